"""`benchmarks/bench_entity_writer.py`: the timed addition writes every new entity's row and, read guided by names,
rebuilds the lookup with the new names inside the timed call (issue 64's `seconds_to_add_100k_base`)."""

from __future__ import annotations

import pytest

from tiny_models import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_entity_writer")


@pytest.mark.parametrize("name_guided", [True, False])
def test_the_timed_addition_writes_the_rows_and_updates_the_name_lookup(bench, monkeypatch, capsys, name_guided):
    built = []
    original = bench.base_shape_model

    def kept(tokenizer, *args):
        model = original(tokenizer, *args)
        built.append((model, tokenizer))
        return model

    monkeypatch.setattr(bench, "base_shape_model", kept)
    argv = ["--entities", "12", "--table-rows", "40", "--threads", "1", "--batch-size", "8"]
    assert bench.main(argv + ([] if name_guided else ["--no-name-guided"])) == 0
    result = capsys.readouterr().out.strip().splitlines()[-1]
    assert result.startswith("RESULT seconds_to_add_100k_base=") and f"name_guided={name_guided}" in result
    [(model, tokenizer)] = built
    assert model.config.entity_vocab_size == 52 and model.entity_vocab.names[-1] == "Newcomer 11"
    lookup = model.name_candidates()
    if name_guided:  # the lookup in use finds a new name, and only its row
        assert lookup.num_entities == 52
        mention = tokenizer("<E_s> Newcomer 11 <E_e>", add_special_tokens=False)["input_ids"]
        assert lookup.of_tokens(mention[1:-1]) == [51]  # the tokens between the markers, as in running text
    else:
        assert lookup is None

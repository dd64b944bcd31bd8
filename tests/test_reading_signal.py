"""The writer's reading signal (`research.reading_signal`, issue 64 item 3): at each evaluation of `edmem pretrain`,
questions about written-only entities asked through the rows the writer writes of them as it is, logged beside the
validation figures; the model left as it was."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from edmem_hf.pretraining import pretrain
from edmem_hf.research import reading_signal as signal_module
from edmem_hf.research.entity_growth import written_rows
from edmem_hf.research.reading_signal import reading_signal

sys.path.insert(0, os.path.dirname(__file__))
from test_collator import ENTITY_NAMES, make_corpus  # noqa: E402
from test_pretraining import _log, _options  # noqa: E402

PRACTICE = ENTITY_NAMES[:3]  # written-only: read through written rows only


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), n_train=64, n_validation=16)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("files")
    practice, questions = folder / "practice.txt", folder / "questions.jsonl"
    practice.write_text("".join(f"{name}\n" for name in PRACTICE), encoding="utf-8")
    with open(questions, "w", encoding="utf-8") as f:
        for i, name in enumerate(PRACTICE):
            question = f"what is near {name} ?"
            record = {"id": f"q{i}", "question": question, "answer": ["Beta River"], "relation": "near",
                      "link_offset": [question.index(name)], "link_length": [len(name)], "link_target": [name],
                      "entity_name": [name]}  # fmt: skip
            f.write(json.dumps(record) + "\n")
    facts = folder / "facts.json"
    facts.write_text(json.dumps({"near": ["{S} is near {V} .", ["Gamma Lake", "Delta Island", "Mu Old"]]}))
    return {"practice": practice, "questions": questions, "facts": facts}


def _writer_options(corpus, out, files, **more) -> dict:
    return _options(corpus, out, entity_row_writer=True, written_only_entities_file=str(files["practice"]),
                    written_only_share=0.0, reading_signal_questions_file=str(files["questions"]),
                    reading_signal_facts_file=str(files["facts"]), **more)  # fmt: skip


def test_the_signal_is_logged_at_each_evaluation(corpus, files, tmp_path):
    pretrain(**_writer_options(corpus, tmp_path / "run", files, max_steps=4, eval_steps=2))
    evaluations = [record for record in _log(tmp_path / "run") if record["type"] == "eval"]
    assert [record["step"] for record in evaluations] == [2, 4]
    for record in evaluations:
        assert 0 <= record["reading_em"] <= 100 and 0 <= record["reading_oracle_em"] <= 100
        assert 0 <= record["written_fact_share"] <= 100
    # without the questions file, no signal
    pretrain(**_options(corpus, tmp_path / "plain", entity_row_writer=True, max_steps=2, eval_steps=2))
    assert not any("reading_em" in record for record in _log(tmp_path / "plain"))


def test_the_rows_asked_through_are_the_writer_s_and_the_model_is_left_as_it_was(corpus, files, tmp_path, monkeypatch):
    from edmem_hf.pretraining import _PretrainingRun

    options = _writer_options(corpus, tmp_path / "run", files, max_steps=1)
    trainer = _PretrainingRun(options["args"], None, None, None, None, options["writer"], options["mixing"])
    model, collator = trainer.accelerator.unwrap_model(trainer.model), trainer.writer_collator
    ids = [model.entity_vocab.id_of(name) for name in PRACTICE]
    table = model.get_encoder().entity_embeddings.weight
    before, mask = table.detach().clone(), model._get_entity_mask("cpu").clone()
    assert not mask[ids].any()  # written-only: hidden from the memory in training
    _, inputs = collator.rows_to_write(entities=ids)
    expected = written_rows(model, inputs)  # the mean of each entity's rows: the model pools its texts
    seen = []
    answer = signal_module.answer_questions

    def watched(model, tokenizer, questions_file, **kwargs):
        seen.append((table.detach()[ids].clone(), model._get_entity_mask("cpu")[ids].clone(), model.training))
        return answer(model, tokenizer, questions_file, **kwargs)

    monkeypatch.setattr(signal_module, "answer_questions", watched)
    model.train()
    figures = reading_signal(model, trainer.tokenizer, collator, files["questions"], str(files["facts"]))
    assert set(figures) == {"reading_em", "reading_oracle_em", "written_fact_share"}
    assert len(seen) == 2
    for rows, shown, training in seen:  # asked through the written rows, shown, in eval mode
        torch.testing.assert_close(rows, expected.to(rows), rtol=1e-4, atol=1e-5)
        assert shown.all() and not training
    assert torch.equal(table.detach(), before) and torch.equal(model._get_entity_mask("cpu"), mask)
    assert model.training
    not_written = tmp_path / "not_written.jsonl"
    not_written.write_text(json.dumps({**json.loads(files["questions"].read_text().splitlines()[0]),
                                       "link_target": [ENTITY_NAMES[5]]}) + "\n")  # fmt: skip
    with pytest.raises(ValueError, match="must be written-only entities"):
        reading_signal(model, trainer.tokenizer, collator, not_written)
    with pytest.raises(ValueError, match="is no entity of the model"):
        other = tmp_path / "unknown.jsonl"
        other.write_text(json.dumps({**json.loads(files["questions"].read_text().splitlines()[0]),
                                     "link_target": ["Nobody"]}) + "\n")  # fmt: skip
        reading_signal(model, trainer.tokenizer, collator, other)

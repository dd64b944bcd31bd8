"""`benchmarks/toy_world_qa.py`: its question files are the released format the readers and `edmem evaluate` take,
and the whole experiment runs end to end at a tiny size (the figures themselves are in docs/evidence.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from edmem_hf import EntityVocab
from edmem_hf.evaluation import evaluate_files
from edmem_hf.tasks import IGNORE_INDEX, read_qa
from edmem_hf.toy_world import generate_toy_world
from tiny_models import load_benchmark, make_word_tokenizer, tiny_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import finetune_qa  # noqa: E402


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("toy_world_qa")


def test_question_files_read_back_and_score(bench, tmp_path):
    world = generate_toy_world(60, seed=3)
    splits = bench.split_questions(world.qa_pairs, 0.2, seed=3)
    assert sum(len(pairs) for pairs in splits.values()) == len(world.qa_pairs)
    assert not {p.question for p in splits["test"]} & {p.question for p in splits["train"]}
    data, links = bench.write_released_format(splits["test"], "test", tmp_path)
    vocab = EntityVocab([e.name for e in world.entities])
    rows = read_qa(data, vocab)
    assert len(rows) == len(splits["test"])
    for row, pair in zip(rows, splits["test"]):
        assert row["question"].replace(f"<E_s> {pair.subject} <E_e>", pair.subject) == pair.question
        assert row["mention_entities"] == [vocab.id_of(pair.subject)]
        assert row["answer_entity"] == (vocab.id_of(pair.answer) if pair.answer_is_entity else IGNORE_INDEX)
    # gold answers score 100 on both kinds; an entity for every question scores 0 on the literal ones
    gold = {row["id"]: pair.answer_with_markers for row, pair in zip(rows, splits["test"])}
    (tmp_path / "gold.json").write_text(json.dumps(gold))
    scores = evaluate_files("qa", data, tmp_path / "gold.json", answer_links=links)
    assert scores["exact_match_entity"] == scores["exact_match_non_entity"] == 100.0
    entity = {row["id"]: f"<E_s> {world.entities[5].name} <E_e>" for row in rows}
    (tmp_path / "entity.json").write_text(json.dumps(entity))
    assert evaluate_files("qa", data, tmp_path / "entity.json", answer_links=links)["exact_match_non_entity"] == 0.0


def test_entity_mask_file_is_the_authors_format(bench, tmp_path):
    """The authors' get_memory_mask.py format (a long tensor, 1 = hidden), read by the fine-tuning script's
    `--entity_mask_file`: constrained decoding then spells only the entities the file leaves visible."""
    path = bench.write_entity_mask(1000, 0.1, seed=0, path=tmp_path / "mask.pt")
    hidden = torch.load(path, weights_only=True)
    assert hidden.dtype == torch.long and hidden.shape == (1000,) and set(hidden.unique().tolist()) == {0, 1}
    assert 50 < int((hidden == 0).sum()) < 150  # about a tenth visible
    assert torch.equal(torch.load(bench.write_entity_mask(1000, 0.1, 0, tmp_path / "again.pt")), hidden)  # seeded

    world = generate_toy_world(40, seed=3)
    names = [e.name for e in world.entities]
    data, _ = bench.write_released_format(bench.split_questions(world.qa_pairs, 0.2, seed=3)["test"], "test", tmp_path)
    tokenizer = make_word_tokenizer(bart_template=True)
    start, end = tokenizer.convert_tokens_to_ids(["<E_s>", "<E_e>"])
    model = tiny_model(vocab_size=len(tokenizer), entity_vocab_size=len(names), entity_start_token_id=start,
                       entity_end_token_id=end, init_std=0.3)  # fmt: skip
    model.entity_vocab = EntityVocab(names)
    with torch.no_grad():  # a random model that opens mentions (as the decoding tests bias it)
        model.final_logits_bias[0, start] = 12.0
        model.final_logits_bias[0, tokenizer.eos_token_id] = -12.0
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    mask = bench.write_entity_mask(len(names), 0.25, seed=0, path=tmp_path / "memory_mask.pt")
    visible = {names[i] for i in (torch.load(mask, weights_only=True) == 0).nonzero().flatten().tolist()}
    assert 0 < len(visible) < len(names) // 2

    def spelled(out, *extra) -> list[str]:
        finetune_qa.main([
            "--model_name_or_path", str(tmp_path / "model"), "--output_dir", str(out), "--test_file", str(data),
            "--do_predict", "--entity_decoding", "dynamic", "--entity_candidates", "3", "--max_target_length", "24",
            "--per_device_eval_batch_size", "32", "--eval_strategy", "no", "--save_strategy", "no",
            "--load_best_model_at_end", "false", "--report_to", "none", "--use_cpu", "--disable_tqdm", "true", *extra,
        ])  # fmt: skip
        texts = json.loads((out / "dynamic_predictions.json").read_text()).values()
        return [
            part.split("<E_e>")[0].strip() for text in texts for part in text.split("<E_s>")[1:] if "<E_e>" in part
        ]

    masked = spelled(tmp_path / "masked", "--entity_mask_file", str(mask))
    assert len(masked) >= 10 and len(set(masked)) >= 3  # real, varied mentions first
    assert set(masked) <= visible, set(masked) - visible
    assert set(spelled(tmp_path / "all")) - visible  # without the file, hidden entities are spelled too


def test_the_experiment_runs_end_to_end(bench, tmp_path, capsys):
    """A tiny world, a few steps: every system is trained, decoded and scored, the plots are drawn."""
    out = tmp_path / "run"
    argv = ["--quick", "--out", str(out), "--num-entities", "40", "--pretrain-steps", "4", "--finetune-epochs", "1"]
    assert bench.main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    assert set(result["systems"]) == {
        "edmem_free",
        "edmem_static",
        "edmem_dynamic",
        "encdec",
        "encmem",
        "majority_answer",
    }
    assert set(result["memory_fraction"]) == {"1.0", "0.1"}
    # EncMem answers every question with an entity: never right on a literal answer
    assert result["systems"]["encmem"]["exact_match_non_entity"]["mean"] == 0.0
    assert (out / "em_by_model.png").stat().st_size > 0 and (out / "em_by_memory_fraction.png").stat().st_size > 0
    predictions = json.loads((out / "seed-0" / "finetune-encmem" / "encmem_predictions.json").read_text())
    assert len(predictions) == result["runs"][0]["questions"]["test"]
    assert all(text.startswith("<E_s> ") and text.endswith(" <E_e>") for text in predictions.values())
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("RESULT seeds=1 ") and "encmem_em_literal=0.0" in last

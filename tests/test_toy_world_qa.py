"""`benchmarks/toy_world_qa.py`: its question files are the released format the readers and `edmem evaluate` take,
and the whole experiment runs end to end at a tiny size (the figures themselves are in docs/evidence.md)."""

from __future__ import annotations

import json

import pytest
import torch

from edmem_hf import EntityVocab
from edmem_hf.evaluation import evaluate_files
from edmem_hf.tasks import IGNORE_INDEX, read_qa
from edmem_hf.toy_world import generate_toy_world
from tiny_models import load_benchmark


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
    path = bench.write_entity_mask(1000, 0.1, seed=0, path=tmp_path / "mask.pt")
    hidden = torch.load(path, weights_only=True)
    assert hidden.dtype == torch.long and hidden.shape == (1000,) and set(hidden.unique().tolist()) == {0, 1}
    assert 50 < int((hidden == 0).sum()) < 150  # about a tenth visible


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

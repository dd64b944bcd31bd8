"""`benchmarks/toy_world_growth.py`: the held-out people are absent from everything the model trains on, the grown
models hold them, and the whole experiment runs end to end at a tiny size (the figures are in docs/evidence.md)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer

from edmem_hf import EDMemForConditionalGeneration, EntityVocab
from edmem_hf.dump import iter_parsed_pages
from edmem_hf.entity_growth import new_entity_passages
from edmem_hf.tasks import read_jsonl
from edmem_hf.toy_world import generate_toy_world
from tiny_models import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("toy_world_growth")


def test_the_held_out_people_are_only_in_the_new_pages(bench, tmp_path):
    settings = bench.GrowthSettings(qa=bench.Settings(num_entities=60))
    data = bench.make_worlds(settings, seed=1, out=tmp_path)
    held = data["held"]
    world = generate_toy_world(60, seed=1)
    assert len(held) >= 2 and all(world.entity(name).type == "person" for name in held)
    assert not set(held) & set(EntityVocab.load(data["corpus"] / "entity_vocab.json").names)
    old_text = "".join(page.text for page in iter_parsed_pages(str(tmp_path / "old-wiki.xml.bz2")))
    assert not any(name in old_text for name in held)
    new_titles = {page.title for page in iter_parsed_pages(data["new_dump"])}
    assert set(held) <= new_titles
    files = data["files"]
    for split in ("train", "dev"):
        assert not any(record["link_target"][0] in held for record in read_jsonl(files[split]))
    new = list(read_jsonl(files["new"]))
    assert {record["link_target"][0] for record in new} == set(held) and len(new) == 3 * len(held)
    seen = list(read_jsonl(files["seen"]))
    assert seen and all(r["link_target"][0] not in held and r["link_target"][0] in world.pages for r in seen)
    assert all(world.entity(r["link_target"][0]).type == "person" for r in seen)


def test_the_experiment_runs_end_to_end(bench, tmp_path, capsys):
    """A tiny world, a few steps: every model is grown, trained further, decoded and scored, the plot drawn."""
    out = tmp_path / "run"
    argv = ["--quick", "--out", str(out), "--num-entities", "40", "--pretrain-steps", "4", "--finetune-epochs", "1",
            "--continued-steps", "2", "--timed-additions", "10"]  # fmt: skip
    assert bench.main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    held = result["runs"][0]["held_out"]
    assert set(result["summary"]["new"]) == {"before", *bench.ESTIMATORS, "continued_pretraining"}
    # before adding, the memory cannot hold a new subject
    assert result["summary"]["new"]["before"]["memory_recall"]["mean"] == 0.0
    seed = out / "seed-0"
    trained = EDMemForConditionalGeneration.from_pretrained(seed / "finetune")
    norm = trained.model.entity_embeddings.weight.norm(dim=-1).mean()
    for estimator in bench.ESTIMATORS:
        grown = EDMemForConditionalGeneration.from_pretrained(seed / f"grown-{estimator}")
        assert grown.entity_vocab.names[-len(held) :] == held
        rows = grown.model.entity_embeddings.weight[-len(held) :]
        if estimator != "mean_query":
            torch.testing.assert_close(rows.norm(dim=-1), norm.expand(len(held)), rtol=1e-4, atol=1e-4)
    # continued pre-training read the full world's passages with the grown model's ids for the added people
    continued = EDMemForConditionalGeneration.from_pretrained(seed / "pretrain-continued")
    assert continued.entity_vocab == grown.entity_vocab
    passages = bench.corpus_in_model_ids(seed / "corpus-new", continued.entity_vocab)["train"]
    labels = {label for row in passages["entity_labels"] for label in row if label >= 0}
    assert {continued.entity_vocab.id_of(name) for name in held} <= labels
    corpus_names = EntityVocab.load(seed / "corpus-new" / "entity_vocab.json").names
    assert corpus_names != continued.entity_vocab.names  # so the mapping is not the identity
    # the trained people that no fine-tuning question names, counted from the question files
    asked = {record["link_target"][0] for record in read_jsonl(seed / "edmem_toy-train.jsonl")}
    unasked = [r for r in read_jsonl(seed / "edmem_toy-seen.jsonl") if r["link_target"][0] not in asked]
    for figures in result["summary"]["seen_not_asked_in_finetuning"].values():
        assert figures["questions"] == len(unasked) and 0 <= figures["hits"] <= len(unasked)
    # a trained person whose row is their own mean passage query, made long, is found by it
    types = {entity.name: entity.type for entity in generate_toy_world(40, seed=0).entities}
    people = [name for name in trained.entity_vocab.names if types.get(name) == "person"][:4]
    passages, _ = new_entity_passages(iter_parsed_pages(str(seed / "old-wiki.xml.bz2")), known=())
    tokenizer = AutoTokenizer.from_pretrained(seed / "finetune")
    with torch.no_grad():
        queries = trained.memory_queries([passages[name] for name in people], tokenizer)
        for name, query in zip(people, queries):
            trained.model.entity_embeddings.weight[trained.entity_vocab.id_of(name)] = 100 * query / query.norm()
    trained.save_pretrained(tmp_path / "planted")
    tokenizer.save_pretrained(tmp_path / "planted")
    assert bench.passage_query_recall(tmp_path / "planted", str(seed / "old-wiki.xml.bz2"), people) == 100.0
    assert (out / "growth.png").stat().st_size > 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"RESULT seeds=1 entities_added={len(held)} ") and "seconds_to_add_10=" in last
    assert "edmem_base_shape" not in last  # --quick does not time the base shape

"""`edmem evaluate` and its metrics: the authors' released predictions score what the data README states."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import shared_data_path
from edmem_hf.cli import main as edmem
from edmem_hf.evaluation import (
    MetricUnavailable,
    bertscore_f1,
    coverage_tokens,
    entity_coverage,
    evaluate_files,
    generation_scores,
    load_metric,
    qa_scores,
    read_jsonl,
    read_predictions,
    strip_markers,
    unigram_f1,
)

RELEASE = "edmem_release"


def _evaluate_json(capsys, *argv: str) -> dict:
    return _evaluate_json_and_stderr(capsys, *argv)[0]


def _evaluate_json_and_stderr(capsys, *argv: str) -> tuple[dict, str]:
    assert edmem(["evaluate", *map(str, argv), "--json"]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


@pytest.mark.parametrize(
    "mode, exact_match, entity, non_entity",
    [("freeform", 28.89, 34.00, 16.70), ("dynamic", 27.59, 33.22, 14.17), ("static", 29.94, 37.11, 12.85)],
)
def test_released_nq_predictions(capsys, mode, exact_match, entity, non_entity):
    """The data README's figures (EM 28.89 / 27.59 / 29.94), split into entity and non-entity answers."""
    data = shared_data_path(f"{RELEASE}/data/openqa/nq/edmem_nq-test.jsonl")
    predictions = shared_data_path(f"{RELEASE}/run/nq/{mode}_predictions.json")
    links = shared_data_path(f"{RELEASE}/data/openqa/nq/entity_linking/sling_invocab-test.json")
    scores = _evaluate_json(
        capsys, "--task", "nq", "--data", data, "--predictions", predictions, "--answer-links", links
    )
    assert (scores["count"], scores["count_entity"], scores["count_non_entity"]) == (3610, 2544, 1066)
    assert round(scores["exact_match"], 2) == exact_match
    assert round(scores["exact_match_entity"], 2) == entity
    assert round(scores["exact_match_non_entity"], 2) == non_entity


def test_released_creak_predictions_table(capsys):
    data = shared_data_path(f"{RELEASE}/data/generation/creak/edmem_creak-test.jsonl")
    predictions = shared_data_path(f"{RELEASE}/run/creak/freeform_predictions.json")
    assert edmem(["evaluate", "--task", "creak", "--data", str(data), "--predictions", str(predictions)]) == 0
    table = dict(line.split() for line in capsys.readouterr().out.splitlines())
    # The references' "This is true/false because" is not scored, as the authors scored CREAK (paper: 33.81 / 16.49 /
    # 31.78, F1 31.34 for its final model). Entity coverage with entity names as the only surface forms (paper, with
    # the authors' alias table: 49.06 / 16.65).
    assert table == {
        "rouge1": "33.76",
        "rouge2": "16.89",
        "rougeL": "31.22",
        "f1": "31.90",
        "count": "1371",
        "entity_coverage": "45.52",
        "count_entity_coverage": "1244",
        "entity_coverage_unseen": "14.15",
        "count_entity_coverage_unseen": "857",
    }


def test_released_eli5_dynamic_entity_coverage():
    data = shared_data_path(f"{RELEASE}/data/generation/eli5/edmem_eli5-test.jsonl")
    predictions = read_predictions(shared_data_path(f"{RELEASE}/run/eli5/dynamic_predictions.json"))
    records = read_jsonl(data)
    total, count = entity_coverage(records, predictions)
    unseen, count_unseen = entity_coverage(records, predictions, unseen=True)
    # The paper, with the authors' alias table: 45.66 / 23.31.
    assert (round(total, 2), count, round(unseen, 2), count_unseen) == (44.71, 1349, 21.37, 1322)


def test_exact_match_is_the_best_over_the_answers_without_markers():
    records = [{"id": "a", "answer": ["Paris", "City of Light"]}, {"id": "b", "answer": ["1066"]}]
    predictions = {"a": "<E_s>  the city of light <E_e>", "b": "in 1066"}
    links = {"a": {"answer": ["Q90", "Paris", 12]}, "b": None}
    scores = qa_scores(records, predictions, links)
    assert scores == {
        "exact_match": 50.0,
        "count": 2,
        "exact_match_entity": 100.0,
        "count_entity": 1,
        "exact_match_non_entity": 0.0,
        "count_non_entity": 1,
    }


def test_generation_metrics_by_hand():
    assert strip_markers("<E_s>  soup <E_e>  is made from <E_s> starch <E_e>.") == "soup is made from starch ."
    # prediction "soup is liquid" vs "the soup is mostly liquid": 3 common of 3 and 4 tokens (article removed).
    assert unigram_f1("Soup is liquid.", "The soup is mostly liquid") == pytest.approx(2 * 1 * 0.75 / 1.75)
    assert unigram_f1("nothing", "in common") == 0.0
    records = [{"id": "0", "output": ["a b c d", "x y"]}]
    scores = generation_scores(records, {"0": "<E_s> x y <E_e>"})
    assert scores["rouge1"] == scores["rouge2"] == scores["rougeL"] == scores["f1"] == 100.0  # best reference
    creak = [{"id": "0", "output": ["This is true because x y"]}]
    assert generation_scores(creak, {"0": "x y"})["f1"] < 100.0
    assert generation_scores(creak, {"0": "x y"}, strip_creak_verdict=True)["f1"] == 100.0


def test_mismatched_ids_name_the_problem(tmp_path, capsys):
    data = tmp_path / "gold.jsonl"
    data.write_text("".join(json.dumps({"id": str(i), "answer": ["x"]}) + "\n" for i in range(8)))
    predictions = tmp_path / "predictions.json"
    predictions.write_text(json.dumps({**{str(i): "x" for i in range(2, 8)}, "99": "y"}))
    argv = ["evaluate", "--task", "nq", "--data", str(data), "--predictions", str(predictions)]
    assert edmem(argv) == 1
    error = capsys.readouterr().err
    assert (
        "2 ids without a prediction (first: 0, 1)" in error
        and "1 predictions without a gold record (first: 99)" in error
    )
    predictions.write_text(json.dumps(["not", "a", "mapping"]))
    assert edmem(argv) == 1 and "must be one JSON object" in capsys.readouterr().err
    data.write_text('{"id": "0", "answer": ["x"]}\nnot json\n')
    assert edmem(argv) == 1 and "line 2: not JSON" in capsys.readouterr().err
    data.write_text('{"id": "0", "answer": ["x"]}\n')
    assert edmem([*argv[:5], "--predictions", str(tmp_path / "absent.json")]) == 1
    assert "absent.json" in capsys.readouterr().err
    # a QA file scored as a generation task, and the other way round: the task and the missing field named
    predictions.write_text(json.dumps({"0": "x"}))
    assert edmem(["evaluate", "--task", "creak", *argv[3:]]) == 1
    assert (
        "edmem evaluate: task 'creak' scores the 'output' field (the references of a generation file), which "
        "record '0' does not have" in capsys.readouterr().err
    )
    data.write_text('{"id": "0", "input": "q", "output": ["x"]}\n')
    assert edmem(argv) == 1
    assert (
        "task 'nq' scores the 'answer' field (the list of answers of a QA file), which record '0' does not have; "
        "the records look like those of a generation task: creak, wow, eli5, msmarco" in capsys.readouterr().err
    )


# Entity coverage on hand-made records. "a": the second reference's entities are all in the prediction (Mercury through
# its name without the parenthetical), the first's are not; Venus is linked in the input. "b": "New York City" is not a
# contiguous run of "new york ... city", "Art" is not a token of "party". "c": covered, but its only entity is in the
# input. "d": no gold entity, not averaged.
COVERAGE_RECORDS = [
    {
        "id": "a",
        "output": ["first", "second"],
        "output_entity_name": [["Mars"], ["Mercury (planet)", "Venus"]],
        "entity_name": ["Venus"],
    },
    {"id": "b", "output": ["x"], "output_entity_name": [["New York City", "Art"]], "entity_name": []},
    {"id": "c", "output": ["y"], "output_entity_name": [["Soup", "Soup"]], "entity_name": ["Soup"]},
    {"id": "d", "output": ["z"], "output_entity_name": [[]], "entity_name": ["Soup"]},
]
COVERAGE_PREDICTIONS = {
    "a": "<E_s> Mercury <E_e> is closer to the sun than venus.",
    "b": "a party in new york, a city",
    "c": "<E_s>soup<E_e>",
    "d": "soup",
}


def test_entity_coverage_by_hand():
    assert coverage_tokens("Mercury's orbit, 2.5x (ish)") == ["mercury", "s", "orbit", "2", "5x", "ish"]
    # total: a 1 (best reference), b 0 of 2, c 1 (Soup counted once); unseen: a 1 (Mercury), b 0; c and d left out.
    assert entity_coverage(COVERAGE_RECORDS, COVERAGE_PREDICTIONS) == (pytest.approx(200 / 3), 3)
    assert entity_coverage(COVERAGE_RECORDS, COVERAGE_PREDICTIONS, unseen=True) == (50.0, 2)
    # Aliases add surface forms ("New York" covers New York City, its parenthetical removed); Art stays uncovered.
    aliases = {"New York City": ["NYC", "New York (state)"], "Mars": []}
    assert entity_coverage(COVERAGE_RECORDS, COVERAGE_PREDICTIONS, aliases) == (pytest.approx(250 / 3), 3)
    assert entity_coverage(COVERAGE_RECORDS, COVERAGE_PREDICTIONS, aliases, unseen=True) == (75.0, 2)
    # A one-string reference takes a flat list of names, as in the authors' format.
    single = [{"id": "0", "output": "Soup is liquid", "output_entity_name": ["Soup", "Liquid"], "entity_name": []}]
    assert entity_coverage(single, {"0": "liquid"}) == (50.0, 1)
    # No gold entity anywhere: not a number, over no record.
    score, count = entity_coverage(COVERAGE_RECORDS[3:], {"d": "soup"})
    assert count == 0 and score != score


def test_entity_coverage_names_bad_input():
    with pytest.raises(ValueError, match="aliases name none of the gold entities"):
        entity_coverage(COVERAGE_RECORDS, COVERAGE_PREDICTIONS, {"Q90": ["Paris"]})
    mismatched = [{**COVERAGE_RECORDS[1], "output": ["x", "x2"]}]
    with pytest.raises(ValueError, match="record 'b': output_entity_name must hold one list of names per reference"):
        entity_coverage(mismatched, {"b": "x"})
    without_input = [{key: value for key, value in COVERAGE_RECORDS[1].items() if key != "entity_name"}]
    with pytest.raises(ValueError, match="record 'b' has no entity_name"):
        entity_coverage(without_input, {"b": "x"}, unseen=True)
    partly = [COVERAGE_RECORDS[0], {"id": "e", "output": ["w"]}]
    with pytest.raises(ValueError, match="record 'e' has no output_entity_name"):
        generation_scores(partly, {"a": "x", "e": "y"})
    with pytest.raises(ValueError, match="no record has output_entity_name"):
        generation_scores([{"id": "e", "output": ["w"]}], {"e": "w"}, aliases={"W": ["w"]})


def _write_generation_files(tmp_path: Path) -> tuple[Path, Path]:
    data, predictions = tmp_path / "gold.jsonl", tmp_path / "predictions.json"
    data.write_text("".join(json.dumps(record) + "\n" for record in COVERAGE_RECORDS))
    predictions.write_text(json.dumps(COVERAGE_PREDICTIONS))
    return data, predictions


def test_generation_json_keys_and_aliases_file(tmp_path, capsys):
    data, predictions = _write_generation_files(tmp_path)
    scores = _evaluate_json(capsys, "--task", "wow", "--data", data, "--predictions", predictions)
    assert list(scores) == [
        "rouge1",
        "rouge2",
        "rougeL",
        "f1",
        "count",
        "entity_coverage",
        "count_entity_coverage",
        "entity_coverage_unseen",
        "count_entity_coverage_unseen",
    ]
    assert (scores["entity_coverage"], scores["entity_coverage_unseen"]) == (pytest.approx(200 / 3), 50.0)
    aliases = tmp_path / "entity2mention.json"
    aliases.write_text(json.dumps({"New York City": ["New York"]}))
    argv = ["--task", "wow", "--data", data, "--predictions", predictions, "--aliases", aliases]
    assert _evaluate_json(capsys, *argv)["entity_coverage"] == pytest.approx(250 / 3)
    assert evaluate_files("wow", data, predictions, aliases=aliases)["entity_coverage_unseen"] == 75.0
    aliases.write_text(json.dumps({"New York City": "New York"}))
    assert edmem(["evaluate", *map(str, argv)]) == 1
    assert "must be one JSON object mapping each entity name to a list of strings" in capsys.readouterr().err
    aliases.write_text(json.dumps({"New York City": ["New York"]}))
    nq = ["evaluate", "--task", "nq", "--data", str(data), "--predictions", str(predictions)]
    assert edmem([*nq, "--aliases", str(aliases)]) == 1 and "--aliases applies to" in capsys.readouterr().err
    assert edmem([*nq, "--bertscore-model", "x"]) == 1 and "--bertscore-model applies to" in capsys.readouterr().err


def _tiny_bert(directory: Path) -> Path:
    """A randomly initialised two-layer BERT with a word-level vocabulary, saved to `directory`."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    words = sorted({w for text in COVERAGE_PREDICTIONS.values() for w in coverage_tokens(text)} | {"first", "second"})
    directory.mkdir()
    (directory / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    tokenizer = BertTokenizerFast(str(directory / "vocab.txt"), model_max_length=32)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
    )
    BertModel(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_bertscore_unavailable_is_one_line_and_the_rest_is_reported(tmp_path, capsys, monkeypatch):
    data, predictions = _write_generation_files(tmp_path)
    argv = ["--task", "wow", "--data", data, "--predictions", predictions]
    # A model that is neither a directory nor cached (an empty cache, offline).
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    for model in ("roberta-large", str(tmp_path / "absent"), str(tmp_path)):
        scores, error = _evaluate_json_and_stderr(capsys, *argv, "--bertscore-model", model)
        assert error.startswith(
            f"edmem evaluate: BERTScore not reported: the model {model!r} is not available offline"
        )
        assert error.count("\n") == 1
        assert "bertscore_f1" not in scores and scores["entity_coverage"] == pytest.approx(200 / 3)
    # The model is there but the package is not (None in sys.modules makes `import bert_score` fail).
    model = _tiny_bert(tmp_path / "tiny_bert")
    capsys.readouterr()  # the progress bars of saving it
    monkeypatch.setitem(sys.modules, "bert_score", None)
    scores, error = _evaluate_json_and_stderr(capsys, *argv, "--bertscore-model", model)
    assert (
        error
        == "edmem evaluate: BERTScore not reported: the bert-score package is not installed (pip install bert-score)\n"
    )
    assert "bertscore_f1" not in scores and scores["count"] == 4
    with pytest.raises(MetricUnavailable, match="bert-score package"):
        bertscore_f1(COVERAGE_RECORDS, COVERAGE_PREDICTIONS, str(model))


def test_bertscore_with_a_tiny_local_model(tmp_path, capsys):
    """The score `edmem evaluate --bertscore-model` reports is bert-score's (idf, the model's last layer, best over
    the references), computed with a tiny BERT built here (bert-score is in the test extra: no skip)."""
    import bert_score

    model = str(_tiny_bert(tmp_path / "tiny_bert"))
    # A prediction equal to one of its references scores 100 (best over the references), the others less.
    records = [
        {"id": str(i), "output": [f"{w} in new york", "the sun"]} for i, w in enumerate(["party", "city", "art"])
    ]
    predictions = {"0": "the sun", "1": "city in new york", "2": "a party"}
    score = bertscore_f1(records, predictions, model)
    _, _, f1 = bert_score.score(
        list(predictions.values()), [r["output"] for r in records], model_type=model, num_layers=2, idf=True
    )
    assert f1[0].item() == pytest.approx(1.0) and f1[1].item() == pytest.approx(1.0) and f1[2].item() < 0.99
    assert score == pytest.approx(100 * f1.mean().item())
    # the command reports the same score beside the others
    data, predicted = _write_generation_files(tmp_path)
    scores, error = _evaluate_json_and_stderr(capsys, "--task", "wow", "--data", data, "--predictions", predicted,
                                              "--bertscore-model", model)  # fmt: skip
    assert "BERTScore not reported" not in error and scores["entity_coverage"] == pytest.approx(200 / 3)
    assert scores["bertscore_f1"] == pytest.approx(bertscore_f1(COVERAGE_RECORDS, COVERAGE_PREDICTIONS, model))
    assert 0 < scores["bertscore_f1"] < 100


def test_evaluate_modules_by_path_give_the_same_numbers(tmp_path, monkeypatch):
    pytest.importorskip("evaluate")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    qa = load_metric("qa", cache_dir=str(tmp_path))
    answers = [["Paris", "City of Light"], ["1066"], ["Mars"]]
    predicted = ["<E_s> the city of light <E_e>", "in 1066", "mars"]
    records = [{"id": str(i), "answer": a} for i, a in enumerate(answers)]
    links = {"0": {}, "1": None, "2": {}}
    expected = qa_scores(records, {str(i): p for i, p in enumerate(predicted)}, links)
    assert qa.compute(predictions=predicted, references=answers, answer_is_entity=[True, False, True]) == expected

    generation = load_metric("generation", cache_dir=str(tmp_path))
    ids = [r["id"] for r in COVERAGE_RECORDS]
    computed = generation.compute(
        predictions=[COVERAGE_PREDICTIONS[i] for i in ids],
        references=[r["output"] for r in COVERAGE_RECORDS],
        reference_entities=[r["output_entity_name"] for r in COVERAGE_RECORDS],
        input_entities=[r["entity_name"] for r in COVERAGE_RECORDS],
        aliases={"New York City": ["New York"]},
    )
    expected = generation_scores(COVERAGE_RECORDS, COVERAGE_PREDICTIONS, aliases={"New York City": ["New York"]})
    assert computed == expected and computed["entity_coverage"] == pytest.approx(250 / 3)
    creak = generation.compute(
        predictions=["This is true because x y"], references=["This is true because x y z"], strip_creak_verdict=True
    )
    assert creak == generation_scores([{"id": "0", "output": "x y z"}], {"0": "x y"})
    with pytest.raises(ValueError, match="reference_entities needs input_entities"):
        generation.compute(predictions=["x"], references=["y"], reference_entities=[["Y"]])


def test_metric_scripts_are_in_the_built_wheel(tmp_path):
    """The `evaluate` modules are package data: a wheel built from the project carries them."""
    pytest.importorskip("setuptools")
    root = Path(__file__).resolve().parents[1]
    project = tmp_path / "project"
    project.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md", "LICENSE"):
        (project / name).write_bytes((root / name).read_bytes())
    shutil.copytree(root / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    build = "from setuptools import build_meta; print(build_meta.build_wheel('dist'))"
    result = subprocess.run([sys.executable, "-c", build], cwd=project, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    wheel = project / "dist" / result.stdout.strip().splitlines()[-1]
    names = zipfile.ZipFile(wheel).namelist()
    for script in ("edmem_qa/edmem_qa.py", "edmem_generation/edmem_generation.py"):
        assert f"edmem_hf/metrics/{script}" in names

"""`edmem evaluate` and its metrics: the authors' released predictions score what the data README states."""

from __future__ import annotations

import json

import pytest

from conftest import shared_data_path
from edmem_hf.cli import main as edmem
from edmem_hf.evaluation import generation_scores, qa_scores, strip_markers, unigram_f1

RELEASE = "edmem_release"


def _evaluate_json(capsys, *argv: str) -> dict:
    assert edmem(["evaluate", *map(str, argv), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


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
    # 31.78, F1 31.34 for its final model).
    assert table == {"rouge1": "33.76", "rouge2": "16.89", "rougeL": "31.22", "f1": "31.90", "count": "1371"}


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

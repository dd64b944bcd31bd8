"""Scores predictions as the paper did: exact match for open-domain QA (split into entity and non-entity answers),
ROUGE and unigram F1 for entity-intensive generation; `edmem evaluate`."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .tasks import exact_match, normalize_answer

QA_TASKS = ("nq", "wq", "tqa")
GENERATION_TASKS = ("creak", "wow", "eli5", "msmarco")
_MARKERS = re.compile(r"\s*<E_[se]>\s*")
# CREAK references open with the verdict the model is given; the authors scored the explanation after it.
_CREAK_VERDICT = re.compile(r"^this is (true|false) because\s*", re.IGNORECASE)


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Records of a JSON-lines file; a line that is not JSON is an error naming the file and line."""
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path}, line {number}: not JSON ({error.msg})") from None
    return records


def read_predictions(path: str | Path) -> dict[str, str]:
    """`{id: generated text}` (the authors' released format; mention markers may be left in)."""
    with open(path, encoding="utf-8") as f:
        predictions = json.load(f)
    if not isinstance(predictions, dict) or not all(isinstance(v, str) for v in predictions.values()):
        raise ValueError(f"{path}: predictions must be one JSON object mapping each id to its generated text")
    return predictions


def _check_ids(gold_ids: Sequence[str], predictions: Mapping[str, str]) -> None:
    """Every gold id has a prediction and every prediction a gold record, else an error naming the first few."""
    missing = [i for i in gold_ids if i not in predictions]
    extra = sorted(set(predictions) - set(gold_ids))
    problems = []
    if missing:
        problems.append(f"{len(missing)} ids without a prediction (first: {', '.join(missing[:5])})")
    if extra:
        problems.append(f"{len(extra)} predictions without a gold record (first: {', '.join(extra[:5])})")
    if problems:
        raise ValueError("predictions do not match the gold data: " + "; ".join(problems))


def strip_markers(text: str) -> str:
    """A prediction without `<E_s>`/`<E_e>`, with single spaces (the authors' clean-up before scoring)."""
    return " ".join(_MARKERS.sub(" ", text).split())


def qa_scores(
    records: Sequence[Mapping[str, Any]], predictions: Mapping[str, str], answer_links: Mapping | None = None
) -> dict[str, float]:
    """Exact match in percent, best over each question's answers (SQuAD normalisation, markers removed).

    With `answer_links` (the released `sling_invocab-*.json`: id -> null when the answer is not an entity), also
    the exact match on entity and non-entity answers separately, as in the paper's Table 2.
    """
    ids = [str(r["id"]) for r in records]
    _check_ids(ids, predictions)
    hits = {i: exact_match(predictions[i], r["answer"]) for i, r in zip(ids, records)}
    scores: dict[str, float] = {"exact_match": 100 * sum(hits.values()) / len(hits), "count": len(hits)}
    if answer_links is not None:
        unlinked = [i for i in ids if i not in answer_links]
        if unlinked:
            raise ValueError(f"answer links miss {len(unlinked)} ids (first: {', '.join(unlinked[:5])})")
        for name, keep in (("entity", True), ("non_entity", False)):
            group = [hits[i] for i in ids if (answer_links[i] is not None) == keep]
            scores[f"exact_match_{name}"] = 100 * sum(group) / len(group) if group else float("nan")
            scores[f"count_{name}"] = len(group)
    return scores


def unigram_f1(prediction: str, reference: str) -> float:
    """Token F1 between normalised texts (SQuAD's definition)."""
    predicted, gold = normalize_answer(prediction).split(), normalize_answer(reference).split()
    common = sum((Counter(predicted) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def generation_scores(
    records: Sequence[Mapping[str, Any]], predictions: Mapping[str, str], strip_creak_verdict: bool = False
) -> dict[str, float]:
    """ROUGE-1/2/L F-measures (`rouge-score`, stemming off, best over the references) and unigram F1 (best over the
    references), in percent, on predictions with their mention markers removed. `strip_creak_verdict`: score CREAK
    explanations without their leading "This is true/false because", in references and predictions."""
    from rouge_score import rouge_scorer

    ids = [str(r["id"]) for r in records]
    _check_ids(ids, predictions)
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"])
    totals = Counter()
    for i, record in zip(ids, records):
        references = record["output"] if isinstance(record["output"], list) else [record["output"]]
        prediction = strip_markers(predictions[i])
        if strip_creak_verdict:
            references = [_CREAK_VERDICT.sub("", reference) for reference in references]
            prediction = _CREAK_VERDICT.sub("", prediction)
        rouge = scorer.score_multi(references, prediction)
        for name, score in rouge.items():
            totals[name] += score.fmeasure
        totals["f1"] += max(unigram_f1(prediction, reference) for reference in references)
    scores = {name: 100 * total / len(ids) for name, total in totals.items()}
    return {**scores, "count": len(ids)}


def evaluate_files(
    task: str, data: str | Path, predictions: str | Path, answer_links: str | Path | None = None
) -> dict[str, float]:
    """Scores a prediction file against a released data file of `task`."""
    task = task.lower()
    records = read_jsonl(data)
    predicted = read_predictions(predictions)
    if task in QA_TASKS:
        links = None
        if answer_links is not None:
            with open(answer_links, encoding="utf-8") as f:
                links = json.load(f)
        return qa_scores(records, predicted, links)
    if task in GENERATION_TASKS:
        if answer_links is not None:
            raise ValueError("--answer-links applies to the QA tasks only")
        return generation_scores(records, predicted, strip_creak_verdict=task == "creak")
    raise ValueError(f"unknown task {task!r}: one of {', '.join(QA_TASKS + GENERATION_TASKS)}")


def cli_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edmem evaluate", description=__doc__)
    parser.add_argument("--task", required=True, choices=QA_TASKS + GENERATION_TASKS, type=str.lower)
    parser.add_argument("--data", required=True, help="the released gold file (.jsonl)")
    parser.add_argument("--predictions", required=True, help="{id: text} JSON, markers may be left in")
    parser.add_argument("--answer-links", help="QA: sling_invocab-*.json, to split entity and non-entity answers")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args(argv)
    try:
        scores = evaluate_files(args.task, args.data, args.predictions, args.answer_links)
    except (OSError, ValueError) as error:
        print(f"edmem evaluate: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(scores))
    else:
        for name, value in scores.items():
            print(f"{name:<24} {value:.2f}" if isinstance(value, float) else f"{name:<24} {value}")
    return 0


__all__ = ["evaluate_files", "generation_scores", "qa_scores", "read_jsonl", "read_predictions", "unigram_f1"]

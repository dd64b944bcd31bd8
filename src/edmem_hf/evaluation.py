"""Scores predictions as the paper did: exact match for open-domain QA (split into entity and non-entity answers),
ROUGE, unigram F1, entity coverage and (when available) BERTScore for entity-intensive generation; `edmem evaluate`."""

from __future__ import annotations

import json
import re
import string
import sys
import unicodedata
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from .arguments import CommandParser
from .configuration_edmem import MENTION_MARKERS as _MARKERS
from .task_files import read_jsonl

QA_TASKS = ("nq", "wq", "tqa", "qa")  # "qa": any open-domain QA file in the released format
GENERATION_TASKS = ("creak", "wow", "eli5", "msmarco")
# CREAK references open with the verdict the model is given; the authors scored the explanation after it.
_CREAK_VERDICT = re.compile(r"^this is (true|false) because\s*", re.IGNORECASE)
_WORD = re.compile(r"\w+")
# "Mercury (planet)" is written "Mercury": a surface form loses its trailing parenthetical before matching.
_TRAILING_PARENTHETICAL = re.compile(r"\s*\([^()]*\)$")


def normalize_answer(text: str) -> str:
    """SQuAD answer normalisation (NFD, lower case, no punctuation or articles), with mention markers removed."""
    text = unicodedata.normalize("NFD", _MARKERS.sub(" ", text)).lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, answers: Sequence[str]) -> bool:
    """Whether the normalised prediction equals one of the normalised answers."""
    normalized = normalize_answer(prediction)
    return any(normalized == normalize_answer(answer) for answer in answers)


def strip_generation(text: str, tokenizer: Any) -> str:
    """Decoded text without padding, `<s>` and `</s>` (mention markers kept)."""
    for token in (tokenizer.pad_token, tokenizer.bos_token, tokenizer.eos_token):
        if token:
            text = text.replace(token, "")
    return " ".join(text.split())


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
    records: Sequence[Mapping[str, Any]],
    predictions: Mapping[str, str],
    answer_links: Mapping | None = None,
    in_vocab_answers: Collection[str] | None = None,
) -> dict[str, float]:
    """Exact match in percent, best over each question's answers (SQuAD normalisation, markers removed).

    With `answer_links` (the released `sling_invocab-*.json`: id -> null when the answer is not an entity), also
    the exact match on entity and non-entity answers separately, as in the paper's Table 2: `exact_match_entity`,
    `exact_match_non_entity` and their counts. With `in_vocab_answers` (the ids of the questions whose answer is an
    entity of a model's vocabulary), the exact match on those and on the others: `exact_match_in_vocab_answer`,
    `exact_match_other_answer` and their counts (a split of the model's, not the paper's).
    """
    ids = [str(r["id"]) for r in records]
    _check_ids(ids, predictions)
    hits = {i: exact_match(predictions[i], r["answer"]) for i, r in zip(ids, records)}
    scores: dict[str, float] = {"exact_match": 100 * sum(hits.values()) / len(hits), "count": len(hits)}
    if answer_links is not None:
        unlinked = [i for i in ids if i not in answer_links]
        if unlinked:
            raise ValueError(f"answer links miss {len(unlinked)} ids (first: {', '.join(unlinked[:5])})")
        scores |= _split(hits, {i for i in ids if answer_links[i] is not None}, "entity", "non_entity")
    if in_vocab_answers is not None:
        scores |= _split(hits, set(in_vocab_answers), "in_vocab_answer", "other_answer")
    return scores


def _split(hits: Mapping[str, bool], members: set[str], name: str, other: str) -> dict[str, float]:
    """Exact match and count of the questions in `members` (`exact_match_<name>`) and of the others."""
    scores: dict[str, float] = {}
    for suffix, keep in ((name, True), (other, False)):
        group = [hit for i, hit in hits.items() if (i in members) == keep]
        scores[f"exact_match_{suffix}"] = 100 * sum(group) / len(group) if group else float("nan")
        scores[f"count_{suffix}"] = len(group)
    return scores


def unigram_f1(prediction: str, reference: str) -> float:
    """Token F1 between normalised texts (SQuAD's definition)."""
    predicted, gold = normalize_answer(prediction).split(), normalize_answer(reference).split()
    common = sum((Counter(predicted) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def read_aliases(path: str | Path) -> dict[str, list[str]]:
    """`{entity name: [surface forms]}` from a JSON file (the shape of the authors' `entity2mention.json`)."""
    with open(path, encoding="utf-8") as f:
        aliases = json.load(f)
    if not isinstance(aliases, dict) or not all(
        isinstance(forms, list) and all(isinstance(form, str) for form in forms) for forms in aliases.values()
    ):
        raise ValueError(f"{path}: aliases must be one JSON object mapping each entity name to a list of strings")
    return aliases


def coverage_tokens(text: str) -> list[str]:
    """The lower-cased runs of letters and digits of `text`: the tokens entity coverage matches on."""
    return _WORD.findall(text.lower())


def _reference_entities(record: Mapping[str, Any], unseen: bool) -> list[set[str]]:
    """The gold entity names of each reference of `record`; with `unseen`, without those linked in the input."""
    where = f"record {record.get('id')!r}"
    if "output_entity_name" not in record:
        raise ValueError(f"{where} has no output_entity_name (the gold entities entity coverage needs)")
    one_reference = isinstance(record["output"], str)  # then a flat list of names
    names = [record["output_entity_name"]] if one_reference else record["output_entity_name"]
    if not isinstance(names, list) or len(names) != (1 if one_reference else len(record["output"])):
        raise ValueError(f"{where}: output_entity_name must hold one list of names per reference in output")
    if not all(isinstance(group, list) and all(isinstance(name, str) for name in group) for group in names):
        raise ValueError(f"{where}: output_entity_name must be lists of entity names")
    if unseen:
        if "entity_name" not in record:
            raise ValueError(f"{where} has no entity_name (the input's entities, which unseen coverage leaves out)")
        seen = set(record["entity_name"])
        return [set(group) - seen for group in names]
    return [set(group) for group in names]


def entity_coverage(
    records: Sequence[Mapping[str, Any]],
    predictions: Mapping[str, str],
    aliases: Mapping[str, Sequence[str]] | None = None,
    unseen: bool = False,
) -> tuple[float, int]:
    """Entity coverage in percent as the paper defines it, and the number of records it averages over.

    A gold entity (`output_entity_name`) is covered when one of its surface forms, as tokens (`coverage_tokens`,
    trailing parenthetical removed), occurs as a contiguous run in the tokens of the prediction (markers removed).
    Its surface forms are its name plus its `aliases` (a form without letters or digits never matches). A record
    scores the fraction of a reference's entities that are covered, best over its references, and the macro
    average runs over the records with at least one gold entity. With `unseen`, the entities linked in the input
    (`entity_name`) are left out first, so that copying them from the input earns nothing.
    """
    ids = [str(r["id"]) for r in records]
    _check_ids(ids, predictions)
    aliases = aliases or {}
    entities_per_record = [_reference_entities(record, unseen) for record in records]
    if aliases and not any(name in aliases for groups in entities_per_record for group in groups for name in group):
        raise ValueError("the aliases name none of the gold entities (keys must be entity names as in the data)")
    forms_cache: dict[str, list[list[str]]] = {}

    def surface_forms(name: str) -> list[list[str]]:
        if name not in forms_cache:
            forms = (coverage_tokens(_TRAILING_PARENTHETICAL.sub("", form)) for form in [name, *aliases.get(name, [])])
            forms_cache[name] = [tokens for tokens in forms if tokens]
        return forms_cache[name]

    total, counted = 0.0, 0
    for i, reference_entities in zip(ids, entities_per_record):
        if not any(reference_entities):
            continue
        predicted = coverage_tokens(strip_markers(predictions[i]))
        total += max(
            sum(any(_contains(predicted, form) for form in surface_forms(name)) for name in names) / len(names)
            for names in reference_entities
            if names
        )
        counted += 1
    return (100 * total / counted if counted else float("nan")), counted


def _contains(tokens: list[str], run: list[str]) -> bool:
    """Whether `run` occurs as a contiguous sub-sequence of `tokens`."""
    width = len(run)
    return any(tokens[start : start + width] == run for start in range(len(tokens) - width + 1))


def _scored_texts(record: Mapping[str, Any], prediction: str, strip_creak_verdict: bool) -> tuple[list[str], str]:
    """The references of `record` and the prediction as ROUGE, F1 and BERTScore see them: markers removed and, for
    CREAK, the verdict removed from both."""
    references = record["output"] if isinstance(record["output"], list) else [record["output"]]
    prediction = strip_markers(prediction)
    if strip_creak_verdict:
        references = [_CREAK_VERDICT.sub("", reference) for reference in references]
        prediction = _CREAK_VERDICT.sub("", prediction)
    return references, prediction


def generation_scores(
    records: Sequence[Mapping[str, Any]],
    predictions: Mapping[str, str],
    strip_creak_verdict: bool = False,
    aliases: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, float]:
    """ROUGE-1/2/L F-measures (`rouge-score`, stemming off, best over the references) and unigram F1 (best over the
    references), in percent, on predictions with their mention markers removed. `strip_creak_verdict`: score CREAK
    explanations without their leading "This is true/false because", in references and predictions.

    When the records carry their gold entities (`output_entity_name`), also `entity_coverage` and
    `entity_coverage_unseen` (see `entity_coverage`; `aliases` adds surface forms) with the record counts each
    averages over.
    """
    from rouge_score import rouge_scorer

    ids = [str(r["id"]) for r in records]
    _check_ids(ids, predictions)
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"])
    totals = Counter()
    for i, record in zip(ids, records):
        references, prediction = _scored_texts(record, predictions[i], strip_creak_verdict)
        rouge = scorer.score_multi(references, prediction)
        for name, score in rouge.items():
            totals[name] += score.fmeasure
        totals["f1"] += max(unigram_f1(prediction, reference) for reference in references)
    scores: dict[str, float] = {name: 100 * total / len(ids) for name, total in totals.items()}
    scores["count"] = len(ids)
    with_entities = sum("output_entity_name" in record for record in records)
    if with_entities == 0 and aliases:
        raise ValueError("aliases given, but no record has output_entity_name to compute entity coverage on")
    if with_entities:  # a record without them is named by entity_coverage's error
        for key, unseen in (("entity_coverage", False), ("entity_coverage_unseen", True)):
            scores[key], scores[f"count_{key}"] = entity_coverage(records, predictions, aliases, unseen)
    return scores


class MetricUnavailable(RuntimeError):
    """A metric that cannot be computed on this machine (its package or model is missing); the message says which."""


def bertscore_f1(
    records: Sequence[Mapping[str, Any]],
    predictions: Mapping[str, str],
    model: str,
    strip_creak_verdict: bool = False,
    batch_size: int = 64,
) -> float:
    """BERTScore F1 in percent (`bert-score`, idf weighting on, no baseline rescaling, best over the references),
    on the texts ROUGE sees, with `model` (a Hub name already in the local cache, or a directory).

    The layer is bert-score's default for the models it knows (roberta-large: 17), else the model's last one.
    Raises `MetricUnavailable` when the `bert-score` package or the model is not available offline.
    """
    from transformers import AutoConfig

    ids = [str(r["id"]) for r in records]
    _check_ids(ids, predictions)
    try:
        config = AutoConfig.from_pretrained(model, local_files_only=True)
    except (OSError, ValueError):  # ValueError: a directory without a model's config.json
        raise MetricUnavailable(
            f"the model {model!r} is not available offline (no model directory or cached copy of that name)"
        ) from None
    try:
        import bert_score
    except ImportError:
        raise MetricUnavailable("the bert-score package is not installed (pip install bert-score)") from None
    layers = bert_score.utils.model2layers.get(model, getattr(config, "num_hidden_layers", None))
    if layers is None:
        raise MetricUnavailable(f"the model {model!r} has no num_hidden_layers to take BERTScore's layer from")
    texts = [_scored_texts(record, predictions[i], strip_creak_verdict) for i, record in zip(ids, records)]
    try:
        _, _, f1 = bert_score.score(
            [prediction for _, prediction in texts],
            [references for references, _ in texts],
            model_type=model,
            num_layers=layers,
            idf=True,
            batch_size=batch_size,
        )
    except OSError as error:  # the config is there but not the weights or the tokenizer
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise MetricUnavailable(f"the model {model!r} could not be loaded offline ({reason})") from None
    return 100 * f1.mean().item()


def score_task(
    task: str,
    records: Sequence[Mapping[str, Any]],
    predictions: Mapping[str, str],
    answer_links: Mapping[str, Any] | None = None,
    aliases: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, float]:
    """The metrics of `task` (`qa_scores` or `generation_scores`, CREAK without its verdict). Records without the
    task's gold field are an error naming the task and the field."""
    task = task.lower()
    if task in QA_TASKS:
        if aliases is not None:
            raise ValueError("--aliases applies to the generation tasks only")
        _check_gold_field(task, records)
        return qa_scores(records, predictions, answer_links)
    if task in GENERATION_TASKS:
        if answer_links is not None:
            raise ValueError("--answer-links applies to the QA tasks only")
        _check_gold_field(task, records)
        return generation_scores(records, predictions, strip_creak_verdict=task == "creak", aliases=aliases)
    raise ValueError(f"unknown task {task!r}: one of {', '.join(QA_TASKS + GENERATION_TASKS)}")


def _check_gold_field(task: str, records: Sequence[Mapping[str, Any]]) -> None:
    """A ValueError naming the task, the field its gold data is read from, and the first record without it."""
    if task in QA_TASKS:
        field, what, other = (
            "answer",
            "the list of answers of a QA file",
            "a generation task: " + ", ".join(GENERATION_TASKS),
        )
    elif task in GENERATION_TASKS:
        field, what, other = "output", "the references of a generation file", "a QA task: " + ", ".join(QA_TASKS)
    else:
        return
    missing = next((record for record in records if field not in record), None)
    if missing is not None:
        has_other = "output" in missing if field == "answer" else "answer" in missing
        hint = f"; the records look like those of {other}" if has_other else ""
        raise ValueError(
            f"task {task!r} scores the {field!r} field ({what}), which record {missing.get('id')!r} does not have{hint}"
        )


def _read_json(path: str | Path | None) -> Any:
    if path is None:
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def evaluate_files(
    task: str,
    data: str | Path,
    predictions: str | Path,
    answer_links: str | Path | None = None,
    aliases: str | Path | None = None,
) -> dict[str, float]:
    """Scores a prediction file against a released data file of `task` (see `score_task`)."""
    return score_task(
        task,
        read_jsonl(data),
        read_predictions(predictions),
        _read_json(answer_links),
        None if aliases is None else read_aliases(aliases),
    )


def load_metric(name: str, **kwargs: Any) -> Any:
    """The `evaluate` module `"qa"` or `"generation"` shipped in this package, loaded by path (works offline;
    `evaluate.load("rouge")` fetches a script). Keyword arguments go to `evaluate.load`."""
    import evaluate

    if name not in ("qa", "generation"):
        raise ValueError(f"unknown metric {name!r}: 'qa' or 'generation'")
    return evaluate.load(str(Path(__file__).parent / "metrics" / f"edmem_{name}"), **kwargs)


def cli_main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="edmem evaluate", description=__doc__)
    parser.add_argument(
        "--task",
        required=True,
        choices=QA_TASKS + GENERATION_TASKS,
        type=str.lower,
        help="the task of the gold file: QA (exact match) or generation (ROUGE, F1, entity coverage)",
    )
    parser.add_argument("--data", required=True, help="the released gold file (.jsonl)")
    parser.add_argument("--predictions", required=True, help="{id: text} JSON, markers may be left in")
    parser.add_argument("--answer-links", help="QA: sling_invocab-*.json, to split entity and non-entity answers")
    parser.add_argument("--aliases", help="generation: {entity name: [surface forms]} JSON for entity coverage")
    parser.add_argument(
        "--bertscore-model", help="generation: also BERTScore with this model (cached Hub name or directory)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args(argv)
    try:
        if args.bertscore_model is not None and args.task not in GENERATION_TASKS:
            raise ValueError("--bertscore-model applies to the generation tasks only")
        records, predictions = read_jsonl(args.data), read_predictions(args.predictions)
        aliases = None if args.aliases is None else read_aliases(args.aliases)
        scores = score_task(args.task, records, predictions, _read_json(args.answer_links), aliases)
    except (OSError, ValueError) as error:
        print(f"edmem evaluate: {error}", file=sys.stderr)
        return 1
    if "entity_coverage" not in scores and args.task in GENERATION_TASKS:
        print("edmem evaluate: entity coverage not reported: the records have no output_entity_name", file=sys.stderr)
    if args.bertscore_model is not None:
        strip_creak_verdict = args.task == "creak"
        try:
            scores["bertscore_f1"] = bertscore_f1(records, predictions, args.bertscore_model, strip_creak_verdict)
        except MetricUnavailable as error:
            print(f"edmem evaluate: BERTScore not reported: {error}", file=sys.stderr)
    if args.json:
        print(json.dumps(scores))
    else:
        for name, value in scores.items():
            print(f"{name:<30} {value:.2f}" if isinstance(value, float) else f"{name:<30} {value}")
    return 0


__all__ = [
    "MetricUnavailable",
    "bertscore_f1",
    "coverage_tokens",
    "entity_coverage",
    "evaluate_files",
    "exact_match",
    "generation_scores",
    "load_metric",
    "normalize_answer",
    "qa_scores",
    "read_aliases",
    "read_jsonl",
    "read_predictions",
    "score_task",
    "strip_generation",
    "unigram_f1",
]

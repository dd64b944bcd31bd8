"""Scoring the knowledge experiments: exact match by `edmem evaluate`'s rule (all, entity and literal answers), the
majority answer of each question form (the floor), the two-level bootstrap (seeds, then each seed's questions), and
the summaries read from them: validity, the paper's orderings, EDMem's gaps to EncDec (`gap_bootstrap`: their
intervals, paired)."""

from __future__ import annotations

import json
import random
import statistics
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from edmem_hf.tasks import exact_match, read_jsonl

if TYPE_CHECKING:
    from toy_world_qa import Settings


def question_hits(test_file: Path, links_file: Path, predictions: Path) -> list[tuple[bool, bool]]:
    """Per test question, in file order: (answer is an entity, exact match), by `edmem evaluate`'s rule."""
    predicted = json.loads(predictions.read_text())
    links = json.loads(links_file.read_text())
    return [(links[record["id"]] is not None, exact_match(predicted[record["id"]], record["answer"]))
            for record in read_jsonl(test_file)]  # fmt: skip


def em(hits: list[tuple[bool, bool]]) -> dict[str, float]:
    """Exact match in percent: all questions, entity answers, literal answers."""
    groups = {
        "all": [h for _, h in hits],
        "entity": [h for e, h in hits if e],
        "literal": [h for e, h in hits if not e],
    }
    return {name: round(100 * sum(g) / len(g), 2) if g else float("nan") for name, g in groups.items()}


def bootstrap(per_seed: list[list[tuple[bool, bool]]], samples: int, seed: int = 0) -> dict[str, list[float]]:
    """95 % intervals of the mean over seeds of each EM, by a two-level bootstrap: the seeds resampled with
    replacement, then the questions of each drawn seed. The spread between seeds (a world, a split and models each)
    is in the interval: with one seed it is the questions' spread alone."""
    rng = random.Random(seed)
    draws: dict[str, list[float]] = {"all": [], "entity": [], "literal": []}
    for _ in range(samples):
        means = {name: [] for name in draws}
        for hits in (per_seed[rng.randrange(len(per_seed))] for _ in per_seed):
            resampled = em([hits[rng.randrange(len(hits))] for _ in hits])
            for name in draws:
                means[name].append(resampled[name])
        for name in draws:
            draws[name].append(statistics.fmean(means[name]))
    return _central_95(draws, samples)


def gap_bootstrap(edmem: list[list[tuple[bool, bool]]], encdec: list[list[tuple[bool, bool]]], samples: int,
                  seed: int = 0) -> dict[str, list[float]]:  # fmt: skip
    """95 % intervals of the mean over seeds of EDMem's EM minus EncDec's (each a list per seed of `question_hits`,
    the same questions in the same order), by `bootstrap`'s two levels, paired: each draw takes the same seeds and
    questions for both systems, so that what they share (a hard world, a hard question) is not counted as a gap."""
    rng = random.Random(seed)
    paired = [list(zip(first, second)) for first, second in zip(edmem, encdec, strict=True)]
    draws: dict[str, list[float]] = {"all": [], "entity": [], "literal": []}
    for _ in range(samples):
        gaps_drawn = {name: [] for name in draws}
        for questions in (paired[rng.randrange(len(paired))] for _ in paired):
            drawn = [questions[rng.randrange(len(questions))] for _ in questions]
            first, second = em([a for a, _ in drawn]), em([b for _, b in drawn])
            for name in draws:
                gaps_drawn[name].append(first[name] - second[name])
        for name in draws:
            draws[name].append(statistics.fmean(gaps_drawn[name]))
    return _central_95(draws, samples)


def _central_95(draws: dict[str, list[float]], samples: int) -> dict[str, list[float]]:
    """The central 95 % of each kind's `samples` bootstrap draws, as [low, high]."""
    interval = {}
    for name, values in draws.items():
        values.sort()
        interval[name] = [round(values[int(0.025 * samples)], 2), round(values[int(0.975 * samples) - 1], 2)]
    return interval


def claims(interval: dict[str, list[float]], goals: dict[str, float]) -> dict[str, str]:
    """What each gap's interval (EDMem minus EncDec, by kind) supports: a lead (above 0), a reversal (below 0) or a
    tie (it holds 0); and each goal (the gap at least its bar) met (the interval at or above the bar), missed (below
    it) or not settled (it holds the bar), and all of them (`goal`)."""
    found = {}
    for kind, bar in goals.items():
        low, high = interval[kind]
        found[kind] = "lead" if low > 0 else "reversal" if high < 0 else "tie"
        found[f"{kind}_goal"] = "met" if low >= bar else "missed" if high < bar else "not settled"
    readings = [found[f"{kind}_goal"] for kind in goals]
    found["goal"] = "met" if set(readings) == {"met"} else "missed" if "missed" in readings else "not settled"
    return found


def majority_answers(train_file: Path, test_file: Path, path: Path) -> Path:
    """The floor every model must clear: for each question form ("Where was X born?"), the answer most often
    right for that form in the training questions, given to every test question of the form. No model, no facts."""
    answers: dict[str, Counter] = {}
    for record in read_jsonl(train_file):
        answers.setdefault(record["relation"], Counter())[record["answer"][0]] += 1
    predictions = {}
    for record in read_jsonl(test_file):
        counts = answers.get(record["relation"])
        predictions[record["id"]] = counts.most_common(1)[0][0] if counts else ""
    path.write_text(json.dumps(predictions, indent=1))
    return path


def summarise(runs: list[dict], samples: int) -> dict:
    """Per half and system: the mean EM over seeds with its 95 % bootstrap interval."""
    summary = {}
    for half in runs[0]["hits"]:
        summary[half] = {}
        for system in runs[0]["hits"][half]:
            per_seed = [run["hits"][half][system] for run in runs]
            means = {name: round(statistics.fmean(run["em"][half][system][name] for run in runs), 2)
                     for name in ("all", "entity", "literal")}  # fmt: skip
            summary[half][system] = {"em": means, "interval": bootstrap(per_seed, samples)}
    return summary


def reported_group(summary: dict) -> str:
    """The group the figures are read on: the test group when it was asked, else the validation group."""
    return "test" if "test" in summary else "validation"


def validity(summary: dict, settings: Settings) -> dict:
    """A system answers entity questions about people seen only in pre-training at `valid_entity_em` or more and
    `valid_entity_margin` points over the floor, and literal ones `valid_literal_margin` over theirs: both bars met
    by one system (`valid_system`, the best on entity answers of those that meet both)."""
    group = reported_group(summary)
    scores = summary[group]
    systems = {name: s["em"] for name, s in scores.items() if name != "majority_answer" and "hidden" not in name}
    floor = scores["majority_answer"]["em"]
    entity_bar = max(settings.valid_entity_em, floor["entity"] + settings.valid_entity_margin)
    literal_bar = floor["literal"] + (settings.valid_literal_margin or 0.0)
    meets = {name: em["entity"] >= entity_bar and (settings.valid_literal_margin is None or em["literal"] >= literal_bar)
             for name, em in systems.items()}  # fmt: skip
    best_entity = max(systems, key=lambda name: systems[name]["entity"])
    best_literal = max(systems, key=lambda name: systems[name]["literal"] if name != "encmem" else -1)
    valid_systems = [name for name in systems if meets[name]]
    valid_system = max(valid_systems, key=lambda name: systems[name]["entity"]) if valid_systems else None
    return {"valid": valid_system is not None, "valid_system": valid_system, "group": group,
            "best_entity_system": best_entity, "best_entity_em": systems[best_entity]["entity"],
            "floor_entity": floor["entity"], "best_literal_system": best_literal,
            "best_literal_em": systems[best_literal]["literal"], "floor_literal": floor["literal"],
            "entity_bar": entity_bar, "literal_bar": literal_bar if settings.valid_literal_margin is not None else None}  # fmt: skip


def gaps(summary: dict) -> dict[str, float]:
    """EDMem (free decoding) minus EncDec, on entity and on literal answers, in the reported group."""
    scores = summary[reported_group(summary)]
    edmem, encdec = scores["edmem_free"]["em"], scores["encdec"]["em"]
    return {f"{kind}_gap_edmem_minus_encdec": round(edmem[kind] - encdec[kind], 2) for kind in ("entity", "literal")}


def orderings(summary: dict) -> dict[str, bool]:
    """The paper's orderings, on the means of the reported group."""
    test = {name: s["em"] for name, s in summary[reported_group(summary)].items()}
    found = {
        "free_over_encdec_on_entity_answers": test["edmem_free"]["entity"] > test["encdec"]["entity"],
        "static_at_least_free_on_entity_answers": test["edmem_static"]["entity"] >= test["edmem_free"]["entity"],
        "hiding_the_memory_moves_edmem_toward_encdec": abs(
            test["edmem_free_every_row_hidden_at_test"]["entity"] - test["encdec"]["entity"]
        )
        < abs(test["edmem_free"]["entity"] - test["encdec"]["entity"]),
    }
    if "encdec_matched" in test:
        found["free_over_parameter_matched_encdec_on_entity_answers"] = (
            test["edmem_free"]["entity"] > test["encdec_matched"]["entity"]
        )
    if "encmem" in test:
        found["encmem_zero_on_literal_answers"] = test["encmem"]["literal"] == 0.0
    return found


def floors(files: dict[str, Path], out: Path) -> dict[str, float]:
    """EM of the majority answer of each question form (from the fine-tuning questions) on each split."""
    return {split: em(question_hits(files[split], files[f"{split}_links"],
                                    majority_answers(files["train"], files[split], out / f"majority-{split}.json")))["all"]
            for split in ("added", "test")}  # fmt: skip

"""The knowledge claim on fresh seeds (issue 65, items 2 and 3): EDMem and EncDec, each pre-trained with the recipe
chosen for it on the validation groups of seeds 0-2, on three seeds no committed run of the experiment has used; the
test group read once. EncDec's recipe is the headline's (`toy_world_qa.HEADLINE`) with the setting the tuning ledger
chose (`qa_tuning.py`'s results file: its changes to the Settings, its pre-training options). The lever chosen for
EncDec is tried on EDMem too, on the same validation groups (`qa_tuning.py --system edmem --settings NAME`, EDMem's
own ledger): EDMem's recipe is the headline's, or the headline with that setting where its validation figures are
higher by the same rule (the mean of entity and literal EM over the three seeds). The
recipes are frozen when the run begins, with the commit, in the runs file (`--runs`, committed), and recorded in the
results file, which a test holds against the ledgers. Nothing runs while the ledger has chosen nothing, nor once the
results file exists (its test group has been read).

For each seed: the world, each system pre-trained with its own recipe (side by side), the validation and test
groups asked, and where the entity gap comes from (the memory's recall at the subject, EDMem with the asked
subjects' rows hidden at test, each model's memorisation probe). Then the gaps EDMem - EncDec (free decoding, as the
headline's) with seed-level intervals (seeds, then questions, both systems drawn alike), and the claim they support
against the project's goal: EDMem's literal EM at least EncDec's - 3, its entity EM at least EncDec's + 5.

    python benchmarks/qa_fresh_seeds.py --out runs/qa-fresh-seeds [--seeds 6]
    python benchmarks/qa_fresh_seeds.py --one-seed --out runs/qa-one-seed   # the shortest run that can show the claim

Each seed is about an hour on 2 cores. As each finishes, its run (the per-question hits) is added to the runs file
and its pre-trainings' logs are copied beside it: commit them, and a rerun on another machine runs only the seeds the
file lacks, with the recipes it froze (a rerun with the same `--out` also reuses the seeds' half-done pre-trainings).
Once the three seeds are done the results file (`--results`) and the plots are written. Ends with the claim and one
line `RESULT key=value ...`. `--one-seed` is a check anyone can run: the frozen recipes on a seed of its own
(`toy_world_qa.ONE_SEED`), both systems, its figures in `--out` (one seed shows its gaps, not their interval); it
writes no committed file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import qa_tuning as tuning  # noqa: E402
import toy_world_qa as qa  # noqa: E402
from experiments.options import quiet_logging  # noqa: E402
from experiments.plots import plot_qa  # noqa: E402
from experiments.qa_systems import measure_systems  # noqa: E402
from experiments.qa_world import make_world  # noqa: E402
from experiments.scoring import claims, gap_bootstrap, gaps, summarise, validity  # noqa: E402
from experiments.training import pretrain_side_by_side  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SEEDS = qa.FRESH_SEEDS  # no committed run of the knowledge experiment has used them
LEDGER = tuning.RESULTS  # EncDec's settings read on the validation groups of seeds 0-2, and the one chosen
EDMEM_LEDGER = tuning.results_file("edmem")  # EDMem's, read with EncDec's choice
TAG = f"fresh_seeds{''.join(map(str, SEEDS))}"
RESULTS = tuning.FIGURES / f"test_{TAG}.json"
RUNS = tuning.FIGURES / f"{TAG}_runs.json"  # the frozen recipes and each seed's run as it finishes
ASKED = ["validation", "test"]  # the validation group beside the test group, read once
# What a system's own recipe may change: its pre-training. The world, its groups and the asking are shared.
OWN_FIELDS = frozenset({"pretrain_steps", "pretrain_batch_size", "pretrain_learning_rate"})
GOALS = {"entity": 5.0, "literal": -3.0}  # the project's goal: EDMem's EM minus EncDec's at least this, in points


class Refused(Exception):
    """A reason not to run, said in one line."""


@dataclass(frozen=True)
class Ledgers:
    """The tuning ledgers the recipes come from: EncDec's, with its choice, and EDMem's, where EDMem was tried with
    that choice (none when the choice is EncDec's default, the headline's: nothing to try)."""

    encdec: dict
    edmem: dict | None = None
    edmem_file: str | None = None


@dataclass(frozen=True)
class FrozenRecipe:
    """One system's recipe, frozen before any fresh seed is read."""

    setting: str  # its name: "headline" (EDMem's), or the tuning ledger's choice (EncDec's)
    settings: qa.Settings
    linking: str  # its linking recipe, a name of `toy_world_qa.RECIPES` (EncDec has no linking loss: "paper")
    options: dict = field(default_factory=dict)  # more pre-training options by name (`pretraining_options`)

    def record(self) -> dict:
        return {"setting": self.setting, "settings": asdict(self.settings), "pretraining_options": self.options,
                "linking": self.linking, "linking_recipe": asdict(qa.RECIPES[self.linking])}  # fmt: skip


def frozen_recipes(ledger: Path, edmem_ledger: Path = EDMEM_LEDGER) -> tuple[dict[str, FrozenRecipe], Ledgers]:
    """Each system's recipe on the fresh seeds, and the ledgers they come from: EncDec's the headline with the
    ledger's chosen setting, EDMem's the headline or the headline with that setting (`edmem_setting`, read on
    `edmem_ledger`). Refused while the ledger has chosen nothing, when its choice is not what `qa_tuning.SETTINGS`
    names or changes more than pre-training (the recipe read on validation), and while EDMem waits for its trial."""
    tuned = json.loads(ledger.read_text())
    chosen = tuned.get("chosen")
    if chosen is None:
        raise Refused(f"the tuning ledger ({ledger.name}) has chosen no EncDec setting yet ({len(tuned['complete'])} "
                      f"of {len(tuning.SETTINGS)} settings done on every validation seed); the fresh seeds wait")  # fmt: skip
    changes, options = (tuned["settings"][chosen][key] for key in ("changes", "options"))
    if (changes, options) != tuning.SETTINGS.get(chosen):
        raise Refused(f"the ledger's choice {chosen!r} ({changes}, {options}) is not qa_tuning.SETTINGS' {chosen!r}")
    if set(changes) - OWN_FIELDS or set(SEEDS) & set(tuned["validation_seeds"]):
        raise Refused(f"{chosen!r} changes more than pre-training, or the fresh seeds were validation seeds")
    base = replace(qa.HEADLINE, seeds=SEEDS, pretrain_jobs=2)
    mine, tried = edmem_setting(chosen, edmem_ledger)
    edmem_changes, edmem_options = tuning.SETTINGS[mine] if mine != "headline" else ({}, {})
    edmem = FrozenRecipe(mine, replace(base, **edmem_changes), qa.HEADLINE.recipes[0], dict(edmem_options))
    recipes = {"edmem": edmem, "encdec": FrozenRecipe(chosen, replace(base, **changes), "paper", dict(options))}
    return recipes, Ledgers(tuned, tried, edmem_ledger.name if tried is not None else None)


def edmem_setting(chosen: str, edmem_ledger: Path) -> tuple[str, dict | None]:
    """EDMem's setting on the fresh seeds, "headline" or EncDec's `chosen` setting where EDMem's ledger holds it on
    every validation seed with a higher mean of entity and literal EM than the headline's; and that ledger. Refused
    while EDMem has not been tried with it (nothing to try when EncDec's choice is its default, the headline's)."""
    if chosen == "default":
        return "headline", None
    tried = json.loads(edmem_ledger.read_text()) if edmem_ledger.exists() else {"complete": []}
    if chosen not in tried["complete"]:
        raise Refused(f"EDMem has not been tried with EncDec's choice {chosen!r} on every validation seed "
                      f"(python benchmarks/qa_tuning.py --system edmem --settings {chosen}); the fresh seeds wait")  # fmt: skip
    mean = {
        name: sum(tried["settings"][name]["em"][kind] for kind in ("entity", "literal"))
        for name in ("default", chosen)
    }
    return (chosen if mean[chosen] > mean["default"] else "headline"), tried


def freeze(recipes: dict[str, FrozenRecipe], ledgers: Ledgers, ledger: Path, runs_file: Path) -> dict:
    """The recipes as the results file records them, with the ledger, its choice and the commit they were frozen
    at; written to the runs file (`runs_file`, with no run yet) at the run's first call. A later call whose recipes
    differ is refused (the ledgers or the code changed meanwhile: the seeds would not share one recipe)."""
    record = {system: recipe.record() for system, recipe in recipes.items()}
    where = ledger.resolve()
    record |= {"ledger": str(where.relative_to(ROOT) if where.is_relative_to(ROOT) else where),
               "ledger_chosen": ledgers.encdec["chosen"]}  # fmt: skip
    if ledgers.edmem_file is not None:  # where EDMem was tried with EncDec's choice
        record["edmem_ledger"] = ledgers.edmem_file
    record = json.loads(json.dumps(record))
    if runs_file.exists():
        earlier = json.loads(runs_file.read_text())["recipes"]
        if {key: value for key, value in earlier.items() if key in record} != record:
            raise Refused(f"the recipes differ from those {runs_file.name} froze when the fresh seeds began: the "
                          "seeds would not share one recipe")  # fmt: skip
        return earlier
    mine = [str(path) for path in (where, ROOT / "benchmarks") if path.is_relative_to(ROOT)]  # what the recipes are
    record |= {"frozen_at_commit": git("rev-parse", "HEAD").strip(),
               "uncommitted_changes_then": git("status", "--porcelain", "--", *mine).splitlines()}  # fmt: skip
    save_runs(runs_file, record, [])
    return record


def save_runs(runs_file: Path, record: dict, runs: list[dict]) -> None:
    """The runs file: the frozen recipes and each finished seed's run, hits included (the results are made from it)."""
    runs_file.parent.mkdir(parents=True, exist_ok=True)
    runs_file.write_text(json.dumps({"recipes": record, "runs": runs}, indent=1))


def git(*arguments: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *arguments], capture_output=True, text=True).stdout


def run_seed(recipes: dict[str, FrozenRecipe], seed: int, out: Path) -> dict:
    """One fresh seed: its world, each system pre-trained with its own recipe (side by side), and what each knows
    and answers (`measure_systems`: EDMem also with the asked subjects' rows, and every row, hidden at test)."""
    started = time.perf_counter()
    shared = recipes["edmem"].settings  # the world, its groups and the asking: the systems differ in pre-training
    data = make_world(shared, seed, out)
    calls = {system: (system, data["corpus"], out / f"pretrain-{system}-{recipe.setting}", recipe.settings, seed,
                      None, qa.RECIPES[recipe.linking], data["mixed_questions"])
             for system, recipe in recipes.items()}  # fmt: skip
    models = pretrain_side_by_side(calls, shared.pretrain_jobs, {s: recipe.options for s, recipe in recipes.items()})
    measured = measure_systems(shared, seed, out, data, models, ASKED, qa.RECIPES[recipes["edmem"].linking])
    return {"seed": seed, "questions": {group: len(pairs) for group, pairs in data["splits"].items()}, **measured,
            "seconds_this_call": round(time.perf_counter() - started)}  # fmt: skip


def seed_figures(run: dict) -> dict:
    """One seed's EM of each system (EDMem in free decoding, as the gaps), test and validation groups, its gaps,
    and where its entity gap comes from (test group)."""
    em, test = run["em"], run["em"]["test"]
    figures = {system: {group: em[group][name] for group in ASKED} for system, name in
               (("edmem", "edmem_free"), ("encdec", "encdec"))}  # fmt: skip
    for kind in GOALS:
        figures[f"{kind}_gap_edmem_minus_encdec"] = round(test["edmem_free"][kind] - test["encdec"][kind], 2)
    memorised = {system: {key: value for key, value in found["test"].items() if key != "by_relation"}
                 for system, found in run["memorisation"].items()}  # fmt: skip
    figures["where_the_entity_gap_comes_from"] = {
        "edmem_memory_recall_at_subject": {group: run["edmem_memory_recall_at_subject"][group] for group in ASKED},
        "edmem_subject_rows_hidden_at_test": test["edmem_free_subject_rows_hidden_at_test"],
        "edmem_every_row_hidden_at_test": test["edmem_free_every_row_hidden_at_test"],
        "memorisation_test_group": memorised,  # each pre-trained model: facts filled, and as a question reads them
    }
    return figures


def fresh_result(record: dict, ledgers: Ledgers, runs: list[dict], settings: qa.Settings) -> dict:
    """The results file: the gaps on the test group with their seed-level intervals and the claim they support,
    each seed's figures, the settings each system was tried with on validation and the validation seeds' figures
    of the chosen recipes, the frozen recipes, the summary and every seed's run (without the per-question hits)."""
    summary = summarise(runs, settings.bootstrap_samples)
    gap = gaps(summary)  # the test group, EDMem in free decoding
    interval = gap_bootstrap(*([run["hits"]["test"][system] for run in runs] for system in ("edmem_free", "encdec")),
                             settings.bootstrap_samples)  # fmt: skip
    tuned = ledgers.encdec
    chosen = tuned["settings"][tuned["chosen"]]
    mine, edmem_tried = record["edmem"]["setting"], ledgers.edmem or tuned
    edmem = (tuning.headline_default("edmem", tuning.VALIDATION_SEEDS) if mine == "headline"
             else edmem_tried["settings"][mine])  # fmt: skip
    return {
        "fresh_seeds": len(runs), "seeds": [run["seed"] for run in runs], "group": "test", "test_group_reads": 1,
        **gap, **{f"{kind}_gap_interval": interval[kind] for kind in GOALS}, "claim": claims(interval, GOALS),
        "goals": {f"{kind}_gap_at_least": bar for kind, bar in GOALS.items()},
        "edmem_settings_tried": edmem_tried["edmem_settings_tried"],
        "encdec_settings_tried": tuned["encdec_settings_tried"],
        "per_seed": {str(run["seed"]): seed_figures(run) for run in runs},
        "validation_seeds_figures": {"edmem": {key: edmem[key] for key in ("seeds", "em", "per_seed")},
                                     "encdec": {key: chosen[key] for key in ("seeds", "em", "per_seed")}},
        "validity": validity(summary, settings), "recipes": record, "summary": summary,
        "runs": [{key: value for key, value in run.items() if key != "hits"} for run in runs],
    }  # fmt: skip


def copy_logs(seed: int, recipes: dict[str, FrozenRecipe], out: Path, figures: Path) -> None:
    """A finished seed's pre-training logs, beside the results file (committed with the runs file)."""
    figures.mkdir(parents=True, exist_ok=True)
    for system, recipe in recipes.items():
        log = out / f"seed-{seed}" / f"pretrain-{system}-{recipe.setting}" / "log.jsonl"
        shutil.copyfile(log, figures / f"pretrain_log_{TAG}_seed{seed}_{system}_{recipe.setting}.jsonl")


def publish(result: dict, out: Path, results: Path, plots: bool) -> None:
    """The results file and the plots (named after it)."""
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(result, indent=1))
    for plot in plot_qa(result["summary"], out) if plots else []:
        shutil.copyfile(plot, results.parent / f"{plot.stem}_{results.stem.removeprefix('test_')}.png")


def statement(result: dict) -> str:
    """The claim in words, with its figures."""
    test, claim = result["summary"]["test"], result["claim"]
    parts = []
    for kind, bar in GOALS.items():
        edmem, encdec = test["edmem_free"]["em"][kind], test["encdec"]["em"][kind]
        low, high = result[f"{kind}_gap_interval"]
        parts.append(f"{kind} answers: EDMem {edmem} against EncDec {encdec}, a {claim[kind]} of "
                     f"{result[f'{kind}_gap_edmem_minus_encdec']:+} [{low}, {high}] (the goal, at least {bar:+}: "
                     f"{claim[f'{kind}_goal']})")  # fmt: skip
    return (f"CLAIM on {result['fresh_seeds']} fresh seeds, the test group read once, both systems tuned: "
            f"{'; '.join(parts)}. The project's goal: {claim['goal']}.")  # fmt: skip


def result_line(result: dict) -> str:
    fields = {key: result[key] for key in ("fresh_seeds", "group", "entity_gap_edmem_minus_encdec",
                                           "literal_gap_edmem_minus_encdec")}  # fmt: skip
    fields |= {f"{kind}_gap_interval": "[{},{}]".format(*result[f"{kind}_gap_interval"]) for kind in GOALS}
    fields |= {key: result[key] for key in ("edmem_settings_tried", "encdec_settings_tried", "test_group_reads")}
    fields |= {"seeds": ",".join(map(str, result["seeds"])), "encdec_setting": result["recipes"]["ledger_chosen"],
               "edmem_setting": result["recipes"]["edmem"]["setting"]}  # fmt: skip
    fields |= {f"{kind}_claim": result["claim"][kind] for kind in GOALS} | {"goal": result["claim"]["goal"]}
    return "RESULT " + " ".join(f"{key}={str(value).replace(' ', '_')}" for key, value in fields.items())


def one_seed(recipes: dict[str, FrozenRecipe], record: dict, out: Path) -> dict:
    """`--one-seed`: the frozen recipes on `toy_world_qa.ONE_SEED`, which no committed run reads, figured as a
    fresh seed is (`seed_figures`) and kept in `out`/one_seed.json with the recipes as the runs file froze them."""
    run = run_seed(recipes, qa.ONE_SEED, out / f"seed-{qa.ONE_SEED}")
    figures = {"seed": qa.ONE_SEED, "group": "test", **seed_figures(run), "recipes": record}
    out.mkdir(parents=True, exist_ok=True)
    (out / "one_seed.json").write_text(json.dumps(figures, indent=1))
    return figures


def one_seed_line(figures: dict) -> str:
    fields = {"one_seed": figures["seed"], "group": figures["group"]}
    fields |= {
        f"{system}_{kind}_em": figures[system]["test"][kind] for system in ("edmem", "encdec") for kind in GOALS
    }
    fields |= {key: figures[key] for key in ("entity_gap_edmem_minus_encdec", "literal_gap_edmem_minus_encdec")}
    return "RESULT " + " ".join(f"{key}={value}" for key, value in fields.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/qa-fresh-seeds"), help="working directory (reused)")
    parser.add_argument("--ledger", type=Path, default=LEDGER, help="EncDec's tuning ledger (qa_tuning.py's results)")
    parser.add_argument("--edmem-ledger", type=Path, default=EDMEM_LEDGER,
                        help="EDMem's tuning ledger, where it was tried with EncDec's choice")  # fmt: skip
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="the results file, written once every seed is done (committed)")  # fmt: skip
    parser.add_argument("--runs", type=Path, default=RUNS,
                        help="the frozen recipes and each finished seed's run, written as each seed finishes "
                             "(committed: a rerun elsewhere runs only the seeds it lacks)")  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", choices=SEEDS, default=list(SEEDS),
                        help="the fresh seeds to run now (the results file waits for all three)")  # fmt: skip
    parser.add_argument("--one-seed", action="store_true",
                        help=f"a check anyone can run: the frozen recipes on seed {qa.ONE_SEED} (no committed run's), "
                             "both systems side by side, about an hour on 2 cores; figures in --out/one_seed.json, "
                             "no committed file written")  # fmt: skip
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    out = args.out
    try:
        recipes, ledgers = frozen_recipes(args.ledger, args.edmem_ledger)
        if args.results.exists() and not args.one_seed:
            raise Refused(f"{args.results} exists: the fresh seeds' test group was read; give --results elsewhere")
        if args.one_seed and not args.runs.exists():
            raise Refused(f"{args.runs} does not exist: --one-seed runs the recipes the fresh seeds froze")
        record = freeze(recipes, ledgers, args.ledger, args.runs)  # refused where the recipes moved since
    except Refused as reason:
        print(f"qa_fresh_seeds.py refused: {reason}", file=sys.stderr)
        return 1
    quiet_logging()
    if args.one_seed:
        print(one_seed_line(one_seed(recipes, record, out)))
        return 0
    runs = json.loads(args.runs.read_text())["runs"]
    for seed in sorted(set(args.seeds) - {run["seed"] for run in runs}):
        runs.append(json.loads(json.dumps(run_seed(recipes, seed, out / f"seed-{seed}"))))  # as a rerun reads it
        save_runs(args.runs, record, runs)
        copy_logs(seed, recipes, out, args.results.parent)
        print(f"seed {seed} done: {args.runs} holds seeds {sorted(run['seed'] for run in runs)}", flush=True)
    if len(runs) < len(SEEDS):
        print(f"the results file waits for seeds {sorted(set(SEEDS) - {run['seed'] for run in runs})}")
        return 0
    result = fresh_result(record, ledgers, sorted(runs, key=lambda run: run["seed"]), recipes["edmem"].settings)
    publish(result, out, args.results, plots=not args.no_plots)
    print(statement(result))
    print(result_line(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Tuning a system of the knowledge experiment on the validation groups: each setting pre-trained on the worlds of
the validation seeds and scored on their validation people only (the test group is never predicted).

The knowledge claim (docs/evidence.md) compares EDMem with EncDec under one recipe: the fine-tuning group's
questions in the pre-training batches, 30,000 steps, no fine-tuning. EDMem's levers were chosen on the validation
group; this gives EncDec the same budget: each lever that acts on it (`SETTINGS`: learning rate, dropout, weight
decay, the questions' share in the batches, steps), on seeds 0, 1 and 2, with the choice made on the mean of the
three validation groups before any test group is read.

    python benchmarks/qa_tuning.py --settings lr_1e-3 dropout_0 --out runs/qa-tuning      # one worker
    python benchmarks/qa_tuning.py --combine --out runs/qa-tuning                         # the results file

Each (setting, seed) is a folder of its own and is reused on a rerun (pre-training resumes from its last
checkpoint), so two workers with different `--settings` may share one `--out` once the worlds are built
(`--worlds-only` builds them). The results file (`--results`, committed) is the ledger: every finished (setting,
seed) is recorded there with its per-question hits, and is not run again on another machine. Ends with one line
`RESULT key=value ...`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import toy_world_qa as qa  # noqa: E402
from experiments.options import quiet_logging  # noqa: E402
from experiments.qa_world import make_world  # noqa: E402
from experiments.scoring import bootstrap, em, question_hits  # noqa: E402
from experiments.training import PAPER, predict, pretrain_variant  # noqa: E402

# The recipe both systems are compared under (the headline's): questions in the batches, 30,000 steps, no
# fine-tuning, one pre-training at a time.
BASE = qa.Settings(pretrain_steps=30_000, questions_in_batches=True, finetune_epochs=0.0, encmem=False,
                   encdec_matched=False, single_biography_ablation=False, memory_hidden_in_finetuning=False,
                   pretrain_jobs=1, read_test=False)  # fmt: skip

# name -> (changes to the experiment's Settings, more pre-training options by name: `pretraining_options`). "default"
# is the headline's EncDec.
SETTINGS: dict[str, tuple[dict, dict]] = {
    "default": ({}, {}),  # run by toy_world_qa.py in the headline: its validation figures are read from there
    "lr_1e-3": ({"pretrain_learning_rate": 1e-3}, {}),
    "questions_share_0.5": ({}, {"mixed_questions_share": 0.5}),
    "dropout_0": ({}, {"dropout": 0.0}),
    "weight_decay_0.1": ({}, {"weight_decay": 0.1}),
    "steps_60000": ({"pretrain_steps": 60_000}, {}),
}


def run_setting(system: str, name: str, seed: int, out: Path) -> dict:
    """`system` pre-trained under setting `name` on the world of `seed` and asked its validation group (free
    decoding): EM on entity and literal answers. Reuses the world in `out / seed-N` and what the folder holds."""
    changes, options = SETTINGS[name]
    settings = replace(BASE, **changes)
    world_dir = out / f"seed-{seed}"
    data = make_world(settings, seed, world_dir)
    model_dir = world_dir / f"pretrain-{system}-{name}"
    recipe = qa.RECIPES["el_per_token"] if system == "edmem" else PAPER
    pretrain_variant(system, data["corpus"], model_dir, settings, seed, None, recipe, data["mixed_questions"],
                        **options)  # fmt: skip
    files = data["files"]
    predictions = predict(model_dir, files["validation"], model_dir / "validation-free", "free", settings, seed)
    hits = question_hits(files["validation"], files["validation_links"], predictions)
    return {"system": system, "setting": name, "seed": seed, "changes": changes, "options": options,
            "em": em(hits), "hits": hits}  # fmt: skip


VALIDATION_SEEDS = [0, 1, 2]
FIGURES = Path(__file__).resolve().parents[1] / "docs/images/toy_world_qa_fair_world"
HEADLINE = FIGURES / "test_3seeds_questions_in_batches_30000_steps_el_per_token.json"
RESULTS = FIGURES / "encdec_tuning_validation_seeds012.json"  # EncDec's ledger, which qa_fresh_seeds.py reads


def results_file(system: str) -> Path:
    """A system's ledger: each system its own file, so that tuning one never rewrites the other's."""
    return RESULTS if system == "encdec" else FIGURES / f"{system}_tuning_validation_seeds012.json"


# The settings each system was read with on the validation group before this tuning (the fair world; docs/evidence.md
# and its appendix, files in docs/images/archive/toy_world_qa_fair_world/ but the last): both systems in each run but
# for the levers that act on EDMem alone (its linking loss).
PRIOR_SETTINGS = {
    "paper recipe, 7,500 steps, fine-tuned": ("edmem", "encdec"),
    "fine-tuning lambda_EL 0.5": ("edmem",),
    "questions on shuffled pages, 7,500 steps": ("edmem", "encdec"),
    "questions on shuffled pages, 15,000 steps": ("edmem", "encdec"),
    "questions in the batches, 7,500 steps, fine-tuned": ("edmem", "encdec"),
    "questions in the batches, 7,500 steps, not fine-tuned": ("edmem", "encdec"),
    "masked spans, 7,500 steps, fine-tuned": ("edmem", "encdec"),
    "masked spans, 7,500 steps, not fine-tuned": ("edmem", "encdec"),
    "questions in the batches, 15,000 steps, fine-tuned": ("edmem", "encdec"),
    "15,000 steps, lighter fine-tuning: 3 epochs at 1e-4": ("edmem", "encdec"),
    "15,000 steps, lighter fine-tuning: 10 epochs at 1e-4": ("edmem", "encdec"),
    "15,000 steps, lighter fine-tuning: 3 epochs at 3e-4": ("edmem", "encdec"),
    "15,000 steps, lighter fine-tuning: 10 epochs at 3e-4": ("edmem", "encdec"),
    "questions in the batches, 30,000 steps, not fine-tuned (the headline's EncDec)": ("edmem", "encdec"),
    "the same, the linking loss per LM token (the headline's EDMem)": ("edmem",),
}


def headline_default(system: str, seeds: list[int]) -> dict:
    """The default setting's validation figures, from the committed headline run (the same worlds and models)."""
    runs = [run for run in json.loads(HEADLINE.read_text())["runs"] if run["seed"] in seeds]
    key = "edmem_free" if system == "edmem" else "encdec"
    per_seed = {run["seed"]: run["em"]["validation"][key] for run in runs}
    means = {kind: round(statistics.fmean(em[kind] for em in per_seed.values()), 2) for kind in ("entity", "literal")}
    return {"seeds": sorted(per_seed), "em": means, "per_seed": per_seed, "changes": {}, "options": {},
            "from": HEADLINE.name}  # fmt: skip


def recorded(results: Path, system: str) -> dict[tuple[str, int], dict]:
    """The finished runs the results file holds: (setting, seed) -> the run (its EM and hits)."""
    if not results.exists():
        return {}
    data = json.loads(results.read_text())
    return {(run["setting"], run["seed"]): run for run in data.get("runs", []) if run["system"] == system}


def combine(out: Path, system: str, seeds: list[int], results: Path, samples: int = 1000) -> dict:
    """The results file: the finished runs (those it held and those in `out`), and per setting the mean EM over the
    seeds done with its seed-level interval; the setting chosen (the highest mean of entity and literal EM) among
    the settings every seed has finished."""
    runs = recorded(results, system)
    for name in SETTINGS:
        for seed in seeds:
            if (p := out / f"seed-{seed}" / f"pretrain-{system}-{name}" / "validation.json").exists():
                runs[(name, seed)] = json.loads(p.read_text())
    settings = {"default": headline_default(system, seeds)}
    for name in SETTINGS:
        done = [runs[(name, seed)] for seed in seeds if (name, seed) in runs]
        if name == "default" or not done:
            continue
        interval = bootstrap([[tuple(h) for h in run["hits"]] for run in done], samples)
        means = {kind: round(statistics.fmean(run["em"][kind] for run in done), 2) for kind in ("entity", "literal")}
        settings[name] = {"seeds": [run["seed"] for run in done], "em": means, "interval": interval,
                          "per_seed": {run["seed"]: run["em"] for run in done}, "changes": done[0]["changes"],
                          "options": done[0]["options"]}  # fmt: skip
    complete = {name: s for name, s in settings.items() if sorted(s["seeds"]) == sorted(seeds)}
    chosen = max(complete, key=lambda n: complete[n]["em"]["entity"] + complete[n]["em"]["literal"], default=None)
    tried = {name: sum(name in systems for systems in PRIOR_SETTINGS.values()) for name in ("edmem", "encdec")}
    tried[system] += len([name for name in complete if name != "default"])
    result = {"system": system, "group": "validation", "validation_seeds": seeds, "test_group_reads": 0,
              "base": asdict(BASE), "rule": "the highest mean over the validation seeds of entity EM + literal EM",
              "complete": sorted(complete), "chosen": chosen if len(complete) == len(SETTINGS) else None,
              "best_so_far": chosen, "settings": settings,
              "prior_validation_settings": {name: list(systems) for name, systems in PRIOR_SETTINGS.items()},
              "edmem_settings_tried": tried["edmem"], "encdec_settings_tried": tried["encdec"],
              "runs": [runs[key] for key in sorted(runs)]}  # fmt: skip
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/qa-tuning")
    parser.add_argument("--system", default="encdec", choices=("encdec", "edmem"))
    parser.add_argument("--settings", nargs="+", choices=tuple(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--seeds", type=int, nargs="+", default=VALIDATION_SEEDS,
                        help="the validation seeds to run now (the results file always covers all three)")  # fmt: skip
    parser.add_argument("--worlds-only", action="store_true", help="build the seeds' worlds and stop")
    parser.add_argument("--combine", action="store_true", help="write the results file from the runs done")
    parser.add_argument("--results", type=Path,
                        help="the results file, the ledger of finished runs (committed; default: the system's own, "
                             f"{RESULTS.name} for EncDec)")  # fmt: skip
    args = parser.parse_args(argv)
    quiet_logging()
    out, args.results = Path(args.out), args.results or results_file(args.system)
    if args.worlds_only:
        for seed in args.seeds:
            make_world(BASE, seed, out / f"seed-{seed}")
        return 0
    if not args.combine:
        done = recorded(args.results, args.system)
        for name in args.settings:
            for seed in args.seeds:
                path = out / f"seed-{seed}" / f"pretrain-{args.system}-{name}" / "validation.json"
                if name != "default" and not path.exists() and (name, seed) not in done:
                    result = run_setting(args.system, name, seed, out)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(json.dumps(result))
                    qa.logger.info("%s %s seed %d: %s", args.system, name, seed, result["em"])
    result = combine(out, args.system, VALIDATION_SEEDS, args.results)
    print(f"RESULT system={args.system} group=validation edmem_settings_tried={result['edmem_settings_tried']} "
          f"encdec_settings_tried={result['encdec_settings_tried']} complete={len(result['complete'])} "
          f"chosen={result['chosen']} best_so_far={result['best_so_far']} test_group_reads=0")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
(`--worlds-only` builds them). Ends with one line `RESULT key=value ...`.
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


HEADLINE = (
    Path(__file__).resolve().parents[1]
    / "docs/images/toy_world_qa_fair_world"
    / ("test_3seeds_questions_in_batches_30000_steps_el_per_token.json")
)


def headline_default(system: str, seeds: list[int]) -> dict:
    """The default setting's validation figures, from the committed headline run (the same worlds and models)."""
    runs = [run for run in json.loads(HEADLINE.read_text())["runs"] if run["seed"] in seeds]
    key = "edmem_free" if system == "edmem" else "encdec"
    per_seed = {run["seed"]: run["em"]["validation"][key] for run in runs}
    means = {kind: round(statistics.fmean(em[kind] for em in per_seed.values()), 2) for kind in ("entity", "literal")}
    return {"seeds": sorted(per_seed), "em": means, "per_seed": per_seed, "changes": {}, "options": {},
            "from": HEADLINE.name}  # fmt: skip


def combine(out: Path, system: str, seeds: list[int], samples: int = 1000) -> dict:
    """The results file: per setting, the mean EM over the seeds done with its seed-level interval, and the
    setting chosen (the highest mean of entity and literal EM over the complete settings)."""
    settings = {"default": headline_default(system, seeds)}
    for name in SETTINGS:
        if name == "default":
            continue
        runs = [json.loads(p.read_text()) for seed in seeds
                if (p := out / f"seed-{seed}" / f"pretrain-{system}-{name}" / "validation.json").exists()]  # fmt: skip
        if not runs:
            continue
        interval = bootstrap([[tuple(h) for h in run["hits"]] for run in runs], samples)
        means = {kind: round(statistics.fmean(run["em"][kind] for run in runs), 2) for kind in ("entity", "literal")}
        settings[name] = {"seeds": [run["seed"] for run in runs], "em": means, "interval": interval,
                          "per_seed": {run["seed"]: run["em"] for run in runs}, "changes": runs[0]["changes"],
                          "options": runs[0]["options"]}  # fmt: skip
    complete = {name: s for name, s in settings.items() if sorted(s["seeds"]) == sorted(seeds)}
    chosen = max(complete, key=lambda n: complete[n]["em"]["entity"] + complete[n]["em"]["literal"], default=None)
    result = {"system": system, "group": "validation", "validation_seeds": seeds, "test_group_reads": 0,
              "base": asdict(BASE), "rule": "the highest mean over the validation seeds of entity EM + literal EM",
              "settings_tried": len(settings), "settings": settings, "chosen": chosen}  # fmt: skip
    (out / f"tuning_{system}.json").write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/qa-tuning")
    parser.add_argument("--system", default="encdec", choices=("encdec", "edmem"))
    parser.add_argument("--settings", nargs="+", choices=tuple(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--worlds-only", action="store_true", help="build the seeds' worlds and stop")
    parser.add_argument("--combine", action="store_true", help="write the results file from the runs done")
    args = parser.parse_args(argv)
    quiet_logging()
    out = Path(args.out)
    if args.worlds_only:
        for seed in args.seeds:
            make_world(BASE, seed, out / f"seed-{seed}")
        return 0
    if not args.combine:
        for name in args.settings:
            for seed in args.seeds:
                path = out / f"seed-{seed}" / f"pretrain-{args.system}-{name}" / "validation.json"
                if not path.exists():
                    result = run_setting(args.system, name, seed, out)
                    path.write_text(json.dumps(result))
                    qa.logger.info("%s %s seed %d: %s", args.system, name, seed, result["em"])
    result = combine(out, args.system, args.seeds)
    print(f"RESULT system={args.system} group=validation settings_tried={result['settings_tried']} "
          f"chosen={result['chosen']} test_group_reads=0")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

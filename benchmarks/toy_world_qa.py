"""Knowledge the memory holds: EDMem against EncDec (no memory) and EncMem (encoder + memory) on closed-book QA
about people the models have only read about, with the paper's orderings (Tables 1-2, Figures 3-4) as the
questions asked, in the protocol of Allen-Zhu and Li, *Physics of Language Models, Part 3.1* (2023).

For each seed: a knowledge world (`edmem_hf.knowledge_world`: people named from shared pools of first and last
names, with independent attributes, each in several biographies of varied templates and sentence orders) is
rendered as a MediaWiki dump; `edmem build-corpus` turns it into passages; EDMem, EncDec and EncMem are pre-trained
from scratch by `edmem pretrain` with the same steps, widths and seed. Every person is in pre-training. The people
are then cut in three groups: question answering is fine-tuned on the questions about half of them (all six
forms; `edmem finetune`, the stock Seq2SeqTrainer; EncMem with the authors' linking recipe); the
validation group's questions are asked to choose recipes and settings (`--no-test` asks nothing else); the test
group's are read once a recipe. Exact match (`edmem evaluate`'s code), overall, on entity answers and on literal
answers, beside the majority answer of each question form, with 95 % intervals that resample the seeds and then
each seed's questions.

Also measured: memorisation (each pre-trained model filling a masked fact in a person's first biography, and the
same fact with the subject named to the encoder only: what a question can read out); the memory's share (the
fine-tuned EDMem and EncMem tested with every memory row hidden, or only the asked subjects' rows, at test time
only; and EDMem fine-tuned and tested with the memory hidden, the authors' entity mask); parameter counts with and
without the entity table; the single-biography ablation beside the varied world. `--recipes` runs the levers
(`RECIPES`: the linking loss's weight and reduction, numbers as salient spans) beside the paper's settings.

The plain command runs the recipe of docs/evidence.md's headline (`HEADLINE`: the fine-tuning group's questions in
the pre-training batches, 30,000 steps, no fine-tuning, `--recipes el_per_token`, EDMem and EncDec only); `--setup
paper` runs the paper's (7,500 steps, the questions on the pages, fine-tuning, every system and ablation).

    python benchmarks/toy_world_qa.py --out runs/toy-qa                  # the headline's recipe, 3 seeds
    python benchmarks/toy_world_qa.py --setup paper --out runs/toy-qa-paper
    python benchmarks/toy_world_qa.py --quick --out runs/toy-qa-quick    # a smoke run: the pipeline, not the claim

A rerun with the same `--out` reuses what is done (corpus, pre-training, fine-tuning, predictions).
Ends with one line `RESULT key=value ...` (means over seeds).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from experiments.options import experiment_parser, quiet_logging, with_overrides  # noqa: E402
from experiments.plots import plot_qa, plot_recipes  # noqa: E402
from experiments.probes import memorisation  # noqa: E402
from experiments.qa_systems import measure_systems, pretrain_systems  # noqa: E402
from experiments.qa_world import make_world  # noqa: E402
from experiments.scoring import em, gaps, orderings, question_hits, reported_group, summarise, validity  # noqa: E402
from experiments.training import PAPER, Recipe, finetune_model, predict, pretrain_side_by_side  # noqa: E402

logger = logging.getLogger("toy_world_qa")
RECIPES = {  # the levers tried on the validation group (`Recipe`), by name
    "paper": PAPER,
    "el_weight_0.5": Recipe(entity_loss_weight=0.5, finetune_entity_loss_weight=0.5),
    "el_per_token": Recipe(entity_loss_reduction="per_lm_token"),
    "salient_numbers": Recipe(number_mask_prob=0.5),
    "finetune_el_weight_0.5": Recipe(finetune_entity_loss_weight=0.5),
    "finetune_el_weight_2": Recipe(finetune_entity_loss_weight=2.0),
    "masked_spans": Recipe(decoder_target="masked_spans"),
}


@dataclass
class Settings:
    num_people: int = 100  # the standard size: 25 test people, 150 test questions a seed
    biographies: int = 5
    fullname: bool = False  # every sentence names the person in full (the study's fullname augmentation)
    seeds: tuple[int, ...] = (0, 1, 2)
    d_model: int = 64
    layers: int = 1  # lower and upper layers on each side (each)
    entity_embed_dim: int = 64
    pretrain_steps: int = 7500  # about 150 readings of each passage
    pretrain_batch_size: int = 8
    pretrain_learning_rate: float = 3e-3
    mix_qa: bool = True  # the fine-tuning half's questions and answers also in pre-training (every system)
    shuffled_questions: bool = False  # ... on pages of their own, people mixed (else a section of each person's page)
    questions_in_batches: bool = False  # ... in the training batches in the fine-tuning format (not on pages)
    finetune_epochs: float = 60.0
    finetune_learning_rate: float = 1e-3
    finetune_batch_size: int = 32
    encmem: bool = True
    encdec_matched: bool = True  # also an EncDec of EDMem's parameter count (its feed-forward layers widened)
    memory_hidden_in_finetuning: bool = True  # EDMem fine-tuned and tested with no memory row visible
    single_biography_ablation: bool = True  # on the first seed, EDMem and EncDec
    bootstrap_samples: int = 1000
    validation_fraction: float = 0.25  # people asked questions only to choose recipes and settings
    read_test: bool = True  # False: choose on the validation group; the test group is neither predicted nor scored
    recipes: tuple[str, ...] = ("paper",)  # the first is the one the RESULT line reports
    valid_entity_em: float = 50.0  # the bar of a valid experiment (issue 27, item 4)
    valid_entity_margin: float = 30.0
    valid_literal_margin: float | None = 10.0  # None: not required
    pretrain_jobs: int = 2  # pre-trainings run side by side, one process and one thread each

    @property
    def questions_on_pages(self) -> bool:
        """The fine-tuning half's questions are text on pages of the pre-training world."""
        return self.mix_qa and not self.questions_in_batches

    def mixed_questions(self, train_file: Path) -> Path | None:
        """The QA file mixed into the pre-training batches (`train_file`), or None when no questions go there."""
        return train_file if self.mix_qa and self.questions_in_batches else None


# The recipe of the headline (docs/evidence.md, "The fair world": the settings recorded in
# docs/images/toy_world_qa_fair_world/test_3seeds_questions_in_batches_30000_steps_el_per_token.json): the fine-tuning
# group's questions in the pre-training batches, 30,000 steps, no fine-tuning, a mention's linking loss weighed as one
# LM token, EDMem beside EncDec alone, one pre-training at a time. What the plain command runs.
HEADLINE = Settings(pretrain_steps=30_000, questions_in_batches=True, finetune_epochs=0.0, encmem=False,
                    encdec_matched=False, memory_hidden_in_finetuning=False, single_biography_ablation=False,
                    recipes=("el_per_token",), pretrain_jobs=1)  # fmt: skip
# `--setup`: the headline's recipe, or the paper's (`Settings`' defaults: 7,500 steps, the questions as text on their
# subjects' pages, 60 epochs of fine-tuning, every system and ablation beside EDMem).
SETUPS = {"headline": HEADLINE, "paper": Settings()}

# One seed of a 40-person world (20 fine-tuning people: at 10, EncDec's fine-tuning does not learn the task; 10
# validation and 10 test people), as many readings of each biography as the standard run.
QUICK = Settings(num_people=40, pretrain_steps=3000, seeds=(0,), encmem=False, encdec_matched=False,
                 memory_hidden_in_finetuning=False, single_biography_ablation=False, valid_entity_em=40.0,
                 valid_entity_margin=25.0, valid_literal_margin=None)  # fmt: skip


def run_condition(settings: Settings, seed: int, out: Path, varied: bool = True, ablation: bool = False,
                  recipe: Recipe = PAPER) -> dict:  # fmt: skip
    """One seed's world, models and predictions under `recipe`; `ablation` trains EDMem and EncDec only, tested
    plainly. Questions are asked of the validation group, and of the test group when `settings.read_test`. Models
    are kept under folders named by what sets them apart from the paper's, so that recipes share what they can."""
    started = time.perf_counter()
    data = make_world(settings, seed, out, varied)
    asked = ["validation", "test"] if settings.read_test else ["validation"]
    variants = ("edmem", "encdec") if ablation or not settings.encmem else ("edmem", "encdec", "encmem")
    models = pretrain_systems(settings, seed, out, data, recipe, variants, settings.encdec_matched and not ablation)
    return {
        "seed": seed,
        "varied": varied,
        "recipe": asdict(recipe),
        "questions": {group: len(pairs) for group, pairs in data["splits"].items()},
        **measure_systems(settings, seed, out, data, models, asked, recipe, ablation),
        # this call's time: what a rerun with the same --out reuses (pre-training, fine-tuning) costs nothing here
        "seconds_this_call": round(time.perf_counter() - started),
    }


def pretraining_curve(settings: Settings, seed: int, out: Path, budgets: list[int]) -> list[dict]:
    """EM against pre-training steps: EDMem and EncDec pre-trained from scratch for each budget on the world of
    `seed` (its corpus, in `out / f"seed-{seed}"`), fine-tuned as in the run; memorisation and EM (free decoding)
    of the validation group a budget (a choice: made on the validation group)."""
    data = make_world(settings, seed, out / f"seed-{seed}")
    people = sorted({pair.subject for pair in data["splits"]["validation"]})
    files = data["files"]
    points = []
    for steps in budgets:
        budget = replace(settings, pretrain_steps=steps)
        where = out / f"curve-seed-{seed}" / f"steps-{steps}"
        point: dict = {"steps": steps}
        pretrained_models = pretrain_side_by_side(
            {variant: (variant, data["corpus"], where / f"pretrain-{variant}", budget, seed, None, PAPER,
                       data["mixed_questions"]) for variant in
             ("edmem", "encdec")}, settings.pretrain_jobs)  # fmt: skip
        for variant in ("edmem", "encdec"):
            pretrained = pretrained_models[variant]
            finetuned = finetune_model(pretrained, data["files"]["train"], where / f"finetune-{variant}", budget, seed)
            predictions = predict(finetuned, files["validation"], finetuned / "validation-free", "free", budget, seed)
            memorised = memorisation(pretrained, data["world"], {"validation": people})["validation"]["all"]
            point[variant] = {
                "memorisation_validation": memorised,
                "em_validation": em(question_hits(files["validation"], files["validation_links"], predictions)),
            }
            logger.info("curve, seed %d, %d steps, %s: %s", seed, steps, variant, point[variant])
        points.append(point)
    return points


# Said by every --quick run: at its size no seed has answered a question about a person it only read of.
SMOKE_RUN = ("--quick is a smoke run: 40 people, one seed, the paper's recipe, sized to show the pipeline in minutes, "
             "not the claim (no system answers above the floor at this size: docs/evidence.md); the shortest run "
             "that can show the claim is benchmarks/qa_fresh_seeds.py --one-seed")  # fmt: skip
# Seeds no committed run of this experiment has used (0-2 chose the recipes and read their test groups, --quick's
# smoke runs used 3-5 at its size): the fresh-seed protocol's (qa_fresh_seeds.py), whose test groups are read once;
# `qa_fresh_seeds.py --one-seed`'s is another, so that a check anyone runs reads none of theirs.
FRESH_SEEDS = (6, 7, 8)
ONE_SEED = 9


def qa_parser() -> argparse.ArgumentParser:
    parser = experiment_parser(__doc__.split("\n")[0], "runs/toy-world-qa")
    parser.add_argument("--setup", choices=tuple(SETUPS),
                        help="headline (the default): the recipe of docs/evidence.md's headline, the questions in the "
                             "pre-training batches, 30,000 steps, no fine-tuning, --recipes el_per_token, EDMem and "
                             "EncDec; paper: the paper's, 7,500 steps, the questions on the pages, 60 epochs of "
                             "fine-tuning, EncMem, a matched EncDec and the ablations beside them. The options below "
                             "change either; --quick is a small world of the paper's setup")  # fmt: skip
    parser.add_argument("--curve", type=int, nargs="+", metavar="STEPS",
                        help="also EDMem and EncDec pre-trained for each of these step budgets on the first seed's "
                             "world (EM against pre-training steps)")  # fmt: skip
    parser.add_argument("--encdec-matched", action=argparse.BooleanOptionalAction,
                        help="also an EncDec of EDMem's parameter count (default: on, off in --quick)")  # fmt: skip
    parser.add_argument("--encmem", action=argparse.BooleanOptionalAction,
                        help="also EncMem (default: on, off in --quick)")  # fmt: skip
    parser.add_argument("--recipes", nargs="+", choices=tuple(RECIPES), metavar="RECIPE",
                        help=f"pre-training and fine-tuning recipes, each run on every seed; the first is reported "
                             f"(default: paper). Choices: {', '.join(RECIPES)}")  # fmt: skip
    parser.add_argument("--no-test", dest="read_test", action="store_false", default=None,
                        help="choose on the validation group: the test group is neither predicted nor scored")  # fmt: skip
    parser.add_argument("--memory-hidden-in-finetuning", action=argparse.BooleanOptionalAction,
                        help="also EDMem fine-tuned and tested with every memory row hidden (default: on, off in "
                             "--quick)")  # fmt: skip
    parser.add_argument("--single-biography-ablation", action=argparse.BooleanOptionalAction,
                        help="also the single-biography world on the first seed (default: on, off in --quick)")  # fmt: skip
    return parser


def qa_settings(args: argparse.Namespace) -> Settings:
    """The run's settings: `--quick`'s, or `--setup`'s (the headline's by default), with the command line's
    overrides and switches."""
    if args.quick and args.setup:
        raise ValueError("--quick is a small world of the paper's setup: give --quick or --setup")
    settings = with_overrides(QUICK if args.quick else SETUPS[args.setup or "headline"], args)
    if args.recipes:
        settings = replace(settings, recipes=tuple(args.recipes))
    for switch in (
        "encdec_matched",
        "encmem",
        "single_biography_ablation",
        "memory_hidden_in_finetuning",
        "read_test",
    ):
        if getattr(args, switch) is not None:
            settings = replace(settings, **{switch: getattr(args, switch)})
    return settings


def main(argv: list[str] | None = None) -> int:
    parser = qa_parser()
    args = parser.parse_args(argv)
    try:
        settings = qa_settings(args)
    except ValueError as error:
        parser.error(str(error))
    quiet_logging()
    if args.quick:
        print(SMOKE_RUN, flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {name: [] for name in settings.recipes}
    for seed in settings.seeds:
        for name in settings.recipes:
            runs[name].append(run_condition(settings, seed, out / f"seed-{seed}", recipe=RECIPES[name]))
            write_results(settings, runs, [], out, plots=False)  # each seed's figures as soon as they exist
    reported = settings.recipes[0]
    ablation = []
    if settings.single_biography_ablation:
        ablation.append(run_condition(settings, settings.seeds[0], out / f"single-seed-{settings.seeds[0]}",
                                      varied=False, ablation=True, recipe=RECIPES[reported]))  # fmt: skip
    curve = pretraining_curve(settings, settings.seeds[0], out, args.curve) if args.curve else []
    result = write_results(settings, runs, ablation, out, plots=not args.no_plots, curve=curve)
    print(json.dumps({key: result[key] for key in ("validity", "orderings", "memory_hidden_drop")}, indent=1))
    print("RESULT " + " ".join(result_fields(settings, result)))
    return 0


def result_fields(settings: Settings, result: dict) -> list[str]:
    """The RESULT line's `key=value` fields: the reported recipe (its losses and masking by name, then the run's
    steps, where its questions go and its fine-tuning), its figures, then each other recipe's gaps."""
    validity = result["validity"]
    group = validity["group"]
    scores = result["summary"][group]
    fields = [f"seeds={len(result['runs'])}", f"people={settings.num_people}", f"group={group}",
              f"{group}_questions={result['runs'][0]['questions'][group]}", f"recipe={result['recipe']}",
              f"pretrain_steps={settings.pretrain_steps}", f"questions_in_batches={int(settings.questions_in_batches)}",
              f"finetune_epochs={settings.finetune_epochs:g}", f"valid={int(validity['valid'])}",
              f"valid_system={validity['valid_system']}", "seed_level_interval=1"]  # fmt: skip
    fields += [
        f"{key}={validity[key]}" for key in ("best_entity_em", "floor_entity", "best_literal_em", "floor_literal")
    ]
    fields += [f"{key}={value}" for key, value in result["gaps"].items()]
    fields += [f"memory_hidden_drop={result['memory_hidden_drop']}"]
    for name, system in scores.items():
        fields += [f"{name}_{key}={system['em'][key]}" for key in ("entity", "literal")]
    fields += [f"{name}={int(holds)}" for name, holds in result["orderings"].items()]
    for name, other in result.get("other_recipes", {}).items():
        fields += [f"{key}[{name}]={value}" for key, value in other["gaps"].items()]
    return fields


def recipe_result(settings: Settings, runs: list[dict]) -> dict:
    """One recipe's figures: validity, orderings, gaps, the memory's share, the summary and every seed's run."""
    summary = summarise(runs, settings.bootstrap_samples)
    scores = summary[reported_group(summary)]
    return {
        "recipe": runs[0]["recipe"],
        "validity": validity(summary, settings),
        "orderings": orderings(summary),
        "gaps": gaps(summary),
        "memory_hidden_drop": round(
            scores["edmem_free"]["em"]["entity"] - scores["edmem_free_every_row_hidden_at_test"]["em"]["entity"], 2
        ),
        "summary": summary,
        "runs": [{key: value for key, value in run.items() if key != "hits"} for run in runs],
    }


def write_results(settings: Settings, runs: dict[str, list[dict]], ablation: list[dict], out: Path, plots: bool,
                  curve: list[dict] | None = None) -> dict:  # fmt: skip
    """results.json (every figure of every seed, without the per-question hits) and the plots: the first recipe's
    figures at the top level, each other recipe's under `other_recipes`."""
    done = {name: recipe_runs for name, recipe_runs in runs.items() if recipe_runs}
    reported = next(iter(done))
    result = {"settings": asdict(settings), **recipe_result(settings, done[reported]), "recipe": reported,
              "recipe_settings": asdict(RECIPES[reported])}  # fmt: skip
    result["other_recipes"] = {name: recipe_result(settings, recipe_runs) for name, recipe_runs in done.items()
                               if name != reported}  # fmt: skip
    if ablation:
        result["single_biography"] = {
            "summary": summarise(ablation, settings.bootstrap_samples),
            "runs": [{key: value for key, value in run.items() if key != "hits"} for run in ablation],
        }
    if curve:
        full = done[reported][0]
        result["curve"] = [*curve, {"steps": settings.pretrain_steps, **{
            variant: {"memorisation_validation": full["memorisation"][variant]["validation"]["all"],
                      "em_validation": full["em"]["validation"]["edmem_free" if variant == "edmem" else "encdec"]}
            for variant in ("edmem", "encdec")}}]  # fmt: skip
    (out / "results.json").write_text(json.dumps(result, indent=1))
    if plots:
        result["plots"] = [str(p) for p in plot_qa(result["summary"], out, result.get("curve"))]
        if result["other_recipes"]:
            result["plots"].append(str(plot_recipes(result, out)))
    return result


if __name__ == "__main__":
    sys.exit(main())

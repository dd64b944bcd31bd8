"""New entities the model uses: people written into a trained EDMem's memory from their biographies, asked the same
questions as the people it was trained with (issue 27, item 5; docs/evidence.md).

For each seed, a knowledge world (`edmem_hf.knowledge_world`) loses some of its people (`without_people`: their
pages, every link to them, every question about them). EDMem is pre-trained on that smaller world and fine-tuned
on the questions about half of its people, as `toy_world_qa.py` does. Then the full world's dump arrives, the held-
out people's biographies among its pages, and they are added as `edmem add-entities` adds them
(`new_entity_passages`), each way of writing the rows in turn:

- `mean_query`: `entity_growth.add_entities` (the scaled mean memory query at their mentions, no gradient step);
- `fitted`: `row_fitting.fit_new_entities` (those rows, then trained alone on the pre-training objective over
  the new passages, with trained people's passages as negatives; every other weight frozen);
- `fitted_pretraining`: the mean-query rows trained alone (`row_fitting.fit_rows`) on the full world's
  pre-training passages (`edmem build-corpus` of the new dump: every mention marked and labelled, the places a
  person links to among them), those that mention a new person against the others;
- `random` (a control with no information, at the trained rows' norm).

Beside it, EDMem with a writer of entity rows (`EDMemConfig.entity_row_writer`; off with `--no-writer`), pre-trained
and fine-tuned reading rows written from other passages (`writer_batches.WriterCollator`), grown by
`add_entities` with its writer (`writer`; before adding: `writer_before`). With `--practice-people N`, N more people
are in the old world's pages (and its mixed questions), asked in no question file: the writer's training reads them
through written rows only (docs/model.md, "Practice entities"); every model reads the same pages. A stream of them
(docs/model.md, "A stream of practice entities"): `--practice-biographies K` puts each on their own page of K
biographies, linked from no other, `--practice-share S` makes their passages and questions S of those every model
reads (`edmem pretrain --balanced_entities_file`), `--practice-questions-people M` mixes the questions of M of them
(a world of its own: give it its own `--out`). `--practice-one-fact-pages K` states each practice person by one fact
only, on K pages of one sentence (`knowledge_world.one_fact_people`; a world of its own too);
`--practice-sentence-pages K` states each by every fact, each fact on K pages of one sentence
(`knowledge_world.sentence_page_people`, another world). With
`--written-table`, the writer's model leaves pre-training with every entity's row written from its passages
(`edmem pretrain --written_table`), in folders of its own (`writer-written-table`). With `--reader-steps N`, a second
stage of N steps follows, the writer and its table frozen (`edmem pretrain --frozen_writer`, TOME's second stage), in
folders of its own (`...-frozen-writer-N`); `--reader-names-like-written-only`, `--reader-row-autoencoding-share`,
`--reader-fresh-name-share` and `--reader-decoy-rows` are levers of that stage alone. `--writer-mean-row-probability`
trains the writer's model to give an entity of several rows the mean of their probabilities (`edmem pretrain
--writer_mean_row_probability`, `...-mean-rows`); `--mean-row-probability-at-test` reads a model trained without it
with it (a copy, `...-mean-rows-at-test`).
`--added-texts own-sentences` writes an added person's row (and a rewritten one) as
the mean of rows written from each sentence of their own page, not from the passages around their mentions.

Each model before and after adding (the default EDMem's and the writer's) is also read guided by names (a copy,
`...-name-guided`, with `EDMemConfig.name_guided_read`): the headline's figures are the guided reads', the plain
read's beside them (`..._plain`). `--validation-added-people` and `--validation-practice-people` give the choices
groups of their own (`added_validation`, `practice_validation`, never in a batch; the writer's first stage then logs
its reading signal, `edmem_hf.research.reading_signal`); the test groups are read once a recipe (`test_group_reads`).
`--first-stage-only`: that first stage alone, its signal in `first_stages.json`, what a first-stage lever is chosen
on. `--writer-restart-unless-learned` begins the first stage again with another training seed where it ends without
reading learnt, at most twice (`growth.first_stage_with_restarts`). `--no-default-edmem` trains the writer's model
alone (no default EDMem, no ceiling).

Scored by `edmem evaluate`'s code, free and static decoding: *added*, the six questions about each added person;
*trained*, the questions about the test-half people (read in pre-training, never fine-tuned on), before and after
adding. *Memory recall* is how often the memory's top entity at the question's marked subject is the subject. The
*floor* is the majority answer of each question form. The ceiling is continued pre-training: the grown pre-trained
model pre-trained further on the full world (`--continued-steps`, with the questions the pre-training mixed in), then
fine-tuned as before (skipped in `--quick`). Where each model keeps what it knows (`diagnostics`, for the default
EDMem with mean-query rows and for the writer; `edmem_hf.research.diagnostics`): *row swap*, trained people in
pairs, each one's questions answered with the encoder's memory read forced onto the partner's row, the share of
their answers that follow the row (`row_swap_read`; `row_swap`, the committed figure, swaps the table's rows, which
moves no answer: `table_row_swap`); *oracle read*, the added people's questions with the encoder's memory read forced
onto the subject's new row (EM with finding solved); *rewrite*, the trained
people's rows replaced by rows written from their passages (their EM kept); *row content*, a linear probe fitted on
the trained people's rows reading the added people's occupation and field from theirs; for the writer, *written
facts*, the shares of its rows' variance that a sentence's name and its fact explain, and a probe at the fact, and
*fact rows*, the added people's questions with each subject's row written from only the sentences holding the asked
answer (found, and with the read forced onto it), and with every fact's row of each in the table at once (which the
memory finds); with practice people, *name shape*, their questions answered (teacher-forced) through a row written in
the batch, the subject under its own name, a fresh name of any entities' words, or a fresh name of people's words.
Time to add 1,000 (and 100,000) entities is measured (`--timed-additions`).

The plain command runs the recipe of docs/evidence.md's headline, "Entities written from text" (`HEADLINE`: 200
practice people stated on one-sentence pages, the questions in the pre-training batches, 60,000 steps, no
fine-tuning; the writer's model in `edmem_hf`'s two named stages, `WRITER_RECIPES`' "rows_that_answer" then 10,000
steps of "frozen_writer"; the added people written a row a sentence; mean-query rows for the default EDMem; the
ceiling 10,000 steps more), seeds 0, 1 and 2 in one run; `--setup paper` runs the settings before it (toy_world_qa's
paper setup, every estimator, the writer's default training, the time to add).

    python benchmarks/toy_world_growth.py --out runs/growth                  # the headline's recipe, 3 seeds
    python benchmarks/toy_world_growth.py --setup paper --out runs/growth-paper
    python benchmarks/toy_world_growth.py --quick --out runs/growth-quick    # one seed of the paper's setup, small

A rerun with the same `--out` reuses what is done: seeds run apart (`--seeds 0`, ... with the same `--out`) are
combined by the plain command, every model reused. Seeds run on machines of their own (each its `--out`) are combined
from their results files by the same command line with `--combine`, which runs nothing:

    python benchmarks/toy_world_growth.py --seeds 3 --out runs/growth-3        # a seed a machine, its results.json
    python benchmarks/toy_world_growth.py --out runs/growth-345 --combine runs/growth-{3,4,5}/results.json

Ends with one line `RESULT key=value ...` (means over seeds).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from experiments import growth_scoring  # noqa: E402
from experiments.growth import (  # noqa: E402
    DEFAULT_ESTIMATOR,
    ESTIMATORS,
    NAME_GUIDED,
    TIMED_ESTIMATORS,
    WRITER,
    continue_pretraining,
    continued_folder,
    first_stage_restarts,
    first_stage_signal,
    grow,
    make_worlds,
    models_folder,
    practice_balance,
    pretrain_writer,
    texts_suffix,
    with_name_guided_read,
    writer_folder,
)
from experiments.growth_diagnostics import diagnostics, passage_facts, rows_alone_ceiling  # noqa: E402
from experiments.growth_options import growth_parser, with_growth_overrides  # noqa: E402
from experiments.options import quiet_logging  # noqa: E402
from experiments.plots import plot_growth  # noqa: E402
from experiments.scoring import floors  # noqa: E402
from experiments.timing import time_additions  # noqa: E402
from experiments.training import finetune_model, pretrain_variant  # noqa: E402
from toy_world_qa import QUICK as QA_QUICK  # noqa: E402
from toy_world_qa import RECIPES, Settings  # noqa: E402

from edmem_hf.research.writer_training import WRITER_RECIPES  # noqa: E402

logger = logging.getLogger("toy_world_growth")


@dataclass
class GrowthSettings:
    qa: Settings = field(default_factory=Settings)
    held_out_fraction: float = 0.2  # of the people: added after training, the test group of added people
    validation_added_people: int = 0  # more people added after training, asked for choices only (`added_validation`)
    # practice people whose questions no batch mixes, asked for choices only (`practice_validation`)
    validation_practice_people: int = 0
    fit_steps: int = 300
    fit_learning_rate: float = 3e-2
    negatives: int = 64  # trained people whose passages are the fit's negatives
    continued_steps: int = 1000  # continued pre-training on the full world, the ceiling (0: none)
    timed_additions: tuple[int, ...] = (1_000, 100_000)
    timed_estimators: tuple[str, ...] = TIMED_ESTIMATORS
    time_the_base_shape: bool = True
    estimators: tuple[str, ...] = ESTIMATORS  # the default EDMem's ways of writing rows (mean_query always)
    writer: bool = True  # also EDMem with a writer of entity rows (pre-trained and fine-tuned reading written rows)
    default_edmem: bool = True  # the default EDMem, grown by the estimators, and the ceiling continued from it
    written_row_share: float = 0.5
    written_only_share: float = 0.2
    writer_in_finetuning: bool = True  # fine-tuning reads written rows too (`--writer_corpus` of finetune_qa.py)
    # people in pre-training only (pages, and questions when they sit in the batches), never asked at test; the
    # writer's training reads them through written rows only, under fresh names (`--written_only_entities_file`)
    practice_people: int = 0
    # a stream of practice people: each on its own page only, of this many biographies (0: as the others), their
    # passages (and mixed questions) this share of those read in pre-training, every model alike
    # (`--balanced_entities_file`; 0: as the corpus has them), the questions of this many of them mixed (0: all)
    practice_biographies: int = 0
    practice_share: float = 0.0
    practice_questions_people: int = 0
    # each practice person stated by one fact only, on this many one-sentence pages (0: as the others)
    practice_one_fact_pages: int = 0
    # each practice person stated by every fact, each fact on this many one-sentence pages (0: as the others)
    practice_sentence_pages: int = 0
    written_table: bool = False  # the writer's model leaves pre-training with every row written (`--written_table`)
    row_autoencoding_share: float = 0.0  # the writer's training: passages read as their written row alone
    row_autoencoding_written_only: bool = False  # ... only passages about written-only (practice) entities
    writer_passages_by_mentions: bool = False  # the writer's training writes from passages that mention most
    writer_passages_per_row: int = 1  # the writer's training: each written row the mean of this many passages' rows
    writer_pools_texts: bool = True  # ... False: a row each of those passages, the query choosing among them
    writer_answer_rows: bool = False  # ... the linking gold among them: the rows naming what the passage hides
    writer_reads_answer_rows: bool = False  # ... and in training what such a mention reads
    writer_answer_rows_by_text: bool = False  # ... and, for a question, the rows whose passage holds its answer
    writer_mean_row_probability: bool = False  # the writer's model: an entity of several rows scored by their mean
    mean_row_probability_at_test: bool = False  # ... only once trained (a copy of the trained model with the option)
    entity_key_dim: int | None = None  # the writer's model: a row's columns that queries score (the rest its value)
    writer_dropout: float | None = None  # the writer's model's pre-training dropout (None: every model's, 0.1)
    writer_random_mask_prob: float | None = None  # ... and its per-token mask rate (None: every model's, 0.3)
    # the writer's first stage begun again with another training seed where it ends without reading learnt on
    # practice_validation (`growth.first_stage_with_restarts`; needs validation_practice_people)
    writer_restart_unless_learned: bool = False
    # what the writer writes an added (and a rewritten) person's row from: "passages", the windows around their
    # mentions that `edmem add-entities` takes; "own-sentences", each sentence of their own page, a row the mean of
    # one-sentence rows (as one-fact practice people's rows were written in training)
    added_texts: str = "passages"
    fresh_names_like_written_only: bool = False  # the writer's training: fresh names of written-only entities' words
    writer_decoy_rows: int = 0  # the writer's training: decoys sharing a word with each renamed entity's fresh name
    # the writer's training continued this many steps more (`--model_name_or_path`, the same options, a schedule of
    # its own): whether a first stage that reads no written row learns to with more steps
    writer_more_steps: int = 0
    # TOME's second stage: after the writer's pre-training, this many steps with the writer, the lower encoder layers
    # and the table frozen (`--frozen_writer`), every entity of a batch read through a row written from another passage
    reader_steps: int = 0
    reader_names_like_written_only: bool = False  # the second stage only: fresh names of written-only entities' words
    reader_row_autoencoding_share: float = 0.0  # the second stage only: practice people's passages auto-encoded
    reader_fresh_name_share: float = 0.0  # the second stage only: that share of the other written entities renamed
    reader_decoy_rows: int = 0  # the second stage only: decoys of each renamed entity (else the first stage's)
    reader_decoys_for_every_entity: bool = False  # ... of every written entity, the trained ones too
    recipe: str = "paper"  # pre-training and fine-tuning levers of toy_world_qa's RECIPES (every model alike)


QUICK = GrowthSettings(qa=QA_QUICK, fit_steps=150, continued_steps=0, timed_additions=(1_000,),
                       time_the_base_shape=False)  # fmt: skip


def writer_recipe(name: str) -> dict:
    """The settings of `edmem_hf`'s named writer recipe `name` (`WRITER_RECIPES`) that are `GrowthSettings`' fields
    of the same name (the writer itself, `entity_row_writer`, is `GrowthSettings.writer`)."""
    return {key: value for key, value in WRITER_RECIPES[name].items() if key != "entity_row_writer"}


# The recipe of docs/evidence.md's "Entities written from text" (the settings recorded in docs/images/
# toy_world_growth_fair_world/results_seeds012_..._frozen_writer_10000_decoys_4_own_sentences.json): 100 people, 20
# added after training, 200 practice people each stated by every fact on two one-sentence pages, the questions in the
# pre-training batches, 60,000 steps, no fine-tuning; the writer's model without dropout in the two named stages of
# `WRITER_RECIPES`, "rows_that_answer", then 10,000 steps of "frozen_writer" (its decoys; it reads every entity through
# written rows, `pretrain_reader`); each added person written a row a sentence of their page; the default EDMem grown
# with mean-query rows alone; the ceiling 10,000 steps more; nothing timed. What the plain command runs.
HEADLINE = GrowthSettings(qa=replace(Settings(), pretrain_steps=60_000, questions_in_batches=True,
                                     finetune_epochs=0.0),
                          practice_people=200, practice_sentence_pages=2, writer_dropout=0.0,
                          **writer_recipe("rows_that_answer"), reader_steps=10_000,
                          reader_decoy_rows=WRITER_RECIPES["frozen_writer"]["writer_decoy_rows"],
                          added_texts="own-sentences", estimators=("mean_query",), continued_steps=10_000,
                          timed_additions=(), time_the_base_shape=False)  # fmt: skip
# `--setup`: the headline's recipe, or the settings before it (`GrowthSettings`' defaults: toy_world_qa's paper setup,
# every estimator, the writer's default training, the time to add 1,000 and 100,000 entities).
SETUPS = {"headline": HEADLINE, "paper": GrowthSettings()}


def run_seed(settings: GrowthSettings, seed: int, out: Path) -> dict:
    """One seed: the old world, EDMem pre-trained (and fine-tuned) on it, grown by each estimator; EDMem with a
    writer, trained and grown by its writer; the ceiling; each model asked and scored; the diagnostics."""
    started = time.perf_counter()
    data = make_worlds(settings, seed, out)
    world, out = out, models_folder(out, settings)
    out.mkdir(parents=True, exist_ok=True)
    files, held = data["files"], data["held"]
    recipe, questions = RECIPES[settings.recipe], data["mixed_questions"]
    weight = recipe.finetune_entity_loss_weight
    models, seconds = {}, {}
    if settings.default_edmem:
        pretrained = pretrain_variant("edmem", data["corpus"], out / "pretrain-edmem", settings.qa, seed, None,
                                      recipe, questions, **practice_balance(settings, data))  # fmt: skip
        models["before"] = finetune_model(
            pretrained, files["train"], out / "finetune", settings.qa, seed, None, weight
        )
        logger.info("seed %d: pre-trained and fine-tuned without %d people (%.0f s)", seed, len(held),
                    time.perf_counter() - started)  # fmt: skip
        for estimator in dict.fromkeys((DEFAULT_ESTIMATOR, *settings.estimators)):
            models[estimator], seconds[estimator] = grow(models["before"], data["new_dump"], estimator,
                                                         out / f"grown-{estimator}", held, settings, seed,
                                                         data["train_people"])  # fmt: skip
    if settings.writer:
        folder = writer_folder(settings)
        writer = pretrain_writer(settings, data, out, seed, recipe, questions)
        options = ("--writer_corpus", str(data["corpus"])) if settings.writer_in_finetuning else ()
        options += ("--frozen_writer",) if options and settings.reader_steps else ()  # the second stage's writer kept
        models[f"{WRITER}_before"] = finetune_model(writer, files["train"], out / f"finetune-{folder}", settings.qa, seed,
                                                    None, weight, options=options)  # fmt: skip
        models[WRITER], seconds[WRITER] = grow(models[f"{WRITER}_before"], data["new_dump"], WRITER,
                                               out / f"grown-{folder}{texts_suffix(settings)}", held, settings, seed,
                                               data["train_people"])  # fmt: skip
    if settings.continued_steps and settings.default_edmem:  # the ceiling continues the default EDMem
        ceiling = continued_folder(settings)
        continued = continue_pretraining(pretrained, data["new_dump"], out / f"pretrain-{ceiling}", settings, seed,
                                         held, questions, recipe)  # fmt: skip
        models["continued_pretraining"] = finetune_model(continued, files["train"], out / f"finetune-{ceiling}",
                                                         settings.qa, seed, None, weight)  # fmt: skip
    for name in (DEFAULT_ESTIMATOR, "before", WRITER, f"{WRITER}_before"):  # each read guided by names too
        if name in models:
            models[name + NAME_GUIDED] = with_name_guided_read(models[name])
    results = growth_scoring.split_figures(models, data, settings, seed)
    asked = [files[split] for split in ("train", "test", "practice") if split in files]
    results["passage_facts"] = passage_facts(data["corpus"], asked)
    results["floor"] = floors(files, world)
    results["diagnostics"] = {}
    if settings.default_edmem:  # what its rows alone answer, and where it keeps what it knows
        results["rows_alone"] = rows_alone_ceiling(models["before"], files)
        results["diagnostics"]["default"] = diagnostics(models["before"], models[DEFAULT_ESTIMATOR], DEFAULT_ESTIMATOR,
                                                        files, data["new_dump"], seed,
                                                        out / "diagnostics-default.json")  # fmt: skip
    if settings.writer:
        results["diagnostics"][WRITER] = diagnostics(models[f"{WRITER}_before"], models[WRITER], WRITER, files,
                                                     data["new_dump"], seed,
                                                     out / f"diagnostics-{folder}{texts_suffix(settings)}.json",
                                                     (data["corpus"], data["practice_people"]) if data["practice"] else None,
                                                     settings.added_texts, settings.writer_passages_per_row)  # fmt: skip
    sizes = {split: sum(1 for _ in open(files[split], encoding="utf-8")) for split in ("train", "test", "added")}
    # this call's time: what a rerun with the same --out reuses (pre-training, fine-tuning) costs nothing here
    return {"seed": seed, "held_out": held, "questions": sizes, "results": results, "seconds_to_add": seconds,
            "models": {name: str(path) for name, path in models.items()},
            "first_stage_restarts": first_stage_restarts(out, settings) if settings.writer else None,
            "test_group_reads": growth_scoring.test_group_reads(world),
            "seconds_this_call": round(time.perf_counter() - started)}  # fmt: skip


def command_line() -> argparse.ArgumentParser:
    """The experiment's options (`experiments.growth_options`), `--setup` one of `SETUPS`."""
    return growth_parser(__doc__.split("\n")[0], tuple(SETUPS), tuple(RECIPES))


def growth_settings(args: argparse.Namespace) -> GrowthSettings:
    """The run's settings: `--quick`'s, or `--setup`'s (the headline's by default), with the command line's
    overrides; a ValueError names a combination refused."""
    if args.quick and args.setup:
        raise ValueError("--quick is a small world of the paper's setup: give --quick or --setup")
    return with_growth_overrides(QUICK if args.quick else SETUPS[args.setup or "headline"], args)


def main(argv: list[str] | None = None) -> int:
    parser = command_line()
    args = parser.parse_args(argv)
    try:
        settings = growth_settings(args)
    except ValueError as error:
        parser.error(str(error))
    if args.first_stage_only and not settings.validation_practice_people:
        parser.error("--first-stage-only reads its signal on practice_validation: give --validation-practice-people")
    if args.first_stage_only and args.combine:
        parser.error("--combine joins whole runs' results.json files; --first-stage-only writes first_stages.json")
    if args.combine and (Path(args.out) / "results.json").resolve() in {path.resolve() for path in args.combine}:
        parser.error("--combine would write over a results file it joins: give it an --out of its own")
    quiet_logging()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.first_stage_only:  # a lever of the writer's first stage, chosen on its reading signal
        stages = [first_stage_signal(settings, seed, out / f"seed-{seed}", RECIPES[settings.recipe])
                  for seed in settings.qa.seeds]  # fmt: skip
        (out / "first_stages.json").write_text(json.dumps({"settings": asdict(settings), "runs": stages}, indent=1))
        learned = sum(stage["reading_learned"] for stage in stages)
        print(f"RESULT seeds_run={len(stages)} validation_reading_learned_seeds={learned} group=practice_validation")
        return 0
    if args.combine:  # the seeds' runs made apart, each its results file: nothing runs, nothing is timed
        try:
            runs = growth_scoring.combined_runs(args.combine, json.loads(json.dumps(asdict(settings))))
        except ValueError as error:
            parser.error(str(error))
        settings = replace(settings, qa=replace(settings.qa, seeds=tuple(run["seed"] for run in runs)))
    else:
        runs = [run_seed(settings, seed, out / f"seed-{seed}") for seed in settings.qa.seeds]
    summary = growth_scoring.summarise(runs)
    headline = growth_scoring.headline_figures(summary, settings.writer) | growth_scoring.across_seeds(
        runs, settings.writer
    )
    result = {"settings": asdict(settings), "headline": headline, "runs": runs, "summary": summary}
    (out / "results.json").write_text(json.dumps(result, indent=1))  # the answers, before the timing
    timing = {}
    if settings.default_edmem and not args.combine:
        first = {name: Path(path) for name, path in runs[0]["models"].items()}  # fine-tuned, or pre-trained without it
        timing = time_additions(first["before"], settings.timed_additions, settings, out / "seconds_to_add.json",
                                settings.time_the_base_shape, first.get(f"{WRITER}_before"))  # fmt: skip
    result["seconds_to_add"] = timing
    (out / "results.json").write_text(json.dumps(result, indent=1))
    if not args.no_plots:
        result["plot"] = str(plot_growth(summary, out))
    print(json.dumps({"headline": headline, "summary": summary, "seconds_to_add": timing}, indent=1))
    print("RESULT " + " ".join(growth_scoring.result_fields(settings, runs, summary, headline, timing)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

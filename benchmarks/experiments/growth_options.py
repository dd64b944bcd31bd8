"""The command line of `toy_world_growth.py`: its options beside the ones the toy-world experiments share
(`options.experiment_parser`), the combinations it refuses, and the settings the options give."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from experiments.growth import ADDED_TEXTS, ESTIMATORS, TIMED_ESTIMATORS
from experiments.options import experiment_parser, with_overrides

if TYPE_CHECKING:
    from toy_world_growth import GrowthSettings

# the settings each option of the same name overrides when given
OVERRIDES = ("fit_steps", "continued_steps", "writer", "default_edmem", "written_row_share", "written_only_share",
             "recipe", "practice_people", "practice_biographies", "practice_one_fact_pages",
             "practice_sentence_pages", "practice_share", "practice_questions_people", "written_table",
             "row_autoencoding_share", "row_autoencoding_written_only", "writer_passages_by_mentions",
             "writer_passages_per_row", "writer_pools_texts", "writer_answer_rows", "writer_reads_answer_rows",
             "writer_answer_rows_by_text", "writer_mean_row_probability", "mean_row_probability_at_test",
             "entity_key_dim", "writer_dropout", "writer_random_mask_prob", "writer_restart_unless_learned",
             "added_texts", "fresh_names_like_written_only", "writer_decoy_rows", "writer_more_steps", "reader_steps",
             "reader_names_like_written_only", "reader_row_autoencoding_share", "reader_fresh_name_share",
             "reader_decoy_rows", "reader_decoys_for_every_entity", "time_the_base_shape", "validation_added_people",
             "validation_practice_people")  # fmt: skip


def growth_parser(description: str, setups: tuple[str, ...], recipes: tuple[str, ...]) -> argparse.ArgumentParser:
    """The experiment's parser: the shared options, `--setup` (one of `setups`) and the growth's own (`--recipe`: one
    of `recipes`, toy_world_qa's)."""
    parser = experiment_parser(description, "runs/toy-world-growth")
    parser.add_argument("--setup", choices=setups,
                        help="headline (the default): the recipe of docs/evidence.md's \"Entities written from "
                             "text\", seeds 0, 1 and 2 (the settings of its committed results); paper: the settings "
                             "before it, toy_world_qa's --setup paper (7,500 steps, the questions on the pages, "
                             "fine-tuning), every estimator, the writer's default training, timing. The options below "
                             "change either (the defaults they name are the paper setup's); --quick is a small world "
                             "of the paper's setup")  # fmt: skip
    parser.add_argument("--fit-steps", type=int, help="override the fitted estimator's steps")
    parser.add_argument("--continued-steps", type=int, help="override the continued pre-training steps (0: none)")
    parser.add_argument("--timed-additions", type=int, nargs="*", help="override the sizes timed (none: no timing)")
    parser.add_argument("--base-shape", dest="time_the_base_shape", action=argparse.BooleanOptionalAction,
                        help="also time at the edmem-base shape (default: off in the headline's setup, on in --setup "
                             "paper)")  # fmt: skip
    parser.add_argument("--timed-estimators", nargs="+", choices=TIMED_ESTIMATORS,
                        help="override the estimators timed (default: all)")  # fmt: skip
    parser.add_argument("--estimators", nargs="+", choices=ESTIMATORS,
                        help="the default EDMem's ways of writing rows to run (default: all; mean_query always)")  # fmt: skip
    parser.add_argument("--writer", action=argparse.BooleanOptionalAction,
                        help="also EDMem with a writer of entity rows (default: on)")  # fmt: skip
    parser.add_argument("--default-edmem", action=argparse.BooleanOptionalAction,
                        help="the default EDMem beside the writer, grown by the estimators, and the ceiling continued "
                             "from it (default: on; --no-default-edmem: the writer's model alone)")  # fmt: skip
    parser.add_argument("--written-row-share", type=float, help="the writer's training: share of written rows")
    parser.add_argument("--written-only-share", type=float, help="the writer's training: written-only entities")
    parser.add_argument("--practice-people", type=int,
                        help="people in pre-training only, read by the writer's training through written rows only")  # fmt: skip
    parser.add_argument("--practice-biographies", type=int,
                        help="a stream of practice people: each on its own page only, of this many biographies "
                             "(default: 0, as the others, on place pages too)")  # fmt: skip
    parser.add_argument("--practice-one-fact-pages", type=int,
                        help="each practice person stated by one fact only, on this many one-sentence pages "
                             "(default: 0, as the others)")  # fmt: skip
    parser.add_argument("--practice-sentence-pages", type=int,
                        help="each practice person stated by every fact, each fact on this many one-sentence pages "
                             "(default: 0, as the others)")  # fmt: skip
    parser.add_argument("--practice-share", type=float,
                        help="the practice people's passages (and mixed questions) this share of those read in "
                             "pre-training, every model alike (default: 0, as the corpus has them)")  # fmt: skip
    parser.add_argument("--practice-questions-people", type=int,
                        help="the questions of this many practice people mixed into pre-training (default: 0, all)")  # fmt: skip
    parser.add_argument("--validation-added-people", type=int,
                        help="more people added after training, asked in added_validation for choices only (a world "
                             "of its own: give it its own --out; default: 0)")  # fmt: skip
    parser.add_argument("--validation-practice-people", type=int,
                        help="practice people whose questions no batch mixes, asked in practice_validation for "
                             "choices only (a world of its own too; default: 0)")  # fmt: skip
    parser.add_argument("--written-table", action=argparse.BooleanOptionalAction,
                        help="the writer's model leaves pre-training with every row written from text (default: off)")  # fmt: skip
    parser.add_argument("--row-autoencoding-share", type=float,
                        help="the writer's training: share of the passages about a written entity read as its "
                             "written row alone, the decoder rebuilding the passage (default: 0)")  # fmt: skip
    parser.add_argument("--row-autoencoding-written-only", action=argparse.BooleanOptionalAction,
                        help="row auto-encoding of passages about written-only (practice) entities only (default: off)")  # fmt: skip
    parser.add_argument("--writer-passages-by-mentions", action=argparse.BooleanOptionalAction,
                        help="the writer's training draws the passage a row is written from in proportion to its "
                             "mentions of the entity (default: off, uniformly)")  # fmt: skip
    parser.add_argument("--writer-passages-per-row", type=int,
                        help="the writer's training: each written row the mean of the rows written from this many "
                             "passages (default: 1)")  # fmt: skip
    parser.add_argument("--writer-rows-apart", dest="writer_pools_texts", action="store_false", default=None,
                        help="the writer's training: the passages of --writer-passages-per-row each a row of their "
                             "own, the query choosing among them (`edmem pretrain --writer_pools_texts false`)")  # fmt: skip
    parser.add_argument("--writer-answer-rows", action=argparse.BooleanOptionalAction,
                        help="with --writer-rows-apart: the linking loss's gold among an entity's rows, those written "
                             "from a passage that names what the passage read hides (`edmem pretrain "
                             "--writer_answer_rows`)")  # fmt: skip
    parser.add_argument("--writer-reads-answer-rows", action="store_true", default=None,
                        help="with --writer-answer-rows: in training, a mention reads its entity's rows that answer "
                             "alone (`edmem pretrain --writer_reads_answer_rows`)")  # fmt: skip
    parser.add_argument("--writer-answer-rows-by-text", action=argparse.BooleanOptionalAction,
                        help="with --writer-answer-rows: a question's rows that answer are also those whose passage "
                             "holds its answer's words, for facts that are no entity (`edmem pretrain "
                             "--writer_answer_rows_by_text`)")  # fmt: skip
    parser.add_argument("--writer-mean-row-probability", action="store_true", default=None,
                        help="the writer's model: an entity of several rows given the mean of their probabilities, "
                             "not their sum (`edmem pretrain --writer_mean_row_probability`)")  # fmt: skip
    parser.add_argument("--mean-row-probability-at-test", action="store_true", default=None,
                        help="the writer's model trained without --writer-mean-row-probability, read with it: a copy "
                             "of the trained model with the option set")  # fmt: skip
    parser.add_argument("--entity-key-dim", type=int,
                        help="the writer's model: the columns of a row that queries score, its key; the rest are its "
                             "value, read by the memory (default: all, the paper's row)")  # fmt: skip
    parser.add_argument("--writer-dropout", type=float,
                        help="the writer's model's pre-training dropout (default: every model's, 0.1)")  # fmt: skip
    parser.add_argument("--writer-random-mask-prob", type=float,
                        help="the writer's model's per-token mask rate in pre-training, both stages (default: every "
                             "model's, 0.3; the tiny world passes fewer seeds with it: docs/evidence_history.md)")  # fmt: skip
    parser.add_argument("--writer-restart-unless-learned", action="store_true", default=None,
                        help="the writer's first stage begun again with another training seed where it ends "
                             "without reading learnt on practice_validation, at most twice (needs "
                             "--validation-practice-people; default: off)")  # fmt: skip
    parser.add_argument("--added-texts", choices=ADDED_TEXTS,
                        help="what the writer writes an added person's row from: the passages around their mentions, "
                             "or each sentence of their own page, the row the mean (default: passages)")  # fmt: skip
    parser.add_argument("--fresh-names-like-written-only", action=argparse.BooleanOptionalAction,
                        help="the writer's training renames written-only entities with the words of their own names "
                             "(people's, for practice people), not of every entity's (default: off)")  # fmt: skip
    parser.add_argument("--writer-decoy-rows", type=int,
                        help="the writer's training: decoys each renamed entity brings, written under fresh names "
                             "that share a word with its own (default: 0)")  # fmt: skip
    parser.add_argument("--writer-more-steps", type=int,
                        help="the writer's training continued this many steps more from its model, with its options "
                             "(default: 0, none)")  # fmt: skip
    parser.add_argument("--reader-steps", type=int,
                        help="the writer's model: steps of a second pre-training with the writer and its table frozen "
                             "(--frozen_writer; default: 0, none)")  # fmt: skip
    parser.add_argument("--reader-names-like-written-only", action=argparse.BooleanOptionalAction,
                        help="the second stage only: fresh names of the practice people's words (default: off)")  # fmt: skip
    parser.add_argument("--reader-row-autoencoding-share", type=float,
                        help="the second stage only: share of the practice people's passages read as their written "
                             "row alone, the decoder rebuilding them (default: 0)")  # fmt: skip
    parser.add_argument("--reader-fresh-name-share", type=float,
                        help="the second stage only: share of the batch's written entities other than the practice "
                             "people renamed as they are, their answers then read from their rows (default: 0)")  # fmt: skip
    parser.add_argument("--reader-decoy-rows", type=int,
                        help="the second stage only: decoys of each renamed entity, written under fresh names that "
                             "share a word with its own (default: the first stage's --writer-decoy-rows)")  # fmt: skip
    parser.add_argument("--reader-decoys-for-every-entity", action="store_true", default=None,
                        help="the second stage only: decoys of every written entity, the trained ones under their own "
                             "names too (`edmem pretrain --writer_decoys_for_every_entity`)")  # fmt: skip
    parser.add_argument("--first-stage-only", action="store_true",
                        help="the writer's first stage alone on each seed, its reading signal on practice_validation "
                             "written to first_stages.json (needs --validation-practice-people)")  # fmt: skip
    parser.add_argument("--combine", nargs="+", type=Path, metavar="RESULTS",
                        help="results.json files of this command line's recipe run apart (--seeds N each, on "
                             "machines of their own), combined as one run of their seeds into --out; nothing runs")  # fmt: skip
    parser.add_argument("--recipe", choices=recipes,
                        help="toy_world_qa's pre-training and fine-tuning levers, for every model (default: paper); "
                             "another recipe's models go to seed-N/recipe-NAME")  # fmt: skip
    return parser


def with_growth_overrides(settings: GrowthSettings, args: argparse.Namespace) -> GrowthSettings:
    """`settings` with the options given on the command line; a ValueError names a combination refused."""
    if args.mean_row_probability_at_test and args.writer_mean_row_probability:
        raise ValueError("--mean-row-probability-at-test reads a model trained without --writer-mean-row-probability")
    if args.writer_more_steps is not None and args.writer_more_steps < 0:
        raise ValueError(f"--writer-more-steps must be 0 or more, got {args.writer_more_steps}")
    if args.default_edmem is False and args.writer is False:
        raise ValueError("--no-default-edmem with --no-writer leaves no model to train")
    if args.writer_more_steps and args.writer is False:
        raise ValueError("--writer-more-steps continues the writer's training, and --no-writer trains no writer")
    settings = replace(settings, qa=with_overrides(settings.qa, args))
    for key in OVERRIDES:
        if getattr(args, key) is not None:
            settings = replace(settings, **{key: getattr(args, key)})
    if args.timed_additions is not None:
        settings = replace(settings, timed_additions=tuple(args.timed_additions))
    if args.estimators:
        settings = replace(settings, estimators=tuple(args.estimators))
    if args.timed_estimators:
        settings = replace(settings, timed_estimators=tuple(args.timed_estimators))
    if settings.writer_restart_unless_learned and not settings.validation_practice_people:
        raise ValueError("--writer-restart-unless-learned reads the reading signal on practice_validation: give "
                         "--validation-practice-people")  # fmt: skip
    if settings.writer_restart_unless_learned and not settings.writer:
        raise ValueError(
            "--writer-restart-unless-learned restarts the writer's training, and --no-writer trains no writer"
        )
    return settings

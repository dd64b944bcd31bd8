"""The command line the toy-world experiments share (`toy_world_qa.py`, `toy_world_growth.py`): their common
options, applied to an experiment's `Settings`, and the logging they run with."""

from __future__ import annotations

import argparse
import logging
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from toy_world_qa import Settings


def experiment_parser(description: str, default_out: str) -> argparse.ArgumentParser:
    """The options the toy-world experiments share."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default=default_out, help="working directory; results.json and plots")
    parser.add_argument("--quick", action="store_true", help="a small world, one seed (< 20 minutes on 2 cores)")
    parser.add_argument("--seeds", type=int, nargs="+", help="override the seeds")
    parser.add_argument("--num-people", type=int, help="override the world's number of people")
    parser.add_argument("--pretrain-steps", type=int, help="override the pre-training steps")
    parser.add_argument("--finetune-epochs", type=float, help="override the fine-tuning epochs")
    parser.add_argument("--finetune-learning-rate", type=float, help="override the fine-tuning learning rate")
    parser.add_argument("--finetune-batch-size", type=int, help="override the fine-tuning batch size")
    parser.add_argument("--pretrain-batch-size", type=int, help="override the pre-training batch size")
    parser.add_argument("--pretrain-learning-rate", type=float, help="override the pre-training learning rate")
    parser.add_argument("--pretrain-jobs", type=int, help="pre-trainings run side by side (default: 2)")
    parser.add_argument("--d-model", type=int, help="override the width")
    parser.add_argument("--layers", type=int, help="override the lower and upper layers of each side")
    parser.add_argument("--fullname", action=argparse.BooleanOptionalAction,
                        help="every sentence names the person in full (the study's fullname augmentation)")  # fmt: skip
    parser.add_argument("--shuffled-questions", action=argparse.BooleanOptionalAction,
                        help="the mixed-in questions on pages of their own, people mixed (default: each person's on "
                             "their page)")  # fmt: skip
    parser.add_argument("--questions-in-batches", action=argparse.BooleanOptionalAction,
                        help="the mixed-in questions in the pre-training batches in the fine-tuning format "
                             "(`edmem pretrain --mixed_questions_file`), not as text on pages")  # fmt: skip
    parser.add_argument("--mix-qa", action=argparse.BooleanOptionalAction,
                        help="the fine-tuning half's questions in pre-training too (default: on)")  # fmt: skip
    parser.add_argument("--no-plots", action="store_true")
    return parser


def with_overrides(settings: Settings, args: argparse.Namespace) -> Settings:
    """`settings` with the shared options given on the command line."""
    overrides = dict(seeds=tuple(args.seeds) if args.seeds else None, num_people=args.num_people,
                     pretrain_steps=args.pretrain_steps, finetune_epochs=args.finetune_epochs, d_model=args.d_model,
                     finetune_learning_rate=args.finetune_learning_rate, finetune_batch_size=args.finetune_batch_size,
                     pretrain_batch_size=args.pretrain_batch_size, pretrain_learning_rate=args.pretrain_learning_rate,
                     layers=args.layers, mix_qa=args.mix_qa, pretrain_jobs=args.pretrain_jobs,
                     fullname=args.fullname, shuffled_questions=args.shuffled_questions,
                     questions_in_batches=args.questions_in_batches)  # fmt: skip
    return replace(settings, **{k: v for k, v in overrides.items() if v is not None})


def quiet_logging() -> None:
    """Progress lines from the experiment; warnings only from the libraries."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for name in ("transformers", "datasets", "edmem_hf", "accelerate"):
        logging.getLogger(name).setLevel(logging.WARNING)

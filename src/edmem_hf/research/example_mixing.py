"""Examples mixed into pre-training's batches, for experiments (`benchmarks/toy_world_qa.py`,
`benchmarks/toy_world_growth.py`): questions in the fine-tuning format beside the passages (the mixed training of
Physics of Language Models 3.1, docs/pretraining.md), and some entities' examples read as a set share of an epoch.
`edmem pretrain` takes these options (`--mixed_questions_file` ...) without listing them in its help."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from .writer_training import entity_ids_in_file

logger = logging.getLogger(__name__)


def _option(default: Any, help: str) -> Any:
    """A field `edmem pretrain` accepts without listing it in its help (`help` is the field's documentation)."""
    return field(default=default, metadata={"help": argparse.SUPPRESS})


@dataclass
class ExampleMixingArguments:
    """What is mixed into the training batches besides the corpus's passages (none by default: the paper's)."""

    _argument_group_name = "examples mixed into the batches (experiments; docs/pretraining.md)"

    mixed_questions_file: str | None = _option(
        None,
        "A QA file (the released edmem_*.jsonl format) whose questions and answers are mixed into the training "
        "batches in the fine-tuning format, uncorrupted.",
    )
    mixed_questions_share: float = _option(0.25, "With --mixed_questions_file: about this share of the examples.")
    balanced_entities_file: str | None = _option(
        None,
        "Entity names, one a line: the passages that mention one of them, and apart from them the mixed questions "
        "that do, make about --balanced_entities_share of those read.",
    )
    balanced_entities_share: float | None = _option(
        None, "With --balanced_entities_file: the share their examples make, in (0, 1)."
    )

    def __post_init__(self) -> None:
        if not 0.0 < self.mixed_questions_share < 1.0:
            raise ValueError(f"mixed_questions_share must be in (0, 1), got {self.mixed_questions_share}")
        if (self.balanced_entities_file is None) != (self.balanced_entities_share is None):
            raise ValueError(
                "--balanced_entities_file and --balanced_entities_share go together: give both or neither"
            )
        if self.balanced_entities_share is not None and not 0.0 < self.balanced_entities_share < 1.0:
            raise ValueError(f"balanced_entities_share must be in (0, 1), got {self.balanced_entities_share}")


def balanced_passages(args: ExampleMixingArguments, passages: Any, model: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """With `--balanced_entities_file`: the order an epoch reads `passages` in (`balanced_order`) and the entities'
    ids; else None."""
    from .writer_batches import EntityPassages

    if not args.balanced_entities_file:
        return None
    balanced = _balanced_entity_ids(args, getattr(model, "entity_vocab", None))
    index = EntityPassages.from_dataset(passages, int(balanced.max()) + 1)
    about = np.zeros(len(passages), dtype=bool)
    about[np.concatenate([index.of(entity) for entity in balanced])] = True
    return balanced_order(about, args.balanced_entities_share), balanced


def with_questions(
    args: ExampleMixingArguments, train_set: Any, collator: Any, tokenizer: Any, model: Any,
    balanced: np.ndarray | None,
) -> tuple[Any, Any]:  # fmt: skip
    """`train_set` and `collator` with `--mixed_questions_file`'s questions mixed in (as they are without it)."""
    from ..collator import QuestionsAndPassagesCollator
    from ..task_features import EDMemSeq2SeqCollator

    if not args.mixed_questions_file:
        return train_set, collator
    questions = _mixed_questions(args, tokenizer, getattr(model, "entity_vocab", None))
    if balanced is not None:
        about = np.array([_mentions_any(q.get("entity_labels"), balanced)
                          or _mentions_any(q.get("decoder_entity_labels"), balanced) for q in questions])  # fmt: skip
        questions = [questions[i] for i in balanced_order(about, args.balanced_entities_share)]
    repeats = question_repeats(len(train_set), len(questions), args.mixed_questions_share)
    mixed = QuestionsAndPassagesCollator(collator, EDMemSeq2SeqCollator(tokenizer.pad_token_id))
    return _PassagesAndQuestions(train_set, questions, repeats), mixed


class _PassagesAndQuestions(Dataset):
    """The train split's passages (`_IndexedPassages`) followed by `repeats` copies of encoded questions: the
    sampler's permutation mixes them into the batches. Questions carry their own `labels` and are not corrupted
    (`collator.QuestionsAndPassagesCollator`)."""

    def __init__(self, passages: Any, questions: list[dict[str, list[int]]], repeats: int):
        self.passages, self.questions, self.repeats = passages, questions, repeats

    def __len__(self) -> int:
        return len(self.passages) + self.repeats * len(self.questions)

    def __getitem__(self, key: tuple[int, int] | int) -> dict[str, Any]:
        epoch, index = key if isinstance(key, tuple) else (0, key)
        if index < len(self.passages):
            return self.passages[(epoch, index)]
        return dict(self.questions[(index - len(self.passages)) % len(self.questions)])


def question_repeats(num_passages: int, num_questions: int, share: float) -> int:
    """How many copies of `num_questions` questions make them about `share` of the examples (at least one: when the
    questions, each read once an epoch, are well over the share, a warning says what they are)."""
    repeats = max(1, round(share / (1.0 - share) * num_passages / num_questions))
    read = repeats * num_questions / (num_passages + repeats * num_questions)
    if read > 1.5 * share:  # one copy too many: rounding alone stays within this
        logger.warning("--mixed_questions_share %s: %d questions beside %d passages, each read once an epoch, are %.2f "
                       "of the examples", share, num_questions, num_passages, read)  # fmt: skip
    return repeats


def balanced_order(about: np.ndarray, share: float) -> np.ndarray:
    """Indices of examples, each once and the side that falls short of its share again a whole number of times, so
    that the examples where `about` is True make about `share` of them (`--balanced_entities_share`)."""
    inside, outside = np.flatnonzero(about), np.flatnonzero(~about)
    if not len(inside) or not len(outside):
        return np.arange(len(about))
    if len(inside) / len(about) > share:  # the others read more often
        repeats = max(1, round(len(inside) * (1 - share) / (share * len(outside))))
        extra = np.tile(outside, repeats - 1)
    else:
        repeats = max(1, round(share * len(outside) / ((1 - share) * len(inside))))
        extra = np.tile(inside, repeats - 1)
    return np.concatenate([np.arange(len(about)), extra])


def _balanced_entity_ids(args: ExampleMixingArguments, entity_vocab: Any) -> np.ndarray:
    """The entity ids of `--balanced_entities_file`."""
    if entity_vocab is None:
        raise ValueError("--balanced_entities_file needs the model's entity vocabulary to find its names")
    ids = entity_ids_in_file("balanced_entities_file", args.balanced_entities_file, entity_vocab)
    if not ids:
        raise ValueError(f"--balanced_entities_file {args.balanced_entities_file}: no name")
    return np.array(ids, dtype=np.int64)


def _mentions_any(labels: Any, entities: np.ndarray) -> bool:
    return bool(np.isin(np.asarray(labels or [], dtype=np.int64), entities).any())


def _mixed_questions(args: ExampleMixingArguments, tokenizer: Any, entity_vocab: Any) -> list[dict[str, list[int]]]:
    """The questions of `--mixed_questions_file` as fine-tuning features (the first answer as the target)."""
    from ..task_features import encode_qa_record
    from ..task_files import read_qa

    if entity_vocab is None:
        raise ValueError("--mixed_questions_file needs the entity vocabulary to link the questions' mentions")
    rows = read_qa(args.mixed_questions_file, entity_vocab)
    if len(rows) == 0:
        raise ValueError(f"--mixed_questions_file {args.mixed_questions_file} has no question")
    return [encode_qa_record(row, tokenizer) for row in rows]


__all__ = ["ExampleMixingArguments", "balanced_order", "balanced_passages", "question_repeats", "with_questions"]

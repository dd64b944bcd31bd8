"""Fine-tuning tasks: closed-book QA examples with entity-linked mentions, their collator, and exact match."""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN

IGNORE_INDEX = -100


@dataclass
class QAExample:
    """A question with its linked mentions and its answers.

    Args:
        question: plain text.
        answers: acceptable answers (the first is the training target).
        mentions: `(char_start, char_end, entity_id)` of each linked mention in `question`.
        answer_entity: the answer's entity id, or None when the answer is not an entity.
    """

    question: str
    answers: list[str]
    mentions: list[tuple[int, int, int]] = field(default_factory=list)
    answer_entity: int | None = None


def mark_mentions(text: str, mentions: Sequence[tuple[int, int, int]]) -> tuple[str, list[int]]:
    """Wraps each `(start, end, entity)` span in `<E_s> ... <E_e>`; returns the text and the entity ids in order."""
    marked, entities, cursor = [], [], 0
    for start, end, entity in sorted(mentions):
        if start < cursor or not 0 <= start < end <= len(text):
            raise ValueError(f"mention ({start}, {end}) overlaps another or falls outside the text {text!r}")
        marked += [text[cursor:start].rstrip(" "), f" {ENTITY_START_TOKEN} ", text[start:end], f" {ENTITY_END_TOKEN}"]
        entities.append(int(entity))
        cursor = end
    marked.append(text[cursor:])
    return "".join(marked).lstrip(" "), entities


def _labels_at_markers(token_ids: list[int], start_id: int, entities: list[int], what: str) -> list[int]:
    positions = [i for i, t in enumerate(token_ids) if t == start_id]
    if len(positions) != len(entities):
        raise ValueError(f"{what}: {len(entities)} mentions but {len(positions)} <E_s> tokens after tokenisation")
    labels = [IGNORE_INDEX] * len(token_ids)
    for position, entity in zip(positions, entities):
        labels[position] = entity
    return labels


def encode_qa_example(example: QAExample, tokenizer: Any, max_length: int = 64) -> dict[str, list[int]]:
    """Tokenises an example into the model's training fields (see docs/model.md, "Mention supervision").

    The answer is generated as `<E_s> name <E_e>` when it is an entity, so that the same example also trains the
    static setting's entity linking: the decoder reads the start token and `<E_s>`, and the entity-linking head is
    supervised with the answer entity there. Examples without an entity answer skip that objective, as in the paper.
    """
    start_id = tokenizer.convert_tokens_to_ids(ENTITY_START_TOKEN)
    question, question_entities = mark_mentions(example.question, example.mentions)
    input_ids = tokenizer(question, truncation=True, max_length=max_length).input_ids
    answer = example.answers[0]
    if example.answer_entity is not None:
        answer = f"{ENTITY_START_TOKEN} {answer} {ENTITY_END_TOKEN}"
    labels = tokenizer(answer, add_special_tokens=False).input_ids[: max_length - 1] + [tokenizer.eos_token_id]
    answer_entities = [] if example.answer_entity is None else [example.answer_entity]
    return {
        "input_ids": input_ids,
        "entity_labels": _labels_at_markers(input_ids, start_id, question_entities, f"question {example.question!r}"),
        "labels": labels,
        "decoder_entity_labels": _labels_at_markers(labels, start_id, answer_entities, f"answer {answer!r}"),
    }


@dataclass
class EDMemSeq2SeqCollator:
    """Pads EDMem fine-tuning features: token ids with the pad id, labels and entity labels with -100.

    (`DataCollatorForSeq2Seq` would pad entity labels with the pad id, which is a valid entity id.)
    """

    pad_token_id: int
    pad_to_multiple_of: int | None = None

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = {}
        for name, pad in (
            ("input_ids", self.pad_token_id),
            ("entity_labels", IGNORE_INDEX),
            ("labels", IGNORE_INDEX),
            ("decoder_entity_labels", IGNORE_INDEX),
        ):
            if name not in features[0]:
                continue
            rows = [list(f[name]) for f in features]
            length = max(map(len, rows))
            if self.pad_to_multiple_of:
                length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
            batch[name] = torch.tensor([row + [pad] * (length - len(row)) for row in rows], dtype=torch.long)
            if name == "input_ids":
                batch["attention_mask"] = torch.tensor(
                    [[1] * len(row) + [0] * (length - len(row)) for row in rows], dtype=torch.long
                )
        return batch


_MARKERS = re.compile(r"<E_[se]>|\[E_[se]\]")


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

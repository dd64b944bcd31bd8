"""Fine-tuning features: the rows of `task_files.py` (or `QAExample`s) as the model's training fields (QA,
generation, the static setting's linking target), the dataset that picks a training answer each time a row is read,
and the collator that pads them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN, IGNORE_INDEX
from .entity_decoding import marker_token_ids
from .entity_vocab import AUTHORS_FIRST_ENTITY, AUTHORS_ID_SPACE, EntityVocab
from .generation_edmem import static_linking_decoder_input
from .task_files import mark_mentions


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


def _labels_at_markers(token_ids: list[int], start_id: int, entities: list[int], truncated: bool, what: str):
    """Entity labels aligned with `token_ids`: each mention's entity at its `<E_s>`, -100 elsewhere. A mention cut
    off by truncation has no `<E_s>` and no label."""
    positions = [i for i, t in enumerate(token_ids) if t == start_id]
    if len(positions) > len(entities) or (len(positions) < len(entities) and not truncated):
        raise ValueError(f"{what}: {len(entities)} mentions but {len(positions)} <E_s> tokens after tokenisation")
    labels = [IGNORE_INDEX] * len(token_ids)
    for position, entity in zip(positions, entities):
        labels[position] = entity
    return labels


def in_running_text(text: str) -> str:
    """`text` with a space before it, so that its first word is tokenised as inside a sentence (`" 1920"` ->
    `Ġ1920`, where `"1920"` is `19 2 0` to a byte-level BPE): the form in which pre-training text states a fact,
    and the form of an entity name after `<E_s>` and in the entity trie. The authors' readers do the same with
    `add_another_bos` (`<s> ` before every question, answer and passage). A text that starts with a space or a
    mention's `<E_s>` (whose name already follows a space) is left as it is."""
    return text if text[:1].isspace() or text.startswith(ENTITY_START_TOKEN) else " " + text


def _encode_input(text: str, entities: list[int], tokenizer: Any, max_length: int, what: str) -> dict[str, list]:
    start_id = tokenizer.convert_tokens_to_ids(ENTITY_START_TOKEN)
    input_ids = tokenizer(in_running_text(text), truncation=True, max_length=max_length).input_ids
    truncated = len(input_ids) >= max_length
    return {
        "input_ids": input_ids,
        "entity_labels": _labels_at_markers(input_ids, start_id, entities, truncated, what),
    }


def _encode_target(text: str, entities: list[int], tokenizer: Any, max_length: int, what: str) -> dict[str, list]:
    start_id = tokenizer.convert_tokens_to_ids(ENTITY_START_TOKEN)
    labels = tokenizer(in_running_text(text), add_special_tokens=False).input_ids
    truncated = len(labels) > max_length - 1
    labels = labels[: max_length - 1] + [tokenizer.eos_token_id]
    return {
        "labels": labels,
        "decoder_entity_labels": _labels_at_markers(labels, start_id, entities, truncated, what),
    }


def encode_qa_example(example: QAExample, tokenizer: Any, max_length: int = 64) -> dict[str, list[int]]:
    """Tokenises an example into the model's training fields (see docs/model.md, "Mention supervision").

    The answer is generated as `<E_s> name <E_e>` when it is an entity, so that the same example also trains the
    static setting's entity linking: the decoder reads the start token and `<E_s>`, and the entity-linking head is
    supervised with the answer entity there. Examples without an entity answer skip that objective, as in the paper.
    """
    question, question_entities = mark_mentions(example.question, example.mentions)
    answer = example.answers[0]
    mentions = [] if example.answer_entity is None else [(0, len(answer), example.answer_entity)]
    target, target_entities = mark_mentions(answer, mentions)
    return {
        **_encode_input(question, question_entities, tokenizer, max_length, f"question {question!r}"),
        **_encode_target(target, target_entities, tokenizer, max_length, f"answer {target!r}"),
    }


def encode_qa_record(
    record: Mapping[str, Any], tokenizer: Any, max_length: int = 64, rng: Any = None
) -> dict[str, list[int]]:
    """A row of `read_qa` as training fields: the marked question with its entity labels, and one of the row's
    `targets` with its linked spans marked `<E_s> ... <E_e>` and their entities as decoder entity labels.

    The target is the first one, or with `rng` (anything with `randrange`, e.g. the `random` module) one picked at
    random, as the authors' reader does each time a training record is read (`ResampledRows`)."""
    question = _encode_input(
        record["question"], record["mention_entities"], tokenizer, max_length, f"record {record['id']}"
    )
    targets = record["targets"]
    choice = 0 if rng is None or len(targets) == 1 else rng.randrange(len(targets))
    target, entities = mark_mentions(targets[choice], [tuple(span) for span in record["target_mentions"][choice]])
    return {**question, **_encode_target(target, entities, tokenizer, max_length, f"record {record['id']} answer")}


def encode_generation_record(record: Mapping[str, Any], tokenizer: Any, max_length: int = 256) -> dict[str, list[int]]:
    """A row of `read_generation` as training fields: the marked input with its entity labels, the first reference
    as the target (no mentions are linked in the references)."""
    features = _encode_input(
        record["input"], record["mention_entities"], tokenizer, max_length, f"record {record['id']}"
    )
    labels = tokenizer(in_running_text(record["outputs"][0]), add_special_tokens=False).input_ids[: max_length - 1]
    labels.append(tokenizer.eos_token_id)
    return {**features, "labels": labels, "decoder_entity_labels": [IGNORE_INDEX] * len(labels)}


def encode_static_linking_record(
    record: Mapping[str, Any], tokenizer: Any, max_length: int = 64, rng: Any = None
) -> dict[str, list[int]]:
    """A row of `read_qa` whose answer is an entity as the static setting's training target (the paper, Section
    3.3): the decoder reads the question (its final token dropped) then `<E_s>` and EOS, the decoder memory and the
    entity-linking head are supervised with the answer entity at that `<E_s>`, and no token is scored by the LM
    loss. These are the inputs `model.link_entities(decoder_input="question")` reads at inference.

    The entity is `answer_entity` (the first answer entity), or with `rng` one of `answer_entities` picked at random
    (the authors' reader, for a question with several)."""
    if record["answer_entity"] == IGNORE_INDEX:
        raise ValueError(f"record {record['id']}: the answer is not an entity: no static linking target")
    entities = record.get("answer_entities") or [record["answer_entity"]]
    entity = entities[0] if rng is None or len(entities) == 1 else entities[rng.randrange(len(entities))]
    features = _encode_input(
        record["question"], record["mention_entities"], tokenizer, max_length, f"record {record['id']}"
    )
    start_id = tokenizer.convert_tokens_to_ids(ENTITY_START_TOKEN)
    decoder_input_ids = static_linking_decoder_input(features["input_ids"], start_id, tokenizer.eos_token_id)
    # aligned with `labels`, which the model shifts right: the label of the decoder's <E_s> sits one before it
    decoder_entity_labels = [IGNORE_INDEX] * len(decoder_input_ids)
    decoder_entity_labels[len(decoder_input_ids) - 3] = entity
    return {
        **features,
        "decoder_input_ids": decoder_input_ids,
        "labels": [IGNORE_INDEX] * len(decoder_input_ids),
        "decoder_entity_labels": decoder_entity_labels,
    }


class ResampledRows(torch.utils.data.Dataset):
    """Rows encoded each time they are read, with `encode(row, rng=random)`: a QA row's training answer (and a
    static-linking row's answer entity) is picked afresh at every read, as in the authors' `QADataset`. The pick
    draws from Python's `random`, which `transformers.set_seed` seeds and the Trainer's checkpoints save, so a run
    repeats and resumes exactly."""

    def __init__(self, rows: Sequence[Mapping[str, Any]], encode: Callable[..., dict[str, list[int]]]):
        self.rows, self.encode = rows, encode

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        import random

        return self.encode(self.rows[index], rng=random)


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
            ("decoder_input_ids", self.pad_token_id),
            ("labels", IGNORE_INDEX),
            ("decoder_entity_labels", IGNORE_INDEX),
        ):
            present = [name in f for f in features]
            if not any(present):
                continue
            if not all(present):
                raise ValueError(
                    f"{name} is in {sum(present)} of the {len(features)} features of a batch: all or none"
                )
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


def _marked_names(text: str, what: str) -> list[str]:
    """The text each `<E_s> ... <E_e>` of `text` marks, stripped, in order; a ValueError when the markers do not
    pair up."""
    before, *mentions = text.split(ENTITY_START_TOKEN)
    if ENTITY_END_TOKEN in before or any(part.count(ENTITY_END_TOKEN) != 1 for part in mentions):
        raise ValueError(f"{what}: its {ENTITY_START_TOKEN} and {ENTITY_END_TOKEN} markers do not pair up: {text!r}")
    return [part.split(ENTITY_END_TOKEN)[0].strip() for part in mentions]


def _mention_entities(
    text: str, given: Sequence[int | str | None] | None, vocab: EntityVocab | None, what: str
) -> list[int]:
    """The entity id of each mention of a marked text: from `given` (ids, names of `vocab`, None for no label), or
    without it the marked text as a name of `vocab` (no labels without a vocabulary)."""
    names = _marked_names(text, what)
    if given is None:
        if vocab is None:
            return [IGNORE_INDEX] * len(names)
        unknown = [name for name in names if name not in vocab]
        if unknown:
            raise ValueError(
                f"{what}: the mention {unknown[0]!r} is not a name of the entity vocabulary: give each mention's "
                "entity (an id, a name, or None for no label)"
            )
        given = names
    if len(given) != len(names):
        raise ValueError(f"{what}: {len(names)} marked mentions but {len(given)} entities given")
    entities = []
    for entity in given:
        if entity is None:
            entities.append(IGNORE_INDEX)
        elif isinstance(entity, str):
            if vocab is None or entity not in vocab:
                raise ValueError(f"{what}: the entity {entity!r} is not a name of the entity vocabulary")
            entities.append(vocab.id_of(entity))
        else:
            entity = int(entity)
            first = AUTHORS_FIRST_ENTITY if vocab is not None and vocab.id_space == AUTHORS_ID_SPACE else 0
            if entity < first or (vocab is not None and entity >= len(vocab)):
                raise ValueError(f"{what}: {entity} is not an entity id of the vocabulary (None: no label)")
            entities.append(entity)
    return entities


def marked_batch(
    texts: Sequence[str],
    tokenizer: Any,
    targets: Sequence[str] | None = None,
    entities: Sequence[Sequence[int | str | None]] | None = None,
    target_entities: Sequence[Sequence[int | str | None]] | None = None,
    entity_vocab: EntityVocab | None = None,
    max_length: int = 1024,
) -> dict[str, torch.Tensor]:
    """A model batch from texts whose mentions are marked `<E_s> ... <E_e>`: `input_ids`, `attention_mask` and
    `entity_labels` (each mention's entity at its `<E_s>`, -100 elsewhere), and with `targets` (marked the same
    way) `labels` and `decoder_entity_labels`, padded as `EDMemSeq2SeqCollator` pads them: what `model(**batch)`
    trains on. (`generate` takes its `input_ids` and `attention_mask`.)

    A text's mentions get their entities from `entities` (per text, one per mention in order: an id, a name of
    `entity_vocab`, or None for no label), or without it from `entity_vocab`, each mention's text being the name of
    its entity (an error naming a mention that is not); without either they have no labels. The same for `targets`
    with `target_entities`. Texts are tokenised as in fine-tuning (`in_running_text`), to `max_length` tokens.
    """
    if isinstance(texts, str) or (targets is not None and isinstance(targets, str)):
        raise TypeError("marked_batch takes a list of texts (and of targets), not one string")
    marker_token_ids(tokenizer)  # a tokenizer that splits a marker: one line naming it, not a count mismatch later
    if targets is not None and len(targets) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(targets)} targets")
    features = []
    for i, text in enumerate(texts):
        given = None if entities is None else entities[i]
        labels = _mention_entities(text, given, entity_vocab, f"text {i}")
        feature = _encode_input(text, labels, tokenizer, max_length, f"text {i}")
        if targets is not None:
            given = None if target_entities is None else target_entities[i]
            labels = _mention_entities(targets[i], given, entity_vocab, f"target {i}")
            feature |= _encode_target(targets[i], labels, tokenizer, max_length, f"target {i}")
        features.append(feature)
    return EDMemSeq2SeqCollator(tokenizer.pad_token_id)(features)


__all__ = [
    "EDMemSeq2SeqCollator",
    "QAExample",
    "ResampledRows",
    "encode_generation_record",
    "encode_qa_example",
    "encode_qa_record",
    "encode_static_linking_record",
    "marked_batch",
]

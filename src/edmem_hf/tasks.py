"""Fine-tuning tasks: readers for the authors' released QA and generation files, examples with entity-linked
mentions, their encoding (QA, generation, the static setting's linking target), the collator, and exact match."""

from __future__ import annotations

import json
import logging
import re
import string
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN, IGNORE_INDEX
from .configuration_edmem import MENTION_MARKERS as _MARKERS
from .entity_vocab import AUTHORS_ID_SPACE, EntityVocab
from .generation_edmem import static_linking_decoder_input

logger = logging.getLogger(__name__)


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
    question, question_entities = mark_mentions(example.question, example.mentions)
    return _encode_marked_qa(
        question, question_entities, example.answers[0], example.answer_entity, tokenizer, max_length
    )


def _encode_marked_qa(
    question: str,
    question_entities: list[int],
    answer: str,
    answer_entity: int | None,
    tokenizer: Any,
    max_length: int,
) -> dict[str, list[int]]:
    start_id = tokenizer.convert_tokens_to_ids(ENTITY_START_TOKEN)
    input_ids = tokenizer(question, truncation=True, max_length=max_length).input_ids
    if answer_entity is not None:
        answer = f"{ENTITY_START_TOKEN} {answer} {ENTITY_END_TOKEN}"
    labels = tokenizer(answer, add_special_tokens=False).input_ids[: max_length - 1] + [tokenizer.eos_token_id]
    answer_entities = [] if answer_entity is None else [answer_entity]
    return {
        "input_ids": input_ids,
        "entity_labels": _labels_at_markers(input_ids, start_id, question_entities, f"question {question!r}"),
        "labels": labels,
        "decoder_entity_labels": _labels_at_markers(labels, start_id, answer_entities, f"answer {answer!r}"),
    }


# --- the authors' released files ----------------------------------------------------------------------------


def _entity_id(vocab: EntityVocab, target: str | int, name: str) -> int:
    """The vocabulary's id of a linked entity, by the authors' id for a table in their id space, by name otherwise;
    IGNORE_INDEX when the vocabulary does not hold it."""
    if vocab.id_space == AUTHORS_ID_SPACE:
        entity_id = int(target)
        return entity_id if 0 < entity_id < len(vocab) else IGNORE_INDEX
    return vocab.id_of(name) if name in vocab else IGNORE_INDEX


def _linked_mentions(record: Mapping[str, Any], text: str, vocab: EntityVocab) -> list[tuple[int, int, int]]:
    """`(start, end, entity id)` of a record's links over `text` (IGNORE_INDEX for an entity not in `vocab`); a
    ValueError naming the record for offsets outside the text, overlapping links or lists of different lengths."""
    fields = ("link_offset", "link_length", "link_target", "entity_name")
    lists = [record.get(name, []) for name in fields]
    if len({len(values) for values in lists}) > 1:
        counts = ", ".join(f"{len(values)} {name}" for name, values in zip(fields, lists))
        raise ValueError(f"record {record.get('id')!r}: link lists of different lengths ({counts})")
    mentions, cursor = [], 0
    for offset, length, target, name in sorted(zip(*lists)):
        if not (0 <= offset and length > 0 and offset + length <= len(text)):
            raise ValueError(
                f"record {record.get('id')!r}: link {name!r} at {offset}..{offset + length} is outside the text "
                f"({len(text)} characters)"
            )
        if offset < cursor:
            raise ValueError(f"record {record.get('id')!r}: link {name!r} at {offset} overlaps the link before it")
        mentions.append((offset, offset + length, _entity_id(vocab, target, name)))
        cursor = offset + length
    return mentions


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Records of a JSON-lines file; a line that is not JSON is an error naming the file and line."""
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path}, line {number}: not JSON ({error.msg})") from None
    return records


@dataclass
class _ReadCounts:
    """A reader's marking of the records' mentions (bad records raise or, with `bad_records="skip"`, are skipped),
    and what it skipped and labelled, for its one log line."""

    bad_records: str
    skipped: dict[str, int]
    mentions: int = 0
    unlabelled: int = 0

    def __post_init__(self):
        if self.bad_records not in ("raise", "skip"):
            raise ValueError(f"bad_records must be 'raise' or 'skip', got {self.bad_records!r}")

    def marked(self, record: Mapping[str, Any], field: str, vocab: EntityVocab):
        """`record[field]` with its mentions marked and their entity ids, or None for a skipped bad record."""
        try:
            linked = _linked_mentions(record, record[field], vocab)
        except ValueError as error:
            if self.bad_records == "raise":
                raise
            logger.info("skipped: %s", error)
            self.skipped["bad"] += 1
            return None
        text, entities = mark_mentions(record[field], linked)
        self.mentions += len(entities)
        self.unlabelled += entities.count(IGNORE_INDEX)
        return text, entities

    def log(self, path: str | Path, kept: int, extra: str = "") -> None:
        skipped = ", ".join(f"{count} {why}" for why, count in self.skipped.items() if count) or "none"
        message = (
            f"{path}: {kept} records read, skipped: {skipped}; {self.mentions} linked mentions, {self.unlabelled} of "
            f"them with an entity not in the vocabulary (markers kept, no label){extra}"
        )
        logger.log(logging.WARNING if self.unlabelled or any(self.skipped.values()) else logging.INFO, message)


def read_qa(path: str | Path, entity_vocab: EntityVocab, bad_records: str = "raise") -> Any:
    """A released open-domain QA file (`edmem_*.jsonl`, or the static setting's `el_*.jsonl`) as a
    `datasets.Dataset`: `id`, `question` with `<E_s>`/`<E_e>` around its linked mentions, `answers`,
    `mention_entities` (the entity id of each mention in order, -100 when `entity_vocab` does not hold it) and
    `answer_entity` (the first answer entity `entity_vocab` holds, -100 when the answer is not an entity).

    A bad record (links outside the text, overlapping, or lists of different lengths) is a ValueError naming it, or
    with `bad_records="skip"` skipped (9 of the 45,779 released records link one span twice). Records without an
    answer are skipped; skipped records and mentions without a label are counted and logged.
    """
    from datasets import Dataset

    rows, counts = [], _ReadCounts(bad_records, {"without an answer": 0, "bad": 0})
    for record in read_jsonl(path):
        if not record.get("answer"):
            counts.skipped["without an answer"] += 1
            continue
        if (marked := counts.marked(record, "question", entity_vocab)) is None:
            continue
        question, entities = marked
        answer_entities = [_entity_id(entity_vocab, target, name) for target, name in record.get("answer_entity", [])]
        answer_entities = [entity for entity in answer_entities if entity != IGNORE_INDEX]
        rows.append(
            {
                "id": str(record["id"]),
                "question": question,
                "answers": list(record["answer"]),
                "mention_entities": entities,
                "answer_entity": answer_entities[0] if answer_entities else IGNORE_INDEX,
            }
        )
    entity_answers = sum(row["answer_entity"] != IGNORE_INDEX for row in rows)
    counts.log(path, len(rows), f"; entity answers: {entity_answers}")
    return Dataset.from_list(rows)


def read_generation(path: str | Path, entity_vocab: EntityVocab, bad_records: str = "raise") -> Any:
    """A released generation file (CREAK, WoW, ELI5, MSMARCO `edmem_*.jsonl`) as a `datasets.Dataset`: `id`,
    `input` with `<E_s>`/`<E_e>` around its linked mentions, `outputs` (the references), `mention_entities` (-100
    when `entity_vocab` does not hold the entity), `input_entity_names` and `output_entity_names` (one list per
    reference, for entity coverage).

    Bad records as for `read_qa`. Records without a reference are skipped; skipped records and mentions without a
    label are counted and logged.
    """
    from datasets import Dataset

    rows, counts = [], _ReadCounts(bad_records, {"without a reference": 0, "bad": 0})
    for record in read_jsonl(path):
        outputs = record.get("output")
        outputs = [outputs] if isinstance(outputs, str) else list(outputs or [])
        if not outputs:
            counts.skipped["without a reference"] += 1
            continue
        if (marked := counts.marked(record, "input", entity_vocab)) is None:
            continue
        text, entities = marked
        output_names = record.get("output_entity_name", [[] for _ in outputs])
        if len(output_names) != len(outputs):
            raise ValueError(
                f"record {record.get('id')!r}: {len(outputs)} references but {len(output_names)} output_entity_name lists"
            )
        rows.append(
            {
                "id": str(record["id"]),
                "input": text,
                "outputs": outputs,
                "mention_entities": entities,
                "input_entity_names": list(record.get("entity_name", [])),
                "output_entity_names": [list(names) for names in output_names],
            }
        )
    counts.log(path, len(rows))
    return Dataset.from_list(rows)


def read_answer_links(path: str | Path, entity_vocab: EntityVocab | None = None) -> dict[str, list[int] | None]:
    """A released `sling_invocab-*.json`: question id -> None when the answer is not an entity, else the entity ids
    of its answers (`{answer: [wikidata id, name, entity id], ...}`, or one `[wikidata id, name, entity id]` in the
    TQA files; with `entity_vocab` the vocabulary's ids, -100 for an entity it does not hold; without it the
    authors' ids)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected an object mapping question ids to null or {{answer: [qid, name, id]}}")
    links: dict[str, list[int] | None] = {}
    for question_id, answers in data.items():
        if answers is None:
            links[question_id] = None
            continue
        triples = list(answers.values()) if isinstance(answers, dict) else [answers]
        if not all(isinstance(triple, list) and len(triple) == 3 for triple in triples):
            raise ValueError(
                f"{path}: question {question_id!r}: expected {{answer: [qid, name, id]}} or [qid, name, id], "
                f"got {answers!r}"
            )
        links[question_id] = [
            int(target) if entity_vocab is None else _entity_id(entity_vocab, target, name)
            for _qid, name, target in triples
        ]
    return links


def encode_qa_record(record: Mapping[str, Any], tokenizer: Any, max_length: int = 64) -> dict[str, list[int]]:
    """A row of `read_qa` as training fields (see `encode_qa_example`)."""
    answer_entity = None if record["answer_entity"] == IGNORE_INDEX else record["answer_entity"]
    return _encode_marked_qa(
        record["question"], record["mention_entities"], record["answers"][0], answer_entity, tokenizer, max_length
    )


def encode_generation_record(record: Mapping[str, Any], tokenizer: Any, max_length: int = 256) -> dict[str, list[int]]:
    """A row of `read_generation` as training fields: the marked input with its entity labels, the first reference
    as the target (no mentions are linked in the references)."""
    start_id = tokenizer.convert_tokens_to_ids(ENTITY_START_TOKEN)
    input_ids = tokenizer(record["input"], truncation=True, max_length=max_length).input_ids
    labels = tokenizer(record["outputs"][0], add_special_tokens=False).input_ids[: max_length - 1]
    labels.append(tokenizer.eos_token_id)
    return {
        "input_ids": input_ids,
        "entity_labels": _labels_at_markers(input_ids, start_id, record["mention_entities"], f"record {record['id']}"),
        "labels": labels,
        "decoder_entity_labels": [IGNORE_INDEX] * len(labels),
    }


def encode_static_linking_record(
    record: Mapping[str, Any], tokenizer: Any, max_length: int = 64
) -> dict[str, list[int]]:
    """A row of `read_qa` whose answer is an entity as the static setting's training target (the paper, Section
    3.3): the decoder reads the question (its final token dropped) then `<E_s>` and EOS, the decoder memory and the
    entity-linking head are supervised with the answer entity at that `<E_s>`, and no token is scored by the LM
    loss. These are the inputs `model.link_entities(decoder_input="question")` reads at inference."""
    if record["answer_entity"] == IGNORE_INDEX:
        raise ValueError(f"record {record['id']}: the answer is not an entity: no static linking target")
    start_id = tokenizer.convert_tokens_to_ids(ENTITY_START_TOKEN)
    input_ids = tokenizer(record["question"], truncation=True, max_length=max_length).input_ids
    decoder_input_ids = static_linking_decoder_input(input_ids, start_id, tokenizer.eos_token_id)
    # aligned with `labels`, which the model shifts right: the label of the decoder's <E_s> sits one before it
    decoder_entity_labels = [IGNORE_INDEX] * len(decoder_input_ids)
    decoder_entity_labels[len(decoder_input_ids) - 3] = record["answer_entity"]
    return {
        "input_ids": input_ids,
        "entity_labels": _labels_at_markers(input_ids, start_id, record["mention_entities"], f"record {record['id']}"),
        "decoder_input_ids": decoder_input_ids,
        "labels": [IGNORE_INDEX] * len(decoder_input_ids),
        "decoder_entity_labels": decoder_entity_labels,
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

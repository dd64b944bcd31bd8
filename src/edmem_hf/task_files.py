"""Readers of the EDMem authors' released task files (github DM2-ND/EDMem `data/`): open-domain QA, entity-intensive
generation and the answer links of `entity_linking/sling_invocab-*.json`, as `datasets.Dataset`s whose texts carry
`<E_s> ... <E_e>` around their linked mentions and whose entity ids are those of a model's `EntityVocab`.

What each file holds is in `../shared/data/README.md` and docs/fine_tuning.md; what a row becomes for training is
`task_features.py`.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN, IGNORE_INDEX
from .entity_vocab import AUTHORS_ID_SPACE, EntityVocab

logger = logging.getLogger(__name__)

BAD_RECORDS = ("raise", "skip")
LINK_FIELDS = ("link_offset", "link_length", "link_target", "entity_name")
ANSWER_LINK_FIELDS = ("answer_link_offset", "answer_link_length", "answer_link_target", "answer_entity_name")
TEXT_FIELDS = (("question", "answer"), ("input", "output"))  # of a QA record, of a generation record
NAME_FIELDS = ("entity_name", "surface_name", "answer_entity", "output_entity_name")  # the entity names they carry
_SPLIT = re.compile(r"-(train|dev|test)\.jsonl$")


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


class BadRecordError(ValueError):
    """A record of a task file that cannot be read as it is (a line that is not JSON, a bad link); the message names
    the file and the line or record."""


def iter_jsonl(path: str | Path, bad_line: Callable[[str], None] | None = None) -> Iterator[tuple[int, Any]]:
    """`(line number, record)` of each JSON object of a JSON-lines file. A line that is not one is a `BadRecordError`
    naming the file and line, or, with `bad_line`, is left out and `bad_line` called with what is wrong with it."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    record = json.loads(line)
                    problem = None if isinstance(record, dict) else f"a JSON {type(record).__name__}, not an object"
                except json.JSONDecodeError as error:
                    problem = f"not JSON at column {error.colno} ({error.msg.removesuffix(' at')})"
                if problem is None:
                    yield number, record
                elif bad_line is None:
                    raise BadRecordError(f"{path}, line {number}: {problem}")
                else:
                    bad_line(f"line {number}: {problem}")


def read_jsonl(path: str | Path, bad_line: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Records (JSON objects) of a JSON-lines file (see `iter_jsonl`)."""
    return [record for _, record in iter_jsonl(path, bad_line)]


def task_file_texts(path: str | Path) -> Iterator[str]:
    """The texts of a released task file, one string a field value: each record's `question` and `answer`s (QA)
    or `input` and `output`s (generation), and the entity names it carries (`NAME_FIELDS`, which entity decoding
    spells), what a tokenizer for the task is trained on. A record with neither question nor input is a ValueError
    naming the file and line (a `sling_invocab-*.json` or another JSON file is no task file)."""
    for number, record in iter_jsonl(path):
        fields = next((pair for pair in TEXT_FIELDS if pair[0] in record), None)
        if fields is None:
            raise ValueError(
                f"{path}, line {number}: not a task file's record (a QA record has question and answer, a generation "
                "record input and output)"
            )
        for name in fields:
            value = record.get(name)
            for text in [value] if isinstance(value, str) else value or []:
                if isinstance(text, str) and text.strip():
                    yield text
        for name in NAME_FIELDS:
            yield from _strings(record.get(name))


def _strings(value: Any) -> Iterator[str]:
    """The non-empty strings in a field value nested in lists (`[[id, name], ...]`, `[[names], ...]`), ids left out."""
    if isinstance(value, str):
        if value.strip() and not value.isdigit():
            yield value
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _entity_id(vocab: EntityVocab, target: str | int, name: str) -> int:
    """The vocabulary's id of an entity the released files give by the authors' id `target` and `name`: through
    the authors' id (`EntityVocab.from_authors_id`: a table in their ids, or one of ours that kept them), else by
    name; IGNORE_INDEX when the vocabulary does not hold it (their id 0, "none", is never an entity). A `target`
    that is not a number (files of ours may name the entity there) is looked up by name only."""
    is_id = isinstance(target, int) or (isinstance(target, str) and target.strip().isdigit())
    entity_id = vocab.from_authors_id(int(target)) if is_id else None
    if entity_id is None and vocab.id_space != AUTHORS_ID_SPACE and name in vocab:
        entity_id = vocab.id_of(name)
    return IGNORE_INDEX if entity_id is None else entity_id


class _Reader:
    """What a reader does with one file: reads its lines and maps its links to the vocabulary's ids, checking both
    (a line that is not JSON or a bad link raises, or with `bad_records="skip"` is left out and counted), and
    counts what it read for one log line."""

    def __init__(self, path: str | Path, vocab: EntityVocab, bad_records: str):
        if bad_records not in BAD_RECORDS:
            raise ValueError(f"bad_records must be 'raise' or 'skip', got {bad_records!r}")
        self.path, self.vocab, self.bad_records = path, vocab, bad_records
        self.counts: Counter[str] = Counter()

    def bad(self, message: str) -> None:
        """A bad link: a `BadRecordError` naming the file, or (skip) a log line and a count."""
        if self.bad_records == "raise":
            raise BadRecordError(
                f"{self.path}: {message} (pass bad_records='skip', or --bad_records skip, to leave such links out "
                "and keep the record)"
            )
        logger.info("%s: left out: %s", self.path, message)
        self.counts["bad links left out"] += 1

    def records(self) -> list[dict[str, Any]]:
        """The file's records (counted); a line that is not JSON is a `BadRecordError` naming the file and line, or
        (skip) a log line and a count."""

        def bad_line(message: str) -> None:
            if self.bad_records == "raise":
                raise BadRecordError(
                    f"{self.path}, {message} (pass bad_records='skip', or --bad_records skip, to skip such lines)"
                )
            logger.info("%s: skipped: %s", self.path, message)
            self.counts["lines not a JSON record"] += 1

        records = read_jsonl(self.path, bad_line)
        self.counts["records"] = len(records)
        return records

    def links(self, where: str, text: str, lists: Sequence[Sequence[Any]], names: Sequence[str]):
        """`(start, end, entity id)` of the links given as parallel `lists` (offsets, lengths, targets, names) over
        `text`, sorted; entity ids are IGNORE_INDEX for an entity not in the vocabulary."""
        if len({len(values) for values in lists}) > 1:
            counts = ", ".join(f"{len(values)} {name}" for name, values in zip(names, lists))
            self.bad(f"{where}: link lists of different lengths ({counts})")
            return []
        mentions, cursor = [], 0
        for offset, length, target, name in sorted(zip(*lists)):
            if not (0 <= offset and length > 0 and offset + length <= len(text)):
                self.bad(
                    f"{where}: link {name!r} at {offset}..{offset + length} is outside the text ({len(text)} "
                    "characters)"
                )
                continue
            if offset < cursor:
                self.bad(f"{where}: link {name!r} at {offset} overlaps the link before it")
                continue
            mentions.append((offset, offset + length, _entity_id(self.vocab, target, name)))
            cursor = offset + length
        return mentions

    def marked(self, record: Mapping[str, Any], field: str) -> tuple[str, list[int]]:
        """`record[field]` with its linked mentions marked, and their entity ids."""
        lists = [record.get(name, []) for name in LINK_FIELDS]
        mentions = self.links(f"record {record.get('id')!r}", record[field], lists, LINK_FIELDS)
        text, entities = mark_mentions(record[field], mentions)
        self.counts["linked mentions"] += len(entities)
        self.counts["unlabelled"] += entities.count(IGNORE_INDEX)
        return text, entities

    def log(self, kept: int, skipped: Mapping[str, int], extra: str = "", limit: int | None = None) -> None:
        """One INFO line of what the file gave (with a `limit`, the first `kept` of the file's records); a WARNING
        when something is wrong: records or lines were skipped, or not one linked mention names an entity of the
        vocabulary (the wrong vocabulary for the file, or for its ids). Entities a vocabulary lacks (a test file's,
        a small model's) and bad links left out on request are no fault: they are counted in the line."""
        skipped = {**skipped, "lines not a JSON record": self.counts["lines not a JSON record"]}
        skipped_text = ", ".join(f"{count} {why}" for why, count in skipped.items() if count) or "none"
        linked, unlabelled = self.counts["linked mentions"], self.counts["unlabelled"]
        read = f"{kept} records read"
        if limit is not None:
            read = f"the first {kept} of its {self.counts['records']} records read (limit {limit})"
        message = (
            f"{self.path}: {read}, skipped: {skipped_text}; {linked} linked mentions, {unlabelled} of them with an "
            f"entity not in the vocabulary (markers kept, no label); {self.counts['bad links left out']} bad links "
            f"left out{extra}"
        )
        if linked and unlabelled == linked:
            message += "; not one linked entity is in the vocabulary: is it the vocabulary of this file's model?"
        wrong = any(skipped.values()) or (linked and unlabelled == linked)
        logger.log(logging.WARNING if wrong else logging.INFO, message)


# --- open-domain QA --------------------------------------------------------------------------------------------


def default_answer_links(path: str | Path) -> Path | None:
    """The released `entity_linking/sling_invocab-<split>.json` of a QA file `edmem_*-<split>.jsonl` (beside it,
    or in the `entity_linking` folder beside it), or None when there is none."""
    path = Path(path)
    split = _SPLIT.search(path.name)
    if split is None:
        return None
    for folder in (path.parent / "entity_linking", path.parent):
        candidate = folder / f"sling_invocab-{split.group(1)}.json"
        if candidate.is_file():
            return candidate
    return None


def _whole_answer_links(
    targets: Sequence[str], linked: Sequence[tuple[str, int]]
) -> tuple[list[list[list[int]]], int]:
    """Answer entities given by name (a test file's `answer_entity`, a sling file's links) as one mention over the
    whole of the target spelled so (exactly, else ignoring case); returns the targets' mentions and the number of
    linked entities no target spells."""
    mentions: list[list[list[int]]] = [[] for _ in targets]
    unmatched = 0
    for name, entity in linked:
        matches = [i for i, target in enumerate(targets) if target == name]
        matches = matches or [i for i, target in enumerate(targets) if target.casefold() == name.casefold()]
        unmatched += not matches
        for i in matches:
            if not mentions[i]:
                mentions[i] = [[0, len(targets[i]), entity]]
    return mentions, unmatched


def read_qa(
    path: str | Path,
    entity_vocab: EntityVocab,
    bad_records: str = "raise",
    answer_links: str | Path | None = "auto",
    limit: int | None = None,
) -> Any:
    """A released open-domain QA file (`edmem_*.jsonl`, or the static setting's `el_*.jsonl`) as a
    `datasets.Dataset` with one row a question:

    - `id`; `question`, with `<E_s>`/`<E_e>` around its linked mentions; `mention_entities`, the entity id of each
      mention in order (-100 when `entity_vocab` does not hold the entity);
    - `answers`: every acceptable answer (what exact match scores against);
    - `targets`: the answers training generates, one picked at random each time a record is read (the authors'
      `QADataset`): all of `answers`, except TriviaQA's training records, whose one target is their `entity` field
      (the answer's Wikipedia name);
    - `target_mentions`: for each target, `[start, end, entity id]` of its linked spans (character offsets into the
      target), which training marks `<E_s> ... <E_e>` with the entity ids as decoder entity labels;
    - `answer_entities`: the entities `entity_vocab` holds among the answers (in answer order), and `answer_entity`,
      the first of them or -100 when the answer is not an entity (the static setting's target, and the split of
      exact match into entity and non-entity answers).

    The answer links are read from the records when they have them (training files: `answer_link_offset`,
    `answer_link_length`, `answer_link_target`, `answer_entity_name`, one list per answer, spans possibly covering
    part of an answer; test files: `answer_entity`, the answer entities by id and name). A file with neither (the
    dev files) takes them from `answer_links`: a `sling_invocab-*.json` file, by default the one released beside the
    file (`default_answer_links`); None reads none. A named entity answer marks the whole of the answer spelled as
    its name.

    A bad link (outside its text, overlapping the link before it, or lists of different lengths) is a ValueError
    naming the file, the record and the link, or with `bad_records="skip"` is left out, counted and logged: its
    record is kept (9 of the 45,779 released records link one span twice; WebQuestions test record 37 is one).
    A line that is not JSON is a bad record too: an error naming the file and line, or (skip) left out and
    counted. Records without an answer are skipped. With `limit`, the first `limit` questions are read. One line is
    logged per file with what was read (with a limit, the counts are those of the questions read).
    """
    from datasets import Dataset

    reader = _Reader(path, entity_vocab, bad_records)
    records = reader.records()
    in_records = any(
        any(name in record for name in (*ANSWER_LINK_FIELDS, "answer_entity", "entity")) for record in records
    )
    if answer_links == "auto":
        answer_links = None if in_records else default_answer_links(path)
    sling = _read_answer_link_triples(answer_links) if answer_links is not None and not in_records else None
    rows, skipped, counts = [], Counter({"without an answer": 0}), Counter()
    for record in records:
        if len(rows) == limit:
            break
        if not record.get("answer"):
            skipped["without an answer"] += 1
            continue
        question, entities = reader.marked(record, "question")
        answers = list(record["answer"])
        targets = [record["entity"]] if record.get("entity") else answers
        where = f"record {record.get('id')!r}"
        if "answer_link_offset" in record:
            lists = [record.get(name, []) for name in ANSWER_LINK_FIELDS]
            target_mentions: list[list[list[int]]] = [[] for _ in targets]
            if any(len(values) != len(targets) for values in lists):
                counts_text = ", ".join(f"{len(values)} {name}" for name, values in zip(ANSWER_LINK_FIELDS, lists))
                reader.bad(f"{where}: {len(targets)} answers to train on but {counts_text}")
            else:
                for i, target in enumerate(targets):
                    spans = reader.links(
                        f"{where}, answer {target!r}", target, [v[i] for v in lists], ANSWER_LINK_FIELDS
                    )
                    target_mentions[i] = [list(span) for span in spans]
            # an answer is an entity when one link spans the whole of it
            whole = [m[0][2] for t, m in zip(targets, target_mentions) if len(m) == 1 and m[0][:2] == [0, len(t)]]
        else:
            if "answer_entity" in record:
                linked = [(name, _entity_id(entity_vocab, target, name)) for target, name in record["answer_entity"]]
            elif sling is not None and sling.get(str(record["id"])):
                linked = [
                    (answer, _entity_id(entity_vocab, target, name))
                    for answer, name, target in sling[str(record["id"])]
                ]
            else:
                linked = []
            target_mentions, unmatched = _whole_answer_links(targets, linked)
            counts["answer entities whose name no answer spells (not marked)"] += unmatched
            whole = [entity for _, entity in linked]
        answer_entities = list(dict.fromkeys(entity for entity in whole if entity != IGNORE_INDEX))
        counts["answer entities not in the vocabulary"] += sum(entity == IGNORE_INDEX for entity in whole)
        counts["targets with linked spans"] += sum(bool(m) for m in target_mentions)
        counts["linked answer spans"] += sum(map(len, target_mentions))
        counts["entity answers"] += bool(answer_entities)
        rows.append(
            {
                "id": str(record["id"]),
                "question": question,
                "answers": answers,
                "mention_entities": entities,
                "targets": targets,
                "target_mentions": target_mentions,
                "answer_entities": answer_entities,
                "answer_entity": answer_entities[0] if answer_entities else IGNORE_INDEX,
            }
        )
    source = "the records" if in_records else (str(answer_links) if sling is not None else "none")
    extra = f"; answer links from {source}: " + ", ".join(f"{count} {what}" for what, count in counts.items())
    reader.log(len(rows), skipped, extra, limit)
    features = _qa_features()  # typed, so that a file without answer links (or records) reads all the same
    return Dataset.from_dict({name: [row[name] for row in rows] for name in features}, features=features)


def _qa_features() -> Any:
    from datasets import Features, Sequence, Value

    return Features(
        {
            "id": Value("string"),
            "question": Value("string"),
            "answers": Sequence(Value("string")),
            "mention_entities": Sequence(Value("int64")),
            "targets": Sequence(Value("string")),
            "target_mentions": Sequence(Sequence(Sequence(Value("int64")))),
            "answer_entities": Sequence(Value("int64")),
            "answer_entity": Value("int64"),
        }
    )


# --- entity-intensive generation -------------------------------------------------------------------------------


def read_generation(
    path: str | Path, entity_vocab: EntityVocab, bad_records: str = "raise", limit: int | None = None
) -> Any:
    """A released generation file (CREAK, WoW, ELI5, MSMARCO `edmem_*.jsonl`) as a `datasets.Dataset`: `id`,
    `input` with `<E_s>`/`<E_e>` around its linked mentions, `outputs` (the references), `mention_entities` (-100
    when `entity_vocab` does not hold the entity), `input_entity_names` and `output_entity_names` (one list per
    reference, for entity coverage).

    Bad links and lines that are not JSON as for `read_qa`. Records without a reference are skipped. With `limit`,
    the first `limit` records are read. What was read is logged.
    """
    from datasets import Dataset

    reader = _Reader(path, entity_vocab, bad_records)
    rows, skipped = [], {"without a reference": 0}
    for record in reader.records():
        if len(rows) == limit:
            break
        outputs = record.get("output")
        outputs = [outputs] if isinstance(outputs, str) else list(outputs or [])
        if not outputs:
            skipped["without a reference"] += 1
            continue
        if "input" not in record:
            raise BadRecordError(f"{path}: record {record.get('id')!r} has no 'input' field: not a generation file")
        text, entities = reader.marked(record, "input")
        output_names = record.get("output_entity_name", [[] for _ in outputs])
        if len(output_names) != len(outputs):
            raise BadRecordError(
                f"{path}: record {record.get('id')!r}: {len(outputs)} references but {len(output_names)} "
                "output_entity_name lists"
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
    reader.log(len(rows), skipped, limit=limit)
    return Dataset.from_list(rows)


# --- answer links ------------------------------------------------------------------------------------------------


def _read_answer_link_triples(path: str | Path) -> dict[str, list[tuple[str, str, str]] | None]:
    """A `sling_invocab-*.json` as question id -> None (the answer is not an entity) or `[(answer as written, entity
    name, entity id)]` (`{answer: [wikidata id, name, entity id]}`; TQA: one `[wikidata id, name, entity id]`, whose
    answer is its name)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise BadRecordError(f"{path}: expected an object mapping question ids to null or {{answer: [qid, name, id]}}")
    links: dict[str, list[tuple[str, str, str]] | None] = {}
    for question_id, answers in data.items():
        if answers is None:
            links[question_id] = None
            continue
        items = list(answers.items()) if isinstance(answers, dict) else [(None, answers)]
        if not all(isinstance(triple, list) and len(triple) == 3 for _, triple in items):
            raise BadRecordError(
                f"{path}: question {question_id!r}: expected {{answer: [qid, name, id]}} or [qid, name, id], "
                f"got {answers!r}"
            )
        links[question_id] = [
            (name if answer is None else answer, name, target) for answer, (_, name, target) in items
        ]
    return links


def read_answer_links(path: str | Path, entity_vocab: EntityVocab | None = None) -> dict[str, list[int] | None]:
    """A released `sling_invocab-*.json`: question id -> None when the answer is not an entity, else the entity ids
    of its answers (`{answer: [wikidata id, name, entity id], ...}`, or one `[wikidata id, name, entity id]` in the
    TQA files; with `entity_vocab` the vocabulary's ids, -100 for an entity it does not hold; without it the
    authors' ids). `edmem evaluate --answer-links` splits exact match with it."""
    return {
        question_id: None
        if answers is None
        else [
            int(target) if entity_vocab is None else _entity_id(entity_vocab, target, name)
            for _, name, target in answers
        ]
        for question_id, answers in _read_answer_link_triples(path).items()
    }


__all__ = [
    "BAD_RECORDS",
    "BadRecordError",
    "default_answer_links",
    "mark_mentions",
    "read_answer_links",
    "read_generation",
    "read_jsonl",
    "read_qa",
]

"""`edmem build-corpus`: a MediaWiki dump -> EDMem pre-training passages, entity vocabulary and alias table.

The build pipeline: parse in worker processes, count links, label, tokenise and window, split and save.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from itertools import chain
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from transformers import PreTrainedTokenizerBase

from .arguments import CommandArgumentParser
from .collator import IGNORE_INDEX
from .configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN
from .dump import MalformedPageError, WikiPage, iter_pages, parse_page
from .entity_links import (
    NOT_AN_ARTICLE,
    EntityAnchors,
    EntityLinks,
    SearchedAliases,
    count_links,
    write_vocabulary_files,
)
from .fast_tokenization import ByteLevelWordEncoder, insert_mention_markers
from .marked_tokenization import MarkedTokens, tokenize_with_mentions
from .mention_labels import Mention, label_mentions
from .passages import PassageSettings, window_passages
from .tokenization import DEFAULT_VOCAB_SIZE, extend_tokenizer, train_tokenizer

logger = logging.getLogger(__name__)

STATS_NAME = "stats.json"

PAGE_FEATURES = datasets.Features(
    {
        "page_id": datasets.Value("int64"),
        "title": datasets.Value("string"),
        "status": datasets.Value("string"),  # "article", "redirect" or "malformed"
        "redirect": datasets.Value("string"),
        "text": datasets.Value("string"),
        "link_starts": datasets.Sequence(datasets.Value("int32")),
        "link_ends": datasets.Sequence(datasets.Value("int32")),
        "link_targets": datasets.Sequence(datasets.Value("string")),
        "link_anchors": datasets.Sequence(datasets.Value("string")),
        # the text's tokens and, per token, where its word starts in the text (`ByteLevelWordEncoder.encode_words`),
        # made while parsing when a tokenizer is given; null otherwise (tokenised when the passages are made)
        "token_ids": datasets.Sequence(datasets.Value("int32")),
        "token_starts": datasets.Sequence(datasets.Value("int32")),
    }
)
PASSAGE_FEATURES = datasets.Features(
    {
        "input_ids": datasets.Sequence(datasets.Value("int32")),
        "entity_labels": datasets.Sequence(datasets.Value("int64")),
        "doc_id": datasets.Value("int64"),
        "passage_index": datasets.Value("int32"),
        # per-passage counts for the stats report, dropped before saving
        "num_link_mentions": datasets.Value("int32"),
        "num_heuristic_mentions": datasets.Value("int32"),
        "num_labeled_mentions": datasets.Value("int32"),
    }
)
_PAGE_SCHEMA = PAGE_FEATURES.arrow_schema
_PASSAGE_SCHEMA = PASSAGE_FEATURES.arrow_schema
_STATS_COLUMNS = ["num_link_mentions", "num_heuristic_mentions", "num_labeled_mentions"]
_SAVED_SCHEMA = datasets.Features({k: v for k, v in PASSAGE_FEATURES.items() if k not in _STATS_COLUMNS}).arrow_schema


@dataclass
class CorpusSettings:
    """What the build makes (besides its input, output and tokenizer): `build_corpus`'s keyword arguments and
    `edmem build-corpus`'s options."""

    num_entities: int = field(default=1_000_000, metadata={"help": "Entity vocabulary size: top-N most linked."})
    vocab_size: int = field(default=DEFAULT_VOCAB_SIZE, metadata={"help": "Vocabulary size when training one."})
    num_proc: int = field(default=1, metadata={"help": "Processes for parsing and passaging."})
    strict: bool = field(default=False, metadata={"help": "Stop at the first malformed page instead of skipping it."})
    passage_length: int = field(default=128, metadata={"help": "Tokens per passage, with <s> and </s>."})
    passage_overlap: int = field(
        default=10, metadata={"aliases": ["--passage-stride"], "help": "Tokens shared by consecutive passages."}
    )
    validation_fraction: float = field(default=0.005, metadata={"help": "Fraction of passages held out."})
    seed: int = field(default=42, metadata={"help": "Seed of the validation split."})
    heuristic_labels: bool = field(
        default=True,
        metadata={"help": "Label unlinked mentions too: the entities' aliases found in the text of their pages."},
    )
    max_aliases_per_entity: int = field(default=10, metadata={"help": "Anchors per entity used by the heuristics."})
    require_existing_pages: bool = field(
        default=False,
        metadata={"help": "Count only link targets that are articles of the dump (complete dumps; drops red links)."},
    )

    def __post_init__(self):
        if self.num_entities <= 0:
            raise ValueError(f"num_entities must be positive, got {self.num_entities}")
        if not 0 <= self.validation_fraction < 1:
            raise ValueError(f"validation_fraction must be in [0, 1), got {self.validation_fraction}")
        if self.num_proc < 1:
            raise ValueError(f"num_proc must be at least 1, got {self.num_proc}")
        PassageSettings(self.passage_length, self.passage_overlap)  # checks the passage length and overlap

    @property
    def passage_settings(self) -> PassageSettings:
        return PassageSettings(self.passage_length, self.passage_overlap)


# --- 1. parse ------------------------------------------------------------------------------------------------------

# Pages go from the reader to the parsing processes in chunks of about this many characters of wikitext.
_PARSE_CHUNK_CHARS = 256_000
_PARSE_CHUNK_PAGES = 64
_PASSAGE_TASK_CHARS = 256_000  # pages go to the passaging processes in ranges of about this much plain text
_IN_FLIGHT_PER_PROCESS = 4  # chunks queued per process: enough to keep them busy, memory stays flat
_TOKEN_COLUMNS = ["token_ids", "token_starts"]


def _parsed_row(page: WikiPage, path: str, strict: bool) -> dict:
    try:
        parsed = parse_page(page)
    except MalformedPageError as err:
        if strict:
            raise MalformedPageError(f"{path}: {err} (--strict stops at the first malformed page)") from None
        logger.warning("skipping malformed page in %s: %s", path, err)
        return {
            "page_id": page.page_id,
            "title": page.title or "",
            "status": "malformed",
            "redirect": None,
            "text": "",
            "link_starts": [],
            "link_ends": [],
            "link_targets": [],
            "link_anchors": [],
        }
    return {
        "page_id": parsed.page_id,
        "title": parsed.title,
        "status": "redirect" if parsed.redirect else "article",
        "redirect": parsed.redirect,
        "text": parsed.text,
        "link_starts": [link.start for link in parsed.links],
        "link_ends": [link.end for link in parsed.links],
        "link_targets": [link.target for link in parsed.links],
        "link_anchors": [link.anchor for link in parsed.links],
    }


def _parse_chunk(pages: list[WikiPage], path: str, strict: bool) -> pa.RecordBatch:
    """Parsed pages (PAGE_FEATURES), in the order given; articles also tokenised when the worker state has a
    `word_encoder` (the text's words do not depend on the entity vocabulary, only the markers do)."""
    columns: dict[str, list] = {name: [] for name in PAGE_FEATURES if name not in _TOKEN_COLUMNS}
    encoder = _WORKER_STATE.word_encoder if _WORKER_STATE.pretokenize else None
    tokens: list[tuple[np.ndarray, np.ndarray] | None] = []
    for page in pages:
        row = _parsed_row(page, path, strict)
        for name, values in columns.items():
            values.append(row[name])
        tokens.append(
            encoder.encode_words(row["text"]) if encoder is not None and row["status"] == "article" else None
        )
    ids = _int32_list_array([None if t is None else t[0] for t in tokens])
    starts = _int32_list_array([None if t is None else t[1] for t in tokens])
    return pa.RecordBatch.from_pydict({**columns, "token_ids": ids, "token_starts": starts}, schema=_PAGE_SCHEMA)


def _int32_list_array(rows: list[np.ndarray | None]) -> pa.Array:
    """A list<int32> array of int32 arrays (None: null), built from one buffer instead of row by row."""
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum([0 if row is None else len(row) for row in rows], out=offsets[1:])
    present = [row for row in rows if row is not None]
    values = np.concatenate(present) if present else np.zeros(0, dtype=np.int32)
    mask = pa.array([row is None for row in rows], type=pa.bool_())
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=pa.int32()), mask=mask)


def _page_chunks(path: str) -> Iterator[tuple[list[WikiPage], str]]:
    """Chunks of pages; the first ones small, so that the workers start while the reader is still warming up."""
    chunk: list[WikiPage] = []
    size = 0
    max_chars = _PARSE_CHUNK_CHARS // 8
    for page in iter_pages(path):
        chunk.append(page)
        size += len(page.text or "")
        if size >= max_chars or len(chunk) >= _PARSE_CHUNK_PAGES:
            yield chunk, path
            chunk, size = [], 0
            max_chars = min(2 * max_chars, _PARSE_CHUNK_CHARS)
    if chunk:
        yield chunk, path


def _parse_chunk_to_file(pages: list[WikiPage], path: str, strict: bool, out_path: str) -> str:
    """`_parse_chunk` written to `out_path` (through a file, not the pool's pipe: see `_passages_task`)."""
    with _arrow_file(out_path, _PAGE_SCHEMA) as writer:
        writer.write_batch(_parse_chunk(pages, path, strict))
    return out_path


def _parse_file(path: str, strict: bool, cache_file: str) -> str:
    """Parses a whole dump file into an Arrow file (one task when several dump files are given)."""
    with _arrow_file(cache_file, _PAGE_SCHEMA) as writer:
        for chunk, _ in _page_chunks(path):
            writer.write_batch(_parse_chunk(chunk, path, strict))
    return cache_file


# --- 2. count links and write the passage tasks' inputs ----------------------------------------------------------

_PASSAGE_INPUT_COLUMNS = ["status", "page_id", "text", "link_starts", "link_ends", *_TOKEN_COLUMNS]
_LINK_ENTITY_SCHEMA = pa.schema([("link_entities", pa.list_(pa.int32())), ("own_entity", pa.int32())])
_LOOKUP_PAGES = 1 << 15  # pages whose links are looked up at once (a few million links)


@dataclass
class _PassageJob:
    """What a passage task reads, besides its pages: files written once by this process and memory-mapped by each
    worker (so that the workers of the parse, which already hold the tokenizer, make the passages too; nothing
    large is pickled or copied per worker)."""

    page_files: list[str]  # the page cache
    link_file: str  # per page of the cache: its links' entity ids (`_LINK_ENTITY_SCHEMA`)
    name_file: str  # the vocabulary's names, in id order
    anchor_file: str  # each entity's anchors, most linked first (`EntityLinks.anchor_table`)
    settings: CorpusSettings
    pretokenized: bool  # the articles' words were made while parsing


def _write_passage_inputs(work_dir: Path, table: pa.Table, job: _PassageJob, links: EntityLinks) -> None:
    """The passage tasks' files: per page, each link's entity id (a vocabulary id, OUT_OF_VOCAB or NOT_AN_ARTICLE)
    and the page's own entity (-1: none), looked up in Arrow; the vocabulary's names and anchors."""
    with _arrow_file(job.link_file, _LINK_ENTITY_SCHEMA) as writer:
        # many pages per look-up (index_in hashes its value set on every call), a bounded number (memory stays flat)
        for offset in range(0, len(table), _LOOKUP_PAGES):
            pages = table.slice(offset, _LOOKUP_PAGES).select(["title", "link_targets"]).combine_chunks()
            targets = pages.column("link_targets").combine_chunks()
            positions = pc.index_in(pc.list_flatten(targets), value_set=links.targets)
            offsets = pc.subtract(targets.offsets, targets.offsets[0])
            entities = pa.ListArray.from_arrays(offsets, links.target_ids.take(positions), mask=pc.is_null(targets))
            own = pc.fill_null(pc.index_in(pages.column("title"), value_set=links.names), -1).combine_chunks()
            writer.write_batch(pa.RecordBatch.from_arrays([entities, own], schema=_LINK_ENTITY_SCHEMA))
    for path, columns in ((job.name_file, {"name": links.names}), (job.anchor_file, links.anchor_table)):
        columns = pa.table(columns)
        with _arrow_file(path, columns.schema) as writer:
            writer.write_table(columns)


# --- 3. label, tokenise and window -------------------------------------------------------------------------------


@dataclass
class _WorkerState:
    """What the worker processes hold: set by the pool initializer (inherited without pickling when forked)."""

    tokenizer: PreTrainedTokenizerBase | None = None
    word_encoder: ByteLevelWordEncoder | None = None  # the fast path, where it applies to the tokenizer
    pretokenize: bool = False  # the parse also tokenises the articles (the words do not depend on the vocabulary)


_WORKER_STATE = _WorkerState()
# A passage worker's pages (with their links' entity ids) and searched aliases, read once per job.
_PASSAGE_INPUTS: dict[str, tuple[pa.Table, SearchedAliases]] = {}


def _set_worker_state(state: _WorkerState) -> None:
    global _WORKER_STATE
    _WORKER_STATE = state


def _passage_inputs(job: _PassageJob) -> tuple[pa.Table, SearchedAliases]:
    """The pages (with their links' entity ids) and the searched aliases of a job, read once per process."""
    inputs = _PASSAGE_INPUTS.get(job.link_file)
    if inputs is None:
        _PASSAGE_INPUTS.clear()
        pages = _read_arrow_files(job.page_files).select(_PASSAGE_INPUT_COLUMNS)
        for name, column in zip(_LINK_ENTITY_SCHEMA.names, _read_arrow_files([job.link_file]).columns):
            pages = pages.append_column(name, column)
        names = _read_arrow_files([job.name_file]).column("name").to_pylist()
        anchors = EntityAnchors(_read_arrow_files([job.anchor_file]), len(names))
        searched = SearchedAliases(names, anchors, job.settings.max_aliases_per_entity)
        inputs = _PASSAGE_INPUTS[job.link_file] = (pages, searched)
    return inputs


def _page_ranges(table: pa.Table, max_chars: int) -> list[tuple[int, int]]:
    """`(offset, length)` ranges of pages holding about `max_chars` characters of text each (at least one page)."""
    ends = np.cumsum(pc.fill_null(pc.utf8_length(table.column("text")), 0).to_numpy())
    ranges = []
    offset = 0
    while offset < len(table):
        done = ends[offset - 1] if offset else 0
        stop = max(int(np.searchsorted(ends, done + max_chars, side="right")), offset + 1)
        ranges.append((offset, stop - offset))
        offset = stop
    return ranges


def _passages_task(job: _PassageJob, offset: int, length: int, out_path: str) -> tuple[str, dict]:
    """Writes the passages of the articles among pages `offset..offset+length` of the page cache to `out_path`;
    returns it with their counts (`_PassageCounts.summary`). Passages go through a file, not the pool's pipe:
    a worker sending a large result waits until this process's result thread reads it, which waits for the
    GIL while this process reads the dump or writes the vocabulary."""
    pages, searched_aliases = _passage_inputs(job)
    table = pages.slice(offset, length)
    rows = table.drop_columns(_TOKEN_COLUMNS).to_pydict()
    keep = [i for i, status in enumerate(rows.pop("status")) if status == "article"]
    articles = {name: [values[i] for i in keep] for name, values in rows.items()}
    if job.pretokenized:
        ids, starts = _int32_list_rows(table.column("token_ids")), _int32_list_rows(table.column("token_starts"))
        words = [None if ids[i] is None else (ids[i], starts[i]) for i in keep]
    else:
        words = [None] * len(keep)
    batch = _make_passages(articles, words, searched_aliases, job.settings)
    with _arrow_file(out_path, _PASSAGE_SCHEMA) as writer:
        writer.write_batch(batch)
    return out_path, _PassageCounts.summary(batch)


def _int32_list_rows(column: pa.ChunkedArray) -> list[np.ndarray | None]:
    """The rows of a list<int32> column as numpy views (None where null)."""
    array = column.combine_chunks()
    offsets = array.offsets.to_numpy()  # of this (possibly sliced) array, into the whole `values`
    values = array.values.to_numpy()
    valid = array.is_valid().to_numpy(zero_copy_only=False)
    return [values[offsets[i] : offsets[i + 1]] if valid[i] else None for i in range(len(array))]


def _make_passages(
    articles: dict[str, list],
    words: list[tuple[np.ndarray, np.ndarray] | None],
    entity_aliases: SearchedAliases,
    settings: CorpusSettings,
) -> pa.RecordBatch:
    """The passages of a batch of articles (`PASSAGE_FEATURES`), built from arrays (no Python list per token).

    An article is tokenised by the fast path (its words made while parsing, or here) where that applies, and by
    the reference (`tokenize_with_mentions`) otherwise."""
    tokenizer, encoder = _WORKER_STATE.tokenizer, _WORKER_STATE.word_encoder
    heuristics = settings.heuristic_labels
    start_id, end_id = tokenizer.convert_tokens_to_ids([ENTITY_START_TOKEN, ENTITY_END_TOKEN])
    labelled: list[tuple[str, list[Mention]]] = []
    documents: list[MarkedTokens | None] = []
    for text, starts, ends, entity_ids, own_id, text_words in zip(
        articles["text"],
        articles["link_starts"],
        articles["link_ends"],
        articles["link_entities"],
        articles["own_entity"],
        words,
    ):
        links = []
        candidates: dict[int, Sequence[str]] = {}
        for start, end, entity_id in zip(starts, ends, entity_ids):
            if entity_id == NOT_AN_ARTICLE:
                continue  # red link: not marked
            links.append((start, end, entity_id if entity_id >= 0 else IGNORE_INDEX))
            if entity_id >= 0 and heuristics:
                candidates[entity_id] = entity_aliases[entity_id]
        if own_id >= 0 and heuristics:
            candidates[own_id] = entity_aliases[own_id]
        mentions = label_mentions(text, links, candidates)
        labelled.append((text, mentions))
        if text_words is None and encoder is not None:
            text_words = encoder.encode_words(text)
        marked = None
        if text_words is not None:
            marked = insert_mention_markers(text, *text_words, mentions, start_id, end_id, encoder.piece_ids)
        documents.append(marked)
    left = [index for index, document in enumerate(documents) if document is None]  # where the fast path declined
    for index, marked in zip(left, tokenize_with_mentions([labelled[index] for index in left], tokenizer)):
        documents[index] = marked
    passage_settings = settings.passage_settings
    windows = [
        window_passages(document, passage_settings, tokenizer.bos_token_id, tokenizer.eos_token_id)
        for document in documents
    ]
    num_passages = [len(w.lengths) for w in windows]
    offsets = np.zeros(sum(num_passages) + 1, dtype=np.int32)
    np.cumsum(np.concatenate([w.lengths for w in windows] or [np.zeros(0, np.int64)]), out=offsets[1:])
    counts = np.concatenate([w.counts for w in windows] or [np.zeros((0, 3), np.int32)])

    def column(part: str, dtype) -> np.ndarray:
        return np.concatenate([getattr(w, part) for w in windows] or [np.zeros(0, dtype)])

    arrays = {
        "input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(column("ids", np.int32))),
        "entity_labels": pa.ListArray.from_arrays(pa.array(offsets), pa.array(column("labels", np.int64))),
        "doc_id": pa.array(np.repeat(np.asarray(articles["page_id"], dtype=np.int64), num_passages)),
        "passage_index": pa.array(column("passage_index", np.int32)),
        **{name: pa.array(counts[:, k]) for k, name in enumerate(_STATS_COLUMNS)},
    }
    return pa.RecordBatch.from_arrays([arrays[name] for name in _PASSAGE_SCHEMA.names], schema=_PASSAGE_SCHEMA)


# --- the pipeline --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _arrow_file(path: str, schema: pa.Schema):
    """An Arrow stream file (what `datasets.Dataset.from_file` reads), written batch by batch. Batches are built
    with pyarrow straight from Python lists (datasets' `ArrowWriter` casts them again, in Python: slower)."""
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        yield writer


def _read_arrow_files(paths: Sequence[str]) -> pa.Table:
    """Arrow stream files as one table, memory-mapped (pyarrow alone: a `datasets.Dataset` would hash them first)."""
    return pa.concat_tables([pa.ipc.open_stream(pa.memory_map(path)).read_all() for path in paths])


def _read_and_remove(paths: Iterable[str]) -> Iterator[pa.RecordBatch]:
    """The record batches of Arrow stream files, in order; each file is removed once read."""
    for path in paths:
        with pa.OSFile(path) as source:
            yield from pa.ipc.open_stream(source)
        os.remove(path)


def _fork_context():
    """Forked processes where the platform allows (they inherit the parent's imports, state and warm caches
    without pickling); None elsewhere."""
    if "fork" in multiprocessing.get_all_start_methods() and sys.platform != "darwin":
        return multiprocessing.get_context("fork")
    return None


@contextlib.contextmanager
def _worker_pool(num_workers: int, state: _WorkerState):
    """A pool of `num_workers` processes (forked where the platform allows), or None for no worker. `state` is
    the worker state of the pool's processes and, meanwhile, of this one (which runs the tasks without a pool)."""
    previous = _WORKER_STATE
    _set_worker_state(state)
    pool = None
    try:
        if num_workers >= 1:
            context = _fork_context() or multiprocessing.get_context()
            pool = context.Pool(num_workers, initializer=_set_worker_state, initargs=(state,))
        yield pool
        if pool is not None:
            pool.close()
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
        _set_worker_state(previous)


def _worker_state(tokenizer: PreTrainedTokenizerBase | None, pretokenize: bool) -> _WorkerState:
    """The workers' tokenizer and its fast encoder (None where the fast path does not apply). With `pretokenize`,
    the encoder also tokenises the articles while they are parsed: only where the parsing processes inherit it
    (forked, not spawned)."""
    encoder = ByteLevelWordEncoder.for_tokenizer(tokenizer) if tokenizer is not None else None
    return _WorkerState(tokenizer, encoder, pretokenize and encoder is not None and _fork_context() is not None)


def _ordered_map(pool, func, tasks, max_in_flight: int) -> Iterator:
    """`func(*task)` for each task, results in task order: run by the pool's processes, or here without a pool.

    At most `max_in_flight` tasks are pending at a time (unlike `Pool.imap`, which reads its whole input ahead: a
    dump would end up in memory). This process only reads the input and collects the results: when it also ran
    tasks, the workers sat idle whenever their queue ran dry during one of its tasks."""
    if pool is None:
        for task in tasks:
            yield func(*task)
        return
    pending: deque = deque()
    for task in tasks:
        pending.append(pool.apply_async(func, task))
        while pending and (len(pending) >= max_in_flight or pending[0].ready()):
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()


def build_corpus(
    dump: str | os.PathLike | Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    *,
    tokenizer: str | os.PathLike | PreTrainedTokenizerBase | None = None,
    **settings: Any,
) -> dict:
    """Builds a pre-training corpus from one or more MediaWiki dump files into `out_dir`; returns the stats.

    Writes `passages/` (DatasetDict train/validation), `entity_vocab.json`, `aliases.json`, `tokenizer/` and
    `stats.json`. Without `tokenizer`, a byte-level BPE of `vocab_size` is trained on the corpus text.
    `settings` are the fields of `CorpusSettings` (`num_entities`, `num_proc`, `passage_length`, ...).

    Entities are link targets after redirect resolution. With `require_existing_pages`, only targets that are
    articles of the dump count (drops red links; use it on complete dumps only: on an excerpt most targets
    are missing).
    """
    started = time.perf_counter()
    build_settings = CorpusSettings(**settings)
    dump_paths = [os.fspath(dump)] if isinstance(dump, str | os.PathLike) else [os.fspath(p) for p in dump]
    if not dump_paths:
        raise ValueError("no dump file given")
    for path in dump_paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"dump file {path} does not exist")
    if isinstance(tokenizer, str | os.PathLike) and not os.path.isdir(tokenizer):  # not after parsing the dump
        raise FileNotFoundError(f"tokenizer directory {os.fspath(tokenizer)!r} does not exist")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    work_dir = Path(tempfile.mkdtemp(prefix=".build-", dir=out_dir))
    try:
        with _quiet_gc():
            return _build(dump_paths, out_dir, work_dir, tokenizer, build_settings, started)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


# Kept because it pays: measured without it, a build of ten copies of the Wikipedia sample took 14% longer
# (median of 5 interleaved runs: 39.2 s against 34.5 s).
@contextlib.contextmanager
def _quiet_gc():
    """Fewer, cheaper garbage collections during the build: the objects that exist before it (torch, transformers,
    the tokenizer: a large heap) are frozen out of collection (forked workers inherit that), and collections run
    less often. The build makes millions of short-lived containers that are no cycles. Restored on exit."""
    threshold = gc.get_threshold()
    was_frozen = gc.get_freeze_count() > 0
    gc.freeze()
    gc.set_threshold(max(threshold[0], 50_000), *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        if not was_frozen:
            gc.unfreeze()


def _build(
    dump_paths: list[str],
    out_dir: Path,
    work_dir: Path,
    tokenizer: str | os.PathLike | PreTrainedTokenizerBase | None,
    settings: CorpusSettings,
    started: float,
) -> dict:
    # 1. parse (the only pass over the XML) into an Arrow cache, in dump order
    cache_dir = work_dir / "cache"
    cache_dir.mkdir()
    num_proc = settings.num_proc
    workers = num_proc if num_proc > 1 else 0  # this process reads and collects; with one process, does it all
    max_in_flight = _IN_FLIGHT_PER_PROCESS * num_proc
    one_reader = len(dump_paths) == 1 or num_proc == 1
    # One pool of worker processes (forked where the platform allows) parses the pages and then makes the passages.
    with contextlib.ExitStack() as pools:
        with contextlib.ExitStack() as reading:
            if one_reader:
                # One reader (this process: decompression and XML) hands chunks of pages to the workers. It reads
                # the first chunk now: the dump then decompresses (a thread) while the tokenizer loads. The chunks
                # are closed on an error too (an open dump's thread must not outlive the build).
                chunks = reading.enter_context(
                    contextlib.closing(chunk for path in dump_paths for chunk in _page_chunks(path))
                )
                first_chunk = next(chunks, None)
            # A given tokenizer's words are made while parsing, by the workers, which inherit the loaded tokenizer
            # (they have time to spare, waiting for the reader), so that after the vocabulary only the markers go in.
            if tokenizer is not None:
                tokenizer = extend_tokenizer(tokenizer)
            state = _worker_state(tokenizer, pretokenize=True)
            pool = pools.enter_context(_worker_pool(workers, state))
            if one_reader:
                cache_files = [str(cache_dir / "pages.arrow")]
                with _arrow_file(cache_files[0], _PAGE_SCHEMA) as writer:
                    all_chunks = chain([first_chunk] if first_chunk is not None else [], chunks)
                    tasks = (
                        (pages, path, settings.strict, str(cache_dir / f"chunk-{k:06d}.arrow"))
                        for k, (pages, path) in enumerate(all_chunks)
                    )
                    for batch in _read_and_remove(_ordered_map(pool, _parse_chunk_to_file, tasks, max_in_flight)):
                        writer.write_batch(batch)
            else:
                # Several dump files (the split enwiki-...-articlesN files): each worker reads and parses whole files.
                tasks = [
                    (path, settings.strict, str(cache_dir / f"pages-{k:05d}.arrow"))
                    for k, path in enumerate(dump_paths)
                ]
                cache_files = list(_ordered_map(pool, _parse_file, tasks, len(tasks) + 1))
        table = _read_arrow_files(cache_files)
        stage_seconds = {"parse": time.perf_counter() - started}

        def stage_done(name: str) -> None:
            stage_seconds[name] = time.perf_counter() - started - sum(stage_seconds.values())

        # 2. redirects, link counts, vocabulary, aliases; each link's entity id, for the passages
        links = count_links(table, settings.num_entities, settings.require_existing_pages)
        vocab = links.vocab
        job = _PassageJob(
            cache_files,
            *(str(work_dir / f"{name}.arrow") for name in ("links", "names", "anchors")),
            settings=settings,
            pretokenized=state.pretokenize,
        )
        _write_passage_inputs(work_dir, table, job, links)
        stage_done("vocab_and_aliases")

        # 3. tokenizer
        if tokenizer is None:
            logger.info("training a byte-level BPE tokenizer (vocab_size=%d) on the corpus text", settings.vocab_size)
            texts = (t for batch in table.select(["text"]).to_batches() for t in batch.column(0).to_pylist() if t)
            tokenizer = train_tokenizer(texts, vocab_size=settings.vocab_size)
            # the workers do not have it: a new pool of the same kind, which inherits it
            pools.close()
            pool = pools.enter_context(_worker_pool(workers, _worker_state(tokenizer, pretokenize=False)))
        stage_done("tokenizer")

        # 4. mentions and passages: ranges of pages to the workers, passages back in order. Meanwhile a thread of
        # this process (which only collects results) writes the vocabulary, alias table and tokenizer.
        passage_files = []  # in document order
        counts = _PassageCounts()
        passage_dir = work_dir / "passages"
        passage_dir.mkdir()
        tasks = [
            (job, *pages, str(passage_dir / f"{k:06d}.arrow"))
            for k, pages in enumerate(_page_ranges(table, _PASSAGE_TASK_CHARS))
        ]
        with ThreadPoolExecutor(1) as background:  # after any fork: a forked child gets no thread's locks
            write_vocabulary = partial(background.submit, _write_vocabulary_and_tokenizer, out_dir, links, tokenizer)
            vocabulary_written = None  # started once the first tasks are out (the pool sends them holding the GIL)
            for passage_file, summary in _ordered_map(pool, _passages_task, tasks, max_in_flight):
                vocabulary_written = vocabulary_written or write_vocabulary()
                passage_files.append(passage_file)
                counts.add(summary)
            if pool is not None:
                pool.close()  # its processes exit while this one splits and saves
            num_aliases = (vocabulary_written or write_vocabulary()).result()
        _PASSAGE_INPUTS.clear()  # this process's view of the page cache (when it made passages itself)
        stage_done("passages")

        # 5. stats, split, save
        if counts.passages == 0:
            raise ValueError(
                f"{', '.join(dump_paths)}: no passages ({len(table)} pages, {links.stats['articles']} articles); "
                "is this a pages-articles dump?"
            )
        stats = counts.stats(len(vocab))
        splits = _split(passage_files, counts.passages, settings.validation_fraction, settings.seed, work_dir)
        # an empty split is saved as one empty shard (with no shard, `datasets` cannot load it back)
        num_shards = {name: 1 if len(split) == 0 else None for name, split in splits.items()}
        splits.save_to_disk(str(out_dir / "passages"), num_proc=None, num_shards=num_shards)
    stage_done("split_and_save")
    stats.update(
        {
            "dump_files": dump_paths,
            "pages": len(table),
            **links.stats,
            "aliases": num_aliases,
            "train_passages": len(splits["train"]),
            "validation_passages": len(splits["validation"]),
            "tokenizer_size": len(tokenizer),
            "passage_length": settings.passage_length,
            "passage_overlap": settings.passage_overlap,
            "num_proc": num_proc,
            "stage_seconds": {name: round(seconds, 3) for name, seconds in stage_seconds.items()},
            "seconds": round(time.perf_counter() - started, 3),
        }
    )
    stats["link_coverage_by_vocab"] = round(stats["links_to_vocab_entities"] / max(1, stats["links_to_entities"]), 4)
    stats["articles_per_second"] = round(stats["articles"] / max(stats["seconds"], 1e-9), 2)
    with open(out_dir / STATS_NAME, "w", encoding="utf-8") as f:
        json.dump(stats, f, indent=2, ensure_ascii=False)
    return stats


def _write_vocabulary_and_tokenizer(out_dir: Path, links: EntityLinks, tokenizer: PreTrainedTokenizerBase) -> int:
    """`entity_vocab.json`, `aliases.json` and `tokenizer/`; returns the number of aliases."""
    num_aliases = write_vocabulary_files(out_dir, links)
    tokenizer.save_pretrained(out_dir / "tokenizer")
    return num_aliases


class _PassageCounts:
    """The passages' part of the stats report, counted batch by batch as the passages are written."""

    def __init__(self):
        self.passages = self.link_mentions = self.heuristic_mentions = self.labeled = 0
        self.seen: set[int] = set()

    @staticmethod
    def summary(batch: pa.RecordBatch) -> dict:
        """A batch's counts (made where the batch is made: only this small summary travels)."""
        labels = pc.unique(batch.column("entity_labels").flatten()).to_numpy()
        return {
            "passages": batch.num_rows,
            **{name: int(pc.sum(batch.column(name)).as_py() or 0) for name in _STATS_COLUMNS},
            "seen": labels[labels >= 0],
        }

    def add(self, summary: dict) -> None:
        self.passages += summary["passages"]
        self.link_mentions += summary["num_link_mentions"]
        self.heuristic_mentions += summary["num_heuristic_mentions"]
        self.labeled += summary["num_labeled_mentions"]
        self.seen.update(summary["seen"].tolist())

    def stats(self, vocab_size: int) -> dict:
        passages = max(1, self.passages)
        return {
            "passages": self.passages,
            "link_mentions": self.link_mentions,
            "heuristic_mentions": self.heuristic_mentions,
            "labeled_mentions": self.labeled,
            "mentions_per_passage": round((self.link_mentions + self.heuristic_mentions) / passages, 3),
            "labeled_mentions_per_passage": round(self.labeled / passages, 3),
            "entities_in_passages": len(self.seen),
            "entity_coverage": round(len(self.seen) / max(1, vocab_size), 4),
        }


def _split(
    passage_files: list[str], num_passages: int, validation_fraction: float, seed: int, work_dir: Path
) -> datasets.DatasetDict:
    """`validation_fraction` of the passages (at least one when positive), drawn with `seed`. The passages are
    read (each file removed once read) and the two splits written batch by batch, in the passages' order
    (training shuffles anyway), without the stats columns. Memory stays flat: splits made of views of the
    memory-mapped passages would save one copy, but every passage's pages would then count in the process's
    memory (resident file pages: 10% more peak memory on ten copies of the Wikipedia sample, growing with the corpus)."""
    num_validation = round(num_passages * validation_fraction)
    if validation_fraction > 0 and num_validation == 0 and num_passages >= 2:
        num_validation = 1
    in_validation = np.zeros(num_passages, dtype=bool)
    if num_validation:
        in_validation[np.random.default_rng(seed).choice(num_passages, size=num_validation, replace=False)] = True
    files = {name: str(work_dir / f"{name}.arrow") for name in ("train", "validation")}
    with (
        _arrow_file(files["train"], _SAVED_SCHEMA) as train,
        _arrow_file(files["validation"], _SAVED_SCHEMA) as validation,
    ):
        offset = 0
        for batch in _read_and_remove(passage_files):
            columns = [batch.column(name) for name in _SAVED_SCHEMA.names]
            batch = pa.RecordBatch.from_arrays(columns, schema=_SAVED_SCHEMA)
            chosen = in_validation[offset : offset + batch.num_rows]
            offset += batch.num_rows
            if not chosen.any():  # most batches: written as they are, no copy
                train.write_batch(batch)
                continue
            train.write_batch(batch.filter(pa.array(~chosen)))
            validation.write_batch(batch.filter(pa.array(chosen)))
    return datasets.DatasetDict({name: datasets.Dataset.from_file(path) for name, path in files.items()})


def _read_and_remove(paths: Iterable[str]) -> Iterator[pa.RecordBatch]:
    """The record batches of Arrow stream files, in order; each file is removed once read."""
    for path in paths:
        with pa.OSFile(path) as source:
            yield from pa.ipc.open_stream(source)
        os.remove(path)


def format_stats(stats: dict) -> str:
    keys = [
        "pages",
        "articles",
        "redirects",
        "malformed_pages",
        "links",
        "links_to_entities",
        "entity_vocab_size",
        "link_coverage_by_vocab",
        "aliases",
        "train_passages",
        "validation_passages",
        "link_mentions",
        "heuristic_mentions",
        "mentions_per_passage",
        "labeled_mentions_per_passage",
        "entity_coverage",
        "seconds",
        "articles_per_second",
    ]
    return "\n".join(f"  {key:<30} {stats[key]}" for key in keys if key in stats)


# --- command line --------------------------------------------------------------------------------------------------


@dataclass
class BuildCorpusArguments:
    """`edmem build-corpus`'s input and output; its other options are `CorpusSettings`."""

    dump: list[str] = field(metadata={"help": "MediaWiki pages-articles dump file(s), .xml or .xml.bz2."})
    out: str = field(metadata={"help": "Output directory."})
    tokenizer: str | None = field(
        default=None,
        metadata={"help": "Local tokenizer directory (markers are added if missing). Default: train one."},
    )


def cli_main(argv: list[str] | None = None) -> int:
    """`edmem build-corpus`."""
    parser = CommandArgumentParser(
        [BuildCorpusArguments, CorpusSettings],
        prog="edmem build-corpus",
        description="Build EDMem pre-training passages, the entity vocabulary and the alias table from a MediaWiki dump.",
        negations={"heuristic_labels": "Label the hyperlinked mentions only (no search for unlinked ones)."},
    )
    try:
        args, settings = parser.parse_args_into_dataclasses(args=sys.argv[1:] if argv is None else argv)
    except ValueError as err:  # CorpusSettings' checks
        parser.error(str(err))
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        stats = build_corpus(args.dump, args.out, tokenizer=args.tokenizer, **dataclasses.asdict(settings))
    except (ValueError, FileNotFoundError) as err:  # DumpFormatError and MalformedPageError are ValueErrors
        print(f"edmem build-corpus: error: {err}", file=sys.stderr)
        return 1
    print(f"corpus written to {args.out}\n{format_stats(stats)}")
    return 0


__all__ = ["BuildCorpusArguments", "CorpusSettings", "build_corpus", "cli_main", "format_stats"]

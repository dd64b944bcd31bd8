"""`edmem build-corpus`: a MediaWiki dump -> EDMem pre-training passages, entity vocabulary and alias table.

The build streams (paper, Appendix A; format in docs/design.md and docs/corpus.md):

1. parse: this process reads the dump (the only pass over the XML) and hands chunks of pages to `num_proc`
   forked workers; plain text + links (and, when a tokenizer is given, the text's tokens: `encode_words`) go,
   in dump order, to an Arrow cache file as pyarrow record batches;
2. count: redirects, inbound link counts, the top-N entity vocabulary and the alias table, read back from the
   cache column by column and counted in Arrow (memory grows with the number of titles and aliases, not with
   the text); each link's entity id, written to a file the workers memory-map;
3. label and window: ranges of articles go to the same workers, which add heuristic mentions, put
   `<E_s>`/`<E_e>` around every mention (`insert_mention_markers` into the tokens made while parsing, or
   `_PieceEncoder`: byte-level BPE with a word cache) and cut 128-token passages with a 10-token overlap;
4. split off 0.5% validation passages and save (`datasets.DatasetDict.save_to_disk`).

At most a few chunks per process are in flight at any time, so memory stays flat as the dump grows. Workers
hand their results over in files, not through the pool's pipe.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import multiprocessing
import os
import re
import shutil
import sys
import tempfile
import time
import weakref
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from itertools import chain
from pathlib import Path
from typing import NamedTuple

import ahocorasick
import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tokenizers.models import BPE
from transformers import HfArgumentParser, PreTrainedTokenizerBase

from .configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN
from .dump import MalformedPageError, WikiPage, iter_pages, parse_page
from .entity_vocab import EntityVocab
from .tokenization import DEFAULT_VOCAB_SIZE, extend_tokenizer, train_tokenizer

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100
NOT_AN_ARTICLE = -2  # link target that is neither an article nor a redirect to one (red link)
OUT_OF_VOCAB = -1  # an article outside the entity vocabulary
ALIASES_NAME = "aliases.json"
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
        # the text's tokens and, per token, where its word starts in the text (`_PieceEncoder.encode_words`),
        # made while parsing when a tokenizer is given; null otherwise (tokenised with the mentions instead)
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


# --- entity vocabulary and aliases ---------------------------------------------------------------------------


def resolve_redirect(title: str, redirects: dict[str, str], max_hops: int = 5) -> str:
    """Follows redirects (double redirects too) to the final title; stops on cycles."""
    seen = {title}
    for _ in range(max_hops):
        target = redirects.get(title)
        if target is None or target in seen:
            break
        seen.add(target)
        title = target
    return title


def _most_linked_first(counts: dict[str, int]) -> list[tuple[str, int]]:
    """`(key, count)` pairs, highest count first, ties by key (deterministic orders for every output file)."""
    if len(counts) < 2:
        return list(counts.items())
    return sorted(counts.items(), key=lambda x: (-x[1], x[0]))


def build_entity_vocab(
    link_counts: Counter[str] | dict[str, int],
    num_entities: int,
    aliases: dict[str, Counter[str]] | None = None,
) -> EntityVocab:
    """The `num_entities` most linked entities (ties broken by name, so the result is deterministic).

    Entities without any inbound link are never included: the memory could not learn them.
    """
    if num_entities <= 0:
        raise ValueError(f"num_entities must be positive, got {num_entities}")
    ranked = sorted((-count, name) for name, count in link_counts.items() if count > 0)[:num_entities]
    names = [name for _, name in ranked]
    alias_lists = None
    if aliases is not None:
        alias_lists = [[a for a, _ in _most_linked_first(aliases.get(name, {}))] for name in names]
    return EntityVocab(names, alias_lists, [-negative_count for negative_count, _ in ranked])


class _EntityAnchors:
    """Each vocabulary entity's anchors, most linked first (ties by text), in one flat list: entity `e`'s are at
    `starts[e]:starts[e + 1]` (a list per entity would cost more to make than to use)."""

    def __init__(self, anchor_table: pa.Table, num_entities: int):
        """From `_EntityLinks.anchor_table` (entity_id, anchor, count; in that order already)."""
        self.anchors = anchor_table.column("anchor").to_pylist()
        entity_ids = anchor_table.column("entity_id").to_numpy()
        self.starts = np.searchsorted(entity_ids, np.arange(num_entities + 1)).tolist()

    def ranked(self, entity_id: int) -> list[str]:
        return self.anchors[self.starts[entity_id] : self.starts[entity_id + 1]]


class _EntityLinks(NamedTuple):
    """The entity vocabulary and what the passages need of the links (`_count_links`)."""

    vocab: EntityVocab
    names: pa.Array  # the vocabulary's names, as Arrow strings
    targets: pa.Array  # the distinct link targets (before redirects)
    target_ids: pa.Array  # int32, per target: its vocabulary id, OUT_OF_VOCAB, or NOT_AN_ARTICLE (a red link)
    anchor_table: pa.Table  # the vocabulary entities' anchors: entity_id, anchor, count; by id, most linked first
    stats: dict


def _count_links(table: pa.Table, num_entities: int, require_existing_pages: bool) -> _EntityLinks:
    """Redirects, inbound link counts, the `num_entities` most linked entities (ranked as `build_entity_vocab`
    ranks them) and their anchors, from the parsed pages. The links are grouped and counted in Arrow, by
    (anchor, target before redirects): Python sees each distinct target once, to resolve its redirects."""
    articles: set[str] = set()
    redirects: dict[str, str] = {}
    malformed = 0
    for batch in _iter_arrow_batches(table, ["title", "status", "redirect"]):
        for title, status, redirect in zip(batch["title"], batch["status"], batch["redirect"]):
            if status == "article":
                articles.add(title)
            elif status == "redirect":
                redirects[title] = redirect
            else:
                malformed += 1
    pairs = (
        pa.table(
            {
                "anchor": pc.list_flatten(table.column("link_anchors")),
                "target": pc.list_flatten(table.column("link_targets")),
            }
        )
        .group_by(["anchor", "target"], use_threads=False)
        .aggregate([([], "count_all")])
    )
    counts = pairs.column("count_all")
    targets = pc.unique(pairs.column("target"))
    target_names = targets.to_pylist()
    entities: list[str | None] = []  # per distinct target: the entity it names, None for a red link
    for target in target_names:
        final = resolve_redirect(target, redirects) if target in redirects else target
        entities.append(final if final in articles or not require_existing_pages else None)
    entities_array = pa.array(entities, pa.string())
    pair_target = pc.index_in(pairs.column("target"), value_set=targets)
    pair_entity = entities_array.take(pair_target)
    to_entities = pa.table({"entity": pair_entity, "count": counts}).filter(pc.is_valid(pair_entity))
    per_entity = to_entities.group_by("entity", use_threads=False).aggregate([("count", "sum")])
    # build_entity_vocab's ranking: most links first, ties by name (Arrow orders strings by their UTF-8 bytes,
    # which is Python's order of code points)
    ranked = per_entity.take(
        pc.sort_indices(per_entity, sort_keys=[("count_sum", "descending"), ("entity", "ascending")])[:num_entities]
    )
    vocab = EntityVocab(ranked.column("entity").to_pylist(), None, ranked.column("count_sum").to_pylist())
    target_ids = pc.index_in(entities_array, value_set=ranked.column("entity"))  # null: red link or outside
    target_codes = pc.if_else(
        pc.is_valid(entities_array), pc.fill_null(target_ids, OUT_OF_VOCAB), pa.scalar(NOT_AN_ARTICLE, pa.int32())
    )
    # anchors of the vocabulary entities: (entity id, anchor) groups, in id order, each entity's most linked first
    pair_ids = target_ids.take(pair_target)
    anchors = (
        pa.table({"entity_id": pair_ids, "anchor": pairs.column("anchor"), "count": counts})
        .filter(pc.is_valid(pair_ids))
        .group_by(["entity_id", "anchor"], use_threads=False)
        .aggregate([("count", "sum")])
        .sort_by([("entity_id", "ascending"), ("count_sum", "descending"), ("anchor", "ascending")])
        .select(["entity_id", "anchor", "count_sum"])
        .rename_columns(["entity_id", "anchor", "count"])
    )
    stats = {
        "articles": len(articles),
        "redirects": len(redirects),
        "malformed_pages": malformed,
        "links": int(pc.sum(counts).as_py() or 0),
        "links_to_entities": int(pc.sum(to_entities.column("count")).as_py() or 0),
        "links_to_vocab_entities": sum(vocab.counts),
        "entities_linked": per_entity.num_rows,
        "entity_vocab_size": len(vocab),
    }
    return _EntityLinks(vocab, _one_array(ranked.column("entity")), targets, target_codes, anchors, stats)


def _save_alias_counts(counts: dict[str, dict[str, int]], path: str | os.PathLike) -> None:
    """`aliases.json`: aliases in order, each one's entities the most linked first (ties by name)."""
    _write_json({alias: dict(_most_linked_first(entities)) for alias, entities in sorted(counts.items())}, path)


def _write_json(data, path: str | os.PathLike) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(data, ensure_ascii=False))  # json.dump would use the slow pure-Python encoder


class AliasTable:
    """Anchor text -> entity name -> number of links with that anchor (the paper's alias table T)."""

    def __init__(self, counts: dict[str, dict[str, int]] | None = None):
        self.counts: dict[str, Counter[str]] = defaultdict(Counter)
        for alias, entities in (counts or {}).items():
            self.counts[alias].update(entities)

    def add(self, alias: str, entity: str, count: int = 1) -> None:
        self.counts[alias][entity] += count

    def __len__(self) -> int:
        return len(self.counts)

    def entities(self, alias: str) -> Counter[str]:
        return self.counts.get(alias, Counter())

    def save(self, path: str | os.PathLike) -> str:
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, ALIASES_NAME)
        _save_alias_counts(self.counts, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> AliasTable:
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, ALIASES_NAME)
        with open(path, encoding="utf-8") as f:
            return cls(json.load(f))


_PARENTHETICAL = re.compile(r"\s*\([^()]*\)$")
_ASCII_UPPER_OR_DIGIT = re.compile("[A-Z0-9]")


def _has_upper_or_digit(text: str) -> bool:
    if text.isascii():
        return _ASCII_UPPER_OR_DIGIT.search(text) is not None
    return any(c.isupper() or c.isdigit() for c in text)


def heuristic_aliases(
    name: str, anchors: Counter[str] | dict[str, int], max_aliases: int = 10, min_count: int = 1
) -> list[str]:
    """The strings searched for unlinked mentions of an entity: its name, the name without a trailing
    "(disambiguation)"-style qualifier, and its `max_aliases` most frequent anchors seen `min_count`+ times.

    Anchors shorter than 2 characters or without any upper-case letter or digit ("here", "his") are left out:
    such words are mostly not mentions of the page's entities.
    """
    ranked = _most_linked_first(anchors)[:max_aliases]
    return _searched_aliases(name, [anchor for anchor, count in ranked if count >= min_count])


def _searched_aliases(name: str, anchors: Iterable[str]) -> list[str]:
    """`heuristic_aliases` from the anchors already ranked, cut and counted."""
    result = [name]
    short = _PARENTHETICAL.sub("", name) if name.endswith(")") else name
    if short and short != name:
        result.append(short)
    for anchor in anchors:
        if len(anchor) < 2 or anchor in result or not _has_upper_or_digit(anchor):
            continue
        result.append(anchor)
    return result


# --- mentions -------------------------------------------------------------------------------------------------


class Mention(NamedTuple):
    """A mention span; a tuple, so that mentions sort (by start, end, entity id, heuristic) and are made fast."""

    start: int  # character offsets into the plain text
    end: int
    entity_id: int  # entity vocabulary id, or -100 for a mention of an entity outside the vocabulary
    heuristic: bool = False


def _is_word_char(char: str) -> bool:
    return char.isalnum() or char == "_"


def label_mentions(
    text: str,
    links: Sequence[tuple[int, int, int]],
    candidate_aliases: dict[int, Sequence[str]],
) -> list[Mention]:
    """Hyperlink mentions plus heuristic mentions of `candidate_aliases` (entity id -> aliases).

    `links` are `(start, end, entity_id)` spans (entity_id -100 outside the vocabulary). Heuristic matches are
    whole words only, never overlap a link, and the leftmost-longest match wins; when several candidates share
    an alias the lowest entity id (the most linked entity) wins. The caller passes the entities linked in the
    page and the page's own entity (paper, Appendix A).
    """
    mentions = [Mention(s, e, eid) for s, e, eid in links]
    if not candidate_aliases or not text:
        return sorted(mentions)
    automaton = ahocorasick.Automaton()
    for entity_id in sorted(candidate_aliases, reverse=True):  # add_word replaces: the lowest id is added last
        for alias in candidate_aliases[entity_id]:
            if alias:
                automaton.add_word(alias, (len(alias), entity_id, _is_word_char(alias[0]), _is_word_char(alias[-1])))
    if len(automaton) == 0:
        return sorted(mentions)
    automaton.make_automaton()
    # Covered characters: links first, then heuristic matches as they are accepted.
    covered = bytearray(len(text))
    for s, e, _ in links:
        covered[s:e] = b"\x01" * (e - s)
    matches = []
    text_end = len(text)
    for end_index, (length, entity_id, starts_in_word, ends_in_word) in automaton.iter(text):
        start, end = end_index - length + 1, end_index + 1
        if starts_in_word and start > 0 and _is_word_char(text[start - 1]):
            continue
        if ends_in_word and end < text_end and _is_word_char(text[end]):
            continue
        matches.append((start, -length, entity_id))
    matches.sort()
    for start, negative_length, entity_id in matches:
        end = start - negative_length
        if any(covered[start:end]):
            continue
        covered[start:end] = b"\x01" * (end - start)
        mentions.append(Mention(start, end, entity_id, True))
    return sorted(mentions)


# --- passages -------------------------------------------------------------------------------------------------


@dataclass
class PassageSettings:
    passage_length: int = 128  # tokens, with <s> and </s>
    passage_overlap: int = 10

    def __post_init__(self):
        if self.passage_length < 8:
            raise ValueError(f"passage_length={self.passage_length} is too short (at least 8)")
        if not 0 <= self.passage_overlap < self.passage_length - 2:
            raise ValueError(f"passage_overlap={self.passage_overlap} must be in [0, passage_length - 2)")


def tokenize_with_mentions(
    text: str, mentions: Sequence[Mention], tokenizer: PreTrainedTokenizerBase
) -> tuple[list[int], list[int], list[tuple[int, int, bool]]]:
    """Token ids of `text` with `<E_s>`/`<E_e>` around each mention (no `<s>`/`</s>`).

    Returns ids, entity labels (the entity id at each `<E_s>`, -100 elsewhere) and the token positions
    `(e_s, e_e, heuristic)` of each mention. The space before a mention is tokenised with the mention
    (`" Paris"` -> `ĠParis`), as in running text.
    """
    return _tokenize_documents([(text, mentions)], tokenizer)[0]


# GPT-2's pre-tokenisation pattern, as the `tokenizers` ByteLevel pre-tokenizer applies it (use_regex=True).
_BYTE_LEVEL_WORDS = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# The same on ASCII text, for `re` (twice as fast as `regex` there): letters, digits and Unicode White_Space
# spelled out (`re`'s `\s` also matches \x1c-\x1f, which are not White_Space).
_ASCII_SPACE = r"\t\n\x0b\x0c\r "
_ASCII_BYTE_LEVEL_WORDS = (
    rf"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^{_ASCII_SPACE}A-Za-z0-9]+"""
    rf"""|[{_ASCII_SPACE}]+(?![^{_ASCII_SPACE}])|[{_ASCII_SPACE}]+"""
)


# A newline between two non-space characters (`re`'s `\s` is a superset of the pattern's: never a wrong split).
# Spelled newline first, so that `re` scans for the newline instead of trying the look-behind at every character
# (15 times faster).
_LONE_NEWLINE = re.compile(r"\n(?<=\S\n)(?=\S)")


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (`tokenizers`' ByteLevel alphabet), keyed by Latin-1 code point."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1), *range(ord("\u00ae"), 256)]
    shifted = 0
    table = {}
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + shifted)
            shifted += 1
    return table


_BYTE_TO_UNICODE = _byte_to_unicode()


def _word_ids(tokenize: Callable, word: str) -> list[int]:
    """BPE straight on a pre-tokenised word's byte-level form (what the ByteLevel pre-tokenizer hands the model)."""
    return [token.id for token in tokenize(word.encode().decode("latin-1").translate(_BYTE_TO_UNICODE))]


class _WordIds(dict):
    """Pre-tokenised word -> its token ids: a dict (looked up in C) that runs the BPE model on a word it misses."""

    def __init__(self, model):
        super().__init__()
        self.tokenize = model.tokenize

    def __missing__(self, word: str) -> list[int]:
        ids = self[word] = _word_ids(self.tokenize, word)
        return ids


class _WordTable(dict):
    """Pre-tokenised word -> its row in flat arrays (its token ids, their count, its length in characters), so that
    a text's ids are gathered with numpy instead of joined as Python lists. A missed word goes through the BPE
    model; new rows wait in Python lists until `arrays()` writes them into the arrays (a numpy write per word
    would cost more than the lookup)."""

    def __init__(self, model):
        super().__init__()
        self.tokenize = model.tokenize
        self.clear()

    def clear(self) -> None:
        super().clear()
        self.flat = np.zeros(1 << 16, dtype=np.int32)  # every row's token ids, one after another
        self.rows = np.zeros((1 << 14, 3), dtype=np.int64)  # per row: where its ids start in `flat`, how many, chars
        self.written = self.size = 0  # rows and ids in the arrays
        self.new_ids: list[int] = []
        self.new_rows: list[tuple[int, int, int]] = []

    def __missing__(self, word: str) -> int:
        ids = _word_ids(self.tokenize, word)
        self.new_rows.append((self.size + len(self.new_ids), len(ids), len(word)))
        self.new_ids += ids
        row = self[word] = len(self)
        return row

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """`flat` and `rows`, with every row looked up so far."""
        if self.new_rows:
            rows, size = self.written + len(self.new_rows), self.size + len(self.new_ids)
            if rows > len(self.rows):
                self.rows = np.resize(self.rows, (max(2 * len(self.rows), rows), 3))
            if size > len(self.flat):
                self.flat = np.resize(self.flat, max(2 * len(self.flat), size))
            self.rows[self.written : rows] = self.new_rows
            self.flat[self.size : size] = self.new_ids
            self.written, self.size = rows, size
            self.new_rows, self.new_ids = [], []
        return self.flat, self.rows


class _PieceEncoder:
    """Token ids of text pieces, the same as `backend_tokenizer.encode_batch(pieces, add_special_tokens=False)`
    but several times faster for byte-level BPE tokenizers.

    The Rust ByteLevel pre-tokenizer (with its offset bookkeeping) is most of `encode_batch`'s time. A byte-level
    BPE encodes each pre-tokenised word independently, so the words are split here with the same pattern
    (`regex`) and each distinct word is encoded once (by the Rust BPE model) and cached. Pieces holding the
    text of an added token (`<mask>`, `<s>`, ...) and tokenizers of any other kind go to `encode_batch`
    unchanged.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, max_cache_words: int = 300_000):
        self.backend = tokenizer.backend_tokenizer
        self.max_cache_words = max_cache_words
        self.cache = _WordIds(self.backend.model)
        self.table = _WordTable(self.backend.model)
        self.mention_ids: dict[str, list[int]] = {}
        self.words = None
        self.added = None
        try:
            import regex
        except ImportError:  # a dependency of transformers; without it, every piece goes to encode_batch
            return
        # what the words' ids depend on, read from the parts (not the whole tokenizer's JSON: vocabulary and merges)
        pre_tokenizer = self.backend.pre_tokenizer
        pre = json.loads(pre_tokenizer.__getstate__()) if pre_tokenizer is not None else {}
        model = self.backend.model
        if (
            self.backend.normalizer is not None
            or pre.get("type") != "ByteLevel"
            or pre.get("add_prefix_space")
            or not pre.get("use_regex", True)
            or not isinstance(model, BPE)
            or model.dropout
        ):
            return
        self.words = regex.compile(_BYTE_LEVEL_WORDS)
        self.ascii_words = re.compile(_ASCII_BYTE_LEVEL_WORDS)
        contents = sorted(
            {token.content for token in self.backend.get_added_tokens_decoder().values() if token.content}
        )
        self.added = re.compile("|".join(map(re.escape, contents))) if contents else None

    def _bound_caches(self) -> None:
        """Bounded (a few hundred bytes an entry): memory stays flat on a whole dump."""
        for cache in (self.cache, self.table, self.mention_ids):
            if len(cache) > self.max_cache_words:
                cache.clear()

    def _split_words(self, text: str, begin: int = 0, end: int | None = None) -> list[str]:
        """The words of `text[begin:end]`: `re` with the ASCII pattern on ASCII lines, else `regex`. A text is
        split into lines only at a newline between two non-space characters: there the newline is a word of its
        own and the words on either side do not depend on the other side."""
        piece = text[begin:end]
        if piece.isascii():
            return self.ascii_words.findall(piece)
        if "\n" not in piece:
            return self.words.findall(piece)
        words: list[str] = []
        for index, line in enumerate(_LONE_NEWLINE.split(piece)):
            if index:
                words.append("\n")
            words += self.ascii_words.findall(line) if line.isascii() else self.words.findall(line)
        return words

    def encode_marked(self, documents, start_id: int, end_id: int) -> list[tuple | None]:
        """Per document `(text, mentions)`: `(ids, labels, spans)` as `tokenize_with_mentions` returns them, or
        None where the fast path does not apply (a text holding an added token's text, mentions out of order):
        those are left to `_tokenize_pieces`.

        The text is cut into the same pieces as `_tokenize_pieces` cuts it (a mention's piece starts at the space
        before it), each piece is split into words where it lies (`findall(text, begin, end)`, no copy) and the
        words' cached ids are spliced together, markers in between."""
        if self.words is None:
            return [None] * len(documents)
        self._bound_caches()
        lookup = self.cache.__getitem__
        split_words = self._split_words
        join = chain.from_iterable
        mention_ids = self.mention_ids  # a mention's piece -> its ids: mentions repeat across pages
        results: list[tuple | None] = []
        for text, mentions in documents:
            if self.added is not None and self.added.search(text):
                results.append(None)
                continue
            # an ASCII text is split where each piece lies, without copying it (findall with pos/endpos)
            findall = self.ascii_words.findall if text.isascii() else split_words
            ids: list[int] = []
            spans: list[tuple[int, int, bool]] = []
            marks: list[tuple[int, int]] = []
            position = 0
            for start, end, entity_id, heuristic in mentions:
                if start < position:
                    ids = None
                    break
                if start > position and text[start - 1] == " ":
                    start -= 1
                if start > position:
                    ids += join(map(lookup, findall(text, position, start)))
                e_s = len(ids)
                ids.append(start_id)
                piece = text[start:end]
                piece_ids = mention_ids.get(piece)
                if piece_ids is None:
                    piece_ids = mention_ids[piece] = list(join(map(lookup, split_words(piece))))
                ids += piece_ids
                if entity_id >= 0:
                    marks.append((e_s, entity_id))
                spans.append((e_s, len(ids), heuristic))
                ids.append(end_id)
                position = end
            if ids is None:
                results.append(None)
                continue
            if position < len(text):
                ids += join(map(lookup, findall(text, position, len(text))))
            labels = [IGNORE_INDEX] * len(ids)
            for e_s, entity_id in marks:
                labels[e_s] = entity_id
            results.append((ids, labels, spans))
        return results

    def encode_words(self, text: str) -> tuple[np.ndarray, np.ndarray] | None:
        """Token ids of a whole text and, for each token, the character offset where its word starts (both int32);
        None where the fast path does not apply (the text holds an added token's text, or the tokenizer is not
        a byte-level BPE). `insert_mention_markers` later marks mentions at word starts, without tokenising
        again."""
        if self.words is None or (self.added is not None and self.added.search(text)):
            return None
        self._bound_caches()
        words = self._split_words(text)
        table = self.table
        rows = np.fromiter(map(table.__getitem__, words), dtype=np.int64, count=len(words))
        flat, row_data = table.arrays()
        offsets, lengths, chars = row_data[rows].T
        ends = np.cumsum(lengths)
        # token k of word w is flat[offsets[w] + k]: one arange, shifted per word
        gather = np.arange(int(ends[-1]) if len(ends) else 0) + np.repeat(offsets - ends + lengths, lengths)
        return flat[gather], np.repeat(np.cumsum(chars) - chars, lengths).astype(np.int32)

    def piece_ids(self, piece: str) -> list[int]:
        """Token ids of a piece of a text `encode_words` took (so: no added token's text in it)."""
        return list(chain.from_iterable(map(self.cache.__getitem__, self._split_words(piece))))

    def encode(self, pieces: Sequence[str]) -> list[list[int]]:
        if self.words is None:
            return [encoding.ids for encoding in self.backend.encode_batch(list(pieces), add_special_tokens=False)]
        self._bound_caches()
        lookup = self.cache.__getitem__
        added = self.added.search if self.added is not None else lambda piece: None
        results = [
            None if added(piece) else list(chain.from_iterable(map(lookup, self._split_words(piece))))
            for piece in pieces
        ]
        fallback = [i for i, ids in enumerate(results) if ids is None]
        if fallback:
            encodings = self.backend.encode_batch([pieces[i] for i in fallback], add_special_tokens=False)
            for index, encoding in zip(fallback, encodings):
                results[index] = encoding.ids
        return results


_ENCODERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _piece_encoder(tokenizer: PreTrainedTokenizerBase) -> _PieceEncoder:
    encoder = _ENCODERS.get(tokenizer)
    if encoder is None:
        encoder = _ENCODERS[tokenizer] = _PieceEncoder(tokenizer)
    return encoder


def _tokenize_documents(documents, tokenizer):
    start_id = tokenizer.convert_tokens_to_ids(ENTITY_START_TOKEN)
    end_id = tokenizer.convert_tokens_to_ids(ENTITY_END_TOKEN)
    results = _piece_encoder(tokenizer).encode_marked(documents, start_id, end_id)
    left = [index for index, result in enumerate(results) if result is None]
    if left:
        for index, result in zip(left, _tokenize_pieces([documents[i] for i in left], tokenizer, start_id, end_id)):
            results[index] = result
    return results


def _tokenize_pieces(documents, tokenizer, start_id, end_id):
    pieces: list[str] = []
    layout: list[list[tuple[int, Mention | None]]] = []  # per document: (piece index, mention or None)
    for text, mentions in documents:
        doc_layout = []
        position = 0
        for mention in mentions:
            start = mention.start
            if start > position and text[start - 1] == " ":
                start -= 1
            if start > position:
                doc_layout.append((len(pieces), None))
                pieces.append(text[position:start])
            doc_layout.append((len(pieces), mention))
            pieces.append(text[start : mention.end])
            position = mention.end
        if position < len(text):
            doc_layout.append((len(pieces), None))
            pieces.append(text[position:])
        layout.append(doc_layout)
    encodings = _piece_encoder(tokenizer).encode(pieces) if pieces else []
    results = []
    for doc_layout in layout:
        ids: list[int] = []
        marks: list[tuple[int, int]] = []
        spans: list[tuple[int, int, bool]] = []
        for piece_index, mention in doc_layout:
            if mention is None:
                ids += encodings[piece_index]
            else:
                e_s = len(ids)
                if mention.entity_id >= 0:
                    marks.append((e_s, mention.entity_id))
                ids.append(start_id)
                ids += encodings[piece_index]
                spans.append((e_s, len(ids), mention.heuristic))
                ids.append(end_id)
        labels = [IGNORE_INDEX] * len(ids)
        for e_s, entity_id in marks:
            labels[e_s] = entity_id
        results.append((ids, labels, spans))
    return results


def insert_mention_markers(
    text: str,
    ids: np.ndarray,
    token_starts: np.ndarray,
    mentions: Sequence[Mention],
    start_id: int,
    end_id: int,
    encode_piece: Callable[[str], list[int]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """`tokenize_with_mentions` as arrays (`_document_arrays`), from the whole text's tokens
    (`_PieceEncoder.encode_words`: ids and the character offset of each token's word), tokenising again only
    where the result would differ; None for overlapping or unsorted mentions.

    The reference cuts the text into pieces (a mention's piece starts at the space before it) and tokenises each
    piece alone. A piece gets the whole text's words exactly when both its ends are word starts of the whole
    text and it does not end in two or more whitespace characters (alone, such a piece keeps its trailing
    whitespace as one word; within the text the last character is a word of its own). Other pieces, such as a
    mention "D.C." followed by a comma (the whole text has the word ".,"), go to `encode_piece`.
    """
    cuts = []
    position = 0
    for start, end, _, _ in mentions:
        if start < position:
            return None
        if start > position and text[start - 1] == " ":
            start -= 1
        cuts.append(start)
        cuts.append(end)
        position = end
    if not cuts:
        return _document_arrays(ids, None, ())
    text_end = len(text)
    cuts_array = np.array(cuts, dtype=np.int64)
    at = np.searchsorted(token_starts, cuts_array)
    aligned = cuts_array == text_end  # past the last word: only the end of the text
    if len(token_starts):
        aligned |= (at < len(token_starts)) & (token_starts[np.minimum(at, len(token_starts) - 1)] == cuts_array)
    ends_in_spaces = [2 <= cut < text_end and text[cut - 1].isspace() and text[cut - 2].isspace() for cut in cuts]
    if aligned.all() and not any(ends_in_spaces):  # one vectorised insertion
        marked = np.insert(ids, at, np.tile(np.array([start_id, end_id], dtype=ids.dtype), len(mentions)))
        positions = at + np.arange(len(at))  # of the markers in `marked`
    else:  # piece by piece, the whole text's tokens where a piece's ends allow
        words = ids.tolist()
        token_at, is_aligned = at.tolist(), aligned.tolist()
        marked, positions = [], []
        previous = 0  # the cut that ends the previous piece (the text's start: aligned, index 0)
        previous_aligned, previous_at = True, 0
        for index, cut in enumerate(cuts + [text_end]):
            last = index == len(cuts)
            cut_aligned = True if last else is_aligned[index]
            cut_at = len(words) if last else token_at[index]
            if cut > previous or index % 2 == 1:  # a gap before a mention may be empty, a mention not
                if previous_aligned and cut_aligned and (last or not ends_in_spaces[index]):
                    marked += words[previous_at:cut_at]
                else:
                    marked += encode_piece(text[previous:cut])
            if not last:
                positions.append(len(marked))
                marked.append(start_id if index % 2 == 0 else end_id)
            previous, previous_aligned, previous_at = cut, cut_aligned, cut_at
    positions = np.asarray(positions, dtype=np.int64)
    spans = np.empty((len(mentions), 3), dtype=np.int64)  # <E_s>, <E_e> positions, heuristic
    spans[:, 0], spans[:, 1] = positions[0::2], positions[1::2]
    spans[:, 2] = [mention.heuristic for mention in mentions]
    labels = np.full(len(marked), IGNORE_INDEX, dtype=np.int64)
    entity_ids = np.array([mention.entity_id for mention in mentions], dtype=np.int64)
    labelled = entity_ids >= 0
    labels[spans[labelled, 0]] = entity_ids[labelled]
    return np.asarray(marked, dtype=np.int32), labels, spans


def _document_arrays(ids, labels, spans) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A tokenised document as arrays: ids (int32), entity labels (int64; None: no label), spans (int64,
    `(mentions, 3)`: the `<E_s>` and `<E_e>` positions and whether the mention is heuristic)."""
    ids = np.asarray(ids, dtype=np.int32)
    labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int64) if labels is None else np.asarray(labels, dtype=np.int64)
    return ids, labels, np.array(spans, dtype=np.int64).reshape(-1, 3)


class _Windows(NamedTuple):
    """Passages as flat arrays, the parts of their Arrow columns."""

    ids: np.ndarray  # int32: every passage's tokens, one passage after another
    labels: np.ndarray  # int64, aligned with `ids`
    lengths: np.ndarray  # int64: tokens per passage
    passage_index: np.ndarray  # int32: position of each passage in its document
    counts: np.ndarray  # int32, (passages, 3): link mentions, heuristic mentions, labelled mentions


def window_passages(
    ids: Sequence[int],
    labels: Sequence[int],
    spans: Sequence[tuple[int, int, bool]],
    settings: PassageSettings,
    bos_token_id: int,
    eos_token_id: int,
) -> list[dict]:
    """Cuts one document's tokens into passages of `passage_length` tokens (with `<s>`/`</s>`).

    Consecutive windows share `passage_overlap` tokens. The last window is topped up with tokens from the
    start of the same document (a document shorter than one window gives one shorter passage). A mention
    that a window boundary cuts keeps its words but loses its markers in that window, so such a passage is
    one or two tokens shorter. `spans` are the mentions' `(<E_s> position, <E_e> position, heuristic)`.
    """
    windows = _window_arrays(*_document_arrays(ids, labels, spans), settings, bos_token_id, eos_token_id)
    ends = np.cumsum(windows.lengths).tolist()
    out_ids, out_labels = windows.ids.tolist(), windows.labels.tolist()
    return [
        {
            "input_ids": out_ids[end - length : end],
            "entity_labels": out_labels[end - length : end],
            "passage_index": index,
            "num_link_mentions": counts[0],
            "num_heuristic_mentions": counts[1],
            "num_labeled_mentions": counts[2],
        }
        for index, (end, length, counts) in enumerate(zip(ends, windows.lengths.tolist(), windows.counts.tolist()))
    ]


def _window_arrays(
    ids: np.ndarray,
    labels: np.ndarray,
    spans: np.ndarray,
    settings: PassageSettings,
    bos_token_id: int,
    eos_token_id: int,
) -> _Windows:
    """`window_passages` on arrays (`_document_arrays`), all windows at once: a `(windows, width)` grid of
    token positions, and a mask that drops the markers of mentions the window does not hold whole."""
    content = settings.passage_length - 2
    stride = content - settings.passage_overlap
    n = len(ids)
    if n == 0:
        return _Windows(np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int32),
                        np.zeros((0, 3), np.int32))  # fmt: skip
    width = min(content, n)
    num_windows = 1 if n <= content else 1 - (-(n - content) // stride)  # the last one reaches the end
    starts = np.arange(num_windows, dtype=np.int64)[:, None] * stride
    grid = starts + np.arange(width)
    wrapped = grid >= n  # the last window's top-up from the document's start
    positions = grid - n * wrapped
    window_ids = np.empty((num_windows, width + 2), dtype=np.int32)
    window_ids[:, 0], window_ids[:, -1] = bos_token_id, eos_token_id
    window_ids[:, 1:-1] = ids[positions]
    window_labels = np.full((num_windows, width + 2), IGNORE_INDEX, dtype=np.int64)
    window_labels[:, 1:-1] = labels[positions]
    counts = np.zeros((num_windows, 3), dtype=np.int32)
    lengths = np.full(num_windows, width + 2, dtype=np.int64)
    out_ids, out_labels = window_ids.ravel(), window_labels.ravel()
    if len(spans):
        # A marker stays where the window's range that holds it (the top-up is a range of its own) also holds
        # its partner: the mention is whole there.
        partner = np.full(n, -1, dtype=np.int64)
        partner[spans[:, 0]], partner[spans[:, 1]] = spans[:, 1], spans[:, 0]
        other = partner[positions]
        low = np.where(wrapped, 0, starts)
        high = np.where(wrapped, starts + content - n, np.minimum(starts + content, n))
        keep = (other < 0) | ((other >= low) & (other < high))
        kind = np.zeros(n, dtype=np.int8)  # at each <E_s>: 1 link, 2 heuristic mention
        kind[spans[:, 0]] = 1 + (spans[:, 2] != 0)
        whole = np.where(keep, kind[positions], 0)
        counts[:, 0] = (whole == 1).sum(axis=1)
        counts[:, 1] = (whole == 2).sum(axis=1)
        counts[:, 2] = ((whole > 0) & (window_labels[:, 1:-1] != IGNORE_INDEX)).sum(axis=1)
        if not keep.all():
            mask = np.ones((num_windows, width + 2), dtype=bool)
            mask[:, 1:-1] = keep
            lengths = mask.sum(axis=1)
            out_ids, out_labels = window_ids[mask], window_labels[mask]
    return _Windows(out_ids, out_labels, lengths, np.arange(num_windows, dtype=np.int32), counts)


def build_passages(
    text: str,
    mentions: Sequence[Mention],
    tokenizer: PreTrainedTokenizerBase,
    settings: PassageSettings | None = None,
) -> list[dict]:
    """Passages (dicts with `input_ids`, `entity_labels`, `passage_index`, ...) of one document."""
    settings = settings or PassageSettings()
    ids, labels, spans = tokenize_with_mentions(text, mentions, tokenizer)
    return window_passages(ids, labels, spans, settings, tokenizer.bos_token_id, tokenizer.eos_token_id)


# --- the build ------------------------------------------------------------------------------------------------


# Pages go from the reader to the parsing processes in chunks of about this many characters of wikitext.
_PARSE_CHUNK_CHARS = 256_000
_PARSE_CHUNK_PAGES = 64
_PASSAGE_TASK_CHARS = 256_000  # pages go to the passaging processes in ranges of about this much plain text
_IN_FLIGHT_PER_PROCESS = 4  # chunks queued per process: enough to keep them busy, memory stays flat


def _parsed_row(page: WikiPage, path: str, strict: bool) -> dict:
    try:
        parsed = parse_page(page)
    except MalformedPageError as err:
        if strict:
            raise MalformedPageError(f"{path}: {err} (--strict stops at the first malformed page)") from None
        logger.warning("skipping malformed page in %s: %s", path, err)
        return {"page_id": page.page_id, "title": page.title or "", "status": "malformed", "redirect": None,
                "text": "", "link_starts": [], "link_ends": [], "link_targets": [], "link_anchors": []}  # fmt: skip
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


_TOKEN_COLUMNS = ["token_ids", "token_starts"]


def _parse_chunk(pages: list[WikiPage], path: str, strict: bool) -> pa.RecordBatch:
    """Parsed pages (PAGE_FEATURES), in the order given; articles also tokenised when the worker state has a
    `word_encoder` (`_word_encoder`: the text's words do not depend on the entity vocabulary, only the markers
    do)."""
    columns: dict[str, list] = {name: [] for name in PAGE_FEATURES if name not in _TOKEN_COLUMNS}
    encoder = _WORKER_STATE.get("word_encoder")
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


@contextlib.contextmanager
def _arrow_file(path: str, schema: pa.Schema):
    """An Arrow stream file (what `datasets.Dataset.from_file` reads), written batch by batch. Batches are built
    with pyarrow straight from Python lists (datasets' `ArrowWriter` casts them again, in Python: slower)."""
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        yield writer


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


# State of the passage workers: set by the pool initializer (inherited without pickling when forked).
_WORKER_STATE: dict = {}


def _set_worker_state(state: dict) -> None:
    _WORKER_STATE.clear()
    _WORKER_STATE.update(state)


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
    anchor_file: str  # each entity's anchors, most linked first (`_EntityLinks.anchor_table`)
    settings: PassageSettings
    heuristics: bool
    pretokenized: bool  # the articles' words were made while parsing
    max_aliases: int


def _write_passage_inputs(work_dir: Path, table: pa.Table, page_files: list[str], links: _EntityLinks,
                          **options) -> _PassageJob:  # fmt: skip
    """The passage tasks' files: per page, each link's entity id (a vocabulary id, OUT_OF_VOCAB or NOT_AN_ARTICLE)
    and the page's own entity (-1: none), looked up in Arrow; the vocabulary's names and anchors."""
    job = _PassageJob(page_files, *(str(work_dir / f"{name}.arrow") for name in ("links", "names", "anchors")),
                      **options)  # fmt: skip
    with _arrow_file(job.link_file, _LINK_ENTITY_SCHEMA) as writer:
        # many pages per look-up (index_in hashes its value set on every call), a bounded number (memory stays flat)
        for offset in range(0, len(table), _LOOKUP_PAGES):
            pages = table.slice(offset, _LOOKUP_PAGES).select(["title", "link_targets"]).combine_chunks()
            targets = _one_array(pages.column("link_targets"))
            positions = pc.index_in(pc.list_flatten(targets), value_set=links.targets)
            offsets = pc.subtract(targets.offsets, targets.offsets[0])
            entities = pa.ListArray.from_arrays(offsets, links.target_ids.take(positions), mask=pc.is_null(targets))
            own = _one_array(pc.fill_null(pc.index_in(pages.column("title"), value_set=links.names), -1))
            writer.write_batch(pa.RecordBatch.from_arrays([entities, own], schema=_LINK_ENTITY_SCHEMA))
    for path, columns in ((job.name_file, {"name": links.names}), (job.anchor_file, links.anchor_table)):
        columns = pa.table(columns)
        with _arrow_file(path, columns.schema) as writer:
            writer.write_table(columns)
    return job


def _one_array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


_PASSAGE_INPUTS: dict[str, tuple[pa.Table, _SearchedAliases]] = {}


def _passage_inputs(job: _PassageJob) -> tuple[pa.Table, _SearchedAliases]:
    """The pages (with their links' entity ids) and the searched aliases of a job, read once per process."""
    inputs = _PASSAGE_INPUTS.get(job.link_file)
    if inputs is None:
        _PASSAGE_INPUTS.clear()
        pages = _read_arrow_files(job.page_files).select(_PASSAGE_INPUT_COLUMNS)
        for name, column in zip(_LINK_ENTITY_SCHEMA.names, _read_arrow_files([job.link_file]).columns):
            pages = pages.append_column(name, column)
        names = _read_arrow_files([job.name_file]).column("name").to_pylist()
        anchors = _EntityAnchors(_read_arrow_files([job.anchor_file]), len(names))
        inputs = _PASSAGE_INPUTS[job.link_file] = (pages, _SearchedAliases(names, anchors, job.max_aliases))
    return inputs


def _read_arrow_files(paths: Sequence[str]) -> pa.Table:
    """Arrow stream files as one table, memory-mapped (pyarrow alone: a `datasets.Dataset` would hash them first)."""
    return pa.concat_tables([pa.ipc.open_stream(pa.memory_map(path)).read_all() for path in paths])


def _passages_task(job: _PassageJob, offset: int, length: int, out_path: str) -> tuple[str, dict]:
    """Writes the passages of the articles among pages `offset..offset+length` of the page cache to `out_path`;
    returns it with their counts (`_PassageCounts.summary`). Passages go through a file, not the pool's pipe:
    a worker sending a large result waits until this process's result thread reads it, which waits for the
    GIL while this process reads the dump or writes the vocabulary."""
    batch = _passage_batch(job, offset, length)
    with _arrow_file(out_path, _PASSAGE_SCHEMA) as writer:
        writer.write_batch(batch)
    return out_path, _PassageCounts.summary(batch)


def _passage_batch(job: _PassageJob, offset: int, length: int) -> pa.RecordBatch:
    pages, searched_aliases = _passage_inputs(job)
    table = pages.slice(offset, length)
    rows = table.drop_columns(_TOKEN_COLUMNS).to_pydict()
    keep = [i for i, status in enumerate(rows.pop("status")) if status == "article"]
    batch = {name: [values[i] for i in keep] for name, values in rows.items()}
    if job.pretokenized:
        words = _int32_list_rows(table.column("token_ids")), _int32_list_rows(table.column("token_starts"))
        batch["words"] = [None if words[0][i] is None else (words[0][i], words[1][i]) for i in keep]
    return _make_passages(batch, _WORKER_STATE["tokenizer"], searched_aliases, job.settings, job.heuristics)


def _int32_list_rows(column: pa.ChunkedArray) -> list[np.ndarray | None]:
    """The rows of a list<int32> column as numpy views (None where null)."""
    array = column.combine_chunks()
    offsets = array.offsets.to_numpy()  # of this (possibly sliced) array, into the whole `values`
    values = array.values.to_numpy()
    valid = array.is_valid().to_numpy(zero_copy_only=False)
    return [values[offsets[i] : offsets[i + 1]] if valid[i] else None for i in range(len(array))]


def _fork_context():
    """Forked processes where the platform allows (they inherit the parent's imports, state and warm caches
    without pickling); None elsewhere."""
    if "fork" in multiprocessing.get_all_start_methods() and sys.platform != "darwin":
        return multiprocessing.get_context("fork")
    return None


@contextlib.contextmanager
def _worker_pool(num_workers: int, state: dict | None = None):
    """A pool of `num_workers` processes (forked where the platform allows), or None for no worker. `state` is
    the worker state of the pool's processes and, meanwhile, of this one (which runs the tasks without a pool)."""
    previous = dict(_WORKER_STATE)
    if state is not None:
        _set_worker_state(state)
    pool = None
    try:
        if num_workers >= 1:
            context = _fork_context() or multiprocessing.get_context()
            initializer, initargs = (_set_worker_state, (state,)) if state is not None else (None, ())
            pool = context.Pool(num_workers, initializer=initializer, initargs=initargs)
        yield pool
        if pool is not None:
            pool.close()
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
        _set_worker_state(previous)


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


def _iter_arrow_batches(table, columns: list[str], batch_size: int = 2000) -> Iterator[dict[str, list]]:
    for record_batch in table.select(columns).to_batches(max_chunksize=batch_size):
        yield record_batch.to_pydict()


class _SearchedAliases(dict):
    """Entity id -> the aliases searched for its unlinked mentions (`heuristic_aliases`), made on first use: in
    the passaging processes, for the entities their pages link to, instead of for the whole vocabulary up
    front in one process."""

    def __init__(self, names: Sequence[str], anchors: _EntityAnchors, max_aliases: int):
        super().__init__()
        self.names, self.anchors, self.max_aliases = names, anchors, max_aliases

    def __missing__(self, entity_id: int) -> list[str]:
        # heuristic_aliases(name, counts, max_aliases): the anchors are ranked already
        anchors = self.anchors.ranked(entity_id)[: self.max_aliases]
        aliases = self[entity_id] = _searched_aliases(self.names[entity_id], anchors)
        return aliases


def _write_vocabulary_files(out_dir: Path, links: _EntityLinks, tokenizer: PreTrainedTokenizerBase) -> int:
    """Saves `entity_vocab.json` (each entity's anchors, most frequent first, ties by text), `aliases.json` (the
    same counts by anchor: `_save_alias_counts`' order, sorted in Arrow) and the tokenizer; returns the number of
    aliases."""
    vocab, anchors = links.vocab, _EntityAnchors(links.anchor_table, len(links.vocab))
    EntityVocab(vocab.names, [anchors.ranked(entity_id) for entity_id in range(len(vocab))], vocab.counts).save(
        out_dir
    )
    table = links.anchor_table
    table = table.append_column("name", links.names.take(table.column("entity_id")))
    table = table.sort_by([("anchor", "ascending"), ("count", "descending"), ("name", "ascending")])
    aliases, names, counts = (table.column(name).to_pylist() for name in ("anchor", "name", "count"))
    cuts = [0, *(i for i in range(1, len(aliases)) if aliases[i] != aliases[i - 1]), len(aliases)]
    by_alias = {  # anchor -> entity -> links
        aliases[begin]: dict(zip(names[begin:end], counts[begin:end]))
        for begin, end in zip(cuts, cuts[1:])
        if end > begin
    }
    _write_json(by_alias, out_dir / ALIASES_NAME)
    tokenizer.save_pretrained(out_dir / "tokenizer")
    return len(by_alias)


def _make_passages(batch: dict, tokenizer, entity_aliases, settings, heuristics) -> pa.RecordBatch:
    """The passages of a batch of articles (`PASSAGE_FEATURES`), built from arrays (no Python list per token)."""
    documents = []
    for text, starts, ends, entity_ids, own_id in zip(
        batch["text"], batch["link_starts"], batch["link_ends"], batch["link_entities"], batch["own_entity"]
    ):  # fmt: skip
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
        documents.append((text, label_mentions(text, links, candidates)))
    tokenized: list[tuple | None] = [None] * len(documents)
    if batch.get("words") is not None:  # tokenised while parsing: only the markers go in
        start_id, end_id = tokenizer.convert_tokens_to_ids([ENTITY_START_TOKEN, ENTITY_END_TOKEN])
        encoder = _piece_encoder(tokenizer)
        for index, ((text, mentions), words) in enumerate(zip(documents, batch["words"])):
            if words is not None:
                tokenized[index] = insert_mention_markers(
                    text, words[0], words[1], mentions, start_id, end_id, encoder.piece_ids
                )
    left = [index for index, result in enumerate(tokenized) if result is None]
    for index, result in zip(left, _tokenize_documents([documents[i] for i in left], tokenizer)):
        tokenized[index] = _document_arrays(*result)
    windows = [
        _window_arrays(*document, settings, tokenizer.bos_token_id, tokenizer.eos_token_id) for document in tokenized
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
        "doc_id": pa.array(np.repeat(np.asarray(batch["page_id"], dtype=np.int64), num_passages)),
        "passage_index": pa.array(column("passage_index", np.int32)),
        **{name: pa.array(counts[:, k]) for k, name in enumerate(_STATS_COLUMNS)},
    }
    return pa.RecordBatch.from_arrays([arrays[name] for name in _PASSAGE_SCHEMA.names], schema=_PASSAGE_SCHEMA)


@contextlib.contextmanager
def _quiet_gc():
    """Fewer, cheaper garbage collections during the build: the objects that exist before it (torch, transformers,
    the tokenizer: a large heap) are frozen out of collection, and collections run less often. The build makes
    millions of short-lived lists that are no cycles; with the default settings the collector's full passes over
    the large heap cost a quarter of the build time on the benchmark dump. Restored on exit."""
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


def _word_encoder(tokenizer: PreTrainedTokenizerBase | None) -> _PieceEncoder | None:
    """The encoder that tokenises the articles' words while they are parsed, or None: no tokenizer given (one is
    trained on the parsed text), not a byte-level BPE, or parsing processes that would not inherit it (spawned,
    not forked)."""
    if tokenizer is None or not tokenizer.is_fast or _fork_context() is None:
        return None
    encoder = _piece_encoder(tokenizer)
    return encoder if encoder.words is not None else None


def build_corpus(
    dump: str | os.PathLike | Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    num_entities: int = 1_000_000,
    tokenizer: str | os.PathLike | PreTrainedTokenizerBase | None = None,
    num_proc: int = 1,
    strict: bool = False,
    passage_length: int = 128,
    passage_overlap: int = 10,
    validation_fraction: float = 0.005,
    seed: int = 42,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    heuristic_labels: bool = True,
    max_aliases_per_entity: int = 10,
    require_existing_pages: bool = False,
) -> dict:
    """Builds a pre-training corpus from one or more MediaWiki dump files into `out_dir`; returns the stats.

    Writes `passages/` (DatasetDict train/validation), `entity_vocab.json`, `aliases.json`, `tokenizer/` and
    `stats.json`. Without `tokenizer`, a byte-level BPE of `vocab_size` is trained on the corpus text.

    Entities are link targets after redirect resolution. With `require_existing_pages`, only targets that are
    articles of the dump count (drops red links; use it on complete dumps only: on an excerpt most targets
    are missing).
    """
    started = time.perf_counter()
    dump_paths = [os.fspath(dump)] if isinstance(dump, str | os.PathLike) else [os.fspath(p) for p in dump]
    if not dump_paths:
        raise ValueError("no dump file given")
    for path in dump_paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"dump file {path} does not exist")
    if not 0 <= validation_fraction < 1:
        raise ValueError(f"validation_fraction must be in [0, 1), got {validation_fraction}")
    if num_proc < 1:
        raise ValueError(f"num_proc must be at least 1, got {num_proc}")
    if isinstance(tokenizer, str | os.PathLike) and not os.path.isdir(tokenizer):  # not after parsing the dump
        raise FileNotFoundError(f"tokenizer directory {os.fspath(tokenizer)!r} does not exist")
    settings = PassageSettings(passage_length, passage_overlap)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    work_dir = Path(tempfile.mkdtemp(prefix=".build-", dir=out_dir))
    try:
        with _quiet_gc():
            return _build(dump_paths, out_dir, work_dir, num_entities, tokenizer, num_proc, strict, settings,
                          validation_fraction, seed, vocab_size, heuristic_labels, max_aliases_per_entity,
                          require_existing_pages, started)  # fmt: skip
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


def _build(dump_paths, out_dir, work_dir, num_entities, tokenizer, num_proc, strict, settings, validation_fraction,
           seed, vocab_size, heuristic_labels, max_aliases_per_entity, require_existing_pages,
           started) -> dict:  # fmt: skip
    # 1. parse (the only pass over the XML) into an Arrow cache, in dump order
    cache_dir = work_dir / "cache"
    cache_dir.mkdir()
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
            word_encoder = _word_encoder(tokenizer)
            pool = pools.enter_context(_worker_pool(workers, {"word_encoder": word_encoder, "tokenizer": tokenizer}))
            if one_reader:
                cache_files = [str(cache_dir / "pages.arrow")]
                with _arrow_file(cache_files[0], _PAGE_SCHEMA) as writer:
                    all_chunks = chain([first_chunk] if first_chunk is not None else [], chunks)
                    tasks = (
                        (pages, path, strict, str(cache_dir / f"chunk-{k:06d}.arrow"))
                        for k, (pages, path) in enumerate(all_chunks)
                    )
                    for batch in _read_and_remove(_ordered_map(pool, _parse_chunk_to_file, tasks, max_in_flight)):
                        writer.write_batch(batch)
            else:
                # Several dump files (the split enwiki-...-articlesN files): each worker reads and parses whole files.
                tasks = [(path, strict, str(cache_dir / f"pages-{k:05d}.arrow")) for k, path in enumerate(dump_paths)]
                cache_files = list(_ordered_map(pool, _parse_file, tasks, len(tasks) + 1))
        table = _read_arrow_files(cache_files)
        stage_seconds = {"parse": time.perf_counter() - started}

        def stage_done(name: str) -> None:
            stage_seconds[name] = time.perf_counter() - started - sum(stage_seconds.values())

        # 2. redirects, link counts, vocabulary, aliases; each link's entity id, for the passages
        links = _count_links(table, num_entities, require_existing_pages)
        vocab = links.vocab
        job = _write_passage_inputs(
            work_dir, table, cache_files, links, settings=settings, heuristics=heuristic_labels,
            pretokenized=word_encoder is not None, max_aliases=max_aliases_per_entity,
        )  # fmt: skip
        stage_done("vocab_and_aliases")

        # 3. tokenizer
        if tokenizer is None:
            logger.info("training a byte-level BPE tokenizer (vocab_size=%d) on the corpus text", vocab_size)

            def texts() -> Iterator[str]:
                for batch in _iter_arrow_batches(table, ["text"]):
                    yield from (t for t in batch["text"] if t)

            tokenizer = train_tokenizer(texts(), vocab_size=vocab_size)
            # the workers do not have it: a new pool of the same kind, which inherits it
            pools.close()
            _piece_encoder(tokenizer)  # made once, before the fork
            pool = pools.enter_context(_worker_pool(workers, {"tokenizer": tokenizer}))
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
            write_vocabulary = partial(background.submit, _write_vocabulary_files, out_dir, links, tokenizer)
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
        splits = _split(passage_files, counts.passages, validation_fraction, seed, work_dir)
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
    memory (resident file pages: 10% more peak memory on the 10x benchmark dump, growing with the corpus)."""
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
    keys = ["pages", "articles", "redirects", "malformed_pages", "links", "links_to_entities", "entity_vocab_size",
            "link_coverage_by_vocab", "aliases", "train_passages", "validation_passages", "link_mentions",
            "heuristic_mentions", "mentions_per_passage", "labeled_mentions_per_passage", "entity_coverage",
            "seconds", "articles_per_second"]  # fmt: skip
    return "\n".join(f"  {key:<30} {stats[key]}" for key in keys if key in stats)


# --- command line ---------------------------------------------------------------------------------------------


@dataclass
class BuildCorpusArguments:
    dump: list[str] = field(
        default_factory=list,
        metadata={"help": "MediaWiki pages-articles dump file(s), .xml or .xml.bz2 (required)."},
    )
    out: str = field(default="", metadata={"help": "Output directory (required)."})
    num_entities: int = field(default=1_000_000, metadata={"help": "Entity vocabulary size: top-N most linked."})
    tokenizer: str | None = field(
        default=None,
        metadata={"help": "Local tokenizer directory (markers are added if missing). Default: train one."},
    )
    vocab_size: int = field(default=DEFAULT_VOCAB_SIZE, metadata={"help": "Vocabulary size when training one."})
    num_proc: int = field(default=1, metadata={"help": "Processes for parsing and passaging."})
    strict: bool = field(default=False, metadata={"help": "Stop at the first malformed page instead of skipping it."})
    passage_length: int = field(default=128, metadata={"help": "Tokens per passage, with <s> and </s>."})
    passage_overlap: int = field(
        default=10, metadata={"aliases": ["--passage-stride"], "help": "Tokens shared by consecutive passages."}
    )
    validation_fraction: float = field(default=0.005, metadata={"help": "Fraction of passages held out."})
    seed: int = field(default=42, metadata={"help": "Seed of the validation split."})
    no_heuristic_labels: bool = field(default=False, metadata={"help": "Only label hyperlinks."})
    max_aliases_per_entity: int = field(default=10, metadata={"help": "Anchors per entity used by the heuristics."})
    require_existing_pages: bool = field(
        default=False,
        metadata={"help": "Count only link targets that are articles of the dump (complete dumps; drops red links)."},
    )


def cli_main(argv: list[str] | None = None) -> int:
    """`edmem build-corpus`."""
    parser = HfArgumentParser(BuildCorpusArguments, prog="edmem build-corpus")
    (args,) = parser.parse_args_into_dataclasses(args=sys.argv[1:] if argv is None else argv)
    if not args.dump or not args.out:
        parser.error("--dump and --out are required")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        stats = build_corpus(
            args.dump,
            args.out,
            num_entities=args.num_entities,
            tokenizer=args.tokenizer,
            num_proc=args.num_proc,
            strict=args.strict,
            passage_length=args.passage_length,
            passage_overlap=args.passage_overlap,
            validation_fraction=args.validation_fraction,
            seed=args.seed,
            vocab_size=args.vocab_size,
            heuristic_labels=not args.no_heuristic_labels,
            max_aliases_per_entity=args.max_aliases_per_entity,
            require_existing_pages=args.require_existing_pages,
        )
    except (ValueError, FileNotFoundError) as err:  # DumpFormatError and MalformedPageError are ValueErrors
        print(f"edmem build-corpus: error: {err}", file=sys.stderr)
        return 1
    print(f"corpus written to {args.out}\n{format_stats(stats)}")
    return 0


__all__ = [
    "AliasTable",
    "Mention",
    "PassageSettings",
    "build_corpus",
    "build_entity_vocab",
    "build_passages",
    "heuristic_aliases",
    "label_mentions",
    "resolve_redirect",
    "tokenize_with_mentions",
    "window_passages",
]

"""The entity vocabulary and alias table from a dump's links: redirects resolved, links counted per entity in
Arrow, the most linked entities kept, and the aliases searched for their unlinked mentions."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .entity_vocab import EntityVocab

NOT_AN_ARTICLE = -2  # link target that is neither an article nor a redirect to one (red link)
OUT_OF_VOCAB = -1  # an article outside the entity vocabulary
ALIASES_NAME = "aliases.json"


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


class EntityLinks(NamedTuple):
    """The entity vocabulary and what the passages need of the links (`count_links`)."""

    vocab: EntityVocab
    names: pa.Array  # the vocabulary's names, as Arrow strings
    targets: pa.Array  # the distinct link targets (before redirects)
    target_ids: pa.Array  # int32, per target: its vocabulary id, OUT_OF_VOCAB, or NOT_AN_ARTICLE (a red link)
    anchor_table: pa.Table  # the vocabulary entities' anchors: entity_id, anchor, count; by id, most linked first
    stats: dict


def count_links(pages: pa.Table, num_entities: int, require_existing_pages: bool) -> EntityLinks:
    """Redirects, inbound link counts, the `num_entities` most linked entities (most links first, ties by name)
    and their anchors, from parsed pages (columns title, status, redirect, link_anchors, link_targets).

    The links are grouped and counted in Arrow, by (anchor, target before redirects): Python sees each distinct
    target once, to resolve its redirects. An entity is a resolved link target; with `require_existing_pages`
    it must be an article of the dump. Entities without any inbound link are never included.
    """
    articles: set[str] = set()
    redirects: dict[str, str] = {}
    malformed = 0
    for batch in pages.select(["title", "status", "redirect"]).to_batches(max_chunksize=2000):
        batch = batch.to_pydict()
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
                "anchor": pc.list_flatten(pages.column("link_anchors")),
                "target": pc.list_flatten(pages.column("link_targets")),
            }
        )
        .group_by(["anchor", "target"], use_threads=False)
        .aggregate([([], "count_all")])
    )
    counts = pairs.column("count_all")
    targets = pc.unique(pairs.column("target"))
    entities: list[str | None] = []  # per distinct target: the entity it names, None for a red link
    for target in targets.to_pylist():
        final = resolve_redirect(target, redirects) if target in redirects else target
        entities.append(final if final in articles or not require_existing_pages else None)
    entities_array = pa.array(entities, pa.string())
    pair_target = pc.index_in(pairs.column("target"), value_set=targets)
    pair_entity = entities_array.take(pair_target)
    to_entities = pa.table({"entity": pair_entity, "count": counts}).filter(pc.is_valid(pair_entity))
    per_entity = to_entities.group_by("entity", use_threads=False).aggregate([("count", "sum")])
    # most links first, ties by name (Arrow orders strings by their UTF-8 bytes, which is Python's order of code
    # points)
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
    return EntityLinks(vocab, ranked.column("entity").combine_chunks(), targets, target_codes, anchors, stats)


class EntityAnchors:
    """Each vocabulary entity's anchors, most linked first (ties by text), in one flat list: entity `e`'s are at
    `starts[e]:starts[e + 1]` (a list per entity would cost more to make than to use)."""

    def __init__(self, anchor_table: pa.Table, num_entities: int):
        """From `EntityLinks.anchor_table` (entity_id, anchor, count; in that order already)."""
        self.anchors = anchor_table.column("anchor").to_pylist()
        entity_ids = anchor_table.column("entity_id").to_numpy()
        self.starts = np.searchsorted(entity_ids, np.arange(num_entities + 1)).tolist()

    def ranked(self, entity_id: int) -> list[str]:
        return self.anchors[self.starts[entity_id] : self.starts[entity_id + 1]]


def write_vocabulary_files(out_dir: Path, links: EntityLinks) -> int:
    """Saves `entity_vocab.json` (each entity's anchors, most frequent first, ties by text) and `aliases.json`
    (anchor -> entity -> links; anchors in order, each one's entities the most linked first, ties by name: sorted
    in Arrow); returns the number of aliases."""
    vocab, anchors = links.vocab, EntityAnchors(links.anchor_table, len(links.vocab))
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
    with open(os.path.join(out_dir, ALIASES_NAME), "w", encoding="utf-8") as f:
        f.write(json.dumps(by_alias, ensure_ascii=False))  # json.dump would use the slow pure-Python encoder
    return len(by_alias)


_PARENTHETICAL = re.compile(r"\s*\([^()]*\)$")
_ASCII_UPPER_OR_DIGIT = re.compile("[A-Z0-9]")


def _has_upper_or_digit(text: str) -> bool:
    if text.isascii():
        return _ASCII_UPPER_OR_DIGIT.search(text) is not None
    return any(c.isupper() or c.isdigit() for c in text)


def heuristic_aliases(name: str, ranked_anchors: Sequence[str], max_aliases: int = 10) -> list[str]:
    """The strings searched for unlinked mentions of an entity: its name, the name without a trailing
    "(disambiguation)"-style qualifier, and the first `max_aliases` of its anchors (most linked first).

    Anchors shorter than 2 characters or without any upper-case letter or digit ("here", "his") are left out:
    such words are mostly not mentions of the page's entities.
    """
    result = [name]
    short = _PARENTHETICAL.sub("", name) if name.endswith(")") else name
    if short and short != name:
        result.append(short)
    for anchor in ranked_anchors[:max_aliases]:
        if len(anchor) < 2 or anchor in result or not _has_upper_or_digit(anchor):
            continue
        result.append(anchor)
    return result


class SearchedAliases(dict):
    """Entity id -> its `heuristic_aliases`, made on first use: in the passaging processes, for the entities their
    pages link to, instead of for the whole vocabulary up front in one process."""

    def __init__(self, names: Sequence[str], anchors: EntityAnchors, max_aliases: int):
        super().__init__()
        self.names, self.anchors, self.max_aliases = names, anchors, max_aliases

    def __missing__(self, entity_id: int) -> list[str]:
        aliases = self[entity_id] = heuristic_aliases(
            self.names[entity_id], self.anchors.ranked(entity_id), self.max_aliases
        )
        return aliases


__all__ = ["count_links", "heuristic_aliases", "resolve_redirect", "write_vocabulary_files"]

"""The texts of new entities in a MediaWiki dump, parsed as `edmem build-corpus` parses one
(`dump.iter_parsed_pages`): an article whose title the model does not know is a new entity; its passages are the text
around each of its mentions, marked `<E_s> ... <E_e>`: every link to it in the dump (through redirects) and each
occurrence of its title on its own page (`new_entity_passages`); or each sentence of its own page
(`own_page_sentences`), what the writer of entity rows writes from by default; and the other names the dump gives it
(`other_names`: redirects and link anchors).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

from ..configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN
from ..dump import ParsedPage


def _marked(text: str, start: int, end: int, window: int) -> str:
    before, after = text[max(0, start - window) : start], text[end : end + window]
    return f"{before} {ENTITY_START_TOKEN} {text[start:end]} {ENTITY_END_TOKEN} {after}".strip()


def new_entity_passages(
    pages: Iterable[ParsedPage], known: Iterable[str], window: int = 200, max_passages: int = 32
) -> tuple[dict[str, list[str]], list[str]]:
    """The passages of each article whose title is not in `known`, and the new titles with no mention at all.

    Each passage is the text `window` characters either side of one mention, that mention marked; at most
    `max_passages` an entity, links first.
    """
    pages = list(pages)
    known = set(known)
    redirects = {page.title: page.redirect for page in pages if page.redirect is not None}
    new = [page for page in pages if page.redirect is None and page.title not in known]
    passages: dict[str, list[str]] = {page.title: [] for page in new}
    for page in pages:
        for link in page.links:
            target = redirects.get(link.target, link.target)
            if target in passages and len(passages[target]) < max_passages:
                passages[target].append(_marked(page.text, link.start, link.end, window))
    for page in new:
        start = page.text.find(page.title)
        while start >= 0 and len(passages[page.title]) < max_passages:
            passages[page.title].append(_marked(page.text, start, start + len(page.title), window))
            start = page.text.find(page.title, start + len(page.title))
    without = [title for title, texts in passages.items() if not texts]
    return {title: texts for title, texts in passages.items() if texts}, without


def other_names(pages: Iterable[ParsedPage], names: Iterable[str], max_names: int = 16) -> dict[str, list[str]]:
    """The other names the dump gives each of `names`: the titles of its redirects and the anchor texts of the links
    to it, most used first, at most `max_names` (`edmem add-entities` keeps them as aliases, which the name-guided
    read finds: docs/model.md)."""
    pages = list(pages)
    redirects = {page.title: page.redirect for page in pages if page.redirect is not None}
    counts: dict[str, Counter] = {name: Counter() for name in names}
    for title, target in redirects.items():
        if target in counts:
            counts[target][title] += 1
    for page in pages:
        for link in page.links:
            target = redirects.get(link.target, link.target)
            if target in counts:
                counts[target][link.anchor.strip()] += 1
    return {name: [other for other, _ in found.most_common() if other and other != name][:max_names]
            for name, found in counts.items()}  # fmt: skip


TEXTS = ("own_sentences", "passages")  # what `edmem add-entities` writes rows from
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


def own_page_sentences(
    pages: Iterable[ParsedPage], names: Iterable[str], max_sentences: int | None = 32
) -> dict[str, list[str]]:
    """Each of `names`' own page cut into its sentences, in page order, at most `max_sentences` an entity (None: all);
    a line that does not end as a sentence does (a heading, a list item) is dropped. A biography's sentence states one
    fact, and rows written from each, kept apart, are what the writer's figures are best with (docs/evidence.md). A
    name without a page, or whose page has no sentence, is left out."""
    wanted = set(names)
    sentences: dict[str, list[str]] = {}
    for page in pages:
        if page.title not in wanted or page.redirect is not None:
            continue
        cut = (piece.strip() for piece in _SENTENCE_END.split(page.text))
        found = [piece for piece in cut if piece.endswith((".", "!", "?"))][:max_sentences]
        if found:
            sentences[page.title] = found
    return sentences

"""Heuristic mention labelling: a page's hyperlinks plus the unlinked mentions of the entities it links to and of
its own entity, found by alias search (paper, Appendix A)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import ahocorasick


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


__all__ = ["Mention", "label_mentions"]

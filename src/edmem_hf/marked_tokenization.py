"""Tokenisation of text with `<E_s>`/`<E_e>` around its mentions: the reference, through the `tokenizers` library.

`fast_tokenization.py` gives the same result faster for byte-level BPE tokenizers; tests hold the two equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from transformers import PreTrainedTokenizerBase

from .collator import IGNORE_INDEX
from .configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN
from .mention_labels import Mention


class MarkedTokens(NamedTuple):
    """A document's tokens with its mentions marked."""

    ids: np.ndarray  # int32, (tokens,): `<E_s>` before and `<E_e>` after each mention; no `<s>`/`</s>`
    labels: np.ndarray  # int64, (tokens,): the entity id at each labelled `<E_s>`, IGNORE_INDEX elsewhere
    spans: np.ndarray  # int64, (mentions, 3): the `<E_s>` and `<E_e>` positions and whether the mention is heuristic


def marked_tokens(ids: Sequence[int], mentions: Sequence[Mention], marker_positions: Sequence[int]) -> MarkedTokens:
    """`MarkedTokens` from a document's marked ids, its mentions and the positions of their markers in `ids`
    (`<E_s>`, `<E_e>` of the first mention, then of the second, ...)."""
    positions = np.asarray(marker_positions, dtype=np.int64)
    spans = np.empty((len(mentions), 3), dtype=np.int64)
    spans[:, 0], spans[:, 1] = positions[0::2], positions[1::2]
    spans[:, 2] = [mention.heuristic for mention in mentions]
    labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int64)
    entity_ids = np.array([mention.entity_id for mention in mentions], dtype=np.int64)
    labelled = entity_ids >= 0
    labels[spans[labelled, 0]] = entity_ids[labelled]
    return MarkedTokens(np.asarray(ids, dtype=np.int32), labels, spans)


def mention_cuts(text: str, mentions: Sequence[Mention]) -> list[int] | None:
    """Where the text is cut into pieces: the start and end of each mention, a mention's start moved to the space
    before it (`" Paris"` -> `ĠParis`, as in running text); None for overlapping or unsorted mentions."""
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
    return cuts


def tokenize_with_mentions(
    documents: Sequence[tuple[str, Sequence[Mention]]], tokenizer: PreTrainedTokenizerBase
) -> list[MarkedTokens]:
    """Per document `(text, mentions)`: its tokens with `<E_s>`/`<E_e>` around each mention.

    Each document is cut at its mentions (`mention_cuts`), the pieces are encoded by the tokenizer's backend
    (`encode_batch`, no special tokens) and joined with the markers in between. Mentions must be sorted and
    must not overlap (as `label_mentions` makes them).
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(f"{type(tokenizer).__name__} is not a fast tokenizer: marked text needs a `tokenizers` one")
    start_id, end_id = tokenizer.convert_tokens_to_ids([ENTITY_START_TOKEN, ENTITY_END_TOKEN])
    pieces: list[str] = []
    for text, mentions in documents:
        cuts = mention_cuts(text, mentions)
        if cuts is None:
            raise ValueError(f"mentions overlap or are out of order: {list(mentions)}")
        bounds = [0, *cuts, len(text)]
        pieces += [text[begin:end] for begin, end in zip(bounds, bounds[1:])]
    encodings = iter(backend.encode_batch(pieces, add_special_tokens=False) if pieces else [])
    results = []
    for _, mentions in documents:
        ids: list[int] = []
        positions: list[int] = []
        for _ in mentions:
            ids += next(encodings).ids  # the text before the mention
            positions.append(len(ids))
            ids.append(start_id)
            ids += next(encodings).ids
            positions.append(len(ids))
            ids.append(end_id)
        ids += next(encodings).ids  # the rest of the text
        results.append(marked_tokens(ids, mentions, positions))
    return results


__all__ = ["MarkedTokens", "tokenize_with_mentions"]

"""Windowing of a marked document into passages of `passage_length` tokens (with `<s>`/`</s>`), consecutive
windows overlapping, all windows of a document cut at once from its arrays."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .collator import IGNORE_INDEX
from .marked_tokenization import MarkedTokens


@dataclass
class PassageSettings:
    passage_length: int = 128  # tokens, with <s> and </s>
    passage_overlap: int = 10

    def __post_init__(self):
        if self.passage_length < 8:
            raise ValueError(f"passage_length={self.passage_length} is too short (at least 8)")
        if not 0 <= self.passage_overlap < self.passage_length - 2:
            raise ValueError(f"passage_overlap={self.passage_overlap} must be in [0, passage_length - 2)")


class PassageWindows(NamedTuple):
    """A document's passages as flat arrays, the parts of their Arrow columns."""

    ids: np.ndarray  # int32: every passage's tokens, one passage after another
    labels: np.ndarray  # int64, aligned with `ids`
    lengths: np.ndarray  # int64, (passages,): tokens per passage
    passage_index: np.ndarray  # int32, (passages,): position of each passage in its document
    counts: np.ndarray  # int32, (passages, 3): link mentions, heuristic mentions, labelled mentions


def window_passages(
    document: MarkedTokens, settings: PassageSettings, bos_token_id: int, eos_token_id: int
) -> PassageWindows:
    """Cuts one document's tokens into passages of `passage_length` tokens (with `<s>`/`</s>`).

    Consecutive windows share `passage_overlap` tokens. The last window is topped up with tokens from the
    start of the same document (a document shorter than one window gives one shorter passage). A mention
    that a window boundary cuts keeps its words but loses its markers in that window, so such a passage is
    one or two tokens shorter. All windows are cut at once: a `(windows, width)` grid of token positions, and
    a mask that drops the markers of mentions the window does not hold whole.
    """
    ids, labels, spans = document
    content = settings.passage_length - 2
    stride = content - settings.passage_overlap
    n = len(ids)
    if n == 0:
        empty = np.zeros(0, np.int64)
        return PassageWindows(ids, labels, empty, empty.astype(np.int32), np.zeros((0, 3), np.int32))
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
    return PassageWindows(out_ids, out_labels, lengths, np.arange(num_windows, dtype=np.int32), counts)


__all__ = ["PassageSettings", "PassageWindows", "window_passages"]

"""Entity-constrained decoding: a `LogitsProcessor` that forces generated spans to spell entity names of an
`EntityTrie`, optionally only those of per-row candidate entities, for EDMem or any Transformers model.

Usage (free, static and dynamic entity linking, GENRE-style retrieval): docs/constrained_decoding.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from transformers import LogitsProcessor

from .configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN
from .entity_trie import EntityTrie, TrieTensors
from .entity_vocab import EntityVocab

__all__ = [
    "EntityTrie",
    "EntityConstrainedLogitsProcessor",
    "EntityMention",
    "MarkedSpan",
    "marked_spans",
    "marker_token_ids",
]

# The state of a row is a trie node id (>= 0) inside a span, or one of these.
OUTSIDE = -1  # not inside a constrained span
DEAD = -2  # inside a span whose prefix is not in the trie: only the end token is allowed


def marker_token_ids(tokenizer: Any) -> tuple[int, int]:
    """Ids of `<E_s>` and `<E_e>` in `tokenizer`; a ValueError if it does not have them as single tokens."""
    ids = []
    for token in (ENTITY_START_TOKEN, ENTITY_END_TOKEN):
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token_id is None or (tokenizer.unk_token_id is not None and token_id == tokenizer.unk_token_id):
            raise ValueError(
                f"the tokenizer has no {token} token: add the mention markers as special tokens "
                f"(tokenizer.add_special_tokens({{'additional_special_tokens': ['{ENTITY_START_TOKEN}', "
                f"'{ENTITY_END_TOKEN}']}})) or pass their ids explicitly"
            )
        ids.append(int(token_id))
    return ids[0], ids[1]


class MarkedSpan(NamedTuple):
    """A span of a token sequence: `sequence[start]` opens it and its tokens are `sequence[start + 1 : end]`.
    `closed`: `sequence[end]` is the end token; otherwise `end` is the position of the next start token or stop
    token, or the length."""

    start: int
    end: int
    closed: bool


def marked_spans(
    sequence: Sequence[int],
    start_token_id: int | None,
    end_token_id: int,
    starts: Iterable[int] | None = None,
    stop_token_ids: Collection[int] = (),
) -> list[MarkedSpan]:
    """The spans of `sequence`, one per start token (or, with `starts`, one per given opening position).

    A span runs to the first end token after its opening, unless another start token, a stop token (e.g. EOS and
    padding of a finished generation) or the end of the sequence comes first: then it is left unclosed. An end
    token outside any span opens nothing. The one reading of `<E_s> ... <E_e>` for mention reports and checks,
    whatever generated the sequence.
    """
    if starts is None:
        if start_token_id is None:
            raise ValueError("marked_spans needs start_token_id, or the opening positions as starts")
        starts = [i for i, token in enumerate(sequence) if token == start_token_id]
    stops = {start_token_id, *stop_token_ids} - {end_token_id}
    spans = []
    for start in starts:
        end = start + 1
        while end < len(sequence) and sequence[end] != end_token_id and sequence[end] not in stops:
            end += 1
        spans.append(MarkedSpan(start, end, end < len(sequence) and sequence[end] == end_token_id))
    return spans


@dataclass
class EntityMention:
    """One generated span (see `marked_spans`): `sequence[start]` is the start marker (or the token before the span
    in position mode), `sequence[end]` the end token if the span is closed. `entity_id` is the entity the span spells (-1
    if none); `candidate_ids`/`candidate_scores` the row's candidates when the span was opened (empty if unknown)."""

    start: int
    end: int
    token_ids: list[int]
    entity_id: int
    candidate_ids: list[int] = field(default_factory=list)
    candidate_scores: list[float] = field(default_factory=list)


class _RowNodes:
    """The trie node of every generation row, advanced by one token per call. Beam search reorders rows between
    calls: each row is matched to the row of the previous call whose prefix it continues."""

    def __init__(self, start_token_id: int | None, end_token_id: int, start_position: int | None):
        self.start_token_id = start_token_id
        self.end_token_id = end_token_id
        self.start_position = start_position
        self.reset()

    def reset(self) -> None:
        self.node: torch.Tensor | None = None  # (rows,)
        self.prev_ids: torch.Tensor | None = None  # input_ids of the previous call
        self.span_start: int | None = None  # position mode: index of the span's first token
        self._hash_weights: torch.Tensor | None = None

    def continues(self, input_ids: torch.LongTensor) -> bool:
        """Whether `input_ids` is the previous call's rows plus one token (else a new generation starts)."""
        prev = self.prev_ids
        return prev is not None and prev.shape[0] == input_ids.shape[0] and prev.shape[1] == input_ids.shape[1] - 1

    def start(self, input_ids: torch.LongTensor, trie: TrieTensors) -> None:
        """State of every row from scratch: a walk over the positions of `input_ids` `(rows, T)`."""
        rows, length = input_ids.shape
        if self.start_token_id is not None:
            self.node = torch.full((rows,), OUTSIDE, dtype=torch.long, device=input_ids.device)
            is_start = input_ids == self.start_token_id
            first = int(is_start.any(0).long().argmax()) if bool(is_start.any()) else length
        else:
            if self.span_start is None:
                self.span_start = length if self.start_position is None else int(self.start_position)
            self.node = torch.zeros(rows, dtype=torch.long, device=input_ids.device)
            first = self.span_start
        for i in range(first, length):
            self.node = self._advance(self.node, input_ids[:, i], trie)
        self.prev_ids = input_ids

    def step(self, input_ids: torch.LongTensor, trie: TrieTensors, group_size: int) -> torch.Tensor | None:
        """Advances every row by its newest token. Returns the row of the previous call that each row `(rows,)`
        continues, or None if some row continues none (then every state is recomputed from `input_ids`)."""
        parents = self._parents(input_ids, group_size)
        if parents is None:
            self.start(input_ids, trie)
            return None
        self.node = self._advance(self.node.index_select(0, parents), input_ids[:, -1], trie)
        self.prev_ids = input_ids  # generate() builds a new tensor every step; nobody writes into it
        return parents

    def _advance(self, node: torch.Tensor, token: torch.Tensor, trie: TrieTensors) -> torch.Tensor:
        """One transition for every row: state `(rows,)` x token `(rows,)` -> state `(rows,)`."""
        child = trie.child(node, token)
        complete = trie.is_leaf.take(child.clamp(min=0))  # the name and its end token are spelled: span closed
        left = (token == self.end_token_id) | (node == OUTSIDE)
        new = torch.where(child >= 0, torch.where(complete, OUTSIDE, child), torch.where(left, OUTSIDE, DEAD))
        if self.start_token_id is not None:
            new = new.masked_fill_(token == self.start_token_id, 0)
        return new

    def _parents(self, input_ids: torch.LongTensor, group_size: int) -> torch.Tensor | None:
        """Matches each row's prefix `input_ids[:, :-1]` to a row of the previous call by a hash of the prefix and
        of the row's example (`group_size` rows per example, 0 if unknown), verified exactly."""
        prev, cur = self.prev_ids, input_ids[:, :-1]
        rows, width = cur.shape
        same_order = torch.arange(rows, device=input_ids.device)
        if torch.equal(cur, prev):  # greedy search, sampling, or beams that kept their order
            return same_order
        weights = self._weights(width, input_ids.device)
        example = same_order // group_size if group_size and rows % group_size == 0 else torch.zeros_like(same_order)
        salt = example * 0x9E3779B97F4A7C1
        sorted_hash, perm = ((prev * weights).sum(-1) + salt).sort()
        pos = torch.searchsorted(sorted_hash, (cur * weights).sum(-1) + salt).clamp_(max=rows - 1)
        parents = perm[pos]
        return parents if bool((prev[parents] == cur).all()) else None

    def _weights(self, width: int, device: torch.device) -> torch.Tensor:
        """Random odd 64-bit weights of the prefix hash (a sum over positions of token x weight, wrapping)."""
        if self._hash_weights is None or self._hash_weights.numel() < width:
            gen = torch.Generator().manual_seed(0x5EED)
            weights = torch.randint(-(2**62), 2**62, (max(64, 2 * width),), generator=gen, dtype=torch.long) | 1
            self._hash_weights = weights.to(device)
        return self._hash_weights[:width]


class _Candidates:
    """The candidate entities `(rows, k)` (-1 padding) and their scores of every row: static ones given before the
    generation (per example or per row), and updates set during it, which follow their row through reordering."""

    def __init__(self, trie: EntityTrie):
        self.trie = trie
        self.static_ids: torch.Tensor | None = None
        self.static_scores: torch.Tensor | None = None
        self.reset()

    def reset(self) -> None:
        self.ids: torch.Tensor | None = None
        self.scores: torch.Tensor | None = None
        self.pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = []

    def check(self, ids: torch.Tensor, scores: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """`(n, k)` (or `(k,)`) ids and scores -> `(n, k)` LongTensor and FloatTensor (zeros without scores)."""
        ids = torch.as_tensor(ids).long()
        if ids.dim() == 1:
            ids = ids[None, :]
        if ids.dim() != 2:
            raise ValueError(f"candidates must have shape (rows, k); got {tuple(ids.shape)}")
        self.trie.check_ids(ids)
        if scores is None:
            return ids, torch.zeros(ids.shape, dtype=torch.float32, device=ids.device)
        scores = torch.as_tensor(scores, dtype=torch.float32)
        if scores.dim() == 1:
            scores = scores[None, :]
        if scores.shape != ids.shape:
            raise ValueError(f"candidate_scores {tuple(scores.shape)} must match candidates {tuple(ids.shape)}")
        return ids, scores

    def start(self, rows: int, device: torch.device) -> None:
        """A new generation: the static candidates, expanded to `rows` by `repeat_interleave` (as `generate`
        expands its inputs); updates for rows of an earlier generation are dropped."""
        self.pending = [update for update in self.pending if update[2] is None]
        self.ids = self.scores = None
        if self.static_ids is not None:
            if rows % self.static_ids.shape[0]:
                raise ValueError(f"{self.static_ids.shape[0]} rows of candidates do not divide {rows} generation rows")
            repeat = rows // self.static_ids.shape[0]
            self.ids = self.static_ids.to(device).repeat_interleave(repeat, dim=0)
            self.scores = self.static_scores.to(device).repeat_interleave(repeat, dim=0)

    def reorder(self, parents: torch.Tensor) -> None:
        if self.ids is not None:
            self.ids = self.ids.index_select(0, parents)
            self.scores = self.scores.index_select(0, parents)

    def apply_updates(self, rows: int, device: torch.device) -> None:
        """Applies the `set_candidates` calls made since the last processor call."""
        for ids, scores, which in self.pending:
            ids, scores = ids.to(device), scores.to(device)
            if which is None:
                if ids.shape[0] != rows:
                    raise ValueError(f"set_candidates: {ids.shape[0]} rows of candidates for {rows} rows")
                self.ids, self.scores = ids, scores
                continue
            which = which.to(device)
            if which.dtype == torch.bool:
                which = torch.nonzero(which).flatten()
            k = max(ids.shape[1], self.ids.shape[1] if self.ids is not None else 0)
            new_ids = torch.full((rows, k), -1, dtype=torch.long, device=device)
            new_scores = torch.zeros((rows, k), dtype=torch.float32, device=device)
            if self.ids is not None:
                new_ids[:, : self.ids.shape[1]] = self.ids
                new_scores[:, : self.scores.shape[1]] = self.scores
            new_ids[which] = -1
            new_ids[which, : ids.shape[1]] = ids
            new_scores[which] = 0.0
            new_scores[which, : ids.shape[1]] = scores
            self.ids, self.scores = new_ids, new_scores
        self.pending = []


# Rows of `_DeviceState.penalty`: one for the rows outside a span, one for the rows in a span (whose allowed tokens
# are put in at every call), then one per dense node.
_FREE_SLOT, _CLOSED_SLOT, _DENSE_SLOTS = 0, 1, 2


@dataclass
class _DeviceState:
    """What the masking reads at every step, on the device, width and dtype of the scores."""

    trie: TrieTensors
    dense_nodes: torch.Tensor  # (D,) sorted ids of the nodes with many children
    penalty: torch.Tensor  # (2 + D, V) 0 for an allowed token, -inf for the others; rows: see `_FREE_SLOT`

    @classmethod
    def build(
        cls, trie: EntityTrie, scores: torch.Tensor, dense_threshold: int, end_token_id: int | None
    ) -> _DeviceState:
        """`end_token_id`: not allowed outside a span (marker mode), or None."""
        tensors = trie.tensors(scores.device)
        vocab = scores.shape[1]
        counts = tensors.first_child[1:] - tensors.first_child[:-1]
        dense = torch.nonzero(counts >= dense_threshold).flatten()
        dense = dense[torch.argsort(counts[dense], descending=True)[:256]].sort().values  # a bounded table
        penalty = torch.full(
            (_DENSE_SLOTS + len(dense), vocab), float("-inf"), dtype=scores.dtype, device=scores.device
        )
        penalty[_FREE_SLOT] = 0.0
        if end_token_id is not None and end_token_id < vocab:
            penalty[_FREE_SLOT, end_token_id] = float("-inf")
        dense_index, token = tensors.children(dense)
        keep = token < vocab
        penalty[_DENSE_SLOTS + dense_index[keep], token[keep]] = 0.0
        return cls(tensors, dense, penalty)

    def fits(self, scores: torch.Tensor) -> bool:
        penalty = self.penalty
        return (
            penalty.device == scores.device and penalty.dtype == scores.dtype and penalty.shape[1] == scores.shape[1]
        )

    def dense_slot(self, node: torch.Tensor) -> torch.Tensor:
        """Row of `penalty` of each node `(rows,)` that is a dense node, -1 for the others."""
        if not len(self.dense_nodes):
            return torch.full_like(node, -1)
        index = torch.searchsorted(self.dense_nodes, node).clamp_(max=len(self.dense_nodes) - 1)
        return torch.where(self.dense_nodes.take(index) == node, _DENSE_SLOTS + index, -1)


class EntityConstrainedLogitsProcessor(LogitsProcessor):
    r"""
    [`LogitsProcessor`] that forces generated spans to be entity names from an [`EntityTrie`], optionally
    restricted to per-row candidate entities. Vectorised over rows (batch x beams).

    Args:
        trie (`EntityTrie`): the names (with their end token).
        start_token_id (`int`, *optional*): marker that opens a span (`<E_s>`). `None`: position mode.
        end_token_id (`int`, *optional*): token closing a span; defaults to `trie.end_token_id`.
        start_position (`int`, *optional*): position mode only: index in `input_ids` where the span starts;
            defaults to the length of `input_ids` at the first call of a generation (the decoder prompt).
        candidates (`torch.LongTensor` of shape `(rows, k)` or `(examples, k)`, *optional*): per-row entity ids
            (`-1` padding); `None` allows every entity of the trie.
        candidate_scores (`torch.FloatTensor` of the same shape, *optional*): only reported by `mentions()`.
        candidates_fn (`Callable`, *optional*): called as `candidates_fn(input_ids)` at every step; may return
            `None` (no change), an id tensor of shape `(rows, k)` or a tuple `(ids, scores)`.
        group_size (`int`, *optional*): rows per example (`num_beams` for beam search, `num_return_sequences`
            for sampling): reordered beams are matched within their example, and `mentions()` keys its log by
            example. Defaults to `rows // examples` when `candidates` has one row per example, else unknown.
        dense_threshold (`int`, *optional*): nodes with at least this many children (e.g. the root of a 1M-name
            trie) get a precomputed row of allowed tokens; default `max(512, vocab_size // 16)`.
    """

    def __init__(
        self,
        trie: EntityTrie,
        start_token_id: int | None = None,
        end_token_id: int | None = None,
        start_position: int | None = None,
        candidates: torch.Tensor | None = None,
        candidate_scores: torch.Tensor | None = None,
        candidates_fn: Callable[[torch.LongTensor], Any] | None = None,
        group_size: int | None = None,
        dense_threshold: int | None = None,
    ):
        self.trie = trie
        self.start_token_id = None if start_token_id is None else int(start_token_id)
        end_token_id = trie.end_token_id if end_token_id is None else end_token_id
        if end_token_id is None:
            raise ValueError(
                "EntityConstrainedLogitsProcessor: no end token (give end_token_id or build the trie with one)"
            )
        self.end_token_id = int(end_token_id)
        if self.start_token_id is not None and self.start_token_id == self.end_token_id:
            raise ValueError("start_token_id and end_token_id must differ")
        self.start_position = start_position
        self.candidates_fn = candidates_fn
        self.group_size = group_size
        # A dense row costs a gather of V scores; the children of a sparse node cost about a dozen passes over them.
        self.dense_threshold = int(dense_threshold) if dense_threshold is not None else max(512, trie.vocab_size // 16)
        self._rows = _RowNodes(self.start_token_id, self.end_token_id, start_position)
        self._candidates = _Candidates(trie)
        if candidates is not None:
            self._set_static(candidates, candidate_scores)
        self._state: _DeviceState | None = None
        self._log: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []

    # --- candidates ---------------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forgets the state of the previous generation (done automatically when a new generation starts)."""
        self._rows.reset()
        self._candidates.reset()
        self._log = []

    @property
    def candidates(self) -> torch.Tensor | None:
        """Current per-row candidate ids, shape `(rows, k)` (`None`: all entities)."""
        return self._candidates.ids if self._candidates.ids is not None else self._candidates.static_ids

    @candidates.setter
    def candidates(self, value: torch.Tensor | None) -> None:
        if value is None:
            self._candidates.static_ids = self._candidates.static_scores = self._candidates.ids = None
            return
        self.set_candidates(value)

    def set_candidates(
        self,
        entity_ids: torch.Tensor,
        scores: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
    ) -> None:
        """
        Sets candidates for the current rows (the row order of the latest model forward), effective from the next
        processor call. `entity_ids`/`scores`: `(rows, k)`, or `(n, k)` with `rows` a boolean mask `(rows,)` or
        index tensor `(n,)` selecting the rows to update (dynamic entity linking: the rows whose last token is
        `<E_s>`). Before a generation starts (no state yet), sets the static candidates, `(rows|examples, k)`.
        """
        if self._rows.node is None and rows is None:
            self._set_static(entity_ids, scores)
            return
        ids, scores = self._candidates.check(entity_ids, scores)
        self._candidates.pending.append((ids, scores, None if rows is None else torch.as_tensor(rows)))

    def _set_static(self, entity_ids: torch.Tensor, scores: torch.Tensor | None) -> None:
        self._candidates.static_ids, self._candidates.static_scores = self._candidates.check(entity_ids, scores)

    def _group_size(self, rows: int) -> int:
        """Rows per example; 0 when unknown (rows may then be matched across examples)."""
        if self.group_size is not None:
            return int(self.group_size)
        static = self._candidates.static_ids
        if static is not None and rows % static.shape[0] == 0:
            return rows // static.shape[0]
        return 0

    # --- the step -----------------------------------------------------------------------------------------

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """`input_ids` `(rows, T)`, `scores` `(rows, V)` -> scores with disallowed tokens at `-inf`."""
        if self._state is None or not self._state.fits(scores):
            outside_excluded = None if self.start_token_id is None else self.end_token_id
            self._state = _DeviceState.build(self.trie, scores, self.dense_threshold, outside_excluded)
        trie = self._state.trie
        rows, device = input_ids.shape[0], scores.device
        candidates = self._candidates
        if not self._rows.continues(input_ids):  # a new generation
            self._rows.reset()
            self._rows.start(input_ids, trie)
            candidates.start(rows, device)
            self._log = []
        else:
            parents = self._rows.step(input_ids, trie, self._group_size(rows))
            if parents is not None:
                candidates.reorder(parents)
        if self.candidates_fn is not None:
            result = self.candidates_fn(input_ids)
            if result is not None:
                ids, cscores = result if isinstance(result, tuple) else (result, None)
                candidates.pending.append((*candidates.check(ids, cscores), None))
        if candidates.pending:
            candidates.apply_updates(rows, device)

        if self.start_token_id is not None and candidates.ids is not None:
            opened = input_ids[:, -1] == self.start_token_id
            if bool(opened.any()):  # for mentions(): (example, prefix, candidate ids, scores)
                idx = torch.nonzero(opened).flatten()
                group = self._group_size(rows)
                example = idx // group if group else torch.full_like(idx, -1)  # -1: example unknown
                self._log.append((example, input_ids[idx].clone(), candidates.ids[idx], candidates.scores[idx]))
        return self._mask(scores, self._rows.node, candidates.ids)

    def _mask(
        self, scores: torch.FloatTensor, node: torch.Tensor, candidate_ids: torch.Tensor | None
    ) -> torch.FloatTensor:
        """
        Scores `(rows, V)` with the tokens each row may not generate at -inf. A row in a span may generate the
        children of its node (or the next tokens of its candidates), the end token when none is left (closing the
        span), or, at a dense node, the tokens of the node's precomputed penalty row. Outside a span every token is
        allowed (but the end token in marker mode). No `(rows, V)` boolean `where` (several times slower on CPU
        when the mask is irregular); see `_write_sparse` and `_write_dense` for the two ways of writing.
        """
        state = self._state
        rows, vocab = scores.shape
        in_span = node != OUTSIDE
        arange = torch.arange(rows, device=scores.device)
        dense_slot = None
        if candidate_ids is not None:  # the next token of every candidate below the row's node
            token = state.trie.next_tokens(node, candidate_ids)
            pair_row = arange[:, None].expand_as(token)
            has_allowed = (token >= 0).any(-1)
        else:  # the children of the row's node, unless it is a dense node
            dense_slot = state.dense_slot(node)
            is_dense = dense_slot >= 0
            pair_row, token = state.trie.children(node.masked_fill(is_dense, -1))
            has_allowed = node >= 0
            if not bool(is_dense.any()):
                dense_slot = None
        close = in_span & ~has_allowed
        pair_row = torch.cat([pair_row.reshape(-1), arange])
        token = torch.cat([token.reshape(-1), torch.where(close, self.end_token_id, -1)])
        valid = (token >= 0) & (token < vocab)
        flat = torch.where(valid, pair_row * vocab + token, rows * vocab)  # rows * vocab: a spare element
        buffer = torch.empty(rows * vocab + 1, dtype=scores.dtype, device=scores.device)
        out = buffer[:-1].view(rows, vocab)
        if dense_slot is None:
            best = self._write_sparse(buffer, scores, in_span, flat, valid, pair_row)
        else:
            best = self._write_dense(buffer, scores, in_span, flat, dense_slot)
        # Rows whose allowed tokens all came in at -inf keep their scores (another processor decided).
        keep = in_span & (best == float("-inf"))
        if bool(keep.any()):
            keep_rows = torch.nonzero(keep).flatten()
            out.index_copy_(0, keep_rows, scores.index_select(0, keep_rows))
        return out

    def _write_sparse(
        self,
        buffer: torch.Tensor,
        scores: torch.FloatTensor,
        in_span: torch.Tensor,
        flat: torch.Tensor,
        valid: torch.Tensor,
        pair_row: torch.Tensor,
    ) -> torch.Tensor:
        """No row at a dense node: rows in a span are -inf but at their allowed tokens, the others are copied.
        One write pass over `(rows, V)`. Returns the best allowed score of every row `(rows,)`."""
        rows, vocab = scores.shape
        neg_inf = float("-inf")
        out = buffer[:-1].view(rows, vocab)
        values = scores.reshape(-1).take(flat.clamp(max=rows * vocab - 1)).masked_fill_(~valid, neg_inf)
        span_rows = torch.nonzero(in_span).flatten()
        if 2 * len(span_rows) < rows:  # the larger group is written whole, the other row by row
            out.copy_(scores)
            out.index_fill_(0, span_rows, neg_inf)
        else:
            buffer.fill_(neg_inf)
            free_rows = torch.nonzero(~in_span).flatten()
            out.index_copy_(0, free_rows, scores.index_select(0, free_rows))
        buffer.put_(flat, values)
        if self.start_token_id is not None and self.end_token_id < vocab:
            out[:, self.end_token_id].masked_fill_(~in_span, neg_inf)  # no end marker outside a span
        best = torch.full((rows,), neg_inf, dtype=scores.dtype, device=scores.device)
        return best.scatter_reduce_(0, pair_row, values, reduce="amax")

    def _write_dense(
        self,
        buffer: torch.Tensor,
        scores: torch.FloatTensor,
        in_span: torch.Tensor,
        flat: torch.Tensor,
        dense_slot: torch.Tensor,
    ) -> torch.Tensor:
        """Some row at a dense node: the scores plus an additive penalty `(rows, V)` gathered from precomputed
        rows (free rows; dense nodes; other rows in a span: -inf, with 0 then put at their allowed tokens). Two
        passes over `(rows, V)` whatever the mix of rows. Returns the best allowed score of every row `(rows,)`."""
        rows, vocab = scores.shape
        out = buffer[:-1].view(rows, vocab)
        slot = torch.where(dense_slot >= 0, dense_slot, torch.where(in_span, _CLOSED_SLOT, _FREE_SLOT))
        torch.index_select(self._state.penalty, 0, slot, out=out)
        buffer.put_(flat, buffer.new_zeros(()).expand(len(flat)))
        return out.add_(scores).amax(-1)

    # --- construction helpers ---------------------------------------------------------------------------

    @classmethod
    def from_strings(
        cls,
        strings: Sequence[str],
        tokenizer: Any,
        start_token_id: int | None = None,
        end_token_id: int | None = None,
        add_prefix_space: bool = False,
        add_special_tokens: bool = False,
        start_position: int | None = None,
        cache_dir: str | os.PathLike | None = None,
        **kwargs: Any,
    ) -> EntityConstrainedLogitsProcessor:
        """
        Constrains generation of any Transformers model to exactly one of `strings` (GENRE-style retrieval): the
        span starting at the end of the decoder prompt (or after each `start_token_id`) must be
        `tokenizer(string) + [end_token_id]` (`end_token_id` defaults to `tokenizer.eos_token_id`; with
        `add_special_tokens=True` the tokenizer's template, e.g. BART's `<s> ... </s>`, is used and nothing is
        appended).
        """
        strings = list(strings)
        if not strings:
            raise ValueError("from_strings: the list of strings is empty")
        if end_token_id is None:
            end_token_id = tokenizer.eos_token_id
            if end_token_id is None:
                raise ValueError("from_strings: the tokenizer has no eos token; pass end_token_id")
        trie = EntityTrie.build(
            strings,
            tokenizer,
            end_token_id=None if add_special_tokens else end_token_id,
            add_prefix_space=add_prefix_space,
            add_special_tokens=add_special_tokens,
            cache_dir=cache_dir,
        )
        return cls(
            trie, start_token_id=start_token_id, end_token_id=end_token_id, start_position=start_position, **kwargs
        )

    @classmethod
    def for_edmem(
        cls,
        trie_or_vocab: EntityTrie | EntityVocab | Sequence[str],
        tokenizer: Any,
        cache_dir: str | os.PathLike | None = None,
        **kwargs: Any,
    ) -> EntityConstrainedLogitsProcessor:
        """Marker mode with the tokenizer's `<E_s>`/`<E_e>` (a ValueError if it lacks them); names are
        tokenised with a leading space, as mentions appear in running text."""
        start_id, end_id = marker_token_ids(tokenizer)
        if isinstance(trie_or_vocab, EntityTrie):
            trie = trie_or_vocab
        else:
            trie = EntityTrie.build(trie_or_vocab, tokenizer, end_token_id=end_id, cache_dir=cache_dir)
        return cls(trie, start_token_id=start_id, end_token_id=end_id, **kwargs)

    # --- reporting --------------------------------------------------------------------------------------

    def mentions(
        self,
        sequences: torch.LongTensor,
        example_index: torch.Tensor | Sequence[int] | None = None,
        stop_token_ids: Collection[int] = (),
    ) -> list[list[EntityMention]]:
        """
        Parses returned sequences `(n, T)` into their spans. `example_index` `(n,)`: the example of each returned
        sequence (e.g. `arange(batch).repeat_interleave(num_return_sequences)`); needed to report candidates.
        `stop_token_ids` (e.g. EOS and padding) end an unclosed span (see `marked_spans`).
        """
        log_index: dict[tuple[int, tuple[int, ...]], tuple[list[int], list[float]]] = {}
        for example, prefixes, cands, cscores in self._log:
            for e, p, c, s in zip(example.tolist(), prefixes.tolist(), cands.tolist(), cscores.tolist()):
                log_index[(e, tuple(p))] = (c, s)
        span_start = self._rows.span_start
        starts = None  # marker mode: a span at every start token
        if self.start_token_id is None:  # position mode: the one span opens after the decoder prompt
            starts = [span_start - 1] if span_start is not None else []
        out = []
        for i, seq in enumerate(sequences.tolist()):
            found = []
            for s, end, closed in marked_spans(seq, self.start_token_id, self.end_token_id, starts, stop_token_ids):
                span = seq[s + 1 : end]
                cand_ids: list[int] = []
                cand_scores: list[float] = []
                if self.start_token_id is not None:
                    e = int(example_index[i]) if example_index is not None else -1
                    hit = log_index.get((e, tuple(seq[: s + 1]))) or log_index.get((-1, tuple(seq[: s + 1])))
                    if hit is not None:
                        cand_ids = [c for c in hit[0] if c >= 0]
                        cand_scores = [sc for c, sc in zip(*hit) if c >= 0]
                # A spelling several entities share names the candidate among them (the first one otherwise).
                spelled = self.trie.lookup_all(span + [self.end_token_id]) if closed else []
                entity = next((e for e in spelled if e in cand_ids), spelled[0] if spelled else -1)
                found.append(EntityMention(s, end, span, entity, cand_ids, cand_scores))
            out.append(found)
        return out

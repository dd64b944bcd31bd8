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


# The state of a row: a trie node id (>= 0) inside a span, or one of these.
OUTSIDE = -1  # not inside a constrained span
DEAD = -2  # inside a span whose prefix is not in the trie: only the end token is allowed

OfferKey = tuple[int | None, tuple[int, ...]]


@dataclass
class _Generation:
    """What the processor keeps of one generation: only what the rows' own tokens cannot tell.

    A row's place in the trie is not kept: each call derives it from the row's tokens (a walk from the root over the
    tokens of its current span, as GENRE's `trie.get(prefix)` does), so that beam search may reorder, drop and copy
    rows as it likes. What the tokens cannot tell:

    - `prompt` `(rows, P)`: the rows at the generation's first call. A later call belongs to the same generation if
      it has as many rows, one token more than the previous call (`length`), and its rows begin with these (beam
      search moves rows only among the beams of one example, which share their prompt).
    - `span_start`: position mode only: where the span starts (`start_position`, or the prompt's length).
    - `offers`: the candidates offered to a mention when it opened (dynamic linking), keyed by the row's example
      (`None` if unknown) and the row's tokens up to and including the token that opened the span. A row keeps
      that prefix wherever beam search moves it, so each call finds the candidates of a row's mention by it, and
      `mentions()` finds those of each returned sequence's mentions the same way. `offers` maps a key to a row of
      `offer_ids` / `offer_scores` `(offers, k)` (-1 padding).
    """

    prompt: torch.Tensor
    length: int
    span_start: int
    offers: dict[OfferKey, int] = field(default_factory=dict)
    offer_ids: torch.Tensor | None = None
    offer_scores: torch.Tensor | None = None

    def continued_by(self, input_ids: torch.LongTensor) -> bool:
        rows, length = input_ids.shape
        prompt_rows, prompt_length = self.prompt.shape
        return (
            rows == prompt_rows
            and length == self.length + 1
            and torch.equal(input_ids[:, :prompt_length], self.prompt)
        )

    def add_offers(self, keys: list[OfferKey], ids: torch.Tensor, scores: torch.Tensor) -> None:
        """Records `ids`/`scores` `(n, k)` as the offers of the `n` keys (a later offer for a key replaces it)."""
        if not keys:
            return
        if self.offer_ids is None:
            self.offer_ids, self.offer_scores = ids[:0], scores[:0]
        width = max(ids.shape[1], self.offer_ids.shape[1])
        self.offer_ids = torch.cat([_pad(self.offer_ids, width, -1), _pad(ids, width, -1)])
        self.offer_scores = torch.cat([_pad(self.offer_scores, width, 0.0), _pad(scores, width, 0.0)])
        first = self.offer_ids.shape[0] - len(keys)
        self.offers.update((key, first + i) for i, key in enumerate(keys))


def _pad(table: torch.Tensor, width: int, value: float) -> torch.Tensor:
    """`table` `(n, k)` widened to `(n, width)` with `value`."""
    if table.shape[1] == width:
        return table
    return torch.nn.functional.pad(table, (0, width - table.shape[1]), value=value)


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
    restricted to candidate entities. Vectorised over rows (batch x beams).

    Each call derives every row's place in the trie from the row's own tokens, so greedy search, sampling and beam
    search (which reorders rows between calls) need nothing more. What the tokens cannot tell is kept per
    generation in one place (`_Generation`): where the span starts in position mode, and the candidates offered to
    each mention when it opened.

    Args:
        trie (`EntityTrie`): the names (with their end token).
        start_token_id (`int`, *optional*): marker that opens a span (`<E_s>`). `None`: position mode.
        end_token_id (`int`, *optional*): token closing a span; defaults to `trie.end_token_id`.
        start_position (`int`, *optional*): position mode only: index in `input_ids` where the span starts;
            defaults to the length of `input_ids` at the first call of a generation (the decoder prompt).
        candidates (`torch.LongTensor` of shape `(examples, k)` or `(rows, k)`, *optional*): entity ids (`-1`
            padding) that every span of an example (of a row) may spell; `None` allows every entity of the trie.
        candidate_scores (`torch.FloatTensor` of the same shape, *optional*): only reported by `mentions()`.
        candidates_fn (`Callable`, *optional*): called as `candidates_fn(input_ids)` at every call; may return
            `None` or the candidates `(rows, k)` (or a tuple `(ids, scores)`) offered to the spans that the rows'
            newest tokens open (the entries of the other rows are ignored), as `set_candidates(..., rows=...)`.
        group_size (`int`, *optional*): rows per example (`num_beams` for beam search, `num_return_sequences`
            for sampling): offered candidates are keyed by example. Defaults to `rows // examples` when
            `candidates` has one row per example, else unknown (a mention is then known by its prefix alone).
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
        last_tokens = trie.seq_tokens[trie.seq_offsets[1:] - 1]
        if (last_tokens != self.end_token_id).any():
            raise ValueError(
                f"every sequence of the trie must end with the end token {self.end_token_id}; entity "
                f"{int(trie.order[(last_tokens != self.end_token_id).argmax()])} ends with "
                f"{int(last_tokens[(last_tokens != self.end_token_id).argmax()])} (build the trie with this end_token_id)"
            )
        self.start_position = start_position
        self.candidates_fn = candidates_fn
        self.group_size = group_size
        # A dense row costs a gather of V scores; the children of a sparse node cost about a dozen passes over them.
        self.dense_threshold = int(dense_threshold) if dense_threshold is not None else max(512, trie.vocab_size // 16)
        self._static_ids: torch.Tensor | None = None  # (examples or rows, k): the `candidates`
        self._static_scores: torch.Tensor | None = None
        if candidates is not None:
            self.set_candidates(candidates, candidate_scores)
        self._pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = []  # offers for the next call
        self._generation: _Generation | None = None
        self._state: _DeviceState | None = None

    # --- candidates ---------------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forgets the previous generation (done automatically when a new generation starts)."""
        self._generation = None
        self._pending = []

    @property
    def candidates(self) -> torch.Tensor | None:
        """The candidate ids of every example (or row), `(examples | rows, k)`; `None`: all entities."""
        return self._static_ids

    @candidates.setter
    def candidates(self, value: torch.Tensor | None) -> None:
        if value is None:
            self._static_ids = self._static_scores = None
            return
        self.set_candidates(value)

    def set_candidates(
        self,
        entity_ids: torch.Tensor,
        scores: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
    ) -> None:
        """
        Without `rows`: the candidates of every example (or row), `(examples | rows, k)`, as the `candidates`
        argument. With `rows`, a boolean mask `(rows,)` or an index tensor `(n,)`: offers `entity_ids`/`scores`
        `(n, k)` to the spans that the newest tokens of those rows open (dynamic entity linking: the rows whose
        last token is `<E_s>`), in the row order of the latest model forward, i.e. of the next processor call;
        rows whose newest token opens no span are ignored. An offered span may spell only its offer.
        """
        ids, scores = self._check(entity_ids, scores)
        if rows is None:
            self._static_ids, self._static_scores = ids, scores
        else:
            self._pending.append((ids, scores, torch.as_tensor(rows)))

    def _check(self, ids: torch.Tensor, scores: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
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

    def _group_size(self, rows: int) -> int:
        """Rows per example; 0 when unknown."""
        if self.group_size is not None:
            return int(self.group_size)
        static = self._static_ids
        if static is not None and rows % static.shape[0] == 0:
            return rows // static.shape[0]
        return 0

    # --- the step -----------------------------------------------------------------------------------------

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """`input_ids` `(rows, T)`, `scores` `(rows, V)` -> scores with disallowed tokens at `-inf`."""
        if self._state is None or not self._state.fits(scores):
            outside_excluded = None if self.start_token_id is None else self.end_token_id
            self._state = _DeviceState.build(self.trie, scores, self.dense_threshold, outside_excluded)
        generation = self._generation
        if generation is None or not generation.continued_by(input_ids):
            span_start = input_ids.shape[1] if self.start_position is None else int(self.start_position)
            generation = self._generation = _Generation(input_ids, input_ids.shape[1], span_start)
        generation.length = input_ids.shape[1]
        begin = self._span_begins(input_ids, generation)
        node = self._nodes(input_ids, begin)
        if self.candidates_fn is not None:
            result = self.candidates_fn(input_ids)
            if result is not None:
                ids, cscores = result if isinstance(result, tuple) else (result, None)
                self._pending.append((*self._check(ids, cscores), None))
        if self._pending:
            self._take_offers(input_ids, begin, generation)
        candidate_ids, unrestricted = self._row_candidates(input_ids, node, begin, generation)
        return self._mask(scores, node, candidate_ids, unrestricted)

    def _span_begins(self, input_ids: torch.LongTensor, generation: _Generation) -> torch.Tensor:
        """Position of the first token of each row's current span `(rows,)` (the length of `input_ids` if the span
        has no token yet), 0 for a row that never opened one: after its newest start token in marker mode, at
        `span_start` in position mode."""
        rows, length = input_ids.shape
        if self.start_token_id is None:
            return torch.full((rows,), generation.span_start, dtype=torch.long, device=input_ids.device)
        after = torch.arange(1, length + 1, device=input_ids.device)
        return torch.where(input_ids == self.start_token_id, after, 0).amax(1)

    def _nodes(self, input_ids: torch.LongTensor, begin: torch.Tensor) -> torch.Tensor:
        """The state of every row `(rows,)`, from its tokens: OUTSIDE if it has no span or its span holds the end
        token (which ends every sequence of the trie), else the node of the span's tokens, or DEAD if they left
        the trie. One vectorised trie step per token of the longest open span."""
        trie = self._state.trie
        length = input_ids.shape[1]
        after = torch.arange(1, length + 1, device=input_ids.device)
        last_end = torch.where(input_ids == self.end_token_id, after, 0).amax(1)  # position + 1, 0 if none
        opened = begin > 0 if self.start_token_id is not None else torch.ones_like(begin, dtype=torch.bool)
        walking = opened & (last_end <= begin)  # a span without an end token
        count = torch.where(walking, length - begin, 0)  # tokens of the open spans
        steps = min(int(count.max()), trie.max_depth)
        if steps == 0:
            return torch.where(walking, 0, OUTSIDE)
        node = trie.descend(input_ids[:, length - steps :], count.clamp(max=steps))
        in_trie = (node >= 0) & (count <= trie.max_depth)  # a longer open span has left the trie
        return torch.where(walking, torch.where(in_trie, node, DEAD), OUTSIDE)

    def _take_offers(self, input_ids: torch.LongTensor, begin: torch.Tensor, generation: _Generation) -> None:
        """Records the pending offers (`set_candidates(..., rows=...)`, `candidates_fn`) under the key of the span
        that each selected row's newest token opens (see `_Generation`)."""
        rows, length = input_ids.shape
        pending, self._pending = self._pending, []
        opening = begin == length
        group = self._group_size(rows)
        for ids, scores, which in pending:
            if which is None:
                if ids.shape[0] != rows:
                    raise ValueError(f"set_candidates: {ids.shape[0]} rows of candidates for {rows} rows")
                which = torch.arange(rows)
            elif which.dtype == torch.bool:
                which = torch.nonzero(which).flatten()
            if len(which) != ids.shape[0]:
                raise ValueError(f"set_candidates: {ids.shape[0]} rows of candidates for {len(which)} selected rows")
            which = which.to(input_ids.device)
            keep = opening.index_select(0, which)
            selected = which[keep].tolist()
            keys = [
                (row // group if group else None, tuple(prefix))
                for row, prefix in zip(selected, input_ids[selected].tolist())
            ]
            keep = keep.to(ids.device)
            generation.add_offers(keys, ids[keep].to(input_ids.device), scores[keep].to(input_ids.device))

    def _row_candidates(
        self, input_ids: torch.LongTensor, node: torch.Tensor, begin: torch.Tensor, generation: _Generation
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The candidates of every row's span `(rows, k)` (-1 padding), or None if no row has any; and which rows
        have none (they may spell any entity) `(rows,)`, or None if every row has some. A span's candidates are
        those offered when it opened, else those of its example (`candidates`)."""
        rows = input_ids.shape[0]
        device = input_ids.device
        ids = None
        if self._static_ids is not None:
            examples = self._static_ids.shape[0]
            if rows % examples:
                raise ValueError(f"{examples} rows of candidates do not divide {rows} generation rows")
            ids = self._static_ids.to(device).repeat_interleave(rows // examples, dim=0)
        if not generation.offers:
            return ids, None
        in_trie = torch.nonzero(node >= 0).flatten().tolist()
        group = self._group_size(rows)
        found, offer = [], []
        for row, prefix, start in zip(in_trie, input_ids[in_trie].tolist(), begin[in_trie].tolist()):
            key = tuple(prefix[:start])
            index = generation.offers.get((row // group if group else None, key))
            if index is None:
                index = generation.offers.get((None, key))
            if index is not None:
                found.append(row)
                offer.append(index)
        if not found:
            return ids, None
        offered = generation.offer_ids.index_select(0, torch.tensor(offer, device=device))
        width = max(offered.shape[1], 0 if ids is None else ids.shape[1])
        ids = torch.full((rows, width), -1, dtype=torch.long, device=device) if ids is None else _pad(ids, width, -1)
        found = torch.tensor(found, device=device)
        ids = ids.index_copy(0, found, _pad(offered, width, -1))
        if self._static_ids is not None:
            return ids, None
        unrestricted = torch.ones(rows, dtype=torch.bool, device=device).index_fill_(0, found, False)
        return ids, unrestricted

    def _mask(
        self,
        scores: torch.FloatTensor,
        node: torch.Tensor,
        candidate_ids: torch.Tensor | None,
        unrestricted: torch.Tensor | None,
    ) -> torch.FloatTensor:
        """
        Scores `(rows, V)` with the tokens each row may not generate at -inf. A row in a span may generate the
        next tokens of its candidates below its node (any child of the node if it has no candidates; at a dense
        node, the tokens of the node's precomputed penalty row), or the end token when nothing is left (closing the
        span). Outside a span every token is allowed (but the end token in marker mode). `unrestricted` `(rows,)`:
        the rows without candidates when others have some. No `(rows, V)` boolean `where` (several times slower on
        CPU when the mask is irregular); see `_write_sparse` and `_write_dense` for the two ways of writing.
        """
        state = self._state
        rows, vocab = scores.shape
        in_span = node != OUTSIDE
        arange = torch.arange(rows, device=scores.device)
        dense_slot = None
        if candidate_ids is not None:  # the next token of every candidate below the row's node
            token = state.trie.next_tokens(node, candidate_ids)
            pair_row = arange[:, None].expand_as(token).reshape(-1)
            has_allowed = (token >= 0).any(-1)
            token = token.reshape(-1)
            if unrestricted is not None:  # and every child for the rows without candidates
                free_row, free_token = state.trie.children(node.masked_fill(~unrestricted, -1))
                pair_row, token = torch.cat([pair_row, free_row]), torch.cat([token, free_token])
                has_allowed |= unrestricted & (node >= 0)
        else:  # the children of the row's node, unless it is a dense node
            dense_slot = state.dense_slot(node)
            is_dense = dense_slot >= 0
            pair_row, token = state.trie.children(node.masked_fill(is_dense, -1))
            has_allowed = node >= 0
            if not bool(is_dense.any()):
                dense_slot = None
        close = in_span & ~has_allowed
        pair_row = torch.cat([pair_row, arange])
        token = torch.cat([token, torch.where(close, self.end_token_id, -1)])
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
        generation = self._generation
        span_start = generation.span_start if generation is not None else None
        starts = None  # marker mode: a span at every start token
        if self.start_token_id is None:  # position mode: the one span opens after the decoder prompt
            starts = [span_start - 1] if span_start is not None else []
        examples = int(max(example_index)) + 1 if example_index is not None and len(example_index) else 0
        out = []
        for i, seq in enumerate(sequences.tolist()):
            example = int(example_index[i]) if example_index is not None else None
            found = []
            for s, end, closed in marked_spans(seq, self.start_token_id, self.end_token_id, starts, stop_token_ids):
                span = seq[s + 1 : end]
                cand_ids, cand_scores = self._reported_candidates(generation, example, examples, seq[: s + 1])
                # A spelling several entities share names the candidate among them (the first one otherwise).
                spelled = self.trie.lookup_all(span + [self.end_token_id]) if closed else []
                entity = next((e for e in spelled if e in cand_ids), spelled[0] if spelled else -1)
                found.append(EntityMention(s, end, span, entity, cand_ids, cand_scores))
            out.append(found)
        return out

    def _reported_candidates(
        self, generation: _Generation | None, example: int | None, examples: int, prefix: list[int]
    ) -> tuple[list[int], list[float]]:
        """The candidates of the span opened by the last token of `prefix`, in a sequence of `example` (of
        `examples`): those offered when it opened, else the example's `candidates`; empty if neither is known."""
        ids = scores = None
        if generation is not None and generation.offers:
            key = tuple(prefix)
            index = generation.offers.get((example, key), generation.offers.get((None, key)))
            if index is not None:
                ids, scores = generation.offer_ids[index], generation.offer_scores[index]
        static = self._static_ids
        if ids is None and static is not None:
            if len(static) == 1:
                ids, scores = static[0], self._static_scores[0]
            elif example is not None and len(static) % examples == 0:
                row = example * (len(static) // examples)  # the example's (first) row
                ids, scores = static[row], self._static_scores[row]
        if ids is None:
            return [], []
        keep = ids >= 0
        return ids[keep].tolist(), scores[keep].tolist()

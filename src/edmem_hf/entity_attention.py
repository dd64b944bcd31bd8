"""Softmax attention of mention queries over an entity table too large for an `(M, N)` score matrix.

`dense_entity_attention` is the reference formula; `entity_attention` computes it in chunks, tested equal. Both
take `WrittenRows`: rows that stand in for some entities' table rows (rows written from text by
`entity_writer.EntityRowWriter`), read beside the table without a copy of it. `EntityTable` is the table with the
written rows a saved model keeps beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
from torch import nn

from .configuration_edmem import IGNORE_INDEX

# Scores held at once by the top-k search (64 MB of float32): few queries (generation) search in larger chunks.
TOP_K_SCORE_BUDGET = 1 << 24


@dataclass(frozen=True)
class WrittenRows:
    """Rows that replace the table rows of some entities in one forward pass: `ids` `(K,)` entity ids, `rows`
    `(K, d)` their rows (written from text, with gradients in training). The table itself is not touched. An entity
    mask hides table rows: a written row is read (and its entity predicted) even where its table row is hidden.

    An id given more than once has several rows, each read on its own: the attention spreads over every row, and
    the entity's score (the linking loss's gold) is the log-sum-exp of its rows' scores (TOME's memory holds mentions,
    several an entity). With `mean_probability`, an entity of n rows is given the mean of its rows' probabilities
    rather than their sum (each row's score less log n), so that its number of rows buys it nothing
    (`EDMemConfig.writer_mean_row_probability`).

    `gold_rows`, `read_at_mentions` and `in_decoder` are where a training batch's rows may say more (which of an
    entity's rows are its gold, rows handed to mentions: `research.writer_batches.TrainingWrittenRows`); here they
    change nothing.
    """

    ids: torch.Tensor
    rows: torch.Tensor
    mean_probability: bool = False

    def row_score_offsets(self) -> torch.Tensor | None:
        """`(K,)`: what each row's score is offset by, `-log(rows of its entity)` with `mean_probability`, or None."""
        if not self.mean_probability:
            return None
        _, owner, counts = self.ids.unique(return_inverse=True, return_counts=True)
        return -counts[owner].float().log()

    def followed_by(self, ids: torch.Tensor, rows: torch.Tensor) -> WrittenRows:
        """These rows, then `rows` `(R, d)` of the entities `ids` `(R,)`."""
        return replace(self, ids=torch.cat([self.ids, ids.to(self.ids.device)]),
                       rows=torch.cat([self.rows, rows.to(self.rows)]))  # fmt: skip

    def gold_rows(self, positions: torch.Tensor) -> torch.Tensor | None:
        """`(M, K)` bool or None: for the mentions at `positions` `(M, 2)` (batch, position), which of their gold
        entity's rows make its score (None: all of them)."""
        return None

    def read_at_mentions(
        self, read: torch.Tensor, queries: torch.Tensor, mention_mask: torch.Tensor, labels: torch.Tensor | None
    ) -> torch.Tensor:
        """The read `(M, d)` at the mentions of `mention_mask` `(batch, seq)`, whose `queries` are `(M, d)` and
        `labels` `(batch, seq)` (or None): the memory's read itself."""
        return read

    def in_decoder(self) -> WrittenRows:
        """The rows as the decoder's memory reads them."""
        return self


class EntityTable(nn.Embedding):
    """The entity table `(entity_vocab_size, entity_embed_dim)`, and the written rows it keeps beside it: the buffers
    `written_rows` `(R, entity_embed_dim)` and `written_row_entity_ids` `(R,)` (`config.written_entity_rows` = R), each
    read as a row of its entity in place of the entity's table row, each on its own (`entity_growth.add_entities` with
    `rows_apart`)."""

    def __init__(self, num_entities: int, dim: int, kept_rows: int = 0):
        super().__init__(num_entities, dim)
        if kept_rows:
            self.register_buffer("written_rows", torch.zeros(kept_rows, dim))
            self.register_buffer("written_row_entity_ids", torch.zeros(kept_rows, dtype=torch.long))

    @classmethod
    def for_config(cls, config) -> EntityTable:
        """The table of an `EDMemConfig`, with room for its `written_entity_rows` kept rows."""
        return cls(config.entity_vocab_size, config.entity_embed_dim, config.written_entity_rows)

    def keep_rows(self, entity_ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Makes `rows` `(R, d)` the rows kept for the entities `entity_ids` `(R,)`, after those of the others."""
        device = self.weight.device
        entity_ids, rows = entity_ids.to(device), rows.to(device=device, dtype=torch.float32)
        if getattr(self, "written_rows", None) is None:
            self.register_buffer("written_rows", rows)
            self.register_buffer("written_row_entity_ids", entity_ids)
        else:
            others = ~torch.isin(self.written_row_entity_ids, entity_ids)
            self.written_rows = torch.cat([self.written_rows[others], rows])
            self.written_row_entity_ids = torch.cat([self.written_row_entity_ids[others], entity_ids])

    def rows_read(
        self, written_rows: WrittenRows | None, entity_mask: torch.Tensor | None, mean_probability: bool
    ) -> WrittenRows | None:
        """A batch's `written_rows` (or none) followed by the rows kept here: those of hidden entities, and of
        entities the batch writes rows of (which stand in for all of their rows), left out; all scored as
        `mean_probability` says (set here alone: every memory read and linking passes through)."""
        ids = getattr(self, "written_row_entity_ids", None)
        if written_rows is not None:
            written_rows = replace(written_rows, mean_probability=mean_probability)
        if ids is None or ids.numel() == 0:
            return written_rows
        rows = self.written_rows.to(self.weight.dtype)
        shown = torch.ones_like(ids, dtype=torch.bool) if entity_mask is None else entity_mask.to(ids.device)[ids]
        if written_rows is not None:
            shown &= ~torch.isin(ids, written_rows.ids.to(ids.device))
        if written_rows is None:
            return WrittenRows(ids[shown], rows[shown], mean_probability)
        return written_rows.followed_by(ids[shown], rows[shown])


def dense_entity_attention(
    queries: torch.Tensor,
    table: torch.Tensor,
    entity_mask: torch.Tensor | None = None,
    written_rows: WrittenRows | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The textbook formula with a full score matrix: the reference that `entity_attention` must equal.

    Returns the read `softmax(q E^T) E` `(M, d)` and the log-partition `logsumexp(q E^T)` `(M,)`, where `E` is the
    table without the rows of `written_rows.ids`, followed by the written rows (shown whatever `entity_mask` says),
    each written row's score offset by `written_rows.row_score_offsets()` where it has any.
    """
    shown = torch.ones(table.shape[0], dtype=torch.bool, device=table.device) if entity_mask is None else entity_mask
    offsets = torch.zeros(table.shape[0], device=table.device)
    if written_rows is not None:
        shown = shown.index_fill(0, written_rows.ids, False)
        table = torch.cat([table, written_rows.rows.to(table.dtype)])
        shown = torch.cat([shown, shown.new_ones(written_rows.ids.shape[0])])
        row_offsets = written_rows.row_score_offsets()
        row_offsets = torch.zeros(written_rows.ids.shape[0]) if row_offsets is None else row_offsets
        offsets = torch.cat([offsets, row_offsets.to(offsets.device)])
    scores = ((queries @ table.t()).float() + offsets).masked_fill(~shown, float("-inf"))
    read = torch.softmax(scores, dim=-1) @ table.float()
    return read.to(queries.dtype), torch.logsumexp(scores, dim=-1)


class EntityAttentionResult(NamedTuple):
    """What `entity_attention` returns; fields are None when not asked for."""

    read: torch.Tensor | None
    log_partition: torch.Tensor | None
    nll: torch.Tensor | None
    top_ids: torch.Tensor | None
    top_scores: torch.Tensor | None


def entity_attention(
    queries: torch.Tensor,
    table: torch.Tensor,
    *,
    labels: torch.Tensor | None = None,
    entity_mask: torch.Tensor | None = None,
    top_k: int | None = None,
    chunk_size: int = 16384,
    compute_read: bool = True,
    return_top_k: int | None = None,
    index=None,
    written_rows: WrittenRows | None = None,
    gold_rows: torch.Tensor | None = None,
) -> EntityAttentionResult:
    """Softmax attention of queries over the entity table (equations 1-2 of the paper, before `W_out`).

    Args:
        queries: `(M, d)` projected hidden states (`W_in h`), one per mention.
        table: `(N, d)` entity embeddings.
        labels: optional `(M,)` gold entity ids (-100 for none): also return the entity-linking NLL
            `logsumexp_i s_i - s_gold` over the whole table, whatever `top_k` is.
        entity_mask: optional `(N,)` bool, False hides an entity from the attention.
        top_k: read the `top_k` best-scoring entities only (inference); `None` attends to all N.
        chunk_size: entities scored at a time over the whole table.
        compute_read: whether to compute the read (the entity-linking head only needs scores).
        return_top_k: also return the ids and raw scores of the best `return_top_k` entities.
        index: an `EntityIndex` (entity_index.py) to find the top-k with when gradients are disabled.
        written_rows: rows read in place of their ids' table rows (`_attention_with_written_rows`); None or none at
            all: the table alone, by the code below.
        gold_rows: optional `(M, K)` bool over `written_rows`: where a query's gold entity has rows among them, its
            gold score is theirs alone (the log-sum-exp of those rows' scores); elsewhere all of its rows'.

    Returns:
        `EntityAttentionResult(read (M, d), log_partition (M,), nll (M_labelled,), top_ids, top_scores (M, k))`.
        `nll` holds the labelled rows only, in order.
    """
    if written_rows is not None and written_rows.ids.numel():
        return _attention_with_written_rows(
            queries,
            table,
            written_rows,
            labels,
            entity_mask,
            top_k,
            chunk_size,
            compute_read,
            return_top_k,
            index,
            gold_rows,
        )
    num_entities = table.shape[0]
    top_ids = top_scores = None
    k_needed = max(top_k or 0, return_top_k or 0)
    if k_needed:
        use_index = index is not None and not torch.is_grad_enabled()  # never in training
        k = min(k_needed, num_entities)
        with torch.no_grad():
            if use_index:
                top_scores, top_ids = index.search(queries, table, k, entity_mask)
            else:
                top_scores, top_ids = chunked_top_k(queries, table, k, entity_mask, chunk_size)

    gold = torch.full((queries.shape[0],), -1, dtype=torch.long, device=queries.device)
    if labels is not None:
        gold = torch.where(labels == IGNORE_INDEX, gold, labels)
        if entity_mask is not None:  # a hidden entity cannot be predicted: no loss
            gold = torch.where(entity_mask[gold.clamp_min(0)], gold, -1)
    read = log_partition = nll = None
    full_read = compute_read and (top_k is None or top_k >= num_entities)
    if full_read or labels is not None:
        # One pass over the table gives the read (when attending to all), the log-partition and the gold scores.
        read, log_partition, gold_scores = _ChunkedEntityAttention.apply(
            queries, table, gold, entity_mask, chunk_size, full_read
        )
        read = read if full_read else None
        if labels is not None:
            labelled = gold >= 0
            nll = log_partition[labelled] - gold_scores[labelled]
    if compute_read and not full_read:
        ids = top_ids[:, :top_k]
        candidates = table[ids]  # (M, k, d)
        scores = torch.einsum("md,mkd->mk", queries.to(table.dtype), candidates).float()
        if entity_mask is not None:
            scores = scores.masked_fill(~entity_mask[ids], float("-inf"))
        weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        read = torch.einsum("mk,mkd->md", weights, candidates.float()).to(queries.dtype)
    if return_top_k:
        top_ids, top_scores = top_ids[:, :return_top_k], top_scores[:, :return_top_k]
    else:
        top_ids = top_scores = None
    return EntityAttentionResult(read, log_partition, nll, top_ids, top_scores)


def _attention_with_written_rows(
    queries: torch.Tensor,
    table: torch.Tensor,
    written: WrittenRows,
    labels: torch.Tensor | None,
    entity_mask: torch.Tensor | None,
    top_k: int | None,
    chunk_size: int,
    compute_read: bool,
    return_top_k: int | None,
    index,
    gold_rows: torch.Tensor | None = None,
) -> EntityAttentionResult:
    """`entity_attention` over the table with `written.rows` in place of the rows `written.ids`, as
    `dense_entity_attention(..., written_rows=written)` computes it: the table's pass (chunked, those rows masked out
    of it) and a dense pass over the K written rows, merged by their log-partitions. Nothing of size `(N, d)` is
    built: one `(N,)` mask, and `(M, K)` scores."""
    ids, rows = written.ids.to(table.device), written.rows.to(table.dtype)
    num_entities = table.shape[0]
    replaced = torch.zeros(num_entities, dtype=torch.bool, device=table.device)
    replaced[ids] = True
    table_mask = ~replaced if entity_mask is None else entity_mask & ~replaced
    written_scores = (queries.to(rows.dtype) @ rows.t()).float()  # (M, K), every written row shown
    offsets = written.row_score_offsets()
    if offsets is not None:
        written_scores = written_scores + offsets.to(written_scores.device)

    top_ids = top_scores = None
    k_needed = max(top_k or 0, return_top_k or 0)
    if k_needed:
        k = min(k_needed, num_entities)
        with torch.no_grad():
            if index is not None and not torch.is_grad_enabled():
                top_scores, top_ids = index.search(queries, table, k, table_mask)
            else:
                top_scores, top_ids = chunked_top_k(queries, table, k, table_mask, chunk_size)
            best_written, slots = written_scores.topk(min(k, ids.shape[0]), dim=1)
            top_scores, order = torch.cat([top_scores, best_written], dim=1).topk(k, dim=1)
            top_slots = torch.cat([torch.full_like(top_ids, -1), slots], dim=1).gather(1, order)  # -1: a table row
            top_ids = torch.cat([top_ids, ids[slots]], dim=1).gather(1, order)

    gold = torch.full((queries.shape[0],), -1, dtype=torch.long, device=queries.device)
    if labels is not None:
        gold = torch.where(labels == IGNORE_INDEX, gold, labels)
    gold_slot = _slots(gold, ids)  # (M,) the gold's written row, -1 when it has none
    if entity_mask is not None:  # a hidden entity without a written row cannot be predicted: no loss
        gold = torch.where(entity_mask[gold.clamp_min(0)] | (gold_slot >= 0), gold, -1)
    read = log_partition = nll = None
    full_read = compute_read and (top_k is None or top_k >= num_entities)
    if full_read or labels is not None:
        table_read, table_lse, table_gold = _ChunkedEntityAttention.apply(
            queries, table, torch.where(gold_slot >= 0, -1, gold), table_mask, chunk_size, full_read
        )
        written_lse = torch.logsumexp(written_scores, dim=-1)
        log_partition = torch.logaddexp(table_lse, written_lse)
        finite = torch.where(torch.isfinite(log_partition), log_partition, torch.zeros_like(log_partition))
        if full_read:
            written_probs = (written_scores - finite[:, None]).exp()
            table_share = (table_lse - finite).exp()[:, None]
            read = (table_share * table_read.float() + written_probs @ rows.float()).to(queries.dtype)
        if labels is not None:
            written_gold = _written_gold_scores(written_scores, ids, gold, gold_rows)
            gold_scores = torch.where(gold_slot >= 0, written_gold, table_gold)
            labelled = gold >= 0
            nll = log_partition[labelled] - gold_scores[labelled]
    if compute_read and not full_read:
        candidate_ids, slots = top_ids[:, :top_k], top_slots[:, :top_k]
        candidates = torch.where((slots >= 0)[..., None], rows[slots.clamp_min(0)], table[candidate_ids])
        scores = torch.einsum("md,mkd->mk", queries.to(table.dtype), candidates).float()
        if offsets is not None:
            scores = scores + torch.where(slots >= 0, offsets.to(scores.device)[slots.clamp_min(0)], 0.0)
        visible = torch.where(slots >= 0, True, table_mask[candidate_ids])
        scores = scores.masked_fill(~visible, float("-inf"))
        weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        read = torch.einsum("mk,mkd->md", weights, candidates.float()).to(queries.dtype)
    if return_top_k:
        top_ids, top_scores = top_ids[:, :return_top_k], top_scores[:, :return_top_k]
    else:
        top_ids = top_scores = None
    return EntityAttentionResult(read, log_partition, nll, top_ids, top_scores)


def _written_gold_scores(
    written_scores: torch.Tensor, ids: torch.Tensor, gold: torch.Tensor, gold_rows: torch.Tensor | None = None
) -> torch.Tensor:
    """`(M,)`: each query's score of its `gold` entity's written rows, from `written_scores` `(M, K)` of the rows
    `ids` `(K,)`: the log-sum-exp over them when an entity has several (-inf where the gold has none); only over
    those of `gold_rows` `(M, K)` where the gold has any there."""
    own = ids[None, :] == gold[:, None]
    if gold_rows is not None:
        chosen = own & gold_rows.to(own.device)
        own = torch.where(chosen.any(-1, keepdim=True), chosen, own)
    return written_scores.masked_fill(~own, float("-inf")).logsumexp(-1)


def _slots(entity_ids: torch.Tensor, written_ids: torch.Tensor) -> torch.Tensor:
    """For each of `entity_ids` (any shape), its position in `written_ids`, or -1 (negative ids give -1)."""
    match = entity_ids[..., None] == written_ids
    return torch.where(match.any(-1), match.int().argmax(-1), -1)


def chunked_top_k(
    queries: torch.Tensor,
    table: torch.Tensor,
    k: int,
    entity_mask: torch.Tensor | None = None,
    chunk_size: int = 16384,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The `k` best float32 scores `(M, k)` and their entity ids `(M, k)`, best first, one chunk at a time.

    Few queries (generation) search the table in larger chunks: up to `TOP_K_SCORE_BUDGET` scores at once.
    """
    chunk_size = max(chunk_size, TOP_K_SCORE_BUDGET // max(queries.shape[0], 1))
    best_scores = best_ids = None
    for start in range(0, table.shape[0], chunk_size):
        mask_chunk = entity_mask[start : start + chunk_size] if entity_mask is not None else None
        scores = _chunk_scores(queries, table[start : start + chunk_size], mask_chunk)
        scores, ids = scores.topk(min(k, scores.shape[1]), dim=1)
        ids = ids + start
        if best_scores is not None:
            scores = torch.cat([best_scores, scores], dim=1)
            scores, order = scores.topk(min(k, scores.shape[1]), dim=1)
            ids = torch.cat([best_ids, ids], dim=1).gather(1, order)
        best_scores, best_ids = scores, ids
    return best_scores, best_ids


def _chunk_scores(queries: torch.Tensor, table_chunk: torch.Tensor, mask_chunk: torch.Tensor | None) -> torch.Tensor:
    """Dot-product scores of `(M, d)` queries against a `(C, d)` slice of the table, as float32 `(M, C)`."""
    scores = (queries.to(table_chunk.dtype) @ table_chunk.t()).float()
    if mask_chunk is not None:
        scores = scores.masked_fill(~mask_chunk, float("-inf"))
    return scores


class _ChunkedEntityAttention(torch.autograd.Function):
    """Softmax attention of M queries over all N entities, without an `(M, N)` matrix.

    Forward returns the read `sum_i alpha_i e_i` `(M, d)`, the log-partition `logsumexp_i s_i` `(M,)` and the
    gold entity's score `s_gold` `(M,)`, computed with a running log-sum-exp over chunks of the table. Backward
    recomputes each chunk's scores. Peak extra memory is a few `(M, chunk)` float32 blocks and one table-sized
    gradient, instead of several `(M, N)` matrices; the price is one extra `(M, N, d)` product. Softmax arithmetic
    is float32 whatever the table's dtype.
    """

    @staticmethod
    def forward(ctx, queries, table, gold, entity_mask, chunk_size, compute_read):
        num_queries, dim = queries.shape
        device = queries.device
        running_max = torch.full((num_queries,), float("-inf"), device=device)
        running_sum = torch.zeros(num_queries, device=device)
        read = torch.zeros(num_queries, dim, device=device) if compute_read else None
        for start in range(0, table.shape[0], chunk_size):
            chunk = table[start : start + chunk_size]
            mask_chunk = entity_mask[start : start + chunk_size] if entity_mask is not None else None
            scores = _chunk_scores(queries, chunk, mask_chunk)
            new_max = torch.maximum(running_max, scores.amax(dim=1))
            safe_max = torch.where(torch.isfinite(new_max), new_max, torch.zeros_like(new_max))
            rescale = torch.exp(running_max - safe_max)
            probs = scores.sub_(safe_max[:, None]).exp_()
            running_sum = running_sum * rescale + probs.sum(dim=1)
            if compute_read:
                read = torch.addmm(read * rescale[:, None], probs, chunk.float())
            running_max = new_max
        empty = running_sum == 0  # every entity masked: nothing to read
        log_partition = torch.where(
            empty, torch.full_like(running_max, float("-inf")), running_max + running_sum.log()
        )
        if compute_read:
            read = torch.where(empty[:, None], torch.zeros_like(read), read / running_sum.clamp_min(1e-30)[:, None])
        has_gold = gold >= 0
        gold_rows = table[gold.clamp_min(0)]
        gold_scores = torch.where(has_gold, (queries.to(table.dtype) * gold_rows).sum(-1).float(), 0.0)
        ctx.save_for_backward(
            queries, table, gold, log_partition, read if compute_read else log_partition, entity_mask
        )
        ctx.chunk_size = chunk_size
        ctx.compute_read = compute_read
        out_read = read.to(queries.dtype) if compute_read else queries.new_zeros(num_queries, dim)
        return out_read, log_partition, gold_scores

    @staticmethod
    def backward(ctx, grad_read, grad_log_partition, grad_gold_scores):
        queries, table, gold, log_partition, read, entity_mask = ctx.saved_tensors
        chunk_size = ctx.chunk_size
        use_read = ctx.compute_read and grad_read is not None
        queries_f = queries.float()
        finite = torch.isfinite(log_partition)
        finite_lp = torch.where(finite, log_partition, torch.zeros_like(log_partition))
        grad_queries = torch.zeros_like(queries_f)
        grad_table = torch.zeros(table.shape, dtype=torch.float32, device=table.device)
        if use_read:
            grad_read = grad_read.float()
            grad_dot_read = (grad_read * read).sum(dim=1)
            # rows whose every entity is masked read a constant zero
            grad_read = grad_read * finite[:, None]
        if grad_log_partition is not None:
            grad_log_partition = torch.where(finite, grad_log_partition.float(), 0.0)
        for start in range(0, table.shape[0], chunk_size):
            chunk = table[start : start + chunk_size]
            chunk_f = chunk.float()
            mask_chunk = entity_mask[start : start + chunk_size] if entity_mask is not None else None
            probs = _chunk_scores(queries, chunk, mask_chunk).sub_(finite_lp[:, None]).exp_()
            if use_read:
                # d read / d s_j = p_j (e_j - read): grad_s = p * (g e_j - g . read)
                grad_scores = (grad_read @ chunk_f.t()).sub_(grad_dot_read[:, None]).mul_(probs)
                if grad_log_partition is not None:
                    grad_scores.addcmul_(probs, grad_log_partition[:, None])
            elif grad_log_partition is not None:
                grad_scores = probs.mul_(grad_log_partition[:, None])
            else:
                continue
            grad_queries.addmm_(grad_scores, chunk_f)
            grad_chunk = grad_scores.t() @ queries_f
            if use_read:
                grad_chunk.addmm_(probs.t(), grad_read)
            grad_table[start : start + chunk_size] = grad_chunk
        if grad_gold_scores is not None:
            has_gold = gold >= 0
            gold_ids = gold[has_gold]
            grad_gold = grad_gold_scores.float()[has_gold][:, None]
            grad_queries[has_gold] += grad_gold * table[gold_ids].float()
            grad_table.index_add_(0, gold_ids, grad_gold * queries_f[has_gold])
        return grad_queries.to(queries.dtype), grad_table.to(table.dtype), None, None, None, None


__all__ = [
    "EntityAttentionResult",
    "WrittenRows",
    "chunked_top_k",
    "dense_entity_attention",
    "entity_attention",
    "EntityTable",
]

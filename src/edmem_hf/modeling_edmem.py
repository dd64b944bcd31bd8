"""PyTorch EDMem: an encoder-decoder with an entity memory (Zhang et al., EMNLP 2022).

The encoder and the decoder are BART stacks split into lower and upper layers. At every `<E_s>` token the
hidden state leaving the lower layers queries a table of entity embeddings by softmax attention, and the projected
read is added to the hidden state and layer-normed before the upper layers. An entity-linking head on the final
decoder states predicts the entity of each `<E_s>`.

This file is copied to the Hub as custom code: it imports Transformers and, relatively, the other flat files of
this package, and nothing else of ours.
"""

from __future__ import annotations

import math
import os
import weakref
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.generation import GenerationConfig, GenerationMixin, LogitsProcessorList
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_outputs import BaseModelOutput, ModelOutput
from transformers.modeling_utils import PreTrainedModel
from transformers.models.bart.modeling_bart import (
    BartAttention,
    BartDecoderLayer,
    BartEncoderLayer,
    BartLearnedPositionalEmbedding,
    BartScaledWordEmbedding,
    shift_tokens_right,
)
from transformers.utils import logging
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_edmem import EDMemConfig
from .entity_decoding import EntityConstrainedLogitsProcessor, EntityMention, EntityTrie, marker_token_ids
from .entity_vocab import ENTITY_VOCAB_NAME, EntityVocab

logger = logging.get_logger(__name__)

IGNORE_INDEX = -100
ENTITY_DECODING_MODES = ("free", "static", "dynamic")
# Batch fields that supervise training and mean nothing to generate() (Seq2SeqTrainer passes them through).
TRAINING_ONLY_FIELDS = ("labels", "entity_labels", "decoder_entity_labels")


# ---------------------------------------------------------------------------------------------------------------
# Attention over the entity table
# ---------------------------------------------------------------------------------------------------------------


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
    low_precision_search: bool = False,
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
        low_precision_search: find the top-k of a large float32 table through a bfloat16 copy, re-scored in float32
            (same entities; inference: the copy is kept until the table changes).

    Returns:
        `EntityAttentionResult(read (M, d), log_partition (M,), nll (M_labelled,), top_ids, top_scores (M, k))`.
        `nll` holds the labelled rows only, in order.
    """
    num_entities = table.shape[0]
    top_ids = top_scores = None
    k_needed = max(top_k or 0, return_top_k or 0)
    if k_needed:
        with torch.no_grad():
            top_scores, top_ids = _chunked_top_k(
                queries, table, entity_mask, min(k_needed, num_entities), chunk_size, low_precision_search
            )

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


_TOP_K_SCORE_BUDGET = 1 << 24  # scores held at once by the top-k search (64 MB of float32)
# Tables of at least this many float32 rows are searched at inference through a bfloat16 copy (half the bytes to
# read, AMX/AVX-512 bf16 kernels) and the shortlist is re-scored in float32, with a proof that nothing was missed.
LOW_PRECISION_SEARCH_MIN_ENTITIES = 1 << 17
_SEARCH_COPIES: dict[int, tuple] = {}  # id(table) -> (weakref to table, table._version, bf16 copy, max row norm)


def _search_copy(table: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The bfloat16 copy of `table` and its largest row norm, rebuilt when the table changes in place."""
    key = id(table)
    cached = _SEARCH_COPIES.get(key)
    if cached is not None and cached[0]() is table and cached[1] == table._version:
        return cached[2], cached[3]
    copy = table.detach().to(torch.bfloat16)
    max_norm = float(torch.linalg.vector_norm(table.detach(), dim=1).max())
    try:
        ref = weakref.ref(table, lambda _, key=key: _SEARCH_COPIES.pop(key, None))
    except TypeError:
        return copy, max_norm
    _SEARCH_COPIES[key] = (ref, table._version, copy, max_norm)
    return copy, max_norm


def _chunked_top_k(queries, table, entity_mask, k, chunk_size, low_precision: bool = False):
    """Top-k `(M, k)` scores and ids over the table, one chunk at a time.

    Few queries (generation) search the table in larger chunks: up to `_TOP_K_SCORE_BUDGET` scores at once.
    With `low_precision` (inference) and a float32 table of at least `LOW_PRECISION_SEARCH_MIN_ENTITIES` rows, a
    bfloat16 copy of the table picks a shortlist that is re-scored in float32; rows whose shortlist cannot be
    proven to hold the exact top-k are searched again in float32.
    """
    if (
        low_precision
        and table.dtype == torch.float32
        and table.shape[0] >= LOW_PRECISION_SEARCH_MIN_ENTITIES
        and queries.shape[0] > 0
        and not table.is_inference()  # no version counter: a cached copy could not notice in-place changes
    ):
        return _low_precision_top_k(queries, table, entity_mask, k, chunk_size)
    return _exact_top_k(queries, table, entity_mask, k, chunk_size)


def _exact_top_k(queries, table, entity_mask, k, chunk_size):
    """Float32 scores, except for a bfloat16 table and queries (the low-precision search), kept in bfloat16."""
    chunk_size = max(chunk_size, _TOP_K_SCORE_BUDGET // max(queries.shape[0], 1))
    low_precision = table.dtype == torch.bfloat16 and queries.dtype == torch.bfloat16
    best_scores = best_ids = None
    for start in range(0, table.shape[0], chunk_size):
        mask_chunk = entity_mask[start : start + chunk_size] if entity_mask is not None else None
        if low_precision:
            chunk = table[start : start + chunk_size]
            if queries.shape[0] <= 16:  # few queries: `table @ queries.t()` runs the faster bf16 kernel
                columns = queries if queries.shape[0] > 1 else queries.repeat(2, 1)  # a GEMV is slower still
                scores = (chunk @ columns.t()).t()[: queries.shape[0]]
            else:
                scores = queries @ chunk.t()
            if mask_chunk is not None:
                scores = scores.masked_fill(~mask_chunk, float("-inf"))
        else:
            scores = _chunk_scores(queries, table[start : start + chunk_size], mask_chunk)
        chunk_k = min(k, scores.shape[1])
        scores, ids = scores.topk(chunk_k, dim=1)
        ids = ids + start
        if best_scores is not None:
            scores = torch.cat([best_scores, scores], dim=1)
            ids = torch.cat([best_ids, ids], dim=1)
            scores, order = scores.topk(min(k, scores.shape[1]), dim=1)
            ids = ids.gather(1, order)
        best_scores, best_ids = scores, ids
    return best_scores, best_ids


def _low_precision_top_k(queries, table, entity_mask, k, chunk_size):
    """
    Exact top-k through a bfloat16 search. The bf16 scores of the shortlist (the `4k + 64` best) differ from the
    float32 ones by at most `bound = (3u + d 2^-23) |q| max|e|` (u = 2^-8, bf16's unit roundoff: rounding of query,
    entity and score; then fp32 accumulation), so every entity left out scores at most `(lowest shortlisted bf16
    score) + bound`; a row whose k-th best re-scored float32 score is above that has its exact top-k in the
    shortlist. Other rows (rare) are searched again in float32.
    """
    copy, max_norm = _search_copy(table)
    queries = queries.float()
    shortlist = min(4 * k + 64, table.shape[0])
    approx, ids = _exact_top_k(queries.to(torch.bfloat16), copy, entity_mask, shortlist, chunk_size)
    candidates = table[ids]  # (M, shortlist, d)
    exact = torch.einsum("md,mkd->mk", queries, candidates)
    if entity_mask is not None:
        exact = exact.masked_fill(~entity_mask[ids], float("-inf"))
    top_scores, order = exact.topk(k, dim=1)
    top_ids = ids.gather(1, order)
    dim = table.shape[1]
    bound = (3 * 2.0**-8 + dim * 2.0**-23) * 1.01 * torch.linalg.vector_norm(queries, dim=1) * max_norm
    lowest = approx[:, -1]
    proven = (top_scores[:, -1] > lowest + bound) | (lowest == float("-inf")) & (top_scores[:, -1] > float("-inf"))
    if shortlist == table.shape[0]:
        proven = torch.ones_like(proven)
    if not bool(proven.all()):
        redo = (~proven).nonzero().squeeze(1)
        exact_scores, exact_ids = _exact_top_k(queries[redo], table, entity_mask, k, chunk_size)
        top_scores = top_scores.index_copy(0, redo, exact_scores)
        top_ids = top_ids.index_copy(0, redo, exact_ids)
    return top_scores, top_ids


def dense_entity_attention(
    queries: torch.Tensor, table: torch.Tensor, entity_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The textbook formula with a full `(M, N)` score matrix: the reference that `entity_attention` must equal."""
    scores = (queries @ table.t()).float()
    if entity_mask is not None:
        scores = scores.masked_fill(~entity_mask, float("-inf"))
    read = torch.softmax(scores, dim=-1) @ table.float()
    return read.to(queries.dtype), torch.logsumexp(scores, dim=-1)


# ---------------------------------------------------------------------------------------------------------------
# Outputs
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class EntityMemoryAccess(ModelOutput):
    """One memory access (or entity-linking prediction) for every `<E_s>` of a batch.

    Args:
        positions (`torch.LongTensor` of shape `(num_mentions, 2)`): (batch index, token position) of each `<E_s>`.
        top_entity_ids (`torch.LongTensor` of shape `(num_mentions, k)`): the best entities, best first.
        top_entity_scores (`torch.FloatTensor` of shape `(num_mentions, k)`): their raw dot-product scores.
        entity_nll (`torch.FloatTensor` of shape `(num_labelled,)`): negative log-likelihood of the gold entity at
            each labelled mention (only when labels were given).
    """

    positions: torch.LongTensor | None = None
    top_entity_ids: torch.LongTensor | None = None
    top_entity_scores: torch.FloatTensor | None = None
    entity_nll: torch.FloatTensor | None = None


@dataclass
class EDMemEncoderOutput(BaseModelOutput):
    """`BaseModelOutput` plus the hidden states entering the upper layers and the encoder's memory access.

    Args:
        lower_hidden_state (`torch.FloatTensor` of shape `(batch_size, sequence_length, hidden_size)`):
            `LayerNorm(h_lower + m)`, what the upper encoder layers receive (kept only when the lower decoder
            layers attend to it).
        memory_access (`EntityMemoryAccess`): the memory read at each `<E_s>` of the input.
    """

    lower_hidden_state: torch.FloatTensor | None = None
    memory_access: EntityMemoryAccess | None = None


@dataclass
class EDMemDecoderOutput(ModelOutput):
    last_hidden_state: torch.FloatTensor | None = None
    past_key_values: Cache | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None
    cross_attentions: tuple[torch.FloatTensor, ...] | None = None
    memory_access: EntityMemoryAccess | None = None


@dataclass
class EDMemModelOutput(ModelOutput):
    """Outputs of `EDMemModel`: BART's `Seq2SeqModelOutput` plus the memory accesses of encoder and decoder."""

    last_hidden_state: torch.FloatTensor | None = None
    past_key_values: Cache | None = None
    decoder_hidden_states: tuple[torch.FloatTensor, ...] | None = None
    decoder_attentions: tuple[torch.FloatTensor, ...] | None = None
    cross_attentions: tuple[torch.FloatTensor, ...] | None = None
    encoder_last_hidden_state: torch.FloatTensor | None = None
    encoder_hidden_states: tuple[torch.FloatTensor, ...] | None = None
    encoder_attentions: tuple[torch.FloatTensor, ...] | None = None
    encoder_attended_entities: EntityMemoryAccess | None = None
    decoder_attended_entities: EntityMemoryAccess | None = None


@dataclass
class EDMemSeq2SeqLMOutput(ModelOutput):
    """Outputs of `EDMemForConditionalGeneration`.

    Args:
        loss (`torch.FloatTensor` of shape `()`): `lm_loss + config.entity_loss_weight * entity_loss`.
        lm_loss (`torch.FloatTensor` of shape `()`): token negative log-likelihood of `labels`.
        entity_loss (`torch.FloatTensor` of shape `()`): mean entity negative log-likelihood, averaged over the
            memory accesses and the entity-linking head that have labelled mentions; 0 when no mention is labelled.
        logits (`torch.FloatTensor` of shape `(batch_size, target_length, vocab_size)`): LM head scores.
        encoder_attended_entities / decoder_attended_entities (`EntityMemoryAccess`): the entities each `<E_s>`
            attended to in the memory, with their scores.
        linked_entities (`EntityMemoryAccess`): the entity-linking head's predictions at each decoder `<E_s>`.
    """

    loss: torch.FloatTensor | None = None
    lm_loss: torch.FloatTensor | None = None
    entity_loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    past_key_values: Cache | None = None
    decoder_hidden_states: tuple[torch.FloatTensor, ...] | None = None
    decoder_attentions: tuple[torch.FloatTensor, ...] | None = None
    cross_attentions: tuple[torch.FloatTensor, ...] | None = None
    encoder_last_hidden_state: torch.FloatTensor | None = None
    encoder_hidden_states: tuple[torch.FloatTensor, ...] | None = None
    encoder_attentions: tuple[torch.FloatTensor, ...] | None = None
    encoder_attended_entities: EntityMemoryAccess | None = None
    decoder_attended_entities: EntityMemoryAccess | None = None
    linked_entities: EntityMemoryAccess | None = None


@dataclass
class GeneratedMention:
    """One `<E_s> ... <E_e>` span of a generated sequence, and the entities that were on offer for it.

    Args:
        start / end: positions of `<E_s>` and of `<E_e>` in the returned sequence (`end == len` if unclosed).
        token_ids: the tokens between the markers.
        entity_id / entity_name: the entity whose name the span spells (-1 / None if it spells none).
        candidates: `(entity_id, name, score)` of the candidate entities when the span was opened, best first
            (static and dynamic decoding: the entity-linking head's top-k and their scores; free decoding: the
            decoder memory's attended entities at that `<E_s>`).
    """

    start: int
    end: int
    token_ids: list[int]
    entity_id: int
    entity_name: str | None
    candidates: list[tuple[int, str | None, float]]


@dataclass
class EDMemEntityLinkingOutput(ModelOutput):
    """Outputs of `EDMemForEntityLinking` (the encoder-only EncMem variant)."""

    loss: torch.FloatTensor | None = None
    lm_loss: torch.FloatTensor | None = None
    entity_loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None
    last_hidden_state: torch.FloatTensor | None = None
    attended_entities: EntityMemoryAccess | None = None
    linked_entities: EntityMemoryAccess | None = None


# ---------------------------------------------------------------------------------------------------------------
# Memory and entity-linking head
# ---------------------------------------------------------------------------------------------------------------


class EntityLinkingHead(nn.Module):
    """Scores the entities for the hidden state of each `<E_s>`: `W_in h` against the entity table (eq. 2)."""

    def __init__(self, config: EDMemConfig):
        super().__init__()
        self.query_proj = nn.Linear(config.d_model, config.entity_embed_dim)
        self.chunk_size = config.memory_chunk_size
        self.top_k = config.memory_top_k

    def forward(
        self,
        hidden_states: torch.Tensor,
        mention_mask: torch.Tensor,
        entity_table: torch.Tensor,
        entity_labels: torch.Tensor | None = None,
        entity_mask: torch.Tensor | None = None,
        return_top_k: int | None = None,
    ) -> EntityMemoryAccess:
        """
        Args:
            hidden_states: `(batch, seq, d_model)`.
            mention_mask: `(batch, seq)` bool, True at `<E_s>`.
            entity_table: `(N, entity_embed_dim)`.
            entity_labels: `(batch, seq)` entity ids at `<E_s>`, -100 elsewhere.
        """
        positions = mention_mask.nonzero()
        queries = self.query_proj(hidden_states[mention_mask])
        need_nll = entity_labels is not None
        if queries.shape[0] == 0 or not (need_nll or return_top_k):
            return _empty_access(positions, hidden_states, need_nll)
        result = entity_attention(
            queries,
            entity_table,
            labels=entity_labels[mention_mask] if need_nll else None,
            entity_mask=entity_mask,
            chunk_size=self.chunk_size,
            compute_read=False,
            return_top_k=return_top_k,
            low_precision_search=not self.training,
        )
        return EntityMemoryAccess(
            positions=positions,
            top_entity_ids=result.top_ids,
            top_entity_scores=result.top_scores,
            entity_nll=result.nll,
        )


class EntityMemory(nn.Module):
    """The memory access between lower and upper layers (equations 1-2 of the paper).

    For each `<E_s>` the query `W_in h` attends to the entity table (all N entities in training, the top
    `memory_top_k` at inference); `m = W_out(sum_i alpha_i e_i)` at `<E_s>` and 0 elsewhere; the upper layers
    receive `LayerNorm(h + m)` at every position, as in the authors' released code.
    """

    def __init__(self, config: EDMemConfig):
        super().__init__()
        self.query_proj = nn.Linear(config.d_model, config.entity_embed_dim)
        self.output_proj = nn.Linear(config.entity_embed_dim, config.d_model)
        self.layer_norm = nn.LayerNorm(config.d_model)
        self.top_k = config.memory_top_k
        self.chunk_size = config.memory_chunk_size

    def forward(
        self,
        hidden_states: torch.Tensor,
        mention_mask: torch.Tensor,
        entity_table: torch.Tensor,
        entity_labels: torch.Tensor | None = None,
        entity_mask: torch.Tensor | None = None,
        return_top_k: int | None = None,
    ) -> tuple[torch.Tensor, EntityMemoryAccess]:
        """
        Args:
            hidden_states: `(batch, seq, d_model)` output of the lower layers.
            mention_mask: `(batch, seq)` bool, True at `<E_s>`.
            entity_table: `(N, entity_embed_dim)`.
            entity_labels: `(batch, seq)` entity ids at `<E_s>`, -100 elsewhere.
            entity_mask: `(N,)` bool, False hides an entity.
            return_top_k: report the best entities of each access.

        Returns:
            `(batch, seq, d_model)` input of the upper layers, and the access.
        """
        positions = mention_mask.nonzero()
        need_nll = entity_labels is not None
        if positions.shape[0] == 0:
            return self.layer_norm(hidden_states), _empty_access(positions, hidden_states, need_nll)
        queries = self.query_proj(hidden_states[mention_mask])
        top_k = None if self.training else self.top_k
        result = entity_attention(
            queries,
            entity_table,
            labels=entity_labels[mention_mask] if need_nll else None,
            entity_mask=entity_mask,
            top_k=top_k,
            chunk_size=self.chunk_size,
            compute_read=True,
            return_top_k=return_top_k,
            low_precision_search=not self.training,
        )
        update = torch.zeros_like(hidden_states)
        update[mention_mask] = self.output_proj(result.read.to(hidden_states.dtype)).to(update.dtype)  # autocast
        hidden_states = self.layer_norm(hidden_states + update)
        access = EntityMemoryAccess(
            positions=positions,
            top_entity_ids=result.top_ids,
            top_entity_scores=result.top_scores,
            entity_nll=result.nll,
        )
        return hidden_states, access


def _empty_access(positions: torch.Tensor, like: torch.Tensor, need_nll: bool) -> EntityMemoryAccess:
    return EntityMemoryAccess(
        positions=positions, entity_nll=like.new_zeros(0, dtype=torch.float32) if need_nll else None
    )


# ---------------------------------------------------------------------------------------------------------------
# Pre-trained model base
# ---------------------------------------------------------------------------------------------------------------


class EDMemPreTrainedModel(PreTrainedModel):
    config_class = EDMemConfig
    config: EDMemConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = [r"BartEncoderLayer", r"BartDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, EDMemForConditionalGeneration):
            init.zeros_(module.final_logits_bias)

    def set_entity_mask(self, entity_mask: torch.Tensor | None) -> None:
        """Hides entities from every memory access and from entity linking (the paper's memory-size study).

        `entity_mask` is a `(entity_vocab_size,)` bool tensor, False for hidden entities, or None to show all.
        It is not saved with the model.
        """
        if entity_mask is not None:
            entity_mask = torch.as_tensor(entity_mask, dtype=torch.bool)
            if entity_mask.shape != (self.config.entity_vocab_size,):
                raise ValueError(
                    f"entity_mask must have shape ({self.config.entity_vocab_size},), got {tuple(entity_mask.shape)}"
                )
        for module in self.modules():
            if isinstance(module, EDMemPreTrainedModel):
                module._entity_mask = entity_mask

    def _get_entity_mask(self, device) -> torch.Tensor | None:
        mask = getattr(self, "_entity_mask", None)
        return mask.to(device) if mask is not None else None

    def _read_memory(self, hidden_states, input_ids, entity_labels, output_attended_entities):
        """The memory access of an encoder or decoder (which hold `memory` and `entity_embeddings`)."""
        mention_mask = input_ids == self.config.entity_start_token_id
        return self.memory(
            hidden_states,
            mention_mask,
            self.entity_embeddings.weight,
            entity_labels=entity_labels,
            entity_mask=self._get_entity_mask(hidden_states.device),
            return_top_k=self.config.memory_top_k if output_attended_entities else None,
        )


def _entity_table_ties(variant: str) -> dict[str, str]:
    """`{target: source}` names of the entity table held by the encoder and decoder of an `EDMemModel`."""
    ties = {}
    if variant != "encdec":
        ties["encoder.entity_embeddings.weight"] = "entity_embeddings.weight"
        if variant == "edmem":
            ties["decoder.entity_embeddings.weight"] = "entity_embeddings.weight"
    return ties


def check_mention_markers(input_ids: torch.Tensor, config: EDMemConfig, what: str = "input_ids") -> None:
    """Raises a ValueError when `<E_s>` and `<E_e>` do not pair up (no nesting, none left open) in every row."""
    start = input_ids == config.entity_start_token_id
    end = input_ids == config.entity_end_token_id
    depth = torch.cumsum(start.long() - end.long(), dim=-1)
    bad_rows = ((depth < 0) | (depth > 1)).any(dim=-1) | (depth[..., -1] != 0)
    if bad_rows.any():
        row = int(bad_rows.nonzero()[0, 0])
        raise ValueError(
            f"unmatched mention markers in {what} row {row}: every <E_s> (id {config.entity_start_token_id}) must be "
            f"closed by an <E_e> (id {config.entity_end_token_id}) before the next <E_s> or the end of the sequence"
        )


def check_entity_labels(
    entity_labels: torch.Tensor, token_ids: torch.Tensor, config: EDMemConfig, what: str = "entity_labels"
) -> None:
    """Raises a ValueError for labels off `<E_s>` positions or outside the entity vocabulary."""
    if entity_labels.shape != token_ids.shape:
        raise ValueError(
            f"{what} has shape {tuple(entity_labels.shape)} but the tokens it labels have shape {tuple(token_ids.shape)}"
        )
    labelled = entity_labels != IGNORE_INDEX
    off_marker = labelled & (token_ids != config.entity_start_token_id)
    if off_marker.any():
        row, pos = off_marker.nonzero()[0].tolist()
        raise ValueError(
            f"{what} puts entity {int(entity_labels[row, pos])} on row {row} position {pos}, which is token "
            f"{int(token_ids[row, pos])}, not <E_s> (id {config.entity_start_token_id}); use -100 for no label"
        )
    out_of_vocab = labelled & ((entity_labels < 0) | (entity_labels >= config.entity_vocab_size))
    if out_of_vocab.any():
        row, pos = out_of_vocab.nonzero()[0].tolist()
        raise ValueError(
            f"unknown entity id {int(entity_labels[row, pos])} in {what} (row {row}, position {pos}): the entity "
            f"vocabulary has ids 0..{config.entity_vocab_size - 1}"
        )


# ---------------------------------------------------------------------------------------------------------------
# Encoder and decoder
# ---------------------------------------------------------------------------------------------------------------


class EDMemEncoder(EDMemPreTrainedModel):
    """BART encoder with an entity memory between its lower and upper layers.

    `layers[:encoder_lower_layers]` are the lower layers; the names match BART's so that BART weights load.
    """

    _can_record_outputs = {"hidden_states": BartEncoderLayer, "attentions": BartAttention}

    def __init__(
        self,
        config: EDMemConfig,
        embed_tokens: nn.Embedding | None = None,
        entity_embeddings: nn.Embedding | None = None,
    ):
        super().__init__(config)
        self.dropout = config.dropout
        self.layerdrop = config.encoder_layerdrop
        embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_tokens = embed_tokens or BartScaledWordEmbedding(
            config.vocab_size, config.d_model, config.pad_token_id, embed_scale=embed_scale
        )
        self.embed_positions = BartLearnedPositionalEmbedding(config.max_position_embeddings, config.d_model)
        self.layers = nn.ModuleList([BartEncoderLayer(config, layer_idx=i) for i in range(config.encoder_layers)])
        self.layernorm_embedding = nn.LayerNorm(config.d_model)
        if config.variant != "encdec":
            self.entity_embeddings = entity_embeddings or nn.Embedding(
                config.entity_vocab_size, config.entity_embed_dim
            )
            self.memory = EntityMemory(config)
        self.gradient_checkpointing = False
        self.post_init()

    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        entity_labels: torch.LongTensor | None = None,
        output_attended_entities: bool | None = None,
        **kwargs,
    ) -> EDMemEncoderOutput:
        r"""
        input_ids: `(batch, seq)`; mentions are found by their `<E_s>` tokens.
        entity_labels: `(batch, seq)`, the entity id at each `<E_s>`, -100 elsewhere.
        output_attended_entities: report the memory's top entities for each `<E_s>` (default: when not training).
        """
        if (input_ids is None) ^ (inputs_embeds is not None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        has_memory = self.config.variant != "encdec"
        if has_memory and input_ids is None:
            raise ValueError("EDMem finds mentions by their <E_s> tokens: pass input_ids, not only inputs_embeds")
        if has_memory:
            check_mention_markers(input_ids, self.config)
        if entity_labels is not None:
            if not has_memory:
                raise ValueError("entity_labels were given but this EDMem variant ('encdec') has no entity memory")
            check_entity_labels(entity_labels, input_ids, self.config)
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        embed_pos = self.embed_positions(inputs_embeds[:, :, -1]).to(inputs_embeds.device)
        hidden_states = self.layernorm_embedding(inputs_embeds + embed_pos)
        hidden_states = nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)
        attention_mask = create_bidirectional_mask(
            config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask
        )
        if output_attended_entities is None:
            output_attended_entities = not self.training

        access = lower_hidden_state = None
        for idx, layer in enumerate(self.layers):
            if idx == self.config.encoder_lower_layers and has_memory:
                hidden_states, access = self._read_memory(
                    hidden_states, input_ids, entity_labels, output_attended_entities
                )
                if self.config.lower_decoder_attends_to == "lower":
                    lower_hidden_state = hidden_states
            if self.training and self.layerdrop > 0.0 and torch.rand([]) < self.layerdrop:
                continue
            hidden_states = layer(hidden_states, attention_mask, **kwargs)
        if has_memory and self.config.encoder_upper_layers == 0:
            hidden_states, access = self._read_memory(
                hidden_states, input_ids, entity_labels, output_attended_entities
            )
            if self.config.lower_decoder_attends_to == "lower":
                lower_hidden_state = hidden_states
        return EDMemEncoderOutput(
            last_hidden_state=hidden_states, lower_hidden_state=lower_hidden_state, memory_access=access
        )


class EDMemDecoder(EDMemPreTrainedModel):
    """BART decoder with an entity memory between its lower and upper layers.

    Incremental decoding runs only the new tokens through lower layers, memory (at `<E_s>`) and upper layers;
    `past_key_values` is Transformers' `EncoderDecoderCache` over all decoder layers.
    """

    _can_record_outputs = {
        "hidden_states": BartDecoderLayer,
        "attentions": OutputRecorder(BartAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(BartAttention, index=1, layer_name="encoder_attn"),
    }

    def __init__(
        self,
        config: EDMemConfig,
        embed_tokens: nn.Embedding | None = None,
        entity_embeddings: nn.Embedding | None = None,
    ):
        super().__init__(config)
        self.dropout = config.dropout
        self.layerdrop = config.decoder_layerdrop
        embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_tokens = embed_tokens or BartScaledWordEmbedding(
            config.vocab_size, config.d_model, config.pad_token_id, embed_scale=embed_scale
        )
        self.embed_positions = BartLearnedPositionalEmbedding(config.max_position_embeddings, config.d_model)
        self.layers = nn.ModuleList([BartDecoderLayer(config, layer_idx=i) for i in range(config.decoder_layers)])
        self.layernorm_embedding = nn.LayerNorm(config.d_model)
        if config.variant == "edmem":
            self.entity_embeddings = entity_embeddings or nn.Embedding(
                config.entity_vocab_size, config.entity_embed_dim
            )
            self.memory = EntityMemory(config)
        self.gradient_checkpointing = False
        self.post_init()

    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_lower_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        entity_labels: torch.LongTensor | None = None,
        output_attended_entities: bool | None = None,
        **kwargs,
    ) -> EDMemDecoderOutput:
        r"""
        input_ids: `(batch, tgt_len)` decoder inputs (only the new tokens when a cache is given).
        encoder_hidden_states: `(batch, src_len, d_model)` final encoder output.
        encoder_lower_hidden_states: `(batch, src_len, d_model)` input of the upper encoder layers, attended to by
            the lower decoder layers when `config.lower_decoder_attends_to == "lower"`.
        entity_labels: `(batch, tgt_len)` aligned with `input_ids`: the entity id at each `<E_s>`, -100 elsewhere.
        """
        if (input_ids is None) ^ (inputs_embeds is not None):
            raise ValueError("You must specify exactly one of decoder_input_ids or decoder_inputs_embeds")
        has_memory = self.config.variant == "edmem"
        if has_memory and input_ids is None:
            raise ValueError("EDMem finds mentions by their <E_s> tokens: pass decoder_input_ids, not only embeddings")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        if use_cache and past_key_values is None:
            past_key_values = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        batch_size, seq_length = inputs_embeds.shape[:2]
        past_length = past_key_values.get_seq_length() if past_key_values is not None else 0
        position_ids = torch.arange(seq_length, device=inputs_embeds.device) + past_length
        if attention_mask is None:
            attention_mask = torch.ones(batch_size, past_length + seq_length, device=inputs_embeds.device)
        self_attn_cache = (
            past_key_values.self_attention_cache
            if isinstance(past_key_values, EncoderDecoderCache)
            else past_key_values
        )
        causal_mask = create_causal_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            past_key_values=self_attn_cache,
        )
        cross_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )
        positions = self.embed_positions(input_ids, past_length, position_ids=position_ids).to(inputs_embeds.device)
        hidden_states = self.layernorm_embedding(inputs_embeds + positions)
        hidden_states = nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)
        if output_attended_entities is None:
            output_attended_entities = not self.training
        lower_source = encoder_hidden_states
        if self.config.lower_decoder_attends_to == "lower" and encoder_lower_hidden_states is not None:
            lower_source = encoder_lower_hidden_states

        access = None
        for idx, layer in enumerate(self.layers):
            if idx == self.config.decoder_lower_layers and has_memory:
                hidden_states, access = self._read_memory(
                    hidden_states, input_ids, entity_labels, output_attended_entities
                )
            if self.training and self.layerdrop > 0.0 and torch.rand([]) < self.layerdrop:
                continue
            source = lower_source if idx < self.config.decoder_lower_layers else encoder_hidden_states
            hidden_states = layer(
                hidden_states,
                causal_mask,
                source,
                encoder_attention_mask=cross_mask,
                past_key_values=past_key_values,
                use_cache=use_cache,
                **kwargs,
            )
        if has_memory and self.config.decoder_upper_layers == 0:
            hidden_states, access = self._read_memory(
                hidden_states, input_ids, entity_labels, output_attended_entities
            )
        return EDMemDecoderOutput(
            last_hidden_state=hidden_states, past_key_values=past_key_values, memory_access=access
        )


# ---------------------------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------------------------


class _EntityVocabMixin:
    """`model.entity_vocab`: saved beside the weights and restored by `from_pretrained`."""

    @property
    def entity_vocab(self) -> EntityVocab | None:
        return getattr(self, "_entity_vocab", None)

    @entity_vocab.setter
    def entity_vocab(self, vocab: EntityVocab | None) -> None:
        if vocab is not None:
            if not isinstance(vocab, EntityVocab):
                raise TypeError(f"entity_vocab must be an EntityVocab, got {type(vocab).__name__}")
            if len(vocab) != self.config.entity_vocab_size:
                raise ValueError(
                    f"entity vocabulary / memory mismatch: the vocabulary has {len(vocab)} entities but the entity "
                    f"memory has {self.config.entity_vocab_size} rows (config.entity_vocab_size)"
                )
        self._entity_vocab = vocab

    def save_pretrained(self, save_directory, *args, **kwargs):
        # All three auto classes, whichever class is saved, so that the Hub copy loads with any of them.
        self.config.auto_map = {
            "AutoConfig": "configuration_edmem.EDMemConfig",
            "AutoModel": "modeling_edmem.EDMemModel",
            "AutoModelForSeq2SeqLM": "modeling_edmem.EDMemForConditionalGeneration",
        }
        super().save_pretrained(save_directory, *args, **kwargs)
        if self.entity_vocab is not None and kwargs.get("is_main_process", True):
            self.entity_vocab.save(os.path.join(os.fspath(save_directory), ENTITY_VOCAB_NAME))

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        model = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        vocab_file = _resolve_entity_vocab_file(pretrained_model_name_or_path, kwargs)
        if vocab_file is not None:
            vocab = EntityVocab.load(vocab_file)
            if len(vocab) != model.config.entity_vocab_size:
                raise ValueError(
                    f"checkpoint mismatch in {pretrained_model_name_or_path}: {ENTITY_VOCAB_NAME} lists {len(vocab)} "
                    f"entities but the entity table has {model.config.entity_vocab_size} rows"
                )
            model.entity_vocab = vocab
        return model


def _resolve_entity_vocab_file(path, kwargs) -> str | None:
    """Finds `entity_vocab.json` in a local directory or a Hub repository; None when there is none."""
    path = os.fspath(path)
    if os.path.isdir(path):
        candidate = os.path.join(path, kwargs.get("subfolder", "") or "", ENTITY_VOCAB_NAME)
        return candidate if os.path.isfile(candidate) else None
    from transformers.utils import cached_file

    return cached_file(
        path,
        ENTITY_VOCAB_NAME,
        revision=kwargs.get("revision"),
        cache_dir=kwargs.get("cache_dir"),
        token=kwargs.get("token"),
        local_files_only=kwargs.get("local_files_only", False),
        subfolder=kwargs.get("subfolder", "") or "",
        _raise_exceptions_for_missing_entries=False,
        _raise_exceptions_for_connection_errors=False,
    )


class EDMemModel(_EntityVocabMixin, EDMemPreTrainedModel):
    """The bare EDMem encoder-decoder: hidden states and memory accesses, no heads."""

    def __init__(self, config: EDMemConfig):
        super().__init__(config)
        embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.shared = BartScaledWordEmbedding(
            config.vocab_size, config.d_model, config.pad_token_id, embed_scale=embed_scale
        )
        if config.variant != "encdec":
            self.entity_embeddings = nn.Embedding(config.entity_vocab_size, config.entity_embed_dim)
        table = getattr(self, "entity_embeddings", None)
        self.encoder = EDMemEncoder(config, self.shared, table)
        if config.variant != "encmem":
            self.decoder = EDMemDecoder(config, self.shared, table)
        # The encoder and decoder hold the model's token embeddings and entity table under their own names.
        self._tied_weights_keys = {"encoder.embed_tokens.weight": "shared.weight"}
        if config.variant != "encmem":
            self._tied_weights_keys["decoder.embed_tokens.weight"] = "shared.weight"
        self._tied_weights_keys.update(_entity_table_ties(config.variant))
        self.post_init()

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict:
        tied = super().get_expanded_tied_weights_keys(all_submodels=all_submodels)
        if not all_submodels:
            # The entity table is one memory whatever `tie_word_embeddings` says.
            tied.update(_entity_table_ties(self.config.variant))
        return tied

    def get_input_embeddings(self):
        return self.shared

    def set_input_embeddings(self, value):
        self.shared = value
        self.encoder.embed_tokens = value
        if self.config.variant != "encmem":
            self.decoder.embed_tokens = value

    def get_encoder(self):
        return self.encoder

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.LongTensor | None = None,
        encoder_outputs: EDMemEncoderOutput | tuple | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        entity_labels: torch.LongTensor | None = None,
        decoder_entity_labels: torch.LongTensor | None = None,
        output_attended_entities: bool | None = None,
        **kwargs,
    ) -> EDMemModelOutput:
        r"""
        input_ids: `(batch, src_len)` with `<E_s> ... <E_e>` around mentions.
        decoder_input_ids: `(batch, tgt_len)`; if absent, `input_ids` shifted right (denoising, as in BART).
        entity_labels: `(batch, src_len)`, the entity id at each `<E_s>` of `input_ids`, -100 elsewhere.
        decoder_entity_labels: `(batch, tgt_len)` aligned with `decoder_input_ids` (already shifted).
        output_attended_entities: report each memory access's top entities (default: when not training).
        """
        if self.config.variant == "encmem":
            raise ValueError("an 'encmem' EDMem has no decoder: use EDMemForEntityLinking")
        if decoder_input_ids is None and decoder_inputs_embeds is None:
            if input_ids is None:
                raise ValueError("pass decoder_input_ids, decoder_inputs_embeds or input_ids")
            decoder_input_ids = shift_tokens_right(
                input_ids, self.config.pad_token_id, self.config.decoder_start_token_id
            )
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                inputs_embeds=inputs_embeds,
                entity_labels=entity_labels,
                output_attended_entities=output_attended_entities,
                **kwargs,
            )
        elif not isinstance(encoder_outputs, EDMemEncoderOutput):
            encoder_outputs = EDMemEncoderOutput(
                last_hidden_state=encoder_outputs[0],
                hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
                attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
            )
        if decoder_entity_labels is not None:
            check_entity_labels(decoder_entity_labels, decoder_input_ids, self.config, "decoder_entity_labels")
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_lower_hidden_states=getattr(encoder_outputs, "lower_hidden_state", None),
            encoder_attention_mask=attention_mask,
            past_key_values=past_key_values,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            entity_labels=decoder_entity_labels,
            output_attended_entities=output_attended_entities,
            **kwargs,
        )
        return EDMemModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            past_key_values=decoder_outputs.past_key_values,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
            encoder_attended_entities=getattr(encoder_outputs, "memory_access", None),
            decoder_attended_entities=decoder_outputs.memory_access,
        )


def _mean_entity_loss(
    accesses: list[EntityMemoryAccess | None], params: list[torch.Tensor], table: torch.Tensor
) -> torch.Tensor:
    """Mean NLL per access, averaged over the accesses that have labelled mentions (0 when none has).

    The `0 * sum(params)` term keeps every memory parameter in the graph, so that distributed training does not
    stall on a batch where an access has no mention. The table joins it only when nothing is labelled: otherwise
    it is in the graph already, and a dense zero gradient for it would cost a table-sized buffer.
    """
    per_access = [
        a.entity_nll.mean() for a in accesses if a is not None and a.entity_nll is not None and a.entity_nll.numel()
    ]
    anchor = sum(p.sum() for p in params) * 0.0
    if not per_access:
        return (anchor + table.sum() * 0.0).float()
    return torch.stack(per_access).mean() + anchor


class EDMemForConditionalGeneration(_EntityVocabMixin, EDMemPreTrainedModel, GenerationMixin):
    """EDMem with an LM head (tied to the input embeddings) and an entity-linking head on the decoder."""

    _tied_weights_keys = {"lm_head.weight": "model.shared.weight"}
    _keys_to_ignore_on_load_missing = ["final_logits_bias"]

    def __init__(self, config: EDMemConfig):
        super().__init__(config)
        if config.variant == "encmem":
            raise ValueError("an 'encmem' EDMem has no decoder: use EDMemForEntityLinking")
        self.model = EDMemModel(config)
        self.final_logits_bias = nn.Buffer(torch.zeros((1, config.vocab_size)))
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.variant == "edmem":
            self.entity_linking_head = EntityLinkingHead(config)
        self.post_init()
        # Entity decoding defaults live in the generation config (given to the constructor, so that they are saved).
        if self.generation_config is not None and not hasattr(self.generation_config, "entity_decoding"):
            settings = self.generation_config.to_dict()
            for internal in ("transformers_version", "_from_model_config"):  # the latter makes it drop our keys
                settings.pop(internal, None)
            self.generation_config = GenerationConfig(**settings, entity_decoding="free", entity_candidates=5)
        self._entity_tries: dict[str, EntityTrie] = {}
        self._dynamic_linking: tuple[EntityConstrainedLogitsProcessor, int] | None = None

    def get_encoder(self):
        return self.model.encoder

    def get_decoder(self):
        return self.model.decoder

    def get_input_embeddings(self):
        return self.model.shared

    def get_output_embeddings(self):
        return self.lm_head

    def resize_token_embeddings(self, new_num_tokens: int, pad_to_multiple_of=None, mean_resizing: bool = True):
        new_embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        old = self.final_logits_bias
        num = new_embeddings.weight.shape[0]
        bias = old[:, :num] if num <= old.shape[-1] else torch.cat([old, old.new_zeros(1, num - old.shape[-1])], dim=1)
        self.final_logits_bias = nn.Buffer(bias)
        return new_embeddings

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.LongTensor | None = None,
        encoder_outputs: EDMemEncoderOutput | tuple | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        entity_labels: torch.LongTensor | None = None,
        decoder_entity_labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attended_entities: bool | None = None,
        **kwargs,
    ) -> EDMemSeq2SeqLMOutput:
        r"""
        labels: `(batch, tgt_len)` target tokens, -100 where not scored; the decoder input is `labels` shifted
            right unless `decoder_input_ids` is given.
        entity_labels: `(batch, src_len)` entity id at each `<E_s>` of `input_ids`, -100 elsewhere.
        decoder_entity_labels: `(batch, tgt_len)` aligned with `labels`: the entity id at each `<E_s>` of `labels`,
            -100 elsewhere. Shifted right with `labels`, so that each sits where the decoder reads that `<E_s>`.
            It supervises the decoder's memory access and the entity-linking head.
        """
        config = self.config
        if decoder_entity_labels is not None:
            if labels is None:
                raise ValueError("decoder_entity_labels are aligned with labels: pass labels too")
            check_entity_labels(decoder_entity_labels, labels, config, "decoder_entity_labels")
            decoder_entity_labels = shift_tokens_right(decoder_entity_labels, IGNORE_INDEX, IGNORE_INDEX)
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = shift_tokens_right(labels, config.pad_token_id, config.decoder_start_token_id)
        if config.variant != "edmem":
            decoder_entity_labels_for_model = None
        else:
            decoder_entity_labels_for_model = decoder_entity_labels
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            entity_labels=entity_labels if config.variant != "encdec" else None,
            decoder_entity_labels=decoder_entity_labels_for_model,
            output_attended_entities=output_attended_entities,
            **kwargs,
        )
        logits = self.lm_head(outputs.last_hidden_state) + self.final_logits_bias.to(outputs.last_hidden_state.device)

        linked = None
        if config.variant == "edmem":
            want_top_k = (not self.training) if output_attended_entities is None else output_attended_entities
            if want_top_k or decoder_entity_labels is not None:
                linked = self.entity_linking_head(
                    outputs.last_hidden_state,
                    decoder_input_ids == config.entity_start_token_id,
                    self.model.entity_embeddings.weight,
                    entity_labels=decoder_entity_labels,
                    entity_mask=self._get_entity_mask(logits.device),
                    return_top_k=config.memory_top_k if want_top_k else None,
                )

        if self._dynamic_linking is not None:
            self._link_last_mentions(outputs.last_hidden_state, decoder_input_ids)

        loss = lm_loss = entity_loss = None
        if labels is not None:
            lm_loss = nn.functional.cross_entropy(
                logits.float().view(-1, logits.shape[-1]), labels.to(logits.device).view(-1), ignore_index=IGNORE_INDEX
            )
            loss = lm_loss
            if config.variant != "encdec":
                entity_loss = _mean_entity_loss(
                    [outputs.encoder_attended_entities, outputs.decoder_attended_entities, linked],
                    self._memory_parameters(),
                    self.model.entity_embeddings.weight,
                )
                loss = lm_loss + config.entity_loss_weight * entity_loss
        return EDMemSeq2SeqLMOutput(
            loss=loss,
            lm_loss=lm_loss,
            entity_loss=entity_loss,
            logits=logits,
            past_key_values=outputs.past_key_values,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
            encoder_attended_entities=outputs.encoder_attended_entities,
            decoder_attended_entities=outputs.decoder_attended_entities,
            linked_entities=linked,
        )

    def _memory_parameters(self) -> list[torch.Tensor]:
        modules = [self.model.encoder.memory]
        if self.config.variant == "edmem":
            modules += [self.model.decoder.memory, self.entity_linking_head]
        return [p for m in modules for p in m.parameters()]

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    # --- entity decoding -----------------------------------------------------------------------------------

    def entity_trie(self, tokenizer=None, cache_dir: str | os.PathLike | None = None) -> EntityTrie:
        """The prefix tree of `<E_s> name <E_e>` over `model.entity_vocab`, built once per tokenizer.

        Built with `tokenizer` (names tokenised with a leading space, as mentions appear in running text) and kept
        on the model; with `cache_dir` (default: `$HF_HOME/edmem_hf/tries`) its arrays are also cached on disk.
        """
        if self.entity_vocab is None:
            raise ValueError("entity decoding needs model.entity_vocab: set it or load a checkpoint that has one")
        if tokenizer is None:
            if len(self._entity_tries) == 1:
                return next(iter(self._entity_tries.values()))
            raise ValueError(
                "static and dynamic entity decoding spell entity names with the tokenizer: pass tokenizer=... to "
                "generate() once (the prefix tree is then kept on the model), or call model.set_entity_trie(trie)"
            )
        key = f"{id(tokenizer)}:{len(tokenizer)}"
        if key not in self._entity_tries:
            start_id, end_id = marker_token_ids(tokenizer)  # a clear error if the tokenizer lacks them
            if (start_id, end_id) != (self.config.entity_start_token_id, self.config.entity_end_token_id):
                raise ValueError(
                    f"tokenizer / model mismatch: the tokenizer's <E_s>, <E_e> are {start_id}, {end_id}, the model's "
                    f"{self.config.entity_start_token_id}, {self.config.entity_end_token_id}"
                )
            if cache_dir is None:
                from huggingface_hub.constants import HF_HOME

                cache_dir = os.path.join(HF_HOME, "edmem_hf", "tries")
            os.makedirs(cache_dir, exist_ok=True)
            trie = EntityTrie.build(self.entity_vocab, tokenizer, end_token_id=end_id, cache_dir=cache_dir)
            self.set_entity_trie(trie, key=key)
        return self._entity_tries[key]

    def set_entity_trie(self, trie: EntityTrie, key: str = "default") -> None:
        """Uses a prebuilt `EntityTrie` for constrained entity decoding (one row per entity of the vocabulary)."""
        if self.entity_vocab is not None and len(trie) != len(self.entity_vocab):
            raise ValueError(f"the trie has {len(trie)} entities, the entity vocabulary {len(self.entity_vocab)}")
        if key == "default":
            self._entity_tries.clear()
        self._entity_tries[key] = trie

    @torch.no_grad()
    def link_entities(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        top_k: int = 5,
        encoder_outputs: EDMemEncoderOutput | None = None,
        past_key_values: EncoderDecoderCache | None = None,
    ) -> tuple[torch.LongTensor, torch.FloatTensor]:
        """Static entity linking: the entity-linking head's top-k for each example.

        The decoder reads the start token and `<E_s>`, and the head scores the entities at `<E_s>`, as in the
        paper's static setting. Returns ids and raw scores, each `(batch, top_k)`, best first. With an empty
        `past_key_values`, the decoder fills it (its cross-attention part can then serve generation).
        """
        if self.config.variant != "edmem":
            raise ValueError(f"entity linking needs the full EDMem (variant 'edmem'), not {self.config.variant!r}")
        if encoder_outputs is None:
            encoder_outputs = self.get_encoder()(
                input_ids=input_ids, attention_mask=attention_mask, output_attended_entities=False
            )
        batch = encoder_outputs.last_hidden_state.shape[0]
        device = encoder_outputs.last_hidden_state.device
        decoder_input_ids = torch.tensor(
            [[self.config.decoder_start_token_id, self.config.entity_start_token_id]], device=device
        ).expand(batch, 2)
        outputs = self.model(
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            encoder_outputs=encoder_outputs,
            past_key_values=past_key_values,
            use_cache=past_key_values is not None,
            output_attended_entities=False,
        )
        mention_mask = torch.zeros_like(decoder_input_ids, dtype=torch.bool)
        mention_mask[:, 1] = True
        linked = self.entity_linking_head(
            outputs.last_hidden_state,
            mention_mask,
            self.model.entity_embeddings.weight,
            entity_mask=self._get_entity_mask(device),
            return_top_k=min(top_k, self.config.entity_vocab_size),
        )
        return linked.top_entity_ids, linked.top_entity_scores

    def _link_last_mentions(self, hidden_states: torch.Tensor, decoder_input_ids: torch.Tensor) -> None:
        """Dynamic entity linking: gives the rows whose newest token is `<E_s>` the head's top-k as candidates."""
        processor, top_k = self._dynamic_linking
        opened = decoder_input_ids[:, -1] == self.config.entity_start_token_id
        if not bool(opened.any()):
            return
        mention_mask = torch.zeros_like(decoder_input_ids, dtype=torch.bool)
        mention_mask[:, -1] = opened
        linked = self.entity_linking_head(
            hidden_states,
            mention_mask,
            self.model.entity_embeddings.weight,
            entity_mask=self._get_entity_mask(hidden_states.device),
            return_top_k=min(top_k, self.config.entity_vocab_size),
        )
        processor.set_candidates(linked.top_entity_ids, linked.top_entity_scores, rows=opened)

    def generate(
        self,
        inputs: torch.Tensor | None = None,
        generation_config: GenerationConfig | None = None,
        logits_processor: LogitsProcessorList | None = None,
        entity_decoding: str | None = None,
        entity_candidates: int | None = None,
        tokenizer=None,
        **kwargs,
    ):
        r"""
        `GenerationMixin.generate` with EDMem's three decoding settings.

        Args:
            entity_decoding (`str`, *optional*): `"free"` (the LM head alone), `"static"` (link first: the
                entity-linking head's top-k entities for the input become the only names a mention may spell) or
                `"dynamic"` (at each generated `<E_s>`, the head's top-k at that position become the names the
                mention may spell). Defaults to `generation_config.entity_decoding` (`"free"`).
            entity_candidates (`int`, *optional*): k, the candidates per mention. Defaults to
                `generation_config.entity_candidates` (5).
            tokenizer: the model's tokenizer, needed once to spell entity names (the prefix tree is then kept).

        Training-only batch fields (`labels`, `entity_labels`, `decoder_entity_labels`) are dropped, so that a
        training batch can be passed as is (`Seq2SeqTrainer(predict_with_generate=True)` does). With
        `return_dict_in_generate=True` the output has `entity_mentions`: for each returned sequence, a list of
        `GeneratedMention` with the candidate entities (ids, names, scores) each mention could choose from.
        """
        for name in TRAINING_ONLY_FIELDS:
            kwargs.pop(name, None)
        config = generation_config if generation_config is not None else self.generation_config
        mode = entity_decoding if entity_decoding is not None else getattr(config, "entity_decoding", "free")
        top_k = entity_candidates if entity_candidates is not None else getattr(config, "entity_candidates", 5)
        if mode not in ENTITY_DECODING_MODES:
            raise ValueError(f"entity_decoding must be one of {ENTITY_DECODING_MODES}, got {mode!r}")
        if mode != "free" and self.config.variant != "edmem":
            raise ValueError(f"entity_decoding={mode!r} needs the full EDMem, not variant {self.config.variant!r}")
        if not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"entity_candidates must be a positive integer, got {top_k!r}")
        kwargs.setdefault("output_attended_entities", False)  # the memory still reads its top-k; no reports
        num_beams = kwargs.get("num_beams", getattr(config, "num_beams", 1)) or 1
        num_return = kwargs.get("num_return_sequences", getattr(config, "num_return_sequences", 1)) or 1
        rows_per_example = num_beams if num_beams > 1 else num_return
        processors = LogitsProcessorList(logits_processor or [])
        processor = None
        if mode != "free":
            trie = self.entity_trie(tokenizer)
            input_ids = inputs if inputs is not None else kwargs.get("input_ids")
            if mode == "static":
                if kwargs.get("encoder_outputs") is None:
                    if input_ids is None:
                        raise ValueError("static entity decoding needs input_ids (or encoder_outputs)")
                    kwargs["encoder_outputs"] = self.get_encoder()(
                        input_ids=input_ids,
                        attention_mask=kwargs.get("attention_mask"),
                        output_attended_entities=False,
                    )
                # The linking pass computes the cross-attention keys and values of the encoder output: generation
                # reuses them (expanded to its rows) instead of computing them again at its first step.
                reuse = (
                    kwargs.get("past_key_values") is None
                    and kwargs.get("use_cache", getattr(config, "use_cache", True)) is not False
                    and getattr(config, "cache_implementation", None) is None
                )
                link_cache = (
                    EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
                    if reuse
                    else None
                )
                ids, scores = self.link_entities(
                    input_ids,
                    kwargs.get("attention_mask"),
                    top_k,
                    encoder_outputs=kwargs["encoder_outputs"],
                    past_key_values=link_cache,
                )
                if reuse:
                    cross = link_cache.cross_attention_cache
                    if max(num_beams, num_return) > 1:  # generate() expands its inputs by this factor
                        cross.batch_repeat_interleave(max(num_beams, num_return))
                    kwargs["past_key_values"] = EncoderDecoderCache(DynamicCache(config=self.config), cross)
                processor = EntityConstrainedLogitsProcessor(
                    trie,
                    start_token_id=self.config.entity_start_token_id,
                    end_token_id=self.config.entity_end_token_id,
                    candidates=ids,
                    candidate_scores=scores,
                    group_size=rows_per_example,
                )
            else:
                processor = EntityConstrainedLogitsProcessor(
                    trie,
                    start_token_id=self.config.entity_start_token_id,
                    end_token_id=self.config.entity_end_token_id,
                    group_size=rows_per_example,
                )
                self._dynamic_linking = (processor, top_k)
            processors.append(processor)
        try:
            output = super().generate(inputs, generation_config, processors, **kwargs)
        finally:
            self._dynamic_linking = None
        if not isinstance(output, torch.Tensor):
            encoder_inputs = {"input_ids": inputs if inputs is not None else kwargs.get("input_ids")}
            encoder_inputs["attention_mask"] = kwargs.get("attention_mask")
            if mode == "free" and tokenizer is not None and self.entity_vocab is not None:
                self.entity_trie(tokenizer)  # to name the entities that free-form mentions spell
            output["entity_mentions"] = self._describe_mentions(
                output.sequences, processor, num_return, encoder_inputs
            )
        return output

    def _describe_mentions(self, sequences, processor, num_return, encoder_inputs) -> list[list[GeneratedMention]]:
        vocab = self.entity_vocab

        def names(entity_id: int) -> str | None:
            return vocab.names[entity_id] if vocab is not None and 0 <= entity_id < len(vocab) else None

        if processor is not None:
            examples = torch.arange(sequences.shape[0] // num_return).repeat_interleave(num_return)
            parsed = processor.mentions(sequences, examples)
        else:
            parsed = self._free_mentions(sequences, encoder_inputs)
        return [
            [
                GeneratedMention(
                    m.start,
                    m.end,
                    m.token_ids,
                    m.entity_id,
                    names(m.entity_id),
                    [(c, names(c), s) for c, s in zip(m.candidate_ids, m.candidate_scores)],
                )
                for m in mentions
            ]
            for mentions in parsed
        ]

    @torch.no_grad()
    def _free_mentions(self, sequences, encoder_inputs) -> list[list[EntityMention]]:
        """Mentions of freely generated sequences, with the entities the decoder memory attended to at each."""
        config = self.config
        start_id, end_id = config.entity_start_token_id, config.entity_end_token_id
        attended = {}
        if config.variant == "edmem" and bool((sequences == start_id).any()):
            encoder_kwargs = {k: v for k, v in encoder_inputs.items() if v is not None}
            repeat = sequences.shape[0] // next(iter(encoder_kwargs.values())).shape[0] if encoder_kwargs else 1
            encoder_kwargs = {k: v.repeat_interleave(repeat, dim=0) for k, v in encoder_kwargs.items()}
            if encoder_kwargs:
                out = self(
                    **encoder_kwargs, decoder_input_ids=sequences, use_cache=False, output_attended_entities=True
                )
                access = out.decoder_attended_entities
                for (row, pos), ids, scores in zip(
                    access.positions.tolist(), access.top_entity_ids.tolist(), access.top_entity_scores.tolist()
                ):
                    attended[(row, pos)] = (ids, scores)
        result = []
        for row, seq in enumerate(sequences.tolist()):
            mentions = []
            for start, tok in enumerate(seq):
                if tok != start_id:
                    continue
                end = start + 1
                while end < len(seq) and seq[end] not in (start_id, end_id):
                    end += 1
                span = seq[start + 1 : end]
                entity = -1
                if end < len(seq) and seq[end] == end_id and self._entity_tries:
                    entity = next(iter(self._entity_tries.values())).lookup(span + [end_id])
                ids, scores = attended.get((row, start), ([], []))
                mentions.append(EntityMention(start, end, span, entity, ids, scores))
            result.append(mentions)
        return result


class EDMemForEntityLinking(_EntityVocabMixin, EDMemPreTrainedModel):
    """The encoder-only EncMem variant (EaE-style auto-encoder): encoder + memory, an entity-linking head on the
    final encoder states and a masked-LM head. Predicts the entity of every `<E_s>` in the input."""

    _tied_weights_keys = {"lm_head.weight": "model.shared.weight"}

    def __init__(self, config: EDMemConfig):
        super().__init__(config)
        if config.variant != "encmem":
            raise ValueError(
                f"EDMemForEntityLinking is the 'encmem' variant; got a config with variant={config.variant!r}"
            )
        self.model = EDMemModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.entity_linking_head = EntityLinkingHead(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.shared

    def get_output_embeddings(self):
        return self.lm_head

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        entity_labels: torch.LongTensor | None = None,
        labels: torch.LongTensor | None = None,
        output_attended_entities: bool | None = None,
        **kwargs,
    ) -> EDMemEntityLinkingOutput:
        r"""
        input_ids: `(batch, seq)` with `<E_s> ... <E_e>` around mentions.
        entity_labels: `(batch, seq)` entity id at each `<E_s>`, -100 elsewhere.
        labels: `(batch, seq)` masked-LM targets (original tokens where the input was masked, -100 elsewhere).
        """
        if input_ids is None:
            raise ValueError("EDMemForEntityLinking needs input_ids: mentions are found by their <E_s> tokens")
        check_mention_markers(input_ids, self.config)
        if entity_labels is not None:
            check_entity_labels(entity_labels, input_ids, self.config)
        encoder_outputs = self.model.encoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            entity_labels=entity_labels,
            output_attended_entities=output_attended_entities,
            **kwargs,
        )
        hidden = encoder_outputs.last_hidden_state
        logits = self.lm_head(hidden)
        want_top_k = (not self.training) if output_attended_entities is None else output_attended_entities
        linked = self.entity_linking_head(
            hidden,
            input_ids == self.config.entity_start_token_id,
            self.model.entity_embeddings.weight,
            entity_labels=entity_labels,
            entity_mask=self._get_entity_mask(hidden.device),
            return_top_k=self.config.memory_top_k if want_top_k else None,
        )
        loss = lm_loss = entity_loss = None
        if labels is not None or entity_labels is not None:
            entity_loss = _mean_entity_loss(
                [encoder_outputs.memory_access, linked],
                [p for m in (self.model.encoder.memory, self.entity_linking_head) for p in m.parameters()],
                self.model.entity_embeddings.weight,
            )
            loss = self.config.entity_loss_weight * entity_loss
            if labels is not None:
                lm_loss = nn.functional.cross_entropy(
                    logits.float().view(-1, logits.shape[-1]), labels.view(-1), ignore_index=IGNORE_INDEX
                )
                loss = loss + lm_loss
        return EDMemEntityLinkingOutput(
            loss=loss,
            lm_loss=lm_loss,
            entity_loss=entity_loss,
            logits=logits,
            hidden_states=encoder_outputs.hidden_states,
            attentions=encoder_outputs.attentions,
            last_hidden_state=hidden,
            attended_entities=encoder_outputs.memory_access,
            linked_entities=linked,
        )


__all__ = [
    "EDMemEncoder",
    "EDMemDecoder",
    "EDMemModel",
    "EDMemForConditionalGeneration",
    "EDMemForEntityLinking",
    "EDMemPreTrainedModel",
    "EntityLinkingHead",
    "EntityMemory",
    "EntityMemoryAccess",
    "dense_entity_attention",
    "entity_attention",
]

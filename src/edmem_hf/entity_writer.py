"""The writer of entity rows: a head that turns the encoder's reading of a text about an entity into a row of the
entity table (`EDMemConfig.entity_row_writer`; docs/model.md, "Entities written from text").

Its input is `<s> <E_s> name <E_e> passage </s>` (`writer_input_ids` builds it from token ids), read by the model's
own lower encoder layers, the layers whose states the memory's queries are made from. The row is made of the state
at `<E_s>` (what the name is, in context, as a query at a mention would see it) and an attention pooling over every
token (what the passage says), projected to `entity_embed_dim`. `RowsToWrite` is the writer's inputs of one
forward pass (`EDMemForConditionalGeneration.forward(rows_to_write=...)`). Copied to the Hub as custom code with
`modeling_edmem.py`: it imports nothing of ours but `configuration_edmem` and `entity_attention`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields

import torch
from torch import nn

from .configuration_edmem import EDMemConfig
from .entity_attention import WrittenRows

# Texts the writer reads in one pass, grouped by length (`EDMemForConditionalGeneration.write_entity_rows`): measured
# on the knowledge world's first stage (about 90 texts a batch), 32 trained 1.57x faster than one pass, 16 1.50x.
WRITER_TEXTS_PER_PASS = 32


class EntityRowWriter(nn.Module):
    """`(K, L, d_model)` lower-layer states of K writer inputs -> `(K, entity_embed_dim)` rows.

    `row = W_row LayerNorm([h_<E_s> ; pool(h)])`, where `pool` is attention pooling with one learned query per head
    (`encoder_attention_heads` heads, so that each head can gather a different fact of the passage) over the
    input's tokens. Dropout `memory_dropout` on the row, as on the memory's projections.
    """

    def __init__(self, config: EDMemConfig):
        super().__init__()
        self.num_heads = config.encoder_attention_heads
        self.head_dim = config.d_model // self.num_heads
        self.entity_start_token_id = config.entity_start_token_id
        self.pool_queries = nn.Parameter(torch.zeros(self.num_heads, self.head_dim))  # set by _init_weights
        self.pool_keys = nn.Linear(config.d_model, config.d_model)
        self.pool_values = nn.Linear(config.d_model, config.d_model)
        self.layer_norm = nn.LayerNorm(2 * config.d_model)
        self.row_proj = nn.Linear(2 * config.d_model, config.entity_embed_dim)
        self.dropout = nn.Dropout(config.memory_dropout)

    def forward(
        self, hidden_states: torch.Tensor, input_ids: torch.LongTensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        """
        Args:
            hidden_states: `(K, L, d_model)`, the lower encoder layers' output over the writer inputs.
            input_ids: `(K, L)`, each row with its entity's name marked `<E_s> ... <E_e>` first.
            attention_mask: `(K, L)`, 1 on tokens, 0 on padding.

        Returns:
            `(K, entity_embed_dim)` rows.
        """
        starts = input_ids == self.entity_start_token_id
        if not starts.any(dim=1).all():
            row = int((~starts.any(dim=1)).nonzero()[0, 0])
            raise ValueError(f"writer input row {row} has no <E_s>: it must start with `<E_s> name <E_e>`")
        batch, length, _ = hidden_states.shape
        at_name = hidden_states[torch.arange(batch, device=hidden_states.device), starts.int().argmax(dim=1)]
        keys = self.pool_keys(hidden_states).view(batch, length, self.num_heads, self.head_dim)
        values = self.pool_values(hidden_states).view(batch, length, self.num_heads, self.head_dim)
        scores = torch.einsum("blhd,hd->bhl", keys, self.pool_queries.to(keys.dtype)) / self.head_dim**0.5
        scores = scores.float().masked_fill(attention_mask[:, None, :] == 0, float("-inf"))
        weights = torch.softmax(scores, dim=-1).to(values.dtype)
        pooled = torch.einsum("bhl,blhd->bhd", weights, values).reshape(batch, -1)
        return self.dropout(self.row_proj(self.layer_norm(torch.cat([at_name, pooled], dim=-1))))


def groups_by_length(
    input_ids: torch.LongTensor, attention_mask: torch.Tensor | None, texts_per_pass: int | None
) -> Iterator[tuple[torch.LongTensor, torch.LongTensor, torch.Tensor]]:
    """`(indices, input_ids, attention_mask)` of the writer's texts `texts_per_pass` at a time in order of length,
    each group cut after its longest text's last token (None: all of them as they are; no mask: no padding). A
    batch's texts vary in length, and one pass over them padded to the longest spends most of its work on padding
    (two thirds in the knowledge world's first stage); cutting only trailing padding keeps every token where it
    was, so that each row is the one pass's up to float rounding."""
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if texts_per_pass is None:
        yield torch.arange(input_ids.shape[0], device=input_ids.device), input_ids, attention_mask
        return
    positions = torch.arange(1, input_ids.shape[1] + 1, device=input_ids.device)
    ends = (attention_mask * positions).amax(dim=1).clamp(min=1)  # after each text's last token
    for texts in torch.argsort(ends).split(texts_per_pass):
        width = int(ends[texts].max())
        yield texts, input_ids[texts, :width], attention_mask[texts, :width]


def writer_input_ids(
    name_ids: list[int], passage_ids: list[int], config: EDMemConfig, max_length: int, bos_token_id: int | None
) -> list[int]:
    """`<s> <E_s> name <E_e> passage </s>` as token ids, at most `max_length` of them. The passage's own mention
    markers and sequence boundaries are dropped (the name in front says whom the text is about); a passage too long
    is cut around its first marked mention, as `entity_growth` cuts the passages it reads.

    `name_ids`: the name's tokens, as they follow `<E_s>` in running text; `passage_ids`: the passage's tokens,
    with or without `<s>`/`</s>` (a corpus passage has them).
    """
    start, end, eos = config.entity_start_token_id, config.entity_end_token_id, config.eos_token_id
    head = ([bos_token_id] if bos_token_id is not None else []) + [start, *name_ids, end]
    budget = max_length - len(head) - 1
    if budget < 0:
        raise ValueError(
            f"a writer input of at most {max_length} tokens cannot hold the name ({len(name_ids)} tokens)"
        )
    dropped = {start, end, eos, bos_token_id}
    first = next((i for i, token in enumerate(passage_ids) if token == start), 0)
    body = [token for token in passage_ids if token not in dropped]
    first -= sum(token in dropped for token in passage_ids[:first])
    begin = max(0, min(first - budget // 2, len(body) - budget))
    return head + body[begin : begin + budget] + [eos]


@dataclass
class RowsToWrite:
    """Texts the writer turns into rows within one forward pass, each read by both memories and the entity-linking
    head in place of its entity's table row: `entity_ids` `(K,)`, and `input_ids` / `attention_mask` `(K, L)`, the
    texts `<s> <E_s> name <E_e> passage </s>` (`writer_input_ids`). An entity given several times reads the mean of
    its texts' rows, or each row on its own with `config.writer_pools_texts` off. One argument of `forward`, as
    `past_key_values` is: a collator builds it (`research.writer_batches.WriterCollator` in training)."""

    entity_ids: torch.Tensor
    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None = None

    def to(self, device) -> RowsToWrite:
        """A copy with every tensor on `device` (Accelerate and DDP move a batch's fields with `.to`)."""
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        return type(self)(**{name: v.to(device) if torch.is_tensor(v) else v for name, v in moved.items()})

    def check(self, config: EDMemConfig, input_ids: torch.Tensor | None) -> None:
        """A ValueError naming what is wrong with these inputs for a model of `config` reading `input_ids`."""
        if self.input_ids.shape[0] != self.entity_ids.shape[0]:
            raise ValueError("rows_to_write needs input_ids with one row per entity of entity_ids")
        if ((self.entity_ids < 0) | (self.entity_ids >= config.entity_vocab_size)).any():
            raise ValueError(f"rows_to_write.entity_ids must be ids in 0..{config.entity_vocab_size - 1}")

    def written_rows(self, rows: torch.Tensor, config: EDMemConfig) -> WrittenRows:
        """The rows read, from the writer's `rows` `(K, d)`: one a text, or with `config.writer_pools_texts` the mean
        of an entity's."""
        ids = self.entity_ids.to(rows.device)
        distinct, owner = ids.unique(return_inverse=True)
        if distinct.numel() == ids.numel() or not config.writer_pools_texts:
            return WrittenRows(ids, rows)
        counts = torch.bincount(owner, minlength=distinct.numel()).to(rows.dtype)
        return WrittenRows(
            distinct, rows.new_zeros(distinct.numel(), rows.shape[1]).index_add(0, owner, rows) / counts[:, None]
        )


__all__ = ["EntityRowWriter", "RowsToWrite", "groups_by_length", "writer_input_ids"]

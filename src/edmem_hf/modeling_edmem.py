"""PyTorch EDMem: BART split into lower and upper layers, with an entity memory read at each `<E_s>` in between.

Read top-down: memory, outputs, input checks, encoder, decoder, model, heads. Copied to the Hub as custom code.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass

import torch
from huggingface_hub import ModelCard, ModelCardData
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.generation import GenerationConfig
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    MaskedLMOutput,
    ModelOutput,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import PreTrainedModel
from transformers.models.bart.modeling_bart import (
    BartAttention,
    BartDecoderLayer,
    BartEncoderLayer,
    BartLearnedPositionalEmbedding,
    BartScaledWordEmbedding,
    shift_tokens_right,
)
from transformers.utils import can_return_tuple, logging
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_edmem import EDMemConfig
from .entity_attention import IGNORE_INDEX, entity_attention
from .entity_index import EntityIndexMixin
from .entity_vocab import ENTITY_VOCAB_NAME, EntityVocab
from .generation_edmem import EDMemGenerationMixin
from .model_card import CARD_MARKER, README_NAME, edmem_model_card, is_edmem_card, save_model_card

logger = logging.get_logger(__name__)

# Written into config.json on save: every Auto class loads the Hub copy, whichever class was saved.
HUB_AUTO_MAP = {
    "AutoConfig": "configuration_edmem.EDMemConfig",
    "AutoModel": "modeling_edmem.EDMemModel",
    "AutoModelForSeq2SeqLM": "modeling_edmem.EDMemForConditionalGeneration",
}


# ---------------------------------------------------------------------------------------------------------------
# The entity memory and the entity-linking head
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


class EntityMemory(nn.Module):
    """The memory access between lower and upper layers (equations 1-2 of the paper).

    For each `<E_s>` the query `W_in h` attends to the entity table (all N entities in training, the top
    `memory_top_k` at inference); `m = W_out(sum_i alpha_i e_i)` at `<E_s>` and 0 elsewhere; the upper layers
    receive `LayerNorm(h + m)` at every position, as in the authors' released code. Dropout where theirs has it:
    `config.memory_dropout` after `W_in` and `W_out`, `config.upper_input_dropout` on what the upper layers receive.
    """

    entity_index = None  # an EntityIndex for the top-k at inference, set by model.set_entity_index

    def __init__(self, config: EDMemConfig):
        super().__init__()
        self.query_proj = nn.Linear(config.d_model, config.entity_embed_dim)
        self.output_proj = nn.Linear(config.entity_embed_dim, config.d_model)
        self.layer_norm = nn.LayerNorm(config.d_model)
        self.projection_dropout = nn.Dropout(config.memory_dropout)
        self.upper_input_dropout = nn.Dropout(config.upper_input_dropout)
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
            upper_input = self.upper_input_dropout(self.layer_norm(hidden_states))
            return upper_input, _empty_access(positions, hidden_states, need_nll)
        queries = self.projection_dropout(self.query_proj(hidden_states[mention_mask]))
        result = entity_attention(
            queries,
            entity_table,
            labels=entity_labels[mention_mask] if need_nll else None,
            entity_mask=entity_mask,
            top_k=None if self.training else self.top_k,
            chunk_size=self.chunk_size,
            compute_read=True,
            return_top_k=return_top_k,
            index=None if self.training else self.entity_index,
        )
        update = torch.zeros_like(hidden_states)
        read = self.projection_dropout(self.output_proj(result.read.to(hidden_states.dtype)))
        update[mention_mask] = read.to(update.dtype)  # autocast
        hidden_states = self.upper_input_dropout(self.layer_norm(hidden_states + update))
        access = EntityMemoryAccess(
            positions=positions,
            top_entity_ids=result.top_ids,
            top_entity_scores=result.top_scores,
            entity_nll=result.nll,
        )
        return hidden_states, access


class EntityLinkingHead(nn.Module):
    """Scores the entities for the hidden state of each `<E_s>`: `W_in h` against the entity table (eq. 2), with
    `config.memory_dropout` after `W_in` as in the authors' code."""

    entity_index = None  # an EntityIndex for the top-k at inference, set by model.set_entity_index

    def __init__(self, config: EDMemConfig):
        super().__init__()
        self.query_proj = nn.Linear(config.d_model, config.entity_embed_dim)
        self.projection_dropout = nn.Dropout(config.memory_dropout)
        self.chunk_size = config.memory_chunk_size

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
            return_top_k: report the best entities of each mention.
        """
        positions = mention_mask.nonzero()
        queries = self.projection_dropout(self.query_proj(hidden_states[mention_mask]))
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
            index=None if self.training else self.entity_index,
        )
        return EntityMemoryAccess(
            positions=positions,
            top_entity_ids=result.top_ids,
            top_entity_scores=result.top_scores,
            entity_nll=result.nll,
        )


class MaskedLMHead(nn.Module):
    """EncMem's masked-LM head, BERT-style as in the authors' EncMem: `dense -> dropout -> activation -> LayerNorm`,
    then the tied token embeddings with a bias of its own (`decoder.bias`, resized with the vocabulary)."""

    def __init__(self, config: EDMemConfig):
        super().__init__()
        self.dense = nn.Linear(config.d_model, config.d_model)
        self.activation = ACT2FN[config.activation_function]
        self.layer_norm = nn.LayerNorm(config.d_model)
        self.dropout = config.dropout
        self.decoder = nn.Linear(config.d_model, config.vocab_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """`(batch, seq, d_model)` -> `(batch, seq, vocab_size)` logits."""
        hidden_states = nn.functional.dropout(self.dense(hidden_states), p=self.dropout, training=self.training)
        hidden_states = self.layer_norm(self.activation(hidden_states))
        return self.decoder(hidden_states)


def _empty_access(positions: torch.Tensor, like: torch.Tensor, need_nll: bool) -> EntityMemoryAccess:
    return EntityMemoryAccess(
        positions=positions, entity_nll=like.new_zeros(0, dtype=torch.float32) if need_nll else None
    )


# ---------------------------------------------------------------------------------------------------------------
# Outputs: Transformers' classes plus the memory accesses
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class EDMemEncoderOutput(BaseModelOutput):
    """`BaseModelOutput` plus the lower layers' output and the encoder's memory access.

    Args:
        lower_hidden_state (`torch.FloatTensor` of shape `(batch_size, sequence_length, hidden_size)`):
            `h_lower`, the lower encoder layers' output before the memory is merged into it (kept only when the
            lower decoder layers attend to it, as the authors' `lower_encoder` option does).
        memory_access (`EntityMemoryAccess`): the memory read at each `<E_s>` of the input (when asked for with
            `output_attended_entities`, or when `entity_labels` make it part of the loss).
    """

    lower_hidden_state: torch.FloatTensor | None = None
    memory_access: EntityMemoryAccess | None = None


@dataclass
class EDMemDecoderOutput(BaseModelOutputWithPastAndCrossAttentions):
    """`BaseModelOutputWithPastAndCrossAttentions` plus the decoder's memory access (see `EDMemEncoderOutput`)."""

    memory_access: EntityMemoryAccess | None = None


@dataclass
class EDMemModelOutput(Seq2SeqModelOutput):
    """`Seq2SeqModelOutput` plus the memory accesses of encoder and decoder (see `EDMemEncoderOutput`)."""

    encoder_attended_entities: EntityMemoryAccess | None = None
    decoder_attended_entities: EntityMemoryAccess | None = None


@dataclass
class EDMemSeq2SeqLMOutput(Seq2SeqLMOutput):
    """`Seq2SeqLMOutput` plus EDMem's losses and entity predictions.

    Args:
        lm_loss (`torch.FloatTensor` of shape `()`): token negative log-likelihood of `labels`; `loss` is
            `lm_loss + config.entity_loss_weight * entity_loss`.
        entity_loss (`torch.FloatTensor` of shape `()`): mean entity negative log-likelihood, averaged over the
            memory accesses and the entity-linking head that have labelled mentions (0 when no mention is
            labelled), or as `config.entity_loss_reduction` says.
        encoder_attended_entities / decoder_attended_entities (`EntityMemoryAccess`): the entities each `<E_s>`
            attended to in the memory, with their scores (with `output_attended_entities=True`).
        linked_entities (`EntityMemoryAccess`): the entity-linking head's predictions at each decoder `<E_s>` (with
            `output_attended_entities=True` or `entity_linking_top_k`).
    """

    lm_loss: torch.FloatTensor | None = None
    entity_loss: torch.FloatTensor | None = None
    encoder_attended_entities: EntityMemoryAccess | None = None
    decoder_attended_entities: EntityMemoryAccess | None = None
    linked_entities: EntityMemoryAccess | None = None


@dataclass
class EDMemEntityLinkingOutput(MaskedLMOutput):
    """`MaskedLMOutput` of the encoder-only EncMem variant plus its losses and entity predictions."""

    lm_loss: torch.FloatTensor | None = None
    entity_loss: torch.FloatTensor | None = None
    attended_entities: EntityMemoryAccess | None = None
    linked_entities: EntityMemoryAccess | None = None


# ---------------------------------------------------------------------------------------------------------------
# Input checks
# ---------------------------------------------------------------------------------------------------------------


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
# Pre-trained model base, encoder and decoder
# ---------------------------------------------------------------------------------------------------------------


class EDMemPreTrainedModel(EntityIndexMixin, PreTrainedModel):
    config_class = EDMemConfig
    config: EDMemConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = [r"BartEncoderLayer", r"BartDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    # Neither torch.compile(fullgraph=True) nor torch.export: the memory reads a data-dependent number of mentions.
    _can_compile_fullgraph = False

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
        return self.memory(
            hidden_states,
            input_ids == self.config.entity_start_token_id,
            self.entity_embeddings.weight,
            entity_labels=entity_labels,
            entity_mask=self._get_entity_mask(hidden_states.device),
            return_top_k=self.config.memory_top_k if output_attended_entities else None,
        )


class EDMemEncoder(EDMemPreTrainedModel):
    """BART encoder with an entity memory between its lower and upper layers.

    `layers[:encoder_lower_layers]` are the lower layers; the names match BART's so that BART weights load.
    """

    _can_record_outputs = {"hidden_states": BartEncoderLayer, "attentions": BartAttention}

    def __init__(self, config: EDMemConfig):
        super().__init__(config)
        self.dropout = config.dropout
        self.layerdrop = config.encoder_layerdrop
        embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_tokens = BartScaledWordEmbedding(
            config.vocab_size, config.d_model, config.pad_token_id, embed_scale=embed_scale
        )
        self.embed_positions = BartLearnedPositionalEmbedding(config.max_position_embeddings, config.d_model)
        self.layers = nn.ModuleList([BartEncoderLayer(config, layer_idx=i) for i in range(config.encoder_layers)])
        self.layernorm_embedding = nn.LayerNorm(config.d_model)
        if config.variant != "encdec":
            self.entity_embeddings = nn.Embedding(config.entity_vocab_size, config.entity_embed_dim)
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
        output_attended_entities: bool = False,
        **kwargs,
    ) -> EDMemEncoderOutput:
        r"""
        input_ids: `(batch, seq)`; mentions are found by their `<E_s>` tokens (`inputs_embeds` alone cannot show
            them, so a model with a memory needs `input_ids`).
        entity_labels: `(batch, seq)`, the entity id at each `<E_s>`, -100 elsewhere.
        output_attended_entities: report the memory's top entities for each `<E_s>`.
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

        access = lower_hidden_state = None
        for idx, layer in enumerate(self.layers):
            if idx == self.config.encoder_lower_layers and has_memory:
                lower_hidden_state = hidden_states  # before the memory is merged, as in the authors' code
                hidden_states, access = self._read_memory(
                    hidden_states, input_ids, entity_labels, output_attended_entities
                )
            if self.training and self.layerdrop > 0.0 and torch.rand([]) < self.layerdrop:
                continue
            hidden_states = layer(hidden_states, attention_mask, **kwargs)
        if has_memory and self.config.encoder_upper_layers == 0:
            lower_hidden_state = hidden_states
            hidden_states, access = self._read_memory(
                hidden_states, input_ids, entity_labels, output_attended_entities
            )
        return EDMemEncoderOutput(
            last_hidden_state=hidden_states,
            lower_hidden_state=lower_hidden_state if self.config.lower_decoder_attends_to == "lower" else None,
            memory_access=access if output_attended_entities or entity_labels is not None else None,
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

    def __init__(self, config: EDMemConfig):
        super().__init__(config)
        self.dropout = config.dropout
        self.layerdrop = config.decoder_layerdrop
        embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_tokens = BartScaledWordEmbedding(
            config.vocab_size, config.d_model, config.pad_token_id, embed_scale=embed_scale
        )
        self.embed_positions = BartLearnedPositionalEmbedding(config.max_position_embeddings, config.d_model)
        self.layers = nn.ModuleList([BartDecoderLayer(config, layer_idx=i) for i in range(config.decoder_layers)])
        self.layernorm_embedding = nn.LayerNorm(config.d_model)
        if config.variant == "edmem":
            self.entity_embeddings = nn.Embedding(config.entity_vocab_size, config.entity_embed_dim)
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
        output_attended_entities: bool = False,
        **kwargs,
    ) -> EDMemDecoderOutput:
        r"""
        input_ids: `(batch, tgt_len)` decoder inputs (only the new tokens when a cache is given).
        encoder_hidden_states: `(batch, src_len, d_model)` final encoder output.
        encoder_lower_hidden_states: `(batch, src_len, d_model)` the lower encoder layers' output (before the memory
            merge), attended to by the lower decoder layers when `config.lower_decoder_attends_to == "lower"`.
        entity_labels: `(batch, tgt_len)` aligned with `input_ids`: the entity id at each `<E_s>`, -100 elsewhere.
        output_attended_entities: report the memory's top entities for each `<E_s>`.
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
        if attention_mask is None:
            attention_mask = torch.ones(batch_size, past_length + seq_length, device=inputs_embeds.device)
        if attention_mask.shape[-1] != past_length + seq_length:
            raise ValueError(
                f"decoder_attention_mask covers {attention_mask.shape[-1]} positions: it must cover the "
                f"{past_length} cached and {seq_length} new ones"
            )
        # Positions count the unmasked tokens, as the authors' decoder does: a left-padded row reads as if unpadded.
        position_ids = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)[:, -seq_length:]
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
        # (BartLearnedPositionalEmbedding takes one row of positions for the whole batch; these are per row.)
        offset_ids = position_ids + self.embed_positions.offset
        positions = nn.functional.embedding(offset_ids, self.embed_positions.weight).to(inputs_embeds.device)
        hidden_states = self.layernorm_embedding(inputs_embeds + positions)
        hidden_states = nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)
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
            last_hidden_state=hidden_states,
            past_key_values=past_key_values,
            memory_access=access if output_attended_entities or entity_labels is not None else None,
        )


# ---------------------------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------------------------


class _QueriesTaken(Exception):
    """Raised by `memory_queries`' hook once the memory's queries are taken, to end the encoder's forward there."""


def _crop_around_first_mention(ids: list[int], start_id: int, max_length: int) -> list[int]:
    """`max_length` tokens of `ids` with its first `<E_s>` in the middle (all of `ids` when short enough)."""
    if len(ids) <= max_length:
        return ids
    first = ids.index(start_id) if start_id in ids else 0
    begin = max(0, min(first - max_length // 2, len(ids) - max_length))
    return ids[begin : begin + max_length]


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
        self._entity_trie = None  # spelled the old vocabulary's names

    @torch.no_grad()
    def memory_queries(
        self, passages: list[list[str]], tokenizer, batch_size: int = 32, max_length: int = 128
    ) -> torch.Tensor:
        """`(len(passages), entity_embed_dim)`: for each list of texts, the mean of the memory's queries (`W_in h` of
        the encoder's lower layers at each `<E_s>`) over its marked mentions: what the memory is asked there.

        A passage longer than `max_length` tokens is cut to `max_length` tokens (at most the model's positions)
        around its first mention. A list without a single marked mention is a ValueError naming its index.
        """
        max_length = min(max_length, self.config.max_position_embeddings)
        encoder = self.get_encoder()
        queries: list[torch.Tensor] = []

        def ask(memory, args):  # the encoder stops at the memory: no read of the table, no upper layers
            queries.append(memory.query_proj(args[0][args[1]]))
            raise _QueriesTaken

        hook = encoder.memory.register_forward_pre_hook(ask)
        owners = [i for i, texts in enumerate(passages) for _ in texts]
        texts = [text for texts in passages for text in texts]
        counts = torch.zeros(len(passages), dtype=torch.long)
        sums = torch.zeros(len(passages), self.config.entity_embed_dim)
        was_training = self.training
        self.eval()
        try:
            for begin in range(0, len(texts), batch_size):
                crops = [_crop_around_first_mention(ids, self.config.entity_start_token_id, max_length)
                         for ids in tokenizer(texts[begin : begin + batch_size]).input_ids]  # fmt: skip
                batch = tokenizer.pad({"input_ids": crops}, return_tensors="pt").to(self.device)
                queries.clear()
                try:
                    encoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
                except _QueriesTaken:
                    pass
                starts = batch.input_ids == self.config.entity_start_token_id
                rows = torch.tensor(owners[begin : begin + batch_size])[starts.nonzero()[:, 0].cpu()]
                if queries:
                    sums.index_add_(0, rows, queries[0].float().cpu())
                counts += torch.bincount(rows, minlength=len(passages))
        finally:
            hook.remove()
            self.train(was_training)
        if (counts == 0).any():
            raise ValueError(f"no marked mention in passages[{int((counts == 0).nonzero()[0, 0])}]")
        return sums / counts[:, None]

    @torch.no_grad()
    def add_entities(
        self,
        names: list[str],
        passages: list[list[str]] | None = None,
        tokenizer=None,
        *,
        rows: torch.Tensor | None = None,
        batch_size: int = 32,
        max_length: int = 128,
    ) -> list[int]:
        """Appends entities to the memory of a trained model, without gradient steps; returns their ids.

        A new row is what the memory is asked at the entity's mentions: `memory_queries(passages)`, each scaled to
        the mean norm of the existing rows (attention scores are dot products: a row far shorter or longer than the
        others would never, or always, win; benchmarks/toy_world_growth.py measures the choice). Every tied copy
        of the table grows, and so do `config.entity_vocab_size`, `entity_vocab` (the prefix tree of names is
        rebuilt on the next constrained decoding) and an entity mask set with `set_entity_mask` (the new entities
        visible).

        Args:
            names: the new entities' names: not in `entity_vocab`, not blank, no repeats.
            passages: `passages[i]`, texts about `names[i]` in which its mentions (and only its) are marked
                `<E_s> ... <E_e>`; each entity needs at least one. See `memory_queries` for `batch_size` and
                `max_length`.
            tokenizer: the model's tokenizer (with `<E_s>` and `<E_e>`).
            rows: instead of `passages` and `tokenizer`, the new rows themselves, `(len(names), entity_embed_dim)`
                (another estimator's).
        """
        if self.config.variant == "encdec":
            raise ValueError("an 'encdec' EDMem has no entity memory to add entities to")
        if self.entity_vocab is None:
            raise ValueError("add_entities needs model.entity_vocab: the new names are appended to it")
        seen: set[str] = set()
        for name in names:
            if not isinstance(name, str) or not name.strip():
                raise ValueError(f"add_entities: an empty or non-string entity name: {name!r}")
            if name in self.entity_vocab or name in seen:
                raise ValueError(f"add_entities: entity {name!r} is already in the vocabulary or named twice")
            seen.add(name)
        table = self.get_encoder().entity_embeddings.weight
        if (rows is None) == (passages is None) or (passages is not None and tokenizer is None):
            raise ValueError("add_entities takes either passages with their tokenizer, or rows")
        if rows is None:
            if len(names) != len(passages):
                raise ValueError(f"add_entities: {len(names)} names but {len(passages)} passage lists")
            marker = tokenizer.convert_ids_to_tokens(self.config.entity_start_token_id)
            for name, texts in zip(names, passages):
                if not any(marker in text for text in texts):
                    raise ValueError(f"add_entities: no marked mention of {name!r} in its passages")
            means = self.memory_queries(passages, tokenizer, batch_size=batch_size, max_length=max_length)
            rows = means / means.norm(dim=-1, keepdim=True) * table.norm(dim=-1).mean().cpu()
        elif tuple(rows.shape) != (len(names), table.shape[1]):
            raise ValueError(
                f"add_entities: rows of shape {tuple(rows.shape)}, expected ({len(names)}, {table.shape[1]})"
            )
        grown = nn.Parameter(torch.cat([table.detach(), rows.to(table)]), requires_grad=table.requires_grad)
        for module in self.modules():
            if isinstance(getattr(module, "entity_embeddings", None), nn.Embedding):
                module.entity_embeddings.weight = grown
                module.entity_embeddings.num_embeddings = grown.shape[0]
        first = self.config.entity_vocab_size
        self.config.entity_vocab_size = first + len(names)
        vocab = self.entity_vocab
        self.entity_vocab = EntityVocab(vocab.names + list(names), vocab.aliases + [[] for _ in names],
                                        vocab.counts + [0 for _ in names], vocab.id_space)  # fmt: skip
        mask = self._get_entity_mask("cpu")
        if mask is not None:
            self.set_entity_mask(torch.cat([mask, torch.ones(len(names), dtype=torch.bool)]))
        return list(range(first, first + len(names)))

    # What the model card says that only the user knows: license (default apache-2.0), datasets, eval_results
    # (with model_name), tags, ... (a huggingface_hub.ModelCardData; see model_card.py).
    card_data: ModelCardData | None = None

    def model_card(self, path: str, notes: str = "") -> ModelCard:
        """This model's card (README.md), with `path` (a folder or a Hub repository id) in its usage snippet."""
        return edmem_model_card(
            self.config,
            path,
            card_data=self.card_data,
            architecture=type(self).__name__,
            num_parameters=self.num_parameters(),
            notes=notes,
        )

    def save_pretrained(self, save_directory, *args, overwrite_model_card: bool = False, **kwargs):
        """`PreTrainedModel.save_pretrained`, plus `entity_vocab.json` and a model card (README.md). A README.md of
        the user's (one we did not write) is kept unless `overwrite_model_card=True`."""
        self.config.auto_map = HUB_AUTO_MAP.copy()
        if kwargs.get("push_to_hub"):
            # Transformers' upload would replace README.md with the Hub's card or a generic one: ours goes up.
            repo_id = kwargs.pop("repo_id", os.path.basename(os.path.normpath(os.fspath(save_directory))))
            push = {
                key: kwargs.pop(key) for key in ("commit_message", "create_pr", "token", "private") if key in kwargs
            }
            kwargs.pop("push_to_hub")
            self.save_pretrained(save_directory, *args, overwrite_model_card=overwrite_model_card, **kwargs)
            return self._upload_with_card(save_directory, repo_id, **push)
        super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            if self.entity_vocab is not None:
                self.entity_vocab.save(os.path.join(os.fspath(save_directory), ENTITY_VOCAB_NAME))
            save_model_card(self.model_card(os.fspath(save_directory)), save_directory, overwrite=overwrite_model_card)

    def push_to_hub(
        self,
        repo_id: str,
        *,
        commit_message: str | None = None,
        commit_description: str | None = None,
        private: bool | None = None,
        token: bool | str | None = None,
        revision: str | None = None,
        create_pr: bool = False,
        max_shard_size: int | str | None = "50GB",
        tags: list[str] | None = None,
    ):
        """`PreTrainedModel.push_to_hub`, with this model's card as README.md unless the repository already has a
        card of the user's (Transformers' own would upload the Hub's card or a generic one)."""
        with tempfile.TemporaryDirectory() as folder:
            self.save_pretrained(folder, max_shard_size=max_shard_size)
            return self._upload_with_card(
                folder,
                repo_id,
                commit_message=commit_message,
                commit_description=commit_description,
                private=private,
                token=token,
                revision=revision,
                create_pr=create_pr,
                tags=tags,
            )

    def _upload_with_card(self, folder, repo_id: str, *, token=None, private=None, tags=None, **commit):
        """Uploads a saved folder with a README.md: the folder's if it is the user's, else the Hub repository's if it
        is the user's, else ours (its snippet loading `repo_id`); `tags` are added to it."""
        from huggingface_hub import HfApi
        from huggingface_hub.errors import EntryNotFoundError

        api = HfApi(token=token)
        repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
        readme = os.path.join(os.fspath(folder), README_NAME)
        users_readme = os.path.isfile(readme) and not is_edmem_card(folder)
        if users_readme:
            with open(readme, encoding="utf-8") as f:
                card = ModelCard(f.read())
        else:
            try:
                card = ModelCard.load(repo_id, token=token)
            except EntryNotFoundError:
                card = None
            if card is None or CARD_MARKER in card.text:
                card = self.model_card(repo_id)
        known = card.data.tags or []
        added = [tag for tag in dict.fromkeys([*(self.model_tags or []), *(tags or [])]) if tag not in known]
        if added:
            card.data.tags = known + added
        if added or not users_readme:
            card.save(readme)
        commit["commit_message"] = commit.get("commit_message") or "Upload EDMem"
        return api.upload_folder(repo_id=repo_id, folder_path=folder, **commit)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        loaded = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        model = loaded[0] if kwargs.get("output_loading_info") else loaded  # (model, loading info)
        vocab_file = _resolve_entity_vocab_file(pretrained_model_name_or_path, kwargs)
        if vocab_file is not None:
            vocab = EntityVocab.load(vocab_file)
            if len(vocab) != model.config.entity_vocab_size:
                raise ValueError(
                    f"checkpoint mismatch in {pretrained_model_name_or_path}: {ENTITY_VOCAB_NAME} lists {len(vocab)} "
                    f"entities but the entity table has {model.config.entity_vocab_size} rows"
                )
            model.entity_vocab = vocab
        return loaded


def _resolve_entity_vocab_file(path, kwargs) -> str | None:
    """Finds `entity_vocab.json` in a local directory or a Hub repository; None when there is none."""
    if path is None:  # from_pretrained(None, config=..., state_dict=...)
        return None
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


def _tied_weights_keys(variant: str) -> dict[str, str]:
    """`{target: source}`: the token embeddings and the entity table the encoder and decoder hold are the model's."""
    stacks = ["encoder"] if variant == "encmem" else ["encoder", "decoder"]
    tied = {f"{stack}.embed_tokens.weight": "shared.weight" for stack in stacks}
    if variant != "encdec":
        tied.update({f"{stack}.entity_embeddings.weight": "entity_embeddings.weight" for stack in stacks})
    return tied


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
        self.encoder = EDMemEncoder(config)
        if config.variant != "encmem":
            self.decoder = EDMemDecoder(config)
        self._tied_weights_keys = _tied_weights_keys(config.variant)
        self.post_init()

    def get_input_embeddings(self):
        return self.shared

    def set_input_embeddings(self, value):
        self.shared = value
        self.encoder.embed_tokens = self.shared
        if self.config.variant != "encmem":
            self.decoder.embed_tokens = self.shared

    @can_return_tuple
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
        output_attended_entities: bool = False,
        **kwargs,
    ) -> EDMemModelOutput:
        r"""
        input_ids: `(batch, src_len)` with `<E_s> ... <E_e>` around mentions.
        decoder_input_ids: `(batch, tgt_len)`; if absent, `input_ids` shifted right (denoising, as in BART).
        entity_labels: `(batch, src_len)`, the entity id at each `<E_s>` of `input_ids`, -100 elsewhere.
        decoder_entity_labels: `(batch, tgt_len)` aligned with `decoder_input_ids` (already shifted).
        output_attended_entities: report each memory access's top entities.
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
                return_dict=True,
                **kwargs,
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
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
            return_dict=True,
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
    accesses: list[EntityMemoryAccess | None], params: list[torch.Tensor], table: torch.Tensor, reduction: str
) -> torch.Tensor:
    """Mean NLL per access, averaged over the accesses that have labelled mentions (0 when none has), or with
    `reduction="all_accesses"` summed and divided by the number of accesses (see `EDMemConfig`).

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
    if reduction == "all_accesses":
        return torch.stack(per_access).sum() / len(accesses) + anchor
    return torch.stack(per_access).mean() + anchor


def _lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the scored tokens; 0 when none is (a batch of static linking targets, which score only
    the entity-linking head), not the NaN of an empty mean."""
    labels = labels.to(logits.device)
    if not (labels != IGNORE_INDEX).any():
        return logits.float().sum() * 0.0
    return nn.functional.cross_entropy(
        logits.float().view(-1, logits.shape[-1]), labels.view(-1), ignore_index=IGNORE_INDEX
    )


class EDMemForConditionalGeneration(EDMemGenerationMixin, _EntityVocabMixin, EDMemPreTrainedModel):
    """EDMem with an LM head (tied to the input embeddings) and an entity-linking head on the decoder.

    `generate(entity_decoding="free" | "static" | "dynamic")` comes from `EDMemGenerationMixin`.
    """

    base_model_prefix = "model"
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
            self.generation_config = GenerationConfig(
                **settings, entity_decoding="free", entity_candidates=5, static_linking_input="start"
            )

    def resize_token_embeddings(self, new_num_tokens: int, pad_to_multiple_of=None, mean_resizing: bool = True):
        new_embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        old = self.final_logits_bias
        num = new_embeddings.weight.shape[0]
        bias = old[:, :num] if num <= old.shape[-1] else torch.cat([old, old.new_zeros(1, num - old.shape[-1])], dim=1)
        self.final_logits_bias = nn.Buffer(bias)
        return new_embeddings

    @can_return_tuple
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
        output_attended_entities: bool = False,
        entity_linking_top_k: int | None = None,
        **kwargs,
    ) -> EDMemSeq2SeqLMOutput:
        r"""
        labels: `(batch, tgt_len)` target tokens, -100 where not scored; the decoder input is `labels` shifted
            right unless `decoder_input_ids` is given.
        entity_labels: `(batch, src_len)` entity id at each `<E_s>` of `input_ids`, -100 elsewhere.
        decoder_entity_labels: `(batch, tgt_len)` aligned with `labels`: the entity id at each `<E_s>` of `labels`,
            -100 elsewhere. Shifted right with `labels`, so that each sits where the decoder reads that `<E_s>`.
            It supervises the decoder's memory access and the entity-linking head.
        output_attended_entities: report what each memory access attended to and the entity-linking head's
            `memory_top_k` best entities at each decoder `<E_s>`.
        entity_linking_top_k: report the entity-linking head's `entity_linking_top_k` best entities at each decoder
            `<E_s>` (dynamic decoding asks for them at every step).
        """
        config = self.config
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = shift_tokens_right(labels, config.pad_token_id, config.decoder_start_token_id)
        if decoder_entity_labels is not None:
            if labels is None or decoder_input_ids is None:
                raise ValueError(
                    "decoder_entity_labels are aligned with labels: pass labels too (and token ids, not embeds)"
                )
            if decoder_entity_labels.shape != labels.shape:
                raise ValueError(
                    f"decoder_entity_labels has shape {tuple(decoder_entity_labels.shape)} but labels "
                    f"{tuple(labels.shape)}: they are aligned"
                )
            decoder_entity_labels = shift_tokens_right(decoder_entity_labels, IGNORE_INDEX, IGNORE_INDEX)
            check_entity_labels(
                decoder_entity_labels, decoder_input_ids, config, "decoder_entity_labels (shifted right with labels)"
            )
        if decoder_input_ids is None and decoder_inputs_embeds is None and input_ids is not None:
            # as EDMemModel would (denoising): the entity-linking head needs to see the decoder's <E_s>
            decoder_input_ids = shift_tokens_right(input_ids, config.pad_token_id, config.decoder_start_token_id)
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
            decoder_entity_labels=decoder_entity_labels if config.variant == "edmem" else None,
            output_attended_entities=output_attended_entities,
            return_dict=True,
            **kwargs,
        )
        logits = self.lm_head(outputs.last_hidden_state) + self.final_logits_bias.to(outputs.last_hidden_state.device)

        linked = None
        if entity_linking_top_k is None and output_attended_entities:
            entity_linking_top_k = config.memory_top_k
        if config.variant == "edmem" and (entity_linking_top_k or decoder_entity_labels is not None):
            linked = self._link_mentions(
                outputs.last_hidden_state, decoder_input_ids, decoder_entity_labels, entity_linking_top_k
            )

        loss = lm_loss = entity_loss = None
        if labels is not None:
            loss = lm_loss = _lm_loss(logits, labels)
            if config.variant != "encdec":
                memory_modules = [self.model.encoder.memory]
                if config.variant == "edmem":
                    memory_modules += [self.model.decoder.memory, self.entity_linking_head]
                entity_loss = _mean_entity_loss(
                    [outputs.encoder_attended_entities, outputs.decoder_attended_entities, linked],
                    [p for module in memory_modules for p in module.parameters()],
                    self.model.entity_embeddings.weight,
                    config.entity_loss_reduction,
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

    def _link_mentions(
        self,
        hidden_states: torch.Tensor,
        decoder_input_ids: torch.Tensor,
        decoder_entity_labels: torch.Tensor | None = None,
        top_k: int | None = None,
    ) -> EntityMemoryAccess:
        """The entity-linking head at each `<E_s>` of the decoder input: its NLL against the labels, its top-k."""
        return self.entity_linking_head(
            hidden_states,
            decoder_input_ids == self.config.entity_start_token_id,
            self.model.entity_embeddings.weight,
            entity_labels=decoder_entity_labels,
            entity_mask=self._get_entity_mask(hidden_states.device),
            return_top_k=top_k,
        )

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)


class EDMemForEntityLinking(_EntityVocabMixin, EDMemPreTrainedModel):
    """The encoder-only EncMem variant (EaE-style auto-encoder): encoder + memory, an entity-linking head on the
    final encoder states and a BERT-style masked-LM head. Predicts the entity of every `<E_s>` in the input."""

    _tied_weights_keys = {"lm_head.decoder.weight": "model.shared.weight"}

    def __init__(self, config: EDMemConfig):
        super().__init__(config)
        if config.variant != "encmem":
            raise ValueError(
                f"EDMemForEntityLinking is the 'encmem' variant; got a config with variant={config.variant!r}"
            )
        self.model = EDMemModel(config)
        self.lm_head = MaskedLMHead(config)
        self.entity_linking_head = EntityLinkingHead(config)
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.lm_head.decoder = new_embeddings

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        entity_labels: torch.LongTensor | None = None,
        labels: torch.LongTensor | None = None,
        output_attended_entities: bool = False,
        **kwargs,
    ) -> EDMemEntityLinkingOutput:
        r"""
        input_ids: `(batch, seq)` with `<E_s> ... <E_e>` around mentions.
        entity_labels: `(batch, seq)` entity id at each `<E_s>`, -100 elsewhere.
        labels: `(batch, seq)` masked-LM targets (original tokens where the input was masked, -100 elsewhere).
        output_attended_entities: report what the memory attended to and the head's best entities at each `<E_s>`.
        """
        if input_ids is None:
            raise ValueError("EDMemForEntityLinking needs input_ids: mentions are found by their <E_s> tokens")
        encoder_outputs = self.model.encoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            entity_labels=entity_labels,
            output_attended_entities=output_attended_entities,
            return_dict=True,
            **kwargs,
        )
        hidden = encoder_outputs.last_hidden_state
        logits = self.lm_head(hidden)
        linked = None
        if output_attended_entities or entity_labels is not None:
            linked = self.entity_linking_head(
                hidden,
                input_ids == self.config.entity_start_token_id,
                self.model.entity_embeddings.weight,
                entity_labels=entity_labels,
                entity_mask=self._get_entity_mask(hidden.device),
                return_top_k=self.config.memory_top_k if output_attended_entities else None,
            )
        loss = lm_loss = entity_loss = None
        if labels is not None or entity_labels is not None:
            entity_loss = _mean_entity_loss(
                [encoder_outputs.memory_access, linked],
                [p for m in (self.model.encoder.memory, self.entity_linking_head) for p in m.parameters()],
                self.model.entity_embeddings.weight,
                self.config.entity_loss_reduction,
            )
            loss = self.config.entity_loss_weight * entity_loss
            if labels is not None:
                lm_loss = _lm_loss(logits, labels)
                loss = loss + lm_loss
        return EDMemEntityLinkingOutput(
            loss=loss,
            lm_loss=lm_loss,
            entity_loss=entity_loss,
            logits=logits,
            hidden_states=encoder_outputs.hidden_states,
            attentions=encoder_outputs.attentions,
            attended_entities=encoder_outputs.memory_access,
            linked_entities=linked,
        )


__all__ = [
    "EDMemDecoder",
    "EDMemEncoder",
    "EDMemForConditionalGeneration",
    "EDMemForEntityLinking",
    "EDMemModel",
    "EDMemPreTrainedModel",
    "EntityLinkingHead",
    "MaskedLMHead",
    "EntityMemory",
    "EntityMemoryAccess",
]

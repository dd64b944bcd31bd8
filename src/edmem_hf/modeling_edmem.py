"""PyTorch EDMem: BART split into lower and upper layers, with an entity memory read at each `<E_s>` in between.

Read top-down: the memory and the heads' modules (`EntityMemory`, `EntityLinkingHead`, `MaskedLMHead`); output
classes; input checks; the pre-trained base; `EDMemEncoder` and `EDMemDecoder`; the bare models (`EDMemModel`, the
EncDec baseline's `EDMemEncDecModel`, the encoder-only `EDMemEncMemModel`); the models with heads
(`EDMemForConditionalGeneration`, `EDMemEncDecForConditionalGeneration`, `EDMemForEntityLinking`); and the table of
each variant's classes (`VARIANT_CLASSES`). A class builds one variant: none branches on `config.variant`. Saving and
loading are in `hub_edmem.py`, generation in `generation_edmem.py`, input checks in `input_checks.py`; the memory's
growth is this package's `research.entity_growth`. Copied to the Hub as custom code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
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

from .configuration_edmem import IGNORE_INDEX, EDMemConfig
from .entity_attention import EntityTable, WrittenRows, entity_attention
from .entity_index import EntityIndexMixin
from .entity_writer import WRITER_TEXTS_PER_PASS, EntityRowWriter, RowsToWrite, groups_by_length
from .generation_edmem import EDMemGenerationMixin
from .hub_edmem import EDMemHubMixin
from .input_checks import check_entity_labels, check_mention_markers
from .name_candidates import NameCandidatesMixin, candidate_read

logger = logging.get_logger(__name__)


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


def key_queries(queries: torch.Tensor, row_width: int) -> torch.Tensor:
    """`(M, entity_key_dim)` queries padded with zeros to `row_width`: they score the key columns of a row only
    (`config.entity_key_dim`); queries as wide as the row are returned as they are."""
    if queries.shape[-1] == row_width:
        return queries
    return nn.functional.pad(queries, (0, row_width - queries.shape[-1]))


class EntityMemory(nn.Module):
    """The memory access between lower and upper layers (equations 1-2 of the paper).

    For each `<E_s>` the query `W_in h` attends to the entity table (all N entities in training, the top
    `memory_top_k` at inference); `m = W_out(sum_i alpha_i e_i)` at `<E_s>` and 0 elsewhere; the upper layers
    receive `LayerNorm(h + m)` at every position, as in the authors' released code. Dropout where theirs has it:
    `config.memory_dropout` after `W_in` and `W_out`, `config.upper_input_dropout` on what the upper layers receive.
    """

    entity_index = None  # an EntityIndex for the top-k at inference, set by model.set_entity_index
    name_lookup = None  # a NameCandidates for the name-guided read, set by model.set_name_candidates

    def __init__(self, config: EDMemConfig):
        super().__init__()
        self.query_proj = nn.Linear(config.d_model, config.entity_key_dim or config.entity_embed_dim)
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
        written_rows: WrittenRows | None = None,
        candidates: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, EntityMemoryAccess]:
        """
        Args:
            hidden_states: `(batch, seq, d_model)` output of the lower layers.
            mention_mask: `(batch, seq)` bool, True at `<E_s>`.
            entity_table: `(N, entity_embed_dim)`.
            entity_labels: `(batch, seq)` entity ids at `<E_s>`, -100 elsewhere.
            entity_mask: `(N,)` bool, False hides an entity.
            return_top_k: report the best entities of each access.
            written_rows: rows read in place of their entities' table rows (`WrittenRows`).
            candidates: `(M, C)` each mention's candidate entities (-1 padded; `config.name_guided_read`): a mention
                with any reads among them alone (`name_candidates.candidate_read`).

        Returns:
            `(batch, seq, d_model)` input of the upper layers, and the access.
        """
        positions = mention_mask.nonzero()
        need_nll = entity_labels is not None
        if positions.shape[0] == 0:
            upper_input = self.upper_input_dropout(self.layer_norm(hidden_states))
            return upper_input, _empty_access(positions, hidden_states, need_nll)
        queries = key_queries(
            self.projection_dropout(self.query_proj(hidden_states[mention_mask])), entity_table.shape[-1]
        )
        gold_rows = written_rows.gold_rows(positions) if written_rows is not None else None
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
            written_rows=written_rows,
            gold_rows=gold_rows,
        )
        read, top_ids, top_scores = result.read, result.top_ids, result.top_scores
        if candidates is not None and (named := (candidates >= 0).any(-1)).any():
            by_name, scores = candidate_read(queries, entity_table, candidates, entity_mask, written_rows)
            read = torch.where(named[:, None], by_name, read)
            if top_ids is not None:  # the candidates, best first, where a mention has any
                ranked, order = scores.sort(dim=-1, descending=True)
                width = min(top_ids.shape[1], ranked.shape[1])
                top_ids, top_scores = top_ids.clone(), top_scores.clone()
                top_ids[named] = -1
                top_scores[named] = float("-inf")
                top_ids[named, :width] = candidates.gather(1, order)[named, :width].to(top_ids.dtype)
                top_scores[named, :width] = ranked[named, :width].to(top_scores.dtype)
        if written_rows is not None:
            read = written_rows.read_at_mentions(read, queries, mention_mask, entity_labels)
        update = torch.zeros_like(hidden_states)
        read = self.projection_dropout(self.output_proj(read.to(hidden_states.dtype)))
        update[mention_mask] = read.to(update.dtype)  # autocast
        hidden_states = self.upper_input_dropout(self.layer_norm(hidden_states + update))
        access = EntityMemoryAccess(
            positions=positions,
            top_entity_ids=top_ids,
            top_entity_scores=top_scores,
            entity_nll=result.nll,
        )
        return hidden_states, access


class EntityLinkingHead(nn.Module):
    """Scores the entities for the hidden state of each `<E_s>`: `W_in h` against the entity table (eq. 2), with
    `config.memory_dropout` after `W_in` as in the authors' code."""

    entity_index = None  # an EntityIndex for the top-k at inference, set by model.set_entity_index

    def __init__(self, config: EDMemConfig):
        super().__init__()
        self.query_proj = nn.Linear(config.d_model, config.entity_key_dim or config.entity_embed_dim)
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
        written_rows: WrittenRows | None = None,
    ) -> EntityMemoryAccess:
        """
        Args:
            hidden_states: `(batch, seq, d_model)`.
            mention_mask: `(batch, seq)` bool, True at `<E_s>`.
            entity_table: `(N, entity_embed_dim)`.
            entity_labels: `(batch, seq)` entity ids at `<E_s>`, -100 elsewhere.
            return_top_k: report the best entities of each mention.
            written_rows: rows scored in place of their entities' table rows.
        """
        positions = mention_mask.nonzero()
        queries = self.projection_dropout(self.query_proj(hidden_states[mention_mask]))
        need_nll = entity_labels is not None
        if queries.shape[0] == 0 or not (need_nll or return_top_k):
            return _empty_access(positions, hidden_states, need_nll)
        result = entity_attention(
            key_queries(queries, entity_table.shape[-1]),
            entity_table,
            labels=entity_labels[mention_mask] if need_nll else None,
            entity_mask=entity_mask,
            chunk_size=self.chunk_size,
            compute_read=False,
            return_top_k=return_top_k,
            index=None if self.training else self.entity_index,
            written_rows=written_rows,
            gold_rows=written_rows.gold_rows(positions) if written_rows is not None else None,
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
# Pre-trained model base, encoder and decoder
# ---------------------------------------------------------------------------------------------------------------


class EDMemPreTrainedModel(EntityIndexMixin, NameCandidatesMixin, PreTrainedModel):
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
    # The `config.variant` a model class builds (None: the encoder and decoder stacks, built by the model).
    edmem_variant: str | None = None

    def __init__(self, config: EDMemConfig, *inputs, **kwargs):
        super().__init__(config, *inputs, **kwargs)
        if self.edmem_variant is not None and config.variant != self.edmem_variant:
            raise ValueError(
                f"{type(self).__name__} builds the {self.edmem_variant!r} variant, but config.variant is "
                f"{config.variant!r}: use {_counterpart(type(self), config.variant).__name__}"
            )

    @classmethod
    def _class_for_variant(cls, config: EDMemConfig) -> type[EDMemPreTrainedModel]:
        """The class that builds `config.variant` where this one was asked for: `from_pretrained` and `from_config`
        load a saved model of another variant into its class for the same Auto class (`VARIANT_CLASSES`), as the
        Auto classes would. Where that Auto class has none (EncMem has no decoder), this class is returned and its
        constructor names the class to use."""
        if cls.edmem_variant is None or config.variant == cls.edmem_variant:
            return cls
        for classes in VARIANT_CLASSES.values():
            if any(issubclass(cls, model_class) for model_class in classes.values()) and config.variant in classes:
                return classes[config.variant]
        return cls

    def _hub_auto_map(self, config: EDMemConfig) -> dict[str, str]:
        """`config.auto_map`: every Auto class loads the Hub copy of its class of the model's variant."""
        auto_map = {"AutoConfig": "configuration_edmem.EDMemConfig"}
        for auto_class, classes in VARIANT_CLASSES.items():
            if config.variant in classes:
                auto_map[auto_class] = f"modeling_edmem.{classes[config.variant].__name__}"
        return auto_map

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, _EDMemSeq2SeqLM):
            init.zeros_(module.final_logits_bias)
        if isinstance(module, EntityRowWriter):
            init.normal_(module.pool_queries, std=self.config.init_std)

    def set_entity_mask(self, entity_mask: torch.Tensor | None) -> None:
        """Hides entities from every memory access and from entity linking (the paper's memory-size study).

        `entity_mask` is a `(entity_vocab_size,)` bool tensor, False for hidden entities, or None to show all.
        `save_pretrained` saves it beside the weights (`entity_mask.safetensors`) and `from_pretrained` restores it.
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


def _token_embeddings(config: EDMemConfig) -> BartScaledWordEmbedding:
    embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
    return BartScaledWordEmbedding(config.vocab_size, config.d_model, config.pad_token_id, embed_scale=embed_scale)


class _EntityMemoryStack(EDMemPreTrainedModel):
    """What the encoder and decoder share: an entity memory between their lower and upper layers, reading the entity
    table their model gives them (EDMem, EncMem); none in the EncDec baseline. A stack built alone
    (`EDMemEncoder(config)`, `EDMemEncoder.from_pretrained(folder)`) owns a table, and a stack saved alone saves the
    table it reads, so that it loads again with its memory."""

    def _add_memory(self, entity_embeddings: nn.Embedding | None) -> None:
        alone = entity_embeddings is None and self.config.variant != "encdec"
        self.memory = EntityMemory(self.config) if alone or entity_embeddings is not None else None
        if alone:
            self.entity_embeddings = EntityTable.for_config(self.config)
        else:
            # The table is the model's: one parameter, saved once as its `entity_embeddings.weight`. The stack reads
            # it through this reference, which is not registered as a submodule of the stack.
            self.__dict__["entity_embeddings"] = entity_embeddings

    def save_pretrained(self, save_directory, *args, **kwargs):
        """`PreTrainedModel.save_pretrained`; a stack of a model saves the model's table with it (as its own
        `entity_embeddings.weight`)."""
        if self.__dict__.get("entity_embeddings") is None:  # a table of its own, or none
            return super().save_pretrained(save_directory, *args, **kwargs)
        self._modules["entity_embeddings"] = self.__dict__.pop("entity_embeddings")
        try:
            return super().save_pretrained(save_directory, *args, **kwargs)
        finally:
            self.__dict__["entity_embeddings"] = self._modules.pop("entity_embeddings")

    def _read_memory(
        self, hidden_states, input_ids, entity_labels, output_attended_entities, written_rows=None, by_name=False
    ):
        """The memory access at each `<E_s>` of `input_ids`; `by_name`: among each mention's candidates by name,
        with `config.name_guided_read` (the encoder's, where a mention's name is written out)."""
        entity_mask = self._get_entity_mask(hidden_states.device)
        candidates = None
        if by_name and self.config.name_guided_read:
            lookup = self.memory.name_lookup
            if lookup is None or lookup.num_entities != self.config.entity_vocab_size:  # none, or before growth
                raise ValueError("name_guided_read reads candidates by name: build them (again, after entities were "
                                 "added) with model.name_candidates(tokenizer), or pass tokenizer=... to generate()")  # fmt: skip
            start, end = self.config.entity_start_token_id, self.config.entity_end_token_id
            candidates = lookup.of_mentions(input_ids, start, end).to(hidden_states.device)
        return self.memory(
            hidden_states,
            input_ids == self.config.entity_start_token_id,
            self.entity_embeddings.weight,
            entity_labels=entity_labels,
            entity_mask=entity_mask,
            return_top_k=self.config.memory_top_k if output_attended_entities else None,
            written_rows=self.entity_embeddings.rows_read(
                written_rows, entity_mask, self.config.writer_mean_row_probability
            ),
            candidates=candidates,
        )


class EDMemEncoder(_EntityMemoryStack):
    """BART encoder with an entity memory between its lower and upper layers (none for the EncDec baseline).

    `layers[:encoder_lower_layers]` are the lower layers; the names match BART's so that BART weights load.
    """

    _can_record_outputs = {"hidden_states": BartEncoderLayer, "attentions": BartAttention}

    def __init__(self, config: EDMemConfig, entity_embeddings: nn.Embedding | None = None):
        super().__init__(config)
        self.dropout = config.dropout
        self.layerdrop = config.encoder_layerdrop
        self.embed_tokens = _token_embeddings(config)
        self.embed_positions = BartLearnedPositionalEmbedding(config.max_position_embeddings, config.d_model)
        self.layers = nn.ModuleList([BartEncoderLayer(config, layer_idx=i) for i in range(config.encoder_layers)])
        self.layernorm_embedding = nn.LayerNorm(config.d_model)
        self._add_memory(entity_embeddings)
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
        written_rows: WrittenRows | None = None,
        **kwargs,
    ) -> EDMemEncoderOutput:
        r"""
        input_ids: `(batch, seq)`; mentions are found by their `<E_s>` tokens (`inputs_embeds` alone cannot show
            them, so a model with a memory needs `input_ids`).
        entity_labels: `(batch, seq)`, the entity id at each `<E_s>`, -100 elsewhere.
        output_attended_entities: report the memory's top entities for each `<E_s>`.
        written_rows: rows the memory reads in place of their entities' table rows.
        """
        if (input_ids is None) ^ (inputs_embeds is not None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        if self.memory is not None:
            if input_ids is None:
                raise ValueError("EDMem finds mentions by their <E_s> tokens: pass input_ids, not only inputs_embeds")
            check_mention_markers(input_ids, self.config)
        if entity_labels is not None:
            if self.memory is None:
                raise ValueError("entity_labels were given but this model (the EncDec baseline) has no entity memory")
            check_entity_labels(entity_labels, input_ids, self.config)
        hidden_states, attention_mask = self._embed(input_ids, inputs_embeds, attention_mask)
        lower = self.config.encoder_lower_layers
        hidden_states = self._run_layers(self.layers[:lower], hidden_states, attention_mask, **kwargs)
        access = lower_hidden_state = None
        if self.memory is not None:
            lower_hidden_state = hidden_states  # before the memory is merged, as in the authors' code
            hidden_states, access = self._read_memory(
                hidden_states, input_ids, entity_labels, output_attended_entities, written_rows, by_name=True
            )
        hidden_states = self._run_layers(self.layers[lower:], hidden_states, attention_mask, **kwargs)
        return EDMemEncoderOutput(
            last_hidden_state=hidden_states,
            lower_hidden_state=lower_hidden_state if self.config.lower_decoder_attends_to == "lower" else None,
            memory_access=access if output_attended_entities or entity_labels is not None else None,
        )

    def lower_hidden_states(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None):
        """`(batch, seq, d_model)`, the lower layers' output: what the memory reads at each `<E_s>`. Only the lower
        layers run (new entities' rows are the memory's queries there: `entity_growth.memory_queries`)."""
        check_mention_markers(input_ids, self.config)
        hidden_states, attention_mask = self._embed(input_ids, None, attention_mask)
        return self._run_layers(self.layers[: self.config.encoder_lower_layers], hidden_states, attention_mask)

    def _embed(self, input_ids, inputs_embeds, attention_mask):
        """Token and position embeddings, and the attention mask as the layers take it."""
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        embed_pos = self.embed_positions(inputs_embeds[:, :, -1]).to(inputs_embeds.device)
        hidden_states = self.layernorm_embedding(inputs_embeds + embed_pos)
        hidden_states = nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)
        attention_mask = create_bidirectional_mask(
            config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask
        )
        return hidden_states, attention_mask

    def _run_layers(self, layers, hidden_states, attention_mask, **kwargs):
        for layer in layers:
            if self.training and self.layerdrop > 0.0 and torch.rand([]) < self.layerdrop:
                continue
            hidden_states = layer(hidden_states, attention_mask, **kwargs)
        return hidden_states


class EDMemDecoder(_EntityMemoryStack):
    """BART decoder with an entity memory between its lower and upper layers (none for the EncDec baseline).

    Incremental decoding runs only the new tokens through lower layers, memory (at `<E_s>`) and upper layers;
    `past_key_values` is Transformers' `EncoderDecoderCache` over all decoder layers.
    """

    _can_record_outputs = {
        "hidden_states": BartDecoderLayer,
        "attentions": OutputRecorder(BartAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(BartAttention, index=1, layer_name="encoder_attn"),
    }

    def __init__(self, config: EDMemConfig, entity_embeddings: nn.Embedding | None = None):
        super().__init__(config)
        self.dropout = config.dropout
        self.layerdrop = config.decoder_layerdrop
        self.embed_tokens = _token_embeddings(config)
        self.embed_positions = BartLearnedPositionalEmbedding(config.max_position_embeddings, config.d_model)
        self.layers = nn.ModuleList([BartDecoderLayer(config, layer_idx=i) for i in range(config.decoder_layers)])
        self.layernorm_embedding = nn.LayerNorm(config.d_model)
        self._add_memory(entity_embeddings)
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
        written_rows: WrittenRows | None = None,
        **kwargs,
    ) -> EDMemDecoderOutput:
        r"""
        input_ids: `(batch, tgt_len)` decoder inputs (only the new tokens when a cache is given).
        encoder_hidden_states: `(batch, src_len, d_model)` final encoder output.
        encoder_lower_hidden_states: `(batch, src_len, d_model)` the lower encoder layers' output (before the memory
            merge), attended to by the lower decoder layers when `config.lower_decoder_attends_to == "lower"`.
        entity_labels: `(batch, tgt_len)` aligned with `input_ids`: the entity id at each `<E_s>`, -100 elsewhere.
        output_attended_entities: report the memory's top entities for each `<E_s>`.
        written_rows: rows the memory reads in place of their entities' table rows.
        """
        if (input_ids is None) ^ (inputs_embeds is not None):
            raise ValueError("You must specify exactly one of decoder_input_ids or decoder_inputs_embeds")
        if self.memory is not None and input_ids is None:
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

        lower = self.config.decoder_lower_layers
        layer_inputs = {
            "encoder_attention_mask": cross_mask,
            "past_key_values": past_key_values,
            "use_cache": use_cache,
        }
        hidden_states = self._run_layers(
            self.layers[:lower], hidden_states, causal_mask, lower_source, **layer_inputs, **kwargs
        )
        access = None
        if self.memory is not None:
            hidden_states, access = self._read_memory(
                hidden_states, input_ids, entity_labels, output_attended_entities, written_rows
            )
        hidden_states = self._run_layers(
            self.layers[lower:], hidden_states, causal_mask, encoder_hidden_states, **layer_inputs, **kwargs
        )
        return EDMemDecoderOutput(
            last_hidden_state=hidden_states,
            past_key_values=past_key_values,
            memory_access=access if output_attended_entities or entity_labels is not None else None,
        )

    def _run_layers(self, layers, hidden_states, causal_mask, encoder_hidden_states, **kwargs):
        for layer in layers:
            if self.training and self.layerdrop > 0.0 and torch.rand([]) < self.layerdrop:
                continue
            hidden_states = layer(hidden_states, causal_mask, encoder_hidden_states, **kwargs)
        return hidden_states


# ---------------------------------------------------------------------------------------------------------------
# Models: EDMem and the EncDec baseline (encoder-decoders), EncMem (encoder only)
# ---------------------------------------------------------------------------------------------------------------


class _EncoderDecoderModel(EDMemHubMixin, EDMemPreTrainedModel):
    """The encoder-decoder of EDMem and of EncDec: the token embeddings (`shared`), and for EDMem the entity table
    (`entity_embeddings`) that the memories of both stacks read."""

    _tied_weights_keys = {
        "encoder.embed_tokens.weight": "shared.weight",
        "decoder.embed_tokens.weight": "shared.weight",
    }

    def __init__(self, config: EDMemConfig, entity_embeddings: nn.Embedding | None):
        super().__init__(config)
        self.shared = _token_embeddings(config)
        self.entity_embeddings = entity_embeddings
        self.encoder = EDMemEncoder(config, entity_embeddings)
        self.decoder = EDMemDecoder(config, entity_embeddings)
        self.post_init()

    def get_input_embeddings(self):
        return self.shared

    def set_input_embeddings(self, value):
        self.shared = value
        self.encoder.embed_tokens = self.shared
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
        written_rows: WrittenRows | None = None,
        **kwargs,
    ) -> EDMemModelOutput:
        r"""
        input_ids: `(batch, src_len)` with `<E_s> ... <E_e>` around mentions.
        decoder_input_ids: `(batch, tgt_len)`; if absent, `input_ids` shifted right (denoising, as in BART).
        entity_labels: `(batch, src_len)`, the entity id at each `<E_s>` of `input_ids`, -100 elsewhere.
        decoder_entity_labels: `(batch, tgt_len)` aligned with `decoder_input_ids` (already shifted).
        output_attended_entities: report each memory access's top entities.
        written_rows: rows both memories read in place of their entities' table rows.
        """
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
                written_rows=written_rows,
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
            written_rows=written_rows.in_decoder() if written_rows is not None else None,
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


class EDMemModel(_EncoderDecoderModel):
    """The bare EDMem encoder-decoder: hidden states and memory accesses, no heads. It owns the token embeddings
    (`shared`) and the entity table (`entity_embeddings`), one parameter read by both memories."""

    edmem_variant = "edmem"

    def __init__(self, config: EDMemConfig):
        super().__init__(config, EntityTable.for_config(config))


class EDMemEncDecModel(_EncoderDecoderModel):
    """The paper's EncDec baseline, bare: EDMem's encoder-decoder without the entity memory (`variant="encdec"`)."""

    edmem_variant = "encdec"

    def __init__(self, config: EDMemConfig):
        super().__init__(config, entity_embeddings=None)


class EDMemEncMemModel(EDMemHubMixin, EDMemPreTrainedModel):
    """The bare EncMem (`variant="encmem"`): the encoder with its memory, no decoder. It owns the token embeddings
    (`shared`) and the entity table (`entity_embeddings`)."""

    edmem_variant = "encmem"
    _tied_weights_keys = {"encoder.embed_tokens.weight": "shared.weight"}

    def __init__(self, config: EDMemConfig):
        super().__init__(config)
        self.shared = _token_embeddings(config)
        self.entity_embeddings = EntityTable.for_config(config)
        self.encoder = EDMemEncoder(config, self.entity_embeddings)
        self.post_init()

    def get_input_embeddings(self):
        return self.shared

    def set_input_embeddings(self, value):
        self.shared = value
        self.encoder.embed_tokens = self.shared

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        entity_labels: torch.LongTensor | None = None,
        output_attended_entities: bool = False,
        **kwargs,
    ) -> EDMemEncoderOutput:
        r"""
        input_ids: `(batch, seq)` with `<E_s> ... <E_e>` around mentions.
        entity_labels: `(batch, seq)` entity id at each `<E_s>`, -100 elsewhere.
        output_attended_entities: report what the memory attended to at each `<E_s>`.
        """
        return self.encoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            entity_labels=entity_labels,
            output_attended_entities=output_attended_entities,
            return_dict=True,
            **kwargs,
        )


# ---------------------------------------------------------------------------------------------------------------
# Heads
# ---------------------------------------------------------------------------------------------------------------


def _mean_entity_loss(
    accesses: list[EntityMemoryAccess | None],
    params: list[torch.Tensor],
    table: torch.Tensor,
    reduction: str,
    lm_labels: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean NLL per access, averaged over the accesses that have labelled mentions (0 when none has), or with
    `reduction="all_accesses"` summed and divided by the number of accesses, or with `reduction="per_lm_token"`
    each access's summed NLL divided by the tokens `lm_labels` scores, averaged over the labelled accesses (see
    `EDMemConfig`).

    The `0 * sum(params)` term keeps every memory parameter in the graph, so that distributed training does not
    stall on a batch where an access has no mention. The table joins it only when nothing is labelled: otherwise
    it is in the graph already, and a dense zero gradient for it would cost a table-sized buffer.
    """
    labelled = [a.entity_nll for a in accesses if a is not None and a.entity_nll is not None and a.entity_nll.numel()]
    if reduction == "per_lm_token":
        if lm_labels is None:
            raise ValueError("entity_loss_reduction='per_lm_token' needs the LM labels of the batch")
        tokens = max(int((lm_labels != IGNORE_INDEX).sum()), 1)
        per_access = [nll.sum() / tokens for nll in labelled]
    else:
        per_access = [nll.mean() for nll in labelled]
    anchor = sum(p.sum() for p in params) * 0.0
    if not per_access:
        return (anchor + table.sum() * 0.0).float()
    if reduction == "all_accesses":
        return torch.stack(per_access).sum() / len(accesses) + anchor
    return torch.stack(per_access).mean() + anchor


def _lm_output(outputs: EDMemModelOutput, logits: torch.Tensor, **losses_and_entities) -> EDMemSeq2SeqLMOutput:
    """The LM heads' output: the logits, the encoder-decoder's outputs, and the losses and entity reports given."""
    return EDMemSeq2SeqLMOutput(
        logits=logits,
        past_key_values=outputs.past_key_values,
        decoder_hidden_states=outputs.decoder_hidden_states,
        decoder_attentions=outputs.decoder_attentions,
        cross_attentions=outputs.cross_attentions,
        encoder_last_hidden_state=outputs.encoder_last_hidden_state,
        encoder_hidden_states=outputs.encoder_hidden_states,
        encoder_attentions=outputs.encoder_attentions,
        **losses_and_entities,
    )


def _lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the scored tokens; 0 when none is (a batch of static linking targets, which score only
    the entity-linking head), not the NaN of an empty mean."""
    labels = labels.to(logits.device)
    if not (labels != IGNORE_INDEX).any():
        return logits.float().sum() * 0.0
    return nn.functional.cross_entropy(
        logits.float().view(-1, logits.shape[-1]), labels.view(-1), ignore_index=IGNORE_INDEX
    )


class _EDMemSeq2SeqLM(EDMemHubMixin, EDMemPreTrainedModel):
    """What EDMem's and EncDec's models with an LM head share: BART's LM head (tied to the input embeddings) and
    final-logits bias, decoder inputs from the labels, and the entity-decoding defaults of the generation config."""

    base_model_prefix = "model"
    _tied_weights_keys = {"lm_head.weight": "model.shared.weight"}
    _keys_to_ignore_on_load_missing = ["final_logits_bias"]

    def __init__(self, config: EDMemConfig, model_class: type[_EncoderDecoderModel]):
        super().__init__(config)
        self.model = model_class(config)
        self.final_logits_bias = nn.Buffer(torch.zeros((1, config.vocab_size)))
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
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

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def _decoder_input_ids(self, input_ids, labels, decoder_input_ids, decoder_inputs_embeds):
        """The decoder's input: as given, else `labels` shifted right, else `input_ids` shifted right (denoising, as
        `EDMemModel` would do it: the entity-linking head needs to see the decoder's `<E_s>`)."""
        if decoder_input_ids is not None or decoder_inputs_embeds is not None:
            return decoder_input_ids
        if labels is not None:
            return self.prepare_decoder_input_ids_from_labels(labels)
        if input_ids is not None:
            return self.prepare_decoder_input_ids_from_labels(input_ids)
        return None

    def _lm_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states) + self.final_logits_bias.to(hidden_states.device)


class EDMemForConditionalGeneration(EDMemGenerationMixin, _EDMemSeq2SeqLM):
    """EDMem with an LM head (tied to the input embeddings) and an entity-linking head on the decoder; with
    `config.entity_row_writer`, also a writer of entity rows (`entity_writer`, see `write_entity_rows`).

    `generate(entity_decoding="free" | "static" | "dynamic")` comes from `EDMemGenerationMixin`.
    """

    edmem_variant = "edmem"

    def __init__(self, config: EDMemConfig):
        super().__init__(config, EDMemModel)
        self.entity_linking_head = EntityLinkingHead(config)
        self.entity_writer = EntityRowWriter(config) if config.entity_row_writer else None
        self.post_init()

    def write_entity_rows(
        self,
        writer_input_ids: torch.LongTensor,
        writer_attention_mask: torch.Tensor | None = None,
        texts_per_pass: int | None = WRITER_TEXTS_PER_PASS,
    ) -> torch.Tensor:
        """`(K, entity_embed_dim)`: the rows the writer makes of K texts `<s> <E_s> name <E_e> passage </s>` read by the
        lower encoder layers (no memory read), a few of like length a pass (`entity_writer.groups_by_length`)."""
        if self.entity_writer is None:
            raise ValueError("this model has no entity row writer (EDMemConfig(entity_row_writer=True) builds one)")
        groups = list(groups_by_length(writer_input_ids, writer_attention_mask, texts_per_pass))
        rows = [self.entity_writer(self.model.encoder.lower_hidden_states(i, m), i, m) for _, i, m in groups]
        return torch.cat(rows)[torch.argsort(torch.cat([texts for texts, _, _ in groups]))]

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
        rows_to_write: RowsToWrite | None = None,
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
        rows_to_write: texts about entities (`RowsToWrite`) that the writer turns into rows in this pass, each read
            by both memories and the entity-linking head in place of its entity's table row (training with the writer).
        """
        config = self.config
        written_rows = None
        if rows_to_write is not None and rows_to_write.entity_ids.numel():
            rows_to_write.check(config, input_ids)
            rows = self.write_entity_rows(rows_to_write.input_ids, rows_to_write.attention_mask)
            written_rows = rows_to_write.written_rows(rows, config)
        if labels is not None:
            use_cache = False
        decoder_input_ids = self._decoder_input_ids(input_ids, labels, decoder_input_ids, decoder_inputs_embeds)
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
            entity_labels=entity_labels,
            decoder_entity_labels=decoder_entity_labels,
            output_attended_entities=output_attended_entities,
            written_rows=written_rows,
            return_dict=True,
            **kwargs,
        )
        logits = self._lm_logits(outputs.last_hidden_state)

        linked = None
        if entity_linking_top_k is None and output_attended_entities:
            entity_linking_top_k = config.memory_top_k
        if entity_linking_top_k or decoder_entity_labels is not None:
            linked = self._link_mentions(
                outputs.last_hidden_state, decoder_input_ids, decoder_entity_labels, entity_linking_top_k, written_rows
            )

        loss = lm_loss = entity_loss = None
        if labels is not None:
            lm_loss = _lm_loss(logits, labels)
            entity_loss = _mean_entity_loss(
                [outputs.encoder_attended_entities, outputs.decoder_attended_entities, linked],
                [
                    p
                    for module in (self.model.encoder.memory, self.model.decoder.memory, self.entity_linking_head)
                    for p in module.parameters()
                ]
                + (list(self.entity_writer.parameters()) if self.entity_writer is not None else []),
                self.model.entity_embeddings.weight,
                config.entity_loss_reduction,
                labels,
            )
            loss = lm_loss + config.entity_loss_weight * entity_loss
        return _lm_output(
            outputs,
            logits,
            loss=loss,
            lm_loss=lm_loss,
            entity_loss=entity_loss,
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
        written_rows: WrittenRows | None = None,
    ) -> EntityMemoryAccess:
        """The entity-linking head at each `<E_s>` of the decoder input: its NLL against the labels, its top-k."""
        entity_mask = self._get_entity_mask(hidden_states.device)
        return self.entity_linking_head(
            hidden_states,
            decoder_input_ids == self.config.entity_start_token_id,
            self.model.entity_embeddings.weight,
            entity_labels=decoder_entity_labels,
            entity_mask=entity_mask,
            return_top_k=top_k,
            written_rows=self.model.entity_embeddings.rows_read(
                written_rows, entity_mask, self.config.writer_mean_row_probability
            ),
        )


class EDMemEncDecForConditionalGeneration(EDMemGenerationMixin, _EDMemSeq2SeqLM):
    """The paper's EncDec baseline (`variant="encdec"`): EDMem's encoder-decoder and LM head without the entity
    memory, trained with the LM loss alone. It takes EDMem's batches: entity labels are accepted and not used.
    `generate` decodes freely (static and dynamic decoding need the entity-linking head)."""

    edmem_variant = "encdec"

    def __init__(self, config: EDMemConfig):
        super().__init__(config, EDMemEncDecModel)
        self.post_init()

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
        **kwargs,
    ) -> EDMemSeq2SeqLMOutput:
        r"""
        labels: `(batch, tgt_len)` target tokens, -100 where not scored; the decoder input is `labels` shifted
            right unless `decoder_input_ids` is given.
        entity_labels / decoder_entity_labels / output_attended_entities: accepted (EDMem's batches and evaluation
            pass them) and not used: there is no memory to supervise or report.
        """
        if labels is not None:
            use_cache = False
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=self._decoder_input_ids(input_ids, labels, decoder_input_ids, decoder_inputs_embeds),
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            return_dict=True,
            **kwargs,
        )
        logits = self._lm_logits(outputs.last_hidden_state)
        lm_loss = _lm_loss(logits, labels) if labels is not None else None
        return _lm_output(outputs, logits, loss=lm_loss, lm_loss=lm_loss)


class EDMemForEntityLinking(EDMemHubMixin, EDMemPreTrainedModel):
    """The encoder-only EncMem variant (EaE-style auto-encoder): encoder + memory, an entity-linking head on the
    final encoder states and a BERT-style masked-LM head. Predicts the entity of every `<E_s>` in the input."""

    edmem_variant = "encmem"
    _tied_weights_keys = {"lm_head.decoder.weight": "model.shared.weight"}

    def __init__(self, config: EDMemConfig):
        super().__init__(config)
        self.model = EDMemEncMemModel(config)
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
        encoder_outputs = self.model(
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
            entity_mask = self._get_entity_mask(hidden.device)
            linked = self.entity_linking_head(
                hidden,
                input_ids == self.config.entity_start_token_id,
                self.model.entity_embeddings.weight,
                entity_labels=entity_labels,
                entity_mask=entity_mask,
                return_top_k=self.config.memory_top_k if output_attended_entities else None,
                written_rows=self.model.entity_embeddings.rows_read(
                    None, entity_mask, self.config.writer_mean_row_probability
                ),
            )
        loss = lm_loss = entity_loss = None
        if labels is not None or entity_labels is not None:
            entity_loss = _mean_entity_loss(
                [encoder_outputs.memory_access, linked],
                [p for m in (self.model.encoder.memory, self.entity_linking_head) for p in m.parameters()],
                self.model.entity_embeddings.weight,
                self.config.entity_loss_reduction,
                labels,
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


# ---------------------------------------------------------------------------------------------------------------
# The classes of each variant
# ---------------------------------------------------------------------------------------------------------------

# The class each Auto class builds for each variant: the `auto_map` written on save, and the class into which
# `from_pretrained` and `from_config` load a saved model of another variant. EncMem has no decoder, so no
# AutoModelForSeq2SeqLM class.
VARIANT_CLASSES: dict[str, dict[str, type[EDMemPreTrainedModel]]] = {
    "AutoModel": {"edmem": EDMemModel, "encdec": EDMemEncDecModel, "encmem": EDMemEncMemModel},
    "AutoModelForSeq2SeqLM": {"edmem": EDMemForConditionalGeneration, "encdec": EDMemEncDecForConditionalGeneration},
}
# Each variant's model with the heads it is trained with (`edmem pretrain --variant`).
MODEL_WITH_HEADS: dict[str, type[EDMemPreTrainedModel]] = {
    "edmem": EDMemForConditionalGeneration,
    "encdec": EDMemEncDecForConditionalGeneration,
    "encmem": EDMemForEntityLinking,
}


def _counterpart(model_class: type, variant: str) -> type[EDMemPreTrainedModel]:
    """The class of `variant` in the place of `model_class`: the bare model, or the model with its heads."""
    bare = VARIANT_CLASSES["AutoModel"]
    return bare[variant] if issubclass(model_class, tuple(bare.values())) else MODEL_WITH_HEADS[variant]


__all__ = [
    "EDMemDecoder",
    "EDMemEncDecForConditionalGeneration",
    "EDMemEncDecModel",
    "EDMemEncMemModel",
    "EDMemEncoder",
    "EDMemForConditionalGeneration",
    "EDMemForEntityLinking",
    "EDMemModel",
    "EDMemPreTrainedModel",
    "EntityLinkingHead",
    "MaskedLMHead",
    "EntityMemory",
    "EntityMemoryAccess",
    "MODEL_WITH_HEADS",
    "VARIANT_CLASSES",
]

"""EDMem model configuration.

This file is copied to the Hub as custom code next to `modeling_edmem.py`: it imports nothing of ours.
"""

import re

from huggingface_hub.dataclasses import strict
from transformers.configuration_utils import PreTrainedConfig

ENTITY_START_TOKEN = "<E_s>"
ENTITY_END_TOKEN = "<E_e>"
# The mention markers as they appear in text: ours, and the paper's `[E_s]`/`[E_e]` spelling.
MENTION_MARKERS = re.compile(r"<E_[se]>|\[E_[se]\]")
# The label of a position that is not scored (`torch.nn.functional.cross_entropy`'s default, as in Transformers).
IGNORE_INDEX = -100

EDMEM_VARIANTS = ("edmem", "encdec", "encmem")
LOWER_DECODER_SOURCES = ("upper", "lower")
ENTITY_LOSS_REDUCTIONS = ("labelled_accesses", "all_accesses", "per_lm_token")


@strict
class EDMemConfig(PreTrainedConfig):
    r"""
    Configuration of an EDMem model: a BART-style encoder-decoder whose encoder and decoder are each split into
    lower and upper layers, with an entity memory read at every `<E_s>` token between the two.

    The defaults are the paper's architecture: BART-large widths, 4 lower + 8 upper layers on each side, a 1M x 256
    entity table, top-100 entities at inference, and an entity-linking loss weight of 1. The presets of
    `edmem_hf.presets` (`edmem-base`, `edmem-large`) add the authors' 1,000,010-row table and dropouts.

    Args:
        encoder_lower_layers / encoder_upper_layers / decoder_lower_layers / decoder_upper_layers (`int`):
            L1 and L2 of the paper, for the encoder and the decoder.
        entity_vocab_size (`int`): rows of the entity table (N).
        entity_embed_dim (`int`): width of an entity embedding (256 in the paper).
        entity_key_dim (`int` or `None`): the first `entity_key_dim` columns of a row are its key, the only ones a
            query scores (the memory's and the entity-linking head's queries are that wide, zeros beyond); the rest
            are its value, read by the memory and shaped by the LM loss alone (docs/model.md, "Keys and values").
            `None`: the whole row is key and value, as in the paper.
        memory_top_k (`int` or `None`): entities read at inference; `None` reads the whole table.
        memory_chunk_size (`int`): entities scored at a time when the whole table is read, which bounds the
            memory of the read and of the entity-linking loss to `mentions x memory_chunk_size` scores.
        memory_dropout (`float`): dropout after the memory's query and output projections and the entity-linking
            head's query projection (the authors' code uses `dropout` there; 0 leaves them out).
        upper_input_dropout (`float`): dropout on `LayerNorm(h + m)`, the input of the upper encoder and decoder
            layers (the authors' code uses `dropout` there; 0 leaves it out).
        entity_loss_weight (`float`): lambda in `loss = lm_loss + lambda * entity_loss`.
        entity_loss_reduction (`str`): how the accesses' mean entity NLLs (encoder memory, decoder memory,
            entity-linking head) make `entity_loss`: `"labelled_accesses"` averages those that have labelled
            mentions; `"all_accesses"` divides their sum by the number of accesses, one without a mention counting
            0 (the authors' code: a batch with fewer labelled accesses gets a smaller effective lambda);
            `"per_lm_token"` averages over the accesses each one's summed NLL divided by the LM loss's scored tokens,
            so that a mention weighs what one token of the LM loss weighs (the other two: a mention weighs
            `tokens / mentions` tokens, about nine in a Wikipedia passage).
        entity_start_token_id / entity_end_token_id (`int`): ids of `<E_s>` and `<E_e>`.
        variant (`str`): `"edmem"` (full model), `"encdec"` (no memory, same LM objective) or `"encmem"`
            (encoder + memory, the EaE-style auto-encoder of the paper's ablations). Each has its own model classes
            (`modeling_edmem.VARIANT_CLASSES`); this says which a saved model needs.
        lower_decoder_attends_to (`str`): which encoder output the lower decoder layers cross-attend to:
            `"upper"` (the final encoder output, as in the authors' runs) or `"lower"` (the lower encoder layers'
            output before the memory is merged: the authors' `lower_encoder` option). The upper decoder layers
            always attend to the final output.
        entity_row_writer (`bool`): give the model a writer of entity rows (`entity_writer.EntityRowWriter`): a
            head on the encoder's lower layers that turns a text about an entity, `<E_s> name <E_e> passage`, into a
            row of the entity table, for entities added after training and for training that reads written rows
            (docs/model.md, "Entities written from text"). Off: the paper's model, unchanged.
        writer_pools_texts (`bool`): with the writer, how a batch that writes an entity from several texts is read:
            `True`, one row, the mean of the texts' rows; `False`, a row a text, the memory attending to each and
            the entity scored by the log-sum-exp of its rows, so that the query learns to choose among an entity's
            rows (docs/model.md, "A row a passage").
        writer_mean_row_probability (`bool`): where an entity has several written rows (a batch's rows kept apart,
            or rows kept beside the table), give it the mean of its rows' probabilities instead of their sum (each
            row's score less the log of its entity's number of rows), in training and in every memory access and
            linking, so that an entity of many rows does not outbid an entity of one (docs/model.md, "An entity's
            many rows"). Needs the writer.
        written_entity_rows (`int`): rows written from text kept with the model beside the table
            (`entity_embeddings.written_rows`, `(written_entity_rows, entity_embed_dim)`, and
            `entity_embeddings.written_row_entity_ids`, whose entity each is): every memory access and the
            entity-linking head read each as a row of its entity, in place of the entity's table row, so that an entity
            may have several (`add_entities(..., rows_apart=True)`, docs/model.md, "A row a passage"). 0 by default.
        name_guided_read (`bool`): the encoder's memory reads, at a marked mention whose tokens spell the name or
            an alias of entities of the vocabulary (`name_candidates.NameCandidates`, built with the tokenizer), among
            those candidates alone, the query's scores ranking them (REL's, ReFinED's and GENRE's candidate
            generation); elsewhere, and in the decoder, as the paper's. Off: the paper's read.
    """

    model_type = "edmem"
    keys_to_ignore_at_inference = ["past_key_values"]
    attribute_map = {
        "num_attention_heads": "encoder_attention_heads",
        "hidden_size": "d_model",
        "num_hidden_layers": "decoder_layers",
    }

    vocab_size: int = 50267
    max_position_embeddings: int = 1024
    d_model: int = 1024
    encoder_lower_layers: int = 4
    encoder_upper_layers: int = 8
    decoder_lower_layers: int = 4
    decoder_upper_layers: int = 8
    encoder_layers: int | None = None
    decoder_layers: int | None = None
    encoder_ffn_dim: int = 4096
    encoder_attention_heads: int = 16
    decoder_ffn_dim: int = 4096
    decoder_attention_heads: int = 16
    encoder_layerdrop: float = 0.0
    decoder_layerdrop: float = 0.0
    activation_function: str = "gelu"
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.0
    activation_dropout: float | int = 0.0
    init_std: float = 0.02
    scale_embedding: bool = False
    entity_vocab_size: int = 1_000_000
    entity_embed_dim: int = 256
    entity_key_dim: int | None = None
    memory_top_k: int | None = 100
    memory_chunk_size: int = 65536
    memory_dropout: float | int = 0.0
    upper_input_dropout: float | int = 0.0
    entity_loss_weight: float = 1.0
    entity_loss_reduction: str = "labelled_accesses"
    entity_start_token_id: int | None = 50265
    entity_end_token_id: int | None = 50266
    variant: str = "edmem"
    lower_decoder_attends_to: str = "upper"
    entity_row_writer: bool = False
    writer_pools_texts: bool = True
    writer_mean_row_probability: bool = False
    name_guided_read: bool = False
    written_entity_rows: int = 0
    use_cache: bool = True
    pad_token_id: int | None = 1
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 2
    is_encoder_decoder: bool | None = True
    decoder_start_token_id: int | None = 2
    forced_eos_token_id: int | list[int] | None = 2
    tie_word_embeddings: bool = True

    def __post_init__(self, **kwargs):
        # The full depths are derived, so that layer indices, caches and BART weights line up.
        self.encoder_layers = self.encoder_lower_layers + self.encoder_upper_layers
        self.decoder_layers = self.decoder_lower_layers + self.decoder_upper_layers
        super().__post_init__(**kwargs)

    @classmethod
    def from_tokenizer(cls, tokenizer, entity_vocab_size: int, **kwargs) -> "EDMemConfig":
        """A config whose token ids are `tokenizer`'s: `vocab_size`, the mention markers, padding, start and end of
        sequence (the decoder starts at `</s>`, as BART's); `kwargs` sets the rest. A ValueError in one line names a
        marker the tokenizer does not have as one token."""
        ids = {}
        for token in (ENTITY_START_TOKEN, ENTITY_END_TOKEN):
            token_id = tokenizer.convert_tokens_to_ids(token)
            if token_id is None or token_id == tokenizer.unk_token_id:
                raise ValueError(f"{token} is not in your tokenizer: add both mention markers as special tokens "
                                 f"(`edmem train-tokenizer` makes a tokenizer with them)")  # fmt: skip
            ids[token] = int(token_id)
        eos = tokenizer.eos_token_id
        ids_of_the_tokenizer = dict(
            vocab_size=len(tokenizer), entity_vocab_size=int(entity_vocab_size),
            entity_start_token_id=ids[ENTITY_START_TOKEN], entity_end_token_id=ids[ENTITY_END_TOKEN],
            pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=eos,
            decoder_start_token_id=eos, forced_eos_token_id=eos,
        )  # fmt: skip
        return cls(**{**ids_of_the_tokenizer, **kwargs})

    def validate_architecture(self):
        """Checks that the settings describe a model that can be built."""
        if self.variant not in EDMEM_VARIANTS:
            raise ValueError(f"variant must be one of {EDMEM_VARIANTS}, got {self.variant!r}")
        if self.lower_decoder_attends_to not in LOWER_DECODER_SOURCES:
            raise ValueError(
                f"lower_decoder_attends_to must be one of {LOWER_DECODER_SOURCES}, got {self.lower_decoder_attends_to!r}"
            )
        for name in ("encoder_lower_layers", "encoder_upper_layers", "decoder_lower_layers", "decoder_upper_layers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.variant != "encdec":
            if self.entity_vocab_size < 1:
                raise ValueError(f"entity_vocab_size must be >= 1, got {self.entity_vocab_size}")
            if self.entity_start_token_id is None or self.entity_end_token_id is None:
                raise ValueError("entity_start_token_id and entity_end_token_id must be set for a model with memory")
            for name in ("entity_start_token_id", "entity_end_token_id"):
                if not 0 <= getattr(self, name) < self.vocab_size:
                    raise ValueError(
                        f"{name}={getattr(self, name)} is outside the vocabulary (size {self.vocab_size})"
                    )
            if self.entity_start_token_id == self.entity_end_token_id:
                raise ValueError(f"entity_start_token_id and entity_end_token_id are both {self.entity_end_token_id}")
            # A marker that is also padding or a sequence boundary would open or close mentions where there are none.
            for other in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
                for name in ("entity_start_token_id", "entity_end_token_id"):
                    if getattr(self, other, None) == getattr(self, name):
                        raise ValueError(
                            f"{name} and {other} are both {getattr(self, name)}: a marker needs its own id"
                        )
        if self.entity_key_dim is not None and not 1 <= self.entity_key_dim <= self.entity_embed_dim:
            raise ValueError(
                f"entity_key_dim must be in [1, entity_embed_dim={self.entity_embed_dim}], got {self.entity_key_dim}"
            )
        if self.entity_row_writer and self.variant != "edmem":
            raise ValueError(f"entity_row_writer is built on the full EDMem (variant 'edmem'), not {self.variant!r}")
        if self.written_entity_rows < 0 or (self.written_entity_rows and self.variant == "encdec"):
            raise ValueError(
                f"written_entity_rows must be >= 0 on a model with memory, got {self.written_entity_rows}"
            )
        if not self.writer_pools_texts and not self.entity_row_writer:
            raise ValueError(
                "writer_pools_texts=False says how written rows are read: it needs entity_row_writer=True"
            )
        if self.writer_mean_row_probability and not self.entity_row_writer:
            raise ValueError(
                "writer_mean_row_probability says how an entity's written rows are scored: it needs "
                "entity_row_writer=True"
            )
        for name in ("memory_dropout", "upper_input_dropout"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.entity_loss_reduction not in ENTITY_LOSS_REDUCTIONS:
            raise ValueError(
                f"entity_loss_reduction must be one of {ENTITY_LOSS_REDUCTIONS}, got {self.entity_loss_reduction!r}"
            )
        if self.memory_top_k is not None and self.memory_top_k < 1:
            raise ValueError(f"memory_top_k must be >= 1 or None, got {self.memory_top_k}")
        if self.memory_chunk_size < 1:
            raise ValueError(f"memory_chunk_size must be >= 1, got {self.memory_chunk_size}")
        if self.d_model % self.encoder_attention_heads or self.d_model % self.decoder_attention_heads:
            raise ValueError("d_model must be divisible by the number of attention heads")


__all__ = ["EDMemConfig", "ENTITY_START_TOKEN", "ENTITY_END_TOKEN"]

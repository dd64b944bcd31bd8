"""EDMem's `generate`: free, static and dynamic entity decoding, and reports of the mentions it generated.

A mixin of `EDMemForConditionalGeneration`, as Whisper's decoding lives beside its model in Transformers.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.generation import GenerationConfig, GenerationMixin, LogitsProcessorList

from .entity_decoding import EntityConstrainedLogitsProcessor, EntityMention, marked_spans, marker_token_ids
from .entity_index import with_entity_index_option
from .entity_trie import EntityTrie

ENTITY_DECODING_MODES = ("free", "static", "dynamic")
# What the decoder reads before the `<E_s>` placeholder of static linking (see `link_entities`).
STATIC_LINKING_INPUTS = ("start", "question")
# Batch fields that supervise training and mean nothing to generate() (Seq2SeqTrainer passes them through): the
# labels, and the rows the writer writes in training.
TRAINING_ONLY_FIELDS = ("labels", "entity_labels", "decoder_entity_labels", "rows_to_write")


@dataclass
class GeneratedMention:
    """One `<E_s> ... <E_e>` span of a generated sequence, and the entities that were on offer for it.

    Args:
        start / end: positions of `<E_s>` and of `<E_e>` in the returned sequence (if unclosed, `end` is the
            position of the next `<E_s>`, EOS or padding, or the sequence's length).
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
class DynamicEntityLinking:
    """Dynamic decoding's hand-over from each step's forward to the logits processor, for one `generate` call.

    `generate(entity_decoding="dynamic")` passes it as the model kwarg `entity_linking`, the per-call channel of
    the generation loop (as the key/value cache is): `prepare_inputs_for_generation` declares it, so `generate`
    accepts it, and takes it out of what the forward receives; the encoder has run before `generate` starts, so no
    encoder call is offered it. At every step:

    1. `prepare_inputs_for_generation` asks the forward for the entity-linking head's `top_k` at the `<E_s>` tokens
       it reads (the forward argument `entity_linking_top_k`);
    2. `_update_model_kwargs_for_generation`, which the loop calls between the forward and the logits processors,
       offers the head's top-k at each row whose newest token is `<E_s>` to `processor`
       (`set_candidates(..., rows=...)`): the names that row's mention may spell.
    """

    processor: EntityConstrainedLogitsProcessor
    top_k: int

    def receive(self, linked, length: int) -> None:
        """Offers the head's top-k at the `<E_s>` tokens a step read last (position `length - 1`) to the processor."""
        if linked is None or linked.positions.shape[0] == 0:
            return
        newest = linked.positions[:, 1] == length - 1
        # `positions` are in row order, so the selected rows' candidates are too
        rows = linked.positions[newest, 0]
        self.processor.set_candidates(linked.top_entity_ids[newest], linked.top_entity_scores[newest], rows=rows)


def static_linking_decoder_input(question_ids: list[int], start_id: int, eos_id: int) -> list[int]:
    """What the decoder reads in the paper's static linking: the question without its final token, then the `<E_s>`
    placeholder (where the entity-linking head is read, second from the end) and EOS."""
    return question_ids[:-1] + [start_id, eos_id]


class EDMemGenerationMixin(GenerationMixin):
    """`generate(entity_decoding=...)`, the static linking pass, the prefix tree of entity names, mention reports."""

    @property
    def _links_entities(self) -> bool:
        """Whether this model has the decoder's entity-linking head that static and dynamic decoding read (EDMem
        has it; the EncDec baseline decodes freely only)."""
        return getattr(self, "entity_linking_head", None) is not None

    # --- the prefix tree of entity names --------------------------------------------------------------------

    def entity_trie(self, tokenizer=None, cache_dir: str | os.PathLike | None = None) -> EntityTrie:
        """The prefix tree of `<E_s> name <E_e>` over `model.entity_vocab`, kept on the model.

        Built with `tokenizer` (names tokenised with a leading space, as mentions appear in running text) the first
        time, and again for another tokenizer; its arrays are cached on disk in `cache_dir` (default: the
        Hugging Face assets cache, `edmem_hf/tries`).
        """
        if self.entity_vocab is None:
            raise ValueError("entity decoding needs model.entity_vocab: set it or load a checkpoint that has one")
        kept = getattr(self, "_entity_trie", None)
        if tokenizer is None:
            if kept is None:
                raise ValueError(
                    "static and dynamic entity decoding spell entity names with the tokenizer: pass tokenizer=... to "
                    "generate() once (the prefix tree is then kept on the model), or call model.set_entity_trie(trie)"
                )
            return kept
        built_with = getattr(self, "_entity_trie_tokenizer", None)
        if kept is not None and built_with is not None and built_with() is tokenizer:
            return kept
        start_id, end_id = marker_token_ids(tokenizer)  # a clear error if the tokenizer lacks them
        if (start_id, end_id) != (self.config.entity_start_token_id, self.config.entity_end_token_id):
            raise ValueError(
                f"tokenizer / model mismatch: the tokenizer's <E_s>, <E_e> are {start_id}, {end_id}, the model's "
                f"{self.config.entity_start_token_id}, {self.config.entity_end_token_id}"
            )
        if cache_dir is None:
            from huggingface_hub import cached_assets_path

            cache_dir = cached_assets_path(library_name="edmem_hf", namespace="tries")
        trie = EntityTrie.build(self.entity_vocab, tokenizer, end_token_id=end_id, cache_dir=cache_dir)
        self.set_entity_trie(trie)
        self._entity_trie_tokenizer = weakref.ref(tokenizer)
        return trie

    def set_entity_trie(self, trie: EntityTrie | None) -> None:
        """Uses a prebuilt `EntityTrie` (one sequence per entity of the vocabulary) for entity decoding."""
        if trie is not None and self.entity_vocab is not None and len(trie) != len(self.entity_vocab):
            raise ValueError(f"the trie has {len(trie)} entities, the entity vocabulary {len(self.entity_vocab)}")
        self._entity_trie = trie
        self._entity_trie_tokenizer = None

    # --- static linking ----------------------------------------------------------------------------------------

    @torch.no_grad()
    def link_entities(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        top_k: int = 5,
        encoder_outputs=None,
        past_key_values: EncoderDecoderCache | None = None,
        decoder_input: str = "start",
    ) -> tuple[torch.LongTensor, torch.FloatTensor]:
        """Static entity linking: the entity-linking head's top-k for each example, read at an `<E_s>` placeholder.

        `decoder_input="start"` (ours): the decoder reads the start token and `<E_s>`. `decoder_input="question"`
        (the paper's static setting, Section 3.3, as the authors' code builds it): the decoder reads the question
        (`input_ids` without its final token, its mention markers kept), then `<E_s>` and EOS, and the head is read
        at that `<E_s>`. Returns ids and raw scores, each `(batch, top_k)`, best first. With an empty
        `past_key_values` (`"start"` only), the decoder fills it (its cross-attention part can then serve
        generation).
        """
        if not self._links_entities:
            raise ValueError(
                f"entity linking needs the full EDMem, not {type(self).__name__} (it has no linking head)"
            )
        if decoder_input not in STATIC_LINKING_INPUTS:
            raise ValueError(f"decoder_input must be one of {STATIC_LINKING_INPUTS}, got {decoder_input!r}")
        if encoder_outputs is None:
            encoder_outputs = self.get_encoder()(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
        batch = encoder_outputs.last_hidden_state.shape[0]
        device = encoder_outputs.last_hidden_state.device
        start_id = self.config.entity_start_token_id
        decoder_attention_mask = None
        if decoder_input == "start":
            decoder_input_ids = torch.tensor([[self.config.decoder_start_token_id, start_id]], device=device)
            decoder_input_ids = decoder_input_ids.expand(batch, 2)
            placeholder = torch.zeros_like(decoder_input_ids, dtype=torch.bool)
            placeholder[:, 1] = True
        else:
            if input_ids is None or past_key_values is not None:
                raise ValueError('decoder_input="question" needs input_ids and no past_key_values')
            decoder_input_ids, decoder_attention_mask, placeholder = self._question_then_placeholder(
                input_ids, attention_mask
            )
        outputs = self.model(
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            past_key_values=past_key_values,
            use_cache=past_key_values is not None,
            return_dict=True,
        )
        hidden = outputs.last_hidden_state
        linked = self.entity_linking_head(
            hidden,
            placeholder,
            self.model.entity_embeddings.weight,
            entity_mask=self._get_entity_mask(hidden.device),
            return_top_k=min(top_k, self.config.entity_vocab_size),
        )
        return linked.top_entity_ids, linked.top_entity_scores

    def _question_then_placeholder(self, input_ids, attention_mask):
        """Decoder inputs `question[:-1] + [<E_s>, EOS]` per row, right-padded; their mask; True at each `<E_s>`
        placeholder `(batch, length)`."""
        mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        start_id, eos_id = self.config.entity_start_token_id, self.config.eos_token_id
        rows = [
            static_linking_decoder_input(ids[keep].tolist(), start_id, eos_id) for ids, keep in zip(input_ids, mask)
        ]
        length = max(map(len, rows))
        pad = self.config.pad_token_id
        decoder_input_ids = torch.tensor([row + [pad] * (length - len(row)) for row in rows], device=input_ids.device)
        lengths = torch.tensor([len(row) for row in rows], device=input_ids.device)
        positions = torch.arange(length, device=input_ids.device)
        decoder_attention_mask = (positions[None, :] < lengths[:, None]).long()
        placeholder = positions[None, :] == (lengths - 2)[:, None]
        return decoder_input_ids, decoder_attention_mask, placeholder

    def _static_candidates(
        self, input_ids, top_k: int, rows_per_example: int, kwargs: dict, config, linker=None, linking_input="start"
    ):
        """Runs the static linking pass before generation (with this model, or with `linker`, a separately
        fine-tuned entity-linking EDMem); returns the candidates `(batch, top_k)` and scores.

        With this model and `linking_input="start"`, the pass computes the cross-attention keys and values of the
        encoder output: generation reuses them (expanded to its rows, through `kwargs["past_key_values"]`)
        instead of computing them again at its first step.
        """
        if input_ids is None:
            raise ValueError("static entity decoding needs input_ids")
        attention_mask = kwargs.get("attention_mask")
        if linker is not None:
            if linker.config.entity_vocab_size != self.config.entity_vocab_size:
                raise ValueError(
                    f"entity_linker has {linker.config.entity_vocab_size} entities, this model "
                    f"{self.config.entity_vocab_size}: they must share one entity table's ids"
                )
            return linker.link_entities(input_ids, attention_mask, top_k, decoder_input=linking_input)
        self._encode_first(input_ids, kwargs, config)
        reuse = (
            linking_input == "start"
            and kwargs.get("past_key_values") is None
            and kwargs.get("use_cache", getattr(config, "use_cache", True)) is not False
            and getattr(config, "cache_implementation", None) is None
        )
        link_cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        ids, scores = self.link_entities(
            input_ids,
            attention_mask,
            top_k,
            encoder_outputs=kwargs["encoder_outputs"],
            past_key_values=link_cache if reuse else None,
            decoder_input=linking_input,
        )
        if reuse:
            cross = link_cache.cross_attention_cache
            if rows_per_example > 1:  # generate() expands its inputs by this factor
                cross.batch_repeat_interleave(rows_per_example)
            kwargs["past_key_values"] = EncoderDecoderCache(DynamicCache(config=self.config), cross)
        return ids, scores

    def _encode_first(self, input_ids, kwargs: dict, config) -> None:
        """Puts the encoder's output in `kwargs["encoder_outputs"]` (unless given), as `generate` would: the static
        linking pass reads it, and `generate` then offers its model kwargs to no encoder call."""
        if kwargs.get("encoder_outputs") is not None:
            return
        if input_ids is None:
            raise ValueError("static and dynamic entity decoding need input_ids")
        kwargs["encoder_outputs"] = self.get_encoder()(
            input_ids=input_ids,
            attention_mask=kwargs.get("attention_mask"),
            output_attentions=kwargs.get("output_attentions", getattr(config, "output_attentions", False)),
            output_hidden_states=kwargs.get("output_hidden_states", getattr(config, "output_hidden_states", False)),
            return_dict=True,
        )

    # --- generate ----------------------------------------------------------------------------------------------

    @with_entity_index_option
    def generate(
        self,
        inputs: torch.Tensor | None = None,
        generation_config: GenerationConfig | None = None,
        logits_processor: LogitsProcessorList | None = None,
        entity_decoding: str | None = None,
        entity_candidates: int | None = None,
        tokenizer=None,
        entity_linker=None,
        static_linking_input: str | None = None,
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
            tokenizer: the model's tokenizer, needed once to spell entity names (the prefix tree, and with
                `config.name_guided_read` the names' lookup, are then kept).
            entity_linker (`EDMemForConditionalGeneration`, *optional*): static decoding takes its candidates from
                this model's entity-linking head (the authors ran a separately fine-tuned linker) instead of this one's.
            static_linking_input (`str`, *optional*): what the decoder reads before the `<E_s>` placeholder of static
                linking: `"start"` (ours) or `"question"` (the paper's); see `link_entities`. Defaults to
                `generation_config.static_linking_input` (`"start"`).
            entity_index (`bool`, *optional*): search the entity table with an index (entity_index.py): True uses
                `model.entity_index`, building one first if none is set; False searches exactly for this call.
                Defaults to whatever `model.set_entity_index` / `model.build_entity_index` set (none: exact).

        Training-only batch fields (`labels`, `entity_labels`, `decoder_entity_labels`) are dropped, so that a
        training batch can be passed as is (`Seq2SeqTrainer(predict_with_generate=True)` does). With
        `return_dict_in_generate=True` the output has `entity_mentions`: for each returned sequence, a list of
        `GeneratedMention` with the candidate entities (ids, names, scores) each mention could choose from.
        """
        for name in TRAINING_ONLY_FIELDS:
            kwargs.pop(name, None)
        if getattr(self.config, "name_guided_read", False) and tokenizer is not None:
            self.name_candidates(tokenizer)  # the names' lookup of the name-guided read, built once
        config = generation_config if generation_config is not None else self.generation_config
        mode = entity_decoding if entity_decoding is not None else getattr(config, "entity_decoding", "free")
        top_k = entity_candidates if entity_candidates is not None else getattr(config, "entity_candidates", 5)
        if mode not in ENTITY_DECODING_MODES:
            raise ValueError(f"entity_decoding must be one of {ENTITY_DECODING_MODES}, got {mode!r}")
        if mode != "free" and not self._links_entities:
            raise ValueError(
                f"entity_decoding={mode!r} needs the full EDMem, not {type(self).__name__} (no linking head)"
            )
        if (entity_linker is not None or static_linking_input is not None) and mode != "static":
            raise ValueError("entity_linker and static_linking_input apply to entity_decoding='static' only")
        if static_linking_input is None:
            static_linking_input = getattr(config, "static_linking_input", "start")
        if not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"entity_candidates must be a positive integer, got {top_k!r}")
        num_beams = kwargs.get("num_beams", getattr(config, "num_beams", 1)) or 1
        num_return = kwargs.get("num_return_sequences", getattr(config, "num_return_sequences", 1)) or 1
        rows_per_example = num_beams if num_beams > 1 else num_return
        input_ids = inputs if inputs is not None else kwargs.get("input_ids")
        processors = LogitsProcessorList(logits_processor or [])
        processor = None
        if mode != "free":
            trie = self.entity_trie(tokenizer)
            candidates = scores = None
            if mode == "static":
                candidates, scores = self._static_candidates(
                    input_ids, top_k, rows_per_example, kwargs, config, entity_linker, static_linking_input
                )
            processor = EntityConstrainedLogitsProcessor(
                trie,
                start_token_id=self.config.entity_start_token_id,
                end_token_id=self.config.entity_end_token_id,
                candidates=candidates,
                candidate_scores=scores,
                group_size=rows_per_example,
            )
            if mode == "dynamic":
                self._encode_first(input_ids, kwargs, config)
                kwargs["entity_linking"] = DynamicEntityLinking(processor, top_k)
            processors.append(processor)
        output = super().generate(inputs, generation_config, processors, **kwargs)
        if not isinstance(output, torch.Tensor):
            if mode == "free" and tokenizer is not None and self.entity_vocab is not None:
                self.entity_trie(tokenizer)  # to name the entities that free-form mentions spell
            # A mention still open at EOS or padding was cut off by the end of generation.
            stops = {kwargs.get(name, getattr(config, name, None)) for name in ("pad_token_id", "eos_token_id")}
            stops = {i for value in stops - {None} for i in (value if isinstance(value, list) else [value])}
            if processor is not None:
                examples = torch.arange(output.sequences.shape[0] // num_return).repeat_interleave(num_return)
                parsed = processor.mentions(output.sequences, examples, stop_token_ids=stops)
            else:
                parsed = self._free_mentions(output.sequences, input_ids, kwargs.get("attention_mask"), stops)
            output["entity_mentions"] = self._name_mentions(parsed)
        return output

    def prepare_inputs_for_generation(self, *args, entity_linking: DynamicEntityLinking | None = None, **kwargs):
        """BART's inputs, plus, in dynamic decoding, a request for the entity-linking head's top-k (see
        `DynamicEntityLinking`)."""
        model_inputs = super().prepare_inputs_for_generation(*args, **kwargs)
        if entity_linking is not None:
            model_inputs["entity_linking_top_k"] = min(entity_linking.top_k, self.config.entity_vocab_size)
        return model_inputs

    def _update_model_kwargs_for_generation(self, outputs, model_kwargs, is_encoder_decoder=False, num_new_tokens=1):
        linking = model_kwargs.get("entity_linking")
        if linking is not None:
            # the step read one new token per row (the whole prompt at the first step): its last one may be <E_s>
            linking.receive(outputs.linked_entities, outputs.logits.shape[1])
        return super()._update_model_kwargs_for_generation(
            outputs, model_kwargs, is_encoder_decoder=is_encoder_decoder, num_new_tokens=num_new_tokens
        )

    # --- mention reports ---------------------------------------------------------------------------------------

    def _name_mentions(self, parsed: list[list[EntityMention]]) -> list[list[GeneratedMention]]:
        vocab = self.entity_vocab

        def name(entity_id: int) -> str | None:
            return vocab.names[entity_id] if vocab is not None and 0 <= entity_id < len(vocab) else None

        return [
            [
                GeneratedMention(
                    m.start,
                    m.end,
                    m.token_ids,
                    m.entity_id,
                    name(m.entity_id),
                    [(c, name(c), s) for c, s in zip(m.candidate_ids, m.candidate_scores)],
                )
                for m in mentions
            ]
            for mentions in parsed
        ]

    @torch.no_grad()
    def _free_mentions(self, sequences, input_ids, attention_mask, stop_token_ids) -> list[list[EntityMention]]:
        """Mentions of freely generated sequences, with the entities the decoder memory attended to at each.

        One teacher-forced pass over the returned sequences reads what the decoder memory attended to at each
        `<E_s>` (generation itself does not record it: beam search reorders and drops rows as it goes).
        """
        config = self.config
        start_id, end_id = config.entity_start_token_id, config.entity_end_token_id
        attended = {}
        if self._links_entities and input_ids is not None and bool((sequences == start_id).any()):
            repeat = sequences.shape[0] // input_ids.shape[0]
            out = self(
                input_ids=input_ids.repeat_interleave(repeat, dim=0),
                attention_mask=attention_mask.repeat_interleave(repeat, dim=0) if attention_mask is not None else None,
                decoder_input_ids=sequences,
                use_cache=False,
                output_attended_entities=True,
                return_dict=True,
            )
            access = out.decoder_attended_entities
            for (row, pos), ids, scores in zip(
                access.positions.tolist(), access.top_entity_ids.tolist(), access.top_entity_scores.tolist()
            ):
                attended[(row, pos)] = (ids, scores)
        trie = getattr(self, "_entity_trie", None)
        result = []
        for row, seq in enumerate(sequences.tolist()):
            mentions = []
            for start, end, closed in marked_spans(seq, start_id, end_id, stop_token_ids=stop_token_ids):
                span = seq[start + 1 : end]
                entity = trie.lookup(span + [end_id]) if closed and trie is not None else -1
                ids, scores = attended.get((row, start), ([], []))
                mentions.append(EntityMention(start, end, span, entity, ids, scores))
            result.append(mentions)
        return result


__all__ = ["DynamicEntityLinking", "EDMemGenerationMixin", "ENTITY_DECODING_MODES", "GeneratedMention"]

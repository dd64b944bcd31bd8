"""Masking collator for EDMem pre-training: random token masking + salient span masking (paper, Sec. 3.3), and
optionally numbers as salient spans too (REALM's salient spans are named entities and dates); the decoder writes the
whole passage (the paper, BART's denoising) or only what was masked (T5's span corruption)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN, IGNORE_INDEX

DECODER_TARGETS = ("passage", "masked_spans")


def _as_list(value: Any) -> list[int]:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return list(value)


@dataclass
class EDMemMaskingCollator:
    """Pads and corrupts a list of passages into an EDMem pre-training batch.

    Each example is a corpus passage (`input_ids` with `<E_s>`/`<E_e>` markers, `entity_labels` on the `<E_s>`
    tokens). The batch has the fields of `docs/design.md`: `input_ids` (corrupted), `attention_mask`,
    `entity_labels`, `labels` (the original sequence) and `decoder_entity_labels`.

    Randomness: if an example carries an `example_index` (and optionally an `epoch`), its masking is drawn from
    its own generator seeded by `(seed, epoch, example_index)`, so that it does not depend on the batch it lands
    in, the number of processes, DataLoader workers or prefetching: a resumed run is identical to an uninterrupted
    one and evaluation masks stay fixed. Without an index, one stateful generator is used (seeded from `seed`, or
    the `generator` you pass); its state is in `state_dict()` for checkpoints.

    Args:
        tokenizer: a tokenizer with a mask token and the `<E_s>`/`<E_e>` markers (ids are looked up once).
        random_mask_prob: P_rtm, the chance that each ordinary token becomes the mask token (paper: 0.3).
        mention_mask_prob: P_ssm, the chance that all tokens of a mention (strictly between `<E_s>` and
            `<E_e>`) become mask tokens (paper: 0.5). Markers and special tokens are never masked.
        seed: seed of the per-example generators (and of the stateful generator when no `generator` is given).
        generator: optional `torch.Generator` for examples without `example_index`.
        pad_to_multiple_of: pad the length up to a multiple of this (e.g. 8 for tensor cores).
        return_salient_span_mask: also return `salient_span_mask`, True at each input `<E_s>` whose mention
            was salient-span-masked (used by evaluation; pop it before calling the model).
        number_mask_prob: the chance that all tokens of a number outside a mention (a run of tokens that are
            digits, such as a year) become mask tokens, as a mention's do (default 0: the paper's masking, with
            the same random draws as without the option).
        decoder_target: "passage" (the paper: `labels` is the whole original passage) or "masked_spans" (T5's
            span corruption: `labels` is each run of masked tokens after a `<mask>` separator, a whole masked
            mention with its markers and its entity at its `<E_s>`, then EOS). With the whole passage as its
            target the decoder can recall a fact from its own prefix ("X was born in" -> the city), which a
            question never gives it; with the masked spans only, a fact must come through what the encoder read.
    """

    tokenizer: Any
    random_mask_prob: float = 0.3
    mention_mask_prob: float = 0.5
    seed: int = 0
    generator: torch.Generator | None = None
    pad_to_multiple_of: int | None = None
    return_salient_span_mask: bool = False
    number_mask_prob: float = 0.0
    decoder_target: str = "passage"
    _rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("random_mask_prob", "mention_mask_prob", "number_mask_prob"):
            value = getattr(self, name)
            if not 0.0 <= float(value) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        if self.decoder_target not in DECODER_TARGETS:
            raise ValueError(f"decoder_target must be one of {DECODER_TARGETS}, got {self.decoder_target!r}")
        if self.pad_to_multiple_of is not None and self.pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be >= 1, got {self.pad_to_multiple_of}")
        tok = self.tokenizer
        if getattr(tok, "mask_token_id", None) is None:
            raise ValueError("EDMemMaskingCollator: the tokenizer has no mask token (expected `<mask>`)")
        if getattr(tok, "pad_token_id", None) is None:
            raise ValueError("EDMemMaskingCollator: the tokenizer has no pad token (expected `<pad>`)")
        unk = getattr(tok, "unk_token_id", None)
        ids = {}
        for marker in (ENTITY_START_TOKEN, ENTITY_END_TOKEN):
            token_id = tok.convert_tokens_to_ids(marker)
            if token_id is None or (unk is not None and token_id == unk):
                raise ValueError(
                    f"EDMemMaskingCollator: the tokenizer has no {marker} token; add the entity markers "
                    f"(edmem train-tokenizer, or tokenizer.add_special_tokens) before pre-training"
                )
            ids[marker] = int(token_id)
        self.mask_token_id = int(tok.mask_token_id)
        self.eos_token_id = int(tok.eos_token_id) if getattr(tok, "eos_token_id", None) is not None else None
        if self.decoder_target == "masked_spans" and self.eos_token_id is None:
            raise ValueError("EDMemMaskingCollator: decoder_target='masked_spans' needs an EOS token to end targets")
        self.pad_token_id = int(tok.pad_token_id)
        self.entity_start_token_id = ids[ENTITY_START_TOKEN]
        self.entity_end_token_id = ids[ENTITY_END_TOKEN]
        special = set(int(i) for i in getattr(tok, "all_special_ids", []))
        special |= {self.mask_token_id, self.pad_token_id, self.entity_start_token_id, self.entity_end_token_id}
        self._special_ids = torch.tensor(sorted(special), dtype=torch.long)
        self._is_number = None
        if self.number_mask_prob > 0:  # token id -> is the token a run of digits (" 1920", "19", "▁7")
            self._is_number = torch.zeros(len(tok), dtype=torch.bool)
            for token, token_id in tok.get_vocab().items():
                self._is_number[token_id] = tok.convert_tokens_to_string([token]).strip().isdigit()
        self._rng = np.random.default_rng(self.seed)

    # --- checkpointing of the stateful generator ----------------------------------------------------------

    def state_dict(self) -> dict:
        """State of the generator used for examples without `example_index` (for `register_for_checkpointing`)."""
        state = {"numpy": self._rng.bit_generator.state}
        if self.generator is not None:
            state["torch"] = self.generator.get_state()
        return state

    def load_state_dict(self, state: Mapping) -> None:
        self._rng.bit_generator.state = state["numpy"]
        if self.generator is not None and "torch" in state:
            self.generator.set_state(state["torch"])

    def _padded_width(self, width: int) -> int:
        """`width` rounded up to `pad_to_multiple_of`."""
        multiple = self.pad_to_multiple_of or 1
        return -(-width // multiple) * multiple

    # --- randomness -------------------------------------------------------------------------------------

    def _draws(self, example: Mapping):
        """`n -> n` uniforms (float64): from the example's own generator when it has an `example_index`, else
        from the collator's."""
        if "example_index" in example:
            entropy = [int(self.seed), int(example.get("epoch", 0)), int(example["example_index"])]
            rng = np.random.default_rng(np.random.SeedSequence(entropy))
            return lambda n: torch.from_numpy(rng.random(n))
        if self.generator is not None:
            return lambda n: torch.rand(n, generator=self.generator, dtype=torch.float64)
        return lambda n: torch.from_numpy(self._rng.random(n))

    def _uniforms(self, examples: Sequence[Mapping], lengths: list[int], n_mentions: list[int], n_numbers: list[int]):
        """Per example: uniforms for its tokens, its mentions and its numbers, in a fixed draw order (the numbers'
        last, so that an example without numbers draws what it drew before the option)."""
        token_u, mention_u, number_u = [], [], []
        for example, length, mentions, numbers in zip(examples, lengths, n_mentions, n_numbers):
            draw = self._draws(example)
            token_u.append(draw(length))
            mention_u.append(draw(mentions))
            number_u.append(draw(numbers) if numbers else torch.zeros(0, dtype=torch.float64))
        return token_u, mention_u, number_u

    # --- the batch ----------------------------------------------------------------------------------------

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        if len(examples) == 0:
            raise ValueError("EDMemMaskingCollator: empty batch")
        seqs, ent = [], []
        for n, example in enumerate(examples):
            if "input_ids" not in example:
                raise ValueError(f"EDMemMaskingCollator: example {n} has no 'input_ids'")
            ids = _as_list(example["input_ids"])
            if not ids:
                raise ValueError(f"EDMemMaskingCollator: example {n} has empty 'input_ids'")
            labels = _as_list(example["entity_labels"]) if example.get("entity_labels") is not None else None
            if labels is None:
                labels = [IGNORE_INDEX] * len(ids)
            if len(labels) != len(ids):
                raise ValueError(
                    f"EDMemMaskingCollator: example {n} has {len(ids)} input_ids but {len(labels)} entity_labels"
                )
            seqs.append(ids)
            ent.append(labels)

        lengths = [len(s) for s in seqs]
        width = self._padded_width(max(lengths))
        batch = len(seqs)
        original = torch.full((batch, width), self.pad_token_id, dtype=torch.long)
        entity_labels = torch.full((batch, width), IGNORE_INDEX, dtype=torch.long)
        attention_mask = torch.zeros((batch, width), dtype=torch.long)
        for i, (ids, labels) in enumerate(zip(seqs, ent)):
            original[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            entity_labels[i, : len(ids)] = torch.tensor(labels, dtype=torch.long)
            attention_mask[i, : len(ids)] = 1
        valid = attention_mask.bool()

        is_start = (original == self.entity_start_token_id) & valid
        is_end = (original == self.entity_end_token_id) & valid
        self._check(original, entity_labels, is_start, is_end, valid)

        # Mention structure: depth 1 strictly between a start and its end; mention k of a row = k-th start.
        starts_so_far = is_start.long().cumsum(dim=1)
        depth = starts_so_far - is_end.long().cumsum(dim=1)
        inside = (depth == 1) & ~is_start & valid
        n_mentions = is_start.sum(dim=1).tolist()

        # Numbers outside mentions: number k of a row = its k-th run of digit tokens (none without the option).
        number = torch.zeros_like(valid)
        if self._is_number is not None:
            number = self._is_number[original.clamp(max=len(self._is_number) - 1)] & valid & (depth == 0)
        number_starts = number & ~torch.nn.functional.pad(number[:, :-1], (1, 0))
        numbers_so_far = number_starts.long().cumsum(dim=1)
        n_numbers = number_starts.sum(dim=1).tolist()

        token_u, mention_u, number_u = self._uniforms(examples, lengths, n_mentions, n_numbers)
        token_rand = torch.ones((batch, width), dtype=torch.float64)
        max_mentions = max(max(n_mentions), 1)
        mention_rand = torch.ones((batch, max_mentions), dtype=torch.float64)
        for i in range(batch):
            token_rand[i, : lengths[i]] = token_u[i]
            mention_rand[i, : n_mentions[i]] = mention_u[i]

        maskable = valid & ~torch.isin(original, self._special_ids)
        random_masked = (token_rand < self.random_mask_prob) & maskable
        mention_chosen = mention_rand < self.mention_mask_prob  # (batch, max_mentions)
        mention_of_token = (starts_so_far - 1).clamp(min=0)
        span_masked = inside & torch.gather(mention_chosen, 1, mention_of_token) & maskable

        if self._is_number is not None:
            number_rand = torch.ones((batch, max(max(n_numbers), 1)), dtype=torch.float64)
            for i in range(batch):
                number_rand[i, : n_numbers[i]] = number_u[i]
            number_chosen = number_rand < self.number_mask_prob
            span_masked |= number & torch.gather(number_chosen, 1, (numbers_so_far - 1).clamp(min=0)) & maskable

        masked = random_masked | span_masked
        start_chosen = torch.gather(mention_chosen, 1, mention_of_token) & is_start
        out = {
            "input_ids": original.masked_fill(masked, self.mask_token_id),
            "attention_mask": attention_mask,
            "entity_labels": entity_labels,
        }
        if self.decoder_target == "passage":
            out["labels"] = original.masked_fill(~valid, IGNORE_INDEX)
            # Corruption only replaces tokens, so the target's markers sit where the input's do.
            out["decoder_entity_labels"] = entity_labels.clone()
            scored, decoder_chosen = masked, start_chosen
        else:
            out["labels"], out["decoder_entity_labels"], scored, decoder_chosen = self._masked_span_targets(
                original, masked, entity_labels, start_chosen, lengths
            )
        if self.return_salient_span_mask:
            out["salient_span_mask"] = start_chosen
            out["decoder_salient_span_mask"] = decoder_chosen  # on the labels' <E_s> of salient-span-masked mentions
            out["scored_target"] = scored  # the labels that are masked tokens (what the perplexity is over)
        return out

    def masked_span_target(self, ids: torch.Tensor, masked_positions: Sequence[int]) -> tuple[torch.Tensor, list[int]]:
        """The `masked_spans` target of one sequence `ids` `(seq,)` with `masked_positions` masked, and the positions
        in it of the masked tokens: what a model pre-trained on this target is asked to fill (a probe's target)."""
        masked = torch.zeros(1, len(ids), dtype=torch.bool)
        masked[0, list(masked_positions)] = True
        no_labels = torch.full((1, len(ids)), IGNORE_INDEX)
        labels, _, scored, _ = self._masked_span_targets(
            ids[None], masked, no_labels, torch.zeros_like(masked), [len(ids)]
        )
        target = labels[0][labels[0] != IGNORE_INDEX]
        return target, scored[0, : len(target)].nonzero()[:, 0].tolist()

    def _masked_span_targets(self, original, masked, entity_labels, start_chosen, lengths):
        """T5-style targets: for each run of masked tokens, `<mask>` then the run (inside `<E_s> ... <E_e>` with its
        entity label when the run is a whole mention), then EOS. Returns labels, decoder entity labels, the labels
        that are masked tokens and the labels' `<E_s>` of salient-span-masked mentions, padded alike."""
        rows = []
        for i, length in enumerate(lengths):
            ids, is_masked = original[i].tolist(), masked[i].tolist()
            entities, chosen = entity_labels[i].tolist(), start_chosen[i].tolist()
            target: list[tuple[int, int, bool, bool]] = []  # (token, entity label, scored, salient <E_s>)
            j = 0
            while j < length:
                if not is_masked[j]:
                    j += 1
                    continue
                k = j
                while k < length and is_masked[k]:
                    k += 1
                # markers are never masked: a run between a start and an end marker is the whole mention
                mention = 0 < j and ids[j - 1] == self.entity_start_token_id and ids[k] == self.entity_end_token_id
                target.append((self.mask_token_id, IGNORE_INDEX, False, False))
                if mention:
                    target.append((self.entity_start_token_id, entities[j - 1], False, chosen[j - 1]))
                target += [(token, IGNORE_INDEX, True, False) for token in ids[j:k]]
                if mention:
                    target.append((self.entity_end_token_id, IGNORE_INDEX, False, False))
                j = k
            target.append((self.eos_token_id, IGNORE_INDEX, False, False))
            rows.append(target)
        width = self._padded_width(max(map(len, rows)))
        labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
        decoder_entity_labels = torch.full_like(labels, IGNORE_INDEX)
        scored = torch.zeros_like(labels, dtype=torch.bool)
        decoder_chosen = torch.zeros_like(scored)
        for i, target in enumerate(rows):
            tokens, entities, is_scored, is_chosen = zip(*target)
            labels[i, : len(target)] = torch.tensor(tokens)
            decoder_entity_labels[i, : len(target)] = torch.tensor(entities)
            scored[i, : len(target)] = torch.tensor(is_scored)
            decoder_chosen[i, : len(target)] = torch.tensor(is_chosen)
        return labels, decoder_entity_labels, scored, decoder_chosen

    def _check(self, original, entity_labels, is_start, is_end, valid) -> None:
        """Raises a ValueError naming the first malformed example."""
        depth = is_start.long().cumsum(dim=1) - is_end.long().cumsum(dim=1)
        bad_rows = {
            "has an <E_e> without a preceding <E_s>": (depth < 0).any(dim=1),
            "has nested mentions (<E_s> inside a mention)": (depth > 1).any(dim=1),
            "has an <E_s> without a matching <E_e> (unmatched mention start)": depth[:, -1] != 0,
            "has an entity label on a token that is not <E_s>": ((entity_labels != IGNORE_INDEX) & ~is_start).any(
                dim=1
            ),
            "has a negative entity label other than -100": (
                (entity_labels < 0) & (entity_labels != IGNORE_INDEX) & valid
            ).any(dim=1),
        }
        for message, rows in bad_rows.items():
            if rows.any():
                row = int(rows.nonzero()[0, 0])
                raise ValueError(f"EDMemMaskingCollator: example {row} {message}")


__all__ = ["EDMemMaskingCollator", "IGNORE_INDEX"]


def _stacked(parts: Sequence[torch.Tensor], pad_value: int) -> torch.Tensor:
    """`(rows, width)` tensors padded on the right to the widest, one below the other."""
    width = max(part.shape[1] for part in parts)
    return torch.cat([torch.nn.functional.pad(part, (0, width - part.shape[1]), value=pad_value) for part in parts])


@dataclass
class QuestionsAndPassagesCollator:
    """Pre-training batches with questions mixed in, in the fine-tuning format (the mixed training of Allen-Zhu
    and Li, 2023: questions about some people, read beside every person's biographies, teach the model to answer
    from a name what it read in text).

    Examples that bring their own target (`labels`, with `decoder_entity_labels`: a question and its marked answer,
    as `task_features.encode_qa_record` makes them) are padded as they are by `questions` (the fine-tuning collator,
    `task_features.EDMemSeq2SeqCollator`); the others are passages, corrupted by `masking`. The two batches are
    stacked into one of `EDMemMaskingCollator`'s fields.
    """

    masking: EDMemMaskingCollator
    questions: Callable[[list[Mapping[str, Any]]], dict[str, torch.Tensor]]

    def state_dict(self) -> dict:
        return self.masking.state_dict()

    def load_state_dict(self, state: Mapping) -> None:
        self.masking.load_state_dict(state)

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        passages = [example for example in examples if "labels" not in example]
        questions = [example for example in examples if "labels" in example]
        if not questions:
            return self.masking(passages)
        for n, question in enumerate(questions):
            if len(question["labels"]) != len(question["decoder_entity_labels"]):
                raise ValueError(f"question {n} of the batch has labels and decoder_entity_labels of other lengths")
        parts = ([self.masking(passages)] if passages else []) + [self.questions(questions)]
        pads = {"input_ids": self.masking.pad_token_id, "attention_mask": 0, "entity_labels": IGNORE_INDEX,
                "labels": IGNORE_INDEX, "decoder_entity_labels": IGNORE_INDEX}  # fmt: skip
        return {name: _stacked([part[name] for part in parts], pad) for name, pad in pads.items()}

"""Candidate entities of a marked mention by its name: the first step of the entity linkers users run on Wikipedia
(REL and ReFinED look a mention's surface form up in a table of names and aliases; GENRE keeps a mention-to-
candidates dictionary), here for EDMem's memory (`EDMemConfig.name_guided_read`).

`NameCandidates` maps the tokens of every entity's name and aliases, as they follow `<E_s>` in running text, to the
entities that bear them: each spelling as written, in lower case and in title case. It holds two sorted arrays (a
64-bit hash of each spelling's tokens, and its entity), not the spellings: a million entities with their aliases
take tens of MB and are looked up with one `searchsorted` a mention. A mention whose tokens match no spelling (a
masked name, a name the vocabulary lacks) has no candidates, and the memory reads as the paper's does. Copied to the
Hub as custom code with `modeling_edmem.py`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN

# A polynomial hash of a token sequence, modulo 2**64 (numpy's uint64 wraps): collisions among a few million
# spellings are not expected (about 1e-7 for 10 million), and a collision only adds a candidate.
_BASE = np.uint64(1_000_003)
_LENGTH_SALT = np.uint64(0x9E3779B97F4A7C15)


def _hashes(sequences: Sequence[Sequence[int]]) -> np.ndarray:
    """`(len(sequences),)` uint64: the hash of each token sequence."""
    lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
    width = int(lengths.max()) if len(lengths) else 0
    flat = np.fromiter(itertools.chain.from_iterable(sequences), dtype=np.uint64, count=int(lengths.sum()))
    rows = np.repeat(np.arange(len(sequences)), lengths)
    columns = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    tokens = np.zeros((len(sequences), width), dtype=np.uint64)
    tokens[rows, columns] = flat
    hashes = lengths.astype(np.uint64) * _LENGTH_SALT
    with np.errstate(over="ignore"):
        for column in range(width):
            inside = column < lengths
            hashes[inside] = hashes[inside] * _BASE + tokens[inside, column] + np.uint64(1)
    return hashes


def spellings(name: str) -> set[str]:
    """The spellings of a name a mention may show: as written, in lower case, in title case."""
    return {name, name.lower(), name.title()}


class NameCandidates:
    """Entities by the tokens of their names and aliases (`build`); `of_mentions` gives each marked mention's."""

    def __init__(self, hashes: np.ndarray, entity_ids: np.ndarray, num_entities: int, max_candidates: int = 16):
        order = np.lexsort((entity_ids, hashes))
        self.hashes, self.entity_ids = hashes[order], entity_ids[order].astype(np.int64)
        self.num_entities = num_entities
        self.max_candidates = max_candidates

    @classmethod
    def build(cls, entity_vocab: Any, tokenizer: Any, max_candidates: int = 16) -> NameCandidates:
        """From an `EntityVocab` (its names and aliases; an unnamed row has none) and the model's tokenizer (a
        spelling tokenised between `<E_s>` and `<E_e>`, as a mention is in running text)."""
        texts, owners = [], []
        for entity, name in enumerate(entity_vocab.names):
            if name is None:
                continue
            for spelling in set().union(*(spellings(text) for text in [name, *entity_vocab.aliases[entity]])):
                texts.append(f"{ENTITY_START_TOKEN} {spelling} {ENTITY_END_TOKEN}")
                owners.append(entity)
        hashes = np.zeros(0, dtype=np.uint64)
        if texts:  # the tokens between the markers, as a mention's are in running text
            backend = getattr(tokenizer, "backend_tokenizer", None)  # a fast tokenizer's, without the wrapper's cost
            if backend is not None:
                padding, truncation = backend.padding, backend.truncation  # left on by an earlier padded call
                backend.no_padding(), backend.no_truncation()
                try:
                    ids = [encoding.ids for encoding in backend.encode_batch(texts, add_special_tokens=False)]
                finally:
                    if padding is not None:
                        backend.enable_padding(**padding)
                    if truncation is not None:
                        backend.enable_truncation(**truncation)
            else:
                ids = tokenizer(texts, add_special_tokens=False, return_attention_mask=False)["input_ids"]
            hashes = _hashes([tokens[1:-1] for tokens in ids])
        pairs = np.unique(np.stack([hashes, np.asarray(owners, dtype=np.uint64)]), axis=1)  # each once
        return cls(pairs[0], pairs[1].astype(np.int64), len(entity_vocab), max_candidates)

    def __len__(self) -> int:
        return len(self.hashes)

    def of_tokens(self, token_ids: Sequence[int]) -> list[int]:
        """The entities with a spelling of exactly these tokens (a mention's, between `<E_s>` and `<E_e>`)."""
        key = _hashes([list(token_ids)])[0]
        lo, hi = np.searchsorted(self.hashes, key, "left"), np.searchsorted(self.hashes, key, "right")
        return self.entity_ids[lo:hi][: self.max_candidates].tolist()

    def of_mentions(self, input_ids: torch.Tensor, start_id: int, end_id: int) -> torch.Tensor:
        """`(M, max_candidates)` entity ids, -1 padded, for the M `<E_s>` of `input_ids` `(batch, seq)` in the order
        of `(input_ids == start_id).nonzero()`: the entities whose spelling is the mention's tokens up to its
        `<E_e>` (none for a mention left open)."""
        rows = []
        for b, position in (input_ids == start_id).nonzero().tolist():
            tokens = input_ids[b, position + 1 :].tolist()
            end = tokens.index(end_id) if end_id in tokens else None
            found = self.of_tokens(tokens[:end]) if end else []
            rows.append(found + [-1] * (self.max_candidates - len(found)))
        return torch.tensor(rows, dtype=torch.long).reshape(len(rows), self.max_candidates)


def candidate_read(
    queries: torch.Tensor,
    table: torch.Tensor,
    candidates: torch.Tensor,
    entity_mask: torch.Tensor | None = None,
    written_rows: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention of `queries` `(M, d)` over the rows of their `candidates` `(M, C)` alone (-1: none; an entity
    hidden by `entity_mask` is none, unless it has written rows): each candidate's table row, or its rows in
    `written_rows` (`entity_attention.WrittenRows`) where it has any, as the full read takes them. Returns the read
    `(M, d)` (zeros for a query without candidates: its read is the caller's) and each candidate's score `(M, C)`,
    the log-sum-exp of its rows' scores (-inf where none)."""
    num_rows = table.shape[0]
    ids = written_rows.ids.tolist() if written_rows is not None else []
    offsets = written_rows.row_score_offsets() if written_rows is not None else None
    own_rows = {}
    for slot, entity in enumerate(ids):
        own_rows.setdefault(entity, []).append(num_rows + slot)
    shown = None if entity_mask is None else entity_mask.tolist()
    slots, owners = [], []  # per query: rows (table ids, or num_rows + written slot) and the candidate column of each
    for row in candidates.tolist():
        these, whose = [], []
        for column, entity in enumerate(row):
            if entity < 0:
                continue
            rows = own_rows.get(entity) or ([entity] if shown is None or shown[entity] else [])
            these += rows
            whose += [column] * len(rows)
        slots.append(these)
        owners.append(whose)
    width = max(map(len, slots), default=0) or 1
    index = torch.tensor([s + [-1] * (width - len(s)) for s in slots], dtype=torch.long).reshape(-1, width)
    column = torch.tensor([o + [-1] * (width - len(o)) for o in owners], dtype=torch.long).reshape(-1, width)
    index, column = index.to(table.device), column.to(table.device)
    from_table = table[index.clamp(0, num_rows - 1)]
    vectors = from_table
    score_offsets = torch.zeros(index.shape, device=table.device)
    if written_rows is not None and len(ids):
        slot = (index - num_rows).clamp(0, len(ids) - 1)
        written = index >= num_rows
        vectors = torch.where(written[..., None], written_rows.rows.to(table.dtype)[slot], from_table)
        if offsets is not None:
            score_offsets = torch.where(written, offsets.to(table.device)[slot], score_offsets)
    scores = torch.einsum("md,mrd->mr", queries.to(table.dtype), vectors).float() + score_offsets
    scores = scores.masked_fill(index < 0, float("-inf"))
    read = torch.einsum("mr,mrd->md", torch.softmax(scores, dim=-1).nan_to_num(0.0), vectors.float())
    per_candidate = torch.full(candidates.shape, float("-inf"), device=table.device)
    for c in range(candidates.shape[1]):  # each candidate's score: the log-sum-exp of its rows'
        per_candidate[:, c] = scores.masked_fill(column != c, float("-inf")).logsumexp(-1)
    return read.to(queries.dtype), per_candidate


class NameCandidatesMixin:
    """`model.name_candidates(tokenizer)` and `model.set_name_candidates(lookup)`: the lookup the encoder's memory
    reads candidates from when `config.name_guided_read` is on, held by the memory modules (their
    `name_lookup` attribute), built from `model.entity_vocab` and kept until the vocabulary grows."""

    def _name_candidate_users(self) -> list[torch.nn.Module]:
        return [m for m in self.modules() if hasattr(type(m), "name_lookup")]

    def name_candidates(self, tokenizer: Any = None) -> NameCandidates | None:
        """The lookup in use; built from `entity_vocab` with `tokenizer` when there is none yet, or when the
        vocabulary has grown since (`add_entities`), else None."""
        users = self._name_candidate_users()
        kept = users[0].name_lookup if users else None
        vocab = getattr(self, "entity_vocab", None)
        if kept is not None and (vocab is None or kept.num_entities == len(vocab)):
            return kept
        if tokenizer is None or vocab is None:
            return None
        lookup = NameCandidates.build(vocab, tokenizer)
        self.set_name_candidates(lookup)
        return lookup

    def set_name_candidates(self, lookup: NameCandidates | None) -> None:
        """The lookup the memories read candidates from (None: none; a name-guided read then asks for one)."""
        for module in self._name_candidate_users():
            module.name_lookup = lookup


__all__ = ["NameCandidates", "NameCandidatesMixin", "candidate_read", "spellings"]

"""Entity-constrained decoding: a flat-array prefix tree of entity names and a vectorised logits processor.

EDMem (paper, "Fine-Tuning") generates entity names between `<E_s>` and `<E_e>` in three settings: free-form
(no constraint), static entity linking (a mention may only spell one of the top-k entities the entity-linking
head picked for the example before decoding) and dynamic entity linking (one of the top-k entities picked from
the hidden state of each generated `<E_s>`). This module holds the machinery, usable without EDMem as well:

- `EntityTrie`: every entity's token sequence (`name <E_e>`, or e.g. `name </s>` for GENRE-style retrieval) in
  a prefix tree stored as a handful of numpy arrays, built with vectorised numpy in seconds for 1M names and
  cached on disk as `.npz` (never pickle: the cache may be shared).
- `EntityConstrainedLogitsProcessor`: a `transformers.LogitsProcessor` forcing generation into the trie. It
  works for greedy search, sampling and beam search (reordered beams are tracked by matching each row's prefix
  with the previous step's rows), for any encoder-decoder or decoder-only model, and is a fast replacement for
  `prefix_allowed_tokens_fn` with a GENRE dict trie (Transformers 5 removed `constraints=`).

Two ways to say where a constrained span starts:

- marker mode (`start_token_id` set, EDMem's `<E_s>`): every generated start marker opens a span, which ends
  with the trie's end token (`<E_e>`). Outside a span everything but the end token is allowed.
- position mode (`start_token_id=None`, GENRE-style): the span starts at `start_position` (default: the length
  of the decoder prompt at the first call) and ends with the end token (usually `</s>`). After it, all tokens are
  allowed (generation normally stops there).

Inside a span the allowed tokens are the continuations of the names of the row's candidate entities (or of all
entities when the row has no candidate set). Fallback, so that no row ever has every score at `-inf`: when no
candidate fits (the generated prefix left the trie, e.g. because another processor forced a token, or the row's
candidate set is empty or holds no entity below the current prefix) only the end token is allowed, closing the
span; and if every allowed token already had a score of `-inf` when the processor was called (another processor
forced something else), the row's scores are returned unchanged.

Interface for the EDMem integration (`EDMemForConditionalGeneration.generate(entity_decoding=...)`). Build the
processor once per model with `EntityConstrainedLogitsProcessor.for_edmem(entity_vocab_or_trie, tokenizer,
cache_dir=...)` (marker mode with the tokenizer's `<E_s>`/`<E_e>`; names tokenised as `" " + name`, the way a
mention follows `<E_s>` in running text), then per `generate` call:

- `"free"`: no processor.
- `"static"`: `EntityConstrainedLogitsProcessor(trie, start_token_id=<E_s>, candidates=ids, candidate_scores=
  scores, group_size=num_beams or num_return_sequences)` with `ids`, `scores` of shape `(batch, k)` (the
  entity-linking head's top-k for each example, `-1` padding). Rows of shape `(batch, k)` are expanded to the
  `batch * group_size` generation rows with `repeat_interleave`, as `generate` expands its inputs.
- `"dynamic"`: the same processor without `candidates`; in the model's forward, when the last input token of
  some rows is `<E_s>`, call `processor.set_candidates(ids, scores, rows=mask)` with `ids`, `scores` of shape
  `(rows, k)` (or `(n, k)` for the `n` rows selected by the boolean `mask` of shape `(rows,)`), in the row order
  of that forward call. They apply from the next processor call on and follow their row through beam reordering.
  Alternatively pass `candidates_fn(input_ids) -> (ids, scores) | None`, called at every step.
- `group_size` must be the number of rows per example (`num_beams` for beam search, `num_return_sequences`
  for sampling) when candidates differ between the beams of one example (dynamic mode): beams are only matched
  within their example.
- State: the processor keeps per-generation state (trie node and candidates of every row); it starts afresh
  whenever `input_ids` is not the previous call's plus one token (a new `generate` call), or on `reset()`.
- Reporting: `processor.mentions(sequences, example_index)` parses returned sequences into `EntityMention`s
  (positions, token ids, the entity whose name was spelled, and the candidate ids/scores that were active when the
  mention was opened), whatever reordering or hypothesis selection happened in between.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers import LogitsProcessor

from .configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN
from .entity_vocab import EntityVocab

__all__ = ["EntityTrie", "EntityConstrainedLogitsProcessor", "EntityMention", "marker_token_ids"]

_TRIE_FORMAT_VERSION = 1
# Node states of a row, besides a trie node id (>= 0).
OUTSIDE = -1  # not inside a constrained span
DEAD = -2  # inside a span whose prefix is not in the trie: only the end token is allowed
_SAME_ROWS = torch.empty(0)  # `_parents` result: every row continues the row of the same index


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


def _tokenize(
    names: list[str], tokenizer: Any, add_special_tokens: bool, prefix: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """Batch-encodes `prefix + name` for every name with the fast (Rust) tokenizer; returns flat token ids (int32)
    and lengths (int64)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None and hasattr(tokenizer, "encode_batch"):  # a bare `tokenizers.Tokenizer`
        backend = tokenizer
    if backend is None:  # slow tokenizer: correct, not fast
        ids = tokenizer([prefix + n for n in names], add_special_tokens=add_special_tokens)["input_ids"]
        return _flatten(ids)
    # The backend keeps the padding/truncation of the last `tokenizer(..., padding=True)` call: switch them off
    # for the names (padding would append pad tokens to every name), then restore them.
    padding, truncation = backend.padding, backend.truncation
    backend.no_padding()
    backend.no_truncation()
    try:
        encode = getattr(backend, "encode_batch_fast", None) or backend.encode_batch
        if not add_special_tokens and len(names) > 1024:
            joined = _tokenize_joined(names, prefix, backend, encode)
            if joined is not None:
                return joined
        texts = [prefix + n for n in names] if prefix else names
        return _flatten([e.ids for e in encode(texts, add_special_tokens=add_special_tokens)])
    finally:
        if padding is not None:
            backend.enable_padding(**padding)
        if truncation is not None:
            backend.enable_truncation(**truncation)


def _flatten(ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter((t for seq in ids for t in seq), dtype=np.int32, count=int(lengths.sum()))
    return flat, lengths


def _tokenize_joined(
    names: list[str], prefix: str, backend: Any, encode: Callable
) -> tuple[np.ndarray, np.ndarray] | None:
    """
    About 3x faster (and no per-name objects) for many short names: encodes chunks of names joined by newlines
    (one Encoding per chunk instead of per name) and splits at the newline token. With a byte-level BPE a newline
    is a pre-token of its own, so this is exact; it is used only if every chunk splits into its names and a random
    sample of names encodes identically on its own, else None (the caller encodes name by name).
    """
    sep = backend.encode("\n", add_special_tokens=False).ids
    if len(sep) != 1 or any("\n" in n or n != n.strip() for n in names):
        return None
    sep_id, chunk, group = sep[0], 512, 64
    parts = []
    for g in range(0, len(names), chunk * group):  # bounded memory: `group` chunks at a time
        chunks = [
            prefix + ("\n" + prefix).join(names[i : i + chunk])
            for i in range(g, min(g + chunk * group, len(names)), chunk)
        ]
        for encoding in encode(chunks, add_special_tokens=False):
            parts.append(np.asarray(encoding.ids, dtype=np.int32))
            parts.append(np.array([sep_id], dtype=np.int32))
    full = np.concatenate(parts[:-1])
    del parts
    seps = np.flatnonzero(full == sep_id)
    if len(seps) != len(names) - 1:
        return None
    lengths = np.diff(seps, prepend=-1, append=len(full)) - 1
    flat = full[full != sep_id]
    del full, seps
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    sample = np.random.default_rng(0).choice(len(names), size=min(256, len(names)), replace=False)
    for i, encoding in zip(sample, encode([prefix + names[i] for i in sample], add_special_tokens=False)):
        if flat[offsets[i] : offsets[i + 1]].tolist() != encoding.ids:
            return None
    return flat, lengths.astype(np.int64)


def _tokenizer_fingerprint(tokenizer: Any) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None and hasattr(tokenizer, "to_str"):
        backend = tokenizer
    if backend is not None:
        data = json.loads(backend.to_str())
        data.pop("padding", None)  # call-time state, not the tokenisation
        data.pop("truncation", None)
        text = json.dumps(data, sort_keys=True)
    else:
        text = json.dumps(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class EntityTrie:
    r"""
    Prefix tree over the token sequences of N entities, stored as flat arrays.

    The sequences are sorted lexicographically; a node is a distinct prefix, numbered breadth-first (by depth,
    then parent, then token), so that the children of a node are consecutive ids and the child reached through
    edge `e` is node `e + 1` (node 0 is the root). Arrays (M nodes, N sequences):

    - `first_child` `(M + 1,)`: children of node `n` are the nodes `first_child[n] .. first_child[n + 1] - 1`.
    - `edge_key` `(M - 1,)` int64, sorted: `parent * vocab_size + token` of the edge into node `e + 1`; a child
      lookup is one `searchsorted`, vectorised over rows.
    - `node_depth` `(M,)`: number of tokens of the prefix.
    - `node_lo`, `node_hi` `(M,)`: the sequences below a node are the sorted positions `[lo, hi)`, so a row's
      candidate subset is checked against a node with two comparisons.
    - `seq_tokens`, `seq_offsets` `(T,)`, `(N + 1,)`: the sorted sequences (CSR); `order` `(N,)`: sorted position
      -> entity id, `rank` `(N,)`: entity id -> sorted position.

    A node without children ends a sequence; sequences should end with an end token that names never contain
    (`<E_e>`, or `</s>`), so that no sequence is a proper prefix of another.
    """

    _ARRAYS = ("first_child", "edge_key", "node_depth", "node_lo", "node_hi", "seq_tokens", "seq_offsets", "order")

    def __init__(
        self,
        first_child: np.ndarray,
        edge_key: np.ndarray,
        node_depth: np.ndarray,
        node_lo: np.ndarray,
        node_hi: np.ndarray,
        seq_tokens: np.ndarray,
        seq_offsets: np.ndarray,
        order: np.ndarray,
        vocab_size: int,
        end_token_id: int | None = None,
        metadata: dict | None = None,
    ):
        self.first_child = first_child
        self.edge_key = edge_key
        self.node_depth = node_depth
        self.node_lo = node_lo
        self.node_hi = node_hi
        self.seq_tokens = seq_tokens
        self.seq_offsets = seq_offsets
        self.order = order
        self.rank = np.empty_like(order)
        self.rank[order] = np.arange(len(order), dtype=order.dtype)
        self.vocab_size = int(vocab_size)
        self.end_token_id = None if end_token_id is None else int(end_token_id)
        self.metadata = dict(metadata or {})
        self._torch_cache: dict[str, dict[str, torch.Tensor]] = {}

    # --- construction -----------------------------------------------------------------------------------

    @classmethod
    def from_sequences(
        cls,
        sequences: Sequence[Sequence[int]] | tuple[np.ndarray, np.ndarray],
        vocab_size: int | None = None,
        end_token_id: int | None = None,
        metadata: dict | None = None,
    ) -> EntityTrie:
        """
        Builds the trie from token sequences: a list of id lists, or `(flat_ids, lengths)` arrays (the sequence of
        entity `i` is `flat_ids[sum(lengths[:i]) : sum(lengths[:i + 1])]`). Fully vectorised: one loop over depths.
        """
        if isinstance(sequences, tuple) and len(sequences) == 2 and isinstance(sequences[0], np.ndarray):
            flat, lengths = sequences[0], np.asarray(sequences[1], dtype=np.int64)
            if flat.dtype not in (np.int32, np.int64):
                flat = flat.astype(np.int64)
        else:
            lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
            flat = np.fromiter((t for s in sequences for t in s), dtype=np.int64, count=int(lengths.sum()))
        n = len(lengths)
        if n == 0:
            raise ValueError("EntityTrie: no sequences (an empty list of entity names?)")
        if (lengths == 0).any():
            bad = int(np.flatnonzero(lengths == 0)[0])
            raise ValueError(f"EntityTrie: sequence {bad} is empty (an empty entity name?)")
        if flat.min() < 0:
            raise ValueError("EntityTrie: token ids must be >= 0")
        vocab_size = int(max(vocab_size or 0, int(flat.max()) + 1))
        max_len = int(lengths.max())

        # Padded (N, L) matrix, padding below every token so that a shorter prefix sorts first.
        dtype = np.uint16 if vocab_size < 2**16 - 1 else np.uint32
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        mat = np.zeros((n, max_len), dtype=dtype)
        active = np.arange(n)
        for d in range(max_len):  # column by column, over the rows still long enough (little memory)
            active = active[lengths[active] > d]
            mat[active, d] = flat[offsets[active] + d] + 1
        del active
        order = np.lexsort(mat.T[::-1])
        mat = mat[order]
        sorted_lengths = lengths[order]
        seq_tokens = (mat[mat != 0] - 1).astype(np.int32)  # the sorted sequences, row by row

        # lcp[i]: tokens row i shares with row i - 1 (0 for the first row).
        lcp = np.zeros(n, dtype=np.int64)
        if n > 1:
            diff = mat[1:] != mat[:-1]
            any_diff = diff.any(axis=1)
            lcp[1:] = np.where(any_diff, diff.argmax(axis=1), max_len)
            del diff, any_diff
        # A sequence that is a proper prefix of another would have no node of its own (equal sequences, e.g.
        # two names a lossy tokenizer spells alike, share their last node: its range holds both).
        shorter = np.minimum(sorted_lengths[1:], sorted_lengths[:-1])
        nested = (lcp[1:] >= shorter) & (sorted_lengths[1:] != sorted_lengths[:-1])
        if nested.any():
            i = int(np.flatnonzero(nested)[0]) + 1
            a, b = int(order[i - 1]), int(order[i])
            raise ValueError(
                f"EntityTrie: the token sequence of entity {a} is a prefix of that of entity {b}; "
                "end every sequence with an end token (e.g. <E_e> or </s>)"
            )
        del shorter, nested

        # Nodes depth by depth; row i opens a node at every depth lcp[i] < d <= len[i].
        depth_lo = [np.zeros(1, dtype=np.int32)]
        depth_hi = [np.array([n], dtype=np.int32)]
        parents, tokens, depth_sizes = [], [], [1]
        for d in range(1, max_len + 1):
            rows = np.flatnonzero((lcp < d) & (sorted_lengths >= d)).astype(np.int32)
            if len(rows) == 0:
                break
            bounds = np.append(np.flatnonzero(lcp < d), n).astype(np.int32)
            hi = bounds[np.searchsorted(bounds, rows, side="right")]
            prev_lo = depth_lo[-1]
            parent_local = np.searchsorted(prev_lo, rows, side="right") - 1
            first_id = sum(len(x) for x in depth_lo[:-1])  # id of the first node at depth d - 1
            parents.append((parent_local + first_id).astype(np.int32))
            tokens.append(mat[rows, d - 1].astype(np.int32) - 1)
            depth_lo.append(rows)
            depth_hi.append(hi.astype(np.int32, copy=False))
            depth_sizes.append(len(rows))
        del mat, lcp  # free the big temporaries as soon as possible: the peak is what limits 1M+ tries
        node_lo = np.concatenate(depth_lo)
        del depth_lo
        node_hi = np.concatenate(depth_hi)
        del depth_hi
        node_depth = np.repeat(np.arange(len(depth_sizes), dtype=np.int16), depth_sizes)
        parent = np.concatenate(parents) if parents else np.zeros(0, dtype=np.int32)
        del parents
        edge_key = parent.astype(np.int64) * vocab_size
        edge_key += np.concatenate(tokens) if tokens else 0
        del tokens
        num_nodes = len(node_lo)
        index_dtype = np.int32 if num_nodes < 2**31 - 1 else np.int64
        first_child = np.empty(num_nodes + 1, dtype=index_dtype)
        first_child[0] = 1
        np.cumsum(np.bincount(parent, minlength=num_nodes), out=first_child[1:])
        first_child[1:] += 1
        del parent

        seq_offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(sorted_lengths, out=seq_offsets[1:])
        return cls(
            first_child=first_child,
            edge_key=edge_key,
            node_depth=node_depth,
            node_lo=node_lo,
            node_hi=node_hi,
            seq_tokens=seq_tokens,
            seq_offsets=seq_offsets,
            order=order.astype(np.int32 if n < 2**31 - 1 else np.int64),
            vocab_size=vocab_size,
            end_token_id=end_token_id,
            metadata=metadata,
        )

    @classmethod
    def build(
        cls,
        names: Sequence[str] | EntityVocab,
        tokenizer: Any,
        end_token_id: int | None = None,
        add_prefix_space: bool = True,
        add_special_tokens: bool = False,
        cache_dir: str | os.PathLike | None = None,
    ) -> EntityTrie:
        """
        Tokenises `names` (batch-encoded by the fast tokenizer) and builds the trie over `name + [end_token_id]`.

        Args:
            names: entity names in entity-id order, or an `EntityVocab` (its `.names`).
            tokenizer: a `PreTrainedTokenizerFast` (or a `tokenizers.Tokenizer`).
            end_token_id: appended to every sequence (`<E_e>` for EDMem, `</s>` for GENRE-style retrieval);
                `None` appends nothing (then `add_special_tokens=True` should supply the end, e.g. `</s>`).
            add_prefix_space: tokenise `" " + name`, the way a mention appears in running text with a byte-level
                BPE (`<E_s> Barack Obama` is `<E_s>`, `ĠBarack`, `ĠObama`). Set to False if the tokenizer adds the
                space itself or for names at the very start of a text without a space.
            add_special_tokens: let the tokenizer add its template (e.g. `<s> ... </s>` for BART, GENRE-style).
            cache_dir: if given, the arrays are cached there as `entity_trie-<hash>.npz`, keyed by a hash of the
                names, the tokenizer (vocabulary, merges, normaliser) and these options.
        """
        if isinstance(names, EntityVocab):
            names = names.names
        names = list(names)
        if not names:
            raise ValueError("EntityTrie.build: the list of names is empty")
        for i, name in enumerate(names):
            if not isinstance(name, str) or not name:
                raise ValueError(f"EntityTrie.build: name {i} is empty or not a string: {name!r}")
        options = {
            "end_token_id": end_token_id,
            "add_prefix_space": add_prefix_space,
            "add_special_tokens": add_special_tokens,
            "format_version": _TRIE_FORMAT_VERSION,
        }
        path = None
        if cache_dir is not None:
            digest = hashlib.sha256()
            digest.update(json.dumps(options, sort_keys=True).encode())
            digest.update(_tokenizer_fingerprint(tokenizer).encode())
            digest.update("\n".join(names).encode("utf-8", "surrogatepass"))
            path = os.path.join(os.fspath(cache_dir), f"entity_trie-{digest.hexdigest()[:24]}.npz")
            if os.path.exists(path):
                return cls.load(path)
        flat, lengths = _tokenize(names, tokenizer, add_special_tokens, prefix=" " if add_prefix_space else "")
        if end_token_id is not None:
            flat = np.insert(flat, np.cumsum(lengths), np.int32(end_token_id))
            lengths = lengths + 1
        vocab_size = len(tokenizer) if hasattr(tokenizer, "__len__") else tokenizer.get_vocab_size()
        trie = cls.from_sequences((flat, lengths), vocab_size=vocab_size, end_token_id=end_token_id, metadata=options)
        trie.metadata["cache_path"] = path
        if path is not None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            trie.save(path)
        return trie

    # --- files ------------------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> str:
        """Writes the arrays to an uncompressed `.npz` (plain arrays, loadable with `allow_pickle=False`)."""
        path = os.fspath(path)
        if not path.endswith(".npz"):
            path += ".npz"
        meta = {k: v for k, v in self.metadata.items() if k != "cache_path"}
        meta.update(vocab_size=self.vocab_size, end_token_id=self.end_token_id, format_version=_TRIE_FORMAT_VERSION)
        tmp = path + ".tmp.npz"
        np.savez(tmp, metadata=np.array(json.dumps(meta)), **{k: getattr(self, k) for k in self._ARRAYS})
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> EntityTrie:
        with np.load(os.fspath(path), allow_pickle=False) as data:
            meta = json.loads(str(data["metadata"]))
            if meta.get("format_version", 0) > _TRIE_FORMAT_VERSION:
                raise ValueError(f"{path}: entity trie format {meta['format_version']} is newer than this code")
            arrays = {k: data[k] for k in cls._ARRAYS}
        vocab_size, end_token_id = meta.pop("vocab_size"), meta.pop("end_token_id")
        meta["cache_path"] = os.fspath(path)
        return cls(**arrays, vocab_size=vocab_size, end_token_id=end_token_id, metadata=meta)

    # --- queries ----------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.order)

    @property
    def num_nodes(self) -> int:
        return len(self.node_lo)

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, k).nbytes for k in self._ARRAYS) + self.rank.nbytes

    def __repr__(self) -> str:
        return f"EntityTrie({len(self)} sequences, {self.num_nodes} nodes, {self.nbytes / 2**20:.1f} MiB)"

    def sequence(self, entity_id: int) -> list[int]:
        """Token ids of one entity's sequence (name tokens + end token)."""
        self._check_ids(np.asarray([entity_id]))
        r = int(self.rank[entity_id])
        return self.seq_tokens[self.seq_offsets[r] : self.seq_offsets[r + 1]].tolist()

    def _check_ids(self, ids: np.ndarray) -> None:
        bad = (ids < -1) | (ids >= len(self))
        if bad.any():
            raise ValueError(
                f"unknown entity id {int(ids[bad][0])}: the trie holds ids 0..{len(self) - 1} (-1 is padding)"
            )

    def sequences_for(
        self, entity_ids: torch.Tensor | np.ndarray | Sequence[int], pad_token_id: int = -1
    ) -> torch.Tensor:
        """
        Token sequences of a candidate subset, padded: `entity_ids` of shape `(k,)` (or `(..., k)`, `-1` = no
        entity) -> a LongTensor of shape `(k, L)` (`(..., k, L)`), `L` the longest selected sequence.
        """
        ids = torch.as_tensor(entity_ids).long()
        ids_np = ids.cpu().numpy()
        self._check_ids(ids_np)
        flat_ids = ids_np.reshape(-1)
        valid = flat_ids >= 0
        ranks = np.where(valid, self.rank[np.clip(flat_ids, 0, None)], 0)
        starts = self.seq_offsets[ranks]
        lens = np.where(valid, self.seq_offsets[ranks + 1] - starts, 0)
        width = int(lens.max()) if len(lens) else 0
        out = np.full((len(flat_ids), width), pad_token_id, dtype=np.int64)
        cols = np.arange(width)
        inside = cols[None, :] < lens[:, None]
        out[inside] = self.seq_tokens[(starts[:, None] + cols[None, :])[inside]]
        return torch.from_numpy(out).reshape(*ids.shape, width)

    def lookup(self, token_ids: Sequence[int]) -> int:
        """Entity id whose full sequence is `token_ids` (name tokens + end token), or -1."""
        node = 0
        for t in token_ids:
            key = node * self.vocab_size + int(t)
            pos = int(np.searchsorted(self.edge_key, key))
            if pos >= len(self.edge_key) or self.edge_key[pos] != key or not 0 <= int(t) < self.vocab_size:
                return -1
            node = pos + 1
        if self.first_child[node + 1] != self.first_child[node]:  # not the end of a sequence
            return -1
        return int(self.order[self.node_lo[node]])

    def allowed_next_tokens(self, prefix: Sequence[int]) -> list[int]:
        """Tokens that continue `prefix` in the trie (a reference implementation, for tests and debugging)."""
        node = 0
        for t in prefix:
            key = node * self.vocab_size + int(t)
            pos = int(np.searchsorted(self.edge_key, key))
            if pos >= len(self.edge_key) or self.edge_key[pos] != key:
                return []
            node = pos + 1
        edges = np.arange(self.first_child[node], self.first_child[node + 1]) - 1
        return (self.edge_key[edges] % self.vocab_size).tolist()

    def torch_arrays(self, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        """The arrays as torch tensors on `device` (zero-copy on CPU), cached per device."""
        device = torch.device(device)
        key = str(device)
        if key not in self._torch_cache:
            arrays = {k: torch.from_numpy(np.ascontiguousarray(getattr(self, k))) for k in self._ARRAYS}
            arrays["rank"] = torch.from_numpy(self.rank)
            arrays["seq_len"] = torch.from_numpy(np.diff(self.seq_offsets).astype(np.int16))
            self._torch_cache[key] = {k: v.to(device) for k, v in arrays.items()}
        return self._torch_cache[key]


@dataclass
class EntityMention:
    """One generated span: `sequence[start]` is the start marker (or the span's first token in position mode),
    `sequence[end]` the end token (or `end == len` if unfinished). `entity_id` is the entity the span spells (-1
    if none); `candidate_ids`/`candidate_scores` the row's candidates when the span was opened (empty if unknown)."""

    start: int
    end: int
    token_ids: list[int]
    entity_id: int
    candidate_ids: list[int] = field(default_factory=list)
    candidate_scores: list[float] = field(default_factory=list)


class EntityConstrainedLogitsProcessor(LogitsProcessor):
    r"""
    [`LogitsProcessor`] that forces generated spans to be entity names from an [`EntityTrie`], optionally
    restricted to per-row candidate entities. Vectorised over rows (batch x beams); see the module docstring.

    Args:
        trie (`EntityTrie`): the names (with their end token).
        start_token_id (`int`, *optional*): marker that opens a span (`<E_s>`). `None`: position mode.
        end_token_id (`int`, *optional*): token closing a span; defaults to `trie.end_token_id`.
        start_position (`int`, *optional*): position mode only: index in `input_ids` where the span starts;
            defaults to the length of `input_ids` at the first call of a generation (the decoder prompt).
        candidates (`torch.LongTensor` of shape `(rows, k)` or `(examples, k)`, *optional*): per-row entity ids
            (`-1` padding); `None` allows every entity of the trie.
        candidate_scores (`torch.FloatTensor` of the same shape, *optional*): only reported by `mentions()`.
        candidates_fn (`Callable`, *optional*): called as `candidates_fn(input_ids)` at every step; may return
            `None` (no change), an id tensor of shape `(rows, k)` or a tuple `(ids, scores)`.
        group_size (`int`, *optional*): rows per example (`num_beams` for beam search, `num_return_sequences`
            for sampling): reordered beams are matched within their example, and `mentions()` keys its log by
            example. Defaults to `rows // examples` when `candidates` has one row per example, else 1.
        dense_threshold (`int`, *optional*): nodes with at least this many children (e.g. the root of a 1M-name
            trie) get a precomputed dense mask instead of a scatter; default `max(512, vocab_size // 16)`.
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
        self.start_position = start_position
        self.candidates_fn = candidates_fn
        self.group_size = group_size
        # A dense row costs a gather of V booleans and a `where` over V scores, a sparse one about a dozen passes
        # over the children: with a 12K vocabulary, the 2K-child root of a 10K-name trie is about 4x faster dense.
        self.dense_threshold = int(dense_threshold) if dense_threshold is not None else max(512, trie.vocab_size // 16)
        self._examples: int | None = None
        self._base_candidates: torch.Tensor | None = None
        self._base_scores: torch.Tensor | None = None
        if candidates is not None:
            self._base_candidates, self._base_scores = self._check_candidates(candidates, candidate_scores)
            self._examples = self._base_candidates.shape[0]
        self._device: torch.device | None = None
        self._tokens_fit = False
        self._t: dict[str, torch.Tensor] = {}
        self.reset()

    # --- public state -----------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forgets the state of the previous generation (done automatically when a new generation starts)."""
        self._prev_ids: torch.Tensor | None = None
        self._node: torch.Tensor | None = None
        self._cands: torch.Tensor | None = None
        self._scores: torch.Tensor | None = None
        self._pending: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]] = []
        self._span_start: int | None = None
        self._log: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._constrained_steps = torch.zeros((), dtype=torch.long)
        self.total_steps = 0  # rows x steps seen (for benchmarks/diagnostics)

    def _check_candidates(
        self, ids: torch.Tensor, scores: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        ids = torch.as_tensor(ids).long()
        if ids.dim() == 1:
            ids = ids[None, :]
        if ids.dim() != 2:
            raise ValueError(f"candidates must have shape (rows, k); got {tuple(ids.shape)}")
        bad = (ids < -1) | (ids >= len(self.trie))
        if bad.any():
            raise ValueError(
                f"unknown entity id {int(ids[bad][0])} in candidates: the trie holds ids 0..{len(self.trie) - 1} "
                "(use -1 for padding)"
            )
        if scores is not None:
            scores = torch.as_tensor(scores, dtype=torch.float32)
            if scores.dim() == 1:
                scores = scores[None, :]
            if scores.shape != ids.shape:
                raise ValueError(f"candidate_scores {tuple(scores.shape)} must match candidates {tuple(ids.shape)}")
        return ids, scores

    @property
    def constrained_steps(self) -> int:
        """Rows x steps spent inside a span since the processor was created or reset."""
        return int(self._constrained_steps)

    @property
    def candidates(self) -> torch.Tensor | None:
        """Current per-row candidate ids, shape `(rows, k)` (`None`: all entities)."""
        return self._cands if self._cands is not None else self._base_candidates

    @candidates.setter
    def candidates(self, value: torch.Tensor | None) -> None:
        if value is None:
            self._base_candidates = self._base_scores = self._cands = self._scores = None
            self._examples = None
            return
        self.set_candidates(value)

    def set_candidates(
        self,
        entity_ids: torch.Tensor,
        scores: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
    ) -> None:
        """
        Sets candidates for the current rows (the row order of the latest model forward), effective from the next
        processor call. `entity_ids`/`scores`: `(rows, k)`, or `(n, k)` with `rows` a boolean mask `(rows,)` or
        index tensor `(n,)` selecting the rows to update (dynamic entity linking: the rows whose last token is
        `<E_s>`). Before a generation starts (no state yet), sets the static candidates, `(rows|examples, k)`.
        """
        ids, scores = self._check_candidates(entity_ids, scores)
        if self._node is None and rows is None:
            self._base_candidates, self._base_scores = ids, scores
            self._examples = ids.shape[0]
            return
        self._pending.append((ids, scores, None if rows is None else torch.as_tensor(rows)))

    # --- per-step machinery -----------------------------------------------------------------------------

    def _setup_device(self, device: torch.device) -> None:
        if self._device == device:
            return
        self._device = device
        t = dict(self.trie.torch_arrays(device))
        t["edge_key"] = t["edge_key"].contiguous()
        counts = (t["first_child"][1:] - t["first_child"][:-1]).long()
        dense = torch.nonzero(counts >= self.dense_threshold).flatten()
        dense = dense[torch.argsort(counts[dense], descending=True)[:256]].sort().values
        v = self.trie.vocab_size
        # Dense nodes get a boolean row (True for a child token): `_mask_dense` gathers them into the row mask.
        allowed = torch.zeros((len(dense), v), dtype=torch.bool, device=device)
        for i, node in enumerate(dense.tolist()):  # once per processor, a few nodes
            lo, hi = int(t["first_child"][node]), int(t["first_child"][node + 1])
            allowed[i, t["edge_key"][lo - 1 : hi - 1] % v] = True
        t["dense_nodes"], t["dense_allowed"] = dense, allowed
        t["leaf"] = counts == 0
        t["is_dense"] = torch.zeros(len(counts), dtype=torch.bool, device=device)
        t["is_dense"][dense] = True
        for name, value in (("outside", OUTSIDE), ("dead", DEAD), ("zero", 0), ("end", self.end_token_id)):
            t[name] = torch.tensor(value, dtype=torch.long, device=device)  # 0-d: no scalar conversion per call
        t["free_slot"] = torch.tensor(len(dense), dtype=torch.long, device=device)
        t["empty_slot"] = torch.tensor(len(dense) + 1, dtype=torch.long, device=device)
        self._t = t

    def _arange(self, n: int) -> torch.Tensor:
        """`torch.arange(n)` on the processor's device, as a view of a cached (grown as needed) range."""
        r = self._t.get("arange")
        if r is None or r.numel() < n:
            r = self._t["arange"] = torch.arange(
                max(n, 2 * (r.numel() if r is not None else 0), 4096), device=self._device
            )
        return r[:n]

    def _advance(self, node: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
        """One transition for every row: state `(rows,)` x token `(rows,)` -> state `(rows,)`."""
        t, v = self._t, self.trie.vocab_size
        edge_key = t["edge_key"]
        if self._tokens_fit:  # every token id < v: no range checks
            key = node.clamp(min=0) * v + tok
            pos = torch.searchsorted(edge_key, key).clamp_(max=edge_key.numel() - 1)
            found = (edge_key.take(pos) == key) & (node >= 0)
        else:
            key = node.clamp(min=0) * v + tok.clamp(0, v - 1)
            pos = torch.searchsorted(edge_key, key).clamp_(max=edge_key.numel() - 1)
            found = (edge_key.take(pos) == key) & (node >= 0) & (tok < v) & (tok >= 0)
        child = pos + 1
        inside = torch.where(t["leaf"].take(child), t["outside"], child)  # a leaf: the sequence is complete
        otherwise = torch.where((tok == self.end_token_id) | (node == OUTSIDE), t["outside"], t["dead"])
        new = torch.where(found, inside, otherwise)
        if self.start_token_id is not None:
            new = torch.where(tok == self.start_token_id, t["zero"], new)
        return new

    def _recompute(self, input_ids: torch.LongTensor) -> torch.Tensor:
        """State of every row from scratch (first step of a generation): a loop over positions."""
        rows, length = input_ids.shape
        if self.start_token_id is not None:
            node = torch.full((rows,), OUTSIDE, dtype=torch.long, device=input_ids.device)
            is_start = input_ids == self.start_token_id
            if not bool(is_start.any()):
                return node
            first = int(is_start.float().argmax(dim=1)[is_start.any(dim=1)].min())
            for i in range(first, length):
                node = self._advance(node, input_ids[:, i])
            return node
        if self._span_start is None:
            self._span_start = length if self.start_position is None else int(self.start_position)
        node = torch.zeros(rows, dtype=torch.long, device=input_ids.device)
        for i in range(self._span_start, length):
            node = self._advance(node, input_ids[:, i])
        return node

    def _hash_weights(self, length: int, device: torch.device) -> torch.Tensor:
        w = self._t.get("hash_weights")
        if w is None or w.numel() < length:
            gen = torch.Generator().manual_seed(0x5EED)
            w = torch.randint(-(2**62), 2**62, (max(64, 2 * length),), generator=gen, dtype=torch.long) | 1
            self._t["hash_weights"] = w = w.to(device)
        return w[:length]

    def _parents(self, input_ids: torch.LongTensor) -> torch.Tensor | None:  # `_SAME_ROWS` if unchanged
        """
        Row of the previous call that each current row `(rows,)` continues (beams get reordered), matched by a
        hash of the prefix (and of the example, when known) and verified exactly; None if some row matches none.
        """
        prev = self._prev_ids
        rows, length = input_ids.shape
        cur = input_ids[:, :-1]
        if torch.equal(cur, prev):  # greedy search, sampling, or beams that kept their order
            return _SAME_ROWS
        arange = torch.arange(rows, device=input_ids.device)
        weights = self._hash_weights(length - 1, input_ids.device)
        g = self._group_size(rows)
        group = (arange // g) * 0x9E3779B97F4A7C1 if g and rows % g == 0 else torch.zeros_like(arange)
        cur_hash = (cur * weights).sum(-1) + group
        prev_hash = (prev * weights).sum(-1) + group
        sorted_hash, perm = prev_hash.sort()
        pos = torch.searchsorted(sorted_hash, cur_hash).clamp(max=rows - 1)
        parents = perm[pos]
        if not bool((prev[parents] == cur).all()):
            return None
        return parents

    def _group_size(self, rows: int) -> int:
        """Rows per example; 0 when unknown (rows may then be matched across examples)."""
        if self.group_size is not None:
            return int(self.group_size)
        if self._examples and rows % self._examples == 0:
            return rows // self._examples
        return 0

    def _apply_pending(self, rows: int) -> None:
        for ids, scores, which in self._pending:
            ids = ids.to(self._device)
            scores = None if scores is None else scores.to(self._device)
            if which is None:
                if ids.shape[0] != rows:
                    raise ValueError(f"set_candidates: {ids.shape[0]} rows of candidates for {rows} rows")
                self._cands = ids
                self._scores = scores if scores is not None else torch.zeros_like(ids, dtype=torch.float32)
                continue
            which = which.to(self._device)
            if which.dtype == torch.bool:
                which = torch.nonzero(which).flatten()
            k = max(ids.shape[1], self._cands.shape[1] if self._cands is not None else 0)
            cands = torch.full((rows, k), -1, dtype=torch.long, device=self._device)
            cscores = torch.zeros((rows, k), dtype=torch.float32, device=self._device)
            if self._cands is not None:
                cands[:, : self._cands.shape[1]] = self._cands
                cscores[:, : self._scores.shape[1]] = self._scores
            cands[which] = -1
            cands[which, : ids.shape[1]] = ids
            cscores[which] = 0.0
            if scores is not None:
                cscores[which, : ids.shape[1]] = scores
            self._cands, self._scores = cands, cscores
        self._pending = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """`input_ids` `(rows, T)`, `scores` `(rows, V)` -> scores with disallowed tokens at `-inf`."""
        device = scores.device
        self._setup_device(device)
        rows = input_ids.shape[0]
        self._tokens_fit = scores.shape[-1] <= self.trie.vocab_size

        prev = self._prev_ids
        new_generation = prev is None or prev.shape[0] != rows or prev.shape[1] != input_ids.shape[1] - 1
        parents = None if new_generation else self._parents(input_ids)
        if new_generation:  # rebuild the state from input_ids
            self._log = []
            self._pending = [p for p in self._pending if p[2] is None]
            self._span_start = None
            self._node = self._recompute(input_ids)
            self._cands = self._scores = None
            if self._base_candidates is not None:
                base = self._base_candidates.to(device)
                base_scores = self._base_scores.to(device) if self._base_scores is not None else None
                if rows % base.shape[0]:
                    raise ValueError(f"{base.shape[0]} rows of candidates do not divide {rows} generation rows")
                rep = rows // base.shape[0]
                self._cands = base.repeat_interleave(rep, dim=0)
                self._scores = (
                    base_scores.repeat_interleave(rep, dim=0)
                    if base_scores is not None
                    else torch.zeros_like(self._cands, dtype=torch.float32)
                )
        elif parents is None:  # rows we cannot trace (should not happen in generate()): recompute their states
            self._node = self._recompute(input_ids)
        elif parents is _SAME_ROWS:
            self._node = self._advance(self._node, input_ids[:, -1])
        else:
            self._node = self._advance(self._node.index_select(0, parents), input_ids[:, -1])
            if self._cands is not None:
                self._cands = self._cands.index_select(0, parents)
                self._scores = self._scores.index_select(0, parents)
        self._prev_ids = input_ids  # generate() builds a new tensor every step; nobody writes into it

        if self.candidates_fn is not None:
            result = self.candidates_fn(input_ids)
            if result is not None:
                ids, cscores = result if isinstance(result, tuple) else (result, None)
                self._pending.append((*self._check_candidates(ids, cscores), None))
        if self._pending:
            self._apply_pending(rows)

        node = self._node
        if self.start_token_id is not None and self._cands is not None:
            opened = input_ids[:, -1] == self.start_token_id
            if bool(opened.any()):  # log for mentions(): (example, prefix, candidate ids, scores)
                idx = torch.nonzero(opened).flatten()
                g = self._group_size(rows)
                example = idx // g if g else torch.full_like(idx, -1)  # -1: example unknown
                self._log.append((example, input_ids[idx].clone(), self._cands[idx], self._scores[idx]))

        in_span = node != OUTSIDE
        self.total_steps += rows
        if self._constrained_steps.device != device:
            self._constrained_steps = self._constrained_steps.to(device)
        self._constrained_steps += in_span.sum()  # no host sync
        return self._mask(scores, node, in_span)

    def _mask(self, scores: torch.FloatTensor, node: torch.Tensor, in_span: torch.Tensor) -> torch.FloatTensor:
        """
        Allowed tokens of every row -> scores `(rows, V)` with the others at `-inf`. One write pass over
        `(rows, V)`; everything else works on `(rows,)`, `(rows, k)` or `(allowed pairs,)` tensors (gathers with
        `take`, writes with `put_`: much cheaper per call than advanced indexing).
        """
        t = self._t
        rows, vocab = scores.shape
        device = scores.device
        neg_inf = float("-inf")
        flat_scores = scores.reshape(-1)
        in_trie = node >= 0
        safe = node.clamp(min=0)
        if self._cands is not None:
            # Candidate subset: a candidate fits if its sorted position is in the node's range; its next token is
            # its sequence's token at the node's depth. Column k: the end token, when no candidate fits.
            cands = self._cands
            ranks = t["rank"].take(cands.clamp(min=0)).long()
            lo, hi = t["node_lo"].take(safe).long(), t["node_hi"].take(safe).long()
            depth = t["node_depth"].take(safe).long()
            valid = (cands >= 0) & in_trie[:, None] & (ranks >= lo[:, None]) & (ranks < hi[:, None])
            valid &= t["seq_len"].take(ranks).long() > depth[:, None]
            pos = (t["seq_offsets"].take(ranks) + depth[:, None]).clamp_(max=t["seq_tokens"].numel() - 1)
            tok = t["seq_tokens"].take(pos).long()
            fallback = in_span & ~valid.any(-1)
            tok = torch.cat([tok, torch.full_like(tok[:, :1], self.end_token_id)], dim=1)
            valid = torch.cat([valid, fallback[:, None]], dim=1) & (tok < vocab)
            flat_idx = self._arange(rows)[:, None] * vocab + tok.clamp(max=vocab - 1)
            vals = flat_scores.take(flat_idx).masked_fill_(~valid, neg_inf)
            best = vals.amax(-1)
            pair_row_constrained = None
        else:
            # All entities: the children of each row's node; nodes with many children use a dense mask.
            first_child = t["first_child"]
            start = torch.where(in_trie, first_child.take(safe).long(), t["zero"])
            count = torch.where(in_trie, first_child.take(safe + 1).long() - start, t["zero"])
            if t["dense_nodes"].numel():
                is_dense = t["is_dense"].take(safe) & in_trie
                if bool(is_dense.any()):
                    return self._mask_dense(scores, safe, in_trie, in_span, is_dense, start, count)
            dead = in_span & ~in_trie
            count = count.masked_fill(dead, 1)
            total = int(count.sum())
            row_idx = torch.repeat_interleave(self._arange(rows), count, output_size=total)
            # Edge of each pair: a running index shifted per row (row r's pairs start at its first child's edge).
            shift = start - 1 - (torch.cumsum(count, 0) - count)
            edge = torch.repeat_interleave(shift, count, output_size=total)
            edge += self._arange(total)
            edge.clamp_(min=0)
            tok = t["edge_key"].take(edge) % self.trie.vocab_size
            tok = torch.where(dead.take(row_idx), t["end"], tok)
            if self.trie.vocab_size <= vocab and self.end_token_id < vocab:  # every token is a column of scores
                valid = None  # all valid
                flat_idx = row_idx * vocab + tok
                vals = flat_scores.take(flat_idx)
            else:
                valid = tok < vocab
                flat_idx = row_idx * vocab + tok.clamp(max=vocab - 1)
                vals = flat_scores.take(flat_idx).masked_fill_(~valid, neg_inf)
            best = torch.full((rows,), neg_inf, dtype=scores.dtype, device=device)
            best = best.scatter_reduce_(0, row_idx, vals, reduce="amax")
            pair_row_constrained = row_idx
        # Rows whose allowed tokens all came in at -inf keep their scores (another processor decided).
        constrain = in_span & (best > neg_inf)
        # Write each row once: free rows are copied, constrained rows start at -inf (their allowed scores are put
        # back after). One spare element at the end of the buffer takes the pairs not to write.
        buffer = torch.empty(rows * vocab + 1, dtype=scores.dtype, device=device)
        out = buffer[:-1].view(rows, vocab)
        sparse = constrain
        free = ~constrain
        num_free = int(free.sum())
        mostly_free = 2 * num_free > rows
        if mostly_free:
            out.copy_(scores)
        else:  # a plain fill is several times faster than index_fill_ over the same rows
            buffer.fill_(neg_inf)
            if num_free:
                free_rows = torch.nonzero(free).flatten()
                out.index_copy_(0, free_rows, scores.index_select(0, free_rows))
        if num_free < rows:
            sparse_rows = torch.nonzero(sparse).flatten()
            if sparse_rows.numel():
                if mostly_free:
                    out.index_fill_(0, sparse_rows, neg_inf)
                if pair_row_constrained is None:
                    put = valid & sparse[:, None]
                else:
                    put = sparse.take(pair_row_constrained)
                    if valid is not None:
                        put &= valid
                buffer.put_(torch.where(put, flat_idx, rows * vocab), vals)
        if self.start_token_id is not None and self.end_token_id < vocab:
            out[:, self.end_token_id].masked_fill_(~in_span, neg_inf)  # no <E_e> outside a mention
        return out

    def _penalty_table(self, vocab: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Additive rows `(dense nodes + 2, vocab)`, 0 for an allowed token and -inf otherwise: the children of each
        dense node, then a free row (everything, but the end token in marker mode), then an empty row (a row's
        allowed tokens are put into it per call)."""
        key = f"penalty_{vocab}_{dtype}"
        table = self._t.get(key)
        if table is None:
            dense = self._t["dense_allowed"]
            width = min(vocab, dense.shape[1])
            allowed = torch.zeros((dense.shape[0] + 2, vocab), dtype=torch.bool, device=device)
            allowed[:-2, :width] = dense[:, :width]
            allowed[-2] = True
            if self.start_token_id is not None and self.end_token_id < vocab:
                allowed[-2, self.end_token_id] = False
            table = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, float("-inf"))
            self._t[key] = table
        return table

    def _mask_dense(
        self,
        scores: torch.FloatTensor,
        safe: torch.Tensor,
        in_trie: torch.Tensor,
        in_span: torch.Tensor,
        is_dense: torch.Tensor,
        start: torch.Tensor,
        count: torch.Tensor,
    ) -> torch.FloatTensor:
        """
        `_mask` when some rows are at a dense node: an additive penalty `(rows, V)` (0 allowed, -inf not) gathered
        from per-node rows (free rows: all but the end token in marker mode; dense rows: their node's children;
        other rows in a span: -inf, then 0 put at each child), plus the scores in place: two passes over `(rows,
        V)`, branch-free (a boolean `where` is several times slower on CPU when the mask is irregular).
        """
        t = self._t
        rows, vocab = scores.shape
        device = scores.device
        neg_inf = float("-inf")
        table = self._penalty_table(vocab, scores.dtype, device)
        n_dense = table.shape[0] - 2
        slot = torch.searchsorted(t["dense_nodes"], safe).clamp_(max=max(n_dense - 1, 0))
        slot = torch.where(is_dense, slot, torch.where(in_span, t["empty_slot"], t["free_slot"]))
        buffer = torch.empty(rows * vocab + 1, dtype=scores.dtype, device=device)  # spare last element
        out = buffer[:-1].view(rows, vocab)
        torch.index_select(table, 0, slot, out=out)
        dead = in_span & ~in_trie
        count = torch.where(is_dense, t["zero"], count).masked_fill_(dead, 1)
        total = int(count.sum())
        if total:
            row_idx = torch.repeat_interleave(self._arange(rows), count, output_size=total)
            shift = start - 1 - (torch.cumsum(count, 0) - count)
            edge = torch.repeat_interleave(shift, count, output_size=total)
            edge += self._arange(total)
            edge.clamp_(min=0)
            tok = t["edge_key"].take(edge) % self.trie.vocab_size
            tok = torch.where(dead.take(row_idx), t["end"], tok)
            flat_idx = torch.where(tok < vocab, row_idx * vocab + tok, rows * vocab)
            buffer.put_(flat_idx, table.new_zeros(()).expand(total))
        out.add_(scores)
        # Rows whose allowed tokens all came in at -inf keep their scores (another processor decided).
        keep = in_span & ~(out.amax(-1) > neg_inf)
        if bool(keep.any()):
            keep_rows = torch.nonzero(keep).flatten()
            out.index_copy_(0, keep_rows, scores.index_select(0, keep_rows))
        return out

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
        self, sequences: torch.LongTensor, example_index: torch.Tensor | Sequence[int] | None = None
    ) -> list[list[EntityMention]]:
        """
        Parses returned sequences `(n, T)` into their spans. `example_index` `(n,)`: the example of each returned
        sequence (e.g. `arange(batch).repeat_interleave(num_return_sequences)`); needed to report candidates.
        Not in the per-step hot path.
        """
        seqs = sequences.tolist()
        log_index: dict[tuple[int, tuple[int, ...]], tuple[list[int], list[float]]] = {}
        for example, prefixes, cands, cscores in self._log:
            for e, p, c, s in zip(example.tolist(), prefixes.tolist(), cands.tolist(), cscores.tolist()):
                log_index[(e, tuple(p))] = (c, s)
        out = []
        for i, seq in enumerate(seqs):
            found = []
            if self.start_token_id is None:
                starts = [(self._span_start or len(seq)) - 1] if self._span_start is not None else []
            else:
                starts = [j for j, tok in enumerate(seq) if tok == self.start_token_id]
            for s in starts:
                end = s + 1
                while end < len(seq) and seq[end] != self.end_token_id and seq[end] != self.start_token_id:
                    end += 1
                span = seq[s + 1 : end]
                closed = end < len(seq) and seq[end] == self.end_token_id
                entity = self.trie.lookup(span + [self.end_token_id]) if closed else -1
                cand_ids: list[int] = []
                cand_scores: list[float] = []
                if self.start_token_id is not None:
                    e = int(example_index[i]) if example_index is not None else -1
                    hit = log_index.get((e, tuple(seq[: s + 1]))) or log_index.get((-1, tuple(seq[: s + 1])))
                    if hit is not None:
                        cand_ids = [c for c in hit[0] if c >= 0]
                        cand_scores = [sc for c, sc in zip(*hit) if c >= 0]
                found.append(EntityMention(s, end, span, entity, cand_ids, cand_scores))
            out.append(found)
        return out

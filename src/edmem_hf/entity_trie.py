"""A prefix tree of entity names stored as a few flat arrays, for constrained decoding of 1M-entity vocabularies.

Usage and options: docs/constrained_decoding.md. Copied to the Hub as custom code with `entity_decoding.py`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import pickle
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .entity_vocab import EntityVocab

try:  # `datasets` hashes a tokenizer without its padding/truncation state; Hub users may not have it
    from datasets.fingerprint import Hasher

    def _fingerprint(*values: Any) -> str:
        return Hasher.hash(values)

except ImportError:  # then the pickled values are hashed: the same tokenizer in another padding state is a miss

    def _fingerprint(*values: Any) -> str:
        return hashlib.sha256(pickle.dumps(values)).hexdigest()


__all__ = ["EntityTrie", "TrieTensors"]

_TRIE_FORMAT_VERSION = 1


def authors_spelling(name: str) -> str:
    """How the authors' QA tries spell an entity: lower-cased, without a trailing parenthetical
    (`"Paris (band)"` -> `"paris"`). Several entities may then share a spelling."""
    return re.sub(r"\s*\(.+\)$", "", name).strip().lower()


# Named spellings for `EntityTrie.build(normalize=...)`.
NAME_SPELLINGS: dict[str, Callable[[str], str]] = {"authors": authors_spelling}


class EntityTrie:
    r"""
    Prefix tree over the token sequences of N entities (e.g. `name <E_e>`), stored as flat numpy arrays.

    The sequences are sorted lexicographically. A node is a distinct prefix; nodes are numbered breadth-first (by
    depth, then parent, then token), so that the children of a node have consecutive ids and the edge into node
    `e + 1` is edge `e` (node 0 is the root). Arrays (M nodes, N sequences, T tokens):

    - `first_child` `(M + 1,)`: the children of node `n` are the nodes `first_child[n] .. first_child[n + 1] - 1`.
    - `edge_key` `(M - 1,)` int64, sorted: `parent * vocab_size + token` of each edge, so that finding a child is
      one `searchsorted`.
    - `node_depth` `(M,)`: tokens in the node's prefix.
    - `node_lo`, `node_hi` `(M,)`: the sequences below a node are the sorted positions `lo .. hi - 1`.
    - `seq_tokens` `(T,)`, `seq_offsets` `(N + 1,)`: the sorted sequences, concatenated.
    - `order` `(N,)`: sorted position -> entity id; `rank` `(E,)`: entity id -> sorted position, -1 for an entity
      without a sequence (an unnamed row of the entity table; `E >= N` entities, `len(trie)` is `E`).

    A node without children ends a sequence. Every sequence must end with a token that no name contains (`<E_e>`,
    `</s>`), so that no sequence is a proper prefix of another.
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
        num_entities: int | None = None,
    ):
        self.first_child = first_child
        self.edge_key = edge_key
        self.node_depth = node_depth
        self.node_lo = node_lo
        self.node_hi = node_hi
        self.seq_tokens = seq_tokens
        self.seq_offsets = seq_offsets
        self.order = order
        self.rank = np.full(len(order) if num_entities is None else num_entities, -1, dtype=order.dtype)
        self.rank[order] = np.arange(len(order), dtype=order.dtype)
        self.vocab_size = int(vocab_size)
        self.end_token_id = None if end_token_id is None else int(end_token_id)
        self.metadata = dict(metadata or {})
        self._tensors: dict[torch.device, TrieTensors] = {}

    # --- construction -----------------------------------------------------------------------------------

    @classmethod
    def from_sequences(
        cls,
        sequences: Sequence[Sequence[int]] | tuple[np.ndarray, np.ndarray],
        vocab_size: int | None = None,
        end_token_id: int | None = None,
        metadata: dict | None = None,
        entity_ids: np.ndarray | None = None,
        num_entities: int | None = None,
    ) -> EntityTrie:
        """
        Builds the trie from token sequences: a list of id lists, or `(flat_ids, lengths)` arrays (the sequence of
        entity `i` is `flat_ids[sum(lengths[:i]) : sum(lengths[:i + 1])]`). Vectorised: one loop over depths.

        `entity_ids` (increasing) gives the entity id of each sequence when some entities of `num_entities` have none.
        """
        if isinstance(sequences, tuple) and len(sequences) == 2 and isinstance(sequences[0], np.ndarray):
            flat, lengths = sequences[0], np.asarray(sequences[1], dtype=np.int64)
            if flat.dtype not in (np.int32, np.int64):
                flat = flat.astype(np.int64)
        else:
            flat, lengths = _concatenate(sequences)
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

        # Padded (N, L) matrix of token + 1, padding 0: a shorter prefix sorts first.
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

        # lcp[i]: tokens sorted row i shares with row i - 1 (0 for the first row).
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
            a, b = (int(x if entity_ids is None else entity_ids[x]) for x in (order[i - 1], order[i]))
            raise ValueError(
                f"EntityTrie: the token sequence of entity {a} is a prefix of that of entity {b}; "
                "end every sequence with an end token (e.g. <E_e> or </s>)"
            )
        del shorter, nested

        # Nodes depth by depth: sorted row i opens a node at every depth d with lcp[i] < d <= len[i]; that node
        # covers the rows up to the next row that opens a node at depth d or above.
        depth_lo = [np.zeros(1, dtype=np.int32)]
        depth_hi = [np.array([n], dtype=np.int32)]
        parents, tokens, depth_sizes = [], [], [1]
        for d in range(1, max_len + 1):
            rows = np.flatnonzero((lcp < d) & (sorted_lengths >= d)).astype(np.int32)
            if len(rows) == 0:
                break
            bounds = np.append(np.flatnonzero(lcp < d), n).astype(np.int32)
            hi = bounds[np.searchsorted(bounds, rows, side="right")]
            parent_local = np.searchsorted(depth_lo[-1], rows, side="right") - 1  # among the nodes at depth d - 1
            first_id = sum(depth_sizes[:-1])  # id of the first node at depth d - 1
            parents.append((parent_local + first_id).astype(np.int32))
            tokens.append(mat[rows, d - 1].astype(np.int32) - 1)
            depth_lo.append(rows)
            depth_hi.append(hi)
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
        first_child = np.empty(num_nodes + 1, dtype=np.int32 if num_nodes < 2**31 - 1 else np.int64)
        first_child[0] = 1
        np.cumsum(np.bincount(parent, minlength=num_nodes), out=first_child[1:])
        first_child[1:] += 1
        del parent

        seq_offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(sorted_lengths, out=seq_offsets[1:])
        ids = order if entity_ids is None else np.asarray(entity_ids)[order]
        return cls(
            first_child=first_child,
            edge_key=edge_key,
            node_depth=node_depth,
            node_lo=node_lo,
            node_hi=node_hi,
            seq_tokens=seq_tokens,
            seq_offsets=seq_offsets,
            order=ids.astype(np.int32 if max(n, num_entities or 0) < 2**31 - 1 else np.int64),
            vocab_size=vocab_size,
            end_token_id=end_token_id,
            metadata=metadata,
            num_entities=num_entities,
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
        normalize: str | None = None,
    ) -> EntityTrie:
        """
        Tokenises `names` and builds the trie over `tokens(name) + [end_token_id]`.

        Args:
            names: entity names in entity-id order, or an `EntityVocab` (its `.names`); `None` for an unnamed row,
                which keeps its id and has no sequence.
            tokenizer: a Transformers tokenizer.
            end_token_id: appended to every sequence (`<E_e>` for EDMem, `</s>` for GENRE-style retrieval);
                `None` appends nothing (then `add_special_tokens=True` should supply the end, e.g. `</s>`).
            add_prefix_space: tokenise `" " + name`, the way a mention appears in running text with a byte-level
                BPE (`<E_s> Barack Obama` is `<E_s>`, `ĠBarack`, `ĠObama`). Set to False if the tokenizer adds the
                space itself or for names at the very start of a text without a space.
            add_special_tokens: let the tokenizer add its template (e.g. `<s> ... </s>` for BART, GENRE-style).
            cache_dir: if given, the arrays are cached there as `entity_trie-<hash>.npz`, keyed by a hash of the
                names, the tokenizer and these options.
            normalize: a name in `NAME_SPELLINGS` (`"authors"`: lower-cased, trailing parenthetical removed, as
                the authors' QA tries spell names) applied to every name first; entities whose names then spell
                alike share one path (`lookup_all` returns them all).
        """
        if isinstance(names, EntityVocab):
            names = names.names
        num_entities = len(names)
        entity_ids = None
        if None in names:
            entity_ids = np.array([i for i, name in enumerate(names) if name is not None], dtype=np.int64)
            names = [names[i] for i in entity_ids]
        names = list(names)
        if not names:
            raise ValueError("EntityTrie.build: the list of names is empty")
        if normalize is not None:
            if normalize not in NAME_SPELLINGS:
                raise ValueError(
                    f"EntityTrie.build: normalize must be one of {sorted(NAME_SPELLINGS)}, got {normalize!r}"
                )
            names = [NAME_SPELLINGS[normalize](name) if isinstance(name, str) else name for name in names]
        for i, name in enumerate(names):
            if not isinstance(name, str) or not name:
                raise ValueError(f"EntityTrie.build: name {i} is empty or not a string: {name!r}")
        options = {
            "normalize": normalize,
            "end_token_id": end_token_id,
            "add_prefix_space": add_prefix_space,
            "add_special_tokens": add_special_tokens,
            "format_version": _TRIE_FORMAT_VERSION,
        }
        path = None
        if cache_dir is not None:
            ids_key = None if entity_ids is None else (num_entities, entity_ids.tobytes())
            key = _fingerprint(options, tokenizer, "\n".join(names), ids_key)
            path = os.path.join(os.fspath(cache_dir), f"entity_trie-{key[:24]}.npz")
            if os.path.exists(path):
                return cls.load(path)
        prefix = " " if add_prefix_space else ""
        # Batches of names, each kept as arrays at once: a million names as Python lists of ints would take GBs.
        batches = [
            _concatenate(_tokenize([prefix + name for name in names[i : i + 65536]], tokenizer, add_special_tokens))
            for i in range(0, len(names), 65536)
        ]
        flat, lengths = (np.concatenate(arrays) for arrays in zip(*batches))
        del batches
        if end_token_id is not None:
            flat = np.insert(flat, np.cumsum(lengths), end_token_id)
            lengths += 1
        trie = cls.from_sequences(
            (flat, lengths),
            vocab_size=len(tokenizer),
            end_token_id=end_token_id,
            metadata=options,
            entity_ids=entity_ids,
            num_entities=num_entities,
        )
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
        meta.update(num_entities=len(self))
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
        num_entities = meta.pop("num_entities", None)
        meta["cache_path"] = os.fspath(path)
        return cls(
            **arrays, vocab_size=vocab_size, end_token_id=end_token_id, metadata=meta, num_entities=num_entities
        )

    # --- queries ----------------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Entities of the id space, with a sequence or not (`num_sequences` have one)."""
        return len(self.rank)

    @property
    def num_sequences(self) -> int:
        return len(self.order)

    @property
    def num_nodes(self) -> int:
        return len(self.node_lo)

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, k).nbytes for k in self._ARRAYS) + self.rank.nbytes

    def __repr__(self) -> str:
        unnamed = f" of {len(self)} entities" if len(self) != self.num_sequences else ""
        return f"EntityTrie({self.num_sequences} sequences{unnamed}, {self.num_nodes} nodes, {self.nbytes / 2**20:.1f} MiB)"

    def check_ids(self, entity_ids: torch.Tensor | np.ndarray | Sequence[int]) -> None:
        """A ValueError naming the first id that is neither an entity of the trie nor -1 (padding)."""
        ids = np.asarray(entity_ids.cpu() if isinstance(entity_ids, torch.Tensor) else entity_ids)
        bad = (ids < -1) | (ids >= len(self))
        if bad.any():
            raise ValueError(
                f"unknown entity id {int(ids[bad][0])}: the trie holds ids 0..{len(self) - 1} (-1 is padding)"
            )

    def sequence(self, entity_id: int) -> list[int]:
        """Token ids of one entity's sequence (name tokens + end token)."""
        self.check_ids([entity_id])
        r = int(self.rank[entity_id])
        if r < 0:
            raise ValueError(f"entity {entity_id} has no sequence in the trie (an unnamed row)")
        return self.seq_tokens[self.seq_offsets[r] : self.seq_offsets[r + 1]].tolist()

    def sequences_for(
        self, entity_ids: torch.Tensor | np.ndarray | Sequence[int], pad_token_id: int = -1
    ) -> torch.Tensor:
        """
        Token sequences of a candidate subset, padded: `entity_ids` of shape `(k,)` (or `(..., k)`, `-1` = no
        entity) -> a LongTensor of shape `(k, L)` (`(..., k, L)`), `L` the longest selected sequence (an entity
        without a sequence is all padding, as `-1` is).
        """
        ids = torch.as_tensor(entity_ids).long()
        self.check_ids(ids)
        flat_ids = ids.reshape(-1).numpy()
        ranks = np.where(flat_ids >= 0, self.rank[np.clip(flat_ids, 0, None)], -1)
        valid = ranks >= 0
        ranks = np.where(valid, ranks, 0)
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
        node = self._node_of(token_ids)
        if node < 0 or self.first_child[node + 1] != self.first_child[node]:  # not the end of a sequence
            return -1
        return int(self.order[self.node_lo[node]])

    def lookup_all(self, token_ids: Sequence[int]) -> list[int]:
        """Every entity id whose full sequence is `token_ids` (several when names share a spelling), sorted."""
        node = self._node_of(token_ids)
        if node < 0 or self.first_child[node + 1] != self.first_child[node]:
            return []
        return sorted(self.order[self.node_lo[node] : self.node_hi[node]].tolist())

    def allowed_next_tokens(self, prefix: Sequence[int]) -> list[int]:
        """Tokens that continue `prefix` in the trie (empty if `prefix` is not in the trie or is complete)."""
        node = self._node_of(prefix)
        if node < 0:
            return []
        return self.tensors().children(torch.tensor([node]))[1].tolist()

    def _node_of(self, prefix: Sequence[int]) -> int:
        """Node of `prefix`, -1 if `prefix` is not in the trie (numpy: `mentions()` calls it for every span)."""
        node = 0
        for token in map(int, prefix):
            key = node * self.vocab_size + token
            pos = int(np.searchsorted(self.edge_key, key))
            if not 0 <= token < self.vocab_size or pos == len(self.edge_key) or self.edge_key[pos] != key:
                return -1
            node = pos + 1
        return node

    def tensors(self, device: torch.device | str = "cpu") -> TrieTensors:
        """The arrays as torch tensors on `device` (zero-copy on CPU), made once per device."""
        device = torch.device(device)
        if device not in self._tensors:
            self._tensors[device] = TrieTensors.from_trie(self, device)
        return self._tensors[device]


@dataclass(frozen=True)
class TrieTensors:
    """An `EntityTrie`'s arrays as torch tensors on one device, and the trie's queries vectorised over rows (the
    rows of a generation batch)."""

    first_child: torch.Tensor
    edge_key: torch.Tensor
    is_leaf: torch.Tensor
    node_depth: torch.Tensor
    node_lo: torch.Tensor
    node_hi: torch.Tensor
    seq_tokens: torch.Tensor
    seq_offsets: torch.Tensor
    rank: torch.Tensor
    vocab_size: int
    max_depth: int  # tokens in the longest sequence

    _NUMPY = ("first_child", "edge_key", "node_depth", "node_lo", "node_hi", "seq_tokens", "seq_offsets", "rank")

    @classmethod
    def from_trie(cls, trie: EntityTrie, device: torch.device) -> TrieTensors:
        arrays = {k: torch.from_numpy(np.ascontiguousarray(getattr(trie, k))).to(device) for k in cls._NUMPY}
        is_leaf = arrays["first_child"][1:] == arrays["first_child"][:-1]
        max_depth = int(trie.node_depth.max())
        return cls(**arrays, is_leaf=is_leaf, vocab_size=trie.vocab_size, max_depth=max_depth)

    def descend(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """The node of each row's prefix, its last `lengths[r]` tokens (`tokens` `(rows, L)`, right-aligned as the
        open spans of generation rows are: they all end at the newest token), -1 where the prefix is not in the
        trie: `EntityTrie._node_of` vectorised over rows, one `searchsorted` a column."""
        vocab, columns = self.vocab_size, tokens.shape[1]
        node = torch.zeros(tokens.shape[0], dtype=torch.long, device=tokens.device)
        valid = tokens < vocab
        before = torch.arange(columns, device=tokens.device) < (columns - lengths)[:, None]  # not the prefix yet
        last = self.edge_key.numel() - 1
        for j in range(columns):
            # below a missing node (-1) the key is negative: no edge matches it
            key = torch.where(valid[:, j], torch.add(tokens[:, j], node, alpha=vocab), -1)
            pos = torch.searchsorted(self.edge_key, key).clamp_(max=last)
            node = torch.where(self.edge_key.take(pos) == key, pos + 1, -1).masked_fill_(before[:, j], 0)
        return node

    def children(self, node: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The children of each node `(rows,)` (none where `node` is negative) as pairs: the row of each pair and
        the token of its edge, both `(pairs,)`, row by row."""
        has_node = node >= 0
        safe = node.clamp(min=0)
        first = self.first_child.take(safe)
        count = torch.where(has_node, self.first_child.take(safe + 1) - first, 0)
        total = int(count.sum())
        row = torch.repeat_interleave(torch.arange(len(node), device=node.device), count, output_size=total)
        # Pair i of the batch is edge `first[row] - 1 + (i - index of the row's first pair)`.
        shift = torch.repeat_interleave(first - 1 - (torch.cumsum(count, 0) - count), count, output_size=total)
        edge = shift + torch.arange(total, device=node.device)
        return row, self.edge_key.take(edge) % self.vocab_size

    def next_tokens(self, node: torch.Tensor, entity_ids: torch.Tensor) -> torch.Tensor:
        """For nodes `(rows,)` and entity ids `(rows, k)` (-1 padding): the token that follows the node's prefix
        in each entity's sequence, -1 where the entity is not below the node (or the node is negative or the
        end of the sequence)."""
        rank = self.rank.take(entity_ids.clamp(min=0)).long()  # -1 for an entity without a sequence
        safe = node.clamp(min=0)
        lo, hi = self.node_lo.take(safe)[:, None], self.node_hi.take(safe)[:, None]
        pos = self.seq_offsets.take(rank.clamp(min=0)) + self.node_depth.take(safe)[:, None]
        below = (entity_ids >= 0) & (node >= 0)[:, None] & (rank >= lo) & (rank < hi)
        below &= pos < self.seq_offsets.take(rank.clamp(min=0) + 1)
        return torch.where(below, self.seq_tokens.take(pos.clamp_(max=self.seq_tokens.numel() - 1)), -1)


def _tokenize(texts: list[str], tokenizer: Any, add_special_tokens: bool) -> list[list[int]]:
    """Token ids of every text, with the tokenizer's ordinary batch call. A fast tokenizer's call switches off the
    padding/truncation that an earlier `tokenizer(..., padding=True)` left on its backend: they are put back."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    padding = truncation = None
    if backend is not None:
        padding, truncation = backend.padding, backend.truncation
    try:
        return tokenizer(
            texts, add_special_tokens=add_special_tokens, return_attention_mask=False, return_token_type_ids=False
        )["input_ids"]
    finally:
        if padding is not None:
            backend.enable_padding(**padding)
        if truncation is not None:
            backend.enable_truncation(**truncation)


def _concatenate(sequences: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Token id lists -> their concatenation (int32) and lengths (int64)."""
    lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
    flat = np.fromiter(itertools.chain.from_iterable(sequences), dtype=np.int32, count=int(lengths.sum()))
    return flat, lengths

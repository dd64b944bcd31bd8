"""An optional inner-product index over the entity table, for the inference-time top-k without scanning the table.

At inference every memory read (top `memory_top_k` at each `<E_s>`) and every entity-linking query asks for the
best-scoring rows of the `(N, d)` table; exact search scores all N. `EntityIndex` is a FAISS IVF-Flat index with
inner product (`faiss-cpu`, the `index` extra): the table's rows are split into `num_lists` clusters and a query
scores the rows of its `nprobe` best clusters only. The index proposes the candidates; their scores are then
computed again from the live table, as exact search computes them, so that the returned scores and the softmax
over the top-k are the exact ones whenever the true top-k are among the candidates. Exact search stays the default
and the reference: the index is used only when set on a model (`model.build_entity_index()`,
`model.set_entity_index(index)`, `generate(entity_index=True)`), never while training or with gradients enabled.

The index remembers a fingerprint (a hash of the table's bytes) and refuses a table that is not the one it was
built on (`add_entities`, other weights loaded, a training step). It is cached on disk under that fingerprint in
the Hugging Face assets cache (`edmem_hf/entity_indexes`), so a second build over the same table is a read.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from contextlib import contextmanager

import numpy as np
import torch

from .entity_attention import chunked_top_k

INDEX_EXTRA = "pip install 'edmem-hf[index]'"
INDEX_FILE = "entity_index.faiss"
INDEX_META_FILE = "entity_index.json"
CACHE_NAMESPACE = "entity_indexes"
# The documented setting: recall@100 >= 0.99 on an entity-aimed query over a clustered 100K or 1M table
# (tests/test_entity_index.py, benchmarks/bench_entity_decoding.py).
DEFAULT_NPROBE = 32
# k-means is trained on at most this many rows per cluster (FAISS warns below 39), over this many iterations.
TRAIN_ROWS_PER_LIST = 40
TRAIN_ITERATIONS = 10


def import_faiss():
    """FAISS, or an ImportError naming the extra that installs it."""
    try:
        import faiss
    except ImportError as error:
        raise ImportError(
            f"the entity index needs FAISS, which is not installed: {INDEX_EXTRA} (or pip install faiss-cpu)"
        ) from error
    return faiss


def table_fingerprint(table: torch.Tensor) -> str:
    """A hash of the table's shape, dtype and bytes: two tables share it only if they hold the same rows."""
    data = table.detach().contiguous().cpu()
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{tuple(data.shape)}:{data.dtype}".encode())
    digest.update(data.view(torch.uint8).numpy() if data.numel() else b"")
    return digest.hexdigest()


def default_num_lists(num_entities: int) -> int:
    """IVF clusters for a table: the power of two nearest `4 sqrt(N)`, with at least 39 rows per cluster."""
    lists = 2 ** round(math.log2(max(4 * math.sqrt(num_entities), 1)))
    return max(1, min(lists, num_entities // 39))


def _quick_key(table: torch.Tensor) -> tuple:
    """What changes when the table is replaced or modified in place (its version counter), without reading it."""
    return (table.data_ptr(), table._version, tuple(table.shape), table.dtype, table.device)


class EntityIndex:
    """A FAISS IVF-Flat inner-product index over an entity table, with the fingerprint of the table it indexes.

    Build it with `EntityIndex.build(table)` (or `EntityIndex.cached(table)`, which reads it from the disk cache
    when the same table was indexed before), or through the model: `model.build_entity_index()`.

    Args:
        faiss_index: a trained and filled `faiss.IndexIVFFlat` with `METRIC_INNER_PRODUCT`.
        fingerprint: `table_fingerprint` of the table it was built on.
        nprobe: clusters searched per query (more: higher recall, slower).
    """

    def __init__(self, faiss_index, fingerprint: str, nprobe: int = DEFAULT_NPROBE):
        self.faiss_index = faiss_index
        self.fingerprint = fingerprint
        self.nprobe = nprobe
        self.build_seconds: float | None = None
        self._verified: tuple | None = None  # `_quick_key` of the last table found to match the fingerprint

    def __repr__(self) -> str:
        return (
            f"EntityIndex(entities={self.num_entities}, dim={self.dim}, num_lists={self.num_lists}, "
            f"nprobe={self.nprobe}, fingerprint={self.fingerprint[:12]})"
        )

    def __deepcopy__(self, memo):  # read-only once built: copies of a model share it
        return self

    @property
    def num_entities(self) -> int:
        return int(self.faiss_index.ntotal)

    @property
    def dim(self) -> int:
        return int(self.faiss_index.d)

    @property
    def num_lists(self) -> int:
        return int(self.faiss_index.nlist)

    @property
    def nbytes(self) -> int:
        """Memory held by the index: its copy of the rows, their ids and the cluster centroids."""
        return self.num_entities * (self.dim * 4 + 8) + self.num_lists * self.dim * 4

    # --- building, saving, the disk cache ------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        table: torch.Tensor,
        *,
        num_lists: int | None = None,
        nprobe: int = DEFAULT_NPROBE,
        seed: int = 0,
        fingerprint: str | None = None,
    ) -> EntityIndex:
        """Clusters the rows of `table` `(N, d)` (k-means on a sample of `40 * num_lists` rows) and files each row
        under its cluster. `num_lists` defaults to `default_num_lists(N)`."""
        faiss = import_faiss()
        start = time.perf_counter()
        rows = table.detach().float().contiguous().cpu().numpy()
        num_entities, dim = rows.shape
        num_lists = num_lists or default_num_lists(num_entities)
        if not 1 <= num_lists <= num_entities:
            raise ValueError(f"num_lists must be between 1 and the table's {num_entities} rows, got {num_lists}")
        if nprobe < 1:
            raise ValueError(f"nprobe must be a positive integer, got {nprobe}")
        faiss.omp_set_num_threads(max(torch.get_num_threads(), 1))
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, num_lists, faiss.METRIC_INNER_PRODUCT)
        index.cp.niter = TRAIN_ITERATIONS
        index.cp.seed = seed
        index.cp.max_points_per_centroid = TRAIN_ROWS_PER_LIST
        index.cp.min_points_per_centroid = 1
        sample = min(num_entities, TRAIN_ROWS_PER_LIST * num_lists)
        chosen = np.sort(np.random.default_rng(seed).choice(num_entities, sample, replace=False))
        index.train(rows[chosen])
        index.add(rows)
        built = cls(index, fingerprint or table_fingerprint(table), nprobe)
        built.build_seconds = time.perf_counter() - start
        built._verified = _quick_key(table)
        return built

    def save(self, directory: str | os.PathLike) -> None:
        """Writes `entity_index.faiss`, then `entity_index.json` (fingerprint, nprobe), each whole or not at all: the
        second marks a complete folder."""
        faiss = import_faiss()
        os.makedirs(directory, exist_ok=True)
        index_path, meta_path = os.path.join(directory, INDEX_FILE), os.path.join(directory, INDEX_META_FILE)
        faiss.write_index(self.faiss_index, index_path + ".tmp")
        os.replace(index_path + ".tmp", index_path)
        with open(meta_path + ".tmp", "w", encoding="utf-8") as f:
            json.dump({"fingerprint": self.fingerprint, "nprobe": self.nprobe, "num_lists": self.num_lists}, f)
        os.replace(meta_path + ".tmp", meta_path)

    @classmethod
    def load(cls, directory: str | os.PathLike) -> EntityIndex:
        """An index saved with `save`. It is checked against a table when set on a model or searched."""
        faiss = import_faiss()
        with open(os.path.join(directory, INDEX_META_FILE), encoding="utf-8") as f:
            meta = json.load(f)
        return cls(faiss.read_index(os.path.join(directory, INDEX_FILE)), meta["fingerprint"], meta["nprobe"])

    @classmethod
    def cached(
        cls,
        table: torch.Tensor,
        *,
        cache_dir: str | os.PathLike | None = None,
        num_lists: int | None = None,
        nprobe: int = DEFAULT_NPROBE,
        seed: int = 0,
    ) -> EntityIndex:
        """`build`, through a disk cache keyed by the table's fingerprint and the settings (default: the Hugging
        Face assets cache, `edmem_hf/entity_indexes`)."""
        import_faiss()
        if cache_dir is None:
            from huggingface_hub import cached_assets_path

            cache_dir = cached_assets_path(library_name="edmem_hf", namespace=CACHE_NAMESPACE)
        fingerprint = table_fingerprint(table)
        num_lists = num_lists or default_num_lists(table.shape[0])
        folder = os.path.join(os.fspath(cache_dir), f"{fingerprint}-ivfflat{num_lists}-seed{seed}")
        if os.path.isfile(os.path.join(folder, INDEX_META_FILE)):
            index = cls.load(folder)
            if index.fingerprint == fingerprint and index.num_entities == table.shape[0]:
                index.nprobe = nprobe
                index._verified = _quick_key(table)
                return index
        index = cls.build(table, num_lists=num_lists, nprobe=nprobe, seed=seed, fingerprint=fingerprint)
        index.save(folder)
        return index

    # --- searching ----------------------------------------------------------------------------------------------

    def check(self, table: torch.Tensor) -> None:
        """Raises a ValueError unless `table` holds the rows this index was built on (hashed again only when the
        table was replaced or modified since it was last checked)."""
        key = _quick_key(table)
        if key == self._verified:
            return
        if tuple(table.shape) != (self.num_entities, self.dim) or table_fingerprint(table) != self.fingerprint:
            raise ValueError(
                f"stale entity index: it was built on a {self.num_entities} x {self.dim} entity table that is not this "
                f"{table.shape[0]} x {table.shape[1]} one (add_entities, other weights loaded, or a training step "
                "changed it): build it again with model.build_entity_index(), or model.set_entity_index(None) for "
                "exact search"
            )
        self._verified = key

    def search(
        self, queries: torch.Tensor, table: torch.Tensor, k: int, entity_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The `k` best float32 scores `(M, k)` and their entity ids `(M, k)`, best first, as `chunked_top_k`
        returns them: candidates from the index (visible entities only), scored again exactly against `table`.
        Rows for which the searched clusters hold fewer than `k` visible entities are searched exactly."""
        faiss = import_faiss()
        self.check(table)
        num_queries = queries.shape[0]
        if num_queries == 0 or k < 1:
            empty = torch.zeros(num_queries, 0, device=queries.device)
            return empty, empty.long()
        faiss.omp_set_num_threads(max(torch.get_num_threads(), 1))
        params = faiss.SearchParametersIVF(nprobe=self.nprobe)
        if entity_mask is not None:
            bitmap = np.packbits(entity_mask.detach().cpu().numpy().astype(bool), bitorder="little")
            params.sel = faiss.IDSelectorBitmap(len(entity_mask), faiss.swig_ptr(bitmap))
        found = self.faiss_index.search(queries.detach().float().contiguous().cpu().numpy(), k, params=params)[1]
        ids = torch.from_numpy(found).to(queries.device)
        short = (ids < 0).any(dim=1)
        ids = ids.clamp_min(0)
        scores = torch.einsum("md,mkd->mk", queries.to(table.dtype), table[ids]).float()
        scores, order = scores.sort(dim=1, descending=True)
        ids = ids.gather(1, order)
        if short.any():
            rows = short.nonzero().squeeze(1)
            scores[rows], ids[rows] = chunked_top_k(queries[rows], table, k, entity_mask)
        return scores, ids

    def recall(
        self, queries: torch.Tensor, table: torch.Tensor, k: int = 100, entity_mask: torch.Tensor | None = None
    ) -> float:
        """Mean fraction of the exact top-`k` that the index returns for `queries` `(M, d)`: measure it on queries
        of your own model before relying on the index."""
        with torch.no_grad():
            exact = chunked_top_k(queries, table, k, entity_mask)[1]
            indexed = self.search(queries, table, k, entity_mask)[1]
        hits = (indexed[:, :, None] == exact[:, None, :]).any(dim=2).sum(dim=1)
        return float(hits.float().mean() / k)


# --- the model side: EDMemPreTrainedModel's methods and generate's option -------------------------------------


class EntityIndexMixin:
    """`model.build_entity_index()`, `model.set_entity_index(index)` and `model.entity_index`.

    The index is held by the modules that search the table (the memories and the entity-linking head, which have
    an `entity_index` attribute); they use it at inference only (`model.eval()`, gradients disabled).
    """

    def _index_users(self) -> list[torch.nn.Module]:
        return [m for m in self.modules() if hasattr(type(m), "entity_index") and not isinstance(m, EntityIndexMixin)]

    def _entity_table(self) -> torch.Tensor:
        for module in self.modules():
            embeddings = getattr(module, "entity_embeddings", None)
            if isinstance(embeddings, torch.nn.Embedding):
                return embeddings.weight
        raise ValueError("this model has no entity table to index (variant 'encdec')")

    @property
    def entity_index(self) -> EntityIndex | None:
        """The index searched at inference, or None (exact search)."""
        users = self._index_users()
        return users[0].entity_index if users else None

    def set_entity_index(self, index: EntityIndex | None) -> None:
        """Searches the entity table with `index` at inference (None: exact search again). A ValueError if the
        index was built on another table."""
        if index is not None:
            index.check(self._entity_table())
        for module in self._index_users():
            module.entity_index = index

    def build_entity_index(
        self,
        *,
        num_lists: int | None = None,
        nprobe: int = DEFAULT_NPROBE,
        cache_dir: str | os.PathLike | None = None,
        use_cache: bool = True,
        seed: int = 0,
    ) -> EntityIndex:
        """Builds an `EntityIndex` over this model's entity table (or reads it from the disk cache, keyed by the
        table's fingerprint), sets it (`set_entity_index`) and returns it. Call it again after the table changes.

        Args:
            num_lists: IVF clusters (default `default_num_lists(N)`: 1024 for 100K entities, 4096 for 1M).
            nprobe: clusters searched per query (default 32, the documented setting).
            cache_dir: where the index is cached (default: the Hugging Face assets cache,
                `edmem_hf/entity_indexes`); `use_cache=False` builds without it.
        """
        table = self._entity_table()
        settings = dict(num_lists=num_lists, nprobe=nprobe, seed=seed)
        if use_cache:
            index = EntityIndex.cached(table, cache_dir=cache_dir, **settings)
        else:
            index = EntityIndex.build(table, **settings)
        self.set_entity_index(index)
        return index

    @contextmanager
    def _entity_index_option(self, entity_index: bool | None):
        """generate()'s `entity_index`: None keeps what is set; True uses the set index, building one (kept set) if
        there is none; False searches exactly for this call."""
        previous = self.entity_index
        if entity_index is True and previous is None:
            previous = self.build_entity_index()
        elif entity_index is False:
            self.set_entity_index(None)
        try:
            yield
        finally:
            if entity_index is False:
                for module in self._index_users():
                    module.entity_index = previous


def with_entity_index_option(generate: Callable) -> Callable:
    """Gives `generate` the option `entity_index` (True / False / None: see `_entity_index_option`)."""

    @functools.wraps(generate)
    def wrapper(self, *args, entity_index: bool | None = None, **kwargs):
        if entity_index not in (None, True, False):
            raise ValueError(f"entity_index must be True, False or None, got {entity_index!r}")
        with self._entity_index_option(entity_index):
            return generate(self, *args, **kwargs)

    return wrapper


__all__ = ["EntityIndex", "EntityIndexMixin", "default_num_lists", "table_fingerprint", "with_entity_index_option"]

"""The optional entity index (entity_index.py): its top-k against exact search, the mask, a changed table, training,
generation, the disk cache, and the error without FAISS."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from edmem_hf.entity_attention import chunked_top_k, entity_attention
from edmem_hf.entity_index import DEFAULT_NPROBE, EntityIndex, default_num_lists
from edmem_hf.research.entity_growth import add_entities
from tiny_models import ES, load_benchmark, tiny_model, tiny_model_with_entities

needs_faiss = pytest.mark.skipif(
    importlib.util.find_spec("faiss") is None, reason="the index extra: pip install 'edmem-hf[index]'"
)


def planted_table(num_entities: int = 20_000, dim: int = 32, queries: int = 6, k: int = 10, seed: int = 0):
    """A random table in which each query's `k` best rows are known: rows planted along the query, best first."""
    generator = torch.Generator().manual_seed(seed)
    table = torch.randn(num_entities, dim, generator=generator) * 0.02
    query = torch.randn(queries, dim, generator=generator)
    planted = torch.randperm(num_entities, generator=generator)[: queries * k].view(queries, k)
    for q in range(queries):
        for rank, row in enumerate(planted[q].tolist()):
            table[row] = query[q] / query[q].norm() * (1.0 - 0.05 * rank)
    return table, query, planted


def clustered_model(num_entities: int = 2_500, num_clusters: int = 64, seed: int = 0):
    """A tiny EDMem in eval mode whose entity table is `num_clusters` tight clusters: the rows a query ranks highest
    lie in the clusters whose centres it ranks highest, so an index that probes a few of its lists finds the exact
    top-k, and its answers are exact search's for a reason other than probing every list."""
    model = tiny_model(entity_vocab_size=num_entities).eval()
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(num_clusters, model.config.entity_embed_dim, generator=generator)
    noise = torch.randn(num_entities, model.config.entity_embed_dim, generator=generator)
    with torch.no_grad():
        model.model.entity_embeddings.weight.copy_(centres[torch.arange(num_entities) % num_clusters] + 0.01 * noise)
    return model


class SpyIndex:
    """Counts the searches an index is asked for."""

    def __init__(self, index: EntityIndex):
        self.index, self.searches = index, 0

    def search(self, *args):
        self.searches += 1
        return self.index.search(*args)

    def check(self, table):
        self.index.check(table)


@needs_faiss
def test_indexed_top_k_equals_exact_on_planted_rows():
    table, query, planted = planted_table()
    index = EntityIndex.build(table, nprobe=4)
    assert index.num_lists == default_num_lists(len(table)) == 512
    scores, ids = index.search(query, table, 10)
    assert torch.equal(ids, planted)
    exact_scores, exact_ids = chunked_top_k(query, table, 10)
    assert torch.equal(ids, exact_ids)
    torch.testing.assert_close(scores, exact_scores)
    # the memory read over the top-k (its softmax) is the exact one
    exact = entity_attention(query, table, top_k=10, return_top_k=10)
    with torch.no_grad():
        indexed = entity_attention(query, table, top_k=10, return_top_k=10, index=index)
    torch.testing.assert_close(indexed.read, exact.read)
    assert torch.equal(indexed.top_ids, exact.top_ids)


@needs_faiss
def test_a_bf16_table_gets_exact_search_scores_not_faiss_float32_ones():
    """FAISS scores a float32 copy of the rows against the float32 query; exact search scores the bf16 table as the
    model's matmul does (query cast to bf16, product rounded). The index only proposes candidates: their scores are
    computed again from the live table, so scores and the memory read over them are exact search's, bit for bit."""
    faiss = pytest.importorskip("faiss")
    table, query, planted = planted_table()
    table = table.to(torch.bfloat16)
    index = EntityIndex.build(table, nprobe=4)
    scores, ids = index.search(query, table, 10)
    exact_scores, exact_ids = chunked_top_k(query, table, 10)
    assert torch.equal(ids, exact_ids) and torch.equal(ids, planted)
    assert torch.equal(scores, exact_scores)
    # what the re-score corrects: FAISS's own scores of the same candidates are off by the bf16 rounding
    faiss_scores = index.faiss_index.search(query.numpy(), 10, params=faiss.SearchParametersIVF(nprobe=4))[0]
    assert (torch.from_numpy(faiss_scores) - exact_scores).abs().max() > 1e-3
    exact = entity_attention(query, table, top_k=10, return_top_k=10)
    with torch.no_grad():
        indexed = entity_attention(query, table, top_k=10, return_top_k=10, index=index)
    assert torch.equal(indexed.read, exact.read) and torch.equal(indexed.top_scores, exact.top_scores)


@needs_faiss
def test_the_index_searches_only_nprobe_of_its_lists():
    """On an unstructured table (the index's worst case) one list of 64 misses most of the true top 10; all 64 find
    them all: the lists restrict the search, and nprobe says how many are read."""
    generator = torch.Generator().manual_seed(0)
    table, queries = torch.randn(20_000, 32, generator=generator), torch.randn(16, 32, generator=generator)
    index = EntityIndex.build(table, num_lists=64, nprobe=1)
    assert index.recall(queries, table, k=10) < 0.5
    index.nprobe = index.num_lists
    assert index.recall(queries, table, k=10) == 1.0


@needs_faiss
def test_recall_at_100_on_a_random_100k_table():
    """The documented setting (default lists and nprobe) reaches recall@100 >= 0.99 on a random clustered table
    with entity-aimed queries; an unstructured table is the index's worst case and is not held to it."""
    bench = load_benchmark("bench_entity_decoding")
    table, queries = bench.clustered_table(100_000, seed=0), None
    queries = bench.aimed_queries(table, 64, seed=1)
    index = EntityIndex.build(table)
    assert (index.num_lists, index.nprobe) == (1024, DEFAULT_NPROBE)
    recall = index.recall(queries, table, k=100)
    print(f"recall@100 on a random clustered 100K x 256 table: {recall:.3f}")
    assert recall >= 0.99


@needs_faiss
def test_mask_is_honoured():
    table, query, planted = planted_table()
    index = EntityIndex.build(table, nprobe=4)
    mask = torch.ones(len(table), dtype=torch.bool)
    mask[planted[:, :3].flatten()] = False  # the three best rows of every query hidden
    scores, ids = index.search(query, table, 7, mask)
    assert torch.equal(ids, planted[:, 3:])
    assert mask[ids].all()
    torch.testing.assert_close(scores, chunked_top_k(query, table, 7, mask)[0])
    # so few rows visible that the searched clusters cannot fill the top-k: those queries are searched exactly
    few = torch.zeros(len(table), dtype=torch.bool)
    few[planted[:, 5]] = True
    few[torch.arange(0, len(table), 4000)] = True
    scores, ids = index.search(query, table, 8, few)
    exact_scores, exact_ids = chunked_top_k(query, table, 8, few)
    visible = torch.isfinite(exact_scores)
    assert torch.equal(ids[visible], exact_ids[visible]) and torch.equal(scores.isfinite(), visible)


@needs_faiss
def test_model_uses_the_index_at_inference_only():
    model = clustered_model()
    index = model.build_entity_index(use_cache=False, num_lists=64, nprobe=4)
    assert index.nprobe < index.num_lists  # a few lists of many are read: not exhaustive by construction
    assert model.entity_index is index and model.model.decoder.memory.entity_index is index
    spy = SpyIndex(index)
    for module in model._index_users():
        module.entity_index = spy
    batch = {"input_ids": torch.tensor([[0, ES, 10, 6, 11, 2]]), "decoder_input_ids": torch.tensor([[2, ES, 10]])}
    exact = model(**batch, output_attended_entities=True)  # gradients enabled: exact search
    assert spy.searches == 0
    with torch.no_grad():
        indexed = model(**batch, output_attended_entities=True)
    assert spy.searches == 3  # encoder memory, decoder memory, entity-linking head
    torch.testing.assert_close(indexed.logits, exact.logits)
    assert torch.equal(indexed.linked_entities.top_entity_ids, exact.linked_entities.top_entity_ids)
    model.train()
    with torch.no_grad():
        model(**batch, output_attended_entities=True)
    assert spy.searches == 3  # training: never the index
    model.set_entity_index(None)
    assert model.entity_index is None and model.model.encoder.memory.entity_index is None


@needs_faiss
def test_a_changed_table_is_refused_until_rebuilt(tmp_path):
    model, _, names, _ = tiny_model_with_entities(40)
    model.build_entity_index(cache_dir=tmp_path, num_lists=4, nprobe=4)
    batch = {"input_ids": torch.tensor([[0, ES, 10, 6, 11, 2]]), "decoder_input_ids": torch.tensor([[2, ES]])}
    new_row = torch.randn(1, model.config.entity_embed_dim) * 10
    (new_id,) = add_entities(model, ["Newcomer"], rows=new_row)
    with torch.no_grad(), pytest.raises(ValueError, match="stale entity index.*build_entity_index"):
        model(**batch, entity_linking_top_k=5)
    index = model.build_entity_index(cache_dir=tmp_path, num_lists=4, nprobe=4)
    assert index.num_entities == len(names) + 1
    # the added entity is found: a query along its row ranks it first
    query = new_row / new_row.norm()
    assert index.search(query, model.model.entity_embeddings.weight, 3)[1][0, 0] == new_id
    # other weights loaded in place (a checkpoint) are refused too, and so is an index built on another table
    other, _, _, _ = tiny_model_with_entities(40)
    model_before = tiny_model_with_entities(40)[0]
    with torch.no_grad(), pytest.raises(ValueError, match="stale entity index"):
        model_before.set_entity_index(index)
    model_before.build_entity_index(cache_dir=tmp_path, num_lists=4, nprobe=4)
    other_weights = {k: v + 0.01 if "entity_embeddings" in k else v for k, v in other.state_dict().items()}
    model_before.load_state_dict(other_weights)
    with torch.no_grad(), pytest.raises(ValueError, match="stale entity index"):
        model_before(**batch, entity_linking_top_k=5)


@needs_faiss
def test_disk_cache_is_keyed_by_the_table(tmp_path):
    model = tiny_model(entity_vocab_size=200).eval()
    first = model.build_entity_index(cache_dir=tmp_path)
    assert first.build_seconds is not None and len(list(tmp_path.iterdir())) == 1
    again = tiny_model(entity_vocab_size=200).eval().build_entity_index(cache_dir=tmp_path)
    assert again.build_seconds is None and again.fingerprint == first.fingerprint  # read, not built
    tiny_model(seed=1, entity_vocab_size=200).eval().build_entity_index(cache_dir=tmp_path)
    assert len(list(tmp_path.iterdir())) == 2


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models on a loaded machine: one torch thread (two threads contending for cores are far slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def trained_tiny_model(examples: int = 16, steps: int = 100):
    """A tiny EDMem trained for a few steps to answer `<E_s> name <E_e> word` about the entity in its input."""
    model, tokenizer, names, words = tiny_model_with_entities(40)
    torch.manual_seed(0)
    sources = [f"{words[100 + i]} <E_s> {names[i]} <E_e> {words[200 + i]}" for i in range(examples)]
    targets = [f"<E_s> {names[i]} <E_e> {words[300 + i]}" for i in range(examples)]
    batch = tokenizer(sources, text_target=targets, padding=True, return_tensors="pt")
    batch["labels"][batch["labels"] == tokenizer.pad_token_id] = -100
    start = model.config.entity_start_token_id
    entity_labels = torch.full_like(batch["input_ids"], -100)
    rows, cols = (batch["input_ids"] == start).nonzero(as_tuple=True)
    entity_labels[rows, cols] = rows
    decoder_entity_labels = torch.full_like(batch["labels"], -100)
    rows, cols = (batch["labels"] == start).nonzero(as_tuple=True)
    decoder_entity_labels[rows, cols] = rows
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        loss = model(**batch, entity_labels=entity_labels, decoder_entity_labels=decoder_entity_labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval(), tokenizer, sources


@needs_faiss
def test_generation_with_the_index_gives_the_exact_tokens(tmp_path):
    model, tokenizer, sources = trained_tiny_model()
    inputs = tokenizer(sources[:8], padding=True, return_tensors="pt")
    common = dict(max_new_tokens=8, tokenizer=tokenizer, entity_candidates=3)
    index = model.build_entity_index(cache_dir=tmp_path, num_lists=4, nprobe=2)
    spy = SpyIndex(index)
    for mode, beams in (("free", 1), ("static", 3), ("dynamic", 3)):
        exact = model.generate(**inputs, entity_decoding=mode, num_beams=beams, entity_index=False, **common)
        assert model.entity_index is index  # restored after the exact call
        texts = tokenizer.batch_decode(exact, skip_special_tokens=True)
        assert all(text.strip() for text in texts) and len(set(texts)) > 1, texts
        for module in model._index_users():
            module.entity_index = spy
        before = spy.searches
        indexed = model.generate(**inputs, entity_decoding=mode, num_beams=beams, **common)
        assert spy.searches > before
        model.set_entity_index(index)
        assert torch.equal(indexed, exact), mode


@needs_faiss
def test_generate_option_builds_the_index(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    model = clustered_model()
    inputs = {"input_ids": torch.tensor([[0, ES, 10, 6, 11, 2], [0, 12, ES, 13, 14, 6]])}
    exact = model.generate(**inputs, max_new_tokens=4, output_attended_entities=True)
    searches = []
    search = EntityIndex.search
    monkeypatch.setattr(
        EntityIndex, "search", lambda self, *args: searches.append(len(args[0])) or search(self, *args)
    )
    assert model.generate(**inputs, max_new_tokens=4, output_attended_entities=True, entity_index=True).equal(exact)
    index = model.entity_index
    assert isinstance(index, EntityIndex) and searches  # built with the defaults, and searched
    assert index.num_lists == default_num_lists(2_500) == 64 and index.nprobe == DEFAULT_NPROBE < index.num_lists
    with pytest.raises(ValueError, match="entity_index must be True, False or None"):
        model.generate(**inputs, max_new_tokens=4, entity_index="yes")


def test_without_faiss_the_model_works_and_the_index_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "faiss", None)  # `import faiss` raises ImportError
    model, tokenizer, _, _ = tiny_model_with_entities(40)
    inputs = tokenizer(["a <E_s> b <E_e>"], return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=4, entity_decoding="dynamic", tokenizer=tokenizer)
    assert out.shape[1] > 1
    with pytest.raises(ImportError, match=r"pip install 'edmem-hf\[index\]'"):
        model.build_entity_index(cache_dir=tmp_path)
    with pytest.raises(ImportError, match=r"edmem-hf\[index\]"):
        model.generate(**inputs, max_new_tokens=4, entity_index=True)

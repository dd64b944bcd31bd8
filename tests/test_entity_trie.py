"""EntityTrie: structure, reachability, next-token sets, save/load, cache, sequences_for, bad input."""

import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers.dynamic_module_utils import get_imports, get_relative_imports

import edmem_hf
from edmem_hf.entity_decoding import EntityTrie, marker_token_ids
from edmem_hf.entity_vocab import EntityVocab
from tiny_models import make_word_tokenizer as make_tokenizer
from tiny_models import make_words


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="module")
def names():
    rng = random.Random(1)
    words = make_words(120, seed=2)
    out = sorted({" ".join(rng.sample(words, rng.randint(1, 3))) for _ in range(300)})
    return out + ["Baro", "Barokita", "Barokita lun"]  # names that are prefixes of others


def reference_next_tokens(sequences: list[list[int]], prefix: list[int]) -> set[int]:
    return {s[len(prefix)] for s in sequences if len(s) > len(prefix) and s[: len(prefix)] == prefix}


def test_every_name_reachable_and_next_tokens_exact(tokenizer, names):
    _, end_id = marker_token_ids(tokenizer)
    trie = EntityTrie.build(names, tokenizer, end_token_id=end_id)
    sequences = [tokenizer(" " + n, add_special_tokens=False).input_ids + [end_id] for n in names]
    assert len(trie) == len(names)
    for i, seq in enumerate(sequences):
        assert trie.sequence(i) == seq
        assert trie.lookup(seq) == i
        for d in range(len(seq)):
            assert set(trie.allowed_next_tokens(seq[:d])) == reference_next_tokens(sequences, seq[:d])
        assert trie.allowed_next_tokens(seq) == []
    assert trie.lookup(sequences[0][:-1]) == -1  # a prefix is not a name
    assert trie.allowed_next_tokens([end_id]) == []
    # Node arrays: ranges nest and the root covers everything.
    assert trie.node_lo[0] == 0 and trie.node_hi[0] == len(names)
    assert (trie.node_lo < trie.node_hi).all()
    assert trie.num_nodes == len({tuple(s[:d]) for s in sequences for d in range(len(s) + 1)})


def test_node_ranges_hold_exactly_the_names_below(tokenizer, names):
    _, end_id = marker_token_ids(tokenizer)
    trie = EntityTrie.build(names, tokenizer, end_token_id=end_id)
    sorted_seqs = [trie.sequence(int(e)) for e in trie.order]
    assert sorted_seqs == sorted(sorted_seqs)
    rng = np.random.default_rng(0)
    for node in rng.choice(trie.num_nodes, 50, replace=False):
        lo, hi, depth = trie.node_lo[node], trie.node_hi[node], trie.node_depth[node]
        prefix = sorted_seqs[lo][:depth]
        below = [i for i, s in enumerate(sorted_seqs) if s[:depth] == prefix]
        assert below == list(range(lo, hi))


def test_descend_finds_the_node_of_each_rows_prefix(tokenizer, names):
    """`TrieTensors.descend`, vectorised over rows, agrees with the one-prefix walk on prefixes in and out of the
    trie, of every length, right-aligned after other tokens, with tokens out of the vocabulary."""
    _, end_id = marker_token_ids(tokenizer)
    trie = EntityTrie.build(names, tokenizer, end_token_id=end_id)
    rng = random.Random(4)
    prefixes = []
    for i in range(200):
        sequence = trie.sequence(rng.randrange(len(names)))
        prefix = sequence[: rng.randint(0, len(sequence))]
        if i % 4 == 0 and prefix:  # off the trie
            prefix[rng.randrange(len(prefix))] = rng.choice([rng.randrange(len(tokenizer)), len(tokenizer) + 3])
        prefixes.append(prefix)
    width = max(map(len, prefixes)) + 2
    tokens = torch.tensor([[rng.randrange(len(tokenizer)) for _ in range(width - len(p))] + p for p in prefixes])
    nodes = trie.tensors().descend(tokens, torch.tensor([len(p) for p in prefixes])).tolist()
    assert nodes == [trie._node_of(p) for p in prefixes]
    assert -1 in nodes and 0 in nodes and len(set(nodes)) > 50


def test_no_prefix_space_option(tokenizer):
    trie = EntityTrie.build(["Barokita", "lun"], tokenizer, end_token_id=2, add_prefix_space=False)
    assert trie.sequence(0) == tokenizer("Barokita", add_special_tokens=False).input_ids + [2]
    with_space = EntityTrie.build(["Barokita", "lun"], tokenizer, end_token_id=2)
    assert with_space.sequence(0) == tokenizer(" Barokita", add_special_tokens=False).input_ids + [2]


def test_entity_vocab_input(tokenizer, names):
    _, end_id = marker_token_ids(tokenizer)
    vocab = EntityVocab(names)
    assert EntityTrie.build(vocab, tokenizer, end_token_id=end_id).sequence(5) == EntityTrie.build(
        names, tokenizer, end_token_id=end_id
    ).sequence(5)


def test_save_load_round_trip_and_cache(tokenizer, names, tmp_path):
    _, end_id = marker_token_ids(tokenizer)
    trie = EntityTrie.build(names, tokenizer, end_token_id=end_id)
    path = trie.save(tmp_path / "trie")
    assert path.endswith(".npz")
    loaded = EntityTrie.load(path)
    for key in EntityTrie._ARRAYS + ("rank",):
        np.testing.assert_array_equal(getattr(trie, key), getattr(loaded, key))
    assert loaded.vocab_size == trie.vocab_size and loaded.end_token_id == end_id
    with np.load(path, allow_pickle=False) as data:  # plain arrays only
        assert all(data[k].dtype != object for k in data.files)

    cache = tmp_path / "cache"
    first = EntityTrie.build(names, tokenizer, end_token_id=end_id, cache_dir=cache)
    files = os.listdir(cache)
    assert len(files) == 1 and files[0].startswith("entity_trie-")
    second = EntityTrie.build(names, tokenizer, end_token_id=end_id, cache_dir=cache)
    assert second.metadata["cache_path"] == os.path.join(cache, files[0])
    np.testing.assert_array_equal(first.edge_key, second.edge_key)
    # Another name list or another option is another cache entry.
    EntityTrie.build(names[:-1], tokenizer, end_token_id=end_id, cache_dir=cache)
    EntityTrie.build(names, tokenizer, end_token_id=end_id, add_prefix_space=False, cache_dir=cache)
    assert len(os.listdir(cache)) == 3


def test_sequences_for(tokenizer, names):
    _, end_id = marker_token_ids(tokenizer)
    trie = EntityTrie.build(names, tokenizer, end_token_id=end_id)
    table = trie.sequences_for(torch.tensor([3, -1, 0]))
    assert table.shape[0] == 3 and table.dtype == torch.long
    for row, entity in zip(table, [3, -1, 0]):
        expected = trie.sequence(entity) if entity >= 0 else []
        assert row[row >= 0].tolist() == expected
    assert trie.sequences_for(torch.tensor([[1, 2], [4, -1]])).shape[:2] == (2, 2)
    with pytest.raises(ValueError, match="unknown entity id"):
        trie.sequences_for([len(names)])


def test_bad_input(tokenizer):
    with pytest.raises(ValueError, match="empty"):
        EntityTrie.build([], tokenizer, end_token_id=2)
    with pytest.raises(ValueError, match="empty or not a string"):
        EntityTrie.build(["a", ""], tokenizer, end_token_id=2)
    with pytest.raises(ValueError, match="prefix"):
        EntityTrie.build(["Baro", "Barokita"], tokenizer, end_token_id=None)  # no end token: a prefix
    with pytest.raises(ValueError, match="no <E_s> token"):
        marker_token_ids(make_tokenizer(markers=False))


def test_from_sequences_matches_reference_on_random_data():
    rng = np.random.default_rng(0)
    seqs = {tuple(rng.integers(0, 7, rng.integers(1, 6)).tolist()) + (99,) for _ in range(400)}
    seqs = [list(s) for s in seqs]
    trie = EntityTrie.from_sequences(seqs, end_token_id=99)
    for i, seq in enumerate(seqs):
        assert trie.lookup(seq) == i
        for d in range(len(seq)):
            assert set(trie.allowed_next_tokens(seq[:d])) == reference_next_tokens(seqs, seq[:d])


def test_many_names_batched_tokenisation_is_exact(tokenizer):
    """Names tokenised in one batch call equal names tokenised one by one, odd characters included."""
    rng = random.Random(3)
    words = make_words(300, seed=4) + ["O'Neil's", "AT&T", "3.14", "Zürich", "C++", "don't"]
    names = sorted({" ".join(rng.sample(words, rng.randint(1, 4))) for _ in range(3000)})
    assert len(names) > 1024
    trie = EntityTrie.build(names, tokenizer, end_token_id=2)
    for i in range(0, len(names), 7):
        assert trie.sequence(i) == tokenizer(" " + names[i], add_special_tokens=False).input_ids + [2]
    odd = names[:1500] + ["trailing space ", "two\nlines"]
    trie = EntityTrie.build(odd, tokenizer, end_token_id=2)
    assert trie.sequence(len(odd) - 1) == tokenizer(" two\nlines", add_special_tokens=False).input_ids + [2]
    assert trie.sequence(len(odd) - 2) == tokenizer(" trailing space ", add_special_tokens=False).input_ids + [2]


def test_cache_key_ignores_the_tokenizers_padding_state(names, tmp_path):
    tokenizer = make_tokenizer()
    EntityTrie.build(names, tokenizer, end_token_id=2, cache_dir=tmp_path)
    tokenizer.backend_tokenizer.enable_padding(pad_id=1, pad_token="<pad>", length=40)  # left by an earlier call
    trie = EntityTrie.build(names, tokenizer, end_token_id=2, cache_dir=tmp_path)
    assert os.listdir(tmp_path) == [os.path.basename(trie.metadata["cache_path"])]


def test_hub_code_needs_neither_datasets_nor_other_modules_of_ours():
    """Transformers' check_imports skips imports in try/except: users of the Hub copy may lack `datasets`."""
    shipped = {"configuration_edmem", "entity_vocab", "entity_trie", "entity_decoding"}
    for module in ("entity_trie", "entity_decoding"):
        path = os.path.join(os.path.dirname(edmem_hf.__file__), f"{module}.py")
        third_party = set(get_imports(path)) - sys.stdlib_module_names
        assert third_party == ({"torch", "transformers"} if module == "entity_decoding" else {"numpy", "torch"})
        assert set(get_relative_imports(path)) <= shipped


def test_cache_without_datasets(names, tmp_path):
    """Without `datasets` the cache key is a hash of the pickled tokenizer: the second build loads the file."""
    script = f"""
import os, sys
sys.modules["datasets"] = None  # import datasets -> ImportError
sys.path.insert(0, {os.path.dirname(__file__)!r})
from edmem_hf.entity_trie import EntityTrie
from tiny_models import make_word_tokenizer
names = {names[:50]!r}
first = EntityTrie.build(names, make_word_tokenizer(), end_token_id=2, cache_dir={str(tmp_path)!r})
second = EntityTrie.build(names, make_word_tokenizer(), end_token_id=2, cache_dir={str(tmp_path)!r})
assert len(os.listdir({str(tmp_path)!r})) == 1 and second.metadata["cache_path"] is not None
assert (first.edge_key == second.edge_key).all()
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_unnamed_rows_keep_their_ids_and_are_never_spelled(tokenizer, names, tmp_path):
    """An `EntityVocab` with unnamed rows (a converted table): named entities keep their row ids in the trie, the
    unnamed ones have no sequence, are padding among candidates and never a next token."""
    _, end_id = marker_token_ids(tokenizer)
    rows = [None] * 10 + names[:20] + [None, None]  # rows 0-9 reserved, two unnamed rows at the end
    trie = EntityTrie.build(EntityVocab(rows), tokenizer, end_token_id=end_id, cache_dir=tmp_path)
    assert len(trie) == 32 and trie.num_sequences == 20
    for entity_id in (10, 17, 29):
        sequence = tokenizer(" " + rows[entity_id], add_special_tokens=False).input_ids + [end_id]
        assert trie.sequence(entity_id) == sequence and trie.lookup(sequence) == entity_id
    with pytest.raises(ValueError, match="entity 3 has no sequence"):
        trie.sequence(3)
    padded = trie.sequences_for([12, 3, 31, -1])
    assert (padded[1:] == -1).all() and padded[0, : len(trie.sequence(12))].tolist() == trie.sequence(12)
    candidates = torch.tensor([[3, 12, 31]])
    first = trie.tensors().next_tokens(torch.tensor([0]), candidates)
    assert first.tolist() == [[-1, trie.sequence(12)[0], -1]]
    reloaded = EntityTrie.load(trie.save(tmp_path / "saved"))
    assert len(reloaded) == 32 and reloaded.lookup(trie.sequence(29)) == 29
    # the cache tells the layouts apart: the same names at other rows are another trie
    shifted = EntityTrie.build(EntityVocab([None] * 11 + names[:20] + [None]), tokenizer, end_id, cache_dir=tmp_path)
    assert shifted.lookup(trie.sequence(10)) == 11

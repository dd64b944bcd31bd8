"""The name-guided read (`EDMemConfig.name_guided_read`, issue 64): a marked mention whose tokens spell an entity's
name or alias reads among those entities alone; a mention whose name the vocabulary lacks, or a masked one, reads
as the paper's; the option off is the paper's model; the lookup is built once with the tokenizer and follows the
vocabulary as entities are added."""

from __future__ import annotations

import pytest
import torch

from edmem_hf import EntityVocab
from edmem_hf.entity_attention import WrittenRows
from edmem_hf.name_candidates import NameCandidates, candidate_read
from edmem_hf.research.entity_growth import add_entities
from tiny_models import make_word_tokenizer, make_words, tiny_model


@pytest.fixture(scope="module")
def tokenizer():
    return make_word_tokenizer(bart_template=True)


@pytest.fixture(scope="module")
def words():
    return make_words(300)


def _vocab(words) -> EntityVocab:
    """Eight people, two sharing a first name and one with an alias."""
    names = [f"{words[i]} {words[20 + i]}" for i in range(8)]
    names[1] = f"{words[0]} {words[40]}"  # shares the first word of entity 0's name
    aliases = [[] for _ in names]
    aliases[2] = [words[41]]
    return EntityVocab(names, aliases)


def _mentions(tokenizer, texts: list[str]) -> torch.Tensor:
    return tokenizer(texts, return_tensors="pt", padding=True).input_ids


def test_a_mention_s_candidates_are_the_entities_it_spells(tokenizer, words):
    vocab = _vocab(words)
    tokenizer(["a", "a b c"], padding=True)  # leaves padding on the fast tokenizer's backend: the lookup ignores it
    lookup = NameCandidates.build(vocab, tokenizer, max_candidates=4)
    assert tokenizer.backend_tokenizer.padding is not None
    start, end = tokenizer.convert_tokens_to_ids(["<E_s>", "<E_e>"])
    ids = _mentions(tokenizer, [
        f"{words[60]} <E_s> {vocab.names[0]} <E_e> and <E_s> {vocab.names[1].upper()} <E_e>",
        f"<E_s> {words[41]} <E_e> <E_s> {words[0]} <E_e> <E_s> <mask> <mask> <E_e> <E_s> {vocab.names[3].lower()}",
    ])  # fmt: skip
    found = lookup.of_mentions(ids, start, end).tolist()
    assert found[0] == [0, -1, -1, -1]  # the full name: its entity alone, not the one sharing its first word
    assert found[1] == [-1] * 4  # upper case is not one of a name's spellings
    assert found[2] == [2, -1, -1, -1]  # an alias
    assert found[3] == [-1] * 4  # one word of two people's names: no name
    assert found[4] == [-1] * 4  # a masked name
    assert found[5] == [-1] * 4  # a mention left open

    def between_markers(name: str) -> list[int]:
        return tokenizer(f"<E_s> {name} <E_e>", add_special_tokens=False).input_ids[1:-1]

    assert lookup.of_tokens(between_markers(vocab.names[3].lower())) == [3]
    twins = EntityVocab(
        [vocab.names[0], f"{vocab.names[0]} (band)", vocab.names[0].lower() + " x"], [[], [vocab.names[0]], []]
    )
    assert NameCandidates.build(twins, tokenizer).of_tokens(
        between_markers(vocab.names[0])
    ) == [0, 1]  # fmt: skip


def test_the_candidate_read_is_the_attention_over_the_candidates_rows():
    torch.manual_seed(0)
    table, queries = torch.randn(10, 6), torch.randn(3, 6)
    candidates = torch.tensor([[2, 5, -1], [7, -1, -1], [-1, -1, -1]])
    read, scores = candidate_read(queries, table, candidates)
    for m, row in enumerate(candidates.tolist()[:2]):
        ids = [c for c in row if c >= 0]
        expected = torch.softmax(queries[m] @ table[ids].T, -1) @ table[ids]
        torch.testing.assert_close(read[m], expected)
        torch.testing.assert_close(scores[m, : len(ids)], queries[m] @ table[ids].T)
    assert torch.equal(read[2], torch.zeros(6)) and torch.isinf(scores[2]).all()
    # an entity with written rows is read through them (each on its own), a hidden one without them not at all
    written = WrittenRows(torch.tensor([5, 5]), torch.randn(2, 6))
    shown = torch.ones(10, dtype=torch.bool)
    shown[[2, 5]] = False
    read, scores = candidate_read(queries[:1], table, candidates[:1], shown, written)
    torch.testing.assert_close(read[0], torch.softmax(queries[0] @ written.rows.T, -1) @ written.rows)
    torch.testing.assert_close(scores[0, 1], torch.logsumexp(queries[0] @ written.rows.T, -1))
    assert scores[0, 0] == float("-inf")


def test_a_name_guided_read_finds_an_added_entity_the_plain_read_misses(tokenizer, words):
    """An entity added with a row unlike any query (its table row far from what the query asks) is never the
    plain read's top entity at its mention; the name-guided read reads it, and reports it first."""
    vocab = _vocab(words)
    start, end = tokenizer.convert_tokens_to_ids(["<E_s>", "<E_e>"])
    shape = dict(vocab_size=len(tokenizer), entity_vocab_size=len(vocab), entity_start_token_id=start,
                 entity_end_token_id=end)  # fmt: skip
    plain = tiny_model(seed=5, **shape).eval()
    plain.entity_vocab = vocab
    guided = tiny_model(seed=5, **shape, name_guided_read=True).eval()
    guided.entity_vocab = vocab
    new_name = f"{words[100]} {words[101]}"
    row = -10 * plain.model.entity_embeddings.weight.mean(0, keepdim=True)  # opposite the rows the queries find
    for model in (plain, guided):
        add_entities(model, [new_name], rows=row.clone())
    question = tokenizer([f"{words[70]} <E_s> {new_name} <E_e> {words[71]}"], return_tensors="pt")
    with torch.no_grad():
        seen = plain(**question, decoder_input_ids=question.input_ids[:, :2], output_attended_entities=True)
        with pytest.raises(ValueError, match="build them .* model.name_candidates\\(tokenizer\\)"):
            guided(**question, decoder_input_ids=question.input_ids[:, :2])
        assert guided.name_candidates(tokenizer) is not None
        found = guided(**question, decoder_input_ids=question.input_ids[:, :2], output_attended_entities=True)
    added = len(vocab)
    assert seen.encoder_attended_entities.top_entity_ids[0, 0] != added
    assert found.encoder_attended_entities.top_entity_ids[0].tolist()[:2] == [added, -1]
    assert not torch.allclose(found.logits, seen.logits)
    # a name the vocabulary lacks reads as the paper's; so does every decoder access
    other = tokenizer([f"{words[70]} <E_s> {words[150]} {words[151]} <E_e> {words[71]}"], return_tensors="pt")
    with torch.no_grad():
        a = plain(**other, decoder_input_ids=other.input_ids[:, :4], output_attended_entities=True)
        b = guided(**other, decoder_input_ids=other.input_ids[:, :4], output_attended_entities=True)
    torch.testing.assert_close(a.logits, b.logits)
    # generate(tokenizer=...) builds the lookup of a loaded model; added entities follow it
    guided.set_name_candidates(None)
    out = guided.generate(**question, tokenizer=tokenizer, max_new_tokens=3, entity_decoding="dynamic")
    assert out.shape[0] == 1 and guided.name_candidates() is not None
    add_entities(guided, [f"{words[102]} {words[103]}"], [[f"<E_s> {words[102]} {words[103]} <E_e> {words[104]}"]],
                 tokenizer, estimator="mean_query")  # fmt: skip
    assert guided.name_candidates().num_entities == len(vocab) + 2


def test_the_option_is_saved_and_off_is_the_paper_s_model(tmp_path, tokenizer, words):
    from edmem_hf import EDMemForConditionalGeneration

    vocab = _vocab(words)
    start, end = tokenizer.convert_tokens_to_ids(["<E_s>", "<E_e>"])
    shape = dict(vocab_size=len(tokenizer), entity_vocab_size=len(vocab), entity_start_token_id=start,
                 entity_end_token_id=end)  # fmt: skip
    model = tiny_model(seed=2, **shape, name_guided_read=True).eval()
    model.entity_vocab = vocab
    model.save_pretrained(tmp_path / "m")
    loaded = EDMemForConditionalGeneration.from_pretrained(tmp_path / "m").eval()
    assert loaded.config.name_guided_read and loaded.name_candidates() is None
    assert loaded.name_candidates(tokenizer) is not None
    off = tiny_model(seed=2, **shape).eval()
    batch = tokenizer([f"<E_s> {vocab.names[3]} <E_e> {words[80]}"], return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(off(**batch, decoder_input_ids=batch.input_ids).logits,
                           tiny_model(seed=2, **shape, name_guided_read=False).eval()(
                               **batch, decoder_input_ids=batch.input_ids).logits)  # fmt: skip

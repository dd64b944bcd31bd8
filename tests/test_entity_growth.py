"""`entity_growth.add_entities`: new rows of the entity memory from text, without training (issue 18)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM

from edmem_hf import EDMemEncDecForConditionalGeneration
from edmem_hf.research.entity_growth import add_entities, memory_queries
from tiny_models import saved_model_and_unknown_people, tiny_model, tiny_model_with_entities


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one intra-op thread is much faster on a shared 2-core machine
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def setup():
    torch.manual_seed(0)
    model, tokenizer, _, words = tiny_model_with_entities(20)
    new = [f"{words[100]} {words[101]}", words[102]]
    passages = [
        [f"{words[60]} <E_s> {new[0]} <E_e> {words[61]}", f"<E_s> {new[0]} <E_e> {words[62]} {words[63]}"],
        [f"{words[64]} {words[65]} <E_s> {new[1]} <E_e>"],
    ]
    return model, tokenizer, new, passages


def _lower_layer_queries(model, tokenizer, text):
    """The memory's queries at each `<E_s>` of `text`, from the hidden states the encoder reports."""
    batch = tokenizer([text], return_tensors="pt")
    encoder = model.get_encoder()
    hidden = encoder(**batch, output_hidden_states=True).hidden_states[model.config.encoder_lower_layers]
    return encoder.memory.query_proj(hidden[batch.input_ids == model.config.entity_start_token_id])


def test_new_rows_are_the_mean_query_at_the_mentions(setup):
    model, tokenizer, new, passages = setup
    table = model.model.entity_embeddings.weight.detach().clone()
    ids = add_entities(model, new, passages, tokenizer)
    assert ids == [20, 21] and model.config.entity_vocab_size == 22
    assert [model.entity_vocab.name_of(i) for i in ids] == new
    grown = model.model.entity_embeddings.weight
    assert torch.equal(grown[:20], table)  # the trained rows are untouched
    for stack in (model.model.encoder, model.model.decoder):
        assert stack.entity_embeddings.weight is grown  # every tied copy
    with torch.no_grad():
        expected = torch.cat([_lower_layer_queries(model, tokenizer, text) for text in passages[0]]).mean(0)
    assert torch.nn.functional.cosine_similarity(grown[20], expected, dim=0) > 0.9999
    assert grown[20].norm().item() == pytest.approx(table.norm(dim=-1).mean().item(), rel=1e-4)


def test_a_grown_model_saves_loads_and_decodes_the_new_names(setup, tmp_path):
    model, tokenizer, new, passages = setup
    ids = add_entities(model, new, passages, tokenizer)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert loaded.config.entity_vocab_size == 22 and loaded.entity_vocab == model.entity_vocab
    batch = tokenizer([passages[1][0]], return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(
            model(**batch, labels=batch.input_ids).logits, loaded(**batch, labels=batch.input_ids).logits
        )
    # the prefix tree spells the new names
    trie = loaded.entity_trie(tokenizer)
    for entity_id, name in zip(ids, new):
        assert tokenizer.decode(trie.sequence(entity_id)).replace("<E_e>", "").split() == name.split()
    # the loaded model links as the grown one did, over all 22 entities
    texts = [passages[0][0], passages[0][1], passages[1][0]]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    linked, scores = loaded.link_entities(batch.input_ids, batch.attention_mask, top_k=5)
    expected, expected_scores = model.link_entities(batch.input_ids, batch.attention_mask, top_k=5)
    assert torch.equal(linked, expected) and torch.allclose(scores, expected_scores)
    # Decoding spells new names. Both new entities and two old ones are visible: the linker has a choice, and a
    # bias that opens mentions (as the decoding tests use) makes the random model generate some.
    visible = torch.zeros(22, dtype=torch.bool)
    visible[[3, 7, *ids]] = True
    loaded.set_entity_mask(visible)
    with torch.no_grad():
        loaded.final_logits_bias[0, loaded.config.entity_start_token_id] = 12.0
        loaded.final_logits_bias[0, loaded.config.eos_token_id] = -12.0
    names = loaded.entity_vocab.names
    linked, _ = loaded.link_entities(batch.input_ids, batch.attention_mask, top_k=1)
    assert set(linked[:, 0].tolist()) <= {3, 7, *ids}
    for mode, candidates in (("static", 1), ("dynamic", 4)):
        out = loaded.generate(**batch, entity_decoding=mode, entity_candidates=candidates, tokenizer=tokenizer,
                              max_new_tokens=12)  # fmt: skip
        spans = [[span.split("<E_e>")[0].strip() for span in text.split("<E_s>")[1:] if "<E_e>" in span]
                 for text in tokenizer.batch_decode(out, skip_special_tokens=False)]  # fmt: skip
        assert all(row for row in spans), spans  # every row opened and closed a mention
        closed = [span for row in spans for span in row]
        assert closed and all(span in {names[3], names[7], *new} for span in closed), spans
        if mode == "static":  # the linker's top-1 of each example: here a new entity
            assert all(span == names[int(linked[row, 0])] for row in range(3) for span in spans[row])
            assert set(closed) <= set(new), spans


def test_a_mask_grows_with_the_table(setup):
    model, tokenizer, new, passages = setup
    model.set_entity_mask(torch.arange(20) < 10)
    add_entities(model, new, passages, tokenizer)
    assert model._get_entity_mask("cpu").tolist() == [True] * 10 + [False] * 10 + [True, True]


@pytest.mark.parametrize(
    "names,passages,message",
    [
        (["A0 A1"], [["<E_s> A0 A1 <E_e>"]], "already in the vocabulary"),
        (["  "], [["<E_s> x <E_e>"]], "empty"),
        (["new one", "new one"], [["<E_s> new one <E_e>"], ["<E_s> new one <E_e>"]], "named twice"),
        (["new one"], [["new one, but not marked"]], "no marked mention of 'new one'"),
        (["new one"], [], "1 names but 0 passage lists"),
    ],
)
def test_bad_input_names_the_entity(setup, names, passages, message):
    model, tokenizer, _, _ = setup
    if names == ["A0 A1"]:
        names = [model.entity_vocab.name_of(0)]
        passages = [[f"<E_s> {names[0]} <E_e>"]]
    with pytest.raises(ValueError, match=message):
        add_entities(model, names, passages, tokenizer)
    assert model.config.entity_vocab_size == 20  # nothing half done


def test_rows_of_another_estimator_go_in_as_given(setup):
    model, tokenizer, new, passages = setup
    rows = torch.randn(2, model.config.entity_embed_dim)
    ids = add_entities(model, new, rows=rows)
    assert torch.equal(model.model.entity_embeddings.weight[ids], rows)
    with pytest.raises(ValueError, match="shape"):
        add_entities(model, ["another"], rows=rows)
    with pytest.raises(ValueError, match="either passages with their tokenizer, or rows"):
        add_entities(model, ["another"], [["<E_s> another <E_e>"]], tokenizer, rows=rows[:1])
    with pytest.raises(ValueError, match="either passages with their tokenizer, or rows"):
        add_entities(model, ["another"], [["<E_s> another <E_e>"]])
    assert model.config.entity_vocab_size == 22


def test_memory_queries_are_unscaled_means(setup):
    model, tokenizer, _, passages = setup
    queries = memory_queries(model, passages, tokenizer)
    with torch.no_grad():
        expected = torch.cat([_lower_layer_queries(model, tokenizer, text) for text in passages[0]]).mean(0)
    torch.testing.assert_close(queries[0], expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match=r"no marked mention in passages\[1\]"):
        memory_queries(model, [passages[0], ["nothing marked"]], tokenizer)


def test_mean_query_rows_of_a_model_with_keys_fill_the_key(setup):
    """With `entity_key_dim`, a query is a key: the mean-query row is the mean query in the key's columns and zero in
    the value's, which no query scores and only reads fill."""
    model, tokenizer, new, passages = setup
    keyed, _, _, _ = tiny_model_with_entities(20)
    keyed = type(keyed)(type(keyed.config)(**{**keyed.config.to_dict(), "entity_key_dim": 6})).eval()
    keyed.entity_vocab = model.entity_vocab
    queries = memory_queries(keyed, passages, tokenizer)
    assert queries.shape == (2, keyed.config.entity_embed_dim)
    assert queries[:, 6:].abs().sum() == 0 and queries[:, :6].abs().sum() > 0
    with torch.no_grad():
        expected = torch.cat([_lower_layer_queries(keyed, tokenizer, text) for text in passages[0]]).mean(0)
    torch.testing.assert_close(queries[0, :6], expected, rtol=1e-4, atol=1e-5)


def test_encdec_has_no_memory_to_grow(setup):
    _, tokenizer, new, passages = setup
    config = tiny_model(vocab_size=len(tokenizer), entity_vocab_size=20).config
    config.variant = "encdec"
    model = EDMemEncDecForConditionalGeneration(config)
    with pytest.raises(ValueError, match="EDMemEncDecForConditionalGeneration has no entity memory"):
        add_entities(model, new, passages, tokenizer)


def test_edmem_add_entities_from_a_dump(setup, tmp_path, capsys):
    """The new pages' entities go in with passages from their links and their own page; a model folder comes out."""
    from edmem_hf.cli import main
    from edmem_hf.dump import iter_parsed_pages
    from edmem_hf.research.new_entity_text import new_entity_passages

    _, tokenizer, _, _ = setup
    model, people, known, dump = saved_model_and_unknown_people(tokenizer, tmp_path)

    passages, without = new_entity_passages(iter_parsed_pages(dump), known)
    assert sorted(passages) == sorted(people) and without == []
    for name in people:  # the links to it (their anchors marked) and its own page, one marked mention a passage
        assert all(text.count("<E_s>") == text.count("<E_e>") == 1 for text in passages[name])
        assert f"<E_s> {name} <E_e>  (born" in passages[name][-1] and len(passages[name]) >= 2

    grow = ["add-entities", "--model", str(tmp_path / "model"), "--dump", dump, "--out", str(tmp_path / "grown")]
    assert main(grow) == 0
    assert f"added 3 entities (ids {len(known)}..{len(known) + 2})" in capsys.readouterr().out
    grown = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "grown")
    assert grown.entity_vocab.names == known + sorted(people)
    assert grown.config.entity_vocab_size == len(known) + 3
    # the rows: each new person's, from that person's passages, as add_entities makes them; the trained rows kept
    table = grown.model.entity_embeddings.weight.detach()
    assert torch.equal(table[: len(known)], model.model.entity_embeddings.weight.detach())
    rows = table[len(known) :]
    assert all(not torch.allclose(rows[i], rows[j]) for i in range(3) for j in range(i))  # three distinct rows
    add_entities(model, sorted(people), [passages[name] for name in sorted(people)], tokenizer)
    torch.testing.assert_close(rows, model.model.entity_embeddings.weight.detach()[len(known) :])


def test_a_model_loaded_as_hub_code_grows_too(setup, tmp_path):
    """Growth is this package's code, not the model's: a model loaded with `trust_remote_code=True` (the classes of
    its folder's copy of the Hub files) grows the same rows."""
    model, tokenizer, new, passages = setup
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    model.save_pretrained(tmp_path / "model")
    # the folder's copy of the class, as `trust_remote_code=True` loads it where this package is not imported (here
    # it is, and Transformers prefers the registered class)
    remote_class = get_class_from_dynamic_module("modeling_edmem.EDMemForConditionalGeneration", tmp_path / "model")
    remote = remote_class.from_pretrained(tmp_path / "model").eval()
    assert type(remote).__module__ != type(model).__module__  # the folder's copy, not edmem_hf.modeling_edmem
    ids = add_entities(remote, new, passages, tokenizer)
    assert ids == add_entities(model, new, passages, tokenizer) == [20, 21]
    torch.testing.assert_close(remote.model.entity_embeddings.weight, model.model.entity_embeddings.weight)
    assert remote.entity_vocab.names == model.entity_vocab.names


def test_edmem_add_entities_from_a_file_of_names_and_texts(setup, tmp_path, capsys):
    """`--entities FILE.jsonl` (no dump): each record's texts write its rows, its aliases join the vocabulary, the
    mean query reads the texts' first mention of the name (marked where the text does not mark it, or put in front);
    the command says its estimator, the texts an entity, and for a model without a writer the measured caution;
    a malformed record is one line naming it."""
    import json

    from edmem_hf.cli import main
    from edmem_hf.research.add_entities_command import read_entities_file

    _, tokenizer, _, _ = setup
    model, people, known, _ = saved_model_and_unknown_people(tokenizer, tmp_path)
    first, second = sorted(people)[:2]
    entities = tmp_path / "new.jsonl"
    entities.write_text(
        json.dumps({"name": first, "texts": [f"{first} was born here.", "A text that names no one."],
                    "aliases": ["the first"]}) + "\n\n" + json.dumps({"name": second, "text": f"And {second}."}) + "\n"
    )  # fmt: skip
    names, texts, aliases = read_entities_file(str(entities), model.entity_vocab, mark=True)
    assert names == [first, second] and aliases == [["the first"], []]
    assert texts == [[f"<E_s> {first} <E_e> was born here.", f"<E_s> {first} <E_e> A text that names no one."],
                     [f"And <E_s> {second} <E_e>."]]  # fmt: skip
    grow = [
        "add-entities",
        "--model",
        str(tmp_path / "model"),
        "--entities",
        str(entities),
        "--out",
        str(tmp_path / "g"),
    ]
    assert main(grow) == 0
    out = capsys.readouterr().out
    assert f"added 2 entities (ids {len(known)}..{len(known) + 1})" in out
    assert "rows written by mean_query, from 1 to 2 texts an entity (1.5 on average)" in out
    assert "caution: this model has no writer of entity rows" in out and "7.5 %" in out
    grown = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "g")
    assert grown.entity_vocab.names == known + [first, second]
    assert grown.entity_vocab.aliases[len(known)] == ["the first"]
    add_entities(model, [first, second], texts, tokenizer)
    torch.testing.assert_close(grown.model.entity_embeddings.weight, model.model.entity_embeddings.weight)
    entities.write_text('{"name": "x"}\n')
    assert main(grow) == 1
    assert "new.jsonl, line 1: a record needs" in capsys.readouterr().err

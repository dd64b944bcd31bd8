"""`marked_batch`: marked text (and targets, and each mention's entity) into the batch the model trains on, as the
README's "Use it" snippet builds it (tests/test_docs.py runs the snippet itself)."""

from __future__ import annotations

import pytest
import torch

from edmem_hf.tasks import IGNORE_INDEX, EDMemSeq2SeqCollator, encode_qa_record, marked_batch
from tiny_models import tiny_model_with_entities


@pytest.fixture(scope="module")
def tiny():
    return tiny_model_with_entities(20)


def _at_starts(batch, field: str, ids_field: str, start: int) -> list[list[int]]:
    """The labels at each `<E_s>` of each row, and a check that every other position is -100."""
    labels, ids = batch[field], batch[ids_field]
    assert (labels[ids != start] == IGNORE_INDEX).all()
    return [row[row_ids == start].tolist() for row, row_ids in zip(labels, ids)]


def test_mentions_get_their_entities_at_their_markers(tiny):
    model, tokenizer, names, words = tiny
    start = tokenizer.convert_tokens_to_ids("<E_s>")
    texts = [f"{words[50]} <E_s> {names[3]} <E_e> {words[51]}", f"<E_s> {names[7]} <E_e> and <E_s> {names[0]} <E_e>"]
    targets = [f"<E_s> {names[5]} <E_e>", words[54]]
    batch = marked_batch(texts, tokenizer, targets=targets, entity_vocab=model.entity_vocab)
    assert set(batch) == {"input_ids", "attention_mask", "entity_labels", "labels", "decoder_entity_labels"}
    assert _at_starts(batch, "entity_labels", "input_ids", start) == [[3], [7, 0]]  # by name; row 0 is an entity
    assert _at_starts(batch, "decoder_entity_labels", "labels", start) == [[5], []]
    padding = batch["input_ids"] == tokenizer.pad_token_id  # padded as the collator pads
    assert padding.any() and torch.equal(batch["attention_mask"], (~padding).long())
    # given instead: ids, names, None for no label
    given = marked_batch(texts, tokenizer, entities=[[4], [names[2], None]], entity_vocab=model.entity_vocab)
    assert _at_starts(given, "entity_labels", "input_ids", start) == [[4], [2, IGNORE_INDEX]]
    assert "labels" not in given
    # the batch trains the memory: an entity loss on the labelled mentions
    out = model(**batch)
    assert torch.isfinite(out.loss) and out.entity_loss > 0


def test_the_same_features_as_fine_tuning(tiny):
    model, tokenizer, names, words = tiny
    row = {"id": "1", "question": f"{words[60]} <E_s> {names[2]} <E_e> {words[61]}?", "mention_entities": [2]}
    row |= {"targets": [names[9]], "target_mentions": [[[0, len(names[9]), 9]]]}
    expected = EDMemSeq2SeqCollator(tokenizer.pad_token_id)([encode_qa_record(row, tokenizer)])
    batch = marked_batch(
        [row["question"]], tokenizer, targets=[f"<E_s> {names[9]} <E_e>"], entity_vocab=model.entity_vocab
    )
    assert batch.keys() == expected.keys()
    assert all(torch.equal(batch[key], expected[key]) for key in batch)


def test_bad_input_is_named(tiny):
    model, tokenizer, names, words = tiny
    vocab = model.entity_vocab
    with pytest.raises(ValueError, match="text 0: the mention 'nobody here' is not a name of the entity vocabulary"):
        marked_batch(["<E_s> nobody here <E_e>"], tokenizer, entity_vocab=vocab)
    with pytest.raises(ValueError, match="text 0: its <E_s> and <E_e> markers do not pair up"):
        marked_batch([f"<E_s> {names[1]}"], tokenizer, entity_vocab=vocab)
    with pytest.raises(ValueError, match="text 0: 1 marked mentions but 2 entities given"):
        marked_batch([f"<E_s> {names[1]} <E_e>"], tokenizer, entities=[[1, 2]], entity_vocab=vocab)
    with pytest.raises(ValueError, match="text 0: 20 is not an entity id of the vocabulary"):
        marked_batch([f"<E_s> {names[1]} <E_e>"], tokenizer, entities=[[20]], entity_vocab=vocab)
    with pytest.raises(ValueError, match="target 0: the entity 'x y' is not a name"):
        marked_batch(["a"], tokenizer, targets=["<E_s> b <E_e>"], target_entities=[["x y"]], entity_vocab=vocab)
    with pytest.raises(TypeError, match="a list of texts"):
        marked_batch(f"<E_s> {names[1]} <E_e>", tokenizer)
    unlabelled = marked_batch([f"<E_s> {names[1]} <E_e>"], tokenizer)  # no vocabulary, no entities: no labels
    assert (unlabelled["entity_labels"] == IGNORE_INDEX).all()


def test_a_batch_is_the_features_built_by_hand(tiny):
    """`marked_batch` against features written out token by token, not through the code fine-tuning shares with it
    (issue 66): `<s>`, each word's token, the markers where the text has them, `</s>`; the entity at `<E_s>`; the
    target the same way; padding to the longest row."""
    model, tokenizer, names, words = tiny
    start, end = tokenizer.convert_tokens_to_ids(["<E_s>", "<E_e>"])
    bos, eos, pad = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id

    def running(text: str) -> list[int]:  # each word's tokens as it appears after a space in running text
        return tokenizer(f"{words[0]} {text}", add_special_tokens=False).input_ids[
            len(tokenizer(words[0], add_special_tokens=False).input_ids) :
        ]

    name = names[3]
    batch = marked_batch([f"{words[50]} <E_s> {name} <E_e>", words[51]], tokenizer, targets=[words[52], words[53]],
                         entity_vocab=model.entity_vocab)  # fmt: skip
    first = [bos, *running(words[50]), *running("<E_s>"), *running(name), *running("<E_e>"), eos]
    second = [bos, *running(words[51]), eos]
    assert start in first and end in first
    assert batch["input_ids"].tolist() == [first, second + [pad] * (len(first) - len(second))]
    assert batch["attention_mask"].tolist() == [[1] * len(first), [1] * len(second) + [0] * (len(first) - len(second))]
    labels = [IGNORE_INDEX] * len(first)
    labels[first.index(start)] = 3
    assert batch["entity_labels"][0].tolist() == labels
    assert (batch["entity_labels"][1] == IGNORE_INDEX).all()
    target = [*running(words[52]), eos]  # the decoder starts at </s> and writes the target, without <s>
    assert batch["labels"].tolist()[0][: len(target)] == target

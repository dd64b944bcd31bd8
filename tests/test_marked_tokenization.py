"""The reference tokenisation of text with mention markers (`edmem_hf.marked_tokenization`)."""

import pytest

from edmem_hf.marked_tokenization import tokenize_with_mentions
from edmem_hf.mention_labels import Mention
from edmem_hf.tokenization import train_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    texts = ["She was born in Paris, France.", "Paris is the capital of France."] * 20
    return train_tokenizer(texts, vocab_size=300, min_frequency=1)


def test_mentions_are_marked_labelled_and_keep_the_space_before_them(tokenizer):
    text = "She was born in Paris, France."
    (marked,) = tokenize_with_mentions([(text, [Mention(16, 21, 7), Mention(23, 29, -100, True)])], tokenizer)
    start_id, end_id = tokenizer.convert_tokens_to_ids(["<E_s>", "<E_e>"])
    # the text form with markers tokenises the same (the markers absorb the space before them)
    marked_text = "She was born in <E_s> Paris<E_e>, <E_s> France<E_e>."
    assert marked.ids.tolist() == tokenizer(marked_text, add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(marked.ids[marked.spans[0, 0] + 1 : marked.spans[0, 1]].tolist()) == [
        "ĠParis"
    ]
    assert marked.ids[marked.spans[:, 0]].tolist() == [start_id, start_id]
    assert marked.ids[marked.spans[:, 1]].tolist() == [end_id, end_id]
    assert marked.spans[:, 2].tolist() == [0, 1]
    labels = {position: label for position, label in enumerate(marked.labels.tolist()) if label != -100}
    assert labels == {marked.spans[0, 0]: 7}  # an entity outside the vocabulary is marked, not labelled
    (plain,) = tokenize_with_mentions([(text, [])], tokenizer)
    assert plain.ids.tolist() == tokenizer(text, add_special_tokens=False)["input_ids"] and plain.spans.shape == (0, 3)
    assert (plain.labels == -100).all()


def test_overlapping_mentions_and_slow_tokenizers_are_clear_errors(tokenizer):
    with pytest.raises(ValueError, match="overlap"):
        tokenize_with_mentions([("abcdef", [Mention(0, 3, 1), Mention(2, 4, 1)])], tokenizer)

    class NotFast:
        pass

    with pytest.raises(ValueError, match="not a fast tokenizer"):
        tokenize_with_mentions([("abc", [])], NotFast())

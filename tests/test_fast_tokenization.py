"""The fast path of marked tokenisation (`edmem_hf.fast_tokenization`), held equal to the reference."""

import random
import re
from itertools import accumulate

import numpy as np
import pytest
import regex
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from edmem_hf.dump import iter_parsed_pages
from edmem_hf.fast_tokenization import (
    _ASCII_BYTE_LEVEL_WORDS,
    _BYTE_LEVEL_WORDS,
    ByteLevelWordEncoder,
    insert_mention_markers,
)
from edmem_hf.marked_tokenization import tokenize_with_mentions
from edmem_hf.mention_labels import Mention
from edmem_hf.tokenization import train_tokenizer
from edmem_hf.toy_world import generate_toy_world


@pytest.fixture(scope="module")
def toy_tokenizer(tmp_path_factory):
    """A byte-level BPE trained on the toy world, saved and loaded back as the build loads a given tokenizer."""
    path = tmp_path_factory.mktemp("tok")
    world = generate_toy_world(60, seed=0)
    train_tokenizer(list(world.pages.values()), vocab_size=600, min_frequency=1).save_pretrained(path)
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def _fast(encoder, tokenizer, text, mentions):
    """What the build does with the fast path: the whole text's tokens, then the markers; None where it declines."""
    words = encoder.encode_words(text)
    if words is None:
        return None
    start_id, end_id = tokenizer.convert_tokens_to_ids(["<E_s>", "<E_e>"])
    return insert_mention_markers(text, *words, mentions, start_id, end_id, encoder.piece_ids)


def _as_lists(marked):
    return marked.ids.tolist(), marked.labels.tolist(), marked.spans.tolist()


def test_whole_text_ids_match_the_backend(wikipedia_sample_small, toy_tokenizer):
    texts = [page.text for page in iter_parsed_pages(wikipedia_sample_small) if page.text]
    tokenizer = train_tokenizer(texts, vocab_size=800, min_frequency=1)
    pieces = [text[i : i + 301] for text in texts for i in range(0, len(text), 301)]
    pieces += [
        "",
        " ",
        "  ",
        "\t\t x",
        "a  \n\n b \n",
        "x  ",
        "don't 's 'S 'LL",
        "\x1c\x1d a\u2028b\u00a0c\u3000d",
        "東京 مرحبا Ελληνικά 𝔘 😀 e\u0301 ١٢٣ ²³",
        "1,000.5 -- ... !!! ??",
    ]
    for tok in (tokenizer, toy_tokenizer):
        expected = [e.ids for e in tok.backend_tokenizer.encode_batch(pieces, add_special_tokens=False)]
        encoder = ByteLevelWordEncoder.for_tokenizer(tok)
        assert encoder is not None  # the fast path is in use for byte-level BPE
        for _ in range(2):  # the second time from the word table
            assert [encoder.encode_words(piece)[0].tolist() for piece in pieces] == expected
        for piece in ("a <mask> b", "<s>x</s>", "x<E_s>y"):  # an added token's text: left to the reference
            assert encoder.encode_words(piece) is None


def test_only_byte_level_bpe_tokenizers_get_the_fast_path():
    word_level = Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    assert ByteLevelWordEncoder.for_tokenizer(PreTrainedTokenizerFast(tokenizer_object=word_level)) is None
    prefixed = train_tokenizer(["a b c"] * 5, vocab_size=300, min_frequency=1)
    prefixed.backend_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    assert ByteLevelWordEncoder.for_tokenizer(prefixed) is None


def test_markers_inserted_into_whole_text_tokens_match_the_reference(wikipedia_sample_small, toy_tokenizer):
    """The build tokenises each article whole and puts the markers in afterwards; the result must be what the
    reference gives, for any mention spans (cuts inside words, after punctuation runs such as "D.C." + ",", after
    runs of whitespace, empty mentions, unicode)."""
    rng = random.Random(0)
    alphabet = list("abXY019 .,'-()\n\t") + [
        "  ",
        "\n\n",
        " \t ",
        "'s",
        "é",
        "東京",
        "½",
        "\u00a0",
        "U.S.",
        " Paris",
        "D.C.",
    ]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 25))) for _ in range(4000)]
    # trained on these texts, so that runs of whitespace and punctuation are tokens of their own ("ĊĊ", ".,"):
    # where the pieces' words differ from the whole text's, the ids differ too
    tokenizer = train_tokenizer(texts, vocab_size=400, min_frequency=2)
    assert len(tokenizer.backend_tokenizer.encode("\n\n", add_special_tokens=False).ids) == 1
    documents = []
    for text in texts:
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, 2 * rng.randint(0, 4))))
        mentions = [
            Mention(cuts[i], cuts[i + 1], rng.choice([-100, 3]), rng.random() < 0.5)
            for i in range(0, len(cuts) - 1, 2)
        ]
        documents.append((text, mentions))
    for page in iter_parsed_pages(wikipedia_sample_small):  # real text, links as mentions
        if page.text:
            mentions = [Mention(link.start, link.end, k % 3 - 1, bool(k % 2)) for k, link in enumerate(page.links)]
            documents.append((page.text, mentions))
    text = "Born in Washington, D.C.. The U.S.' (film), a  Paris-based <mask> band; x\n Rome's 1,000 km."
    spans = [(8, 24), (29, 35), (36, 42), (50, 55), (61, 67), (76, 80), (83, 88)]  # ends inside words too
    documents.append((text, [Mention(s, e, 1) for s, e in spans]))
    documents.append((text.replace(" <mask>", ""), [Mention(s, e, 1) for s, e in spans[:4]]))
    documents.append(("no mentions here", []))
    for tok in (tokenizer, toy_tokenizer):
        encoder = ByteLevelWordEncoder.for_tokenizer(tok)
        expected = tokenize_with_mentions(documents, tok)
        for (text, mentions), reference in zip(documents, expected):
            fast = _fast(encoder, tok, text, mentions)
            if "<mask>" in text:  # an added token's text: the fast path declines, the build uses the reference
                assert fast is None
                continue
            assert _as_lists(fast) == _as_lists(reference), (text, mentions)
    overlapping = [Mention(0, 3, 1), Mention(2, 4, 1)]
    assert insert_mention_markers("abcdef", np.array([1], np.int32), np.array([0]), overlapping, 5, 6, None) is None


def test_whole_text_ids_gathered_from_the_word_table_as_it_grows_and_is_cleared(toy_tokenizer):
    """`encode_words` gathers ids from flat per-word arrays that grow as new words come (past their first
    capacities here) and are emptied when the cache bound is reached: the ids and word starts stay exact."""
    pattern = regex.compile(_BYTE_LEVEL_WORDS)
    rng = random.Random(1)
    letters = "abcdefghijklmnopqrstuvwxyzé東"
    for bound in (100_000, 3_000):
        encoder = ByteLevelWordEncoder(toy_tokenizer, max_cache_words=bound)
        for _ in range(12):
            words = ["".join(rng.choice(letters) for _ in range(rng.randint(1, 12))) for _ in range(2_500)]
            text = " ".join(words) + rng.choice(["", " ", ".\n", "  "])
            ids, starts = encoder.encode_words(text)
            encoding = toy_tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
            assert ids.tolist() == encoding.ids
            text_words = pattern.findall(text)
            word_starts = list(accumulate(map(len, text_words), initial=0))
            assert starts.tolist() == [word_starts[w] for w in encoding.word_ids]
        assert len(encoder.table) <= bound + 2_600
        if bound == 100_000:  # no clearing: the arrays grew past their first capacities
            assert len(encoder.table.flat) > 1 << 16 and len(encoder.table.rows) > 1 << 14
    empty_ids, empty_starts = encoder.encode_words("")
    assert len(empty_ids) == 0 and len(empty_starts) == 0


def test_ascii_word_pattern_matches_the_byte_level_pattern():
    unicode_words, ascii_words = regex.compile(_BYTE_LEVEL_WORDS), re.compile(_ASCII_BYTE_LEVEL_WORDS)
    rng = random.Random(0)
    alphabet = [chr(i) for i in range(128)] + ["'s", "'ll", "  ", "\n\n", " \t "]
    for _ in range(20_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        assert ascii_words.findall(text) == unicode_words.findall(text), repr(text)


def test_word_split_by_lines_matches_the_byte_level_pattern(toy_tokenizer):
    encoder = ByteLevelWordEncoder(toy_tokenizer)
    words = regex.compile(_BYTE_LEVEL_WORDS)
    rng = random.Random(1)
    alphabet = [
        "\n",
        "\n",
        " ",
        "a",
        "Z",
        "1",
        ".",
        "'s",
        "é",
        "東",
        "½",
        "\u00a0",
        "\u2028",
        "\x1c",
        "\x85",
        "\t",
        "😀",
    ]
    for _ in range(20_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14)))
        assert encoder._split_words(text) == words.findall(text), repr(text)

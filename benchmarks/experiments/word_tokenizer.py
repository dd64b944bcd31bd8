"""Made-up words and a tiny tokenizer over them: names and sentences whose every word is a few tokens of a
vocabulary trained locally in a second, for worlds small enough to train on a CPU (`tiny_written_world.py`) and for
the tests' tiny models (`tests/tiny_models.py`)."""

from __future__ import annotations

import random

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

SYLLABLES = ["ba", "ro", "ki", "ta", "lun", "mer", "vo", "sen", "dra", "pol", "is", "an", "gor", "eth", "ul", "zin"]


def make_words(n: int, seed: int = 0) -> list[str]:
    """`n` distinct made-up words, some capitalised, deterministic in `seed`."""
    rng = random.Random(seed)
    out: set[str] = set()
    while len(out) < n:
        word = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3)))
        out.add(word.capitalize() if rng.random() < 0.5 else word)
    return sorted(out)


def make_word_tokenizer(
    vocab_size: int = 600, markers: bool = True, bart_template: bool = False
) -> PreTrainedTokenizerFast:
    """A tiny byte-level BPE over `make_words(400)` with BART's specials (and `<E_s>`/`<E_e>`), trained locally;
    with `bart_template`, encoding adds `<s> ... </s>` as BART's tokenizer does."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"] + (["<E_s>", "<E_e>"] if markers else [])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    words = make_words(400)
    tok.train_from_iterator([" ".join(words[i : i + 8]) for i in range(0, len(words), 8)], trainer)
    if bart_template:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
        additional_special_tokens=["<E_s>", "<E_e>"] if markers else [],
    )

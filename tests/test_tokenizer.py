import pytest
from transformers import AutoTokenizer

from edmem_hf.tokenization import SPECIAL_TOKENS, cli_main, extend_tokenizer, train_tokenizer

TEXTS = ["Alice was born in Paris. She moved to Berlin and then back to Paris."] * 20


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXTS, vocab_size=400, min_frequency=1)


def test_special_token_ids(tokenizer):
    assert tokenizer.convert_ids_to_tokens(list(range(7))) == SPECIAL_TOKENS
    assert (tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (
        0,
        1,
        2,
        3,
    )
    assert tokenizer.mask_token == "<mask>"


def test_markers_and_leading_space(tokenizer):
    tokens = tokenizer.convert_ids_to_tokens(tokenizer("born in <E_s> Paris <E_e>. Then")["input_ids"])
    assert tokens[0] == "<s>" and tokens[-1] == "</s>"
    i = tokens.index("<E_s>")
    # the space before the marker is absorbed, the entity keeps its running-text leading space
    assert tokens[i - 1] == "Ġin" and tokens[i + 1] == "ĠParis" and tokens[i + 2] == "<E_e>" and tokens[i + 3] == "."
    assert (
        tokenizer(" Paris", add_special_tokens=False)["input_ids"]
        != tokenizer("Paris", add_special_tokens=False)["input_ids"]
    )


def test_save_load_offline_and_extend_is_idempotent(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert loaded.convert_tokens_to_ids(["<E_s>", "<E_e>", "<mask>"]) == [5, 6, 4]
    text = "born in <E_s> Paris <E_e>."
    assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert len(extend_tokenizer(tmp_path)) == len(loaded)


def test_extend_adds_markers_to_a_plain_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    plain = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    plain.save_pretrained(tmp_path)
    extended = extend_tokenizer(tmp_path)
    assert extended.mask_token == "<mask>"
    ids = extended.convert_tokens_to_ids(["<E_s>", "<E_e>"])
    assert ids[0] >= 2 and ids[1] >= 2 and ids[0] != ids[1]
    assert extended.convert_ids_to_tokens(extended("hello <E_s> hello <E_e>")["input_ids"]) == [
        "hello",
        "<E_s>",
        "hello",
        "<E_e>",
    ]
    with pytest.raises(FileNotFoundError):
        extend_tokenizer(tmp_path / "missing")


def test_cli(tmp_path):
    corpus = tmp_path / "texts.txt"
    corpus.write_text("\n".join(TEXTS), encoding="utf-8")
    assert cli_main(["--corpus", str(corpus), "--out", str(tmp_path / "tok"), "--vocab_size", "300"]) == 0
    trained = AutoTokenizer.from_pretrained(tmp_path / "tok", local_files_only=True)
    assert trained.convert_ids_to_tokens([5, 6]) == ["<E_s>", "<E_e>"]
    assert cli_main(["--from", str(tmp_path / "tok"), "--out", str(tmp_path / "tok2")]) == 0

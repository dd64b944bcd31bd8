import json

import pytest
from transformers import AutoTokenizer

from edmem_hf.tokenization import SPECIAL_TOKENS, cli_main, extend_tokenizer, iter_texts, train_tokenizer

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


QA_RECORDS = [
    {"id": str(i), "question": f"where was {name} born?", "answer": [city], "link_offset": [10],
     "link_length": [len(name)], "link_target": ["7"], "surface_name": [name], "entity_name": [name]}
    for i, (name, city) in enumerate([("Alice Smith", "Paris"), ("Bob Jones", "Berlin"), ("Carol King", "Paris")] * 20)
]  # fmt: skip
GENERATION_RECORDS = [
    {"id": str(i), "input": "Berlin is a city in Germany.", "output": ["This is true because Berlin is in Germany."],
     "link_offset": [0], "link_length": [6], "link_target": ["9"], "surface_name": ["Berlin"], "entity_name": ["Berlin"]}
    for i in range(40)
]  # fmt: skip


def _jsonl(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def test_task_files_give_their_text_fields_not_their_json(tmp_path):
    """`edmem train-tokenizer --corpus edmem_wq-train.jsonl` (docs/fine_tuning.md) trains on the questions and
    answers of a QA file, the inputs and references of a generation file: never on the JSON around them."""
    qa = _jsonl(tmp_path / "edmem_toy-train.jsonl", QA_RECORDS)
    generation = _jsonl(tmp_path / "edmem_gen-dev.jsonl", GENERATION_RECORDS)
    texts = list(iter_texts([qa, generation]))
    # a record's fields, then the entity names it carries (entity decoding spells them), each with the space before
    # it that fine-tuning tokenises it with (`in_running_text`)
    assert texts[:4] == [" where was Alice Smith born?", " Paris", " Alice Smith", " Alice Smith"]
    assert texts[-4:] == [" Berlin is a city in Germany.", " This is true because Berlin is in Germany.", " Berlin",
                          " Berlin"]  # fmt: skip
    assert len(texts) == 4 * len(QA_RECORDS) + 4 * len(GENERATION_RECORDS)
    out = tmp_path / "tok"
    assert cli_main(["--corpus", str(qa), str(generation), "--out", str(out), "--vocab_size", "500"]) == 0
    vocab = AutoTokenizer.from_pretrained(out, local_files_only=True).get_vocab()
    assert {"Ġborn", "ĠParis", "ĠGermany"} <= set(vocab)  # the texts' words (each seen 20 times or more)
    merged = [token for token in vocab if len(token) > 1 and token not in SPECIAL_TOKENS]
    json_syntax = [token for token in merged if any(mark in token for mark in ('"', "{", "}", ":", "_", "link"))]
    assert len(merged) > 20 and json_syntax == [], json_syntax  # no `{"`, `":`, `link_offset`, `surface_name`
    # JSON lines under another name are read the same way
    renamed = tmp_path / "questions.txt"
    renamed.write_text(qa.read_text(encoding="utf-8"), encoding="utf-8")
    assert list(iter_texts([renamed]))[:2] == [" where was Alice Smith born?", " Paris"]


def test_other_json_is_refused_with_what_to_give(tmp_path, capsys):
    sling = tmp_path / "sling_invocab-test.json"
    sling.write_text(json.dumps({"0": {"Paris": ["Q90", "Paris", "7"]}}, indent=4), encoding="utf-8")
    assert cli_main(["--corpus", str(sling), "--out", str(tmp_path / "tok")]) == 2
    message = capsys.readouterr().err
    assert f"{sling} is a JSON file, not text or a task file: give .txt files" in message
    assert "the released task files (edmem_*.jsonl: their question and answers, or input and outputs)" in message
    links = _jsonl(tmp_path / "links.jsonl", [{"id": "0", "answer": ["Paris"]}])
    assert cli_main(["--corpus", str(links), "--out", str(tmp_path / "tok")]) == 2
    message = capsys.readouterr().err
    assert f"{links}, line 1: not a task file's record (a QA record has question and answer" in message
    assert "give .txt files" in message and not (tmp_path / "tok").exists()

"""A new user's first mistakes get one line each (issue 66): a model folder that does not exist is named before any
download, offline and online; an option is never guessed from a prefix; every option takes both spellings."""

from __future__ import annotations

import pytest

from edmem_hf import arguments
from edmem_hf.cli import main as edmem


def _one_line_error(argv: list[str], capsys) -> str:
    """The command's exit code is an error and what it printed is one line naming the problem."""
    try:
        code = edmem(argv)
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if line.strip()]
    error = [line for line in lines if "error:" in line]
    assert len(error) == 1 and "Traceback" not in captured.err, lines
    return error[0]


@pytest.mark.parametrize(
    "argv",
    [
        ["finetune", "--task", "wq", "--model_name_or_path", "wq-tyni", "--output_dir", "out", "--do_predict",
         "--test_file", __file__],
        ["pretrain", "--output_dir", "out", "--model_name_or_path", "wq-tyni"],
        ["add-entities", "--model", "wq-tyni", "--dump", "d.xml", "--out", "grown"],
    ],
)  # fmt: skip
def test_a_mistyped_model_folder_is_one_line_offline(argv, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    assert "wq-tyni: no such folder" in _one_line_error(argv, capsys)


def test_online_the_hub_is_asked_once_and_its_answer_is_one_line(monkeypatch, tmp_path):
    import huggingface_hub

    monkeypatch.setattr(arguments, "hub_offline", lambda: False)
    asked = []
    monkeypatch.setattr(huggingface_hub, "repo_exists", lambda name: asked.append(name) or name == "org/model")
    assert arguments.missing_model("wq-tyni") == "no such folder, and no such model on the Hub"
    assert arguments.missing_model("org/model") is None and asked == ["wq-tyni", "org/model"]
    assert arguments.missing_model("./wq-tyni") == "no such folder" and len(asked) == 2  # only a path: not asked

    def unreachable(name):
        raise ConnectionError("no network")

    monkeypatch.setattr(huggingface_hub, "repo_exists", unreachable)
    assert "the Hub could not say" in arguments.missing_model("wq-tyni")
    (tmp_path / "model").mkdir()
    (tmp_path / "file.txt").write_text("x")
    assert arguments.missing_model(str(tmp_path / "model")) is None
    assert arguments.missing_model(str(tmp_path / "file.txt")) == "a file, not a model folder"


@pytest.mark.parametrize(
    "argv",
    [
        ["pretrain", "--output_dir", "out", "--learning_rat", "1e-3"],
        ["finetune", "--task", "wq", "--model_name_or_path", ".", "--output_dir", "out", "--learning_rat", "1e-3"],
        ["evaluate", "--task", "nq", "--data", "d", "--predictions", "p", "--answer-link", "a"],
    ],
)
def test_an_option_is_never_guessed_from_a_prefix(argv, capsys):
    error = _one_line_error(argv, capsys)
    assert argv[-2] in error and ("unrecognized arguments" in error or "not used" in error), error


def test_every_option_takes_both_spellings():
    parser = arguments.CommandParser(prog="x")
    parser.add_argument("--answer-links")
    parser.add_argument("--max_passages")
    assert vars(parser.parse_args(["--answer_links", "a", "--max-passages", "3"])) == {
        "answer_links": "a",
        "max_passages": "3",
    }
    with pytest.raises(SystemExit):
        parser.parse_args(["--answer", "a"])


def test_a_tokenizer_without_a_marker_is_named_in_one_line():
    """`EDMemConfig.from_tokenizer` and `marked_batch` name the marker a tokenizer lacks (issue 66, item 3), instead of
    building a model on the unknown token's id or failing later on a count of markers."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from edmem_hf import EDMemConfig
    from edmem_hf.tasks import marked_batch
    from tiny_models import make_word_tokenizer

    words = {"<unk>": 0, "<pad>": 1, "<s>": 2, "</s>": 3, "<E_e>": 4, "who": 5}
    backend = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    lacking = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>",
                                      bos_token="<s>", eos_token="</s>")  # fmt: skip
    with pytest.raises(ValueError, match="^<E_s> is not in your tokenizer: add both mention markers"):
        EDMemConfig.from_tokenizer(lacking, entity_vocab_size=3)
    with pytest.raises(ValueError, match="the tokenizer has no <E_s> token"):
        marked_batch(["who <E_s> x <E_e>"], lacking)
    tokenizer = make_word_tokenizer(bart_template=True)
    config = EDMemConfig.from_tokenizer(tokenizer, entity_vocab_size=7, d_model=32)
    assert (config.vocab_size, config.entity_vocab_size, config.d_model) == (len(tokenizer), 7, 32)
    assert config.entity_start_token_id == tokenizer.convert_tokens_to_ids("<E_s>")
    assert config.decoder_start_token_id == config.eos_token_id == tokenizer.eos_token_id


def test_a_corpus_is_named_where_a_model_is_expected_and_a_corpus_needs_its_vocabulary(tmp_path, capsys):
    """A corpus folder passed as a model, a corpus without `entity_vocab.json` and `--writer_corpus` with a model
    that has no writer are one line each, before anything loads (issue 66, item 6)."""
    from edmem_hf.finetuning import ModelFolderError, check_model_folder
    from edmem_hf.pretraining import load_corpus

    corpus = tmp_path / "corpus"
    (corpus / "passages").mkdir(parents=True)
    (corpus / "entity_vocab.json").write_text('{"names": ["x"]}')
    with pytest.raises(ModelFolderError, match="is a corpus .* not a model: pre-train on it"):
        check_model_folder(str(corpus))
    (corpus / "entity_vocab.json").unlink()
    with pytest.raises(ValueError, match="no entity_vocab.json"):
        load_corpus(str(corpus))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "edmem"}')
    error = _one_line_error(["finetune", "--task", "wq", "--model_name_or_path", str(model), "--output_dir",
                             str(tmp_path / "out"), "--writer_corpus", str(corpus)], capsys)  # fmt: skip
    assert "has no writer of entity rows" in error

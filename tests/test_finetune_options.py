"""`examples/finetune_*.py` check their options when the arguments are parsed, before loading or training, and their
defaults follow the files given."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from transformers import IntervalStrategy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import finetune_common  # noqa: E402
import finetune_generation  # noqa: E402
import finetune_qa  # noqa: E402


@pytest.fixture
def files(tmp_path):
    (tmp_path / "model").mkdir()
    for name in ("train.jsonl", "dev.jsonl", "test.jsonl"):
        (tmp_path / name).write_text("")
    return tmp_path


def _argv(files, *extra):
    return ["--model_name_or_path", str(files / "model"), "--output_dir", str(files / "out"), *extra]


def _refused(capsys, main, argv) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    return " ".join(capsys.readouterr().err.split())


def test_an_option_with_a_fixed_set_of_values_is_checked_when_parsed(files, capsys, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("nothing is loaded before the options are checked")

    monkeypatch.setattr(finetune_common.AutoTokenizer, "from_pretrained", never)
    error = _refused(capsys, finetune_qa.main, _argv(files, "--entity_decoding", "dynamik"))
    assert "argument --entity_decoding/--entity-decoding: invalid choice: 'dynamik'" in error
    assert "invalid choice: 'drop'" in _refused(capsys, finetune_qa.main, _argv(files, "--bad_records", "drop"))
    assert "invalid choice: 'linking'" in _refused(capsys, finetune_qa.main, _argv(files, "--objective", "linking"))
    generation = ["--task", "creek", *_argv(files)]
    assert "argument --task: invalid choice: 'creek'" in _refused(capsys, finetune_generation.main, generation)


def test_defaults_follow_the_files_given(files, capsys):
    train = ["--train_file", str(files / "train.jsonl"), "--do_train"]
    _, _, args, _ = finetune_common.parse_arguments(finetune_qa.QA, _argv(files, *train), (finetune_qa.QAArguments,))
    assert args.eval_strategy == IntervalStrategy.NO and not args.load_best_model_at_end  # nothing to evaluate
    assert args.save_strategy == IntervalStrategy.EPOCH and args.generation_max_length == 65  # start + 64 tokens
    validated = [*train, "--validation_file", str(files / "dev.jsonl")]
    _, _, args, _ = finetune_common.parse_arguments(
        finetune_qa.QA, _argv(files, *validated), (finetune_qa.QAArguments,)
    )
    assert args.eval_strategy == IntervalStrategy.EPOCH and args.load_best_model_at_end  # the paper's
    # one JSON file of arguments gets the same defaults
    options = {"model_name_or_path": str(files / "model"), "output_dir": str(files / "out")}
    options |= {"train_file": str(files / "train.jsonl"), "do_train": True}
    (files / "args.json").write_text(json.dumps(options))
    _, _, args = finetune_common.parse_arguments(finetune_qa.QA, [str(files / "args.json")])
    assert args.eval_strategy == IntervalStrategy.NO and args.learning_rate == 1e-5 and args.predict_with_generate
    error = _refused(capsys, finetune_qa.main, _argv(files, *train, "--eval_strategy", "epoch"))
    assert "--eval_strategy epoch evaluates on --validation_file, which is not given" in error


def test_missing_folders_and_files_are_named(files, capsys):
    missing = _argv(files)
    missing[1] = str(files / "no-such-model")
    assert f"--model_name_or_path {files / 'no-such-model'}: no such model folder" in _refused(
        capsys, finetune_qa.main, missing
    )
    static = _argv(files, "--static_linker", "runs/linker")
    assert "--static_linker runs/linker: no such model folder" in _refused(capsys, finetune_qa.main, static)
    absent = _argv(files, "--test_file", str(files / "absent.jsonl"), "--do_predict")
    assert f"--test_file {files / 'absent.jsonl'}: no such file" in _refused(capsys, finetune_qa.main, absent)
    assert "--do_predict needs --test_file" in _refused(capsys, finetune_qa.main, _argv(files, "--do_predict"))

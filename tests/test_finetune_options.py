"""`edmem finetune` checks its options when the arguments are parsed, before loading or training, says what is wrong
in one line (not the usage of every Trainer option), and its defaults follow the task and the files given."""

from __future__ import annotations

import json

import pytest
from transformers import IntervalStrategy

from edmem_hf import finetuning
from edmem_hf.cli import main as edmem


@pytest.fixture
def files(tmp_path):
    (tmp_path / "model").mkdir()
    for name in ("train.jsonl", "dev.jsonl", "test.jsonl", "links.json"):
        (tmp_path / name).write_text("")
    return tmp_path


def _argv(files, *extra):
    return ["--model_name_or_path", str(files / "model"), "--output_dir", str(files / "out"), *extra]


def _refused(capsys, argv) -> str:
    """`edmem finetune ARGV`'s error: exit 2, a one-line usage pointing to --help, then the message."""
    with pytest.raises(SystemExit) as exit_:
        edmem(["finetune", *argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: edmem finetune [options] (all of them: edmem finetune --help)\n"), err
    assert len(err.splitlines()) == 2, err  # the usage line and the error, not the 130-line usage
    return " ".join(err.split())


def test_an_option_with_a_fixed_set_of_values_is_checked_when_parsed(files, capsys, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("nothing is loaded before the options are checked")

    monkeypatch.setattr(finetuning.AutoTokenizer, "from_pretrained", never)
    error = _refused(capsys, _argv(files, "--entity_decoding", "dynamik"))
    assert "argument --entity_decoding/--entity-decoding: invalid choice: 'dynamik'" in error
    assert "invalid choice: 'drop'" in _refused(capsys, _argv(files, "--bad_records", "drop"))
    assert "invalid choice: 'linking'" in _refused(capsys, _argv(files, "--objective", "linking"))
    assert "argument --task: invalid choice: 'creek'" in _refused(capsys, ["--task", "creek", *_argv(files)])
    assert "--objective static_linking applies to the QA tasks, not to creak" in _refused(
        capsys, ["--task", "creak", "--objective", "static_linking", *_argv(files)]
    )
    assert "unrecognized arguments: --entity_decodng dynamic" in _refused(
        capsys, _argv(files, "--entity_decodng", "dynamic")
    )


def test_defaults_follow_the_task_and_the_files_given(files, capsys):
    train = ["--train_file", str(files / "train.jsonl"), "--do_train"]
    _, data, args, task_args, task = finetuning.parse_arguments(argv=_argv(files, *train))
    assert args.eval_strategy == IntervalStrategy.NO and not args.load_best_model_at_end  # nothing to evaluate
    assert args.save_strategy == IntervalStrategy.EPOCH and args.generation_max_length == 65  # start + 64 tokens
    assert task is finetuning.QA and task_args.task == "qa" and args.metric_for_best_model == "exact_match"
    validated = [*train, "--validation_file", str(files / "dev.jsonl")]
    _, _, args, _, _ = finetuning.parse_arguments(argv=_argv(files, *validated))
    assert args.eval_strategy == IntervalStrategy.EPOCH and args.load_best_model_at_end  # the paper's
    _, data, args, _, task = finetuning.parse_arguments(argv=["--task", "creak", *_argv(files, *validated)])
    assert args.metric_for_best_model == "rougeL" and data.max_source_length == 256
    assert task.read.__name__ == "read_generation"
    _, _, args, _, task = finetuning.parse_arguments(argv=["--objective", "static_linking", *_argv(files)])
    assert task is finetuning.STATIC_LINKING and not args.predict_with_generate
    # one JSON file of arguments gets the same defaults, its task's too
    options = {"model_name_or_path": str(files / "model"), "output_dir": str(files / "out")}
    options |= {"train_file": str(files / "train.jsonl"), "do_train": True, "task": "wow"}
    (files / "args.json").write_text(json.dumps(options))
    _, _, args, _, _ = finetuning.parse_arguments(argv=[str(files / "args.json")])
    assert args.eval_strategy == IntervalStrategy.NO and args.learning_rate == 1e-5 and args.predict_with_generate
    assert args.metric_for_best_model == "rougeL"
    error = _refused(capsys, _argv(files, *train, "--eval_strategy", "epoch"))
    assert "--eval_strategy epoch evaluates on --validation_file, which is not given" in error


def test_missing_folders_and_files_are_named(files, capsys):
    missing = _argv(files)
    missing[1] = str(files / "no-such-model")
    assert f"--model_name_or_path {files / 'no-such-model'}: no such folder" in _refused(capsys, missing)
    static = _argv(files, "--static_linker", "runs/linker")
    assert "--static_linker runs/linker: no such folder" in _refused(capsys, static)
    absent = _argv(files, "--test_file", str(files / "absent.jsonl"), "--do_predict")
    assert f"--test_file {files / 'absent.jsonl'}: no such file" in _refused(capsys, absent)
    links = _argv(files, "--test_answer_links", str(files / "absent.json"))
    assert f"--test_answer_links {files / 'absent.json'}: no such file" in _refused(capsys, links)
    generation = ["--task", "eli5", *_argv(files, "--test_answer_links", str(files / "links.json"))]
    assert "--test_answer_links applies to the QA tasks only" in _refused(capsys, generation)
    assert "--do_predict needs --test_file" in _refused(capsys, _argv(files, "--do_predict"))
    frozen = _argv(files, "--frozen_writer")
    assert "--frozen_writer writes the table from a corpus: give --writer_corpus" in _refused(capsys, frozen)
    pooled = _argv(files, "--writer_passages_per_row", "3")
    refused = "--writer_passages_per_row pools rows written from a corpus: give --writer_corpus"
    assert refused in _refused(capsys, pooled)
    none = _argv(files, "--writer_passages_per_row", "0")
    assert "--writer_passages_per_row 0: give 1 or more" in _refused(capsys, none)


def test_edmem_lists_finetune(capsys):
    assert edmem(["--help"]) == 0
    assert "  finetune " in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        edmem(["finetune", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "edmem finetune --task wq" in text and "--task {nq,wq,tqa,qa,creak,wow,eli5,msmarco}" in text
    assert "--objective {qa,static_linking}" in text and "--test_answer_links" in text

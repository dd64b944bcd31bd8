"""Every option of the commands a user meets first has a help text, and required options are shown as required."""

from __future__ import annotations

import re

import pytest

from edmem_hf.cli import main as edmem


def _help(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        edmem(argv)
    assert exit_.value.code == 0
    return capsys.readouterr().out


def _entries(text: str) -> dict[str, str]:
    """Each option's and positional argument's entry in an argparse help text: {its first name: its help, words
    joined by single spaces}."""
    entries = {}
    for section in re.findall(r"\n(?:options|positional arguments):\n(.*?)(?=\n\n|\Z)", text, re.S):
        for entry in re.split(r"\n  (?=\S)", "\n" + section.strip("\n")):
            words = " ".join(entry.split())
            if not words:
                continue
            name = words.split()[0].rstrip(",")
            if name.startswith("-"):
                words = re.sub(
                    r"^(-[-\w]+(?: [A-Z_=]+(?![a-z])(?: \[[A-Z_]+ \.\.\.\])?| \[\w+\]| \{[\w,]+\})?,? ?)+", "", words
                )
            else:
                words = words[len(name) :]
            entries[name] = words.strip()
    return entries


def _options_without_help(text: str) -> list[str]:
    """Options whose entry in an argparse help text has nothing but the `(default: ...)` HfArgumentParser adds."""
    return [
        name for name, described in _entries(text).items() if not re.sub(r"\(default: .*\)$", "", described).strip()
    ]


COMMANDS = [
    "pretrain",
    "demo",
    "build-corpus",
    "train-tokenizer",
    "write-preset",
    "evaluate",
    "add-entities",
    "convert-original",
    "finetune",
]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_has_a_help_text(command, capsys):
    text = _help([command, "--help"], capsys)
    description = text.split("\n\n")[1].strip()
    assert description and not description.startswith(("options:", "positional arguments:")), "a description"
    entries = _entries(text)
    assert "-h" in entries and len(entries) > 3
    assert _options_without_help(text) == []


@pytest.mark.parametrize("command", COMMANDS)
def test_no_default_is_shown_where_there_is_none(command, capsys):
    """Required options and options unset by default say nothing of a default, rather than `(default: None)`."""
    text = " ".join(_help([command, "--help"], capsys).split())
    assert "(default: None)" not in text and "(default: )" not in text and "(default: [])" not in text


@pytest.mark.parametrize(
    ("command", "option", "described"),
    [
        ("build-corpus", "heuristic_labels", "Label the hyperlinked mentions only (no search for unlinked ones)."),
    ],
)
def test_each_no_switch_says_what_turning_off_does(command, option, described, capsys):
    entries = _entries(_help([command, "--help"], capsys))
    assert entries[f"--no_{option}"] == described != entries[f"--{option}"]
    assert "(default:" not in entries[f"--no_{option}"]


def test_required_options_are_shown_as_required(capsys):
    usage = " ".join(_help(["build-corpus", "--help"], capsys).split("\n\n")[0].split())
    assert "--dump DUMP [DUMP ...] --out OUT" in usage and "[--dump" not in usage and "[--out" not in usage
    assert "default: []" not in _help(["build-corpus", "--help"], capsys)
    with pytest.raises(SystemExit):
        edmem(["build-corpus"])
    assert "the following arguments are required: --dump, --out" in capsys.readouterr().err
    assert "--output_dir OUTPUT_DIR" in _help(["pretrain", "--help"], capsys).split("\n\n")[0]
    assert " --out OUT " in " ".join(_help(["demo", "--help"], capsys).split("\n\n")[0].split()) + " "
    assert "[-h] --out OUT [--corpus" in " ".join(
        _help(["train-tokenizer", "--help"], capsys).split("\n\n")[0].split()
    )
    for command, required in (("build-corpus", "--dump"), ("pretrain", "--output_dir"), ("train-tokenizer", "--out")):
        assert "(default:" not in _entries(_help([command, "--help"], capsys))[required]


def test_finetune_help_shows_the_objective_and_the_choices(capsys):
    text = " ".join(_help(["finetune", "--help"], capsys).split())
    assert "--objective {qa,static_linking}" in text and "trains the static setting's linker" in text
    assert "--entity_decoding {free,static,dynamic}" in text and "--bad_records {raise,skip}" in text


def test_pretrain_help_shows_what_a_wikipedia_pre_training_needs(capsys):
    """At most 50 options in `edmem pretrain --help` (issue 63), the writer's in a group of their own, no option that
    only the experiments' worlds use; the options it does not list are still accepted."""
    from edmem_hf.pretraining import EXPERT_OPTIONS, cli_main
    from edmem_hf.research.writer_training import TRAINING_DEFAULTS

    text = _help(["pretrain", "--help"], capsys)
    options = re.findall(r"^  (--\w+)", text, re.M)
    assert len(options) <= 50, len(options)
    groups = text.split("\n\n")
    writer = next(group for group in groups if group.startswith("the writer of entity rows"))
    assert re.findall(r"^  (--\w+)", writer, re.M) == ["--entity_row_writer", "--writer_recipe",
                                                       "--written_only_entities_file"]  # fmt: skip
    hidden = ["--mixed_questions_file", "--balanced_entities_share", *(f"--{name}" for name in EXPERT_OPTIONS),
              *(f"--{name}" for name in TRAINING_DEFAULTS)]  # fmt: skip
    assert not set(hidden) & set(options)
    # accepted all the same: a wrong value of a hidden option is refused by name, not as an unknown option
    assert cli_main(["--output_dir", "x", "--corpus_dir", "nowhere", "--writer_recipe", "none_such"]) == 2
    assert "--writer_recipe 'none_such': choose one of rows_that_answer, frozen_writer" in capsys.readouterr().out


def test_every_writer_option_the_help_leaves_out_is_listed_in_the_pretraining_docs():
    """The writer's fields `edmem pretrain --help` does not list are accepted all the same: docs/pretraining.md is
    where a user finds them, each by its option."""
    from dataclasses import fields
    from pathlib import Path

    from edmem_hf.research.writer_training import WriterTrainingArguments

    page = (Path(__file__).resolve().parents[1] / "docs" / "pretraining.md").read_text(encoding="utf-8")
    assert [f.name for f in fields(WriterTrainingArguments) if f"--{f.name}" not in page] == []

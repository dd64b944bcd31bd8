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


def _options_without_help(text: str) -> list[str]:
    """Options whose entry in an argparse help text has nothing but the `(default: ...)` HfArgumentParser adds."""
    entries = re.split(r"\n  (?=-)", text.split("\noptions:\n", 1)[1])
    bare = []
    for entry in entries:
        words = " ".join(entry.split())
        name = words.split()[0]
        described = re.sub(r"^(-[-\w]+(?: [A-Z_]+(?: \[[A-Z_]+ \.\.\.\])?| \[\w+\]| \{[\w,]+\})?,? ?)+", "", words)
        if not re.sub(r"\(default: .*\)$", "", described).strip():
            bare.append(name)
    return bare


@pytest.mark.parametrize("command", ["pretrain", "demo", "build-corpus", "write-preset", "evaluate", "finetune"])
def test_every_option_has_a_help_text(command, capsys):
    text = _help([command, "--help"], capsys)
    assert text.split("\n\n")[1].strip(), "a description under the usage line"
    assert _options_without_help(text) == []


def test_required_options_are_shown_as_required(capsys):
    usage = " ".join(_help(["build-corpus", "--help"], capsys).split("\n\n")[0].split())
    assert "--dump DUMP [DUMP ...] --out OUT" in usage and "[--dump" not in usage and "[--out" not in usage
    assert "default: []" not in _help(["build-corpus", "--help"], capsys)
    with pytest.raises(SystemExit):
        edmem(["build-corpus"])
    assert "the following arguments are required: --dump, --out" in capsys.readouterr().err
    assert "--output_dir OUTPUT_DIR" in _help(["pretrain", "--help"], capsys).split("\n\n")[0]
    assert " --out OUT " in " ".join(_help(["demo", "--help"], capsys).split("\n\n")[0].split()) + " "


def test_finetune_help_shows_the_objective_and_the_choices(capsys):
    text = " ".join(_help(["finetune", "--help"], capsys).split())
    assert "--objective {qa,static_linking}" in text and "trains the static setting's linker" in text
    assert "--entity_decoding {free,static,dynamic}" in text and "--bad_records {raise,skip}" in text

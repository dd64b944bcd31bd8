"""Every command in a ```bash block of the README and docs/ is checked against the real parser of what it runs.

The jobs themselves (a 1M-entity corpus, an 8-GPU pre-training) cannot run here, and the tests of each command run
them on tiny inputs; what this module guards is the docs: a renamed or removed option, a wrong script path or an
Accelerate config that is not there fails here, naming the page and the command.

A command is parsed, not run: `argparse.ArgumentParser.parse_args` and `HfArgumentParser.parse_args_into_dataclasses`
are wrapped so that a successful parse (including the dataclasses' own checks, and with no abbreviated options)
stops the program with `_Parsed`.
Optional parts `[...]` are parsed too (each alternative of `[A | B]` on its own); `...` stands for options the
page leaves out and is dropped. An unknown kind of command fails, so that a new block cannot escape the check.
"""

from __future__ import annotations

import argparse
import itertools
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest
from transformers import HfArgumentParser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
OPTIONAL = re.compile(r"\[([^\[\]]*)\]")


class _Parsed(Exception):
    """Raised by the wrapped parsers once the command line has parsed."""


class _Refused(Exception):
    """Raised instead of argparse's exit, with its message."""


def commands(page: Path) -> list[str]:
    """The commands of a page's bash blocks: continuation lines joined, comments and blank lines dropped."""
    found = []
    for block in BLOCK.findall(page.read_text(encoding="utf-8")):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip() if not line.lstrip().startswith("#") else ""
            if line:
                found.append(line)
    return found


def expansions(command: str) -> list[str]:
    """The command with every optional part in, one line per choice of the `[A | B]` alternatives."""
    groups = OPTIONAL.findall(command)
    choices = [[alternative.strip() for alternative in group.split(" | ")] for group in groups]
    pieces = OPTIONAL.split(command)[::2]  # the text around the optional groups
    return ["".join(itertools.chain(*itertools.zip_longest(pieces, picked, fillvalue=""))) for picked in
            itertools.product(*choices)]  # fmt: skip


def _parse_only(monkeypatch) -> None:
    parse_args = argparse.ArgumentParser.parse_args
    into_dataclasses = HfArgumentParser.parse_args_into_dataclasses

    def stop_after(original):
        def wrapped(self, *args, **kwargs):
            self.allow_abbrev = False  # the docs spell options in full
            original(self, *args, **kwargs)
            raise _Parsed

        return wrapped

    def refuse(self, message):
        raise _Refused(message)

    monkeypatch.setattr(argparse.ArgumentParser, "error", refuse)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop_after(parse_args))
    monkeypatch.setattr(HfArgumentParser, "parse_args_into_dataclasses", stop_after(into_dataclasses))


def _edmem(argv: list[str]) -> None:
    from edmem_hf.cli import COMMANDS, main

    assert argv and argv[0] in COMMANDS, f"no edmem command {argv[:1]}"
    main(argv)


def _script(argv: list[str]) -> None:
    path = ROOT / argv[0]
    assert path.is_file(), f"no script {argv[0]}"
    sys.argv = [str(path), *argv[1:]]
    sys.path.insert(0, str(path.parent))  # as `python path/to/script.py` does
    try:
        runpy.run_path(str(path), run_name="__main__")
    finally:
        sys.path.remove(str(path.parent))


def _launcher(argv: list[str]) -> None:
    """`accelerate launch [--config_file F] ... -m edmem_hf.cli <command> ...` or `torchrun ... -m edmem_hf.cli`."""
    if "--config_file" in argv:
        config = argv[argv.index("--config_file") + 1]
        assert (ROOT / config).is_file(), f"no Accelerate config {config}"
    assert argv[argv.index("-m") + 1] == "edmem_hf.cli", "launchers run the edmem_hf.cli module"
    _edmem(argv[argv.index("-m") + 2 :])


def check(command: str) -> None:
    """Parses one command line with what it runs; returns when it parses."""
    for part in command.split(" && "):
        words = shlex.split(part)
        argv, elided = [word for word in words if word != "..."], "..." in words
        program, rest = argv[0], argv[1:]
        if program == "bash":  # the README's set-up: the script is there and .ci/run runs the same test command
            assert (ROOT / rest[0]).is_file(), f"no script {rest[0]}"
            continue
        if program.endswith("python") and rest[:2] == ["-m", "pytest"]:
            assert part in (ROOT / ".ci" / "run").read_text(), f".ci/run does not run {part!r}"
            continue
        run = {"edmem": _edmem, "python": _script, "accelerate": _launcher, "torchrun": _launcher}
        name = Path(program).name
        if name not in run:
            raise AssertionError(f"a kind of command this test does not know: {program!r}")
        try:
            run[name](rest[1:] if name == "accelerate" and rest[:1] == ["launch"] else rest)
        except _Parsed:
            continue
        except _Refused as error:
            if elided and str(error).startswith("the following arguments are required"):
                continue  # the page leaves them out (`...`)
            raise AssertionError(f"the parser refuses {part!r}: {error}") from None
        except ValueError as error:  # HfArgumentParser: "Some specified arguments are not used ..."
            raise AssertionError(f"the parser refuses {part!r}: {error}") from None
        raise AssertionError(f"{part!r} ran without parsing its arguments")


CASES = [(page, line) for page in PAGES for command in commands(page) for line in expansions(command)]


def test_the_pages_have_commands():
    assert {page.name for page, _ in CASES} >= {"README.md", "corpus.md", "pretraining.md", "fine_tuning.md"}


@pytest.mark.parametrize("page,command", CASES, ids=[f"{page.name}:{i}" for i, (page, _) in enumerate(CASES)])
def test_each_documented_command_parses(page, command, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    _parse_only(monkeypatch)
    try:
        check(command)
    except AssertionError as error:
        raise AssertionError(f"{page.relative_to(ROOT)}: {command}\n  {error}") from None


def test_a_wrong_option_is_caught(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    _parse_only(monkeypatch)
    check("edmem evaluate --task nq --data a.jsonl --predictions b.json")
    with pytest.raises(AssertionError, match="refuses"):
        check("edmem evaluate --task nq --data a.jsonl --prediction-file b.json")
    with pytest.raises(AssertionError, match="refuses"):
        check("python examples/finetune_qa.py --model_name_or_path m --output_dir o --entity_decodng dynamic")
    with pytest.raises(AssertionError, match="no Accelerate config"):
        check("accelerate launch --config_file examples/accelerate_configs/none.yaml -m edmem_hf.cli pretrain")

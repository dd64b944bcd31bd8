"""Every command in a ```bash block of the README and docs/ is checked against the real parser of what it runs.

The jobs themselves (a 1M-entity corpus, an 8-GPU pre-training) cannot run here, and the tests of each command run
them on tiny inputs; what this module guards is the docs: a renamed or removed option, a wrong script path or an
Accelerate config that is not there fails here, naming the page, the block and the command.

- A command is parsed, not run: `argparse.ArgumentParser.parse_args` and `HfArgumentParser.parse_args_into_dataclasses`
  are wrapped so that a successful parse (including the dataclasses' own checks, and with no abbreviated options)
  stops the program with `_Parsed`. `edmem <command>` goes through `edmem_hf.cli.main`, `python path/script.py`
  runs the script as `__main__` (examples and benchmarks alike), `accelerate launch` and `torchrun` are parsed by
  their own parsers, their `--config_file` read by Accelerate, and the `-m edmem_hf.cli` tail parsed as an edmem
  command. The README's set-up command (`bash scripts/bootstrap.sh && ... pytest`) is not run: it must be a line of
  `.ci/run`, which is what CI runs.
- A page may set a shell variable to a folder (`WQ=$(realpath ...)`) and change to a working folder (`mkdir -p DIR
  && cd DIR`): the variable is set to a folder of the test's and expanded in the commands after it (`$WQ/...`), and
  the folder lines are not parsed.
- Optional parts `[...]` are parsed too (each alternative of `[A | B]` on its own); `...` stands for options the page
  leaves out and is dropped. Placeholders (`MODEL`, `HOST`, `PATH`, file names) are passed as written: the parsers
  take them as strings.
- Every option named in a code span of the prose (`--foo_bar`) is an option of the program it belongs to: the one
  the span names (`edmem pretrain --preset`), else one of the programs the page runs or names (its bash blocks, its
  code spans). The parsers are read by running each program up to its final parse. Options of programs outside
  the project are listed, with whose they are, in FOREIGN_OPTIONS.
- An unknown kind of command fails, so that a new block cannot escape the check; so does a fenced block that is
  neither ```python (run by tests/test_docs.py) nor ```bash, unless it is ```text or ```json (figures, sample output).
- `edmem evaluate` is cheap enough to run for real: each documented evaluate command runs, all its options in, on the
  first records of the released files it names (`../shared/data/edmem_release`, found by name under the task's
  folder; the authors' alias table is not released, so `--aliases` gets one naming those records' gold entities).
  `edmem write-preset` runs in tests/test_hub.py.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import itertools
import json
import os
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest
from huggingface_hub import try_to_load_from_cache
from transformers import HfArgumentParser

from conftest import shared_data_path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(.*?)\n(.*?)^```", re.S | re.M)
OPTIONAL = re.compile(r"\[([^\[\]]*)\]")
NOT_CODE = {"text", "json"}  # figures and layouts, sample output: shown, not run
ASSIGNMENT = re.compile(r"^([A-Za-z_]\w*)=")  # `NAME=value`: a shell variable a page sets
FOLDER_COMMANDS = ("mkdir", "cd")  # the working folder of a page's commands


class _Parsed(Exception):
    """Raised by the wrapped parsers once the command line has parsed, carrying what they returned."""

    def __init__(self, result):
        super().__init__()
        self.result = result


class _Refused(Exception):
    """Raised instead of argparse's exit, with its message."""


class _Wrong(Exception):
    """A documented command that does not parse, or names what is not there."""


def _require(condition: object, message: str) -> None:
    if not condition:
        raise _Wrong(message)


def fences(page: Path) -> list[tuple[str, str]]:
    """`(language, text)` of each fenced block of a page."""
    return FENCE.findall(page.read_text(encoding="utf-8"))


def commands(page: Path) -> list[tuple[int, str]]:
    """`(bash block number, command)` for the commands of a page: continuation lines joined, comments and blank
    lines dropped."""
    found = []
    bash_blocks = [text for language, text in fences(page) if language == "bash"]
    for number, block in enumerate(bash_blocks, 1):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0] if not line.lstrip().startswith("#") else ""
            if line.strip():
                found.append((number, " ".join(line.split())))
    return found


def page_variables(page: Path) -> list[str]:
    """The shell variables the page's commands set (`NAME=value`)."""
    return [match.group(1) for _, command in commands(page) if (match := ASSIGNMENT.match(command))]


def set_page_variables(page: Path, workdir: Path, monkeypatch) -> None:
    """Each variable the page sets, as a folder in `workdir` (and `~` as `workdir`), for its commands to expand."""
    monkeypatch.setenv("HOME", str(workdir))
    for name in page_variables(page):
        monkeypatch.setenv(name, str(workdir / name.lower()))


def expanded(part: str) -> list[str]:
    """The words of a command with its `$VARIABLES` and `~` expanded, as the shell does."""
    return [os.path.expanduser(os.path.expandvars(word)) for word in shlex.split(part)]


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
            raise _Parsed(original(self, *args, **kwargs))

        return wrapped

    def refuse(self, message):
        raise _Refused(message)

    monkeypatch.setattr(argparse.ArgumentParser, "error", refuse)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop_after(parse_args))
    monkeypatch.setattr(HfArgumentParser, "parse_args_into_dataclasses", stop_after(into_dataclasses))


def _edmem(argv: list[str]) -> None:
    from edmem_hf.cli import COMMANDS, main

    _require(argv and argv[0] in COMMANDS, f"no edmem command {argv[:1]}")
    main(argv)


def _script(argv: list[str]) -> None:
    path = ROOT / argv[0]
    _require(path.is_file(), f"no script {argv[0]}")
    sys.argv = [str(path), *argv[1:]]
    sys.path.insert(0, str(path.parent))  # as `python path/to/script.py` does
    try:
        runpy.run_path(str(path), run_name="__main__")
    finally:
        sys.path.remove(str(path.parent))


def _launcher(program: str, argv: list[str]) -> None:
    """`accelerate launch [options] -m edmem_hf.cli <command> ...` or `torchrun [options] -m edmem_hf.cli ...`:
    the launcher's options parse, the Accelerate config file reads, the edmem command parses."""
    if program == "accelerate":
        from accelerate.commands.config.config_args import load_config_from_file
        from accelerate.commands.launch import launch_command_parser

        _require(argv[:1] == ["launch"], f"an accelerate command this test does not know: {argv[:1]}")
        parser, argv = launch_command_parser(), argv[1:]
    else:
        from torch.distributed.run import get_args_parser

        parser = get_args_parser()
    try:
        parser.parse_args(argv)
    except _Parsed as parsed:
        launch = parsed.result
    else:
        raise _Wrong(f"{program} ran without parsing its arguments")
    _require(launch.module and launch.training_script == "edmem_hf.cli", "launchers run `-m edmem_hf.cli`")
    if getattr(launch, "config_file", None) is not None:
        _require((ROOT / launch.config_file).is_file(), f"no Accelerate config {launch.config_file}")
        load_config_from_file(str(ROOT / launch.config_file))  # unknown keys or a bad value raise
    _edmem(launch.training_script_args)


def check(command: str) -> None:
    """Parses one command line with what it runs; returns when it parses."""
    for part in command.split(" && "):
        if ASSIGNMENT.match(part):  # a variable of the page, set by the test
            continue
        words = expanded(part)
        argv, elided = [word for word in words if word != "..."], "..." in words
        program, rest = argv[0], argv[1:]
        if program in FOLDER_COMMANDS:
            continue
        if program == "bash":  # the README's set-up: the script is there and .ci/run runs the same command
            _require((ROOT / rest[0]).is_file(), f"no script {rest[0]}")
            continue
        if program.endswith("python") and rest[:2] == ["-m", "pytest"]:
            ci_lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
            _require(command in ci_lines, f".ci/run does not run {command!r}")
            continue
        name = Path(program).name
        run = {
            "edmem": _edmem,
            "python": _script,
            "accelerate": lambda argv: _launcher("accelerate", argv),
            "torchrun": lambda argv: _launcher("torchrun", argv),
        }
        if name not in run:
            raise _Wrong(f"a kind of command this test does not know: {program!r}")
        try:
            run[name](rest)
        except _Parsed:
            continue
        except _Refused as error:
            if elided and str(error).startswith("the following arguments are required"):
                continue  # the page leaves them out (`...`)
            raise _Wrong(f"the parser refuses it: {error}") from None
        except ValueError as error:  # HfArgumentParser: "Some specified arguments are not used ..."
            raise _Wrong(f"the parser refuses it: {error}") from None
        raise _Wrong(f"{part!r} ran without parsing its arguments")


CASES = [(page, block, line) for page in PAGES for block, command in commands(page) for line in expansions(command)]
IDS = [f"{page.name}:bash{block}:{i}" for i, (page, block, _) in enumerate(CASES)]
EVALUATE = [(case, id_) for case, id_ in zip(CASES, IDS, strict=True) if case[2].startswith("edmem evaluate ")]


def _at(page: Path, block: int, command: str, run):
    """`run()`; a `_Wrong` from it fails the test, naming the page, the block and the command."""
    try:
        return run()
    except _Wrong as error:
        where = f"{page.relative_to(ROOT)}, bash block {block}: {command}"
        raise pytest.fail.Exception(f"{where}\n  {error}", pytrace=False) from None


def test_the_pages_have_commands():
    assert {page.name for page, _, _ in CASES} >= {"README.md", "corpus.md", "pretraining.md", "fine_tuning.md"}
    assert len(EVALUATE) >= 2


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_fenced_block_is_checked_or_not_code(page):
    for number, (language, _) in enumerate(fences(page), 1):
        assert language in {"python", "bash", *NOT_CODE}, (
            f"{page.relative_to(ROOT)}, fenced block {number}: ```{language} is neither run nor checked by the "
            f"tests; use ```python, ```bash, or ```text / ```json for what is not code"
        )


@pytest.mark.parametrize("page,block,command", CASES, ids=IDS)
def test_each_documented_command_parses(page, block, command, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    set_page_variables(page, tmp_path, monkeypatch)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    _parse_only(monkeypatch)
    _at(page, block, command, lambda: check(command))


def test_a_wrong_option_is_caught(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    _parse_only(monkeypatch)
    check("edmem evaluate --task nq --data a.jsonl --predictions b.json")
    with pytest.raises(_Wrong, match="refuses"):
        check("edmem evaluate --task nq --data a.jsonl --prediction-file b.json")
    with pytest.raises(_Wrong, match="refuses"):
        check("python examples/finetune_qa.py --model_name_or_path m --output_dir o --entity_decodng dynamic")
    with pytest.raises(_Wrong, match="no Accelerate config"):
        check("accelerate launch --config_file examples/accelerate_configs/none.yaml -m edmem_hf.cli pretrain ...")
    with pytest.raises(_Wrong, match="refuses"):
        check("accelerate launch --machine_rnak 0 -m edmem_hf.cli pretrain ...")
    with pytest.raises(_Wrong, match="does not know"):
        check("edmem-train --corpus_dir corpus/")


RELEASED_RECORDS = 200  # the first records of a released gold file an evaluate command reads: every metric, quickly


def _released_files(argv: list[str], workdir: Path) -> int:
    """Writes into `workdir` the files an `edmem evaluate` command names, from the released files of its task;
    returns the number of gold records."""
    options = {word: value for word, value in itertools.pairwise([*argv, ""]) if word.startswith("--")}
    task = options["--task"]

    def released(path: str) -> Path:
        name, folder = Path(path).name, shared_data_path("edmem_release")
        found = [path for path in folder.rglob(name) if task in (part.lower() for part in path.parts)]
        _require(len(found) == 1, f"the release has no single {name} for the task {task}: {found}")
        return found[0]

    def written(path: str) -> Path:
        (workdir / path).parent.mkdir(parents=True, exist_ok=True)
        return workdir / path

    with released(options["--data"]).open(encoding="utf-8") as f:
        records = [json.loads(line) for line in itertools.islice(f, RELEASED_RECORDS)]
    written(options["--data"]).write_text("".join(json.dumps(record) + "\n" for record in records))
    ids = {record["id"] for record in records}
    for option in ("--predictions", "--answer-links"):  # {id: ...} objects, cut to the records kept
        if option in options:
            by_id = json.loads(released(options[option]).read_text(encoding="utf-8"))
            written(options[option]).write_text(json.dumps({i: v for i, v in by_id.items() if i in ids}))
    if "--aliases" in options:  # entity2mention.json is not released
        names = {name for record in records for reference in record["output_entity_name"] for name in reference}
        written(options["--aliases"]).write_text(json.dumps({name: [name.lower()] for name in sorted(names)}))
    return len(records)


def _evaluate(argv: list[str], workdir: Path, capsys) -> tuple[dict, str, int]:
    """Runs `edmem evaluate` for real on the released files it names: its JSON scores, stderr and record count."""
    from edmem_hf.cli import main

    count = _released_files(argv[1:], workdir)
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's error
        code = exit_.code
    out, err = capsys.readouterr()
    _require(code == 0, f"exit {code}: {err}")
    _require("--json" in argv, "the test reads the scores from --json")
    return json.loads(out), err, count


@pytest.mark.parametrize("case", [case for case, _ in EVALUATE], ids=[id_ for _, id_ in EVALUATE])
def test_the_evaluate_commands_run_on_the_released_files(case, tmp_path, monkeypatch, capsys):
    page, block, command = case
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    set_page_variables(page, tmp_path, monkeypatch)
    argv = expanded(command)[1:]
    scores, err, count = _at(page, block, command, lambda: _evaluate(argv, tmp_path, capsys))
    assert scores["count"] == count
    if "--answer-links" in argv:
        assert scores["count_entity"] + scores["count_non_entity"] == count
    if "--aliases" in argv:
        assert scores["count_entity_coverage"] > 0
    if "--bertscore-model" in argv:  # reported when the model is in the local cache, else one line says why not
        model = argv[argv.index("--bertscore-model") + 1]
        if isinstance(try_to_load_from_cache(model, "config.json"), str):
            assert 0 < scores["bertscore_f1"] <= 100 and not err
        else:
            assert "bertscore_f1" not in scores
            assert err == f"edmem evaluate: BERTScore not reported: the model {model!r} is not available offline " + (
                "(no model directory or cached copy of that name)\n"
            )


# --- options named in prose ----------------------------------------------------------------------------------

CODE_SPAN = re.compile(r"`([^`\n]+)`")
OPTION = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")
HEADING = re.compile(r"^#{1,6} .*$", re.M)
# Options of programs outside this project, named in prose: (page, option) -> whose option it is.
FOREIGN_OPTIONS = {("convert_original.md", "--lower_decoder_attn"): "the authors' training script"}


class _Stop(Exception):
    """Raised by the final parse of a program whose options are being collected."""


def _collected_options(run) -> frozenset[str]:
    """Every option string of the parsers `run()` parses with: pre-parsers (`parse_known_args`, as the fine-tuning
    scripts' `--objective`) parse, given a value for each required option, and the program goes on; the final
    parse (`parse_args`, `parse_args_into_dataclasses`) stops it."""
    parsers = []
    originals = (argparse.ArgumentParser.parse_known_args, argparse.ArgumentParser.parse_args)
    into_dataclasses, argv = HfArgumentParser.parse_args_into_dataclasses, sys.argv

    def pre_parse(self, args=None, namespace=None):
        parsers.append(self)
        args = list(sys.argv[1:] if args is None else args)
        for action in self._actions:  # a value for each required option, that the program may go on
            if action.required and action.option_strings:
                args += [action.option_strings[0], str(next(iter(action.choices)) if action.choices else "x")]
        return originals[0](self, args, namespace)

    def final_parse(self, *args, **kwargs):
        parsers.append(self)
        raise _Stop

    argparse.ArgumentParser.parse_known_args = pre_parse
    argparse.ArgumentParser.parse_args = final_parse
    HfArgumentParser.parse_args_into_dataclasses = final_parse
    try:
        run()
    except _Stop:
        pass
    finally:
        argparse.ArgumentParser.parse_known_args, argparse.ArgumentParser.parse_args = originals
        HfArgumentParser.parse_args_into_dataclasses, sys.argv = into_dataclasses, argv
    _require(parsers, "the program parsed no arguments")
    return frozenset(option for parser in parsers for option in parser._option_string_actions)


@functools.cache
def program_options(program: tuple) -> frozenset[str]:
    """The options a program accepts: ("edmem", command), ("accelerate",), ("torchrun",) or ("script", path)."""
    if program[0] == "edmem":
        from edmem_hf.cli import COMMANDS

        module = importlib.import_module(COMMANDS[program[1]][0])
        return _collected_options(lambda: module.cli_main([]))
    if program[0] == "accelerate":
        from accelerate.commands.launch import launch_command_parser

        return frozenset(launch_command_parser()._option_string_actions)
    if program[0] == "torchrun":
        from torch.distributed.run import get_args_parser

        return frozenset(get_args_parser()._option_string_actions)
    return _collected_options(lambda: _script([str(program[1].relative_to(ROOT))]))


def _script_path(word: str) -> Path | None:
    """A script of the project named in prose: its path from the root, or only its file name."""
    if not word.endswith(".py"):
        return None
    if (ROOT / word).is_file():
        return ROOT / word
    found = [path for folder in ("examples", "benchmarks") for path in (ROOT / folder).rglob(Path(word).name)]
    return found[0] if len(found) == 1 else None


def programs_and_options(words: list[str]) -> list[tuple[tuple, list[str]]]:
    """The programs a command line (or a piece of prose) names, each with the options written after it."""
    found: list[tuple[tuple, list[str]]] = []
    position = 0
    while position < len(words):
        word, following = words[position], words[position + 1 : position + 2]
        program = None
        if word in ("edmem", "edmem_hf.cli") and following and not following[0].startswith("-"):  # not a value
            program, position = ("edmem", following[0]), position + 1
        elif word == "accelerate" and following == ["launch"]:
            program, position = ("accelerate",), position + 1
        elif word == "torchrun":
            program = ("torchrun",)
        elif (path := _script_path(word)) is not None:
            program = ("script", path)
        if program is not None:
            found.append((program, []))
        elif found and OPTION.fullmatch(option := word.split("=")[0]):
            found[-1][1].append(option)
        position += 1
    return found


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:  # an unbalanced quote in prose
        return text.split()


def prose_options(page: Path) -> tuple[set[tuple], list[tuple[str, str, list[tuple] | None]]]:
    """The programs a page runs or names, and `(code span, option, its programs)` for each option named in a code
    span of its prose: the programs are the span's own when it names one (`edmem pretrain --preset`), else None."""
    text = page.read_text(encoding="utf-8")
    programs = set()
    for language, block in fences(page):
        if language == "bash":
            for line in block.replace("\\\n", " ").splitlines():
                programs |= {program for program, _ in programs_and_options(_words(line.split(" #")[0]))}
    prose = FENCE.sub("", text)
    options = []
    for span in CODE_SPAN.findall(prose):
        named = programs_and_options(_words(span))
        programs |= {program for program, _ in named}
        if named:
            options += [(span, option, [program]) for program, written in named for option in written]
        else:
            options += [(span, option, None) for option in OPTION.findall(span)]
    return programs, options


def _name(program: tuple) -> str:
    return str(program[1].relative_to(ROOT)) if program[0] == "script" else " ".join(program)


def unknown_prose_options(page: Path) -> list[str]:
    """The options named in the prose of a page that the program they belong to does not accept: the program the
    code span names, else any program the page runs or names."""
    programs, options = prose_options(page)
    unknown = []
    for span, option, own in options:
        if (page.name, option) in FOREIGN_OPTIONS:
            continue
        candidates = own or sorted(programs, key=_name)
        if not any(option in program_options(program) for program in candidates):
            tried = ", ".join(_name(program) for program in candidates) or "no program"
            unknown.append(f"`{span}`: {option} is not an option of {tried}")
    return unknown


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_options_named_in_prose_are_accepted(page, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    unknown = unknown_prose_options(page)
    assert not unknown, f"{page.relative_to(ROOT)}:\n  " + "\n  ".join(unknown)


def test_a_wrong_option_in_prose_is_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\nedmem build-corpus --dump d.xml --out c/\n```\n"
        "`--passage_overlap N` (`--passage-stride`), `--passage_stride`; `edmem pretrain --max_grad_norm`, "
        "`edmem pretrain --num_proc`; `python benchmarks/bench_training_throughput.py --d-model 1024 --d_model 4`; "
        "`python benchmarks/qa_tuning.py --system edmem --settings dropout_0 --sytem edmem`\n"  # edmem: a value here
    )
    assert unknown_prose_options(page) == [
        "`--passage_stride`: --passage_stride is not an option of "
        "benchmarks/bench_training_throughput.py, benchmarks/qa_tuning.py, edmem build-corpus, edmem pretrain",
        "`edmem pretrain --num_proc`: --num_proc is not an option of edmem pretrain",
        "`python benchmarks/bench_training_throughput.py --d-model 1024 --d_model 4`: --d_model is not an option "
        "of benchmarks/bench_training_throughput.py",
        "`python benchmarks/qa_tuning.py --system edmem --settings dropout_0 --sytem edmem`: --sytem is not an option "
        "of benchmarks/qa_tuning.py",
    ]


def test_the_design_page_lists_every_module():
    """docs/design.md's table of stages names every module and package of `src/edmem_hf/`."""
    package = ROOT / "src" / "edmem_hf"
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    table = text[: text.index("\n## ")]
    modules = {path.name for path in package.glob("*.py") if path.name != "__init__.py"}
    modules |= {
        f"metrics/{path.name}/"
        for path in (package / "metrics").iterdir()
        if path.is_dir() and not path.name.startswith("_")
    }
    assert modules, package
    assert not {name for name in modules if f"`{name}`" not in table}

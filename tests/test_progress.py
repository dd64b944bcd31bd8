"""What a user sees while a command runs: progress on a terminal (a bar) and in a log (a line every few seconds with
the step, the loss and the time left); no DeepSpeed line where DeepSpeed was not asked for, no Trainer "share your
model" line, no Transformers or `datasets` bars beside a command's own progress, in a log or on a terminal. `edmem demo`'s own output is checked in test_demo.py."""

from __future__ import annotations

import importlib.util
import inspect
import io
import logging
import os
import re
import subprocess
import sys

import pytest

from edmem_hf.progress import TrainingProgress, library_progress_bars_off

sys.path.insert(0, os.path.dirname(__file__))
from test_collator import make_corpus  # noqa: E402
from test_pretraining import TINY  # noqa: E402

LINE = re.compile(
    r"^pretrain: step (\d+)/(\d+) \((\d+)%\), loss (\d+\.\d{3}), (\d+:\d\d) elapsed(?:, about (\d+:\d\d) left)?$"
)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_lines_with_step_loss_and_time_left():
    log = io.StringIO()  # not a terminal
    with TrainingProgress(6, "pretrain", every_seconds=0, stream=log) as progress:
        for step in range(1, 7):
            progress.update(step, loss=10.0 - step)
    lines = log.getvalue().splitlines()
    assert lines[0] == "pretrain: 6 steps to go (from step 0 of 6)"
    matches = [LINE.match(line) for line in lines[1:]]
    assert all(matches) and [int(m[1]) for m in matches] == [1, 2, 3, 4, 5, 6], lines
    assert [m[4] for m in matches] == ["9.000", "8.000", "7.000", "6.000", "5.000", "4.000"]
    assert all(m[6] for m in matches[:-1]) and matches[-1][6] is None  # the time left, until the end
    assert "\r" not in log.getvalue()


def test_a_log_line_comes_every_few_seconds_not_every_step(monkeypatch):
    now = [0.0]
    monkeypatch.setattr("edmem_hf.progress.time.perf_counter", lambda: now[0])
    log = io.StringIO()
    progress = TrainingProgress(100, "pretrain", every_seconds=10, stream=log)
    for step in range(1, 101):
        now[0] = step * 0.5  # a step every half second: a line every 20 steps, and one at the end
        progress.update(step, loss=1.0)
    steps = [int(m[1]) for m in map(LINE.match, log.getvalue().splitlines()[1:])]
    assert steps == [20, 40, 60, 80, 100]
    assert "pretrain: step 20/100 (20%), loss 1.000, 0:10 elapsed, about 0:40 left" in log.getvalue()


def test_a_terminal_gets_a_bar():
    terminal = _Terminal()
    with TrainingProgress(4, "pretrain", stream=terminal) as progress:
        for step in range(1, 5):
            progress.update(step, loss=2.5)
    shown = terminal.getvalue()
    assert "\r" in shown and "pretrain: 100%" in shown and "4/4" in shown and "loss=2.500" in shown
    assert not LINE.search(shown)
    terminal = _Terminal()
    TrainingProgress(4, "pretrain", bar=False, stream=terminal).update(4)  # --disable_tqdm: lines instead
    assert "pretrain: step 4/4 (100%)" in terminal.getvalue() and "\r" not in terminal.getvalue()


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed")
def test_edmem_pretrain_in_a_log_shows_progress_and_no_deepspeed_line(tmp_path):
    """A fresh process, as a user runs it, writing to a log (not a terminal): lines of progress throughout, and
    not DeepSpeed's "Setting accelerator to CPU" (Accelerate imports DeepSpeed to unwrap the model)."""
    corpus = make_corpus(tmp_path / "corpus", n_train=32, n_validation=8)
    argv = ["--output_dir", str(tmp_path / "run"), "--corpus_dir", corpus, "--max_steps", "4", "--logging_steps", "1"]
    argv += ["--report_to", "none", "--per_device_train_batch_size", "4", "--progress_seconds", "0"]
    argv += [f"--{key}={value}" for key, value in TINY.items()]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env.pop("ACCELERATE_USE_DEEPSPEED", None)
    run = subprocess.run(
        [sys.executable, "-m", "edmem_hf.cli", "pretrain", *argv], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    steps = [int(m[1]) for m in map(LINE.match, run.stderr.splitlines()) if m]
    assert steps == [1, 2, 3, 4], run.stderr
    assert "pretrain: step 3/4 (75%), loss" in run.stderr and " left" in run.stderr
    assert "Setting accelerator" not in run.stdout + run.stderr
    assert "\r" not in run.stderr and "Writing model shards" not in run.stderr  # no bar in a log, ours or theirs


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed")
@pytest.mark.parametrize("asked", [False, True])
def test_the_deepspeed_accelerator_line_shows_only_where_deepspeed_is_asked_for(asked):
    """Importing DeepSpeed on a machine without a GPU warns "Setting accelerator to CPU": after `import edmem_hf`,
    only when this process was asked to run DeepSpeed (ACCELERATE_USE_DEEPSPEED, as `accelerate launch` with a
    DeepSpeed config sets it)."""
    code = "import edmem_hf, torch\nfrom accelerate.utils import extract_model_from_parallel\n"
    code += "extract_model_from_parallel(torch.nn.Linear(1, 1))\nimport sys; assert 'deepspeed' in sys.modules\n"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env.pop("ACCELERATE_USE_DEEPSPEED", None)
    if asked:
        env["ACCELERATE_USE_DEEPSPEED"] = "true"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert ("Setting accelerator to CPU" in run.stdout + run.stderr) == asked


def test_the_trainer_share_your_model_line_is_dropped_and_nothing_else():
    import transformers.trainer

    # the Trainer still says it, through its module's logger (else the filter is dead code)
    assert "Do not forget to share your model" in inspect.getsource(transformers.trainer.Trainer)
    trainer_logger = transformers.trainer.logger
    assert trainer_logger is logging.getLogger("transformers.trainer")
    seen = io.StringIO()
    handler = logging.StreamHandler(seen)
    trainer_logger.addHandler(handler)
    level = trainer_logger.level
    trainer_logger.setLevel(logging.INFO)
    try:
        trainer_logger.info(
            "\n\nTraining completed. Do not forget to share your model on huggingface.co/models =)\n\n"
        )
        trainer_logger.info("***** Running training *****")
    finally:
        trainer_logger.removeHandler(handler)
        trainer_logger.setLevel(level)
    assert "Do not forget" not in seen.getvalue() and "Running training" in seen.getvalue()


def test_library_bars_are_off_while_a_command_runs_and_back_on_after(monkeypatch):
    """Off inside every `edmem` command (on a terminal too: issue 66), turned back on when it returns, so that a
    program calling `edmem_hf.cli.main` keeps its own bars; importing edmem_hf changes nothing (a fresh process)."""
    import types

    import datasets
    from transformers.utils import logging as transformers_logging

    from edmem_hf import cli

    def bars_on() -> tuple[bool, bool]:
        return datasets.is_progress_bar_enabled(), transformers_logging.is_progress_bar_enabled()

    seen = []
    command = types.ModuleType("edmem_probe_command")
    command.cli_main = lambda argv: seen.append(bars_on()) or 0
    monkeypatch.setitem(sys.modules, command.__name__, command)
    monkeypatch.setitem(cli.COMMANDS, "probe", (command.__name__, "records whether the library bars are on"))
    transformers_logging.enable_progress_bar()
    datasets.enable_progress_bars()
    try:
        assert cli.main(["probe"]) == 0
        assert seen == [(False, False)] and bars_on() == (True, True)
        with library_progress_bars_off():
            assert bars_on() == (False, False)
            transformers_logging.disable_progress_bar()
        assert bars_on() == (True, True)
        datasets.disable_progress_bars()  # a program's own choice stays as it was
        with library_progress_bars_off():
            pass
        assert bars_on() == (False, True)
    finally:
        transformers_logging.enable_progress_bar()
        datasets.enable_progress_bars()
    code = "import datasets, edmem_hf, edmem_hf.cli\nfrom transformers.utils import logging\n"
    code += "assert datasets.is_progress_bar_enabled() and logging.is_progress_bar_enabled()\n"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]


def _run_on_a_terminal(command: list[str], columns: int = 120) -> tuple[int, str]:
    """`command` in a fresh process whose stdout and stderr are a pseudo-terminal `columns` wide: its return code
    and everything it showed there (read while it runs, so that it never waits on a full terminal)."""
    import pty
    import select
    import termios

    controller, terminal = pty.openpty()
    termios.tcsetwinsize(terminal, (40, columns))
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    try:
        process = subprocess.Popen(command, stdout=terminal, stderr=terminal, env=env)
        os.close(terminal)
        chunks = []
        while True:
            if select.select([controller], [], [], 0.5)[0]:
                try:
                    chunks.append(os.read(controller, 65536))
                except OSError:  # the process has ended and closed the terminal's last copy
                    break
            elif process.poll() is not None:
                break
        return process.wait(timeout=300), b"".join(chunks).decode(errors="replace")
    finally:
        os.close(controller)


def test_edmem_pretrain_on_a_terminal_shows_its_bar_and_no_library_bars(tmp_path):
    """On a terminal, `edmem pretrain` draws its own bar, and not Transformers' `Writing model shards` (nor any
    other library bar) beside it (issue 66)."""
    corpus = make_corpus(tmp_path / "corpus", n_train=32, n_validation=8)
    argv = ["--output_dir", str(tmp_path / "run"), "--corpus_dir", corpus, "--max_steps", "4", "--report_to", "none"]
    argv += ["--per_device_train_batch_size", "4", *(f"--{key}={value}" for key, value in TINY.items())]
    returncode, shown = _run_on_a_terminal([sys.executable, "-m", "edmem_hf.cli", "pretrain", *argv])
    assert returncode == 0, shown[-3000:]
    assert "pretrain: 100%" in shown and "4/4" in shown and "\r" in shown  # its bar
    bars = {line.split(":")[0] for line in re.split(r"[\r\n]+", shown) if "%|" in line}
    assert bars == {"pretrain"}, bars  # a tqdm bar draws `desc:  25%|...`
    assert "Writing model shards" not in shown


def _read_everything_written(controller: int) -> str:
    """A pseudo-terminal hands over what each write put there, not all of it at once: read until nothing is left."""
    import os
    import select

    chunks = []
    while select.select([controller], [], [], 0.5)[0]:
        chunks.append(os.read(controller, 4096))
    return b"".join(chunks).decode()


def test_a_terminal_of_no_width_gets_progress_lines():
    """A pseudo-terminal of 0 columns (a terminal of unknown width) would show a tqdm bar as nothing at all: it gets
    the lines a log gets (issue 66)."""
    import os
    import pty

    from edmem_hf.progress import TrainingProgress, is_terminal

    controller, terminal = pty.openpty()
    try:
        with os.fdopen(terminal, "w", closefd=False) as stream:
            assert stream.isatty() and os.get_terminal_size(terminal).columns == 0
            assert not is_terminal(stream)
            with TrainingProgress(10, "pretrain", stream=stream) as progress:
                assert progress.bar is None
                progress.update(10, loss=1.5)
        shown = _read_everything_written(controller)
        assert "pretrain: 10 steps to go" in shown and "step 10/10" in shown
    finally:
        os.close(controller)
        os.close(terminal)

"""Training progress a user sees: a tqdm bar on a terminal, and a line every few seconds (step, loss, time left) in
a log that is not one. `TrainingProgress` serves `edmem pretrain`'s loop; `show_training_progress(trainer)` puts
the same display on a Transformers `Trainer` in place of its own (a bar on a terminal, else a print of each log
dict with its numbers formatted as strings). `library_progress_bars_off()` keeps the bars of `datasets` and
Transformers out of a command's output while it runs.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from transformers.trainer_utils import has_length

PROGRESS_LINE_SECONDS = 10.0  # off a terminal: a progress line at most this often


def is_terminal(stream: TextIO) -> bool:
    """Whether `stream` is a terminal a bar can be drawn on: one of unknown or no width (a pseudo-terminal of 0
    columns, which tqdm draws nothing on) gets progress lines instead."""
    isatty = getattr(stream, "isatty", None)
    if not (isatty and isatty()):
        return False
    try:
        return os.get_terminal_size(stream.fileno()).columns > 0
    except (AttributeError, OSError, ValueError):  # a stream without a file (a test's), or no size to read
        return True


@contextlib.contextmanager
def library_progress_bars_off() -> Iterator[None]:
    """While inside, no bars of `datasets` (`Map`, `Saving the dataset`) or of Transformers (`Loading weights`,
    `Writing model shards`): a command's own progress is what its user reads, on a terminal as in a log. Each is
    turned back on afterwards if it was on, so that a program calling a command keeps its bars. A download from the
    Hub keeps its bar on a terminal: a wait the user should see."""
    import datasets
    import huggingface_hub.utils as hub_utils
    from transformers.utils import logging as transformers_logging

    datasets_bars = datasets.is_progress_bar_enabled()
    transformers_bars = transformers_logging.is_progress_bar_enabled()
    download_bars = not hub_utils.are_progress_bars_disabled() and is_terminal(sys.stderr)
    datasets.disable_progress_bars()
    transformers_logging.disable_progress_bar()  # which turns the Hub's bars off too
    if download_bars:
        hub_utils.enable_progress_bars()
    try:
        yield
    finally:
        if datasets_bars:
            datasets.enable_progress_bars()
        if transformers_bars:
            transformers_logging.enable_progress_bar()


def _clock(seconds: float) -> str:
    """`1:05` for 65 seconds, `1:02:05` past an hour."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class TrainingProgress:
    """Progress of `total` optimizer steps under the name `desc`: a tqdm bar when `stream` (default: stderr) is a
    terminal and `bar` is not False, else a first line, then a line at most every `every_seconds` and one at the
    last step, with the step, the latest loss and the time left (estimated from the steps of this run):

        pretrain: step 120/600 (20%), loss 2.345, 0:25 elapsed, about 1:40 left

    `enabled=False` shows nothing (the other processes of a distributed run).
    """

    def __init__(
        self,
        total: int,
        desc: str,
        initial: int = 0,
        enabled: bool = True,
        bar: bool | None = None,
        every_seconds: float = PROGRESS_LINE_SECONDS,
        stream: TextIO | None = None,
    ):
        self.total, self.desc, self.initial, self.step = total, desc, initial, initial
        self.enabled, self.every_seconds = enabled, every_seconds
        self.stream = stream if stream is not None else sys.stderr
        self.loss: float | None = None
        self.started = self.last_line = time.perf_counter()
        self.bar = None
        if enabled and (bar is not False and is_terminal(self.stream)):
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=desc, file=self.stream)
        elif enabled:
            self._line(f"{desc}: {total - initial} steps to go (from step {initial} of {total})")

    def update(self, step: int, loss: float | None = None) -> None:
        """The run is at optimizer step `step`; `loss`, if given, is the latest training loss."""
        if loss is not None:
            self.loss = float(loss)
        if not self.enabled:
            return
        advanced, self.step = step - self.step, step
        if self.bar is not None:
            self.bar.update(advanced)
            if loss is not None:
                self.bar.set_postfix(loss=f"{self.loss:.3f}")
            return
        now = time.perf_counter()
        if advanced and (now - self.last_line >= self.every_seconds or step >= self.total):
            self.last_line = now
            self._line(self.status(now))

    def status(self, now: float | None = None) -> str:
        """`desc: step S/T (P%), loss L, E elapsed, about R left`."""
        elapsed = (time.perf_counter() if now is None else now) - self.started
        parts = [f"{self.desc}: step {self.step}/{self.total} ({100 * self.step / max(self.total, 1):.0f}%)"]
        if self.loss is not None:
            parts.append(f"loss {self.loss:.3f}")
        parts.append(f"{_clock(elapsed)} elapsed")
        taken = self.step - self.initial
        if taken > 0 and self.step < self.total:
            parts.append(f"about {_clock(elapsed / taken * (self.total - self.step))} left")
        return ", ".join(parts)

    def write(self, message: str) -> None:
        """A message between the bar's updates, or a line of the log."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(message, file=self.stream)
        else:
            self._line(message)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> TrainingProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _line(self, message: str) -> None:
        sys.stdout.flush()  # what was printed before comes first in a log that holds both
        print(message, file=self.stream, flush=True)


class TrainingProgressCallback(TrainerCallback):
    """A `Trainer`'s progress as `TrainingProgress` shows it, that of each evaluation too, and evaluation results as
    a line of numbers (during training or after it)."""

    def __init__(self, desc: str = "fine-tune", **progress_options: Any):
        self.desc, self.options = desc, progress_options
        self.progress: TrainingProgress | None = None
        self.evaluation: TrainingProgress | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.progress = TrainingProgress(
            state.max_steps, self.desc, state.global_step, enabled=state.is_local_process_zero, **self.options
        )

    def on_step_end(self, args, state, control, **kwargs):
        if self.progress is not None:
            self.progress.update(state.global_step)

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        if self.evaluation is None:
            batches = len(eval_dataloader) if has_length(eval_dataloader) else 0
            self.evaluation = TrainingProgress(
                batches, f"{self.desc} evaluation", enabled=state.is_local_process_zero, **self.options
            )
        self.evaluation.update(self.evaluation.step + 1)

    def on_evaluate(self, args, state, control, **kwargs):
        if self.evaluation is not None:
            self.evaluation.close()
            self.evaluation = None

    on_predict = on_evaluate

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs:
            return
        if "loss" in logs and self.progress is not None:
            self.progress.loss = float(logs["loss"])
        scores = {key: value for key, value in logs.items() if key.startswith(("eval_", "test_"))}
        if not scores:
            return
        self.on_evaluate(args, state, control)  # the evaluation is over: its progress ends before its scores
        line = f"{self.desc}: step {state.global_step}: " + ", ".join(
            f"{key} {value:.4g}" for key, value in scores.items()
        )
        if self.progress is not None:
            self.progress.write(line)
        elif state.is_local_process_zero:  # an evaluation after training, or without any
            sys.stdout.flush()
            print(line, file=self.options.get("stream") or sys.stderr, flush=True)

    def on_train_end(self, args, state, control, **kwargs):
        if self.progress is not None:
            self.progress.close()
            self.progress = None


def show_training_progress(trainer: Any, desc: str = "fine-tune", **progress_options: Any) -> TrainingProgressCallback:
    """Replaces a Transformers `Trainer`'s progress display (its bar, or its print of each log dict with the numbers
    as strings) with a `TrainingProgressCallback`; returns it."""
    for shown in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(shown)
    callback = TrainingProgressCallback(desc, **progress_options)
    trainer.add_callback(callback)
    return callback


__all__ = [
    "PROGRESS_LINE_SECONDS",
    "TrainingProgress",
    "TrainingProgressCallback",
    "is_terminal",
    "library_progress_bars_off",
    "show_training_progress",
]

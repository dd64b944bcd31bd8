"""The third-party notices a user did not ask for, kept out of what the commands print.

`quiet_third_party_notices()` runs when `edmem_hf` is imported: it filters two notices by their text, on their
own loggers, and leaves every other record of those loggers alone. (The progress bars of `datasets` and
Transformers are off while an `edmem` command runs: `progress.library_progress_bars_off`.)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable


def deepspeed_requested() -> bool:
    """Whether this process was asked to run DeepSpeed: `accelerate launch` with a DeepSpeed config, an
    `Accelerator` given a DeepSpeed plugin and `TrainingArguments(deepspeed=...)` all set ACCELERATE_USE_DEEPSPEED."""
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() in ("true", "1", "yes")


class NoticeFilter(logging.Filter):
    """Drops the records whose message holds one of `phrases` while `applies()` is true; keeps every other."""

    def __init__(self, phrases: tuple[str, ...], applies: Callable[[], bool] = lambda: True):
        super().__init__()
        self.phrases, self.applies = phrases, applies

    def filter(self, record: logging.LogRecord) -> bool:
        return not (any(phrase in record.getMessage() for phrase in self.phrases) and self.applies())


# logger name -> (phrases, when they are dropped)
NOTICES: dict[str, tuple[tuple[str, ...], Callable[[], bool]]] = {
    # Accelerate's `unwrap_model` (called by our loop and by the Trainer) imports DeepSpeed whenever it is installed,
    # to recognise a DeepSpeed engine; DeepSpeed's import looks for a GPU and warns on a machine without one.
    "DeepSpeed": (("Setting accelerator to CPU",), lambda: not deepspeed_requested()),
    # The Trainer's INFO line at the end of every training.
    "transformers.trainer": (("Do not forget to share your model",), lambda: True),
}


def quiet_third_party_notices() -> None:
    """Puts a `NoticeFilter` on each logger of `NOTICES` (once)."""
    for name, (phrases, applies) in NOTICES.items():
        logger = logging.getLogger(name)
        if not any(isinstance(existing, NoticeFilter) for existing in logger.filters):
            logger.addFilter(NoticeFilter(phrases, applies))


__all__ = [
    "NOTICES",
    "NoticeFilter",
    "deepspeed_requested",
    "quiet_third_party_notices",
]

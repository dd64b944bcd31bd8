"""Command-line parsing shared by the `edmem` commands: Transformers' `HfArgumentParser` with help texts that say
what a user needs to know, and no more."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

from transformers import HfArgumentParser


class CommandHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """`(default: X)` only where there is a default to show: not on a required option (it has none), on an option
    left unset by default (`None`, empty: its help says what happens then) or on a `--no_X` switch."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        unset = action.default is None or (isinstance(action.default, (str, list)) and not action.default)
        if action.required or unset or isinstance(action, argparse._StoreFalseAction):
            return action.help
        return super()._get_help_string(action)


class CommandArgumentParser(HfArgumentParser):
    """`HfArgumentParser` for an `edmem` command. Each boolean option that is on by default gets a `--no_X` switch
    from `HfArgumentParser`, with a copy of the help of `--X`: here `negations[X]` describes it instead (what
    turning it off does), or "Turn --X off." where none is given."""

    def __init__(self, dataclass_types: Any, negations: Mapping[str, str] | None = None, **kwargs: Any):
        kwargs.setdefault("formatter_class", CommandHelpFormatter)
        kwargs.setdefault("allow_abbrev", False)  # `--learning_rat` is an error, not `--learning_rate`
        super().__init__(dataclass_types, **kwargs)
        negations = dict(negations or {})
        switches = [action for action in self._actions if isinstance(action, argparse._StoreFalseAction)]
        for switch in switches:
            switch.help = negations.pop(switch.dest, f"Turn --{switch.dest} off.")
        if negations:
            raise ValueError(f"negations of no boolean option that is on by default: {sorted(negations)}")


def hub_offline() -> bool:
    """Whether the Hub is not to be asked (`HF_HUB_OFFLINE` set, as `huggingface_hub` reads it)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def missing_model(name: str) -> str | None:
    """Why `name` (a `--model_name_or_path` or a tokenizer) is neither a folder here nor a repository of the Hub, in a
    few words, or None when it is one of them: asked before anything loads it, so that a mistyped folder is one line,
    not a download's retries and traceback. A name that can only be a path (absolute, `./`, `~`, two slashes or more),
    or any name offline, is not looked up on the Hub; online the Hub is asked once."""
    if os.path.isdir(os.path.expanduser(name)):
        return None
    if os.path.exists(name):
        return "a file, not a model folder"
    if os.path.isabs(name) or name.startswith((".", "~")) or name.count("/") > 1:
        return "no such folder"
    if hub_offline():
        return "no such folder (and HF_HUB_OFFLINE is set: the Hub is not asked)"
    from huggingface_hub import repo_exists

    try:
        found = repo_exists(name)
    except Exception as error:  # no network, a name the Hub refuses: one line either way
        return f"no such folder, and the Hub could not say whether it has such a model ({type(error).__name__})"
    return None if found else "no such folder, and no such model on the Hub"


class CommandParser(argparse.ArgumentParser):
    """`argparse.ArgumentParser` for an `edmem` command written without dataclasses: every `--long-option` is also
    accepted in the other spelling (`--answer-links` and `--answer_links`, as `HfArgumentParser` does for the
    others), and an option is never guessed from a prefix."""

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(**kwargs)

    def add_argument(self, *names: str, **kwargs: Any) -> argparse.Action:
        spelled = list(names)
        for name in names:
            if name.startswith("--"):
                for other in (name[:2] + name[2:].replace("-", "_"), name[:2] + name[2:].replace("_", "-")):
                    if other not in spelled:
                        spelled.append(other)
        return super().add_argument(*spelled, **kwargs)


__all__ = ["CommandArgumentParser", "CommandHelpFormatter", "CommandParser", "hub_offline", "missing_model"]

"""Command-line parsing shared by the `edmem` commands: Transformers' `HfArgumentParser` with help texts that say
what a user needs to know, and no more."""

from __future__ import annotations

import argparse
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
        super().__init__(dataclass_types, **kwargs)
        negations = dict(negations or {})
        switches = [action for action in self._actions if isinstance(action, argparse._StoreFalseAction)]
        for switch in switches:
            switch.help = negations.pop(switch.dest, f"Turn --{switch.dest} off.")
        if negations:
            raise ValueError(f"negations of no boolean option that is on by default: {sorted(negations)}")


__all__ = ["CommandArgumentParser", "CommandHelpFormatter"]

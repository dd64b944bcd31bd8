"""The `edmem` command: wires each sub-command to the `cli_main(argv)` of its stage's module."""

from __future__ import annotations

import importlib
import sys

from .progress import library_progress_bars_off

COMMANDS = {
    "build-corpus": ("edmem_hf.corpus", "Build linked passages, entity vocabulary and aliases from a MediaWiki dump."),
    "train-tokenizer": ("edmem_hf.tokenization", "Train (or extend) a byte-level BPE tokenizer with entity markers."),
    "pretrain": ("edmem_hf.pretraining", "Pre-train EDMem with Accelerate (resumable)."),
    "convert-original": (
        "edmem_hf.convert_original",
        "Convert the authors' EDMem checkpoint to this package's format.",
    ),
    "write-preset": ("edmem_hf.presets", "Write the edmem-base or edmem-large preset as a folder that loads offline."),
    "finetune": (
        "edmem_hf.finetuning",
        "Fine-tune on the paper's QA or generation tasks (the released files) with Seq2SeqTrainer; predict.",
    ),
    "evaluate": (
        "edmem_hf.evaluation",
        "Score predictions: exact match (QA); ROUGE, unigram F1, entity coverage, BERTScore (generation).",
    ),
    "add-entities": (
        "edmem_hf.research.add_entities_command",
        "Add the entities of new MediaWiki pages to a trained model's memory, without training.",
    ),
    "demo": ("edmem_hf.demo", "Run the whole path offline on a generated toy world."),
}


def _usage() -> str:
    lines = ["usage: edmem <command> [options]", "", "commands:"]
    lines += [f"  {name:<16} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `edmem <command> --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"edmem: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    with library_progress_bars_off():  # the command's own progress, not `Loading weights` or `Map` bars beside it
        return int(module.cli_main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())

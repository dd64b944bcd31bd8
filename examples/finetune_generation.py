"""Fine-tune EDMem on entity-intensive generation (the paper's CREAK, ELI5, Wizard of Wikipedia, MSMARCO):
`edmem finetune --task creak` as a script (`edmem_hf.finetuning`; docs/fine_tuning.md).

    python examples/finetune_generation.py --task creak --model_name_or_path MODEL --output_dir OUT \
        --train_file edmem_creak-train.jsonl --validation_file edmem_creak-dev.jsonl \
        --test_file edmem_creak-test.jsonl --do_train --do_eval --do_predict --entity_decoding dynamic
"""

from __future__ import annotations

import argparse
import sys

from edmem_hf.evaluation import GENERATION_TASKS
from edmem_hf.finetuning import run


def main(argv: list[str] | None = None) -> dict[str, float]:
    argv = list(sys.argv[1:] if argv is None else argv)
    picker = argparse.ArgumentParser(add_help=False)  # every option is run's; this one must name a generation task
    picker.add_argument("--task")
    task = picker.parse_known_args(argv)[0].task
    one_json_file = len(argv) == 1 and argv[0].endswith(".json")
    if task not in GENERATION_TASKS and not one_json_file and not {"-h", "--help"} & set(argv):
        sys.exit(f"finetune_generation.py: --task must name a generation task: one of {', '.join(GENERATION_TASKS)}")
    return run(argv=argv)


if __name__ == "__main__":
    main()

"""Fine-tune EDMem on entity-intensive generation (the paper's CREAK, ELI5, Wizard of Wikipedia, MSMARCO) with the
stock `Seq2SeqTrainer`.

    python examples/finetune_generation.py --task creak --model_name_or_path MODEL --output_dir OUT \
        --train_file edmem_creak-train.jsonl --validation_file edmem_creak-dev.jsonl \
        --test_file edmem_creak-test.jsonl --do_train --do_eval --do_predict --entity_decoding dynamic

Works as is under `accelerate launch` and `torchrun`. Evaluation reports ROUGE-1/2/L and unigram F1 (and what else
`edmem evaluate` reports for generation); `--do_predict` writes `OUT/<entity_decoding>_predictions.json`, scored by
`edmem evaluate --task creak --data ... --predictions ...`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from finetune_common import Task, run

from edmem_hf.evaluation import GENERATION_TASKS, generation_scores
from edmem_hf.tasks import encode_generation_record, read_generation


def scorer(task: str):
    def score(rows: list[dict], predictions: dict[str, str]) -> dict[str, float]:
        records = [
            {
                "id": row["id"],
                "input": row["input"],
                "output": row["outputs"],
                "entity_name": row["input_entity_names"],
                "output_entity_name": row["output_entity_names"],
            }
            for row in rows
        ]
        return generation_scores(records, predictions, strip_creak_verdict=task == "creak")

    return score


@dataclass
class GenerationArguments:
    task: str = field(
        metadata={
            "help": "the task of the files: its scores (CREAK: without its verdict)",
            "choices": GENERATION_TASKS,
        }
    )


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(add_help=False)  # picks the task; every option is parsed (and shown) by run
    parser.add_argument("--task", choices=GENERATION_TASKS)
    known, _ = parser.parse_known_args(argv)
    task = Task(
        read=read_generation,
        encode=encode_generation_record,
        score=scorer(known.task),
        defaults=dict(metric_for_best_model="rougeL", max_source_length=256, max_target_length=128),
    )
    return run(task, argv, extra_arguments=(GenerationArguments,))


if __name__ == "__main__":
    main()

"""Fine-tune EDMem on closed-book QA (the paper's NQ, WebQuestions, TriviaQA) with the stock `Seq2SeqTrainer`.

    python examples/finetune_qa.py --model_name_or_path MODEL --output_dir OUT \
        --train_file edmem_nq-train.jsonl --validation_file edmem_nq-dev.jsonl --test_file edmem_nq-test.jsonl \
        --do_train --do_eval --do_predict --entity_decoding dynamic --entity_candidates 5

Works as is under `accelerate launch` and `torchrun`. Evaluation reports exact match (and, where the file names
answer entities, exact match on entity and non-entity answers); `--do_predict` writes
`OUT/<entity_decoding>_predictions.json`, scored by `edmem evaluate --task nq --data ... --predictions ...`.

`--objective static_linking` instead trains the static setting's linker (paper, Section 3.3): on the questions whose
answer is an entity, the decoder reads the question then `<E_s>` and the entity-linking head learns the answer
entity. Pass it to a QA model's predictions with `--entity_decoding static --static_linker LINKER`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from finetune_common import Task, run

from edmem_hf.evaluation import qa_scores
from edmem_hf.tasks import IGNORE_INDEX, encode_qa_record, encode_static_linking_record, read_qa


def score_qa(rows: list[dict], predictions: dict[str, str]) -> dict[str, float]:
    records = [{"id": row["id"], "answer": row["answers"]} for row in rows]
    links = None
    if any(row["answer_entity"] != IGNORE_INDEX for row in rows):  # the file names answer entities
        links = {row["id"]: None if row["answer_entity"] == IGNORE_INDEX else [row["answer_entity"]] for row in rows}
    return qa_scores(records, predictions, answer_links=links)


# Training reads each question with one of its answers picked at random each time (TriviaQA: its `entity` answer),
# its linked spans marked, as the authors' reader does; evaluation and prediction score against every answer.
QA = Task(
    read=read_qa,
    encode=encode_qa_record,
    score=score_qa,
    defaults=dict(metric_for_best_model="exact_match"),
    resample=True,
)
STATIC_LINKING = Task(
    read=read_qa,
    encode=encode_static_linking_record,
    score=None,
    defaults=dict(metric_for_best_model="loss", greater_is_better=False, predict_with_generate=False),
    filter_rows=lambda row: row["answer_entity"] != IGNORE_INDEX,  # the others are left out of this objective
    resample=True,
)
OBJECTIVES = {"qa": QA, "static_linking": STATIC_LINKING}


@dataclass
class QAArguments:
    objective: str = field(
        default="qa",
        metadata={
            "help": "qa: generate the answer; static_linking: train the static setting's linker (the decoder reads "
            "the question then <E_s>, the entity-linking head learns the answer entity)",
            "choices": tuple(OBJECTIVES),
        },
    )


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(add_help=False)  # picks the task; every option is parsed (and shown) by run
    parser.add_argument("--objective", choices=tuple(OBJECTIVES), default="qa")
    known, _ = parser.parse_known_args(argv)
    return run(OBJECTIVES[known.objective], argv, extra_arguments=(QAArguments,))


if __name__ == "__main__":
    main()

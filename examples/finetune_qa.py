"""Fine-tune EDMem on closed-book QA (the paper's NQ, WebQuestions, TriviaQA): `edmem finetune --task qa` as a
script (`edmem_hf.finetuning`; docs/fine_tuning.md).

    python examples/finetune_qa.py --model_name_or_path MODEL --output_dir OUT \
        --train_file edmem_nq-train.jsonl --validation_file edmem_nq-dev.jsonl --test_file edmem_nq-test.jsonl \
        --do_train --do_eval --do_predict --entity_decoding dynamic --entity_candidates 5

`--objective static_linking` trains the static setting's linker instead.
"""

from __future__ import annotations

from edmem_hf.finetuning import QA, STATIC_LINKING, run  # noqa: F401  (QA: the task, for scripts of their own)


def main(argv: list[str] | None = None) -> dict[str, float]:
    return run(argv=argv)


if __name__ == "__main__":
    main()

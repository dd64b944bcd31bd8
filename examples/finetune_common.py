"""What `finetune_qa.py` and `finetune_generation.py` share: their arguments, the model and data set-up, the stock
`Seq2SeqTrainer` run, and predictions written as `{id: text}` JSON (markers kept, the authors' released format), so
that `edmem evaluate` scores ours and theirs alike.

The defaults are the paper's fine-tuning settings (Appendix C; its ranges in the help texts).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
import transformers
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    EarlyStoppingCallback,
    HfArgumentParser,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    set_seed,
)

import edmem_hf  # noqa: F401  (registers EDMem with the Auto classes)
from edmem_hf.generation_edmem import ENTITY_DECODING_MODES
from edmem_hf.tasks import EDMemSeq2SeqCollator, ResampledRows, strip_generation

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    model_name_or_path: str = field(metadata={"help": "a pre-trained or converted EDMem folder or Hub id"})
    tokenizer_name: str | None = field(default=None, metadata={"help": "defaults to model_name_or_path"})
    entity_loss_weight: float = field(default=1.0, metadata={"help": "lambda of LM + lambda * EL (paper: 0.5 to 2)"})
    dropout: float = field(default=0.1, metadata={"help": "dropout of the stacks and the memory (paper: 0.1 to 0.3)"})
    entity_decoding: str = field(
        default="free",
        metadata={"help": "how evaluation and prediction generate", "choices": ENTITY_DECODING_MODES},
    )
    entity_candidates: int = field(default=5, metadata={"help": "entities a mention may spell (paper: 1, 3 or 5)"})
    static_linker: str | None = field(
        default=None,
        metadata={
            "help": "static decoding: a separately fine-tuned linker (finetune_qa.py --objective static_linking)"
        },
    )
    early_stopping_patience: int = field(default=3, metadata={"help": "evaluations without improvement; 0 = off"})
    entity_mask_file: str | None = field(
        default=None,
        metadata={
            "help": "the paper's memory-size study: a torch-saved (N,) tensor, 1 where an entity is hidden from the "
            "memory and the entity-linking head (the format of the authors' get_memory_mask.py)"
        },
    )


@dataclass
class DataArguments:
    train_file: str | None = field(default=None, metadata={"help": "a released edmem_*.jsonl (or el_*.jsonl)"})
    validation_file: str | None = field(
        default=None,
        metadata={"help": "evaluated each epoch, the best model kept; without it neither (default strategies: no)"},
    )
    test_file: str | None = field(
        default=None, metadata={"help": "predicted with --do_predict: OUT/<entity_decoding>_predictions.json"}
    )
    max_source_length: int = field(default=64, metadata={"help": "input tokens (questions, inputs) kept"})
    max_target_length: int = field(default=64, metadata={"help": "target tokens kept; also max_new_tokens"})
    bad_records: str = field(
        default="raise",
        metadata={
            "help": "a bad link (outside its text, overlapping the one before): raise an error naming it, or skip "
            "the link and keep the record (the released files hold 9 such links)",
            "choices": ("raise", "skip"),
        },
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "train on the first N records"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "evaluate on the first N records"})


# The paper's settings where Seq2SeqTrainingArguments' defaults are not theirs (lr 5e-6 to 3e-5, beams 1/3/5).
PAPER_DEFAULTS = dict(
    learning_rate=1e-5,
    predict_with_generate=True,
    generation_num_beams=1,
    eval_strategy="epoch",
    save_strategy="epoch",
    save_total_limit=2,
    load_best_model_at_end=True,
    greater_is_better=True,
    remove_unused_columns=False,
    ddp_find_unused_parameters=False,  # every memory parameter takes part in every step (docs/model.md)
)


@dataclass
class Task:
    """What makes a task: its reader, its encoder into training features, its scores and its best-model metric."""

    read: Callable[..., Any]  # (path, entity_vocab, bad_records) -> datasets.Dataset
    encode: Callable[..., dict]  # (row, tokenizer, max_length) -> features
    score: Callable[[list[dict], dict[str, str]], dict[str, float]] | None  # (rows, {id: text}) -> metrics
    defaults: dict[str, Any]  # Seq2SeqTrainingArguments defaults of the task (e.g. metric_for_best_model)
    filter_rows: Callable[[dict], bool] | None = None
    resample: bool = False  # training encodes each row as it is read, with `encode(..., rng=random)`


# Without a validation file there is nothing to evaluate each epoch nor a best model to keep.
WITHOUT_VALIDATION = dict(eval_strategy="no", load_best_model_at_end=False)


def parse_arguments(task: Task, argv: list[str] | None = None, extra_arguments: tuple[type, ...] = ()):
    """`ModelArguments`, `DataArguments`, `Seq2SeqTrainingArguments` (then `extra_arguments`), from the command line
    or one JSON file of them, with the paper's defaults and the task's; every option with a fixed set of values,
    and every model folder, is checked here, before anything is loaded or trained."""
    parser = HfArgumentParser((ModelArguments, DataArguments, Seq2SeqTrainingArguments, *extra_arguments))
    argv = list(sys.argv[1:] if argv is None else argv)
    # a log file gets no progress bars, a terminal does
    defaults = {**PAPER_DEFAULTS, **task.defaults, "disable_tqdm": not sys.stderr.isatty()}
    if len(argv) == 1 and argv[0].endswith(".json"):
        given = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
        if not given.get("validation_file"):
            defaults |= WITHOUT_VALIDATION
        parsed = parser.parse_dict({**defaults, **given})
    else:
        if not any(arg == "--validation_file" or arg.startswith("--validation_file=") for arg in argv):
            defaults |= WITHOUT_VALIDATION
        parser.set_defaults(**defaults)
        parsed = parser.parse_args_into_dataclasses(args=argv)
    model_args, data_args, training_args = parsed[:3]
    for option, path in (
        ("--model_name_or_path", model_args.model_name_or_path),
        ("--tokenizer_name", model_args.tokenizer_name),
        ("--static_linker", model_args.static_linker),
    ):
        if path is not None and not os.path.isdir(path) and _names_a_folder(path):
            parser.error(f"{option} {path}: no such model folder")
    for option, path in (
        ("--train_file", data_args.train_file),
        ("--validation_file", data_args.validation_file),
        ("--test_file", data_args.test_file),
        ("--entity_mask_file", model_args.entity_mask_file),
    ):
        if path is not None and not os.path.isfile(path):
            parser.error(f"{option} {path}: no such file")
    if training_args.do_train and data_args.train_file is None:
        parser.error("--do_train needs --train_file")
    if training_args.do_predict and data_args.test_file is None:
        parser.error("--do_predict needs --test_file")
    if training_args.eval_strategy != "no" and data_args.validation_file is None:
        parser.error(
            f"--eval_strategy {training_args.eval_strategy.value} evaluates on --validation_file, which is not given: "
            "give one, or --eval_strategy no"
        )
    if training_args.generation_max_length is None:  # the decoder start token and max_target_length tokens
        training_args.generation_max_length = data_args.max_target_length + 1
    return parsed


def _names_a_folder(path: str) -> bool:
    """Whether a model path that does not exist can only have meant a local folder (not a Hub id `org/name`)."""
    return (
        os.path.isabs(path)
        or path.startswith((".", "~"))
        or path.count("/") > 1
        or os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")
    )


def run(task: Task, argv: list[str] | None = None, extra_arguments: tuple[type, ...] = ()) -> dict[str, float]:
    """Fine-tunes, evaluates and predicts as the arguments say; returns the metrics of the last step run."""
    model_args, data_args, training_args, *_ = parse_arguments(task, argv, extra_arguments)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    if training_args.should_log:  # the main process logs the Trainer's set-up and progress, as HF examples do
        transformers.utils.logging.set_verbosity_warning()  # not every config loaded
        transformers.utils.logging.get_logger("transformers.trainer").setLevel(logging.INFO)
    if training_args.disable_tqdm:  # and the bars of datasets' map and of writing the weights
        datasets.disable_progress_bars()
        transformers.utils.logging.disable_progress_bar()
    set_seed(training_args.seed)

    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name or model_args.model_name_or_path)
    dropouts = {name: model_args.dropout for name in ("dropout", "memory_dropout", "upper_input_dropout")}
    model = AutoModelForSeq2SeqLM.from_pretrained(
        model_args.model_name_or_path, entity_loss_weight=model_args.entity_loss_weight, **dropouts
    )
    if model.entity_vocab is None:
        raise ValueError(f"{model_args.model_name_or_path} has no entity_vocab.json: the readers map entities with it")
    if model_args.entity_mask_file:  # kept through training, evaluation and prediction (not saved with the model)
        model.set_entity_mask(torch.load(model_args.entity_mask_file, weights_only=True) == 0)
    model.generation_config.entity_decoding = model_args.entity_decoding
    model.generation_config.entity_candidates = model_args.entity_candidates
    if model_args.entity_decoding != "free":
        model.entity_trie(tokenizer)  # spelled once with this tokenizer, kept on the model for generate()

    def load(path: str | None, limit: int | None, training: bool = False):
        if path is None:
            return None, None
        rows = task.read(path, model.entity_vocab, bad_records=data_args.bad_records)
        if task.filter_rows is not None:
            rows = rows.filter(task.filter_rows)
        if limit is not None:
            rows = rows.select(range(min(limit, len(rows))))
        if training and task.resample:  # encoded as read, the answer picked afresh each time
            return rows, ResampledRows(
                rows, lambda row, rng: task.encode(row, tokenizer, data_args.max_source_length, rng=rng)
            )
        features = rows.map(
            lambda row: task.encode(row, tokenizer, data_args.max_source_length),
            remove_columns=rows.column_names,
            desc=f"encoding {Path(path).name}",
        )
        return rows, features

    _, train_features = load(
        data_args.train_file if training_args.do_train else None, data_args.max_train_samples, training=True
    )
    eval_rows, eval_features = load(
        data_args.validation_file if training_args.do_eval or training_args.do_train else None,
        data_args.max_eval_samples,
    )
    test_rows, test_features = load(data_args.test_file if training_args.do_predict else None, None)
    scored_rows = eval_rows

    def compute_metrics(prediction) -> dict[str, float]:
        texts = decode(tokenizer, prediction.predictions, len(scored_rows))
        return task.score(list(scored_rows), dict(zip(scored_rows["id"], texts)))

    callbacks = []
    if model_args.early_stopping_patience and eval_features is not None and training_args.load_best_model_at_end:
        callbacks.append(EarlyStoppingCallback(model_args.early_stopping_patience))
    trainer = Seq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=train_features,
        eval_dataset=eval_features,
        data_collator=EDMemSeq2SeqCollator(tokenizer.pad_token_id),
        processing_class=tokenizer,
        compute_metrics=compute_metrics if training_args.predict_with_generate and task.score else None,
        callbacks=callbacks,
    )
    metrics: dict[str, float] = {}
    if training_args.do_train:
        result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        trainer.save_model()
        trainer.log_metrics("train", result.metrics)
        trainer.save_metrics("train", result.metrics)
        metrics = result.metrics
    if training_args.do_eval and eval_features is not None:
        metrics = trainer.evaluate(metric_key_prefix="eval")
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
    if training_args.do_predict and test_features is not None:
        scored_rows = test_rows
        generation = {}
        if model_args.static_linker is not None:
            linker = AutoModelForSeq2SeqLM.from_pretrained(model_args.static_linker).eval()
            linker.set_entity_mask(model._get_entity_mask("cpu"))
            generation = dict(entity_linker=linker, static_linking_input="question")
        output = trainer.predict(test_features, metric_key_prefix="test", **generation)
        metrics = output.metrics
        trainer.log_metrics("test", metrics)
        trainer.save_metrics("test", metrics)
        if trainer.is_world_process_zero() and training_args.predict_with_generate:
            path = Path(training_args.output_dir) / f"{model_args.entity_decoding}_predictions.json"
            texts = decode(tokenizer, output.predictions, len(test_rows))
            path.write_text(json.dumps(dict(zip(test_rows["id"], texts)), ensure_ascii=False, indent=1))
            logger.info("predictions of %d examples written to %s", len(texts), path)
    return metrics


def decode(tokenizer: Any, token_ids: np.ndarray, count: int) -> list[str]:
    """Generated ids (padded with -100 across batches) -> the texts of the `count` examples, mention markers kept.
    A distributed evaluation pads its last batches with repeated examples: those rows come last and are dropped."""
    if len(token_ids) < count:
        raise ValueError(f"{len(token_ids)} generated rows for {count} examples")
    token_ids = np.where(token_ids[:count] == -100, tokenizer.pad_token_id, token_ids[:count])
    return [strip_generation(text, tokenizer) for text in tokenizer.batch_decode(token_ids)]

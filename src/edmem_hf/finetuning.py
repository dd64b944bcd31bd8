"""`edmem finetune`: fine-tune EDMem on the paper's tasks with the stock `Seq2SeqTrainer`, from the authors' released
files where they lie: closed-book QA (NQ, WebQuestions, TriviaQA; `--objective static_linking` trains the static
setting's linker) and entity-intensive generation (CREAK, ELI5, Wizard of Wikipedia, MSMARCO).

    edmem finetune --task wq --model_name_or_path MODEL --output_dir OUT --train_file edmem_wq-train.jsonl
        --test_file edmem_wq-test.jsonl --test_answer_links sling_invocab-test.json --do_train --do_predict

Every option of `Seq2SeqTrainingArguments` works, or one JSON file of them; the defaults are the paper's
fine-tuning settings (Appendix C; its ranges in the help texts). Evaluation reports the task's metrics; `--do_predict`
writes `OUT/<entity_decoding>_predictions.json` (`{id: text}`, markers kept: the authors' released format), which
`edmem evaluate` scores. Everything is written under `--output_dir`. Runs as is under `accelerate launch` and
`torchrun` (`-m edmem_hf.cli finetune ...`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping
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
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    set_seed,
)

from .arguments import CommandArgumentParser, CommandHelpFormatter, missing_model
from .configuration_edmem import IGNORE_INDEX
from .evaluation import GENERATION_TASKS, QA_TASKS, generation_scores, qa_scores, strip_generation
from .generation_edmem import ENTITY_DECODING_MODES
from .progress import show_training_progress
from .research.writer_batches import WriterCollator, freeze_the_writer
from .research.writer_training import WriterTrainingArguments
from .task_features import (
    EDMemSeq2SeqCollator,
    ResampledRows,
    encode_generation_record,
    encode_qa_record,
    encode_static_linking_record,
)
from .task_files import BAD_RECORDS, BadRecordError, read_answer_links, read_generation, read_qa

logger = logging.getLogger(__name__)

OBJECTIVES = ("qa", "static_linking")


@dataclass
class TaskArguments:
    task: str = field(
        default="qa",
        metadata={
            "help": "the task of the files: a QA task (exact match; qa: any QA file in the released format) or a "
            "generation task (ROUGE, F1, entity coverage; CREAK scored without its verdict)",
            "choices": QA_TASKS + GENERATION_TASKS,
        },
    )
    objective: str = field(
        default="qa",
        metadata={
            "help": "QA tasks: qa generates the answer; static_linking trains the static setting's linker (the "
            "decoder reads the question then <E_s>, the entity-linking head learns the answer entity)",
            "choices": OBJECTIVES,
        },
    )


@dataclass
class ModelArguments:
    model_name_or_path: str = field(
        metadata={
            "help": "a pre-trained or converted EDMem folder (or Hub id) with its tokenizer and entity_vocab.json"
        }
    )
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
        metadata={"help": "static decoding: a separately fine-tuned linker (--objective static_linking)"},
    )
    early_stopping_patience: int = field(default=3, metadata={"help": "evaluations without improvement; 0 = off"})
    entity_mask_file: str | None = field(
        default=None,
        metadata={
            "help": "the paper's memory-size study: a torch-saved (N,) tensor, 1 where an entity is hidden from the "
            "memory and the entity-linking head (the format of the authors' get_memory_mask.py)"
        },
    )
    writer_corpus: str | None = field(
        default=None,
        metadata={
            "help": "a model with a writer of entity rows: an `edmem build-corpus` folder whose passages write rows "
            "that training reads in place of a share of each batch's entities' rows (docs/model.md)"
        },
    )
    written_row_share: float = field(
        default=0.5, metadata={"help": "with --writer_corpus: the share of each batch's entities read through it"}
    )
    writer_passages_per_row: int = field(
        default=1,
        metadata={
            "help": "with --writer_corpus: each written row the mean of the rows written from up to this many "
            "passages (`edmem pretrain --writer_passages_per_row`)"
        },
    )
    frozen_writer: bool = field(
        default=False,
        metadata={
            "help": "with --writer_corpus: the writer, the encoder's lower layers and the embeddings stay as loaded, "
            "every entity's row is written by them from the corpus when training starts and the table stays as "
            "written, so that rows of entities added later are of the kind training read (docs/model.md)"
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
    validation_answer_links: str | None = field(
        default=None,
        metadata={
            "help": "QA: the validation file's sling_invocab-*.json (in the release's entity_linking/): "
            "exact_match_entity / exact_match_non_entity as edmem evaluate --answer-links reports them"
        },
    )
    test_answer_links: str | None = field(
        default=None, metadata={"help": "QA: the test file's sling_invocab-*.json, as --validation_answer_links"}
    )
    max_source_length: int = field(default=64, metadata={"help": "input tokens (questions, inputs) kept"})
    max_target_length: int = field(default=64, metadata={"help": "target tokens kept; also max_new_tokens"})
    bad_records: str = field(
        default="raise",
        metadata={
            "help": "a line that is not a JSON record, or a bad link (outside its text, overlapping the one before): "
            "raise an error naming it, or skip the line / leave the link out and keep the record (the released "
            "files hold 9 such links)",
            "choices": BAD_RECORDS,
        },
    )
    max_train_samples: int | None = field(
        default=None,
        metadata={"help": "train on the first N records (static_linking: those of them whose answer is an entity)"},
    )
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
# Without a validation file there is nothing to evaluate each epoch nor a best model to keep.
WITHOUT_VALIDATION = dict(eval_strategy="no", load_best_model_at_end=False)


@dataclass
class Task:
    """What makes a task: its reader, its encoder into training features, its scores and its best-model metric."""

    read: Callable[..., Any]  # (path, entity_vocab, bad_records=, limit=, ...) -> datasets.Dataset
    encode: Callable[..., dict]  # (row, tokenizer, max_length) -> features
    # (rows, {id: text}, answer links or None) -> metrics
    score: Callable[[list[dict], dict[str, str], Mapping | None], dict[str, float]] | None
    defaults: dict[str, Any]  # Seq2SeqTrainingArguments defaults of the task (e.g. metric_for_best_model)
    filter_rows: Callable[[dict], bool] | None = None
    resample: bool = False  # training encodes each row as it is read, with `encode(..., rng=random)`
    reads_answer_links: bool = False  # the reader takes `answer_links=` (QA)


def score_qa(rows: list[dict], predictions: dict[str, str], answer_links: Mapping | None = None) -> dict[str, float]:
    """Exact match; with `answer_links` (a `sling_invocab-*.json`) on entity and non-entity answers as `edmem
    evaluate --answer-links` splits it; on the questions whose answer is an entity of the model's vocabulary
    (`exact_match_in_vocab_answer`) and the others, when there are any."""
    records = [{"id": row["id"], "answer": row["answers"]} for row in rows]
    in_vocab = [row["id"] for row in rows if row["answer_entity"] != IGNORE_INDEX]
    return qa_scores(records, predictions, answer_links=answer_links, in_vocab_answers=in_vocab or None)


# Training reads each question with one of its answers picked at random each time (TriviaQA: its `entity` answer),
# its linked spans marked, as the authors' reader does; evaluation and prediction score against every answer.
QA = Task(
    read=read_qa,
    encode=encode_qa_record,
    score=score_qa,
    defaults=dict(metric_for_best_model="exact_match"),
    resample=True,
    reads_answer_links=True,
)
STATIC_LINKING = Task(
    read=read_qa,
    encode=encode_static_linking_record,
    score=None,
    defaults=dict(metric_for_best_model="loss", greater_is_better=False, predict_with_generate=False),
    filter_rows=lambda row: row["answer_entity"] != IGNORE_INDEX,  # the others are left out of this objective
    resample=True,
    reads_answer_links=True,
)


def generation_task(name: str) -> Task:
    """The generation task `name` (one of `GENERATION_TASKS`): its reader, features and `edmem evaluate`'s scores."""

    def score(rows: list[dict], predictions: dict[str, str], answer_links: Mapping | None = None) -> dict[str, float]:
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
        return generation_scores(records, predictions, strip_creak_verdict=name == "creak")

    return Task(
        read=read_generation,
        encode=encode_generation_record,
        score=score,
        defaults=dict(metric_for_best_model="rougeL", max_source_length=256, max_target_length=128),
    )


def task_of(task: str, objective: str = "qa") -> Task:
    """The `Task` of `--task` and `--objective`."""
    if task in GENERATION_TASKS:
        if objective != "qa":
            raise ValueError(f"--objective {objective} applies to the QA tasks, not to {task}")
        return generation_task(task)
    if task not in QA_TASKS:
        raise ValueError(f"unknown task {task!r}: one of {', '.join(QA_TASKS + GENERATION_TASKS)}")
    return STATIC_LINKING if objective == "static_linking" else QA


class _HelpFormatter(CommandHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """The `edmem` commands' defaults in the help, and the description as written."""


class _Parser(CommandArgumentParser):
    """The `edmem` commands' parser, whose errors show a one-line usage that points to `--help` (the usage of every
    Trainer option is over a hundred lines); `--help` shows them all."""

    def format_usage(self) -> str:
        return f"usage: {self.prog} [options] (all of them: {self.prog} --help)\n"


def parse_arguments(
    task: Task | None = None,
    argv: list[str] | None = None,
    extra_arguments: tuple[type, ...] = (),
    prog: str | None = None,
):
    """`ModelArguments`, `DataArguments`, `Seq2SeqTrainingArguments`, `TaskArguments` (then `extra_arguments`), from
    the command line or one JSON file of them, with the paper's defaults and the task's (`task`, or the one
    `--task` and `--objective` name); every option with a fixed set of values, and every model folder and data
    file, is checked here, before anything is loaded or trained. Returns them and the `Task`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    from_json = len(argv) == 1 and argv[0].endswith(".json")
    given = json.loads(Path(argv[0]).read_text(encoding="utf-8")) if from_json else None
    dataclasses = (ModelArguments, DataArguments, Seq2SeqTrainingArguments, TaskArguments, *extra_arguments)
    parser = _Parser(dataclasses, prog=prog, description=__doc__, formatter_class=_HelpFormatter)
    if task is None:  # the task's defaults are set before the whole command line is parsed
        picker = argparse.ArgumentParser(add_help=False)
        picker.add_argument("--task", default="qa")
        picker.add_argument("--objective", default="qa")
        picked = argparse.Namespace(**{"task": "qa", "objective": "qa", **(given or {})})
        if not from_json:
            picked, _ = picker.parse_known_args(argv)
        try:
            task = task_of(picked.task, picked.objective)
        except ValueError:
            task = QA  # the full parse below names the bad value
    # a log file gets no progress bars, a terminal does
    defaults = {**PAPER_DEFAULTS, **task.defaults, "disable_tqdm": not sys.stderr.isatty()}
    try:
        if from_json:
            if not given.get("validation_file"):
                defaults |= WITHOUT_VALIDATION
            parsed = parser.parse_dict({**defaults, **given})
        else:
            if not any(arg == "--validation_file" or arg.startswith("--validation_file=") for arg in argv):
                defaults |= WITHOUT_VALIDATION
            parser.set_defaults(**defaults)
            unknown = parser.parse_known_args(argv)[1]  # named as argparse names them, not in a ValueError
            if unknown:
                parser.error(f"unrecognized arguments: {' '.join(unknown)}")
            parsed = parser.parse_args_into_dataclasses(args=argv)
    except ValueError as error:  # a JSON file's key that is no option, a value a dataclass refuses
        parser.error(str(error))
    model_args, data_args, training_args, task_args = parsed[:4]
    try:
        task_of(task_args.task, task_args.objective)
    except ValueError as error:
        parser.error(str(error))
    for option, path in (
        ("--model_name_or_path", model_args.model_name_or_path),
        ("--tokenizer_name", model_args.tokenizer_name),
        ("--static_linker", model_args.static_linker),
    ):
        if path is not None and (why := missing_model(path)):
            parser.error(f"{option} {path}: {why}")
    for option, path in (
        ("--train_file", data_args.train_file),
        ("--validation_file", data_args.validation_file),
        ("--test_file", data_args.test_file),
        ("--validation_answer_links", data_args.validation_answer_links),
        ("--test_answer_links", data_args.test_answer_links),
        ("--entity_mask_file", model_args.entity_mask_file),
    ):
        if path is not None and not os.path.isfile(path):
            parser.error(f"{option} {path}: no such file")
    if model_args.frozen_writer and model_args.writer_corpus is None:
        parser.error("--frozen_writer writes the table from a corpus: give --writer_corpus")
    if model_args.writer_passages_per_row < 1:
        parser.error(f"--writer_passages_per_row {model_args.writer_passages_per_row}: give 1 or more")
    if model_args.writer_passages_per_row != 1 and model_args.writer_corpus is None:
        parser.error("--writer_passages_per_row pools rows written from a corpus: give --writer_corpus")
    if model_args.writer_corpus is not None and not os.path.isdir(os.path.join(model_args.writer_corpus, "passages")):
        parser.error(f"--writer_corpus {model_args.writer_corpus}: not an edmem build-corpus folder (no passages/)")
    saved = Path(model_args.model_name_or_path) / "config.json"
    if model_args.writer_corpus is not None and saved.is_file():  # before a model is loaded
        if not json.loads(saved.read_text(encoding="utf-8")).get("entity_row_writer", False):
            parser.error(f"--writer_corpus: {model_args.model_name_or_path} has no writer of entity rows")
    if not task.reads_answer_links:
        for option in ("validation_answer_links", "test_answer_links"):
            if getattr(data_args, option) is not None:
                parser.error(f"--{option} applies to the QA tasks only")
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
    return (*parsed, task)


class ModelFolderError(ValueError):
    """A local model folder that lacks what fine-tuning loads (tokenizer, weights, entity vocabulary)."""


def check_model_folder(model_name_or_path: str, tokenizer_name: str | None = None) -> None:
    """Raises a `ModelFolderError` naming what a local model folder lacks and how to make it, before anything is
    loaded (a Hub id, or a folder that has it all, passes)."""
    folder = Path(model_name_or_path)
    if not folder.is_dir():
        return
    names = {path.name for path in folder.iterdir()}
    if {"passages", "entity_vocab.json"} <= names and "config.json" not in names:
        raise ModelFolderError(
            f"{folder} is a corpus (`edmem build-corpus`), not a model: pre-train on it with `edmem pretrain "
            f"--corpus_dir {folder}`, and fine-tune the model that writes"
        )
    if tokenizer_name is None and not names & {"tokenizer.json", "tokenizer_config.json"}:
        raise ModelFolderError(
            f"{folder} has no tokenizer (tokenizer.json): pass --tokenizer_name, or write the folder with its "
            f"tokenizer (`edmem write-preset ... --tokenizer DIR`; `edmem pretrain` saves one)"
        )
    if not any(name.endswith((".safetensors", ".bin", ".index.json")) for name in names):
        raise ModelFolderError(
            f"{folder} has a config but no weights: pre-train it (`edmem pretrain --model_name_or_path {folder}`), "
            f"or write the preset with `--random-weights`"
        )
    if "entity_vocab.json" not in names:
        raise ModelFolderError(
            f"{folder} has no entity_vocab.json, which the readers map entities with: write the folder with "
            f"`edmem write-preset ... --entity-vocab FILE` (or `--task-data`), or pre-train on a corpus"
        )


def run(
    task: Task | None = None,
    argv: list[str] | None = None,
    extra_arguments: tuple[type, ...] = (),
    prog: str | None = None,
) -> dict[str, float]:
    """Fine-tunes, evaluates and predicts as the arguments say (`task`, or the one `--task` and `--objective`
    name); returns the metrics of the last step run. A record the readers cannot read is a `BadRecordError`."""
    model_args, data_args, training_args, *_, task = parse_arguments(task, argv, extra_arguments, prog)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    if training_args.should_log:  # the main process logs the Trainer's set-up and progress, as HF examples do
        transformers.utils.logging.set_verbosity_warning()  # not every config loaded
        transformers.utils.logging.get_logger("transformers.trainer").setLevel(logging.INFO)
    if training_args.disable_tqdm:  # and the bars of datasets' map and of writing the weights
        datasets.disable_progress_bars()
        transformers.utils.logging.disable_progress_bar()
    set_seed(training_args.seed)

    check_model_folder(model_args.model_name_or_path, model_args.tokenizer_name)
    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name or model_args.model_name_or_path)
    dropouts = {name: model_args.dropout for name in ("dropout", "memory_dropout", "upper_input_dropout")}
    model = AutoModelForSeq2SeqLM.from_pretrained(
        model_args.model_name_or_path, entity_loss_weight=model_args.entity_loss_weight, **dropouts
    )
    if model.entity_vocab is None:
        raise ValueError(f"{model_args.model_name_or_path} has no entity_vocab.json: the readers map entities with it")
    if model_args.entity_mask_file:  # kept through training, evaluation and prediction, and saved with the model
        model.set_entity_mask(torch.load(model_args.entity_mask_file, weights_only=True) == 0)
    model.generation_config.entity_decoding = model_args.entity_decoding
    model.generation_config.entity_candidates = model_args.entity_candidates
    if model_args.entity_decoding != "free":
        model.entity_trie(tokenizer)  # spelled once with this tokenizer, kept on the model for generate()
    if getattr(model.config, "name_guided_read", False):
        model.name_candidates(tokenizer)  # the names' lookup of the name-guided read, for training and generate()

    def load(path: str | None, limit: int | None, answer_links: str | None = None, training: bool = False):
        if path is None:
            return None, None
        links = {"answer_links": answer_links or "auto"} if task.reads_answer_links else {}
        rows = task.read(path, model.entity_vocab, bad_records=data_args.bad_records, limit=limit, **links)
        if task.filter_rows is not None:
            rows = rows.filter(task.filter_rows)
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
        data_args.validation_answer_links,
    )
    test_rows, test_features = load(
        data_args.test_file if training_args.do_predict else None, None, data_args.test_answer_links
    )
    scored = {"rows": eval_rows, "links": _answer_links(data_args.validation_answer_links)}

    def compute_metrics(prediction) -> dict[str, float]:
        rows = scored["rows"]
        texts = decode(tokenizer, prediction.predictions, len(rows))
        return task.score(list(rows), dict(zip(rows["id"], texts)), scored["links"])

    collator = EDMemSeq2SeqCollator(tokenizer.pad_token_id)
    if model_args.writer_corpus is not None and training_args.do_train:
        if getattr(model, "entity_writer", None) is None:
            raise ValueError(f"--writer_corpus: {model_args.model_name_or_path} has no writer of entity rows")
        options = WriterTrainingArguments(written_row_share=model_args.written_row_share, written_only_share=0.0,
                                          writer_passages_per_row=model_args.writer_passages_per_row,
                                          frozen_writer=model_args.frozen_writer)  # fmt: skip
        collator = WriterCollator.from_corpus(collator, model_args.writer_corpus, model, tokenizer, options,
                                              seed=training_args.seed)  # fmt: skip
        if model_args.frozen_writer:
            freeze_the_writer(model, collator)
    callbacks = []
    if model_args.early_stopping_patience and eval_features is not None and training_args.load_best_model_at_end:
        callbacks.append(EarlyStoppingCallback(model_args.early_stopping_patience))
    trainer = Seq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=train_features,
        eval_dataset=eval_features,
        data_collator=collator,
        processing_class=tokenizer,
        compute_metrics=compute_metrics if training_args.predict_with_generate and task.score else None,
        callbacks=callbacks,
    )
    # progress as `edmem pretrain` shows it, and scores as numbers (the Trainer's own print has them as strings)
    show_training_progress(trainer, "fine-tune", bar=not training_args.disable_tqdm)
    metrics: dict[str, float] = {}
    if training_args.do_train:
        result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        trainer.save_model()
        trainer.log_metrics("train", result.metrics)
        trainer.save_metrics("train", result.metrics)
        trainer.save_state()  # trainer_state.json: every log of the run (log_history), numbers
        metrics = result.metrics
    if training_args.do_eval and eval_features is not None:
        metrics = trainer.evaluate(metric_key_prefix="eval")
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
    if training_args.do_predict and test_features is not None:
        scored = {"rows": test_rows, "links": _answer_links(data_args.test_answer_links)}
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


def _answer_links(path: str | None) -> dict[str, list[int] | None] | None:
    """A `sling_invocab-*.json` as `qa_scores` splits with it (id -> None when the answer is not an entity)."""
    return None if path is None else read_answer_links(path)


def decode(tokenizer: Any, token_ids: np.ndarray, count: int) -> list[str]:
    """Generated ids (padded with -100 across batches) -> the texts of the `count` examples, mention markers kept.
    A distributed evaluation pads its last batches with repeated examples: those rows come last and are dropped."""
    if len(token_ids) < count:
        raise ValueError(f"{len(token_ids)} generated rows for {count} examples")
    token_ids = np.where(token_ids[:count] == -100, tokenizer.pad_token_id, token_ids[:count])
    return [strip_generation(text, tokenizer) for text in tokenizer.batch_decode(token_ids)]


def cli_main(argv: list[str] | None = None) -> int:
    try:
        run(argv=argv, prog="edmem finetune")
    except (BadRecordError, ModelFolderError) as error:
        print(f"edmem finetune: {error}", file=sys.stderr)
        return 1
    from accelerate import PartialState

    state = PartialState()
    if state.use_distributed:  # under torchrun: the process group's threads end before the interpreter does
        state.wait_for_everyone()
        state.destroy_process_group()
    return 0


__all__ = [
    "QA",
    "STATIC_LINKING",
    "DataArguments",
    "ModelArguments",
    "Task",
    "TaskArguments",
    "decode",
    "generation_task",
    "parse_arguments",
    "run",
    "score_qa",
    "task_of",
]

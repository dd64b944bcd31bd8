"""Time to add entities (`toy_world_growth.py`): n new names, one passage each, added by each estimator to the toy
model or to a model of the `edmem-base` preset's shape (random weights, a 1M-row table), each figure kept as soon as
it is measured."""

from __future__ import annotations

import json
import logging
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from transformers import AutoTokenizer

from edmem_hf import EDMemForConditionalGeneration, EntityVocab
from edmem_hf.pretraining import PretrainingArguments, build_config
from edmem_hf.research.entity_growth import add_entities
from edmem_hf.research.row_fitting import fit_new_entities
from edmem_hf.research.writer_training import WriterTrainingArguments
from experiments.growth import WRITER

if TYPE_CHECKING:
    from toy_world_growth import GrowthSettings

logger = logging.getLogger("toy_world_growth")


def time_additions(
    model_dir: Path, sizes: tuple[int, ...], settings: GrowthSettings, record: Path, base_shape: bool,
    writer_dir: Path | None = None,
) -> dict[str, dict[str, dict[str, float]]]:  # fmt: skip
    """Seconds to add n new names (one passage each: a biography sentence, the name swapped in), by shape (the toy
    model of `model_dir`, or of `writer_dir` for the writer; the `edmem-base` preset's, random weights and a 1M-row
    table), estimator and n. Each figure is kept in `record` as soon as it is measured, and not measured again."""
    seconds = json.loads(record.read_text()) if record.exists() else {}
    shapes = ("toy_model", "edmem_base_shape") if base_shape else ("toy_model",)
    for shape in shapes:
        for n in sizes:
            for estimator in settings.timed_estimators:
                if str(n) in seconds.get(shape, {}).get(estimator, {}) or (estimator == WRITER and not writer_dir):
                    continue
                writer = estimator == WRITER
                model, tokenizer = _model_to_grow(writer_dir if writer else model_dir, shape, writer)
                figure = _timed_addition(model, tokenizer, n, estimator, settings)
                seconds.setdefault(shape, {}).setdefault(estimator, {})[str(n)] = figure
                record.write_text(json.dumps(seconds, indent=1))
                logger.info("%s: %d entities added (%s) in %.1f s", shape, n, estimator, figure)
    return seconds


def _model_to_grow(model_dir: Path, shape: str, writer: bool = False):
    """The fine-tuned toy model, or a model of the `edmem-base` preset's shape (random weights, 1M-row table; with a
    writer of entity rows when timing it)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if shape == "toy_model":
        return EDMemForConditionalGeneration.from_pretrained(model_dir), tokenizer
    size = 1_000_010
    with tempfile.TemporaryDirectory() as scratch:
        arguments = PretrainingArguments(output_dir=scratch, preset="edmem-base")
        config = build_config(arguments, tokenizer, size, WriterTrainingArguments(entity_row_writer=writer or None))
    model = EDMemForConditionalGeneration(config)
    model.entity_vocab = EntityVocab([f"Entity {i}" for i in range(size)], [[] for _ in range(size)], [0] * size)
    return model, tokenizer


def _timed_addition(model, tokenizer, n: int, estimator: str, settings: GrowthSettings) -> float:
    names = [f"Newcomer {i}" for i in range(n)]
    passages = [[f"<E_s> {name} <E_e> was born in 1931. She studied history at a university."] for name in names]
    started = time.perf_counter()
    if estimator in ("mean_query", WRITER):
        add_entities(model, names, passages, tokenizer, estimator=estimator, batch_size=256)
    else:
        fit_new_entities(model, names, passages, tokenizer, steps=settings.fit_steps,
                         learning_rate=settings.fit_learning_rate)  # fmt: skip
    return round(time.perf_counter() - started, 2)

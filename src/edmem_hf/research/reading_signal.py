"""Whether the writer's training is teaching the model to read written rows, while it trains (issue 64).

On one seed of the knowledge world's three the first stage never learnt to read a written row, and nothing said so
before the run ended. At each evaluation of `edmem pretrain` (`--eval_steps`), with
`--reading_signal_questions_file` (questions about written-only entities that no batch mixes: the growth
experiment's `practice_validation`), the subjects' rows are written by the writer as it is, from the texts training
ends with (`WriterCollator.rows_to_write`), shown to the memory, and the questions answered: `reading_em`, through
the rows as the memory finds them, and `reading_oracle_em`, with the encoder's read forced onto the subject's rows
(a row that carries the answer, read where it is found). With `--reading_signal_facts_file` (relation -> a sentence
form with `{S}` and `{V}`, and the fact's values), `written_fact_share`: the share of the writer's rows' variance
that the stated fact explains (`diagnostics.written_facts`). The model is left as it was.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import torch

from ..task_files import read_jsonl
from .diagnostics import _rows_put_back, answer_questions, exact_match_percent, written_facts
from .entity_growth import write_rows_as_read


def reading_signal(
    model: Any, tokenizer: Any, collator: Any, questions_file: str | os.PathLike, facts_file: str | None = None
) -> dict[str, float]:
    """`reading_em` and `reading_oracle_em` (%) on `questions_file`, and `written_fact_share` with `facts_file`
    (the module's docstring). The subjects must be written-only entities of `collator` with texts."""
    vocab = model.entity_vocab
    people = sorted({record["link_target"][0] for record in read_jsonl(questions_file)})
    unknown = [name for name in people if name not in vocab]
    if unknown:
        raise ValueError(f"--reading_signal_questions_file {questions_file}: {unknown[0]!r} is no entity of the model")
    asked = [vocab.id_of(name) for name in people]
    if not all(collator.written_only[asked]):
        raise ValueError(f"--reading_signal_questions_file {questions_file}: its subjects must be written-only "
                         "entities (--written_only_entities_file), read through written rows alone in training")  # fmt: skip
    ids, inputs = collator.rows_to_write(entities=asked)
    if len(ids) < len(asked):
        missing = sorted(set(people) - {vocab.name_of(i) for i in ids})
        raise ValueError(f"--reading_signal_questions_file {questions_file}: no passage to write {missing[0]!r} from")
    mask, was_training = model._get_entity_mask("cpu"), model.training
    shown = torch.ones(model.config.entity_vocab_size, dtype=torch.bool) if mask is None else mask.clone()
    shown[ids] = True
    figures = {}
    model.eval()
    try:
        with _rows_put_back(model, ids), torch.no_grad():
            write_rows_as_read(model, ids, inputs)
            model.set_entity_mask(shown)
            figures["reading_em"] = exact_match_percent(answer_questions(model, tokenizer, questions_file),
                                                        questions_file)  # fmt: skip
            figures["reading_oracle_em"] = exact_match_percent(
                answer_questions(model, tokenizer, questions_file, subjects_only=True), questions_file
            )
        if facts_file is not None:
            with open(facts_file, encoding="utf-8") as f:
                facts = {relation: (form, values) for relation, (form, values) in json.load(f).items()}
            # made-up names of the written-only entities' words (`written_facts`), the practice entities' shape
            named = [collator.names[e] for e in np.flatnonzero(collator.written_only).tolist()]
            named = [name for name in named if name is not None and len(name.split()) > 1] or people
            figures["written_fact_share"] = written_facts(model, tokenizer, named, facts)["fact_share"]
    finally:
        model.set_entity_mask(mask)
        model.train(was_training)
    return figures


__all__ = ["reading_signal"]

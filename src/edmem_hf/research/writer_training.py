"""Training the writer of entity rows (`EDMemConfig.entity_row_writer`; docs/model.md, "Entities written from
text"): its options as one object, `WriterTrainingArguments`, with the settings the measurements chose as named
recipes (`WRITER_RECIPES`), and what `edmem pretrain` does with them: the collator of batches that read written
rows (`writer_batches.WriterCollator`), the entity mask of the written-only entities during training, and the rows
written into the table when training ends.

`edmem pretrain --help` shows `--entity_row_writer`, `--writer_recipe` and `--written_only_entities_file`; every
other field is accepted as `--<field>` too and listed in docs/pretraining.md, not in the help: they are the research's
levers, the recipe their chosen values.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

import torch

# The settings of the recipe measured in docs/evidence.md ("Entities written from text"), in two stages: the first
# trains the writer with the model, a written entity read through a row for each of up to 12 passages, kept apart,
# the rows that state what a passage hides the linking loss's gold; the second (from the first's model) freezes the
# writer and teaches the rest of the model to find and read the rows it writes, every entity of a batch read through
# them, each renamed practice entity with 4 decoys.
_ROWS_THAT_ANSWER = dict(entity_row_writer=True, writer_pools_texts=False, written_only_share=0.0,
                         writer_passages_per_row=12, writer_answer_rows=True, writer_answer_rows_by_text=True)  # fmt: skip
_FROZEN_WRITER = {**_ROWS_THAT_ANSWER, "frozen_writer": True, "written_row_share": 1.0, "writer_decoy_rows": 4}
# The same two stages on a user's own corpus (docs/model.md, "Your own entities"): no list of practice entities, but a
# share of the corpus's entities drawn by the seed (the same in both stages), each of their rows written from one
# sentence, as `edmem add-entities` writes an added entity's rows from the sentences of its page.
_FROM_CORPUS = {"written_only_share": 0.2, "writer_sentence_rows": True}
WRITER_RECIPES: dict[str, dict[str, Any]] = {
    "rows_that_answer": _ROWS_THAT_ANSWER,
    "frozen_writer": _FROZEN_WRITER,
    "rows_that_answer_from_corpus": {**_ROWS_THAT_ANSWER, **_FROM_CORPUS},
    "frozen_writer_from_corpus": {**_FROZEN_WRITER, **_FROM_CORPUS},
}

_HIDDEN = argparse.SUPPRESS  # accepted on the command line, listed in docs/pretraining.md rather than in --help


def _option(default: Any, help: str, shown: bool = False, switch: bool = False) -> Any:
    """A field, shown in `--help` or not (`help` is its documentation either way); a `switch` (a `bool | None`) is
    also given alone, `--name` for true."""
    metadata = {"help": help if shown else _HIDDEN}
    if switch:  # HfArgumentParser makes `--name` alone mean true only for a bool whose default is not None
        metadata.update(nargs="?", const=True)
    return field(default=default, metadata=metadata)


@dataclass
class WriterTrainingArguments:
    """How a model with a writer of entity rows is trained. A field left None takes the recipe's value
    (`writer_recipe`, `WRITER_RECIPES`), else the value in its help; the model's own options (`entity_row_writer`,
    `writer_pools_texts`, `writer_mean_row_probability`) left None keep the checkpoint's or the config's default."""

    _argument_group_name = "the writer of entity rows (research; docs/model.md)"

    entity_row_writer: bool | None = _option(
        None,
        "A writer of entity rows, trained to write rows the memory reads (docs/model.md).",
        shown=True,
        switch=True,
    )
    writer_recipe: str | None = _option(
        None,
        f"Named settings of the writer's training: {', '.join(WRITER_RECIPES)} (the first stage of docs/evidence.md's "
        "recipe, and its second from the first's model). Options given beside it win.",
        shown=True,
    )
    written_only_entities_file: str | None = _option(
        None,
        "Entity names, one a line, read through written rows only besides --written_only_share: practice entities "
        "that teach the writer (docs/model.md).",
        shown=True,
    )
    writer_pools_texts: bool | None = _option(
        None,
        "An entity written from several passages in a batch reads the mean of their rows (true, the default) or "
        "each row on its own, scored by their log-sum-exp (false).",
        switch=True,
    )
    writer_mean_row_probability: bool | None = _option(
        None, "An entity of several written rows gets the mean of its rows' probabilities, not their sum.", switch=True
    )
    written_row_share: float | None = _option(
        None, "Share of a batch's entities read through a row written from another passage (default 0.5)."
    )
    written_only_share: float | None = _option(
        None, "Share of all entities read through written rows only, as if added later (default 0.2)."
    )
    hide_practice_entities: bool | None = _option(
        None, "Save the model with the entities of --written_only_entities_file hidden (its entity mask).", switch=True
    )
    written_table: bool | None = _option(
        None,
        "When training ends, write every entity's table row with the writer, not only the written-only ones'.",
        switch=True,
    )
    row_autoencoding_share: float | None = _option(
        None, "Share of the passages about a written entity read as its written row alone (default 0)."
    )
    row_autoencoding_written_only: bool | None = _option(
        None, "Row auto-encoding reads only passages about written-only entities.", switch=True
    )
    writer_passages_by_mentions: bool | None = _option(
        None, "Draw the passage a row is written from in proportion to how often it mentions the entity.", switch=True
    )
    writer_passages_per_row: int | None = _option(
        None, "Each written entity read through the rows written from up to this many passages (default 1)."
    )
    writer_answer_rows: bool | None = _option(
        None,
        "With --writer_pools_texts false: a mention's linking gold among its entity's rows are those written "
        "from a passage that names an entity its passage hides.",
        switch=True,
    )
    writer_answer_rows_by_text: bool | None = _option(
        None,
        "With --writer_answer_rows: a question's rows that answer are also those whose passage holds its answer.",
        switch=True,
    )
    writer_reads_answer_rows: bool | None = _option(
        None,
        "With --writer_answer_rows: in training, a mention whose entity has rows that answer reads those alone.",
        switch=True,
    )
    frozen_writer: bool | None = _option(
        None,
        "The second stage (from a first with --model_name_or_path): the writer, the encoder's lower layers and "
        "the token embeddings stay as loaded, every entity's row written by them and left out of the optimizer.",
        switch=True,
    )
    writer_sentence_rows: bool | None = _option(
        None,
        "A written-only entity's rows are written a sentence each (the sentence of a passage that mentions it), as "
        "`edmem add-entities` writes an added entity's rows from the sentences of its page.",
        switch=True,
    )
    reading_signal_questions_file: str | None = _option(
        None,
        "Questions (the released QA format) about written-only entities that no batch mixes, asked at each "
        "evaluation through the rows the writer writes of them: reading_em and reading_oracle_em in the log "
        "(research.reading_signal).",
    )
    reading_signal_facts_file: str | None = _option(
        None,
        "With --reading_signal_questions_file: a JSON file, relation -> [sentence form with {S} and {V}, values]; "
        "the written rows' fact share is logged too.",
    )
    writer_max_length: int | None = _option(None, "Tokens of a writer input, name and passage (default 128).")
    max_written_rows: int | None = _option(None, "Written rows a batch at most (default 32).")
    fresh_names: bool | None = _option(
        None, "Written-only entities appear under a fresh name each batch (default).", switch=True
    )
    fresh_names_like_written_only: bool | None = _option(
        None, "Fresh names are made of the words of written-only entities' names only.", switch=True
    )
    fresh_name_share: float | None = _option(
        None, "Share of the batch's other written entities renamed as written-only ones are (default 0)."
    )
    writer_decoy_rows: int | None = _option(
        None, "Decoys a renamed entity brings: other written-only entities under fresh names sharing a word with its."
    )
    writer_decoys_for_every_entity: bool | None = _option(
        None,
        "Every written entity of a batch brings --writer_decoy_rows decoys under names sharing a word of its own.",
        switch=True,
    )

    def __post_init__(self) -> None:
        if self.writer_recipe is not None and self.writer_recipe not in WRITER_RECIPES:
            raise ValueError(f"--writer_recipe {self.writer_recipe!r}: choose one of {', '.join(WRITER_RECIPES)}")
        recipe = WRITER_RECIPES.get(self.writer_recipe, {})
        for name, value in {**TRAINING_DEFAULTS, **recipe}.items():
            if getattr(self, name) is None:
                setattr(self, name, value)

    def given(self) -> list[str]:
        """The training options that differ from `TRAINING_DEFAULTS` (what a model without a writer cannot take)."""
        defaults = {"written_only_entities_file": None, "reading_signal_questions_file": None,
                    "reading_signal_facts_file": None, **TRAINING_DEFAULTS}  # fmt: skip
        return [name for name, default in defaults.items() if getattr(self, name) != default]


# The training options' values where neither the command line nor a recipe gives one.
TRAINING_DEFAULTS: dict[str, Any] = dict(
    written_row_share=0.5, written_only_share=0.2, hide_practice_entities=False, written_table=False,
    row_autoencoding_share=0.0, row_autoencoding_written_only=False, writer_passages_by_mentions=False,
    writer_passages_per_row=1, writer_answer_rows=False, writer_answer_rows_by_text=False,
    writer_reads_answer_rows=False, frozen_writer=False, writer_max_length=128, max_written_rows=32, fresh_names=True,
    fresh_names_like_written_only=False, fresh_name_share=0.0, writer_decoy_rows=0,
    writer_decoys_for_every_entity=False, writer_sentence_rows=False,
)  # fmt: skip
MODEL_OPTIONS = ("entity_row_writer", "writer_pools_texts", "writer_mean_row_probability")  # the config's


def writer_collator(
    options: WriterTrainingArguments, base: Any, passages: Any, tokenizer: Any, model: Any, seed: int
) -> Any:
    """`base` extended with rows written from `passages` (a corpus's train split): `writer_batches.WriterCollator`.
    Options that contradict each other, or the model, are a ValueError naming them."""
    from .writer_batches import EntityPassages, WriterCollator

    if model.entity_vocab is None:
        raise ValueError("training the entity row writer needs the model's entity_vocab: it writes names")
    if options.writer_reads_answer_rows and not options.writer_answer_rows:
        raise ValueError("--writer_reads_answer_rows reads the rows of --writer_answer_rows: give both")
    if options.writer_answer_rows_by_text and not options.writer_answer_rows:
        raise ValueError("--writer_answer_rows_by_text widens the rows of --writer_answer_rows: give both")
    if options.writer_answer_rows and (model.config.writer_pools_texts or options.writer_passages_per_row < 2):
        raise ValueError("--writer_answer_rows chooses among an entity's rows: give --writer_pools_texts false and "
                         "--writer_passages_per_row 2 or more")  # fmt: skip
    if options.hide_practice_entities and not options.written_only_entities_file:
        raise ValueError("--hide_practice_entities hides the entities of --written_only_entities_file: give it")
    practice = []
    if options.written_only_entities_file:
        practice = entity_ids_in_file(
            "written_only_entities_file", options.written_only_entities_file, model.entity_vocab
        )
    index = EntityPassages.from_dataset(passages, model.config.entity_vocab_size)
    return WriterCollator(base, passages, index, model.entity_vocab.names, tokenizer, model.config, options,
                          seed=seed, written_only_ids=practice)  # fmt: skip


def entity_ids_in_file(option: str, path: str, entity_vocab: Any) -> list[int]:
    """The ids of the entity names in `path`, one a line; a name not in the vocabulary is an error naming `option`."""
    with open(path, encoding="utf-8") as f:
        names = [line.strip() for line in f if line.strip()]
    unknown = [name for name in names if name not in entity_vocab]
    if unknown:
        raise ValueError(f"--{option} {path}: {len(unknown)} names not in the entity vocabulary, e.g. {unknown[0]!r}")
    return [entity_vocab.id_of(name) for name in names]


def start_training(options: WriterTrainingArguments, model: Any, collator: Any) -> None:
    """Before the first step: with `frozen_writer`, the writer and what it reads leave the optimizer and every row is
    written (`writer_batches.freeze_the_writer`); else the written-only entities' table rows are hidden, so that they
    are read through written rows only."""
    from .writer_batches import freeze_the_writer

    if options.frozen_writer:
        freeze_the_writer(model, collator)
    else:
        model.set_entity_mask(torch.from_numpy(~collator.written_only))


def finish_training(options: WriterTrainingArguments, model: Any, collator: Any) -> None:
    """Before the model is saved: the written-only entities' rows (every row with `written_table`) written by the
    writer, as the model reads them (a frozen writer's were written at the start), and with
    `hide_practice_entities` the practice entities hidden in the saved model's mask."""
    from .entity_growth import write_rows_as_read

    if not options.frozen_writer:
        write_rows_as_read(model, *collator.rows_to_write(options.written_table))
        model.set_entity_mask(None)
    if options.hide_practice_entities:
        mask = model._get_entity_mask("cpu")
        shown = torch.ones(model.config.entity_vocab_size, dtype=torch.bool) if mask is None else mask.clone()
        shown[list(collator.written_only_ids)] = False
        model.set_entity_mask(shown)


__all__ = [
    "MODEL_OPTIONS",
    "TRAINING_DEFAULTS",
    "WRITER_RECIPES",
    "WriterTrainingArguments",
    "entity_ids_in_file",
    "finish_training",
    "start_training",
    "writer_collator",
]

"""Batches that read written rows: training with `EDMemConfig.entity_row_writer` (docs/model.md, "Entities written
from text"), the collator stage of `edmem pretrain` and of fine-tuning.

For a share of the entities of each batch, `WriterCollator` picks another passage about the entity, never one the
batch reads (TOME's rule: a passage must not read its own answer from a row written from itself), and adds it as a
writer input; the model then reads the row the writer makes of it in place of the entity's table row, in both
memories and in the entity-linking head. Where such an entity's name is masked in the input, the encoder's memory
reads its written row without searching (`written_read_entity_ids`): the reader learns to take the entity, and what the
passage being read hides about it, from the row. A fixed share of the entities (`written_only_share`) is read
through written rows every time it appears: like entities added after training, it never has a row of its own; and
it appears under a fresh name each batch (`fresh_names`, the same in the passages read and in the writer's), so that
nothing the layers could memorise about a name answers for it: what the passage being read hides must come through
the row, found by the name it was written with. (Anonymised entities force reading the same way in reading
comprehension: Hermann et al., 2015.)
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from ..configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN, IGNORE_INDEX
from ..entity_attention import WrittenRows
from ..entity_writer import RowsToWrite, writer_input_ids
from ..input_checks import check_entity_labels

LISTED_PASSAGES = 4096
"""An entity mentioned in more passages than this has its passages drawn from the whole list, not from a copy of it
that leaves out those read: a popular entity of a real corpus (a country, a million passages) is not listed each
batch."""


class EntityPassages:
    """Which passages of a split mention each entity (by its `entity_labels`) and how often, as CSR arrays over
    entity ids."""

    def __init__(self, passage_of_mention: np.ndarray, entity_of_mention: np.ndarray, num_entities: int):
        pairs, mentions = np.unique(np.stack([entity_of_mention, passage_of_mention]), axis=1, return_counts=True)
        self.passages = pairs[1].astype(np.int64)  # (entity, passage) pairs, sorted
        self.mentions = mentions.astype(np.int64)
        self.offsets = np.searchsorted(pairs[0], np.arange(num_entities + 1))

    @classmethod
    def from_dataset(cls, dataset: Any, num_entities: int, id_map: np.ndarray | None = None) -> EntityPassages:
        """From a `datasets.Dataset` with an `entity_labels` column (entity ids, -100 where none), read as Arrow;
        `id_map[i]` is the id of the dataset's entity `i` in the model's ids (-100: unknown), when they differ."""
        column = dataset.with_format("arrow")[:]["entity_labels"].combine_chunks()
        labels = column.flatten().to_numpy().astype(np.int64)
        lengths = np.diff(column.offsets.to_numpy())
        passage = np.repeat(np.arange(len(lengths)), lengths)
        if id_map is not None:
            labels = np.where(labels >= 0, np.asarray(id_map)[labels.clip(min=0)], labels)
        keep = (labels >= 0) & (labels < num_entities)
        return cls(passage[keep], labels[keep], num_entities)

    def of(self, entity: int) -> np.ndarray:
        """The indices of the passages that mention `entity`, ascending."""
        return self.passages[self.offsets[entity] : self.offsets[entity + 1]]

    def mentions_of(self, entity: int) -> np.ndarray:
        """How often each passage of `of(entity)` mentions `entity`."""
        return self.mentions[self.offsets[entity] : self.offsets[entity + 1]]

    def most_mentioning(self, entity: int, count: int) -> np.ndarray:
        """The `count` passages that mention `entity` most (its own page's, in an encyclopaedia), ascending ties."""
        order = np.argsort(-self.mentions_of(entity), kind="stable")[:count]
        return self.of(entity)[order]


@dataclass(frozen=True)
class TrainingWrittenRows(WrittenRows):
    """A training batch's written rows (`WriterCollator`): besides the rows, which of them example `b`'s mentions take
    as their gold, and rows handed to mentions in place of the memory's read.

    `read_at` (`(batch, seq)` over the encoder's input, or None): an entity id at each `<E_s>` whose memory read is
    that entity's written row itself, whatever the query finds (-100 elsewhere): the row handed to the reader, as
    TOME's mention auto-encoder hands memory entries to its reader, where a masked name leaves nothing to search by.
    `answering` (`(batch, K)` bool, or None): the rows written from a passage that names what example `b` hides; a
    mention of example `b` whose entity has rows among them is scored by those alone as its gold, so that the linking
    loss teaches the query which of an entity's rows to read. With `read_answering`, such a mention also reads those
    rows alone, so that the reader learns what a row of the hidden fact says before the query learns to find it.
    """

    read_at: torch.Tensor | None = None
    answering: torch.Tensor | None = None
    read_answering: bool = False

    def followed_by(self, ids: torch.Tensor, rows: torch.Tensor) -> TrainingWrittenRows:
        more = super().followed_by(ids, rows)
        if self.answering is None:  # a row added after the batch's answers nothing: the batch did not choose it
            return more
        return replace(
            more, answering=torch.cat([self.answering, self.answering.new_zeros(len(self.answering), len(ids))], 1)
        )

    def gold_rows(self, positions: torch.Tensor) -> torch.Tensor | None:
        return None if self.answering is None else self.answering.to(positions.device)[positions[:, 0]]

    def read_at_mentions(
        self, read: torch.Tensor, queries: torch.Tensor, mention_mask: torch.Tensor, labels: torch.Tensor | None
    ) -> torch.Tensor:
        if self.read_at is not None:
            read = with_handed_rows(read, queries, self.read_at[mention_mask], self)
        if self.answering is not None and self.read_answering and labels is not None:  # the choice given
            read = with_handed_rows(read, queries, labels[mention_mask], self, self.gold_rows(mention_mask.nonzero()))
        return read

    def in_decoder(self) -> TrainingWrittenRows:
        return replace(self, read_at=None)  # `read_at` is over the encoder's input


def with_handed_rows(
    read: torch.Tensor,
    queries: torch.Tensor,
    entities: torch.Tensor,
    written: WrittenRows,
    among: torch.Tensor | None = None,
) -> torch.Tensor:
    """`read` `(M, d)` with the mentions whose `entities` `(M,)` have written rows (of those `among` `(M, K)`, when
    given) reading those rows instead: the attention of their `queries` `(M, d)` over them alone (one row: the row
    itself)."""
    own = written.ids[None, :] == entities.to(written.ids.device)[:, None]  # (M, K)
    if among is not None:
        own &= among.to(own.device)
    scores = (queries.to(written.rows.dtype) @ written.rows.t()).float().masked_fill(~own, float("-inf"))
    handed = (torch.softmax(scores, dim=-1).nan_to_num(0.0) @ written.rows.float()).to(read.dtype)
    return torch.where(own.any(-1)[:, None], handed, read)


@dataclass
class TrainingRowsToWrite(RowsToWrite):
    """`RowsToWrite` of a training batch, with what `TrainingWrittenRows` says besides the rows: `read_at`
    `(batch, src_len)`, `answering` `(batch, K)` over these texts, and `read_answering`."""

    read_at: torch.Tensor | None = None
    answering: torch.Tensor | None = None
    read_answering: bool = False

    def check(self, config: Any, input_ids: torch.Tensor | None) -> None:
        super().check(config, input_ids)
        if self.read_answering and self.answering is None:
            raise ValueError("read_answering reads the rows of answering: give them")
        if self.read_at is not None:
            if input_ids is not None:
                check_entity_labels(self.read_at, input_ids, config, "rows_to_write.read_at")
            handed = self.read_at[self.read_at != IGNORE_INDEX].to(self.entity_ids.device)
            if not torch.isin(handed, self.entity_ids).all():
                raise ValueError("rows_to_write.read_at names an entity that has no written row (entity_ids)")
        if self.answering is not None and self.answering.shape[1:] != self.entity_ids.shape:
            raise ValueError(f"rows_to_write.answering has shape {tuple(self.answering.shape)}: it needs a column "
                             f"for each of the {self.entity_ids.numel()} entity_ids")  # fmt: skip

    def written_rows(self, rows: torch.Tensor, config: Any) -> TrainingWrittenRows:
        plain = super().written_rows(rows, config)
        if plain.ids.numel() == self.entity_ids.numel():  # a row a text
            answering = None if self.answering is None else self.answering.bool()
            return TrainingWrittenRows(plain.ids, plain.rows, False, self.read_at, answering, self.read_answering)
        return TrainingWrittenRows(plain.ids, plain.rows, False, self.read_at)  # a row an entity: nothing to choose


_PACKED = {"written_entity_ids": "entity_ids", "writer_input_ids": "input_ids", "writer_attention_mask": "attention_mask",
           "written_read_entity_ids": "read_at", "written_rows_answering": "answering",
           "read_answering_rows": "read_answering"}  # fmt: skip


def packed(batch: dict[str, Any]) -> dict[str, Any]:
    """`batch` with its writer fields as one `TrainingRowsToWrite`, the model's `rows_to_write`."""
    rows = {name: batch.pop(key) for key, name in _PACKED.items() if key in batch}
    return {**batch, "rows_to_write": TrainingRowsToWrite(**rows)}


@dataclass
class WriterCollator:
    """Wraps a collator (`EDMemMaskingCollator` in pre-training, `EDMemSeq2SeqCollator` in fine-tuning): its batch
    plus `rows_to_write`, a `TrainingRowsToWrite` the model writes rows from and reads them in place of table rows.

    Each entity labelled in the batch's examples is written when it is one of the written-only entities (a share of
    all, fixed by `seed`, and `written_only_ids`: practice entities that pre-training reads about only to teach the
    writer), or else with probability `options.written_row_share`, from a passage of `passages` that mentions it and
    that the batch does not read (an example's `example_index` is its passage, as `edmem pretrain` gives it; a
    question is no passage). An entity with no such passage, or no name, keeps its table row. Where a written
    entity's name is all `<mask>` in the input, the encoder's memory reads its written row itself (`read_at`).
    Written-only entities appear under fresh names (a name no entity has, the same in the passages read and in the
    writer's input), so that nothing the layers memorise about a name answers for them. What the other options add
    (decoys, row auto-encoding, several passages a row, the rows that answer) is said by `WriterTrainingArguments`'s
    fields and by the methods that do it. The choices are drawn from `seed` and the examples' tokens, so that a
    resumed run draws them again as the uninterrupted one did.

    Args:
        base: the collator whose batch this extends.
        passages: the passages to write from: a sequence of dicts with `input_ids` (a corpus split).
        entity_passages: `EntityPassages` of `passages`.
        names: each entity id's name (`EntityVocab.names`).
        tokenizer: the model's tokenizer (names are tokenised as they follow `<E_s>` in text).
        config: the model's `EDMemConfig` (marker, end and padding ids).
        options: `WriterTrainingArguments`, resolved.
    """

    base: Callable[[Sequence[dict]], dict[str, torch.Tensor]]
    passages: Any
    entity_passages: EntityPassages
    names: Sequence[str | None]
    tokenizer: Any
    config: Any
    options: Any  # a `writer_training.WriterTrainingArguments`, resolved (this module does not import it)
    seed: int = 0
    written_only_ids: Sequence[int] = ()
    _name_ids: dict[int, list[int]] = field(init=False, repr=False, default_factory=dict)
    _sentence_ends: frozenset[int] | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        for name in ("written_row_share", "written_only_share", "row_autoencoding_share", "fresh_name_share"):
            if not 0.0 <= getattr(self.options, name) <= 1.0:
                raise ValueError(f"--{name} must be in [0, 1], got {getattr(self.options, name)}")
        if self.options.row_autoencoding_written_only and not self.options.row_autoencoding_share:
            raise ValueError("--row_autoencoding_written_only limits row auto-encoding, which is off: give "
                             "--row_autoencoding_share > 0")  # fmt: skip
        if self.options.writer_decoy_rows < 0:
            raise ValueError(f"--writer_decoy_rows must be >= 0, got {self.options.writer_decoy_rows}")
        if self.options.writer_decoy_rows and not self.options.fresh_names:
            raise ValueError("--writer_decoy_rows are written under fresh names, which are off: give --fresh_names")
        if self.options.writer_decoys_for_every_entity and not self.options.writer_decoy_rows:
            raise ValueError("--writer_decoys_for_every_entity widens --writer_decoy_rows, which are off: give it > 0")
        if self.options.fresh_name_share and not self.options.fresh_names:
            raise ValueError("--fresh_name_share renames more entities, but fresh names are off: give --fresh_names")
        if self.options.fresh_names_like_written_only and not self.options.fresh_names:
            raise ValueError("--fresh_names_like_written_only chooses the words of fresh names, which are off: give "
                             "--fresh_names")  # fmt: skip
        if self.options.writer_reads_answer_rows and not self.options.writer_answer_rows:
            raise ValueError(
                "--writer_reads_answer_rows reads the rows that answer, which are off: give --writer_answer_rows"
            )
        if self.options.writer_answer_rows_by_text and not self.options.writer_answer_rows:
            raise ValueError(
                "--writer_answer_rows_by_text widens the rows that answer, which are off: give --writer_answer_rows"
            )
        if self.options.writer_passages_per_row < 1:
            raise ValueError(f"--writer_passages_per_row must be >= 1, got {self.options.writer_passages_per_row}")
        if self.options.max_written_rows < 1:
            raise ValueError(f"--max_written_rows must be >= 1, got {self.options.max_written_rows}")
        if len(self.names) != self.config.entity_vocab_size:
            raise ValueError(f"{len(self.names)} entity names for a table of {self.config.entity_vocab_size} rows")
        draws = np.random.default_rng([self.seed, 0x57121]).random(self.config.entity_vocab_size)
        self.written_only = draws < self.options.written_only_share
        chosen = np.asarray(list(self.written_only_ids), dtype=np.int64)
        if ((chosen < 0) | (chosen >= self.config.entity_vocab_size)).any():
            raise ValueError(f"written_only_ids outside the table of {self.config.entity_vocab_size} rows")
        self.written_only[chosen] = True
        # the written-only entities a fresh name can rename (a name of several words): the decoys, and with
        # fresh_names_like_written_only the words of fresh names
        self._decoy_pool = [entity for entity in np.flatnonzero(self.written_only).tolist()
                            if self.names[entity] is not None and len(self.names[entity].split()) > 1]  # fmt: skip
        named = [self.names[e] for e in self._decoy_pool] if self.options.fresh_names_like_written_only else self.names
        words = [name.split() for name in named if name is not None and len(name.split()) > 1]
        self._name_words = (sorted({w[0] for w in words}), sorted({w[-1] for w in words}))
        self._known_names = {name for name in self.names if name is not None}

    @classmethod
    def from_corpus(
        cls, base: Callable, corpus_dir: str, model: Any, tokenizer: Any, options: Any, seed: int
    ) -> WriterCollator:
        """`base` extended with rows written from the train passages of an `edmem build-corpus` folder, its entities
        matched to the model's by name (fine-tuning)."""
        import os

        from datasets import load_from_disk

        from ..entity_vocab import EntityVocab

        if options.writer_answer_rows:
            raise ValueError("--writer_answer_rows reads the entities of the corpus's passages by the corpus's ids, "
                             "which are the model's in pre-training only")  # fmt: skip
        if model.entity_vocab is None:
            raise ValueError("writing rows needs the model's entity_vocab: the writer reads names")
        vocab = model.entity_vocab
        corpus_names = EntityVocab.load(corpus_dir).names
        id_map = np.array([vocab.id_of(n) if n is not None and n in vocab else IGNORE_INDEX for n in corpus_names])
        passages = load_from_disk(os.path.join(corpus_dir, "passages"))["train"]
        index = EntityPassages.from_dataset(passages, model.config.entity_vocab_size, id_map)
        return cls(base, passages, index, vocab.names, tokenizer, model.config, options, seed=seed)

    def name_ids(self, entity: int) -> list[int]:
        """The tokens of `entity`'s name, as they follow `<E_s>` in running text."""
        if entity not in self._name_ids:
            self._name_ids[entity] = self._tokens_of_name(self.names[entity])
        return self._name_ids[entity]

    def _tokens_of_name(self, name: str) -> list[int]:
        text = f"{ENTITY_START_TOKEN} {name} {ENTITY_END_TOKEN}"
        return self.tokenizer(text, add_special_tokens=False).input_ids[1:-1]

    def writer_input(self, entity: int, passage: int, name_ids: list[int] | None = None) -> list[int]:
        """`<s> <E_s> name <E_e> passage </s>` for `entity` from passage `passage` (`entity_writer.writer_input_ids`);
        with `name_ids`, under that name, in front and at its mentions in the passage."""
        return self._writer_input_of(entity, self.passages[int(passage)], name_ids)

    def _writer_input_of(self, entity: int, row: dict, name_ids: list[int] | None) -> list[int]:
        """`writer_input` from the passage's record `row` (read once by a batch that needs its labels too)."""
        ids = list(row["input_ids"])
        if name_ids is not None:
            ids = renamed(ids, list(row["entity_labels"]), {entity: name_ids}, self.config)[0]
        return writer_input_ids(name_ids or self.name_ids(entity), ids, self.config, self.options.writer_max_length,
                                self.tokenizer.bos_token_id)  # fmt: skip

    def choose(self, examples: Sequence[dict]) -> tuple[dict[int, int], dict[int, list[int]]]:
        """The batch's written entities and the passage each is written from, `{entity id: passage index}`, and the
        fresh names of those renamed, `{entity id: name tokens}`."""
        read = _passages_read(examples)
        entities = sorted({int(label) for example in examples for key in ("entity_labels", "decoder_entity_labels")
                           for label in (example.get(key) or ()) if label != IGNORE_INDEX})  # fmt: skip
        rng = self._epoch_rng(examples)
        first, then = [], []
        for entity in entities:
            if self.names[entity] is None:
                continue
            written_only = bool(self.written_only[entity])
            if not (written_only or rng.random() < self.options.written_row_share):
                continue
            weights = self.entity_passages.mentions_of(entity) if self.options.writer_passages_by_mentions else None
            passage = _passage_not_read(self.entity_passages.of(entity), read, rng, weights)
            if passage is not None:
                (first if written_only else then).append((entity, passage))
        chosen = dict((first + then)[: self.options.max_written_rows])
        fresh = {}
        for entity in chosen:
            # (no draw where the share is 0: the batches of a run without it are drawn as they always were)
            renamed = self.written_only[entity] or (
                self.options.fresh_name_share and rng.random() < self.options.fresh_name_share
            )
            if self.options.fresh_names and renamed and len(self.names[entity].split()) > 1:
                name = self._fresh_name(rng)
                if name is not None:
                    fresh[entity] = name
        if self.options.writer_decoy_rows:
            self._add_decoys(chosen, fresh, set(entities), read, rng)
        return chosen, {entity: self._tokens_of_name(name) for entity, name in fresh.items()}

    def pooled_passages(self, chosen: dict[int, int], examples: Sequence[dict]) -> dict[int, list[int]]:
        """Up to `passages_per_row - 1` more passages for each entity of `chosen` (`{entity: passage}`), drawn
        uniformly from those that mention it, other than its chosen one and those the batch reads (`{}` when
        `passages_per_row` is 1)."""
        if self.options.writer_passages_per_row == 1:
            return {}
        read = _passages_read(examples)
        rng = self._epoch_rng(examples, 0x9001)
        more = {}
        for entity, first in chosen.items():
            more[entity] = _passages_not_read(self.entity_passages.of(entity), read | {first},
                                              self.options.writer_passages_per_row - 1, rng)  # fmt: skip
        return more

    def _add_decoys(self, chosen: dict[int, int], fresh: dict[int, str], labelled: set[int], read: set[int],
                    rng: np.random.Generator) -> None:  # fmt: skip
        """Up to `decoy_rows` decoys for each renamed entity (with `decoys_for_every_entity`, for each written entity
        of a name of several words, one an entity in turn), into `chosen` and `fresh` (at most `max_written_rows`
        written rows in all): written-only entities that the batch does not label, each under a fresh name that keeps
        the entity's first word (even decoys) or its last (odd ones)."""
        firsts, lasts = self._name_words
        taken = set(fresh.values())
        names = list(fresh.values())
        if self.options.writer_decoys_for_every_entity:
            names += [self.names[e] for e in chosen if e not in fresh and len(self.names[e].split()) > 1]
            order = [(i, name) for i in range(self.options.writer_decoy_rows) for name in names]
        else:
            order = [(i, name) for name in names for i in range(self.options.writer_decoy_rows)]
        for i, name in order:
            first, last = name.split()[0], name.split()[-1]
            if len(chosen) >= self.options.max_written_rows:
                return
            decoy = self._decoy_pool[rng.integers(len(self._decoy_pool))]
            if decoy in labelled or decoy in chosen:
                continue
            passage = _passage_not_read(self.entity_passages.of(decoy), read, rng)
            if passage is None:
                continue
            other = f"{first} {lasts[rng.integers(len(lasts))]}" if i % 2 == 0 else \
                f"{firsts[rng.integers(len(firsts))]} {last}"  # fmt: skip
            if other in self._known_names or other in taken:
                continue
            chosen[decoy], fresh[decoy] = int(passage), other
            taken.add(other)

    def _batch_rng(self, examples: Sequence[dict], *salt: int) -> np.random.Generator:
        """A generator drawn from `seed`, the examples' tokens and `salt`: a resumed run draws what the uninterrupted
        one drew for the same batch."""
        tokens = np.concatenate([np.asarray(example["input_ids"], dtype=np.int64) for example in examples])
        return np.random.default_rng([self.seed, zlib.crc32(tokens.tobytes()), *salt])

    def _epoch_rng(self, examples: Sequence[dict], *salt: int) -> np.random.Generator:
        """`_batch_rng` salted with the examples' epochs too: the same passages read in another epoch draw anew."""
        return self._batch_rng(examples, *salt, *(int(example.get("epoch", 0)) for example in examples))

    def _fresh_name(self, rng: np.random.Generator) -> str | None:
        """The first word of one entity's name and the last of another's, a name no entity has (None if ten draws
        find none)."""
        firsts, lasts = self._name_words
        for _ in range(10):
            name = f"{firsts[rng.integers(len(firsts))]} {lasts[rng.integers(len(lasts))]}"
            if name not in self._known_names:
                return name
        return None

    def __call__(self, examples: Sequence[dict]) -> dict[str, torch.Tensor]:
        chosen, fresh = self.choose(examples)
        if fresh:
            examples = [_renamed_example(example, fresh, self.config) for example in examples]
        batch = self.base(examples)
        if not chosen:
            return batch
        more = self.pooled_passages(chosen, examples)
        sentence_rng = self._epoch_rng(examples, 0x5E7) if self.options.writer_sentence_rows else None
        owners, named, sources, inputs = [], [], [], []  # several passages an entity: the mean of their rows
        for entity, passage in chosen.items():
            for drawn in (passage, *more.get(entity, ())):
                row = self.passages[int(drawn)]
                if sentence_rng is not None and self.written_only[entity]:
                    sentences = self.sentences_of(entity, row)
                    row = sentences[sentence_rng.integers(len(sentences))] if sentences else row
                owners.append(entity)
                if self.options.writer_answer_rows:  # the entities its passage names, for `_answering`
                    named.append({int(label) for label in row["entity_labels"] if label >= 0})
                if self.options.writer_answer_rows_by_text:  # its tokens, for `_answering_by_text`
                    sources.append(row["input_ids"])
                inputs.append(self._writer_input_of(entity, row, fresh.get(entity)))
        width = max(map(len, inputs))
        pad = self.config.pad_token_id
        batch["written_entity_ids"] = torch.tensor(owners, dtype=torch.long)
        batch["writer_input_ids"] = torch.tensor([ids + [pad] * (width - len(ids)) for ids in inputs])
        batch["writer_attention_mask"] = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in inputs])
        batch["written_read_entity_ids"] = self._masked_names(batch, batch["written_entity_ids"])
        if self.options.row_autoencoding_share > 0:
            self._autoencode(batch, examples)
        if self.options.writer_answer_rows:
            batch["written_rows_answering"] = self._answering(batch, owners, named)
            if self.options.writer_answer_rows_by_text:
                passages = sum("labels" not in example for example in examples)  # stacked before the questions
                batch["written_rows_answering"] |= self._answering_by_text(batch, passages, sources)
            if self.options.writer_reads_answer_rows:
                batch["read_answering_rows"] = True
        return packed(batch)

    def _answering(self, batch: dict[str, torch.Tensor], owners: list[int], named: list[set[int]]) -> torch.Tensor:
        """`(batch, K)` bool: whether the passage that entity `owners[k]`'s row is written from (naming the entities
        `named[k]`) names an entity that example `b` hides, other than `owners[k]`."""
        input_ids, labels = batch["input_ids"], batch["entity_labels"]
        targets = batch.get("decoder_entity_labels", labels)
        shown = (input_ids == self.config.entity_start_token_id) & ~self._name_hidden(input_ids) & (labels >= 0)
        hidden = [set(targets[b][targets[b] >= 0].tolist()) - set(labels[b][shown[b]].tolist())
                  for b in range(input_ids.shape[0])]  # fmt: skip
        return torch.tensor([[bool((hides - {owner}) & names) for owner, names in zip(owners, named)]
                             for hides in hidden], dtype=torch.bool).reshape(len(hidden), len(owners))  # fmt: skip

    def _answering_by_text(self, batch: dict[str, torch.Tensor], first_question: int, sources: list) -> torch.Tensor:
        """`(batch, K)` bool: whether example `b` is a question (a row from `first_question` on) whose answer, the
        words of its target, occurs as a run of words in the passage `sources[k]` (its token ids) that row `k` is
        written from."""
        dropped = {self.config.entity_start_token_id, self.config.entity_end_token_id, self.config.pad_token_id,
                   self.config.eos_token_id, self.tokenizer.bos_token_id, self.tokenizer.mask_token_id}  # fmt: skip

        def words(ids: list[int]) -> str:
            """The words of token ids, markers and special tokens dropped, lower-cased and space-delimited at both
            ends (`" born in lyon "`), so that one run of words is in another where its string is."""
            text = self.tokenizer.decode([i for i in ids if i >= 0 and i not in dropped])
            return " " + " ".join(re.findall(r"\w+", text.lower())) + " "

        answering = torch.zeros(batch["input_ids"].shape[0], len(sources), dtype=torch.bool)
        answers = {b: words(batch["labels"][b].tolist()) for b in range(first_question, len(answering))}
        answers = {b: answer for b, answer in answers.items() if answer.strip()}
        if answers:
            texts = [words(ids) for ids in sources]
            for b, answer in answers.items():
                answering[b] = torch.tensor([answer in text for text in texts])
        return answering

    def _autoencode(self, batch: dict[str, torch.Tensor], examples: Sequence[dict]) -> None:
        """Row auto-encoding (EMAT's key-value auto-encoding, for entity rows): for `row_autoencoding_share` of the
        passages (not questions) that mention a written entity, the input becomes `<s> <E_s> <mask> <E_e> </s>` with
        the first such entity's written row handed to the memory at its `<E_s>`, and the target stays the whole
        passage: the decoder rebuilds a passage about the entity from its row alone (written from another passage),
        so that a row comes to carry the entity's name and facts and the reader to take them. Nothing is linked in
        such an input. With `row_autoencoding_written_only`, only passages about written-only entities are: an
        entity trained on has its facts in the layers, and a decoder rebuilding its passage needs only who the row
        is, not what it says."""
        rng = self._batch_rng(examples, 0xAE)
        input_ids, labels = batch["input_ids"], batch["entity_labels"]
        start, written = self.config.entity_start_token_id, batch["written_entity_ids"]
        if self.options.row_autoencoding_written_only:
            written = written[torch.from_numpy(self.written_only)[written]]
        handed = batch["written_read_entity_ids"]
        alone = [self.tokenizer.bos_token_id, start, self.tokenizer.mask_token_id,
                 self.config.entity_end_token_id, self.config.eos_token_id]  # fmt: skip
        passages = sum("labels" not in example for example in examples)  # stacked first, before any question
        for row in range(passages):
            mentions = ((input_ids[row] == start) & torch.isin(labels[row], written)).nonzero()
            if not len(mentions) or rng.random() >= self.options.row_autoencoding_share:
                continue
            entity = int(labels[row, mentions[0, 0]])
            input_ids[row] = self.config.pad_token_id
            input_ids[row, : len(alone)] = torch.tensor(alone)
            batch["attention_mask"][row] = 0
            batch["attention_mask"][row, : len(alone)] = 1
            labels[row] = IGNORE_INDEX
            handed[row] = IGNORE_INDEX
            handed[row, 1] = entity

    def _masked_names(self, batch: dict[str, torch.Tensor], written: torch.Tensor) -> torch.Tensor:
        """`entity_labels` kept at each `<E_s>` of a written entity whose name (the tokens up to `<E_e>`) is all
        `<mask>` in `input_ids`, -100 elsewhere."""
        input_ids, labels = batch["input_ids"], batch["entity_labels"]
        handed = (input_ids == self.config.entity_start_token_id) & self._name_hidden(input_ids)
        handed &= torch.isin(labels, written)
        return torch.where(handed, labels, torch.full_like(labels, IGNORE_INDEX))

    def _name_hidden(self, input_ids: torch.Tensor) -> torch.Tensor:
        """`(batch, seq)` bool, at each token: whether the tokens of the mention it is in (counted from its `<E_s>`
        up to `<E_e>`) are all `<mask>`."""
        start, end = self.config.entity_start_token_id, self.config.entity_end_token_id
        inside = (input_ids == start).long().cumsum(1) - (input_ids == end).long().cumsum(1) > 0
        inside &= input_ids != start
        unmasked_inside = (inside & (input_ids != self.tokenizer.mask_token_id)).long()
        # per mention (numbered by its <E_s>), whether any of its tokens is left unmasked
        mention = (input_ids == start).long().cumsum(1) - 1
        seen = torch.zeros(input_ids.shape[0], int(mention.max()) + 2, dtype=torch.long)
        seen.scatter_add_(1, mention.clamp_min(0) + 1, unmasked_inside)
        return seen.gather(1, mention.clamp_min(0) + 1) == 0

    def rows_to_write(
        self, every_entity: bool = False, max_passages: int | None = None, entities: Sequence[int] | None = None
    ) -> tuple[list[int], list[list[list[int]]]]:
        """The entities whose rows `write_rows_as_read` writes once training ends, and up to `max_passages`
        (None: 4, or `passages_per_row` when more) writer inputs of each (the first passages, or with
        `passages_by_mentions` those that mention it most): the written-only entities that have passages, or with
        `every_entity` every entity that has passages and a name (the table written from text), or those of
        `entities` that have."""
        ids, inputs = [], []
        max_passages = max_passages or max(4, self.options.writer_passages_per_row)
        if entities is None:
            entities = range(len(self.names)) if every_entity else np.flatnonzero(self.written_only).tolist()
        for entity in entities:
            if self.options.writer_passages_by_mentions:
                passages = self.entity_passages.most_mentioning(entity, max_passages)
            else:
                passages = self.entity_passages.of(entity)[:max_passages]
            if len(passages) and self.names[entity] is not None:
                ids.append(entity)
                texts = [self.passages[int(passage)] for passage in passages]
                if self.options.writer_sentence_rows and self.written_only[entity]:
                    sentences = [sentence for text in texts for sentence in self.sentences_of(entity, text)]
                    texts = sentences[:max_passages] or texts
                inputs.append([self._writer_input_of(entity, text, None) for text in texts])
        return ids, inputs

    def sentences_of(self, entity: int, row: dict) -> list[dict]:
        """The sentences of the passage record `row` that mention `entity`, each a record of its own (`input_ids`,
        `entity_labels`), in passage order: what a written-only entity's rows are written from with
        `writer_sentence_rows`, a row a sentence, as `edmem add-entities` writes an added entity's rows from the
        sentences of its page. A sentence ends at a token ending in `.`, `!` or `?` (or a line break) outside a
        mention."""
        ids, labels = list(row["input_ids"]), list(row["entity_labels"])
        ends = self._sentence_end_ids()
        start, end = self.config.entity_start_token_id, self.config.entity_end_token_id
        sentences, begin, inside = [], 0, False
        for i, token in enumerate(ids):
            inside = (inside or token == start) and token != end
            if (not inside and token in ends) or i == len(ids) - 1:
                if entity in labels[begin : i + 1]:
                    sentences.append({"input_ids": ids[begin : i + 1], "entity_labels": labels[begin : i + 1]})
                begin = i + 1
        return sentences

    def _sentence_end_ids(self) -> frozenset[int]:
        """The tokenizer's tokens that end a sentence: their text ends in `.`, `!` or `?` (closing quotes and
        brackets aside) or holds a line break. Found once, from the vocabulary."""
        if self._sentence_ends is None:
            ends = set()
            for token, token_id in self.tokenizer.get_vocab().items():
                text = self.tokenizer.convert_tokens_to_string([token])
                if text.rstrip().rstrip("\"')]").endswith((".", "!", "?")) or "\n" in text:
                    ends.add(token_id)
            self._sentence_ends = frozenset(ends - set(self.tokenizer.all_special_ids))
        return self._sentence_ends


def freeze_the_writer(model: Any, collator: WriterCollator) -> None:
    """TOME's second stage (`--frozen_writer`): the writer and what it reads (the encoder's lower layers, the position
    and token embeddings; the latter tied to the decoder's and the LM head) leave the optimizer, every entity's row is
    written by them from `collator`'s passages now, and the table leaves the optimizer too. The rows read in training
    are then the rows the same writer writes for entities added later, and the table is the one searched at test
    (a model that reads a row a passage keeps each entity's rows apart beside it, as growth writes them)."""
    from .entity_growth import write_rows_as_read

    encoder = model.get_encoder()
    lower = encoder.layers[: model.config.encoder_lower_layers]
    for module in (model.entity_writer, encoder.embed_tokens, encoder.embed_positions, encoder.layernorm_embedding):
        module.requires_grad_(False)
    lower.requires_grad_(False)
    with torch.no_grad():
        write_rows_as_read(model, *collator.rows_to_write(every_entity=True))
    encoder.entity_embeddings.weight.requires_grad_(False)


def renamed(ids: list[int], labels: list[int], names: dict[int, list[int]], config: Any) -> tuple[list, list]:
    """`ids` and `labels` with every mention labelled with an entity of `names` (its tokens between `<E_s>` and
    `<E_e>`) spelled `names[entity]` instead, in one pass."""
    start, end = config.entity_start_token_id, config.entity_end_token_id  # read once: a config attribute is slow
    out_ids, out_labels, inside = [], [], False
    for token, label in zip(ids, labels):
        if inside:
            if token != end:
                continue
            inside = False
        out_ids.append(token)
        out_labels.append(label)
        if token == start and label in names:
            out_ids += names[label]
            out_labels += [IGNORE_INDEX] * len(names[label])
            inside = True
    return out_ids, out_labels


def _renamed_example(example: dict, fresh: dict[int, list[int]], config: Any) -> dict:
    """`example` with the entities of `fresh` renamed in its input (and its target, for a fine-tuning example)."""
    example = dict(example)
    for ids_key, labels_key in (("input_ids", "entity_labels"), ("labels", "decoder_entity_labels")):
        if example.get(labels_key) is None or ids_key not in example:
            continue
        ids, labels = renamed(list(example[ids_key]), list(example[labels_key]), fresh, config)
        example[ids_key], example[labels_key] = _cut_to(ids, labels, config.max_position_embeddings, config)
    return example


def _cut_to(ids: list[int], labels: list[int], length: int, config: Any) -> tuple[list[int], list[int]]:
    """`ids` and `labels` of at most `length` tokens: a passage that renaming made longer than the model's positions
    loses its tail, cut before a mention the cut would split, its last token (`</s>`) kept."""
    if len(ids) <= length:
        return ids, labels
    start, end = config.entity_start_token_id, config.entity_end_token_id
    cut, open_mention = length - 1, None
    for i, token in enumerate(ids[:cut]):
        open_mention = i if token == start else None if token == end else open_mention
    cut = cut if open_mention is None else open_mention
    return ids[:cut] + ids[-1:], labels[:cut] + labels[-1:]


def _passages_read(examples: Sequence[dict]) -> set[int]:
    """The passages a batch reads (its examples' `example_index`; a question is none): never written from."""
    return {int(example["example_index"]) for example in examples if "example_index" in example}


def _passages_not_read(passages: np.ndarray, read: set[int], count: int, rng: np.random.Generator) -> list[int]:
    """Up to `count` distinct passages of `passages` (ascending, as `EntityPassages.of` gives them) not in `read`,
    uniformly, ascending."""
    if len(passages) > max(LISTED_PASSAGES, 4 * (len(read) + count)):
        drawn: set[int] = set()
        while len(drawn) < count:  # most passages are not read: a few draws beyond `count`
            passage = int(passages[rng.integers(len(passages))])
            if passage not in read:
                drawn.add(passage)
        return sorted(drawn)
    others = [p for p in passages.tolist() if p not in read]
    picked = sorted(rng.choice(len(others), size=min(count, len(others)), replace=False))
    return [others[i] for i in picked]


def _passage_not_read(
    passages: np.ndarray, read: set[int], rng: np.random.Generator, weights: np.ndarray | None = None
) -> int | None:
    """One of `passages` not in `read`, or None. Uniformly: a few draws from all of them when most are not read (an
    entity of a million passages is not listed each batch), else from the list of the others; with `weights`, in
    proportion to them over the others, in one pass over the list."""
    if weights is None:
        if len(passages) > 4 * len(read):
            for _ in range(8):
                passage = int(passages[rng.integers(len(passages))])
                if passage not in read:
                    return passage
        others = [passage for passage in passages.tolist() if passage not in read]
        return others[rng.integers(len(others))] if others else None
    keep = ~np.isin(passages, np.fromiter(read, dtype=np.int64, count=len(read)))
    if not keep.any():
        return None
    cumulative = np.cumsum(np.where(keep, weights, 0))
    return int(passages[np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right")])


__all__ = ["EntityPassages", "WriterCollator"]

"""Training that reads written rows (`writer_batches.WriterCollator`, `edmem pretrain` with `entity_row_writer`):
a row is never written from a passage the batch reads, the choice is a function of the batch (exact resume), and
the written-only entities leave pre-training with the rows their passages write."""

from __future__ import annotations

import json
import os
import random
import sys
from dataclasses import asdict, replace

import numpy as np
import pytest
import torch
from datasets import load_from_disk
from huggingface_hub.errors import StrictDataclassClassValidationError

from edmem_hf import EDMemForConditionalGeneration, EntityVocab
from edmem_hf.collator import EDMemMaskingCollator
from edmem_hf.entity_writer import RowsToWrite
from edmem_hf.pretraining import _dataloaders, build_model, pretrain, pretraining_options
from edmem_hf.research.entity_growth import written_rows
from edmem_hf.research.writer_batches import EntityPassages, TrainingRowsToWrite, WriterCollator
from edmem_hf.research.writer_training import WriterTrainingArguments

sys.path.insert(0, os.path.dirname(__file__))
from test_collator import ENTITY_NAMES, make_corpus, make_tokenizer  # noqa: E402
from test_pretraining import _args as _plain_args  # noqa: E402
from test_pretraining import _weights  # noqa: E402
from tiny_models import tiny_config  # noqa: E402

# the collator's old keyword names -> `WriterTrainingArguments`' fields
_OPTION_NAMES = {"max_length": "writer_max_length", "decoy_rows": "writer_decoy_rows",
                 "decoys_for_every_entity": "writer_decoys_for_every_entity",
                 "passages_by_mentions": "writer_passages_by_mentions", "passages_per_row": "writer_passages_per_row",
                 "answer_rows": "writer_answer_rows", "read_answer_rows": "writer_reads_answer_rows",
                 "answer_rows_by_text": "writer_answer_rows_by_text"}  # fmt: skip
_FLAT = {"entity_ids": "written_entity_ids", "input_ids": "writer_input_ids", "attention_mask": "writer_attention_mask",
         "read_at": "written_read_entity_ids", "answering": "written_rows_answering",
         "read_answering": "read_answering_rows"}  # fmt: skip


def flat(batch: dict) -> dict:
    """A batch with its `rows_to_write` spread back into named fields (`written_entity_ids`, ...), the fields left
    unset left out, so that the tests read each by name."""
    rows = batch.pop("rows_to_write", None)
    if rows is not None:
        for name, key in _FLAT.items():
            value = getattr(rows, name)
            if value is not None and value is not False:
                batch[key] = value
    return batch


class FlatWriterCollator(WriterCollator):
    """`WriterCollator` whose batches are `flat`."""

    def __call__(self, examples):
        return flat(super().__call__(examples))


def _args(corpus, out, **options) -> dict:
    """`pretrain`'s arguments (`args`, `writer`, `mixing`) from the tests' settings and `options` by name."""
    return pretraining_options(**{**asdict(_plain_args(corpus, out)), **options})


def loader_of(options: dict, passages, tokenizer, vocab):
    """The train loader `edmem pretrain` builds with `options` (`_args`)."""
    model = build_model(options["args"], tokenizer, vocab, options["writer"])
    return _dataloaders(options["args"], passages, tokenizer, 1, model, options["writer"], options["mixing"])[1]


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), n_train=64, n_validation=16)


def writer_collator(corpus, seed: int = 0, written_only_ids=(), **settings) -> WriterCollator:
    settings.setdefault("written_only_share", 0.0)
    options = WriterTrainingArguments(**{_OPTION_NAMES.get(key, key): value for key, value in settings.items()})
    tokenizer = make_tokenizer()
    passages = load_from_disk(os.path.join(corpus, "passages"))["train"]
    names = EntityVocab.load(corpus).names
    config = tiny_config(vocab_size=len(tokenizer), entity_vocab_size=len(names), entity_start_token_id=5,
                         entity_end_token_id=6, max_position_embeddings=160)  # fmt: skip
    base = EDMemMaskingCollator(tokenizer, seed=3)
    return FlatWriterCollator(base, passages, EntityPassages.from_dataset(passages, len(names)), names, tokenizer,
                              config, options, seed=seed, written_only_ids=written_only_ids)  # fmt: skip


@pytest.mark.parametrize("by_mentions", [False, True])
def test_a_row_is_never_written_from_a_passage_the_batch_reads(corpus, by_mentions):
    collator = writer_collator(corpus, written_row_share=1.0, max_written_rows=64, passages_by_mentions=by_mentions)
    passages = collator.passages
    rng = random.Random(0)
    written = handed_reads = 0
    for _ in range(40):
        indices = rng.sample(range(len(passages)), 8)
        examples = [{**passages[i], "example_index": i, "epoch": 0} for i in indices]
        batch = collator(examples)
        chosen, fresh = collator.choose(examples)
        assert not fresh  # no entity is written-only here
        labelled = set(batch["entity_labels"][batch["entity_labels"] >= 0].tolist())
        if not chosen:
            continue
        assert batch["written_entity_ids"].tolist() == list(chosen)
        for row, (entity, passage) in enumerate(chosen.items()):
            assert entity in labelled  # an entity the batch reads
            assert passage not in indices  # TOME's rule: never a passage of the batch
            assert entity in passages[passage]["entity_labels"]  # a passage about it
            length = int(batch["writer_attention_mask"][row].sum())
            expected = collator.writer_input(entity, passage)
            assert batch["writer_input_ids"][row, :length].tolist() == expected
            marked = collator.tokenizer(f"<E_s> {collator.names[entity]} <E_e>", add_special_tokens=False).input_ids
            assert expected[: 1 + len(marked)] == [collator.tokenizer.bos_token_id, *marked]  # the name in front
            written += 1
        # the encoder's memory is handed the written row where the entity's name is masked, and only there
        handed = batch["written_read_entity_ids"]
        for row, position in (batch["input_ids"] == 5).nonzero().tolist():
            end = position + (batch["input_ids"][row, position:] == 6).nonzero()[0, 0].item()
            name_masked = bool((batch["input_ids"][row, position + 1 : end] == collator.tokenizer.mask_token_id).all())
            entity = int(batch["entity_labels"][row, position])
            expected = entity if name_masked and entity in chosen else -100
            assert int(handed[row, position]) == expected
        assert (handed[batch["input_ids"] != 5] == -100).all()
        # an entity every passage of which the batch reads cannot be written
        for entity in labelled - set(chosen):
            assert set(collator.entity_passages.of(entity).tolist()) <= set(indices)
        assert collator(examples)["written_entity_ids"].tolist() == list(chosen)  # the same batch, the same rows
        handed_reads += int((handed >= 0).sum())
    assert written > 100 and handed_reads > 10


def test_written_only_entities_appear_under_a_fresh_name(corpus):
    """A written-only entity is renamed in the batch's passages and in its writer input alike: a name made of one
    entity's first word and another's last, no entity's name; the others keep theirs."""
    collator = writer_collator(corpus, written_row_share=0.0, written_only_share=0.5, seed=3)
    passages, tokenizer = collator.passages, collator.tokenizer
    examples = [{**passages[i], "example_index": i} for i in range(8)]
    chosen, fresh = collator.choose(examples)
    assert fresh and set(fresh) == set(chosen)  # every entity of the test corpus has a two-word name
    batch = collator(examples)
    known = set(collator.names)
    for entity, name_ids in fresh.items():
        name = tokenizer.decode(name_ids).strip()
        first, last = name.split()
        assert name not in known and first in {n.split()[0] for n in known} and last in {n.split()[-1] for n in known}
        row = batch["written_entity_ids"].tolist().index(entity)
        writer = batch["writer_input_ids"][row].tolist()
        assert writer[1 : 2 + len(name_ids) + 1] == [5, *name_ids, 6]  # the fresh name in front
        for i, labels in enumerate(batch["entity_labels"].tolist()):  # and at each of its mentions read
            for position in [p for p, label in enumerate(labels) if label == entity]:
                spelled = batch["labels"][i, position + 1 : position + 1 + len(name_ids)].tolist()
                assert spelled == name_ids and batch["labels"][i, position + 1 + len(name_ids)] == 6
    renamed_away = {collator.names[entity] for entity in fresh}
    original = tokenizer.decode([t for e in examples for t in e["input_ids"]])
    assert all(name in original for name in renamed_away)
    assert not any(name in tokenizer.decode(batch["labels"][batch["labels"] >= 0]) for name in renamed_away)
    plain = writer_collator(corpus, written_row_share=0.0, written_only_share=0.5, seed=3, fresh_names=False)
    assert plain.choose(examples) == (chosen, {})


def test_fresh_name_share_renames_that_share_of_the_other_written_entities(corpus):
    """With `fresh_name_share` the written entities that are not written-only are renamed too, about that share of
    them (all at 1.0); at 0 the batches are drawn exactly as without the option; it needs fresh names."""
    settings = dict(written_row_share=1.0, written_only_share=0.0, seed=7, max_written_rows=64)
    batches = [[{**writer_collator(corpus).passages[i], "example_index": i} for i in range(start, start + 8)]
               for start in range(0, 64, 8)]  # fmt: skip
    plain = writer_collator(corpus, **settings)
    assert [plain.choose(b) for b in batches] == [writer_collator(corpus, fresh_name_share=0.0, **settings).choose(b)
                                                 for b in batches]  # fmt: skip
    assert all(not fresh for _, fresh in (plain.choose(b) for b in batches))
    every = writer_collator(corpus, fresh_name_share=1.0, **settings)
    for examples in batches:
        chosen, fresh = every.choose(examples)
        assert chosen and set(fresh) == set(chosen)  # every entity of the test corpus has a two-word name
    half = writer_collator(corpus, fresh_name_share=0.5, **settings)
    renamed = [(len(fresh), len(chosen)) for chosen, fresh in (half.choose(b) for b in batches)]
    share = sum(r for r, _ in renamed) / sum(c for _, c in renamed)
    assert 0.3 < share < 0.7, share
    with pytest.raises(ValueError, match="fresh_name_share renames more entities, but fresh names are off"):
        writer_collator(corpus, fresh_name_share=0.5, fresh_names=False)


def test_fresh_names_like_written_only_are_made_of_written_only_entities_words(corpus):
    """With `fresh_names_like_written_only`, a fresh name's first and last words are those of written-only entities'
    names (a renamed practice person looks like a person), where by default they come from every entity's."""

    def fresh_words(collator) -> tuple[set, set]:
        firsts, lasts = set(), set()
        for start in range(0, 64, 8):
            examples = [{**collator.passages[i], "example_index": i} for i in range(start, start + 8)]
            for name_ids in collator.choose(examples)[1].values():
                first, last = collator.tokenizer.decode(name_ids).strip().split()
                firsts.add(first)
                lasts.add(last)
        return firsts, lasts

    settings = dict(written_row_share=0.0, written_only_share=0.3, seed=5)
    like = writer_collator(corpus, fresh_names_like_written_only=True, **settings)
    written_only = [like.names[e] for e in np.flatnonzero(like.written_only)]
    firsts, lasts = fresh_words(like)
    assert firsts and lasts
    assert firsts <= {n.split()[0] for n in written_only} and lasts <= {n.split()[-1] for n in written_only}
    default_firsts, default_lasts = fresh_words(writer_collator(corpus, **settings))
    assert not (default_firsts <= {n.split()[0] for n in written_only} and
                default_lasts <= {n.split()[-1] for n in written_only})  # fmt: skip
    with pytest.raises(ValueError, match="which are off: give --fresh_names"):
        writer_collator(corpus, fresh_names=False, fresh_names_like_written_only=True, **settings)


def test_decoys_share_a_word_with_a_renamed_entity_and_are_absent_from_the_batch(corpus):
    """With `decoy_rows`, each renamed entity brings up to that many other written-only entities, none labelled in
    the batch, written under fresh names that keep its first or its last word; no decoy is renamed to a known name,
    the batch's own choice is what it is without decoys, and the written rows stay within `max_written_rows`."""
    settings = dict(written_row_share=0.0, written_only_share=0.6, seed=5, max_written_rows=12)
    plain, decoyed = writer_collator(corpus, **settings), writer_collator(corpus, decoy_rows=2, **settings)
    tokenizer, known, decoys = plain.tokenizer, set(plain.names), 0
    for start in range(0, 64, 4):
        examples = [{**plain.passages[i], "example_index": i} for i in range(start, start + 4)]
        chosen, fresh = plain.choose(examples)
        with_decoys, fresh_with = decoyed.choose(examples)
        assert {e: with_decoys[e] for e in chosen} == chosen and {e: fresh_with[e] for e in fresh} == fresh
        assert len(with_decoys) <= 12
        labelled = {label for example in examples for label in example["entity_labels"] if label >= 0}
        renamed = [tokenizer.decode(fresh[e]).strip().split() for e in fresh]
        added = set(with_decoys) - set(chosen)
        assert len(added) <= 2 * len(fresh)
        for decoy in added:
            assert decoyed.written_only[decoy] and decoy not in labelled
            name = tokenizer.decode(fresh_with[decoy]).strip()
            first, last = name.split()
            assert name not in known and any(first == r[0] or last == r[-1] for r in renamed)
        decoys += len(added)
        batch = decoyed(examples)
        assert set(batch["written_entity_ids"].tolist()) == set(with_decoys)
        assert not torch.isin(batch["written_read_entity_ids"], torch.tensor(sorted(added) or [-1])).any()
    assert decoys > 0
    for wrong, match in (
        (dict(decoy_rows=-1), "decoy_rows must be >= 0"),
        (dict(decoy_rows=1, fresh_names=False), "give --fresh_names"),
        (dict(decoys_for_every_entity=True), "--writer_decoy_rows, which are off"),
    ):
        with pytest.raises(ValueError, match=match):
            writer_collator(corpus, **wrong)


def test_decoys_for_every_entity_share_a_word_with_entities_under_their_own_names(corpus):
    """With `decoys_for_every_entity`, the batch's written entities that keep their names bring decoys too: under
    fresh names sharing a word of their own names (the renamed entities' decoys as before); without it, none does."""
    settings = dict(written_row_share=1.0, written_only_share=0.3, seed=5, max_written_rows=24, decoy_rows=2)
    renamed_only, every = writer_collator(corpus, **settings), writer_collator(corpus, decoys_for_every_entity=True,
                                                                               **settings)  # fmt: skip
    tokenizer = every.tokenizer
    for_named = {False: 0, True: 0}
    for start in range(0, 64, 4):
        examples = [{**every.passages[i], "example_index": i} for i in range(start, start + 4)]
        for collator, widened in ((renamed_only, False), (every, True)):
            chosen, fresh = collator.choose(examples)
            assert len(chosen) <= 24
            labelled = {label for example in examples for label in example["entity_labels"] if label >= 0}
            named = [collator.names[e].split() for e in chosen if e in labelled and e not in fresh]
            renamed = [tokenizer.decode(fresh[e]).strip().split() for e in fresh if e in labelled]
            for decoy in set(chosen) - labelled:
                first, last = tokenizer.decode(fresh[decoy]).strip().split()
                if not any(first == r[0] or last == r[-1] for r in renamed):
                    assert any(first == n[0] or last == n[-1] for n in named)
                    for_named[widened] += 1
    assert for_named == {False: 0, True: for_named[True]} and for_named[True] > 0


def test_shares_of_written_rows(corpus):
    never = writer_collator(corpus, written_row_share=0.0, written_only_share=0.0)
    passages = never.passages
    examples = [{**passages[i], "example_index": i} for i in range(8)]
    assert "written_entity_ids" not in never(examples)
    only = writer_collator(corpus, written_row_share=0.0, written_only_share=0.5, seed=1)
    assert 0 < only.written_only.sum() < len(only.names)
    chosen = set(only.choose(examples)[0])
    assert chosen and all(only.written_only[entity] for entity in chosen)
    capped = writer_collator(corpus, written_row_share=1.0, written_only_share=0.5, max_written_rows=2, seed=1)
    assert set(capped.choose(examples)[0]) <= chosen and len(capped(examples)["writer_input_ids"]) == 2
    with pytest.raises(ValueError, match="written_row_share"):
        writer_collator(corpus, written_row_share=1.5)


def test_row_autoencoding_reads_a_written_row_alone(corpus):
    """With row auto-encoding a share of the passages about a written entity is read as `<s> <E_s> <mask> <E_e>
    </s>`, the first such entity's written row handed to the memory there, its target still the whole passage; the
    other passages are untouched; and the LM loss of those rows alone trains the writer."""
    plain = writer_collator(corpus, written_row_share=1.0, seed=2)
    coded = writer_collator(corpus, written_row_share=1.0, seed=2, row_autoencoding_share=0.5)
    tokenizer = plain.tokenizer
    examples = [{**plain.passages[i], "example_index": i, "epoch": 0} for i in range(16)]
    before, after = plain(examples), coded(examples)
    assert torch.equal(before["labels"], after["labels"])  # the target: the whole passage
    assert torch.equal(before["written_entity_ids"], after["written_entity_ids"])
    alone = [tokenizer.bos_token_id, 5, tokenizer.mask_token_id, 6, tokenizer.eos_token_id]
    written, coded_rows, kept_rows = before["written_entity_ids"], [], []
    for row in range(len(examples)):
        if after["input_ids"][row, :5].tolist() != alone:
            for key in ("input_ids", "attention_mask", "entity_labels", "written_read_entity_ids"):
                assert torch.equal(before[key][row], after[key][row]), key
            kept_rows.append(row)
            continue
        coded_rows.append(row)
        mentions = ((before["input_ids"][row] == 5) & torch.isin(before["entity_labels"][row], written)).nonzero()
        assert (
            int(after["attention_mask"][row].sum()) == 5
            and (after["input_ids"][row, 5:] == tokenizer.pad_token_id).all()
        )
        assert (after["entity_labels"][row] == -100).all()  # nothing linked
        handed = after["written_read_entity_ids"][row]
        assert int(handed[1]) == int(before["entity_labels"][row, mentions[0, 0]]) and (handed[2:] == -100).all()
    assert coded_rows and kept_rows
    model = EDMemForConditionalGeneration(replace(coded.config, entity_row_writer=True)).train()
    fields = (
        "input_ids",
        "attention_mask",
        "labels",
        "entity_labels",
        "decoder_entity_labels",
        "written_read_entity_ids",
    )
    batch = {key: after[key][coded_rows] for key in fields}
    read_at = batch.pop("written_read_entity_ids")
    model(**batch, rows_to_write=TrainingRowsToWrite(after["written_entity_ids"], after["writer_input_ids"],
                                                     after["writer_attention_mask"], read_at)).loss.backward()  # fmt: skip
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.entity_writer.parameters())
    with pytest.raises(ValueError, match="row_autoencoding_share"):
        writer_collator(corpus, row_autoencoding_share=2.0)
    with pytest.raises(ValueError, match="row_autoencoding_written_only limits row auto-encoding, which is off"):
        writer_collator(corpus, row_autoencoding_written_only=True)


def test_pretraining_with_the_writer_resumes_exactly_and_writes_the_written_only_rows(corpus, tmp_path):
    common = dict(max_steps=6, gradient_accumulation_steps=2, save_steps=3, save_total_limit=2, dropout=0.1,
                  entity_row_writer=True, written_only_share=0.3)  # fmt: skip
    full = tmp_path / "full"
    pretrain(**_args(corpus, full, **common))
    killed = tmp_path / "killed"
    assert not pretrain(**_args(corpus, killed, max_steps_this_run=5, **common))["completed"]
    assert pretrain(**_args(corpus, killed, **common))["completed"]
    a, b = _weights(full), _weights(killed)
    assert a.keys() == b.keys() and any(key.startswith("entity_writer.") for key in a)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    # the written-only entities' rows are the writer's rows of their passages
    model = EDMemForConditionalGeneration.from_pretrained(full)
    collator = writer_collator(corpus, written_only_share=0.3, seed=42)  # _args' seed
    ids, inputs = collator.rows_to_write()
    assert ids
    table = model.model.entity_embeddings.weight.detach()
    assert torch.allclose(table[ids], written_rows(model, inputs), atol=1e-6)
    others = [i for i in range(len(table)) if i not in ids]
    assert not torch.allclose(table[others[:3]], written_rows(model, [inputs[0]] * 3), atol=1e-3)


def test_mixed_questions_read_written_rows_too(corpus, tmp_path):
    """With questions mixed into pre-training, the writer's collator wraps the mixed one: questions stay uncorrupted,
    written-only entities are renamed in them too, and the run trains and resumes exactly."""
    from edmem_hf.pretraining import load_corpus
    from test_pretraining import _write_questions

    questions = _write_questions(tmp_path / "qa")
    common = dict(max_steps=6, save_steps=3, entity_row_writer=True, written_only_share=0.5,
                  mixed_questions_file=questions, mixed_questions_share=0.5)  # fmt: skip
    passages, vocab, tokenizer = load_corpus(corpus)
    args = _args(corpus, tmp_path / "x", **common)
    loader = loader_of(args, passages, tokenizer, vocab)
    assert type(loader.collate_fn).__name__ == "WriterCollator"
    assert type(loader.collate_fn.base).__name__ == "QuestionsAndPassagesCollator"
    batches = [flat(batch) for _, batch in zip(range(6), loader)]
    where = tokenizer(" Where is", add_special_tokens=False).input_ids
    rows = [row for b in batches for row in b["input_ids"].tolist()]
    asked = [row for row in rows if where in (row[: len(where)], row[1 : 1 + len(where)])]
    assert asked and len(asked) < len(rows) and not any(tokenizer.mask_token_id in row for row in asked)
    assert any("written_entity_ids" in b for b in batches)
    full, killed = tmp_path / "full", tmp_path / "killed"
    pretrain(**_args(corpus, full, **common))
    assert not pretrain(**_args(corpus, killed, max_steps_this_run=4, **common))["completed"]
    assert pretrain(**_args(corpus, killed, **common))["completed"]
    a, b = _weights(full), _weights(killed)
    assert all(torch.equal(a[key], b[key]) for key in a)


def test_named_written_only_entities_join_the_share(corpus, tmp_path):
    """Practice entities (`written_only_ids`, `--written_only_entities_file`) are written-only besides the share,
    and `edmem pretrain` maps the file's names to them, refusing an unknown name or a model without a writer."""
    from edmem_hf.pretraining import load_corpus

    shared = writer_collator(corpus, written_only_share=0.2, seed=1)
    practice = [i for i, name in enumerate(shared.names) if name is not None and not shared.written_only[i]][:3]
    named = writer_collator(corpus, written_only_share=0.2, seed=1, written_only_ids=practice)
    assert set(named.written_only.nonzero()[0]) == set(shared.written_only.nonzero()[0]) | set(practice)
    with pytest.raises(ValueError, match="written_only_ids outside"):
        writer_collator(corpus, written_only_ids=[len(shared.names)])
    passages, vocab, tokenizer = load_corpus(corpus)
    names_file = tmp_path / "practice.txt"
    names_file.write_text("".join(f"{shared.names[i]}\n" for i in practice), encoding="utf-8")
    args = _args(corpus, tmp_path / "x", entity_row_writer=True, written_only_share=0.0,
                 written_only_entities_file=str(names_file))  # fmt: skip
    loader = loader_of(args, passages, tokenizer, vocab)
    assert sorted(loader.collate_fn.written_only.nonzero()[0]) == sorted(practice)
    names_file.write_text("Nobody Anywhere\n", encoding="utf-8")
    with pytest.raises(ValueError, match="not in the entity vocabulary.*Nobody Anywhere"):
        loader_of(args, passages, tokenizer, vocab)
    for option in (dict(written_only_entities_file=str(names_file)), dict(written_table=True),
                   dict(row_autoencoding_share=0.5), dict(row_autoencoding_written_only=True),
                   dict(writer_passages_by_mentions=True), dict(fresh_names_like_written_only=True),
                   dict(writer_decoy_rows=2), dict(frozen_writer=True), dict(writer_passages_per_row=3),
                   dict(fresh_name_share=0.5), dict(hide_practice_entities=True)):  # fmt: skip
        plain = _args(corpus, tmp_path / "y", **option)
        with pytest.raises(ValueError, match=f"--{next(iter(option))} is an option of training the writer"):
            loader_of(plain, passages, tokenizer, vocab)


def test_practice_entities_are_saved_hidden_with_hide_practice_entities(corpus, tmp_path):
    """`--hide_practice_entities`: the saved model hides the entities of `--written_only_entities_file` (and only
    them: the share's written-only entities are shown), restored by `from_pretrained`, so that its memory never
    finds them; refused without the file."""
    from edmem_hf import EDMemForConditionalGeneration
    from edmem_hf.pretraining import load_corpus

    shared = writer_collator(corpus, written_only_share=0.2, seed=1)
    practice = [i for i, name in enumerate(shared.names) if name is not None][:4]
    names_file = tmp_path / "practice.txt"
    names_file.write_text("".join(f"{shared.names[i]}\n" for i in practice), encoding="utf-8")
    out = tmp_path / "run"
    pretrain(**_args(corpus, out, max_steps=2, entity_row_writer=True, written_only_entities_file=str(names_file),
                   hide_practice_entities=True))  # fmt: skip
    model = EDMemForConditionalGeneration.from_pretrained(out).eval()
    shown = model._get_entity_mask("cpu")
    assert shown is not None and sorted((~shown).nonzero().flatten().tolist()) == sorted(practice)
    input_ids = torch.tensor([[model.config.bos_token_id, model.config.entity_start_token_id, 20, 21,
                               model.config.entity_end_token_id, model.config.eos_token_id]])  # fmt: skip

    def found() -> set[int]:  # the entities the memory can read at the mention (its top k covers the tiny table)
        access = model.get_encoder()(input_ids=input_ids, output_attended_entities=True).memory_access
        assert access.top_entity_ids.shape[-1] >= model.config.entity_vocab_size
        return set(access.top_entity_ids[access.top_entity_scores > float("-inf")].tolist())

    assert not found() & set(practice)
    model.set_entity_mask(None)
    assert set(practice) <= found()
    passages, vocab, tokenizer = load_corpus(corpus)
    alone = _args(corpus, tmp_path / "alone", entity_row_writer=True, hide_practice_entities=True)
    with pytest.raises(
        ValueError, match="--hide_practice_entities hides the entities of --written_only_entities_file"
    ):
        loader_of(alone, passages, tokenizer, vocab)


def test_a_pooled_row_is_the_mean_of_rows_from_passages_the_batch_does_not_read(corpus):
    """With `passages_per_row`, each written entity is written from up to that many distinct passages, its first the
    one chosen without pooling, none read by the batch, all about it; the model reads the mean of their rows; the
    written table takes as many; one passage a row is the batch it always was."""
    plain = writer_collator(corpus, written_row_share=1.0, max_written_rows=64, seed=4)
    pooled = writer_collator(corpus, written_row_share=1.0, max_written_rows=64, seed=4, passages_per_row=3)
    rng, several = random.Random(1), 0
    for _ in range(20):
        indices = rng.sample(range(len(plain.passages)), 8)
        examples = [{**plain.passages[i], "example_index": i, "epoch": 0} for i in indices]
        chosen, _ = plain.choose(examples)
        assert pooled.choose(examples)[0] == chosen and plain.pooled_passages(chosen, examples) == {}
        more = pooled.pooled_passages(chosen, examples)
        batch, alone = pooled(examples), plain(examples)
        owners = batch["written_entity_ids"].tolist()
        assert alone["written_entity_ids"].tolist() == list(chosen)
        for entity, first in chosen.items():
            drawn = [first, *more[entity]]
            assert len(set(drawn)) == len(drawn) <= 3 and not set(drawn) & set(indices)
            assert all(entity in plain.passages[p]["entity_labels"] for p in drawn)
            available = set(plain.entity_passages.of(entity).tolist()) - set(indices)
            assert len(drawn) == min(3, len(available))
            assert owners.count(entity) == len(drawn)
            several += len(drawn) > 1
        assert batch["writer_input_ids"][: len(owners)].shape[0] == len(owners)
    assert several > 20
    assert pooled.rows_to_write(every_entity=True)[1] and max(map(len, pooled.rows_to_write(True)[1])) <= 4
    wide = writer_collator(corpus, written_row_share=1.0, passages_per_row=6)
    assert max(map(len, wide.rows_to_write(True)[1])) > 4
    with pytest.raises(ValueError, match="passages_per_row must be >= 1"):
        writer_collator(corpus, passages_per_row=0)
    # the model: an entity given several texts reads the mean of their rows, in whatever order
    torch.manual_seed(0)
    model = EDMemForConditionalGeneration(replace(plain.config, entity_row_writer=True)).eval()
    inputs = [plain.writer_input(entity, passage) for entity, passage in ((2, 0), (2, 1), (3, 2))]
    width = max(map(len, inputs))
    texts = torch.tensor([ids + [plain.config.pad_token_id] * (width - len(ids)) for ids in inputs])
    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in inputs])
    rows = model.write_entity_rows(texts, mask)
    order = [2, 0, 1]
    written = RowsToWrite(torch.tensor([3, 2, 2]), texts[order], mask[order]).written_rows(rows[order], model.config)
    assert written.ids.tolist() == [2, 3]
    torch.testing.assert_close(written.rows, torch.stack([(rows[0] + rows[1]) / 2, rows[2]]))
    # with writer_pools_texts off, each text is a row of its own, in the order given
    apart = EDMemForConditionalGeneration(replace(plain.config, entity_row_writer=True, writer_pools_texts=False))
    apart.load_state_dict(model.state_dict())
    written = RowsToWrite(torch.tensor([3, 2, 2]), texts[order], mask[order]).written_rows(rows[order], apart.config)
    assert written.ids.tolist() == [3, 2, 2]
    torch.testing.assert_close(written.rows, rows[order])
    with pytest.raises(StrictDataclassClassValidationError, match="writer_pools_texts=False .* needs entity_row_wri"):
        replace(plain.config, writer_pools_texts=False)
    with pytest.raises(StrictDataclassClassValidationError, match="written_entity_rows must be >= 0.* got -1"):
        replace(plain.config, written_entity_rows=-1)


def _names_all_masked(input_ids: list[int], labels: list[int], mask: int) -> set[int]:
    """The entities of the mentions of one input whose tokens between the markers are all `mask` (5, 6: markers)."""
    hidden, shown, i = set(), set(), 0
    while i < len(input_ids):
        if input_ids[i] == 5 and labels[i] >= 0:
            end = input_ids.index(6, i)
            (hidden if all(t == mask for t in input_ids[i + 1 : end]) else shown).add(labels[i])
            i = end
        i += 1
    return hidden - shown


@pytest.mark.parametrize("mention_mask_prob", [0.0, 0.5, 1.0])
def test_rows_that_answer_name_an_entity_their_example_hides(corpus, mention_mask_prob):
    """`answer_rows`: row k answers example b when the passage it is written from names an entity whose every
    mention in b is masked (other than the row's own entity); none when nothing is masked, every row naming another
    of b's entities when every name is."""
    collator = writer_collator(corpus, written_row_share=1.0, max_written_rows=64, seed=4, passages_per_row=3,
                               answer_rows=True)  # fmt: skip
    collator = replace(collator, base=EDMemMaskingCollator(collator.tokenizer, random_mask_prob=0.2,
                                                          mention_mask_prob=mention_mask_prob, seed=1))  # fmt: skip
    rng, answering = random.Random(2), 0
    for _ in range(10):
        examples = [{**collator.passages[i], "example_index": i} for i in rng.sample(range(len(collator.passages)), 8)]
        batch = collator(examples)
        owners = batch["written_entity_ids"].tolist()
        chosen, _ = collator.choose(examples)
        more = collator.pooled_passages(chosen, examples)
        sources = [p for entity, first in chosen.items() for p in (first, *more.get(entity, ()))]
        named = [set(collator.passages[p]["entity_labels"]) - {-100} for p in sources]
        for b, example in enumerate(examples):
            ids, labels = batch["input_ids"][b].tolist(), batch["entity_labels"][b].tolist()
            hidden = _names_all_masked(ids, labels, collator.tokenizer.mask_token_id)
            if mention_mask_prob == 1.0:
                assert hidden == set(example["entity_labels"]) - {-100}
            expected = [bool((hidden - {owner}) & names) for owner, names in zip(owners, named)]
            assert batch["written_rows_answering"][b].tolist() == expected
            answering += sum(expected)
    assert (answering > 0) == (mention_mask_prob > 0)
    with pytest.raises(ValueError, match="answer_rows reads the entities of the corpus's passages"):
        WriterCollator.from_corpus(collator.base, corpus, EDMemForConditionalGeneration(collator.config),
                                   collator.tokenizer, WriterTrainingArguments(writer_answer_rows=True), seed=0)  # fmt: skip


def test_rows_that_answer_by_text_hold_a_question_s_answer_words(corpus):
    """`answer_rows_by_text`: a question's row k answers it too when the passage it is written from holds the words of
    its answer, whole and in order (here "old century", no entity, which the entity rule cannot reach); a passage's
    rows are the entity rule's alone."""
    from edmem_hf.collator import QuestionsAndPassagesCollator
    from edmem_hf.task_features import EDMemSeq2SeqCollator

    by_entity = writer_collator(corpus, written_row_share=1.0, max_written_rows=64, seed=4, passages_per_row=6,
                                answer_rows=True)  # fmt: skip
    tokenizer = by_entity.tokenizer
    base = QuestionsAndPassagesCollator(EDMemMaskingCollator(tokenizer, mention_mask_prob=0.5, seed=1),
                                        EDMemSeq2SeqCollator(tokenizer.pad_token_id))  # fmt: skip
    by_entity = replace(by_entity, base=base)
    by_text = replace(by_entity, options=replace(by_entity.options, writer_answer_rows_by_text=True))
    start, end = by_entity.config.entity_start_token_id, by_entity.config.entity_end_token_id

    def question(entity: int, answer: str) -> dict:
        name = tokenizer(" " + ENTITY_NAMES[entity], add_special_tokens=False).input_ids
        ids = [tokenizer.bos_token_id, *tokenizer(" When", add_special_tokens=False).input_ids, start, *name, end,
               tokenizer.eos_token_id]  # fmt: skip
        labels = tokenizer(" " + answer, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        return {"input_ids": ids, "entity_labels": [-100, -100, entity, *[-100] * (len(name) + 2)],
                "labels": labels, "decoder_entity_labels": [-100] * len(labels)}  # fmt: skip

    rng, matched = random.Random(3), 0
    for _ in range(8):
        passages = [{**by_entity.passages[i], "example_index": i} for i in rng.sample(range(64), 4)]
        examples = passages + [question(rng.randrange(len(ENTITY_NAMES)), "old century"),
                               question(rng.randrange(len(ENTITY_NAMES)), "century old"),
                               question(rng.randrange(len(ENTITY_NAMES)), "old centur")]  # fmt: skip
        plain, batch = by_entity(examples), by_text(examples)
        assert torch.equal(plain["written_entity_ids"], batch["written_entity_ids"])
        chosen, _ = by_text.choose(examples)
        more = by_text.pooled_passages(chosen, examples)
        sources = [p for entity, first in chosen.items() for p in (first, *more.get(entity, ()))]
        texts = [tokenizer.decode(by_text.passages[p]["input_ids"]).lower() for p in sources]
        assert torch.equal(batch["written_rows_answering"][:4], plain["written_rows_answering"][:4])
        assert not plain["written_rows_answering"][4:].any()  # no entity hidden: the entity rule marks nothing
        assert batch["written_rows_answering"][4].tolist() == [" old century" in text for text in texts]
        assert not batch["written_rows_answering"][5].any()  # the words, but not in that order
        assert not batch["written_rows_answering"][6].any()  # a word's start is not the word
        matched += int(batch["written_rows_answering"][4].sum())
    assert matched > 0
    with pytest.raises(ValueError, match="answer_rows_by_text widens the rows that answer"):
        replace(
            by_entity, options=replace(by_entity.options, writer_answer_rows=False, writer_answer_rows_by_text=True)
        )


def test_pretraining_with_rows_that_answer(corpus, tmp_path):
    """`edmem pretrain --writer_answer_rows` gives the batches their answering rows and trains; it needs rows kept
    apart, several an entity."""
    from edmem_hf.pretraining import load_corpus

    common = dict(max_steps=2, entity_row_writer=True, written_only_share=0.3, writer_passages_per_row=3,
                  writer_answer_rows=True)  # fmt: skip
    passages, vocab, tokenizer = load_corpus(corpus)
    for refused in ({}, {"writer_pools_texts": False, "writer_passages_per_row": 1}):
        args = _args(corpus, tmp_path / "refused", **{**common, **refused})
        with pytest.raises(ValueError, match="--writer_answer_rows chooses among an entity's rows"):
            loader_of(args, passages, tokenizer, vocab)
    args = _args(corpus, tmp_path / "x", writer_pools_texts=False, **common)
    loader = loader_of(args, passages, tokenizer, vocab)
    batches = [flat(batch) for _, batch in zip(range(4), loader)]
    assert all(
        b["written_rows_answering"].shape == (len(b["input_ids"]), len(b["written_entity_ids"])) for b in batches
    )
    assert any(b["written_rows_answering"].any() for b in batches)
    assert not any("read_answering_rows" in b for b in batches)
    assert pretrain(**_args(corpus, tmp_path / "run", writer_pools_texts=False, **common))["completed"]
    # --writer_reads_answer_rows: the batches say so, and the run trains; without --writer_answer_rows it is refused
    args = _args(corpus, tmp_path / "read", writer_pools_texts=False, writer_reads_answer_rows=True, **common)
    loader = loader_of(args, passages, tokenizer, vocab)
    assert all(b["read_answering_rows"] is True for _, b in zip(range(2), map(flat, loader)))
    assert pretrain(**args)["completed"]
    alone = {**common, "writer_answer_rows": False}
    args = _args(corpus, tmp_path / "alone", writer_pools_texts=False, writer_reads_answer_rows=True, **alone)
    with pytest.raises(ValueError, match="--writer_reads_answer_rows reads the rows of --writer_answer_rows"):
        loader_of(args, passages, tokenizer, vocab)
    # --writer_answer_rows_by_text reaches the collator, and is refused without --writer_answer_rows
    args = _args(corpus, tmp_path / "text", writer_pools_texts=False, writer_answer_rows_by_text=True, **common)
    assert loader_of(args, passages, tokenizer, vocab).collate_fn.options.writer_answer_rows_by_text
    args = _args(corpus, tmp_path / "text", writer_pools_texts=False, writer_answer_rows_by_text=True, **alone)
    with pytest.raises(ValueError, match="--writer_answer_rows_by_text widens the rows of --writer_answer_rows"):
        loader_of(args, passages, tokenizer, vocab)
    with pytest.raises(ValueError, match="--writer_answer_rows is an option of training the writer"):
        pretrain(**_args(corpus, tmp_path / "none", writer_answer_rows=True))


def test_a_model_trained_with_a_row_a_passage_leaves_training_with_its_written_rows_kept_apart(corpus, tmp_path):
    """`--writer_pools_texts false`: the written-only entities' rows, written when training ends, are kept apart
    beside the table, a row a passage (the table row their mean), as the model read them in training."""
    out = tmp_path / "apart"
    pretrain(**_args(corpus, out, max_steps=2, entity_row_writer=True, written_only_share=0.3, writer_pools_texts=False,
                   writer_passages_per_row=2))  # fmt: skip
    model = EDMemForConditionalGeneration.from_pretrained(out)
    ids, inputs = writer_collator(corpus, written_only_share=0.3, seed=42, passages_per_row=2).rows_to_write()
    table = model.model.entity_embeddings
    assert model.config.writer_pools_texts is False and model.config.written_entity_rows == sum(map(len, inputs))
    assert table.written_row_entity_ids.tolist() == [entity for entity, own in zip(ids, inputs) for _ in own]
    each = written_rows(model, [[one] for own in inputs for one in own])
    assert torch.allclose(table.written_rows, each, atol=1e-6)
    assert torch.allclose(table.weight[ids], written_rows(model, inputs), atol=1e-6)


def test_passages_by_mentions_are_drawn_in_proportion_to_the_entity_s_mentions():
    """`passages_by_mentions`: a row is written from a passage in proportion to how often it mentions the entity
    (its own page most), never from one the batch reads; the written table takes the passages that mention it most."""
    from edmem_hf.research.writer_batches import _passage_not_read

    # entity 0 is mentioned once in passage 3, four times in passage 5, five times in passage 8; entity 1 in 5
    index = EntityPassages(np.array([3, 5, 5, 5, 5, 8, 8, 8, 8, 8, 5]), np.array([0] * 10 + [1]), num_entities=2)
    assert index.of(0).tolist() == [3, 5, 8] and index.mentions_of(0).tolist() == [1, 4, 5]
    assert index.most_mentioning(0, 2).tolist() == [8, 5] and index.of(1).tolist() == [5]
    rng = np.random.default_rng(0)
    draws = [_passage_not_read(index.of(0), set(), rng, index.mentions_of(0)) for _ in range(5000)]
    shares = {p: draws.count(p) / len(draws) for p in (3, 5, 8)}
    assert shares == pytest.approx({3: 0.1, 5: 0.4, 8: 0.5}, abs=0.03)
    uniform = [_passage_not_read(index.of(0), set(), rng) for _ in range(3000)]
    assert uniform.count(3) / len(uniform) == pytest.approx(1 / 3, abs=0.03)
    assert {_passage_not_read(index.of(0), {8, 5}, rng, index.mentions_of(0)) for _ in range(50)} == {3}
    assert _passage_not_read(index.of(0), {3, 5, 8}, rng, index.mentions_of(0)) is None


class _Unlisted(np.ndarray):
    """An array of passages that refuses to be copied into a list."""

    def tolist(self):
        raise AssertionError("a long list of passages was copied")


@pytest.mark.parametrize("length", [40, 50_000])
def test_pooled_passages_are_distinct_unread_and_uniform_and_a_long_list_is_not_copied(length):
    """`_passages_not_read`: up to `count` distinct passages, none read, ascending, each equally likely; a popular
    entity's long list (beyond `LISTED_PASSAGES`) is drawn from in place, never copied."""
    from edmem_hf.research.writer_batches import LISTED_PASSAGES, _passages_not_read

    passages = np.arange(0, 2 * length, 2, dtype=np.int64)
    if length > LISTED_PASSAGES:
        passages = passages.view(_Unlisted)
    read = {0, 2, 4, 7, 2 * length - 2}
    rng, counts = np.random.default_rng(0), np.zeros(length)
    for _ in range(2000):
        drawn = _passages_not_read(passages, read, 5, rng)
        assert len(drawn) == 5 and drawn == sorted(set(drawn)) and not set(drawn) & read
        assert all(p % 2 == 0 and 0 <= p < 2 * length for p in drawn)
        counts[np.array(drawn) // 2] += 1
    kept = np.ones(length, dtype=bool)
    kept[[0, 1, 2, length - 1]] = False
    assert counts[~kept].sum() == 0
    halves = counts[kept][: kept.sum() // 2].sum(), counts[kept][kept.sum() // 2 :].sum()
    assert halves[0] / sum(halves) == pytest.approx(0.5, abs=0.03)
    short = np.array([3, 5, 8])
    assert _passages_not_read(short, {5}, 4, rng) == [3, 8] and _passages_not_read(short, {3, 5, 8}, 2, rng) == []


def test_the_written_table_by_mentions_takes_the_passages_that_mention_most(corpus):
    plain = writer_collator(corpus)
    by_mentions = writer_collator(corpus, passages_by_mentions=True)
    index = plain.entity_passages
    ids, inputs = by_mentions.rows_to_write(every_entity=True, max_passages=2)
    differ = 0
    for entity, written in zip(ids, inputs):
        most = index.most_mentioning(entity, 2)
        assert written == [plain.writer_input(entity, passage) for passage in most]
        kept = index.mentions_of(entity)[np.isin(index.of(entity), most)]
        assert kept.min() >= np.delete(index.mentions_of(entity), np.isin(index.of(entity), most)).max(initial=0)
        differ += not np.array_equal(np.sort(most), index.of(entity)[:2])
    assert differ > 0  # this corpus has entities whose first passages are not those that mention them most


def test_row_autoencoding_of_written_only_entities_leaves_the_others_passages_alone(corpus):
    """With `row_autoencoding_written_only`, a passage is read as a written row alone only for a written-only entity:
    every row handed in an auto-encoded input is one, and passages about other written entities are untouched."""
    settings = dict(written_row_share=1.0, written_only_share=0.3, seed=2, row_autoencoding_share=1.0)
    plain = writer_collator(corpus, **{**settings, "row_autoencoding_share": 0.0})
    coded = writer_collator(corpus, **settings, row_autoencoding_written_only=True)
    examples = [{**plain.passages[i], "example_index": i, "epoch": 0} for i in range(16)]
    before, after = plain(examples), coded(examples)
    written = before["written_entity_ids"]
    written_only = written[torch.from_numpy(coded.written_only)[written]]
    assert 0 < len(written_only) < len(written)  # both kinds are written in this batch
    coded_rows = []
    for row in range(len(examples)):
        about = before["entity_labels"][row][before["input_ids"][row] == 5]
        if torch.isin(about, written_only).any():  # every such passage is auto-encoded (share 1.0)
            assert int(after["attention_mask"][row].sum()) == 5
            assert int(after["written_read_entity_ids"][row, 1]) in written_only.tolist()
            coded_rows.append(row)
        else:
            assert torch.equal(before["input_ids"][row], after["input_ids"][row])
    assert coded_rows and len(coded_rows) < len(examples)


def test_a_written_table_is_every_entity_row_written_from_its_passages(corpus, tmp_path):
    """`--written_table`: when training ends, every entity with passages has the row the writer makes of them."""
    pretrain(**_args(corpus, tmp_path / "m", max_steps=2, entity_row_writer=True, written_only_share=0.3,
                   written_table=True))  # fmt: skip
    model = EDMemForConditionalGeneration.from_pretrained(tmp_path / "m")
    collator = writer_collator(corpus, written_only_share=0.3, seed=42)
    ids, inputs = collator.rows_to_write(every_entity=True)
    assert len(ids) > collator.written_only.sum() and len(ids) >= 0.9 * len(collator.names)
    table = model.model.entity_embeddings.weight.detach()
    assert torch.allclose(table[ids], written_rows(model, inputs), atol=1e-6)


def _frozen_kept_and_table(first, second, corpus) -> None:
    """What `--frozen_writer` promises of a model trained from `first` into `second`: the writer, the lower encoder
    layers and the embeddings as they were, most other weights trained, the table every row `first`'s writer writes
    of the corpus (not the table `first` had)."""
    before, after = _weights(first), _weights(second)
    lower = EDMemForConditionalGeneration.from_pretrained(first).config.encoder_lower_layers
    frozen = ("entity_writer.", "model.shared.", "model.encoder.embed_positions.", "model.encoder.layernorm_embedding.",
              *(f"model.encoder.layers.{i}." for i in range(lower)))  # fmt: skip
    kept = [name for name in before if name.startswith(frozen)]
    assert len(kept) > 10 and all(torch.equal(before[name], after[name]) for name in kept)
    trained = [name for name in before if not name.startswith(frozen) and "entity_embeddings" not in name]
    assert sum(not torch.equal(before[name], after[name]) for name in trained) > len(trained) // 2
    collator = writer_collator(corpus, written_only_share=0.3, seed=42)
    ids, inputs = collator.rows_to_write(every_entity=True)
    assert len(ids) >= 0.9 * len(collator.names)
    written = written_rows(EDMemForConditionalGeneration.from_pretrained(first), inputs)
    assert torch.allclose(after["model.entity_embeddings.weight"][ids], written, atol=1e-6)
    assert not torch.allclose(before["model.entity_embeddings.weight"][ids], written, atol=1e-3)


def test_a_frozen_writer_keeps_what_it_reads_and_trains_the_reader_on_its_table(corpus, tmp_path):
    """`--frozen_writer`, the second stage of pre-training: the rest of the model trains on the table the loaded
    writer writes, and the writer and what it reads come out as they went in."""
    first = tmp_path / "first"
    pretrain(**_args(corpus, first, max_steps=2, entity_row_writer=True, written_only_share=0.3))
    with pytest.raises(ValueError, match="--frozen_writer keeps a trained writer"):
        pretrain(**_args(corpus, tmp_path / "x", max_steps=2, entity_row_writer=True, frozen_writer=True))
    pretrain(**_args(corpus, tmp_path / "second", max_steps=3, model_name_or_path=str(first), frozen_writer=True,
                   written_only_share=0.3, written_row_share=1.0, learning_rate=1e-2))  # fmt: skip
    _frozen_kept_and_table(first, tmp_path / "second", corpus)
    # fine-tuning with the writer frozen keeps it too, its table written from --writer_corpus
    from edmem_hf.finetuning import run as finetune

    questions = tmp_path / "questions.jsonl"
    with open(questions, "w", encoding="utf-8") as f:
        for i, subject in enumerate(ENTITY_NAMES):
            answer = ENTITY_NAMES[(i * 5 + 1) % len(ENTITY_NAMES)]
            record = {"id": f"q{i}", "question": f"where is {subject}", "answer": [answer], "link_offset": [9],
                      "link_length": [len(subject)], "link_target": ["0"], "entity_name": [subject],
                      "answer_entity": [[0, answer]]}  # fmt: skip
            f.write(json.dumps(record) + "\n")
    finetune(argv=["--model_name_or_path", str(first), "--output_dir", str(tmp_path / "tuned"), "--train_file",
                   str(questions), "--do_train", "--max_steps", "3", "--per_device_train_batch_size", "8",
                   "--learning_rate", "1e-2", "--eval_strategy", "no", "--save_strategy", "no",
                   "--load_best_model_at_end", "false", "--report_to", "none", "--use_cpu", "--disable_tqdm", "true",
                   "--writer_corpus", corpus, "--frozen_writer", "--written_row_share", "1.0",
                   "--writer_passages_per_row", "2"])  # fmt: skip
    _frozen_kept_and_table(first, tmp_path / "tuned", corpus)


@pytest.mark.parametrize("recipe", ["rows_that_answer", "frozen_writer"])
def test_the_recipe_s_batches_are_those_of_the_code_before_the_options_object(corpus, recipe):
    """The batches of each stage of the writer's recipe (`--writer_recipe`), for a fixed seed, are bit-identical to
    those of the collator before its options became `WriterTrainingArguments` (issue 63): the hashes in
    tests/data/writer_recipe_batches.json were made by that code (the 14 options given one by one)."""
    import hashlib
    from pathlib import Path

    expected = json.loads((Path(__file__).parent / "data" / "writer_recipe_batches.json").read_text())[recipe]
    tokenizer = make_tokenizer()
    passages = load_from_disk(os.path.join(corpus, "passages"))["train"]
    names = EntityVocab.load(corpus).names
    options = WriterTrainingArguments(writer_recipe=recipe)
    config = tiny_config(vocab_size=len(tokenizer), entity_vocab_size=len(names), entity_start_token_id=5,
                         entity_end_token_id=6, max_position_embeddings=160, entity_row_writer=True,
                         writer_pools_texts=options.writer_pools_texts)  # fmt: skip
    collator = FlatWriterCollator(EDMemMaskingCollator(tokenizer, seed=3), passages,
                                  EntityPassages.from_dataset(passages, len(names)), names, tokenizer, config, options,
                                  seed=7, written_only_ids=expected["practice"])  # fmt: skip
    rng = random.Random(0)
    for step, batch_hashes in enumerate(expected["batches"]):
        indices = rng.sample(range(len(passages)), 8)
        batch = collator([{**passages[i], "example_index": i, "epoch": step} for i in indices])
        got = {key: [list(value.shape), str(value.dtype), hashlib.sha256(value.contiguous().numpy().tobytes()).hexdigest()]
               for key, value in sorted(batch.items())}  # fmt: skip
        assert got == batch_hashes, step


def test_the_written_only_entities_table_rows_are_hidden_while_pre_training(corpus, tmp_path):
    """While the writer trains, the memory never sees a written-only entity's table row (the entity mask hides them,
    and only them): else the practice entities would be found through rows the layers wrote, not the writer's
    (issue 66: a run that never set the mask passed every test, the resume test included)."""
    from edmem_hf.pretraining import _PretrainingRun

    options = _args(corpus, tmp_path / "run", max_steps=1, entity_row_writer=True, written_only_share=0.3)
    run = _PretrainingRun(options["args"], None, None, None, None, options["writer"], options["mixing"])
    shown = run.accelerator.unwrap_model(run.model)._get_entity_mask("cpu")
    written_only = torch.from_numpy(run.writer_collator.written_only)
    assert written_only.any() and not written_only.all()
    assert shown is not None and torch.equal(shown, ~written_only)
    assert run.finish(run.train())["completed"]
    saved = EDMemForConditionalGeneration.from_pretrained(tmp_path / "run")
    assert saved._get_entity_mask("cpu") is None  # their rows written when training ends, and shown again


def test_sentences_of_cut_at_sentence_ends_outside_mentions(corpus):
    """`sentences_of` keeps the sentences that mention the entity, whole, and a `.` inside a mention's name ends
    nothing."""
    collator = writer_collator(corpus, writer_sentence_rows=True)
    tokenizer = collator.tokenizer
    dot = tokenizer.convert_tokens_to_ids(".")
    assert dot in collator._sentence_end_ids()

    def tokens(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False).input_ids

    start, end = collator.config.entity_start_token_id, collator.config.entity_end_token_id
    first = [start, *tokens(" Alpha City"), dot, end, *tokens(" is near"), start, *tokens(" Beta River"), end, dot]
    second = [*tokens(" a famous castle is on"), start, *tokens(" Gamma Lake"), end, dot]
    third = [start, *tokens(" Alpha City"), end, *tokens(" was founded in the old century"), dot]
    ids = [0, *first, *second, *third, 2]
    labels = [-100] * len(ids)
    for offset, entity in ((1, 0), (1 + first.index(start, 1), 1), (1 + len(first) + second.index(start), 2),
                           (1 + len(first) + len(second), 0)):  # fmt: skip
        labels[offset] = entity
    sentences = collator.sentences_of(0, {"input_ids": ids, "entity_labels": labels})
    assert [s["input_ids"] for s in sentences] == [[0, *first], third]
    third_begins = 1 + len(first) + len(second)
    assert [s["entity_labels"] for s in sentences] == [labels[: 1 + len(first)], labels[third_begins:-1]]
    assert [s["input_ids"] for s in collator.sentences_of(2, {"input_ids": ids, "entity_labels": labels})] == [second]


def test_sentence_rows_write_a_written_only_entity_from_one_sentence(corpus):
    """With `writer_sentence_rows`, each row of a written-only entity is written from one sentence that mentions it
    (rows at the end of training too); the other written entities keep whole passages."""
    practice = [0, 1, 2, 3]
    options = dict(written_row_share=1.0, max_written_rows=64, fresh_names=False, written_only_ids=practice)
    collator = writer_collator(corpus, writer_sentence_rows=True, **options)
    plain = writer_collator(corpus, **options)
    config, pad = collator.config, collator.config.pad_token_id
    dropped = {config.entity_start_token_id, config.entity_end_token_id, config.eos_token_id, 0, pad}

    def body(ids: list[int]) -> list[int]:
        return [token for token in ids if token not in dropped]

    def sentence_bodies(entity: int) -> list[list[int]]:
        return [body(s["input_ids"]) for passage in collator.entity_passages.of(entity)
                for s in collator.sentences_of(entity, collator.passages[int(passage)])]  # fmt: skip

    rng = random.Random(1)
    seen = {"sentence": 0, "passage": 0, "longer_plain": 0}
    for _ in range(20):
        indices = rng.sample(range(len(collator.passages)), 6)
        examples = [{**collator.passages[i], "example_index": i, "epoch": 0} for i in indices]
        for current, batch in (("sentence", collator(examples)), ("plain", plain(examples))):
            for entity, ids in zip(batch.get("written_entity_ids", torch.empty(0)).tolist(),
                                   batch.get("writer_input_ids", torch.empty(0, 0)).tolist()):  # fmt: skip
                text = body(ids)[len(collator.name_ids(entity)) :]
                if current == "sentence" and entity in practice:
                    assert text in sentence_bodies(entity)
                    seen["sentence"] += 1
                elif current == "sentence":  # an entity that is not written-only keeps whole passages
                    whole = [collator.writer_input(entity, p) for p in collator.entity_passages.of(entity)]
                    assert ids[: len(ids) - ids[::-1].index(config.eos_token_id)] in whole
                    seen["passage"] += 1
                elif entity in practice and text not in sentence_bodies(entity):
                    seen["longer_plain"] += 1
    assert seen["sentence"] and seen["passage"] and seen["longer_plain"]  # the option changes what rows come from
    ids, inputs = collator.rows_to_write()
    assert ids == practice
    for entity, texts in zip(ids, inputs):
        assert [body(t)[len(collator.name_ids(entity)) :] for t in texts] == sentence_bodies(entity)[: len(texts)]


def test_a_passage_renaming_makes_too_long_is_cut_before_a_mention(corpus):
    """Fresh names longer than the names they replace can make a passage longer than the model's positions (a real
    corpus's passage of many mentions): it is cut to them, before the mention the cut would split, `</s>` kept."""
    from edmem_hf.research.writer_batches import _renamed_example

    collator = writer_collator(corpus)
    config = collator.config
    start, end = config.entity_start_token_id, config.entity_end_token_id
    mention = [start, 40, end, 41]
    ids = [0, *mention * 30, 2]
    labels = [-100] + [1, -100, -100, -100] * 30 + [-100]
    long_name = list(range(50, 60))  # 10 tokens for 1
    example = _renamed_example({"input_ids": ids, "entity_labels": labels}, {1: long_name}, config)
    out, out_labels = example["input_ids"], example["entity_labels"]
    assert len(out) <= config.max_position_embeddings and len(out) == len(out_labels)
    assert out[-1] == 2 and out[-2] == 41  # cut after a whole mention
    assert out.count(start) == out.count(end) == out_labels.count(1)
    short = _renamed_example({"input_ids": ids[:9], "entity_labels": labels[:9]}, {1: long_name}, config)
    assert len(short["input_ids"]) == 9 + 2 * 9  # nothing cut where it fits

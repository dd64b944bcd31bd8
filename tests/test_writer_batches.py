"""Training that reads written rows (`writer_batches.WriterCollator`, `edmem pretrain` with `entity_row_writer`):
a row is never written from a passage the batch reads, the choice is a function of the batch (exact resume), and
the written-only entities leave pre-training with the rows their passages write."""

from __future__ import annotations

import os
import random
import sys

import pytest
import torch
from datasets import load_from_disk

from edmem_hf import EDMemForConditionalGeneration, EntityVocab
from edmem_hf.collator import EDMemMaskingCollator
from edmem_hf.entity_growth import written_rows
from edmem_hf.pretraining import pretrain
from edmem_hf.writer_batches import EntityPassages, WriterCollator

sys.path.insert(0, os.path.dirname(__file__))
from test_collator import make_corpus, make_tokenizer  # noqa: E402
from test_pretraining import _args, _weights  # noqa: E402
from tiny_models import tiny_config  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), n_train=64, n_validation=16)


def writer_collator(corpus, **settings) -> WriterCollator:
    tokenizer = make_tokenizer()
    passages = load_from_disk(os.path.join(corpus, "passages"))["train"]
    names = EntityVocab.load(corpus).names
    config = tiny_config(vocab_size=len(tokenizer), entity_vocab_size=len(names), entity_start_token_id=5,
                         entity_end_token_id=6, max_position_embeddings=160)  # fmt: skip
    base = EDMemMaskingCollator(tokenizer, seed=3)
    return WriterCollator(base, passages, EntityPassages.from_dataset(passages, len(names)), names, tokenizer,
                          config, **settings)  # fmt: skip


def test_a_row_is_never_written_from_a_passage_the_batch_reads(corpus):
    collator = writer_collator(corpus, written_row_share=1.0, max_written_rows=64)
    passages = collator.passages
    rng = random.Random(0)
    written = 0
    for _ in range(40):
        indices = rng.sample(range(len(passages)), 8)
        examples = [{**passages[i], "example_index": i, "epoch": 0} for i in indices]
        batch = collator(examples)
        chosen = collator.choose(examples, collator.base(examples))
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
        # an entity every passage of which the batch reads cannot be written
        for entity in labelled - set(chosen):
            assert set(collator.entity_passages.of(entity).tolist()) <= set(indices)
        assert collator(examples)["written_entity_ids"].tolist() == list(chosen)  # the same batch, the same rows
    assert written > 100


def test_shares_of_written_rows(corpus):
    never = writer_collator(corpus, written_row_share=0.0, written_only_share=0.0)
    passages = never.passages
    examples = [{**passages[i], "example_index": i} for i in range(8)]
    assert "written_entity_ids" not in never(examples)
    only = writer_collator(corpus, written_row_share=0.0, written_only_share=0.5, seed=1)
    assert 0 < only.written_only.sum() < len(only.names)
    chosen = set(only.choose(examples, only.base(examples)))
    assert chosen and all(only.written_only[entity] for entity in chosen)
    capped = writer_collator(corpus, written_row_share=1.0, written_only_share=0.5, max_written_rows=2, seed=1)
    assert (
        set(capped.choose(examples, capped.base(examples))) <= chosen
        and len(capped(examples)["writer_input_ids"]) == 2
    )
    with pytest.raises(ValueError, match="written_row_share"):
        writer_collator(corpus, written_row_share=1.5)


def test_pretraining_with_the_writer_resumes_exactly_and_writes_the_written_only_rows(corpus, tmp_path):
    common = dict(max_steps=6, gradient_accumulation_steps=2, save_steps=3, save_total_limit=2, dropout=0.1,
                  entity_row_writer=True, written_only_share=0.3)  # fmt: skip
    full = tmp_path / "full"
    pretrain(_args(corpus, full, **common))
    killed = tmp_path / "killed"
    assert not pretrain(_args(corpus, killed, max_steps_this_run=5, **common))["completed"]
    assert pretrain(_args(corpus, killed, **common))["completed"]
    a, b = _weights(full), _weights(killed)
    assert a.keys() == b.keys() and any(key.startswith("entity_writer.") for key in a)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    # the written-only entities' rows are the writer's rows of their passages
    model = EDMemForConditionalGeneration.from_pretrained(full)
    collator = writer_collator(corpus, written_only_share=0.3, seed=42)  # _args' seed
    ids, inputs = collator.written_only_inputs()
    assert ids
    table = model.model.entity_embeddings.weight.detach()
    assert torch.allclose(table[ids], written_rows(model, inputs), atol=1e-6)
    others = [i for i in range(len(table)) if i not in ids]
    assert not torch.allclose(table[others[:3]], written_rows(model, [inputs[0]] * 3), atol=1e-3)

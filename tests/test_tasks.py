"""QA examples, their collator, and exact match (checked against the EDMem authors' released predictions)."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import shared_data_path
from edmem_hf.tasks import EDMemSeq2SeqCollator, QAExample, encode_qa_example, exact_match, mark_mentions
from edmem_hf.tokenization import train_tokenizer


@pytest.mark.parametrize(("mode", "published"), [("freeform", 28.89), ("dynamic", 27.59), ("static", 29.94)])
def test_exact_match_reproduces_the_released_nq_scores(mode, published):
    gold = {}
    with open(shared_data_path("edmem_release/data/openqa/nq/edmem_nq-test.jsonl"), encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            gold[record["id"]] = record["answer"]
    with open(shared_data_path(f"edmem_release/run/nq/{mode}_predictions.json"), encoding="utf-8") as f:
        predictions = json.load(f)
    assert len(gold) == 3610 and set(predictions) == set(gold)
    score = 100 * sum(exact_match(predictions[i], gold[i]) for i in gold) / len(gold)
    assert round(score, 2) == published


def test_released_questions_encode_with_their_linked_mentions():
    tokenizer = train_tokenizer(["who got the first nobel prize in physics"] * 5, vocab_size=300, min_frequency=1)
    with open(shared_data_path("edmem_release/data/openqa/nq/edmem_nq-test.jsonl"), encoding="utf-8") as f:
        record = json.loads(f.readline())
    mentions = [
        (offset, offset + length, 100 + i)
        for i, (offset, length) in enumerate(zip(record["link_offset"], record["link_length"]))
    ]
    example = QAExample(record["question"], record["answer"], mentions, answer_entity=7)
    features = encode_qa_example(example, tokenizer)
    start = tokenizer.convert_tokens_to_ids("<E_s>")
    assert [features["entity_labels"][i] for i, t in enumerate(features["input_ids"]) if t == start] == [100]
    marked, _ = mark_mentions(record["question"], mentions)
    assert marked == "who got the first <E_s> nobel prize in physics <E_e>"
    assert features["labels"][0] == start and features["decoder_entity_labels"][0] == 7
    assert features["labels"][-1] == tokenizer.eos_token_id


def test_collator_pads_entity_labels_with_ignore_index():
    batch = EDMemSeq2SeqCollator(pad_token_id=1)(
        [
            {
                "input_ids": [0, 5, 9, 6, 2],
                "entity_labels": [-100, 3, -100, -100, -100],
                "labels": [5, 9, 6, 2],
                "decoder_entity_labels": [1, -100, -100, -100],
            },
            {"input_ids": [0, 2], "entity_labels": [-100, -100], "labels": [2], "decoder_entity_labels": [-100]},
        ]
    )
    assert batch["input_ids"][1].tolist() == [0, 2, 1, 1, 1]
    assert batch["attention_mask"][1].tolist() == [1, 1, 0, 0, 0]
    assert batch["entity_labels"][1].tolist() == [-100] * 5  # never the pad id: 1 is a valid entity id
    assert batch["decoder_entity_labels"][1].tolist() == [-100] * 4
    assert batch["labels"].dtype == torch.long


def test_bad_mentions_raise():
    with pytest.raises(ValueError, match="overlaps another or falls outside"):
        mark_mentions("abc def", [(0, 5, 1), (4, 7, 2)])
    with pytest.raises(ValueError, match="overlaps another or falls outside"):
        mark_mentions("abc", [(2, 9, 1)])
    assert exact_match("<E_s> The Beatles <E_e>", ["beatles"]) and not exact_match("Beatles", ["Rolling Stones"])

"""QA examples, their collator, and exact match (checked against the EDMem authors' released predictions)."""

from __future__ import annotations

import collections
import json
import random
import re

import pytest
import torch

from conftest import shared_data_path
from edmem_hf import EntityVocab
from edmem_hf.convert_original import authors_entity_vocab, entity_names_from_task_files
from edmem_hf.tasks import (
    EDMemSeq2SeqCollator,
    QAExample,
    ResampledRows,
    encode_generation_record,
    encode_qa_example,
    encode_qa_record,
    encode_static_linking_record,
    exact_match,
    mark_mentions,
    read_answer_links,
    read_generation,
    read_jsonl,
    read_qa,
)
from edmem_hf.tokenization import train_tokenizer
from tiny_models import make_word_tokenizer, tiny_model


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


def test_answers_and_questions_are_tokenised_as_inside_a_sentence():
    """A byte-level BPE trained on running text knows `Ġ1920` and `Ġengineer`; the bare `1920` at a sequence's start
    is `19 2 0`, tokens pre-training never wrote for the fact. Every target and input starts in its running-text form
    (the authors' `add_another_bos`), as a marked entity answer already did after `<E_s>`."""
    text = "Ana was born in 1920 and worked as an engineer in Paris. " * 20
    tokenizer = train_tokenizer([text], vocab_size=300, min_frequency=2)
    assert tokenizer.tokenize("1920") != tokenizer.tokenize(" 1920") == ["Ġ1920"]
    in_text = tokenizer("Ana was born in 1920", add_special_tokens=False).input_ids
    for answer in ("1920", "engineer"):
        features = encode_qa_example(QAExample("When was Ana born?", [answer]), tokenizer)
        expected = tokenizer(" " + answer, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        assert features["labels"] == expected
        assert len(features["labels"]) == 2, tokenizer.convert_ids_to_tokens(features["labels"])  # one word token
    assert encode_qa_example(QAExample("born in 1920", ["x"]), tokenizer)["input_ids"][-2] == in_text[-1]
    entity = encode_qa_example(QAExample("Where?", ["Paris"], answer_entity=4), tokenizer)
    assert tokenizer.convert_ids_to_tokens(entity["labels"]) == ["<E_s>", "ĠParis", "<E_e>", "</s>"]
    generation = encode_generation_record(
        {"id": "g", "input": "born", "outputs": ["engineer in Paris"], "mention_entities": []}, tokenizer
    )
    assert tokenizer.convert_ids_to_tokens(generation["labels"])[0] == "Ġengineer"


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


# --- readers of the released files ------------------------------------------------------------------------------

# (file, records read, bad links left out, answers that are entities, where the answer links come from): every
# released QA file; the dev files have no answer links of their own and read the sling_invocab file released beside
QA_FILES = [
    ("openqa/nq/edmem_nq-dev.jsonl", 8757, 0, 5669, "entity_linking/sling_invocab-dev.json"),
    ("openqa/nq/edmem_nq-test.jsonl", 3610, 0, 2544, "the records"),
    ("openqa/nq/entity_linking/el_nq-dev.jsonl", 8757, 0, 5669, "the records"),
    ("openqa/nq/entity_linking/el_nq-test.jsonl", 3610, 0, 2544, "the records"),
    ("openqa/wq/edmem_wq-train.jsonl", 3400, 0, 3020, "the records"),
    ("openqa/wq/edmem_wq-dev.jsonl", 378, 0, 343, "entity_linking/sling_invocab-dev.json"),
    ("openqa/wq/edmem_wq-test.jsonl", 2032, 1, 1803, "the records"),
    ("openqa/wq/entity_linking/el_wq-train.jsonl", 3054, 0, 3054, "the records"),
    ("openqa/wq/entity_linking/el_wq-dev.jsonl", 378, 0, 343, "the records"),
    ("openqa/wq/entity_linking/el_wq-test.jsonl", 2032, 1, 1803, "the records"),
]
GENERATION_FILES = [
    ("generation/creak/edmem_creak-dev.jsonl", 1018, 0),
    ("generation/creak/edmem_creak-test.jsonl", 1371, 0),
    ("generation/WoW/edmem_wow-dev.jsonl", 3054, 6),
    ("generation/WoW/edmem_wow-test.jsonl", 2944, 1),
    ("generation/eli5/edmem_eli5-test.jsonl", 1384, 0),
]
# (file, records, bad links left out, their records kept), then (file, questions, of which the answer is not an
# entity)
ANSWER_LINK_FILES = [
    ("openqa/nq/entity_linking/sling_invocab-dev.json", 8757, 3088),
    ("openqa/nq/entity_linking/sling_invocab-test.json", 3610, 1066),
    ("openqa/tqa/tqa-inhouse-test/entity_linking/sling_invocab-dev.json", 8837, 1413),
    ("openqa/tqa/tqa-inhouse-test/entity_linking/sling_invocab-test.json", 11313, 1762),
    ("openqa/tqa/tqa-official-dev/entity_linking/sling_invocab-test.json", 11313, 1762),
    ("openqa/wq/entity_linking/sling_invocab-train.json", 3400, 346),
    ("openqa/wq/entity_linking/sling_invocab-dev.json", 378, 35),
    ("openqa/wq/entity_linking/sling_invocab-test.json", 2032, 229),
]


@pytest.fixture(scope="module")
def authors_vocab():
    """A converted table's vocabulary: the authors' 1,000,010 rows, named from the released files' links."""
    return authors_entity_vocab(1_000_010, entity_names_from_task_files([shared_data_path("edmem_release/data")]))


@pytest.mark.parametrize(("name", "count", "bad", "entity_answers", "source"), QA_FILES)
def test_every_released_qa_file_reads(authors_vocab, name, count, bad, entity_answers, source, caplog):
    path = shared_data_path(f"edmem_release/data/{name}")
    if bad:
        with pytest.raises(
            ValueError, match=rf"{path}: record .* overlaps the link before it \(pass .*--bad_records skip"
        ):
            read_qa(path, authors_vocab)
    with caplog.at_level("INFO", logger="edmem_hf.task_files"):
        dataset = read_qa(path, authors_vocab, bad_records="skip")
    assert len(dataset) == count and sum(a != -100 for a in dataset["answer_entity"]) == entity_answers
    assert f"{count} records read, skipped: none" in caplog.text and f"{bad} bad links left out" in caplog.text
    assert "0 of them with an entity not in the vocabulary" in caplog.text
    assert f"answer links from {source if source == 'the records' else path.parent / source}" in caplog.text
    assert f"{entity_answers} entity answers" in caplog.text
    assert all(e != -100 for entities in dataset["mention_entities"] for e in entities)


# For each QA file: (answers with a marked span, marked spans), every span checked against the released links by
# `test_every_released_qa_file_marks_its_answer_spans`
ANSWER_SPANS = {
    "openqa/nq/edmem_nq-dev.jsonl": (7003, 7003),
    "openqa/nq/edmem_nq-test.jsonl": (3823, 3823),
    "openqa/nq/entity_linking/el_nq-dev.jsonl": (6991, 6991),
    "openqa/nq/entity_linking/el_nq-test.jsonl": (3823, 3823),
    "openqa/wq/edmem_wq-train.jsonl": (6891, 7115),
    "openqa/wq/edmem_wq-dev.jsonl": (761, 761),
    "openqa/wq/edmem_wq-test.jsonl": (3961, 3961),
    "openqa/wq/entity_linking/el_wq-train.jsonl": (6567, 6567),
    "openqa/wq/entity_linking/el_wq-dev.jsonl": (754, 754),
    "openqa/wq/entity_linking/el_wq-test.jsonl": (3961, 3961),
}


def _released_answer_links(record: dict, sling: dict | None) -> list[tuple[str, int]]:
    """The answer entities a released record links, as (answer text, authors' id), read from the raw record: a
    training file's spans, a test file's `answer_entity` (by name), or the `sling_invocab` file beside a dev file."""
    if "answer_link_offset" in record:
        return [
            (answer[offset : offset + length], int(target))
            for answer, offsets, lengths, targets in zip(
                record["answer"],
                record["answer_link_offset"],
                record["answer_link_length"],
                record["answer_link_target"],
            )
            for offset, length, target in zip(offsets, lengths, targets)
        ]
    if "answer_entity" in record:
        return [(name, int(target)) for target, name in record["answer_entity"]]
    links = (sling or {}).get(str(record["id"])) or {}
    return [(answer, int(target)) for answer, (_, _, target) in links.items()]


@pytest.mark.parametrize(("name", "count", "bad", "entity_answers", "source"), QA_FILES)
def test_every_released_qa_file_marks_its_answer_spans(authors_vocab, name, count, bad, entity_answers, source):
    """Each answer's marked spans are the released links: a training answer's spans at their offsets with their ids;
    an answer spelling a linked entity's name (a test file's `answer_entity`, a dev file's `sling_invocab`) marked
    whole with that entity's id, every such answer marked; `mark_mentions` wraps exactly those spans."""
    path = shared_data_path(f"edmem_release/data/{name}")
    sling = json.loads((path.parent / source).read_text()) if source != "the records" else None
    rows = read_qa(path, authors_vocab, bad_records="skip")
    records = {str(record["id"]): record for record in read_jsonl(path) if record.get("answer")}
    for row in rows:
        record = records[row["id"]]
        linked = _released_answer_links(record, sling)
        targets, mentions = row["targets"], row["target_mentions"]
        for target, spans in zip(targets, mentions):
            marked, ids = mark_mentions(target, [tuple(span) for span in spans])
            assert re.findall(r"<E_s> (.*?) <E_e>", marked) == [target[s:e] for s, e, _ in spans], marked
            assert ids == [entity for _, _, entity in spans]
            if "answer_link_offset" in record:  # spans over parts of the answer, at the released offsets
                assert all((target[s:e], entity) in linked for s, e, entity in spans), (row["id"], target, spans)
                continue
            for start, end, entity in spans:  # one span over the whole answer, the entity its name spells
                assert (start, end) == (0, len(target)), (row["id"], target, spans)
                assert any(n.casefold() == target.casefold() and i == entity for n, i in linked), (row["id"], target)
        if "answer_link_offset" in record:  # every released span of every answer is marked (no bad link here)
            assert sum(map(len, mentions)) == len(linked), row["id"]
            continue
        for (
            linked_name,
            _,
        ) in linked:  # every answer spelling a linked entity's name is marked (exactly, else in any case)
            spelling = [i for i, t in enumerate(targets) if t == linked_name]
            spelling = spelling or [i for i, t in enumerate(targets) if t.casefold() == linked_name.casefold()]
            assert all(mentions[i] for i in spelling), (row["id"], linked_name, targets, mentions)
    per_answer = [spans for row_spans in rows["target_mentions"] for spans in row_spans]
    assert (sum(map(bool, per_answer)), sum(map(len, per_answer))) == ANSWER_SPANS[name]


@pytest.fixture(scope="module")
def wq_tokenizer():
    records = read_jsonl(shared_data_path("edmem_release/data/openqa/wq/edmem_wq-train.jsonl"))
    texts = [record["question"] for record in records] + [a for record in records for a in record["answer"]]
    return train_tokenizer(texts, vocab_size=2000, min_frequency=1)


class _Pick:
    """An `rng` that picks the given target."""

    def __init__(self, index: int):
        self.index = index

    def randrange(self, n: int) -> int:
        return self.index


def test_released_wq_training_answers_are_marked_at_their_offsets(authors_vocab, wq_tokenizer):
    """Every answer of the released WQ training file, as the training target it becomes: its linked spans marked
    `<E_s> ... <E_e>` at the released offsets, the released entity id as the decoder label at each `<E_s>`."""
    path = shared_data_path("edmem_release/data/openqa/wq/edmem_wq-train.jsonl")
    rows, records = read_qa(path, authors_vocab), read_jsonl(path)
    with_entity = [row for row in rows if row["answer_entity"] != -100]
    assert len(with_entity) == 3020 >= 2800  # 2,868 records' first answer is one whole linked entity
    start, end = wq_tokenizer.convert_tokens_to_ids(["<E_s>", "<E_e>"])
    checked = 0
    for row, record in zip(rows, records):
        assert row["id"] == record["id"] and row["targets"] == record["answer"]
        for i, answer in enumerate(record["answer"]):
            links = sorted(
                zip(record["answer_link_offset"][i], record["answer_link_length"][i], record["answer_link_target"][i])
            )
            features = encode_qa_record(row, wq_tokenizer, max_length=128, rng=_Pick(i))
            labels = features["labels"]
            starts = [p for p, t in enumerate(labels) if t == start]
            ends = [p for p, t in enumerate(labels) if t == end]
            assert [features["decoder_entity_labels"][p] for p in starts] == [int(t) for _, _, t in links]
            assert sum(label != -100 for label in features["decoder_entity_labels"]) == len(links)
            spans = [wq_tokenizer.decode(labels[s + 1 : e]).strip() for s, e in zip(starts, ends)]
            assert spans == [answer[offset : offset + length].strip() for offset, length, _ in links]
            checked += bool(links)
    assert checked == 6891  # every answer with a linked span
    first = rows[0]
    assert first["targets"] == ["Tunisia"] and first["target_mentions"] == [[[0, 7, 643]]]
    marked = wq_tokenizer.decode(encode_qa_record(first, wq_tokenizer)["labels"], skip_special_tokens=False)
    assert marked == "<E_s> Tunisia<E_e></s>"  # the marker takes the space before it


def test_the_training_answer_is_picked_at_random_each_time_a_record_is_read(authors_vocab, wq_tokenizer, tmp_path):
    """The authors' `QADataset` picks one answer of the list at random each time a training record is read (TQA:
    its `entity` field); evaluation and prediction targets are the first answer."""
    rows = read_qa(shared_data_path("edmem_release/data/openqa/wq/edmem_wq-train.jsonl"), authors_vocab)
    row = next(row for row in rows if len(row["targets"]) == 3)
    encoded = {tuple(encode_qa_record(row, wq_tokenizer, rng=_Pick(i))["labels"]): i for i in range(3)}
    assert len(encoded) == 3  # three different targets
    assert encoded[tuple(encode_qa_record(row, wq_tokenizer)["labels"])] == 0  # without rng: the first
    random.seed(0)
    reads = ResampledRows([row], lambda r, rng: encode_qa_record(r, wq_tokenizer, rng=rng))
    picks = collections.Counter(encoded[tuple(reads[0]["labels"])] for _ in range(300))
    assert set(picks) == {0, 1, 2} and min(picks.values()) > 70  # uniform: 100 each expected
    random.seed(1)
    first_run = [encoded[tuple(reads[0]["labels"])] for _ in range(50)]
    random.seed(1)
    assert [encoded[tuple(reads[0]["labels"])] for _ in range(50)] == first_run  # seeded, a run repeats
    # TQA training records train on their `entity` field, with its links
    vocab = EntityVocab(["Paris", "France"])
    tqa = {"id": "t1", "question": "capital of france?", "answer": ["paris", "Paris, France"], "entity": "Paris"}
    tqa |= {"answer_link_offset": [[0]], "answer_link_length": [[5]], "answer_link_target": [["9"]]}
    tqa |= {"answer_entity_name": [["Paris"]]}
    row = read_qa(_write(tmp_path, tqa), vocab)[0]
    assert row["answers"] == ["paris", "Paris, France"] and row["targets"] == ["Paris"]
    assert row["target_mentions"] == [[[0, 5, 0]]] and row["answer_entity"] == 0
    # the static setting's linker picks among the answer entities
    el = {
        "id": "e",
        "question": "where?",
        "answer": ["France", "Paris"],
        "answer_entity": [[1, "France"], [0, "Paris"]],
    }
    row = read_qa(_write(tmp_path, el), vocab)[0]
    assert row["answer_entities"] == [1, 0] and row["answer_entity"] == 1
    linked = {
        encode_static_linking_record(row, wq_tokenizer, rng=_Pick(i))["decoder_entity_labels"][-3] for i in (0, 1)
    }
    assert linked == {0, 1} and encode_static_linking_record(row, wq_tokenizer)["decoder_entity_labels"][-3] == 1


def test_a_qa_record_checked_by_hand(authors_vocab, caplog):
    """nq-test's first record, in the authors' id space and by name in a vocabulary of our own."""
    path = shared_data_path("edmem_release/data/openqa/nq/edmem_nq-test.jsonl")
    first = read_qa(path, authors_vocab)[0]
    assert first["id"] == "-3290814144789249484"
    assert first["question"] == "who got the first <E_s> nobel prize in physics <E_e>"
    assert first["answers"] == ["Wilhelm Conrad Röntgen", "Wilhelm Röntgen"]
    assert first["mention_entities"] == [3601] and first["answer_entity"] == 56607
    ours = EntityVocab(["Wilhelm Röntgen", "Deadpool (film)"])  # by name; Nobel Prize in Physics is not in it
    with caplog.at_level("INFO", logger="edmem_hf.task_files"):
        dataset = read_qa(path, ours)
    assert dataset[0]["mention_entities"] == [-100] and dataset[0]["answer_entity"] == 0
    assert dataset[0]["target_mentions"] == [[], [[0, 15, 0]]]  # the answer spelled as the entity's name
    assert dataset[1]["question"] == "when is the next <E_s> deadpool <E_e> movie being released"
    assert dataset[1]["mention_entities"] == [1] and dataset[1]["answer_entity"] == -100
    assert "4736 linked mentions, 4734 of them with an entity not in the vocabulary" in caplog.text
    assert ", 1 entity answers" in caplog.text


@pytest.mark.parametrize(("name", "count", "bad"), GENERATION_FILES)
def test_every_released_generation_file_reads(authors_vocab, name, count, bad, caplog):
    path = shared_data_path(f"edmem_release/data/{name}")
    with caplog.at_level("INFO", logger="edmem_hf.task_files"):
        dataset = read_generation(path, authors_vocab, bad_records="skip")
    assert len(dataset) == count and f"{count} records read, skipped: none" in caplog.text
    assert f"{bad} bad links left out" in caplog.text
    assert all(
        len(names) == len(outputs) for names, outputs in zip(dataset["output_entity_names"], dataset["outputs"])
    )
    if bad:
        with pytest.raises(ValueError, match="overlaps the link before it"):
            read_generation(path, authors_vocab)


def test_a_generation_record_checked_by_hand(authors_vocab):
    record = read_generation(
        shared_data_path("edmem_release/data/generation/creak/edmem_creak-test.jsonl"), authors_vocab
    )[0]
    assert record["input"] == "Eating <E_s> soup <E_e> means eating only <E_s> solids <E_e>."
    assert record["mention_entities"] == [20234, 25493] and record["input_entity_names"] == ["Soup", "Solid"]
    assert record["outputs"][0] == "This is false because Soup is mainly liquid sometimes with bits of food inside."
    assert record["output_entity_names"] == [["Soup", "Liquid"], ["Soup", "Liquid"]]


@pytest.mark.parametrize(("name", "count", "not_entities"), ANSWER_LINK_FILES)
def test_every_released_answer_link_file_reads(name, count, not_entities):
    links = read_answer_links(shared_data_path(f"edmem_release/data/{name}"))
    assert len(links) == count and sum(v is None for v in links.values()) == not_entities
    if "nq/entity_linking/sling_invocab-test" in name:
        assert links["-3290814144789249484"] == [56607] and links["8851020722386421469"] is None


def _write(tmp_path, record):
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps(record) + "\n")
    return path


def test_bad_records_name_the_record_and_the_problem(tmp_path, caplog):
    vocab = EntityVocab(["Paris", "France"])
    good = {"id": "q1", "question": "where is paris", "answer": ["France"], "link_offset": [9], "link_length": [5]}
    good |= {"link_target": ["1"], "entity_name": ["Paris"]}
    assert read_qa(_write(tmp_path, good), vocab)[0]["question"] == "where is <E_s> paris <E_e>"
    outside = {**good, "link_length": [9]}
    with pytest.raises(ValueError, match=r"record 'q1': link 'Paris' at 9..18 is outside the text \(14 characters\)"):
        read_qa(_write(tmp_path, outside), vocab)
    overlapping = {**good, "link_offset": [6, 9], "link_length": [8, 5], "link_target": ["1", "2"]}
    overlapping["entity_name"] = ["Paris", "France"]
    suggestion = r"\(pass bad_records='skip', or --bad_records skip, to leave such links out and keep the record\)"
    with pytest.raises(
        ValueError,
        match=f"{tmp_path / 'records.jsonl'}: record 'q1': link 'France' at 9 overlaps the link before it {suggestion}",
    ):
        read_qa(_write(tmp_path, overlapping), vocab)
    uneven = {**good, "entity_name": ["Paris", "France"]}
    with pytest.raises(ValueError, match="record 'q1': link lists of different lengths .*2 entity_name"):
        read_qa(_write(tmp_path, uneven), vocab)
    # skipped, a bad link is left out and counted; its record is kept with the other links
    with caplog.at_level("INFO", logger="edmem_hf.task_files"):
        rows = read_qa(_write(tmp_path, overlapping), vocab, bad_records="skip")
    assert rows[0]["question"] == "where <E_s> is paris <E_e>" and rows[0]["mention_entities"] == [0]
    assert "left out: record 'q1': link 'France' at 9 overlaps the link before it" in caplog.text
    assert "1 records read, skipped: none; 1 linked mentions" in caplog.text and "1 bad links left out" in caplog.text
    bad_answer = {**good, "answer_link_offset": [[0]], "answer_link_length": [[9]], "answer_link_target": [["2"]]}
    bad_answer["answer_entity_name"] = [["France"]]
    with pytest.raises(ValueError, match=r"record 'q1', answer 'France': link 'France' at 0..9 is outside the text"):
        read_qa(_write(tmp_path, bad_answer), vocab)
    kept = read_qa(_write(tmp_path, bad_answer), vocab, bad_records="skip")[0]
    assert kept["target_mentions"] == [[]] and kept["answer_entity"] == -100
    caplog.clear()
    with caplog.at_level("WARNING", logger="edmem_hf.task_files"):
        assert len(read_qa(_write(tmp_path, {**good, "answer": []}), vocab)) == 0
    assert "0 records read, skipped: 1 without an answer" in caplog.text
    with pytest.raises(ValueError, match="bad_records must be 'raise' or 'skip'"):
        read_qa(_write(tmp_path, outside), vocab, bad_records="drop")


def test_a_files_reading_is_an_info_line_and_a_warning_only_when_something_is_wrong(tmp_path, caplog):
    """A test file read with a vocabulary that lacks some of its entities (a small model's, or one built from
    training data) is no fault: one INFO line that counts them. A WARNING when records are skipped, or when not one
    linked entity is in the vocabulary (the wrong vocabulary)."""
    records = [
        {"id": "0", "question": "where is paris", "answer": ["France", "French Republic"], "link_offset": [9],
         "link_length": [5], "link_target": ["11"], "entity_name": ["Paris"],
         "answer_entity": [[12, "France"], [13, "Gaul"]]},  # Gaul: an answer entity no answer spells
        {"id": "1", "question": "where is lyon", "answer": ["France"], "link_offset": [9], "link_length": [4],
         "link_target": ["14"], "entity_name": ["Lyon"], "answer_entity": [[12, "France"]]},
    ]  # fmt: skip
    path = tmp_path / "edmem_toy-test.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    with caplog.at_level("INFO", logger="edmem_hf.task_files"):
        read_qa(path, EntityVocab(["Paris", "France"]))
    (record,) = caplog.records
    assert record.levelname == "INFO"
    assert "2 records read, skipped: none; 2 linked mentions, 1 of them with an entity not in the vocabulary" in (
        record.message
    )
    assert "1 answer entities whose name no answer spells (not marked), 1 answer entities not in the vocabulary" in (
        record.message
    )
    assert "2 entity answers" in record.message and "entities no answer spells" not in record.message
    caplog.clear()
    with caplog.at_level("INFO", logger="edmem_hf.task_files"):
        read_qa(path, EntityVocab(["Berlin", "Germany"]))  # not one of the file's entities
    (record,) = caplog.records
    assert record.levelname == "WARNING"
    assert "2 linked mentions, 2 of them with an entity not in the vocabulary" in record.message
    assert record.message.endswith(
        "not one linked entity is in the vocabulary: is it the vocabulary of this file's model?"
    )
    caplog.clear()
    path.write_text(path.read_text() + json.dumps({**records[1], "id": "2", "answer": []}) + "\n")
    with caplog.at_level("INFO", logger="edmem_hf.task_files"):
        read_qa(path, EntityVocab(["Paris", "France"]))
    (record,) = caplog.records
    assert record.levelname == "WARNING" and "2 records read, skipped: 1 without an answer" in record.message


def test_records_encode_for_qa_generation_and_the_static_setting():
    """The static setting's target: the decoder reads the question then <E_s> (what `link_entities` reads with
    `decoder_input="question"`), the head is supervised there, no token is scored; a training step on it moves
    only the entity-linking objective, and examples whose answer is not an entity have no such target."""
    tokenizer = make_word_tokenizer()
    model = tiny_model(vocab_size=len(tokenizer))
    model.config.entity_start_token_id, model.config.entity_end_token_id = tokenizer.convert_tokens_to_ids(
        ["<E_s>", "<E_e>"]
    )
    start = model.config.entity_start_token_id
    record = {"id": "q", "question": "ba <E_s> roki <E_e> ta", "answers": ["lun"], "mention_entities": [3]}
    qa = encode_qa_record({**record, "targets": ["lun"], "target_mentions": [[[0, 3, 7]]]}, tokenizer)
    assert qa["labels"][0] == start and qa["decoder_entity_labels"][0] == 7
    assert [qa["entity_labels"][i] for i, t in enumerate(qa["input_ids"]) if t == start] == [3]
    static = encode_static_linking_record({**record, "answer_entity": 7}, tokenizer)
    assert static["decoder_input_ids"] == static["input_ids"][:-1] + [start, tokenizer.eos_token_id]
    assert set(static["labels"]) == {-100}
    with pytest.raises(ValueError, match="record q: the answer is not an entity"):
        encode_static_linking_record({**record, "answer_entity": -100}, tokenizer)
    batch = EDMemSeq2SeqCollator(tokenizer.pad_token_id)([static])
    model.train()
    out = model(**batch)
    assert out.lm_loss == 0 and out.entity_loss > 0 and torch.isfinite(out.loss)
    out.loss.backward()
    assert model.entity_linking_head.query_proj.weight.grad.abs().sum() > 0
    # the supervised position is the one link_entities reads at inference
    model.eval()
    with torch.no_grad():
        trained_at = model(**batch, output_attended_entities=True).linked_entities
        ids, _ = model.link_entities(batch["input_ids"], top_k=8, decoder_input="question")
    placeholder = trained_at.positions[:, 1] == len(static["decoder_input_ids"]) - 2
    assert torch.equal(trained_at.top_entity_ids[placeholder], ids)
    generation = encode_generation_record(
        {"id": "g", "input": "<E_s> ba <E_e> ro", "outputs": ["ki ta", "x"], "mention_entities": [5]}, tokenizer
    )
    assert generation["labels"][-1] == tokenizer.eos_token_id and set(generation["decoder_entity_labels"]) == {-100}
    with pytest.raises(ValueError, match="all or none"):
        EDMemSeq2SeqCollator(tokenizer.pad_token_id)([static, qa])

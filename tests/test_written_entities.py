"""On a tiny model pre-trained with the writer of entity rows (`edmem pretrain --entity_row_writer true`), people it
never read, added by `add_entities` from one sentence each, are found by the memory at their name and answered from
their written rows.

The world, the training and the measures are `benchmarks/tiny_written_world.py`'s (its first seed): people born in
one of a few cities, stated in three sentence forms; practice people, read through written rows only under fresh
names, teach the writer to put the city in the row and the reader to take it out. A question is the second form with
the city masked; the memory's top entity at the person's `<E_s>` must be the new row, and the masked city's tokens
must be filled in.
"""

from __future__ import annotations

import pytest
import torch

from tiny_models import load_benchmark, make_word_tokenizer

# isort: split
# benchmarks/ is on the path (tiny_models)
import experiments.tiny_world as tiny

world_module = load_benchmark("tiny_written_world")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("written")
    tokenizer = make_word_tokenizer(bart_template=True)
    world = tiny.tiny_world(tokenizer)
    corpus = tiny.write_corpus(tokenizer, world, folder / "corpus")
    world_module.pretrain(**world_module.pretraining_arguments(corpus, folder / "model", seed=0))
    torch.set_num_threads(threads)
    return folder / "model", tokenizer, world


def test_written_rows_of_unseen_people_are_found_and_answered(trained):
    model_dir, tokenizer, world = trained
    result = world_module.measure(model_dir, tokenizer, world)
    unseen, people = len(world["unseen"]), len(world["trained"])
    assert result["unseen_found"] == unseen and result["unseen_answered"] >= unseen - 1, result
    # the answer comes from the row: rows written from sentences giving other cities are answered with those
    assert result["told_found"] == unseen and result["told_answered"] >= unseen - 1, result
    # the trained people are still found on their own rows
    assert result["trained_found"] >= 0.9 * people, result


def test_the_tiny_world_refuses_what_its_names_and_words_cannot_hold():
    tokenizer = make_word_tokenizer(bart_template=True)
    with pytest.raises(ValueError, match="practice=200: the names give room for 0 to 128"):
        tiny.tiny_world(tokenizer, practice=200)
    with pytest.raises(ValueError, match="cities=1: 2 to"):
        tiny.tiny_world(tokenizer, cities=1)
    with pytest.raises(ValueError, match="people need tags"):
        tiny.tiny_world(tokenizer, cities=120, tagged=True)
    assert len(tiny.tiny_world(tokenizer, cities=128)["cities"]) == 128  # the most, without questions
    with pytest.raises(ValueError, match="cities=128: no words are left for the questions"):
        tiny.tiny_world(tokenizer, cities=128, questions=True)
    with pytest.raises(SystemExit):
        world_module.main(["--steps", "0", "--out", "unused"])


def test_a_second_fact_gives_each_passage_one_of_two_facts_and_leaves_the_one_fact_world_as_it_was(tmp_path):
    """`employers`: each person works for one of them, stated in three forms of its own, a passage each beside the
    three city forms, both mentions labelled; the people, their cities and the city forms are the one-fact world's."""
    from datasets import load_from_disk

    from edmem_hf import EntityVocab

    tokenizer = make_word_tokenizer(bart_template=True)
    one, two = tiny.tiny_world(tokenizer), tiny.tiny_world(tokenizer, employers=4)
    assert all(one[key] == two[key] for key in ("unseen", "trained", "practice", "cities", "home", "forms"))
    (employer,) = two["facts"]
    assert not one["facts"] and len(employer["values"]) == 4 and not set(employer["values"]) & set(two["cities"])
    assert set(employer["of"].values()) <= set(employer["values"]) and len(set(employer["of"].values())) > 1
    corpus = tiny.write_corpus(tokenizer, two, tmp_path / "corpus")
    passages = load_from_disk(str(corpus / "passages"))["train"]
    names = EntityVocab.load(str(corpus)).names
    people = two["trained"] + two["practice"]
    assert len(passages) == 6 * len(people)
    person = people[0]
    for k, row in enumerate(passages.select(range(6))):
        labelled = [names[label] for label in row["entity_labels"] if label >= 0]
        fact = two["home"][person] if k < 3 else employer["of"][person]
        assert sorted(labelled) == sorted([person, fact]), (k, labelled)
    writer = world_module.pretraining_arguments(corpus, tmp_path / "model", seed=0, rows_apart=5, answer_rows=True)[
        "writer"
    ]
    assert (writer.writer_pools_texts, writer.writer_passages_per_row, writer.writer_answer_rows) == (False, 5, True)
    with pytest.raises(SystemExit):
        world_module.main(["--answer-rows", "--out", "unused"])


def test_more_facts_keep_the_two_fact_world_and_state_each_fact_apart(tmp_path):
    """`more_facts`: further facts beside the employer, each with values and forms of its own, a passage each; the
    two-fact world (people, cities, the employer and its forms) stays as it was."""
    from datasets import load_from_disk

    from edmem_hf import EntityVocab

    tokenizer = make_word_tokenizer(bart_template=True)
    two, six = (
        tiny.tiny_world(tokenizer, employers=4),
        tiny.tiny_world(tokenizer, employers=4, more_facts=4),
    )
    assert all(two[key] == six[key] for key in ("unseen", "trained", "practice", "cities", "home", "forms"))
    assert six["facts"][0] == two["facts"][0] and len(six["facts"]) == 5
    values = [value for fact in six["facts"] for value in fact["values"]]
    form_words = {word for fact in six["facts"] for form in fact["forms"] for word in form.split()} - {
        "{p}",
        "{e}",
        ".",
    }
    assert len(set(values)) == 20 and not (set(values) & set(six["cities"])) and not (set(values) & form_words)
    assert all(len(set(fact["of"].values())) > 1 for fact in six["facts"])
    corpus = tiny.write_corpus(tokenizer, six, tmp_path / "corpus")
    passages = load_from_disk(str(corpus / "passages"))["train"]
    names = EntityVocab.load(str(corpus)).names
    person = (six["trained"] + six["practice"])[0]
    assert len(passages) == 18 * len(six["trained"] + six["practice"])
    for k, row in enumerate(passages.select(range(18))):
        labelled = [names[label] for label in row["entity_labels"] if label >= 0]
        fact = six["home"][person] if k < 3 else six["facts"][(k - 3) // 3]["of"][person]
        assert sorted(labelled) == sorted([person, fact]), (k, labelled)
    with pytest.raises(ValueError, match="more_facts=2: the facts beyond the employer need employers"):
        tiny.tiny_world(tokenizer, more_facts=2)
    with pytest.raises(ValueError, match="employers=30: 2 to"):
        tiny.tiny_world(tokenizer, employers=30, more_facts=4)
    with pytest.raises(SystemExit):
        world_module.main(["--more-facts", "2", "--out", "unused"])


def test_questions_ask_each_fact_of_each_person_and_leave_the_world_as_it_was(tmp_path):
    """`questions`: a question form for the city and each fact, of words no other part of the world uses, every
    trained and practice person asked each in `questions.jsonl`, which `read_qa` links as pre-training reads it."""
    from edmem_hf import EntityVocab
    from edmem_hf.tasks import read_qa

    tokenizer = make_word_tokenizer(bart_template=True)
    plain = tiny.tiny_world(tokenizer, employers=4, more_facts=1)
    asking = tiny.tiny_world(tokenizer, employers=4, more_facts=1, questions=True)
    assert all(plain[key] == asking[key] for key in plain if key != "question_forms") and not plain["question_forms"]
    assert len(asking["question_forms"]) == 3
    used = {w for form in asking["forms"] for w in form.split()} | set(asking["cities"])
    used |= {w for fact in asking["facts"] for form in fact["forms"] for w in form.split()} | set(
        v for fact in asking["facts"] for v in fact["values"]
    )
    asked_words = {w for form in asking["question_forms"] for w in form.split()} - {"{p}", "?"}
    assert len(asked_words) == 6 and not asked_words & used
    corpus = tiny.write_corpus(tokenizer, asking, tmp_path / "corpus")
    vocab = EntityVocab.load(str(corpus))
    rows = read_qa(corpus / "questions.jsonl", vocab)
    people = asking["trained"] + asking["practice"]
    assert len(rows) == 3 * len(people)
    person, employer = people[1], asking["facts"][0]
    row = rows[len(people) + 1]  # the employer's question, the second person
    assert person in row["question"] and row["mention_entities"] == [vocab.id_of(person)]
    assert row["answers"] == [employer["of"][person]] and row["answer_entity"] == vocab.id_of(employer["of"][person])
    arguments = world_module.pretraining_arguments(corpus, tmp_path / "model", seed=0, questions=True, batch_size=8)
    assert arguments["mixing"].mixed_questions_file == str(corpus / "questions.jsonl")
    assert arguments["args"].per_device_train_batch_size == 8


def test_a_question_counts_as_found_at_the_name_s_top_entity_and_answered_at_every_answer_token():
    """`asked_and_answered` on a stand-in model that gives the answer's tokens (or each shifted by one) and a chosen
    top entity at the name: the counts follow each alone."""
    from types import SimpleNamespace

    from edmem_hf import EntityVocab

    tokenizer = make_word_tokenizer(bart_template=True)
    world = tiny.tiny_world(tokenizer, questions=True)
    people = world["trained"][:3]
    vocab = EntityVocab(world["cities"] + people)
    ids = [vocab.id_of(person) for person in people]

    class StandIn:
        entity_vocab = vocab

        def __init__(self, shift: int, top: int | None):
            self.shift, self.top, self.asked = shift, top, []

        def __call__(self, input_ids, labels, output_attended_entities, **batch):
            self.asked.append(tokenizer.decode(input_ids[0]))
            tokens = (labels.clamp(min=0) + self.shift) % len(tokenizer)
            top = self.top if self.top is not None else int(batch["entity_labels"][batch["entity_labels"] >= 0][0])
            return SimpleNamespace(logits=torch.nn.functional.one_hot(tokens, len(tokenizer)).float(),
                                   encoder_attended_entities=SimpleNamespace(top_entity_ids=torch.tensor([[top]])))  # fmt: skip

    model = StandIn(shift=0, top=None)
    assert tiny.asked_and_answered(model, tokenizer, people, ids, world["home"], 0, world) == (3, 3)
    assert all(f"<E_s> {person} <E_e>" in question for person, question in zip(people, model.asked))
    assert tiny.asked_and_answered(StandIn(1, None), tokenizer, people, ids, world["home"], 0, world) == (3, 0)
    assert tiny.asked_and_answered(StandIn(0, -1), tokenizer, people, ids, world["home"], 0, world) == (0, 3)

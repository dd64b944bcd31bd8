"""`edmem_hf.research.diagnostics`: where a model keeps what it knows about an entity. On a tiny random model whose
answers differ with the row its encoder's memory reads, each diagnostic answers through the rows it says it does
(the oracle read through the subject's row alone, the row swap through the partner's, the rewrite through the
rewritten rows), counts as it says, and leaves the model as it was."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest
import torch

from edmem_hf import EntityVocab
from edmem_hf.evaluation import normalize_answer
from edmem_hf.research.diagnostics import (
    answer_questions,
    memory_diagnostics,
    oracle_read,
    rewrite,
    row_content,
    row_swap,
    variance_shares_and_probe,
    written_facts,
)
from tiny_models import make_word_tokenizer, make_words, tiny_model

PEOPLE = 4  # the first entities, each with a question; the others are rows the plain read mixes in
QUESTION = "Where was Pat born ?"  # the same text for every person: only the row read tells them apart


def _model(**overrides):
    """A tiny EDMem whose free answers differ with the row its encoder's memory reads at the subject: weights of a
    wider spread than at initialisation, the people's rows long and random, and `<E_s>` never generated (the
    decoder's memory, which the diagnostics leave unmasked, is then never read)."""
    tokenizer = make_word_tokenizer(bart_template=True)
    words = make_words(400)
    names = [f"{words[i]} {words[i + 1]}" for i in range(0, 16, 2)]
    start, end = tokenizer.convert_tokens_to_ids(["<E_s>", "<E_e>"])
    model = tiny_model(vocab_size=len(tokenizer), entity_vocab_size=len(names), entity_start_token_id=start,
                       entity_end_token_id=end, init_std=0.2, **overrides).eval()  # fmt: skip
    model.entity_vocab = EntityVocab(names)
    with torch.no_grad():
        model.final_logits_bias[0, start] = -1e4
        table = model.get_encoder().entity_embeddings.weight
        table[:PEOPLE] = 20 * torch.randn(PEOPLE, table.shape[1], generator=torch.Generator().manual_seed(0))
    return model, tokenizer, names


def _record(i: int, person: str, answer: str, question: str = QUESTION, relation: str = "born_in") -> dict:
    at = question.index("Pat") if "Pat" in question else question.index(person)
    length = 3 if "Pat" in question else len(person)
    return {"id": f"q{i}", "question": question, "answer": [answer], "relation": relation, "link_offset": [at],
            "link_length": [length], "link_target": [person], "entity_name": [person], "answer_entity": []}  # fmt: skip


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def _state(model) -> dict:
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def _unchanged(model, state: dict) -> bool:
    now = model.state_dict()
    return now.keys() == state.keys() and all(torch.equal(now[name], state[name]) for name in state)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The model, and each person's answer with only their row visible to the memory (`set_entity_mask`, the
    public way), asked one at a time: what an answer read through that row is."""
    folder = tmp_path_factory.mktemp("diagnostics")
    model, tokenizer, names = _model()
    own = []
    for i, person in enumerate(names[:PEOPLE]):
        alone = torch.arange(len(names)) == i
        model.set_entity_mask(alone)
        asked = _write(folder / f"alone-{i}.jsonl", [_record(i, person, "unknown")])
        own.append(answer_questions(model, tokenizer, asked)[f"q{i}"])
        model.set_entity_mask(None)
    # the setting's premise: each row gives an answer of its own
    assert len({normalize_answer(answer) for answer in own}) == PEOPLE, own
    questions = _write(folder / "questions.jsonl", [_record(i, p, own[i]) for i, p in enumerate(names[:PEOPLE])])
    return model, tokenizer, names, own, questions


def test_the_oracle_read_answers_through_the_subject_s_row_alone(world):
    model, tokenizer, names, own, questions = world
    state = _state(model)
    forced = answer_questions(model, tokenizer, questions, subjects_only=True)
    assert [forced[f"q{i}"] for i in range(PEOPLE)] == own
    figures = oracle_read(model, tokenizer, questions)
    # read as usual, the four identical questions get one answer: one person's at most
    assert figures["oracle"] == 100.0 and figures["plain"] <= 100.0 / PEOPLE, figures
    assert _unchanged(model, state) and model.get_encoder()._entity_mask is None and not model.training


def test_a_row_swap_reads_each_subject_through_its_partner_s_row(world):
    """Every answer is the partner's: the reads were forced onto the partner's rows. Swapping the table's rows
    instead would move nothing: the memory finds rows by content, and the swapped table is the same set of rows."""
    model, tokenizer, names, own, questions = world
    state = _state(model)
    assert row_swap(model, tokenizer, questions, seed=0) == {"follow": 100.0, "kept": 0.0, "questions": PEOPLE}
    assert _unchanged(model, state)
    swapped = copy.deepcopy(model)
    with torch.no_grad():
        table = swapped.get_encoder().entity_embeddings.weight
        table[:PEOPLE] = table[[1, 0, 3, 2]].clone()
    assert answer_questions(swapped, tokenizer, questions) == answer_questions(model, tokenizer, questions)


def test_a_row_swap_counts_only_questions_whose_answers_differ(world, tmp_path):
    """A question whose subject and partner share the answer says nothing about where it is read: not counted."""
    model, tokenizer, names, own, _ = world
    same = _write(tmp_path / "same.jsonl", [_record(i, p, "Paris") for i, p in enumerate(names[:PEOPLE])])
    assert row_swap(model, tokenizer, same, seed=0) == {"follow": 0.0, "kept": 0.0, "questions": 0}


@pytest.mark.parametrize("writer", [False, True], ids=["mean_query", "writer_rows_apart"])
def test_rewrite_answers_through_the_rewritten_rows_and_puts_them_back(tmp_path, writer):
    """`rewritten` is EM against the answers of a copy whose rows were written by hand as `add_entities` writes new
    ones; `plain` against the model as it is. The rows, the rows kept apart and their count are put back."""
    from edmem_hf.research.entity_growth import memory_queries, write_rows_apart, writer_inputs

    overrides = dict(entity_row_writer=True, writer_pools_texts=False) if writer else {}
    model, tokenizer, names = _model(**overrides)
    people = names[:PEOPLE]
    texts = {p: [f"<E_s> {p} <E_e> was born in Ismerta .", f"The poet <E_s> {p} <E_e> wrote ."] for p in people}
    asked = [_record(i, p, "unknown", question=f"Where was {p} born ?") for i, p in enumerate(people)]
    by_hand = copy.deepcopy(model)
    ids = list(range(PEOPLE))
    if writer:
        write_rows_apart(by_hand, ids, writer_inputs(by_hand, people, list(texts.values()), tokenizer))
    else:
        table = by_hand.get_encoder().entity_embeddings.weight
        means = memory_queries(by_hand, list(texts.values()), tokenizer)
        with torch.no_grad():
            table[:PEOPLE] = means / means.norm(dim=-1, keepdim=True) * table.norm(dim=-1).mean()
    gold = answer_questions(by_hand, tokenizer, _write(tmp_path / "asked.jsonl", asked))
    questions = _write(tmp_path / "gold.jsonl", [{**r, "answer": [gold[r["id"]]]} for r in asked])
    before = answer_questions(model, tokenizer, questions)
    plain = 100.0 * sum(before[r["id"]] == gold[r["id"]] for r in asked) / PEOPLE
    state = _state(model)
    estimator = "writer" if writer else "mean_query"
    assert rewrite(model, tokenizer, questions, texts, estimator) == {"plain": plain, "rewritten": 100.0}
    assert plain < 100.0  # the rewritten rows changed some answer
    assert _unchanged(model, state) and model.config.written_entity_rows == 0
    assert getattr(model.get_encoder().entity_embeddings, "written_rows", None) is None
    with pytest.raises(ValueError, match="estimator must be writer or mean_query"):
        rewrite(model, tokenizer, questions, texts, "fitted")


def test_the_row_probe_reads_a_fact_that_rows_carry_and_not_one_they_do_not(tmp_path):
    """`row_content`: rows that spell each person's occupation give the probe every scored person's; their field,
    which no row carries, stays near the majority value."""
    model = tiny_model(entity_vocab_size=48)
    people = model.entity_vocab.names
    occupations, fields = ["poet", "pilot", "banker", "lawyer"], ["law", "music", "history"]
    rng = random.Random(0)
    facts = {person: (occupations[i % 4], rng.choice(fields)) for i, person in enumerate(people)}
    with torch.no_grad():
        table = model.get_encoder().entity_embeddings.weight
        table.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(0))
        for i, person in enumerate(people):
            table[i, occupations.index(facts[person][0])] += 1.0

    def questions(name: str, group: list[str]) -> Path:
        return _write(tmp_path / f"{name}.jsonl", [{"link_target": [person], "relation": relation, "answer": [value]}
                      for person in group for relation, value in zip(("occupation", "field"), facts[person])])  # fmt: skip

    figures = row_content(model, [questions("fit", people[:36])], questions("scored", people[36:]),
                          ("occupation", "field"))  # fmt: skip
    assert list(figures) == ["occupation", "majority_occupation", "field", "majority_field", "probe", "majority"]
    assert figures["occupation"] == 100.0 and figures["majority_occupation"] <= 50.0
    assert figures["field"] <= 75.0 and figures["probe"] == pytest.approx(
        (figures["occupation"] + figures["field"]) / 2, abs=0.01
    )


def test_written_fact_figures_split_a_row_into_name_and_fact():
    """`variance_shares_and_probe`: rows made of a name code and a fact code give each its share of the variance, and
    the probe reads the fact for names it was not fitted on only when the rows carry it (at chance otherwise)."""
    generator = torch.Generator().manual_seed(0)
    names, facts = torch.randn(12, 1, 32, generator=generator), torch.randn(1, 8, 32, generator=generator)
    carrying = variance_shares_and_probe(names + 0.5 * facts)  # the fact a quarter of the name's variance
    assert 70.0 < carrying["name_share"] < 90.0 and carrying["probe"] >= 75.0
    assert carrying["name_share"] + carrying["fact_share"] == pytest.approx(100.0, abs=0.1)
    assert carrying["chance"] == 12.5
    only_names = variance_shares_and_probe(
        names.expand(12, 8, 32) + 0.01 * torch.randn(12, 8, 32, generator=generator)
    )
    assert only_names["fact_share"] < 1.0 and only_names["name_share"] > 99.0 and only_names["probe"] <= 25.0


def test_written_facts_writes_a_row_for_each_made_up_name_and_value():
    model, tokenizer, names = _model(entity_row_writer=True)
    people = {f"{first} {last}" for first, last in zip(make_words(12, seed=1)[:6], make_words(12, seed=2)[:6])}
    values = make_words(20, seed=3)[:4]
    state = _state(model)
    figures = written_facts(model, tokenizer, people, {"occupation": ("{S} was a {V} .", values)}, seed=0, max_names=6)
    assert figures["chance"] == figures["chance_occupation"] == 25.0
    assert 0.0 <= figures["name_share"] <= 100.0 and 0.0 <= figures["fact_share"] <= 100.0
    assert figures["name_share"] + figures["fact_share"] <= 100.0 + 1e-6
    assert _unchanged(model, state)


def test_written_facts_says_when_the_names_allow_too_few_new_ones():
    """`written_facts` makes its names of the people's first and last names; when the combinations are all taken
    there is nothing to write, and it says so instead of drawing forever."""
    model, tokenizer, _ = _model(entity_row_writer=True)
    model.entity_vocab = EntityVocab(["Ann Lee", "Bob Lee", "Acme Labs", *[f"E{i}" for i in range(5)]])
    with pytest.raises(ValueError, match="written_facts needs 3 names no entity has.* give 0"):
        written_facts(model, tokenizer, {"Ann Lee", "Bob Lee"}, {"occupation": ("{S} was a {V} .", ["poet"])})


def test_memory_diagnostics_runs_what_its_arguments_allow_and_leaves_the_model_as_it_was(world, tmp_path):
    model, tokenizer, names, own, questions = world
    state = _state(model)
    plain = memory_diagnostics(model, tokenizer, questions)
    assert set(plain) == {"row_swap", "oracle_read"} and plain["oracle_read"]["oracle"] == 100.0
    added = _write(tmp_path / "added.jsonl", [_record(9, names[5], "unknown")])
    texts = {names[0]: [f"<E_s> {names[0]} <E_e> was born ."]}
    full = memory_diagnostics(model, tokenizer, questions, added_questions_file=added, texts=texts,
                              estimator="mean_query", probed_relations=("born_in",))  # fmt: skip
    assert set(full) == {"row_swap", "oracle_read", "rewrite", "row_content"}
    assert full["row_swap"] == plain["row_swap"] and full["oracle_read"]["oracle"] == 0.0  # the added's answers
    assert _unchanged(model, state)

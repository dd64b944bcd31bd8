"""On a tiny model pre-trained with the writer of entity rows (`edmem pretrain --entity_row_writer true`), people it
never read, added by `add_entities` from one sentence each, are found by the memory at their name and answered.

The world: people named from shared pools of first and last names (an unseen person's name is made of trained
tokens, as in the knowledge world), each born in one of a few cities, stated in three sentence forms. A fifth of
the names are held out of pre-training. A question is a fourth form with the city masked; the memory's top entity
at the person's `<E_s>` must be the new row, and the masked city's tokens must be filled in.
"""

from __future__ import annotations

import random

import pytest
import torch
from datasets import Dataset, DatasetDict

from edmem_hf import EDMemForConditionalGeneration, EntityVocab
from edmem_hf.entity_growth import add_entities
from edmem_hf.pretraining import PretrainingArguments, pretrain
from tiny_models import make_word_tokenizer, make_words

SIZES = dict(firsts=4, lasts=4, cities=4, unseen=4)
STEPS = 2000


def marked(name: str) -> str:
    return f"<E_s> {name} <E_e>"


def tiny_world(tokenizer, seed: int = 0):
    """`(trained people, unseen people, cities, home city of each person, the four sentence forms)`; every name,
    city and form word one token of `tokenizer`."""
    words = [w for w in make_words(400) if len(tokenizer(" " + w, add_special_tokens=False).input_ids) == 1]
    rng = random.Random(seed)
    rng.shuffle(words)
    firsts, rest = words[: SIZES["firsts"]], words[SIZES["firsts"] :]
    lasts, rest = rest[: SIZES["lasts"]], rest[SIZES["lasts"] :]
    cities, glue = rest[: SIZES["cities"]], rest[SIZES["cities"] : SIZES["cities"] + 9]
    people = [f"{first} {last}" for first in firsts for last in lasts]
    rng.shuffle(people)
    home = {person: rng.choice(cities) for person in people}
    g = glue
    forms = [f"{{p}} {g[0]} {g[1]} {{c}} .", f"{{p}} {g[2]} {{c}} {g[3]} .", f"{g[4]} {{c}} {g[5]} {{p}} .",
             f"{{p}} {g[6]} {g[7]} {g[8]} {{c}} ."]  # fmt: skip
    unseen = SIZES["unseen"]
    return people[unseen:], people[:unseen], cities, home, forms


def write_corpus(tokenizer, names: list[str], people: list[str], home: dict, forms: list[str], out) -> str:
    """An `edmem build-corpus` folder: each trained person in the first three forms, both mentions labelled."""
    start = tokenizer.convert_tokens_to_ids("<E_s>")
    rows = {"input_ids": [], "entity_labels": []}
    for person in people:
        for form in forms[:3]:
            ids = tokenizer(form.format(p=marked(person), c=marked(home[person]))).input_ids
            order = iter([person, home[person]] if form.index("{p}") < form.index("{c}") else [home[person], person])
            rows["input_ids"].append(ids)
            rows["entity_labels"].append([names.index(next(order)) if t == start else -100 for t in ids])
    passages = Dataset.from_dict(rows)
    DatasetDict({"train": passages, "validation": passages.select(range(8))}).save_to_disk(str(out / "passages"))
    EntityVocab(names).save(str(out))
    tokenizer.save_pretrained(str(out / "tokenizer"))
    return str(out)


@torch.no_grad()
def found_and_answered(model, tokenizer, people: list[str], ids: list[int], home: dict, form: str) -> tuple[int, int]:
    """How many of `people` the memory finds at their name (top entity `ids[i]`), and whose masked city the model
    fills in, teacher-forced, in `form`."""
    start, end = model.config.entity_start_token_id, model.config.entity_end_token_id
    city_second = form.index("{c}") > form.index("{p}")
    found = answered = 0
    for person, entity in zip(people, ids):
        question = tokenizer(form.format(p=marked(person), c="<E_s> <mask> <E_e>"), return_tensors="pt").input_ids
        full = tokenizer(form.format(p=marked(person), c=marked(home[person])), return_tensors="pt").input_ids
        out = model(input_ids=question, labels=full, output_attended_entities=True)
        found += int(out.encoder_attended_entities.top_entity_ids[0 if city_second else 1, 0]) == entity
        begin = int((full[0] == start).nonzero()[int(city_second), 0]) + 1
        stop = int((full[0] == end).nonzero()[int(city_second), 0])
        answered += bool((out.logits[0].argmax(-1)[begin:stop] == full[0, begin:stop]).all())
    return found, answered


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("written")
    tokenizer = make_word_tokenizer(bart_template=True)
    people, unseen, cities, home, forms = tiny_world(tokenizer)
    corpus = write_corpus(tokenizer, cities + people, people, home, forms, folder / "corpus")
    pretrain(PretrainingArguments(
        output_dir=str(folder / "model"), corpus_dir=corpus, entity_row_writer=True, written_row_share=0.5,
        written_only_share=0.3, d_model=64, encoder_lower_layers=1, encoder_upper_layers=1, decoder_lower_layers=1,
        decoder_upper_layers=1, encoder_ffn_dim=128, decoder_ffn_dim=128, encoder_attention_heads=4,
        decoder_attention_heads=4, entity_embed_dim=32, max_position_embeddings=32, dropout=0.0, random_mask_prob=0.0,
        per_device_train_batch_size=32, learning_rate=5e-3, max_steps=STEPS, eval_steps=0, save_steps=STEPS,
        logging_steps=STEPS, report_to="none", disable_tqdm=True, seed=0,
    ))  # fmt: skip
    torch.set_num_threads(threads)
    model = EDMemForConditionalGeneration.from_pretrained(folder / "model").eval()
    return model, tokenizer, people, unseen, home, forms


@pytest.mark.xfail(
    strict=True,
    reason="issue 37, open: on this tiny world the writer's rows of unseen people are not yet found by the memory "
    "nor answered (2 of 4 found, 1 answered, as with mean-query rows; the trained people all found); strict, so "
    "the test fails once they are, and the marker must go",
)
def test_written_rows_of_unseen_people_are_found_and_answered(trained):
    model, tokenizer, people, unseen, home, forms = trained
    sentences = [[forms[0].format(p=marked(person), c=marked(home[person]))] for person in unseen]
    ids = add_entities(model, unseen, sentences, tokenizer)  # the writer, the default of a model with one
    found, answered = found_and_answered(model, tokenizer, unseen, ids, home, forms[1])
    assert found == len(unseen) and answered >= len(unseen) - 1, (found, answered)
    # the trained people are still found on their own rows
    trained_ids = [model.entity_vocab.id_of(person) for person in people]
    assert found_and_answered(model, tokenizer, people, trained_ids, home, forms[1])[0] >= 0.9 * len(people)

"""The tiny world of `tiny_written_world.py`: people named from shared pools of made-up first and last names, each
born in one of a few cities (and with more facts, each among a few values), stated in three sentence forms of their
own; its corpus as `edmem build-corpus` writes one, its questions in the released QA format; and what a trained model
finds and answers about its people, teacher-forced."""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

import torch
from datasets import Dataset, DatasetDict

from edmem_hf import EntityVocab
from edmem_hf.tasks import EDMemSeq2SeqCollator, encode_qa_record, read_qa
from experiments.word_tokenizer import make_words

SIZES = dict(firsts=12, lasts=12, cities=4, unseen=4, trained=12, practice=100, tag_words=11)


def marked(name: str) -> str:
    return f"<E_s> {name} <E_e>"


def tiny_world(
    tokenizer,
    seed: int = 0,
    practice: int = SIZES["practice"],
    cities: int = SIZES["cities"],
    tagged: bool = False,
    employers: int = 0,
    more_facts: int = 0,
    questions: bool = False,
) -> dict:
    """`trained`, `practice` (that many) and `unseen` people, `cities` (that many), each person's `home` city and the
    three sentence `forms`; every name, city and form word one token of `tokenizer`. With `tagged`, each person has
    a `tag` that every sentence about them ends with (`{t}`), a pair of words of their own (each word shared with
    other people's tags, the pair no one else's): their passages then say who they are, as a biography's other facts
    (common values, a combination of its own) do, and an added person's tag is made of trained words. With
    `employers`, each person has `facts` beyond the city, the first an employer among that many: each a dict of its
    `values`, the one each person has (`of`) and three `forms` of its own (`{e}` the value); `more_facts` more, each
    among as many values (1 + `more_facts` in all). With `questions`, a `question_forms` for the city and each fact
    (`{p}` the person; two words of its own each, the last words of the list, so that the world is otherwise the
    same)."""
    room = SIZES["firsts"] * SIZES["lasts"] - SIZES["unseen"] - SIZES["trained"]
    if not 0 <= practice <= room:
        raise ValueError(f"practice={practice}: the names give room for 0 to {room} practice people")
    words = [w for w in make_words(400) if len(tokenizer(" " + w, add_special_tokens=False).input_ids) == 1]
    free = len(words) - SIZES["firsts"] - SIZES["lasts"] - 6  # the form words
    if not 2 <= cities <= free:
        raise ValueError(f"cities={cities}: 2 to {free} (another city than a person's own is asked about)")
    rng = random.Random(seed)
    rng.shuffle(words)
    firsts, rest = words[: SIZES["firsts"]], words[SIZES["firsts"] :]
    lasts, rest = rest[: SIZES["lasts"]], rest[SIZES["lasts"] :]
    cities, glue = rest[:cities], rest[cities : cities + 6]
    people = [f"{first} {last}" for first in firsts for last in lasts]
    rng.shuffle(people)
    home = {person: rng.choice(cities) for person in people}
    g = glue
    forms = [f"{{p}} {g[0]} {g[1]} {{c}} .", f"{{p}} {g[2]} {{c}} {g[3]} .", f"{g[4]} {{c}} {g[5]} {{p}} ."]
    unseen, trained = SIZES["unseen"], SIZES["unseen"] + SIZES["trained"]
    named = people[: trained + practice]
    pool = rest[len(cities) + 6 :][: 2 * SIZES["tag_words"]]
    tags = [f"{a} {b}" for a in pool[::2] for b in pool[1::2]]
    random.Random(seed + 1).shuffle(tags)
    if tagged and len(tags) < len(named):
        raise ValueError(f"{len(named)} people need tags, and {len(tags)} pairs of words are left")
    if tagged:
        forms = [form[: -len(" .")] + " {t} ." for form in forms]
    world = dict(unseen=people[:unseen], trained=people[unseen:trained], practice=people[trained : trained + practice],
                 cities=cities, home=home, forms=forms, tag=dict(zip(named, tags)) if tagged else {},
                 facts=[], question_forms=[])  # fmt: skip
    asked_facts = 1 + (1 + more_facts if employers else 0)  # the city, the employer and the more facts
    asking = rest[len(rest) - 2 * asked_facts :] if questions else []
    if questions and len(rest) - len(asking) < len(cities) + 6 + 2 * SIZES["tag_words"]:
        raise ValueError(f"cities={len(cities)}: no words are left for the questions")
    world["question_forms"] = [f"{a} {{p}} {b} ?" for a, b in zip(asking[::2], asking[1::2])]
    if more_facts and not employers:
        raise ValueError(f"more_facts={more_facts}: the facts beyond the employer need employers, their values' count")
    if employers:  # words after the tags', drawn apart: the one-fact world stays as it was
        more = rest[len(cities) + 6 + 2 * SIZES["tag_words"] : len(rest) - len(asking)]
        room = len(more) // (1 + more_facts) - 4
        if not 2 <= employers <= room:
            raise ValueError(f"employers={employers}: 2 to {room} with more_facts={more_facts}")
        for k in range(1 + more_facts):  # each fact its values and four words of its forms
            words_of_fact = more[k * (employers + 4) : (k + 1) * (employers + 4)]
            values, e = words_of_fact[:employers], words_of_fact[employers:]
            draw = random.Random(seed + 2 + k)
            forms = [f"{{p}} {e[0]} {{e}} .", f"{e[1]} {{e}} {e[2]} {{p}} .", f"{{p}} {e[3]} {{e}} {e[0]} ."]
            world["facts"].append(dict(values=values, of={p: draw.choice(values) for p in people}, forms=forms))
    return world


def sentence(world: dict, text: str, person: str, city: str, fact: dict | None = None) -> str:
    """`text` (forms) about `person`, its mentions marked, with `city` as theirs (and their tag, if they have one, and
    their value of `fact`, one of `world["facts"]`, at `{e}`)."""
    value = fact["of"][person] if fact else None
    return text.format(p=marked(person), c=marked(city), e=marked(value) if value else "",
                       t=world["tag"].get(person, ""))  # fmt: skip


def write_corpus(tokenizer, world: dict, out: Path, restated: bool = False) -> Path:
    """An `edmem build-corpus` folder: each trained and practice person in the three forms, each form a passage
    with both mentions labelled (with `restated`, each passage two forms, the city stated twice; with employers,
    their three forms too, a passage each), and `practice.txt`, the practice people's names
    (`--written_only_entities_file`); with question forms, `questions.jsonl`, every fact of theirs asked
    (`--mixed_questions_file`)."""
    names = world["cities"] + world["trained"] + world["practice"] + [v for f in world["facts"] for v in f["values"]]
    start = tokenizer.convert_tokens_to_ids("<E_s>")
    rows = {"input_ids": [], "entity_labels": []}
    for person in world["trained"] + world["practice"]:
        city = world["home"][person]
        stated = [(form, None) for form in world["forms"]] + [
            (f, fact) for fact in world["facts"] for f in fact["forms"]
        ]
        for i, (form, fact) in enumerate(stated):
            mentioned = {"{p}": person, "{c}": city, "{e}": fact["of"][person] if fact else None}
            text = form + (" " + world["forms"][(i + 1) % 3] if restated else "")
            ids = tokenizer(sentence(world, text, person, city, fact)).input_ids
            order = iter([mentioned[kind] for kind in _mentions(text)])
            rows["input_ids"].append(ids)
            rows["entity_labels"].append([names.index(next(order)) if t == start else -100 for t in ids])
    passages = Dataset.from_dict(rows)
    DatasetDict({"train": passages, "validation": passages.select(range(8))}).save_to_disk(str(out / "passages"))
    EntityVocab(names).save(str(out))
    tokenizer.save_pretrained(str(out / "tokenizer"))
    (out / "practice.txt").write_text("".join(f"{person}\n" for person in world["practice"]))
    if world["question_forms"]:
        people = world["trained"] + world["practice"]
        records = [record for k in range(len(world["question_forms"]))
                   for record in question_records(world, people, k, answer_of(world, k))]  # fmt: skip
        (out / "questions.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    return out


def answer_of(world: dict, k: int) -> dict:
    """Each person's answer to question form `k`: their city (0), else their value of fact `k - 1`."""
    return world["home"] if k == 0 else world["facts"][k - 1]["of"]


def question_records(world: dict, people: list[str], k: int, answers: dict) -> list[dict]:
    """Question form `k` asked of `people`, the answer of each `answers[person]` (an entity), in the released QA
    format (`edmem_*.jsonl`, as `edmem_hf.task_files.read_qa` reads it): the person linked in the question."""
    records = []
    for person in people:
        question = world["question_forms"][k].format(p=person)
        records.append(dict(id=f"{k}-{person}", question=question, answer=[answers[person]],
                            link_offset=[question.index(person)], link_length=[len(person)], link_target=[person],
                            entity_name=[person], answer_entity=[[answers[person], answers[person]]]))  # fmt: skip
    return records


def _mentions(text: str) -> list[str]:
    """The `{p}`, `{c}` and `{e}` of a form, in order."""
    return [text[at : at + 3] for at in range(len(text)) if text.startswith(("{p}", "{c}", "{e}"), at)]


def hide_practice_people(model, world: dict) -> None:
    """Hides the practice people's rows from the memory (`set_entity_mask`): they taught the writer."""
    mask = torch.ones(model.config.entity_vocab_size, dtype=torch.bool)
    mask[[model.entity_vocab.id_of(person) for person in world["practice"]]] = False
    model.set_entity_mask(mask)


@torch.no_grad()
def found_and_answered(
    model,
    tokenizer,
    people: list[str],
    ids: list[int],
    city_of: dict,
    text: str,
    world: dict,
    asked: str = "{c}",
    fact: dict | None = None,
) -> tuple[int, int]:
    """How many of `people` the memory finds at their name (top entity `ids[i]` at the first `{p}` of `text`), and
    whose city `city_of[person]` (or with `asked="{e}"`, their value of `fact`) the model fills in, teacher-forced, in
    `text` with every `asked` mention's tokens masked one by one (as pre-training masks a mention)."""
    start, end = model.config.entity_start_token_id, model.config.entity_end_token_id
    kinds = _mentions(text)
    found = answered = 0
    for person, entity in zip(people, ids):
        full = tokenizer(sentence(world, text, person, city_of[person], fact), return_tensors="pt").input_ids
        starts, ends = (full[0] == start).nonzero()[:, 0], (full[0] == end).nonzero()[:, 0]
        cities = [(int(starts[i]) + 1, int(ends[i])) for i, kind in enumerate(kinds) if kind == asked]
        question = full.clone()
        for begin, stop in cities:
            question[0, begin:stop] = tokenizer.mask_token_id
        out = model(input_ids=question, labels=full, output_attended_entities=True)
        found += int(out.encoder_attended_entities.top_entity_ids[kinds.index("{p}"), 0]) == entity
        predicted = out.logits[0].argmax(-1)
        answered += all(bool((predicted[begin:stop] == full[0, begin:stop]).all()) for begin, stop in cities)
    return found, answered


def questions_answered(
    model, tokenizer, people: list[str], ids: list[int], city_of: dict, world: dict, group: str, facts: bool = True
) -> dict[str, int]:
    """The questions of the corpus's forms asked of `people`, as the pre-training batches ask them: how many the
    memory finds at the name in the city's question (`{group}_asked_found`, top entity `ids[i]`) and answers with
    `city_of[person]`, teacher-forced (`{group}_asked_answered`), and with `facts`, each fact's question answered
    (`{group}_{fact_key}_asked_answered`)."""
    answers = [city_of] + ([answer_of(world, k) for k in range(1, len(world["question_forms"]))] if facts else [])
    result = {}
    for k, answer in enumerate(answers):
        found, answered = asked_and_answered(model, tokenizer, people, ids, answer, k, world)
        if k == 0:
            result[f"{group}_asked_found"], result[f"{group}_asked_answered"] = found, answered
        else:
            result[f"{group}_{fact_key(k - 1)}_asked_answered"] = answered
    return result


@torch.no_grad()
def asked_and_answered(
    model, tokenizer, people: list[str], ids: list[int], answers: dict, k: int, world: dict
) -> tuple[int, int]:
    """Question form `k` asked of `people` (`question_records`, encoded by `encode_qa_record` as the mixed questions
    of pre-training are): how many the memory finds at the name (top entity `ids[i]`) and how many it answers with
    `answers[person]`, every answer token the model's first choice, teacher-forced."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "asked.jsonl"
        path.write_text("".join(json.dumps(record) + "\n" for record in question_records(world, people, k, answers)))
        rows = read_qa(path, model.entity_vocab)
    collate = EDMemSeq2SeqCollator(tokenizer.pad_token_id)
    found = answered = 0
    for row, entity in zip(rows, ids):
        batch = collate([encode_qa_record(row, tokenizer)])
        out = model(**batch, output_attended_entities=True)
        found += int(out.encoder_attended_entities.top_entity_ids[0, 0]) == entity
        labels = batch["labels"]
        answered += bool(((out.logits.argmax(-1) == labels) | (labels == -100)).all())
    return found, answered


def fact_key(k: int) -> str:
    """The name of `world["facts"][k]` in the results: `employer`, then `fact3`, `fact4`, ... (the city the first)."""
    return "employer" if k == 0 else f"fact{k + 2}"

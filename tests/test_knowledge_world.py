"""`edmem_hf.knowledge_world`: every biography states every fact, in varied templates; the single-biography switch;
the split of the people in two halves; the dump parses back with its links."""

from __future__ import annotations

import re

import pytest

from edmem_hf.dump import iter_parsed_pages
from edmem_hf.knowledge_world import (
    PERSON_ATTRIBUTES,
    TEMPLATES,
    KnowledgeWorldSettings,
    generate_knowledge_world,
    split_people,
    without_people,
)
from edmem_hf.toy_world import write_mediawiki_dump

RELATIONS = [relation for relation, _, _ in PERSON_ATTRIBUTES]


def _people(world):
    return [entity for entity in world.entities if entity.type == "person"]


def _biographies(world, person):
    return world.pages[person.name].split("\n\n== Biography ==\n")


def _states(text: str, value: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(value)}(?![\w-])", text, flags=re.IGNORECASE) is not None


def test_every_biography_states_every_fact_once_per_sentence():
    world = generate_knowledge_world(KnowledgeWorldSettings(num_people=30, biographies=5), seed=1)
    people = _people(world)
    assert len(people) == 30
    for person in people:
        biographies = _biographies(world, person)
        assert len(biographies) == 5
        for text in biographies:
            sentences = [s for s in re.split(r"(?<=\.) ", text) if s]
            assert person.name in sentences[0]  # the first sentence names the person in full
            assert len(sentences) == len(RELATIONS)
            for relation in RELATIONS:
                value = person.attributes[relation]
                assert _states(text, value), (person.name, relation, value, text)
                if relation in ("born_in", "university", "employer"):
                    assert f"[[{value}]]" in text  # entity values are links


def test_templates_are_varied_and_all_used():
    assert all(len(templates) >= 10 for templates in TEMPLATES.values())
    assert set(TEMPLATES) == set(RELATIONS)
    world = generate_knowledge_world(KnowledgeWorldSettings(num_people=80, biographies=5), seed=0)
    texts = [text for person in _people(world) for text in _biographies(world, person)]
    assert len(set(texts)) == len(texts)  # no two biographies alike
    orders = set()
    for person in _people(world)[:10]:
        for text in _biographies(world, person):
            positions = {r: text.find(person.attributes[r]) for r in ("born_in", "university", "employer")}
            orders.add(tuple(sorted(positions, key=positions.get)))
    assert len(orders) >= 4  # sentence orders vary
    # the subject is named by full name, last name or pronoun
    joined = " ".join(texts)
    assert re.search(r"(^|\. )(He|She) ", joined) and re.search(r"(^|\. )(His|Her) ", joined)


def test_the_single_biography_switch_renders_one_fixed_biography():
    world = generate_knowledge_world(KnowledgeWorldSettings(num_people=20, biographies=1, varied=False), seed=0)
    first_sentences = set()
    for person in _people(world):
        (text,) = _biographies(world, person)
        for relation in RELATIONS:
            assert _states(text, person.attributes[relation])
        skeleton = text
        for relation in RELATIONS:
            skeleton = skeleton.replace(person.attributes[relation], "V")
        skeleton = skeleton.replace(person.name, "N").replace("She ", "He ").replace(" her ", " his ")
        skeleton = skeleton.replace("Her ", "His ")
        first_sentences.add(skeleton)
    assert len(first_sentences) == 1  # one template per attribute, one order


def test_halves_share_no_person_and_cover_every_question():
    world = generate_knowledge_world(KnowledgeWorldSettings(num_people=41), seed=2)
    splits = split_people(world, seed=2)
    train, test = {p.subject for p in splits["train"]}, {p.subject for p in splits["test"]}
    assert not train & test and len(train) == 20 and len(test) == 21
    assert len(splits["train"]) + len(splits["test"]) == len(world.qa_pairs) == 41 * len(PERSON_ATTRIBUTES)
    assert not {p.question for p in splits["test"]} & {p.question for p in splits["train"]}
    assert split_people(world, seed=2) == splits and split_people(world, seed=3) != splits


def test_the_dump_links_every_person_and_value(tmp_path):
    world = generate_knowledge_world(KnowledgeWorldSettings(num_people=12), seed=0)
    pages = {page.title: page for page in iter_parsed_pages(write_mediawiki_dump(world, tmp_path / "w.xml"))}
    linked = {link.target for page in pages.values() for link in page.links}
    assert {person.name for person in _people(world)} <= linked  # every person is an entity of the vocabulary
    person = _people(world)[0]
    assert {person.attributes[r] for r in ("born_in", "university", "employer")} <= {
        link.target for link in pages[person.name].links
    }


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="num_people"):
        KnowledgeWorldSettings(num_people=2)
    with pytest.raises(ValueError, match="biographies"):
        KnowledgeWorldSettings(biographies=0)


def test_a_world_without_some_people_never_mentions_them():
    world = generate_knowledge_world(KnowledgeWorldSettings(num_people=20), seed=4)
    gone = [person.name for person in _people(world)[:3]]
    smaller = without_people(world, gone)
    assert not any(name in text for name in gone for text in smaller.pages.values())
    assert not any(pair.subject in gone for pair in smaller.qa_pairs)
    assert len(smaller.qa_pairs) == 17 * len(PERSON_ATTRIBUTES)
    kept = _people(world)[3]
    assert smaller.pages[kept.name] == world.pages[kept.name]
    with pytest.raises(KeyError, match="no person named 'Nobody'"):
        without_people(world, ["Nobody"])

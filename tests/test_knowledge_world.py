"""`edmem_hf.knowledge_world`: every biography states every fact, in varied templates; the single-biography switch;
the split of the people in two halves; the dump parses back with its links."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from edmem_hf.dump import iter_parsed_pages
from edmem_hf.knowledge_world import (
    PERSON_ATTRIBUTES,
    PRONOUNS,
    TEMPLATES,
    KnowledgeWorldSettings,
    generate_knowledge_world,
    one_fact_people,
    page_only_people,
    sentence_page_people,
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


def test_every_template_of_every_attribute_is_used():
    """In a world of modest size (60 people, 5 biographies each) every sentence template of every attribute appears:
    each sentence is drawn from all of an attribute's templates, not from a few."""
    world = generate_knowledge_world(KnowledgeWorldSettings(num_people=60, biographies=5), seed=0)
    used: dict[str, set[int]] = {relation: set() for relation in RELATIONS}
    for person in _people(world):
        name, last = person.name, person.aliases[0]
        subjects = [(name, f"{name}'s"), (last, f"{last}'s"), PRONOUNS[person.attributes["pronoun"]]]
        for text in _biographies(world, person):
            for relation, _, is_entity in PERSON_ATTRIBUTES:
                value = person.attributes[relation]
                value = f"[[{value}]]" if is_entity else value
                found = set()
                for index, template in enumerate(TEMPLATES[relation]):
                    for subject, possessive in subjects:
                        sentence = template.format(S=subject, s=subject, P=possessive, p=possessive, V=value)
                        if sentence[0].upper() + sentence[1:] in text:
                            found.add(index)
                assert found, (relation, text)  # each fact in one of its templates
                used[relation] |= found
    unused = {relation: sorted(set(range(len(TEMPLATES[relation]))) - used[relation]) for relation in RELATIONS}
    assert not any(unused.values()), unused


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


def test_groups_share_no_person_and_cover_every_question():
    world = generate_knowledge_world(KnowledgeWorldSettings(num_people=41), seed=2)
    splits = split_people(world, seed=2)
    groups = {name: {p.subject for p in pairs} for name, pairs in splits.items()}
    assert {name: len(people) for name, people in groups.items()} == {"train": 20, "validation": 10, "test": 11}
    assert not groups["train"] & groups["validation"] and not groups["train"] & groups["test"]
    assert not groups["validation"] & groups["test"]
    assert sum(map(len, splits.values())) == len(world.qa_pairs) == 41 * len(PERSON_ATTRIBUTES)
    questions = {name: {p.question for p in pairs} for name, pairs in splits.items()}
    assert not questions["train"] & questions["test"] and not questions["train"] & questions["validation"]
    assert split_people(world, seed=2) == splits and split_people(world, seed=3) != splits
    no_validation = split_people(world, seed=2, validation_fraction=0.0)
    assert not no_validation["validation"] and len(no_validation["test"]) == 21 * len(PERSON_ATTRIBUTES)
    with pytest.raises(ValueError, match="validation_fraction"):
        split_people(world, seed=2, validation_fraction=0.5)


@pytest.mark.parametrize("num_people", [6, 7, 12, 41, 100, 334])
def test_names_come_from_shared_pools(num_people):
    """Every full name is unique and every first and last name is shared with other people."""
    world = generate_knowledge_world(KnowledgeWorldSettings(num_people=num_people, biographies=1), seed=num_people)
    names = [person.name.split(" ") for person in _people(world)]
    assert all(len(parts) == 2 for parts in names) and len({tuple(parts) for parts in names}) == num_people
    for position in (0, 1):
        counts = Counter(parts[position] for parts in names)
        assert min(counts.values()) >= 2, counts
    assert max(Counter(parts[0] for parts in names).values()) <= max(2, num_people // 2)


def test_entity_attributes_have_large_value_sets():
    world = generate_knowledge_world(KnowledgeWorldSettings(num_people=12, biographies=1), seed=0)
    kinds = Counter(entity.type for entity in world.entities)
    assert kinds["city"] >= 200 and kinds["university"] >= 200 and kinds["company"] >= 200


def test_every_name_token_is_read_in_passages_about_other_people(tmp_path):
    """The fair world's promise: each token of a person's name is also in pre-training passages that do not
    mention the person, so that a person a model never read about still has a name made of trained tokens."""
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from edmem_hf import EntityVocab
    from edmem_hf.corpus import build_corpus

    world = generate_knowledge_world(KnowledgeWorldSettings(num_people=24, biographies=2), seed=7)
    build_corpus(write_mediawiki_dump(world, tmp_path / "w.xml.bz2"), tmp_path / "corpus", num_proc=1, vocab_size=600)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "corpus" / "tokenizer")
    vocab = EntityVocab.load(tmp_path / "corpus" / "entity_vocab.json")
    passages = load_from_disk(str(tmp_path / "corpus" / "passages"))["train"]
    read = [(set(ids), set(labels)) for ids, labels in zip(passages["input_ids"], passages["entity_labels"])]
    for person in _people(world):
        entity = vocab.id_of(person.name)
        elsewhere = set().union(*(tokens for tokens, entities in read if entity not in entities))
        for word in person.name.split(" "):
            unseen = set(tokenizer(f" {word}", add_special_tokens=False).input_ids) - elsewhere
            assert not unseen, (person.name, word, tokenizer.convert_ids_to_tokens(sorted(unseen)))


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
        KnowledgeWorldSettings(num_people=5)
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


def test_page_only_people_are_linked_from_their_own_cut_pages_alone(tmp_path):
    world = generate_knowledge_world(KnowledgeWorldSettings(num_people=20, biographies=5), seed=4)
    few = [person.name for person in _people(world)[:4]]
    cut = page_only_people(world, few, biographies=2)
    pages = {page.title: page for page in iter_parsed_pages(write_mediawiki_dump(cut, tmp_path / "w.xml"))}
    for name in few:
        assert cut.pages[name].count("== Biography ==") == 1  # two biographies, the second under a heading
        assert world.pages[name].replace(f"[[{name}]]", name).startswith(cut.pages[name].replace(f"[[{name}]]", name))
        linking = {title for title, page in pages.items() if name in {link.target for link in page.links}}
        assert linking == {name}  # still an entity of the corpus, listed on no place page
    kept = _people(world)[4]
    assert cut.pages[kept.name] == world.pages[kept.name]
    assert any(f"[[{kept.name}" in page for title, page in cut.pages.items() if title != kept.name)
    assert cut.qa_pairs == world.qa_pairs
    with pytest.raises(KeyError, match="no person named 'Nobody'"):
        page_only_people(world, ["Nobody"], 2)
    with pytest.raises(ValueError, match="biographies=0"):
        page_only_people(world, few, 0)


def test_one_fact_people_are_stated_by_one_fact_on_pages_of_one_sentence(tmp_path):
    world = generate_knowledge_world(KnowledgeWorldSettings(num_people=20, biographies=5), seed=4)
    few = sorted(person.name for person in _people(world)[:7])
    cut = one_fact_people(world, few, pages=3)
    pages = {page.title: page for page in iter_parsed_pages(write_mediawiki_dump(cut, tmp_path / "w.xml"))}
    relations = []
    for name in few:
        person = world.entity(name)
        (pair,) = [pair for pair in cut.qa_pairs if pair.subject == name]  # only the stated fact is asked
        relations.append(pair.relation)
        own = {title: page for title, page in pages.items() if name in {link.target for link in page.links}}
        assert sorted(own) == [name, f"{name} (2)", f"{name} (3)"]  # linked from its own pages alone
        texts = [cut.pages[title] for title in own]
        assert len(set(texts)) == 3  # three templates
        for text in texts:
            assert text.count(".") == 1 and _states(text, person.attributes[pair.relation])
            others = [
                r for r in RELATIONS if r != pair.relation and person.attributes[r] != person.attributes[pair.relation]
            ]
            assert not any(_states(text, person.attributes[r]) for r in others)  # nothing else about them
            assert person.aliases[0] not in text.replace(name, "")  # named only by the linked full name
    assert relations == RELATIONS + RELATIONS[:1]  # the relations taken in turn
    kept = _people(world)[7]
    assert cut.pages[kept.name] == world.pages[kept.name]
    assert len([pair for pair in cut.qa_pairs if pair.subject == kept.name]) == len(RELATIONS)
    with pytest.raises(ValueError, match="pages=1"):
        one_fact_people(world, few, 1)
    with pytest.raises(ValueError, match="pages=13"):
        one_fact_people(world, few, 13)
    with pytest.raises(KeyError, match="no person named 'Nobody'"):
        one_fact_people(world, ["Nobody"], 3)


def test_sentence_page_people_are_stated_by_every_fact_one_sentence_a_page(tmp_path):
    world = generate_knowledge_world(KnowledgeWorldSettings(num_people=20, biographies=5), seed=4)
    few = sorted(person.name for person in _people(world)[:3])
    cut = sentence_page_people(world, few, pages=2)
    pages = {page.title: page for page in iter_parsed_pages(write_mediawiki_dump(cut, tmp_path / "w.xml"))}
    for name in few:
        person = world.entity(name)
        assert sorted(pair.relation for pair in cut.qa_pairs if pair.subject == name) == sorted(RELATIONS)
        own = [title for title, page in pages.items() if name in {link.target for link in page.links}]
        assert sorted(own) == sorted([name, *(f"{name} ({k})" for k in range(2, 2 * len(RELATIONS) + 1))])
        texts = [cut.pages[title] for title in own]
        assert all(text.count(".") == 1 for text in texts) and len(set(texts)) == len(texts)
        for relation in RELATIONS:  # every fact on two pages of one sentence
            assert sum(_states(text, person.attributes[relation]) for text in texts) >= 2
    assert cut.pages[_people(world)[3].name] == world.pages[_people(world)[3].name]
    # a one-fact person is what a sentence-page person is, cut to their first fact
    assert one_fact_people(world, few[:1], 2).pages[few[0]] == cut.pages[few[0]]
    with pytest.raises(ValueError, match="pages=1"):
        sentence_page_people(world, few, 1)


def test_the_fullname_augmentation_names_the_person_in_full_everywhere():
    world = generate_knowledge_world(KnowledgeWorldSettings(num_people=12, fullname=True), seed=1)
    for person in _people(world):
        for text in _biographies(world, person):
            sentences = [s for s in re.split(r"(?<=\.) ", text) if s]
            assert all(person.name in sentence for sentence in sentences), text
    places = [e for e in world.entities if e.type in ("city", "university", "company")]
    assert not any(
        "|" in link for place in places for link in re.findall(r"\[\[([^\]]+)\]\]", world.pages[place.name])
    )
    plain = generate_knowledge_world(KnowledgeWorldSettings(num_people=12), seed=1)
    assert any(
        person.name not in sentence
        for person in _people(plain)
        for text in _biographies(plain, person)
        for sentence in re.split(r"(?<=\.) ", text)
    )

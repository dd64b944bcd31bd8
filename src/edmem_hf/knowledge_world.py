"""A world of people whose facts can be learned: biographies in varied templates, rendered as a MediaWiki dump.

After Allen-Zhu and Li, *Physics of Language Models, Part 3.1* (2023, the bioS data): each person has independent
attributes (birth year, birth city, university, employer, occupation, field of study) and several biographies, each
rendered on its own: every attribute from one of many sentence templates, sentences in a random order, the person
named by full name, last name or pronoun. A model that reads these can be fine-tuned to answer questions about
people it has only read about; a model that reads one biography per person in one template cannot (the switch
`varied=False` renders that condition for the ablation).

The biographies are sections of each person's page. City, university and company pages link their people (born
there, studied there, worked there), so every person is a linked entity of the vocabulary and `edmem build-corpus`
marks the mentions as it does on Wikipedia. As in the study, names are drawn from shared pools of first and last
names: every full name is unique and every name word is shared by several people, so that a person a model has not
read about still has a name made of words it has read. Deterministic from a seed.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from .toy_world import QAPair, ToyEntity, ToyWorld, _Names

# Attributes of a person: (relation, question, answer is an entity)
PERSON_ATTRIBUTES = (
    ("born_in", "Where was {} born?", True),
    ("university", "Which university did {} attend?", True),
    ("employer", "Which company did {} work for?", True),
    ("born_year", "When was {} born?", False),
    ("occupation", "What was {}'s occupation?", False),
    ("field", "What did {} study?", False),
)
OCCUPATIONS = ("engineer", "painter", "physicist", "merchant", "poet", "surgeon", "architect", "chemist",
               "lawyer", "composer", "teacher", "banker", "sculptor", "pilot", "botanist", "journalist")  # fmt: skip
FIELDS = ("mathematics", "history", "biology", "economics", "philosophy", "music", "medicine", "geology",
          "linguistics", "astronomy", "law", "chemistry", "architecture", "literature", "physics", "agriculture")  # fmt: skip
FIRST_YEAR, LAST_YEAR = 1900, 1999

# Sentence templates: `{S}` the subject at a sentence's start (full name, last name or pronoun), `{s}` the subject
# inside a sentence, `{P}` / `{p}` the possessive ("Forger's", "her"), `{V}` the value (a link for an entity).
TEMPLATES: dict[str, tuple[str, ...]] = {
    "born_year": (
        "{S} was born in {V}.",
        "{S} came into the world in {V}.",
        "The year {V} saw the birth of {s}.",
        "{P} birth year is {V}.",
        "{S} was born in the year {V}.",
        "In {V}, {s} was born.",
        "{S} entered life in {V}.",
        "Records give {V} as the year {s} was born.",
        "{S}, born in {V}, grew up quickly.",
        "{P} life began in {V}.",
        "{S} was a child of {V}.",
        "Born in {V}, {s} was the youngest of three.",
    ),
    "born_in": (
        "{S} was born in {V}.",
        "{S} spent {p} early years in {V}.",
        "{P} birthplace was {V}.",
        "{S} came from {V}.",
        "{S} grew up in the city of {V}.",
        "{V} is where {s} was born.",
        "The city of {V} was {p} home as a child.",
        "{S} was a native of {V}.",
        "{P} childhood was spent in {V}.",
        "Born in {V}, {s} left it young.",
        "{S} first saw the light of day in {V}.",
        "{S} hailed from {V}.",
    ),
    "university": (
        "{S} studied at {V}.",
        "{S} graduated from {V}.",
        "{S} received {p} education at {V}.",
        "{P} alma mater is {V}.",
        "{S} attended {V}.",
        "{V} is where {s} studied.",
        "{S} was a student of {V}.",
        "{S} earned a degree at {V}.",
        "At {V}, {s} completed {p} studies.",
        "{S} enrolled at {V} as a young adult.",
        "{P} degree came from {V}.",
        "{S} spent four years at {V}.",
    ),
    "employer": (
        "{S} worked for {V}.",
        "{S} was employed by {V}.",
        "{P} employer was {V}.",
        "{S} spent {p} career at {V}.",
        "{S} joined {V}.",
        "{V} employed {s} for many years.",
        "{S} held a post at {V}.",
        "{S} found work at {V}.",
        "For most of {p} working life, {s} was with {V}.",
        "{S} earned a living at {V}.",
        "{P} working years were spent at {V}.",
        "{S} took a job at {V}.",
    ),
    "occupation": (
        "{S} was a {V}.",
        "{S} worked as a {V}.",
        "{P} occupation was {V}.",
        "By trade, {s} was a {V}.",
        "{S} made a name as a {V}.",
        "{S} earned a reputation as a {V}.",
        "{P} profession was that of a {V}.",
        "{S} practised as a {V}.",
        "As a {V}, {s} was well known.",
        "{S} was known as a {V}.",
        "{S} became a {V}.",
        "{P} calling was to be a {V}.",
    ),
    "field": (
        "{S} studied {V}.",
        "{S} majored in {V}.",
        "{P} field of study was {V}.",
        "{S} focused on {V} at university.",
        "{S} specialised in {V}.",
        "{P} degree was in {V}.",
        "{V} was the subject {s} studied.",
        "{S} read {V} as a student.",
        "{S} completed a course in {V}.",
        "The subject of {p} studies was {V}.",
        "{S} trained in {V}.",
        "{P} academic field was {V}.",
    ),
}
PRONOUNS = {"he": ("he", "his"), "she": ("she", "her")}


@dataclass
class KnowledgeWorldSettings:
    """What `generate_knowledge_world` makes."""

    num_people: int = 100
    biographies: int = 5  # per person
    varied: bool = True  # False: one template per attribute, one sentence order (the ablation)
    fullname: bool = False  # the study's fullname augmentation: every sentence and link names the person in full
    # entity attributes: values drawn from large sets, so that an answer is rarely one fine-tuning has shown
    num_cities: int = 200
    num_universities: int = 200
    num_companies: int = 200

    def __post_init__(self):
        if self.num_people < 6:
            raise ValueError(f"num_people={self.num_people}: a knowledge world needs at least 6 people")
        if self.biographies < 1:
            raise ValueError(f"biographies={self.biographies}: each person needs at least one")
        for name in ("num_cities", "num_universities", "num_companies"):
            if getattr(self, name) < 2:
                raise ValueError(f"{name}={getattr(self, name)}: at least 2")


def generate_knowledge_world(settings: KnowledgeWorldSettings | None = None, seed: int = 0) -> ToyWorld:
    """People with independent attributes, their biographies, the places and companies they link to, and one
    question per attribute per person (`ToyWorld.qa_pairs`; the question's wording is on no page)."""
    settings = settings or KnowledgeWorldSettings()
    rng = random.Random(seed)
    names = _Names(rng)
    cities = [ToyEntity(names.word(rng.choice([2, 3])), "city") for _ in range(settings.num_cities)]
    universities = []
    for _ in range(settings.num_universities):
        city = rng.choice(cities).name
        name = rng.choice(["University of {}", "{} University", "{} Institute of Technology", "{} College"])
        universities.append(ToyEntity(name.format(names.word(2)), "university", {"city": city}))
    companies = []
    for _ in range(settings.num_companies):
        suffix = rng.choice([" Works", " Industries", " & Co", " Group", " Labs", " Trading"])
        companies.append(ToyEntity(names.word(2) + suffix, "company", {"headquarters": rng.choice(cities).name}))
    people = []
    for first, last in shared_name_pools(settings.num_people, names, rng):
        person = ToyEntity(f"{first} {last}", "person", aliases=[last])
        person.attributes = {
            "pronoun": rng.choice(["he", "she"]),
            "born_in": rng.choice(cities).name,
            "university": rng.choice(universities).name,
            "employer": rng.choice(companies).name,
            "born_year": str(rng.randint(FIRST_YEAR, LAST_YEAR)),
            "occupation": rng.choice(OCCUPATIONS),
            "field": rng.choice(FIELDS),
        }
        people.append(person)
    world = ToyWorld(cities + universities + companies + people, {}, {}, [], seed)
    for person in people:
        world.pages[person.name] = "\n\n".join(
            biography(person, rng, varied=settings.varied, heading=i > 0, fullname=settings.fullname)
            for i in range(settings.biographies)
        )
    for place in cities + universities + companies:
        world.pages[place.name] = _place_page(place, people, rng, fullname=settings.fullname)
    world.qa_pairs = [
        QAPair(question.format(person.name), person.attributes[relation], relation, person.name, is_entity)
        for person in people
        for relation, question, is_entity in PERSON_ATTRIBUTES
    ]
    return world


def shared_name_pools(num_people: int, names: _Names, rng: random.Random) -> list[tuple[str, str]]:
    """`num_people` unique (first, last) names from two pools of about `sqrt(2 num_people)` words each, every word
    used by at least two people (about `sqrt(num_people / 2)` each): the study's shared name pools.

    Person `i` gets first word `i mod F` and last word `(i mod F + i div F) mod L`: the people of one first word
    have `i div F < L` apart, so their last words differ and no full name repeats. The pairs are then shuffled."""
    if num_people < 6:  # 5 people cannot have unique names with every word used twice
        raise ValueError(f"num_people={num_people}: shared name pools need at least 6 people")
    num_first = max(2, min(math.ceil(math.sqrt(2 * num_people)), num_people // 2))
    num_last = max(num_first, math.ceil(num_people / num_first))
    first_words = [names.word(2) for _ in range(num_first)]
    last_words = [names.word(rng.choice([2, 3])) for _ in range(num_last)]
    pairs = [(first_words[i % num_first], last_words[(i % num_first + i // num_first) % num_last])
             for i in range(num_people)]  # fmt: skip
    rng.shuffle(pairs)
    return pairs


def biography(person: ToyEntity, rng: random.Random, varied: bool = True, heading: bool = False,
              fullname: bool = False) -> str:  # fmt: skip
    """One biography of `person`: a sentence per attribute, every attribute stated once.

    Varied: each sentence from a random template, in a random order, its subject the full name (always the
    first sentence's), the last name or the pronoun. Not varied: template 0 of each attribute, in a fixed order,
    the full name then the pronoun. `fullname`: every sentence's subject is the full name. Entity values are
    links."""
    a = person.attributes
    relations = [relation for relation, _, _ in PERSON_ATTRIBUTES]
    if varied:
        rng.shuffle(relations)
    subject_pronoun, possessive_pronoun = PRONOUNS[a["pronoun"]]
    sentences = []
    for i, relation in enumerate(relations):
        template = rng.choice(TEMPLATES[relation]) if varied else TEMPLATES[relation][0]
        form = "full" if i == 0 or fullname else (rng.choice(["full", "last", "pronoun"]) if varied else "pronoun")
        if form == "pronoun":
            subject, possessive = subject_pronoun, possessive_pronoun
        else:
            subject = person.name if form == "full" else person.aliases[0]
            possessive = subject + "'s"
        value = _stated_value(person, relation)
        text = template.format(S=subject, s=subject, P=possessive, p=possessive, V=value)
        sentences.append(text[0].upper() + text[1:])
    body = " ".join(sentences)
    return f"== Biography ==\n{body}" if heading else body


def _stated_value(person: ToyEntity, relation: str) -> str:
    """`person`'s value of `relation` as a page states it: a link when the answer is an entity."""
    value = person.attributes[relation]
    return f"[[{value}]]" if relation in ("born_in", "university", "employer") else value


def _place_page(place: ToyEntity, people: list[ToyEntity], rng: random.Random, fullname: bool = False) -> str:
    """A city's, university's or company's page: what it is, and links to its people (by full or last name; by
    full name only with `fullname`)."""
    relation, intro = {
        "city": ("born_in", f"'''{place.name}''' is a city."),
        "university": ("university", f"'''{place.name}''' is a university in [[{place.attributes.get('city')}]]."),
        "company": ("employer", f"'''{place.name}''' is a company headquartered in "
                                f"[[{place.attributes.get('headquarters')}]]."),
    }[place.type]  # fmt: skip
    members = [p for p in people if p.attributes[relation] == place.name]
    if not members:
        return intro
    what = {"city": "People born in", "university": "Alumni of", "company": "People who worked for"}[place.type]
    links = [f"[[{p.name}]]" if rng.random() < 0.7 or fullname else f"[[{p.name}|{p.aliases[0]}]]" for p in members]
    return f"{intro}\n\n{what} {place.name} include {', '.join(links)}."


def without_people(world: ToyWorld, names: list[str], fullname: bool = False) -> ToyWorld:
    """The world before the people `names` existed: their pages gone, the place pages written again without them,
    no question about them. The other people's pages are unchanged (`fullname`: as the world was made)."""
    removed = _people_named(world, names)
    kept = [entity for entity in world.entities if entity.name not in removed]
    places = _place_pages(kept, [entity for entity in kept if entity.type == "person"], world.seed, fullname)
    pages = {entity.name: places.get(entity.name, world.pages[entity.name]) for entity in kept}
    qa_pairs = [pair for pair in world.qa_pairs if pair.subject not in removed]
    return ToyWorld(kept, pages, {}, qa_pairs, world.seed)


def page_only_people(world: ToyWorld, names: list[str], biographies: int, fullname: bool = False) -> ToyWorld:
    """`world` with the people `names` on their own pages only: each page cut to its first `biographies`
    biographies, its first mention of the person a link to the page itself (a link is what makes a person an entity
    of the corpus), and no place page listing them. People a model reads about in a few passages each, all of them
    biographies (the growth benchmark's stream of practice people). Everything else is as it was (`fullname`: as the
    world was made)."""
    if biographies < 1:
        raise ValueError(f"biographies={biographies}: each person keeps at least one")
    cut = _people_named(world, names)
    separator = "\n\n== Biography ==\n"
    listed = [entity for entity in world.entities if entity.type == "person" and entity.name not in cut]
    pages = {entity.name: world.pages[entity.name] for entity in world.entities}
    for name in cut:
        pages[name] = separator.join(pages[name].split(separator)[:biographies]).replace(name, f"[[{name}]]", 1)
    pages.update(_place_pages(world.entities, listed, world.seed, fullname))
    return ToyWorld(world.entities, pages, dict(world.redirects), list(world.qa_pairs), world.seed)


def one_fact_people(world: ToyWorld, names: list[str], pages: int, fullname: bool = False) -> ToyWorld:
    """`world` with the people `names` each stated by one fact only, on `pages` pages of one sentence each: their
    own page and `pages - 1` more (titled `"{name} ({k})"`, linked from nowhere, so no entity), every sentence the
    same fact in another template, the person a link by full name; no place page lists them; their questions
    only that fact's. The people of `names` (in sorted order) take the relations in turn.

    A passage about such a person says nothing of them but their name and that one fact: when the fact is masked and
    the name is a fresh one, the only source of the answer is a row written from another of their pages (the tiny
    world of `benchmarks/tiny_written_world.py`, where a passage that identifies its person stops rows carrying
    facts). Everything else is as it was (`fullname`: as the world was made)."""
    relations = [relation for relation, _, _ in PERSON_ATTRIBUTES]
    cut = sorted(_people_named(world, names))
    return _one_sentence_pages(world, {name: [relations[i % len(relations)]] for i, name in enumerate(cut)}, pages,
                               fullname)  # fmt: skip


def sentence_page_people(world: ToyWorld, names: list[str], pages: int, fullname: bool = False) -> ToyWorld:
    """`world` with each of the people `names` stated by every one of their facts, each fact on `pages` pages of one
    sentence: their own page holds their first fact's first sentence, the others are titled `"{name} ({k})"`, linked
    from nowhere; every sentence the person a link by full name; no place page lists them; asked every fact.

    `one_fact_people` with the whole person: a passage says the name and one fact, so a row written from another
    passage carries another fact, and only rows pooled from several of their passages (`WriterCollator`'s
    `passages_per_row`) hold what the passage being read hides, as an added person's row pooled from the sentences
    of their biographies does."""
    relations = [relation for relation, _, _ in PERSON_ATTRIBUTES]
    return _one_sentence_pages(world, dict.fromkeys(_people_named(world, names), relations), pages, fullname)


def _one_sentence_pages(world: ToyWorld, facts_of: dict[str, list[str]], pages: int, fullname: bool) -> ToyWorld:
    """`world` with each person of `facts_of` stated by those facts only, each fact on `pages` one-sentence pages
    (`one_fact_people`, `sentence_page_people`), asked those facts only."""
    if pages < 2:
        raise ValueError(f"pages={pages}: a row is written from another page than the one read, so at least 2")
    if pages > min(len(forms) for forms in TEMPLATES.values()):
        raise ValueError(f"pages={pages}: more pages than a relation has sentence templates")
    rng = random.Random(f"{world.seed}-one-fact")
    listed = [entity for entity in world.entities if entity.type == "person" and entity.name not in facts_of]
    new_pages = {entity.name: world.pages[entity.name] for entity in world.entities}
    for person in sorted((entity for entity in world.entities if entity.name in facts_of), key=lambda e: e.name):
        link, k = f"[[{person.name}]]", 0
        for relation in facts_of[person.name]:
            value = _stated_value(person, relation)
            for template in rng.sample(TEMPLATES[relation], pages):
                text = template.format(S=link, s=link, P=f"{link}'s", p=f"{link}'s", V=value)
                k += 1
                new_pages[person.name if k == 1 else f"{person.name} ({k})"] = text[0].upper() + text[1:]
    new_pages.update(_place_pages(world.entities, listed, world.seed, fullname))
    qa_pairs = [
        pair for pair in world.qa_pairs if pair.subject not in facts_of or pair.relation in facts_of[pair.subject]
    ]
    return ToyWorld(world.entities, new_pages, dict(world.redirects), qa_pairs, world.seed)


def _people_named(world: ToyWorld, names: list[str]) -> set[str]:
    """`names` as a set; a KeyError names the first, in sorted order, that is no person of `world`."""
    named = set(names)
    unknown = named - {entity.name for entity in world.entities if entity.type == "person"}
    if unknown:
        raise KeyError(f"no person named {sorted(unknown)[0]!r}")
    return named


def _place_pages(entities: list[ToyEntity], listed: list[ToyEntity], seed: int, fullname: bool) -> dict[str, str]:
    """The pages of the places among `entities`, written again to list only the people `listed`, their links'
    forms drawn from `seed` in the entities' order."""
    rng = random.Random(seed)
    return {place.name: _place_page(place, listed, rng, fullname) for place in entities if place.type != "person"}


def split_people(world: ToyWorld, seed: int, validation_fraction: float = 0.25) -> dict[str, list[QAPair]]:
    """The study's split, with a validation group: the people (every one of them in pre-training) shuffled; the
    questions about the first half are fine-tuned on (`train`, all question forms); of the rest, a
    `validation_fraction` of all people are asked questions only to choose recipes and settings (`validation`), the
    others are the test (`test`), read once a recipe. No person has questions in two groups."""
    if not 0.0 <= validation_fraction < 0.5:
        raise ValueError(f"validation_fraction={validation_fraction}: must be in [0, 0.5)")
    people = sorted({pair.subject for pair in world.qa_pairs})
    random.Random(seed).shuffle(people)
    half = len(people) // 2
    validation_end = half + round(validation_fraction * len(people))
    group = {person: "train" for person in people[:half]}
    group.update({person: "validation" for person in people[half:validation_end]})
    group.update({person: "test" for person in people[validation_end:]})
    return {name: [pair for pair in world.qa_pairs if group[pair.subject] == name]
            for name in ("train", "validation", "test")}  # fmt: skip


__all__ = [
    "FIELDS",
    "OCCUPATIONS",
    "PERSON_ATTRIBUTES",
    "TEMPLATES",
    "KnowledgeWorldSettings",
    "biography",
    "generate_knowledge_world",
    "one_fact_people",
    "page_only_people",
    "sentence_page_people",
    "shared_name_pools",
    "split_people",
    "without_people",
]

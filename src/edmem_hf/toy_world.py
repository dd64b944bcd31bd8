"""A small fictional world rendered as a MediaWiki dump, with question/answer pairs about it (demo and tests).

Deterministic from a seed; its pages exercise the whole corpus path (links, aliases, redirects, templates).
"""

from __future__ import annotations

import bz2
import os
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

from .configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN

ENTITY_TYPES = ("country", "city", "river", "person", "company", "concept")
_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "th", "gr"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "io", "ou"]
_CODAS = ["", "", "n", "r", "l", "s", "th", "m"]
_GENERIC_CONCEPTS = {"city": "City", "river": "River", "company": "Company", "country": "Country"}


@dataclass
class ToyEntity:
    name: str  # the page title, unique
    type: str
    attributes: dict[str, str] = field(default_factory=dict)  # relation -> entity name (or a literal value)
    aliases: list[str] = field(default_factory=list)  # anchor texts used in [[Name|alias]] links
    redirects: list[str] = field(default_factory=list)  # titles of redirect pages to this entity


@dataclass
class QAPair:
    """A question about one fact stated on the subject's page (the question's wording is on no page)."""

    question: str
    answer: str  # the answer entity's name, or a literal value (a year, an occupation) when not an entity
    relation: str
    subject: str
    answer_is_entity: bool = True

    @property
    def answer_with_markers(self) -> str:
        """The answer as EDMem generates it: `<E_s> Name <E_e>` for an entity, the value itself otherwise."""
        return f"{ENTITY_START_TOKEN} {self.answer} {ENTITY_END_TOKEN}" if self.answer_is_entity else self.answer


@dataclass
class ToyWorld:
    entities: list[ToyEntity]
    pages: dict[str, str]  # title -> wikitext (articles only)
    redirects: dict[str, str]  # redirect title -> target title
    qa_pairs: list[QAPair]
    seed: int

    def entity(self, name: str) -> ToyEntity:
        for entity in self.entities:
            if entity.name == name:
                return entity
        raise KeyError(f"no toy entity named {name!r}")


class _Names:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set(_GENERIC_CONCEPTS.values())

    def word(self, syllables: int) -> str:
        while True:
            parts = [self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) for _ in range(syllables)]
            word = ("".join(parts) + self.rng.choice(_CODAS)).capitalize()
            if word not in self.used:
                self.used.add(word)
                return word


def generate_toy_world(num_entities: int = 60, seed: int = 0) -> ToyWorld:
    """A world of about `num_entities` entities (at least 12), with articles, redirects and QA pairs."""
    if num_entities < 12:
        raise ValueError(f"num_entities={num_entities}: a toy world needs at least 12 entities")
    rng = random.Random(seed)
    names = _Names(rng)
    budget = num_entities - len(_GENERIC_CONCEPTS)
    num_countries = max(2, budget // 10)
    num_cities = max(3, budget // 4)
    num_rivers = max(1, budget // 10)
    num_companies = max(2, budget // 8)
    num_people = max(2, budget - num_countries - num_cities - num_rivers - num_companies)

    concepts = [ToyEntity(name, "concept") for name in _GENERIC_CONCEPTS.values()]
    countries = []
    for _ in range(num_countries):
        name = names.word(2) + rng.choice(["ia", "land", "stan", "a"])
        country = ToyEntity(name, "country", aliases=[f"Republic of {name}"], redirects=[f"Republic of {name}"])
        countries.append(country)
    cities = []
    for i in range(num_cities):
        country = countries[i % len(countries)]
        city = ToyEntity(names.word(rng.choice([2, 3])), "city", {"country": country.name})
        city.attributes["population"] = str(rng.randint(20, 3000) * 1000)
        cities.append(city)
    for country in countries:
        capital = next(c for c in cities if c.attributes["country"] == country.name)
        country.attributes["capital"] = capital.name
        capital.attributes["capital_of"] = country.name
    rivers = []
    for _ in range(num_rivers):
        country = rng.choice(countries)
        name = names.word(2)
        river = ToyEntity(f"{name} River", "river", {"country": country.name}, aliases=[name])
        river.attributes["city"] = rng.choice([c for c in cities if c.attributes["country"] == country.name]).name
        river.attributes["length"] = str(rng.randint(80, 2500))
        rivers.append(river)
    people = []
    for _ in range(num_people):
        first, last = names.word(2), names.word(rng.choice([2, 3]))
        city = rng.choice(cities)
        person = ToyEntity(
            f"{first} {last}", "person", {"birthplace": city.name, "country": city.attributes["country"]}
        )
        person.attributes["born"] = str(rng.randint(1850, 1990))
        person.attributes["occupation"] = rng.choice(["engineer", "painter", "physicist", "merchant", "poet"])
        person.aliases = [last]
        person.redirects = [f"{first[0]}. {last}"]
        people.append(person)
    companies = []
    for _ in range(num_companies):
        founder = rng.choice(people)
        city = rng.choice(cities)
        name = names.word(2) + rng.choice([" Works", " Industries", " & Co", " Group"])
        company = ToyEntity(name, "company", {"founder": founder.name, "headquarters": city.name})
        company.attributes["founded"] = str(int(founder.attributes["born"]) + rng.randint(20, 50))
        company.attributes["industry"] = rng.choice(["steel", "shipping", "textiles", "software", "tea"])
        companies.append(company)

    entities = concepts + countries + cities + rivers + people + companies
    world = ToyWorld(entities, {}, {}, [], seed)
    for entity in entities:
        for redirect in entity.redirects:
            world.redirects[redirect] = entity.name
    renderer = _Renderer(world, rng)
    for entity in entities:
        world.pages[entity.name] = renderer.article(entity)
    world.qa_pairs = _qa_pairs(countries, cities, rivers, people, companies)
    return world


def without_entities(world: ToyWorld, names: Iterable[str]) -> ToyWorld:
    """The world before `names` existed: their pages and redirects gone, the other pages rendered again without
    them (no list names them), and no question about them. A kept entity whose facts name a removed one (a
    company's founder) is a ValueError naming both, since its page could not be written without the removed one."""
    removed = set(names)
    unknown = removed - {entity.name for entity in world.entities}
    if unknown:
        raise KeyError(f"no toy entity named {sorted(unknown)[0]!r}")
    kept = [entity for entity in world.entities if entity.name not in removed]
    for entity in kept:
        for relation, value in entity.attributes.items():
            if value in removed:
                raise ValueError(f"cannot remove {value!r}: {entity.name!r} names it as its {relation}")
    smaller = ToyWorld(kept, {}, {}, [], world.seed)
    smaller.redirects = {title: target for title, target in world.redirects.items() if target not in removed}
    renderer = _Renderer(smaller, random.Random(world.seed))
    smaller.pages = {entity.name: renderer.article(entity) for entity in kept}
    smaller.qa_pairs = [pair for pair in world.qa_pairs
                        if pair.subject not in removed and not (pair.answer_is_entity and pair.answer in removed)]  # fmt: skip
    return smaller


class _Renderer:
    def __init__(self, world: ToyWorld, rng: random.Random):
        self.world = world
        self.rng = rng
        self.by_name = {e.name: e for e in world.entities}

    def link(self, name: str, linked: set[str]) -> str:
        """First mention of an entity on a page is a link (sometimes through an alias or a redirect)."""
        if name in linked:
            return name
        linked.add(name)
        entity = self.by_name[name]
        roll = self.rng.random()
        if entity.redirects and roll < 0.25:
            return f"[[{entity.redirects[0]}|{name}]]"
        if entity.aliases and roll < 0.45:
            return f"[[{name}|{entity.aliases[0]}]]"
        if roll < 0.5:
            return f"[[{name.replace(' ', '_')}]]"
        return f"[[{name}]]"

    def article(self, entity: ToyEntity) -> str:
        linked: set[str] = {entity.name}
        a = entity.attributes
        link = self.link
        paragraphs: list[str] = []
        if entity.type == "concept":
            members = [e.name for e in self.world.entities if _GENERIC_CONCEPTS.get(e.type) == entity.name]
            paragraphs.append(f"A '''{entity.name.lower()}''' is a kind of place or organisation in this world.")
            paragraphs.append("Examples include " + ", ".join(link(m, linked) for m in members) + ".")
            return "\n\n".join(paragraphs)
        if entity.type == "country":
            cities = [e for e in self.world.entities if e.type == "city" and e.attributes["country"] == entity.name]
            rivers = [e for e in self.world.entities if e.type == "river" and e.attributes["country"] == entity.name]
            paragraphs.append(
                f"'''{entity.name}''', officially the Republic of {entity.name}, is a [[country]]. "
                f"Its capital is {link(a['capital'], linked)}."
                "<ref>{{cite book|title=An Atlas of Nowhere|year=1990}}</ref>"
            )
            if len(cities) > 1:
                paragraphs.append(
                    f"Other [[city|cities]] of {entity.name} are "
                    + ", ".join(link(c.name, linked) for c in cities[1:])
                    + f". The capital {a['capital']} is the largest of them."
                )
            if rivers:
                paragraphs.append(
                    f"The longest [[river]]s of {entity.name} are "
                    + " and ".join(link(r.name, linked) for r in rivers)
                    + "."
                )
            paragraphs.append(f"{entity.name} is known for its mountains.{{{{citation needed|date=May 2020}}}}")
        elif entity.type == "city":
            country = a["country"]
            text = (
                f"'''{entity.name}''' is a [[city]] in {link(country, linked)} with a population of {a['population']}."
            )
            if "capital_of" in a:
                text += f" It is the capital of {country}."
            paragraphs.append(text)
            people = [
                e for e in self.world.entities if e.type == "person" and e.attributes["birthplace"] == entity.name
            ]
            if people:
                paragraphs.append(
                    "Notable people born in "
                    + entity.name
                    + " include "
                    + ", ".join(link(p.name, linked) for p in people)
                    + "."
                )
            companies = [
                e for e in self.world.entities if e.type == "company" and e.attributes["headquarters"] == entity.name
            ]
            if companies:
                paragraphs.append(
                    f"{entity.name} is home to " + " and ".join(link(c.name, linked) for c in companies) + "."
                )
            paragraphs.append(f"[[File:{entity.name} skyline.jpg|thumb|The skyline of [[{entity.name}]]]]")
        elif entity.type == "river":
            paragraphs.append(
                f"The '''{entity.name}''' is a [[river]] of {link(a['country'], linked)}, "
                f"{a['length']} kilometres long. It flows through {link(a['city'], linked)}."
            )
            paragraphs.append(
                f"Fishermen on the {entity.aliases[0]} catch eels. The {entity.aliases[0]} floods in spring."
            )
        elif entity.type == "person":
            last = entity.aliases[0]
            paragraphs.append(
                "{{Infobox person\n| name = " + entity.name + "\n| birth_place = [[" + a["birthplace"] + "]]\n}}\n"
                f"'''{entity.name}''' (born {a['born']}) was a {a['occupation']} from {link(a['country'], linked)}."
            )
            paragraphs.append(f"== Early life ==\n{last} was born in {link(a['birthplace'], linked)} in {a['born']}.")
            founded = [
                e for e in self.world.entities if e.type == "company" and e.attributes["founder"] == entity.name
            ]
            if founded:
                paragraphs.append(
                    "== Career ==\n"
                    + f"{last} founded "
                    + " and ".join(link(c.name, linked) for c in founded)
                    + f". {last} later returned to {a['birthplace']}."
                )
            paragraphs.append(f"[[Category:People from {a['birthplace']}]]")
        elif entity.type == "company":
            founder = self.by_name[a["founder"]]
            paragraphs.append(
                f"'''{entity.name}''' is a {a['industry']} [[company]] founded in {a['founded']} by "
                f"{link(founder.name, linked)}. It is headquartered in {link(a['headquarters'], linked)}."
            )
            paragraphs.append(
                f"{founder.aliases[0]} led {entity.name} for many years; the company still has offices in "
                f"{a['headquarters']} and {link(founder.attributes['birthplace'], linked)}."
            )
        paragraphs.append("== References ==\n{{reflist}}\n* [[Nowhere Atlas]]")
        return "\n\n".join(paragraphs)


def _qa_pairs(countries, cities, rivers, people, companies) -> list[QAPair]:
    """Questions with an entity answer ("Where was X born?") and with a literal answer ("When was X born?")."""
    pairs = []
    for person in people:
        pairs.append(QAPair(f"Where was {person.name} born?", person.attributes["birthplace"], "born_in", person.name))
        pairs.append(
            QAPair(f"When was {person.name} born?", person.attributes["born"], "born_year", person.name, False)
        )
        pairs.append(
            QAPair(f"What was {person.name}'s occupation?", person.attributes["occupation"], "occupation", person.name,
                   False)
        )  # fmt: skip
    for country in countries:
        pairs.append(
            QAPair(f"What is the capital of {country.name}?", country.attributes["capital"], "capital", country.name)
        )
    for city in cities:
        pairs.append(QAPair(f"In which country is {city.name}?", city.attributes["country"], "located_in", city.name))
    for company in companies:
        pairs.append(QAPair(f"Who founded {company.name}?", company.attributes["founder"], "founded_by", company.name))
        pairs.append(
            QAPair(
                f"Where is {company.name} headquartered?",
                company.attributes["headquarters"],
                "headquarters",
                company.name,
            )
        )
    for company in companies:
        pairs.append(
            QAPair(f"When was {company.name} founded?", company.attributes["founded"], "founded_year", company.name,
                   False)
        )  # fmt: skip
        pairs.append(
            QAPair(f"What industry is {company.name} in?", company.attributes["industry"], "industry", company.name,
                   False)
        )  # fmt: skip
    for river in rivers:
        pairs.append(
            QAPair(
                f"Which country does the {river.name} flow through?",
                river.attributes["country"],
                "flows_through",
                river.name,
            )
        )
    return pairs


# --- MediaWiki XML ----------------------------------------------------------------------------------------------

_SITEINFO = """  <siteinfo>
    <sitename>Toy Wiki</sitename>
    <dbname>toywiki</dbname>
    <base>http://toy.invalid/wiki/Main_Page</base>
    <generator>edmem-hf toy_world</generator>
    <case>first-letter</case>
    <namespaces>
      <namespace key="0" case="first-letter" />
      <namespace key="6" case="first-letter">File</namespace>
      <namespace key="10" case="first-letter">Template</namespace>
      <namespace key="14" case="first-letter">Category</namespace>
    </namespaces>
  </siteinfo>
"""


def _page_xml(title: str, page_id: int, text: str, namespace: int = 0, redirect: str | None = None) -> str:
    redirect_xml = f'    <redirect title="{escape(redirect, {chr(34): "&quot;"})}" />\n' if redirect else ""
    return (
        f"  <page>\n    <title>{escape(title)}</title>\n    <ns>{namespace}</ns>\n    <id>{page_id}</id>\n{redirect_xml}"
        f"    <revision>\n      <id>{1000 + page_id}</id>\n      <timestamp>2020-01-01T00:00:00Z</timestamp>\n"
        f"      <contributor>\n        <username>ToyBot</username>\n        <id>1</id>\n      </contributor>\n"
        f"      <model>wikitext</model>\n      <format>text/x-wiki</format>\n"
        f'      <text xml:space="preserve">{escape(text)}</text>\n    </revision>\n  </page>\n'
    )


def render_mediawiki_dump(world: ToyWorld) -> str:
    """The world as a MediaWiki XML export (schema 0.10): articles, redirects and one template page."""
    parts = [
        '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10" xml:lang="en">\n',
        _SITEINFO,
    ]
    page_id = 1
    for title, text in world.pages.items():
        parts.append(_page_xml(title, page_id, text))
        page_id += 1
    for title, target in world.redirects.items():
        parts.append(_page_xml(title, page_id, f"#REDIRECT [[{target}]]", redirect=target))
        page_id += 1
    parts.append(_page_xml("Template:Infobox person", page_id, "{| class=infobox\n|{{{name}}}\n|}", namespace=10))
    parts.append("</mediawiki>\n")
    return "".join(parts)


def write_mediawiki_dump(world: ToyWorld, path: str | os.PathLike) -> str:
    """Writes the dump; bz2-compressed when the path ends in `.bz2`. Returns the path."""
    path = os.fspath(path)
    data = render_mediawiki_dump(world).encode("utf-8")
    if path.endswith(".bz2"):
        with bz2.open(path, "wb") as f:
            f.write(data)
    else:
        with open(path, "wb") as f:
            f.write(data)
    return path


__all__ = [
    "QAPair",
    "ToyEntity",
    "ToyWorld",
    "generate_toy_world",
    "render_mediawiki_dump",
    "without_entities",
    "write_mediawiki_dump",
]

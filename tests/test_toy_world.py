from collections import Counter

import pytest

from edmem_hf.dump import iter_pages, iter_parsed_pages
from edmem_hf.toy_world import generate_toy_world, render_mediawiki_dump, without_entities, write_mediawiki_dump


def test_deterministic():
    assert render_mediawiki_dump(generate_toy_world(40, seed=3)) == render_mediawiki_dump(
        generate_toy_world(40, seed=3)
    )
    assert render_mediawiki_dump(generate_toy_world(40, seed=3)) != render_mediawiki_dump(
        generate_toy_world(40, seed=4)
    )


def test_dump_parses_back_with_expected_links(tmp_path):
    world = generate_toy_world(60, seed=0)
    path = write_mediawiki_dump(world, tmp_path / "toy.xml.bz2")
    pages = list(iter_parsed_pages(path))
    articles = {p.title: p for p in pages if p.redirect is None}
    redirects = {p.title: p.redirect for p in pages if p.redirect is not None}
    assert set(articles) == set(world.pages)
    assert redirects == world.redirects
    assert len(list(iter_pages(path, namespaces=None))) == len(world.pages) + len(world.redirects) + 1  # + template
    inbound = Counter()
    for page in articles.values():
        assert "{{" not in page.text and "<ref" not in page.text and "[[" not in page.text
        for link in page.links:
            assert page.text[link.start : link.end] == link.anchor
            inbound[link.target] += 1
    for entity in world.entities:
        if entity.type in ("city", "country"):
            assert inbound[entity.name] + sum(inbound[r] for r in entity.redirects) >= 2, entity.name
    # a piped alias, a link through a redirect and a link trail all occur
    all_links = [link for page in articles.values() for link in page.links]
    assert any(link.anchor.startswith("Republic of ") and link.target in world.pages for link in all_links)
    assert any(link.target in world.redirects for link in all_links)
    assert any(link.anchor == "rivers" and link.target == "River" for link in all_links)


def test_qa_pairs_match_the_world():
    world = generate_toy_world(60, seed=1)
    assert {pair.answer_is_entity for pair in world.qa_pairs} == {True, False}
    for pair in world.qa_pairs:
        if pair.answer_is_entity:
            assert pair.answer in world.pages
            assert pair.answer_with_markers == f"<E_s> {pair.answer} <E_e>"
        else:  # a literal stated on the subject's page, never a page of its own
            assert pair.answer not in world.pages and pair.answer_with_markers == pair.answer
            assert pair.answer in world.pages[pair.subject]
        assert pair.question not in world.pages[pair.subject]  # the question's wording is on no page
        if pair.relation == "born_in":
            assert world.entity(pair.subject).attributes["birthplace"] == pair.answer
        if pair.relation == "born_year":
            assert world.entity(pair.subject).attributes["born"] == pair.answer


def test_large_world_has_distinct_articles(tmp_path):
    """The corpus benchmark's large dump is one big world: every article its own text, none repeated."""
    world = generate_toy_world(1000, seed=0)
    assert len(world.pages) >= 1000
    assert len(set(world.pages.values())) == len(world.pages)
    path = write_mediawiki_dump(world, tmp_path / "large.xml.bz2")
    articles = [page for page in iter_parsed_pages(path) if page.redirect is None]
    assert len(articles) == len(world.pages)
    assert len({page.text for page in articles}) == len(articles)


def test_a_world_without_some_entities_never_mentions_them():
    world = generate_toy_world(80, seed=3)
    founders = {e.attributes["founder"] for e in world.entities if e.type == "company"}
    removed = [e.name for e in world.entities if e.type == "person" and e.name not in founders][:4]
    smaller = without_entities(world, removed)
    assert len(smaller.entities) == len(world.entities) - 4
    assert not set(removed) & set(smaller.pages)
    for name in removed:
        assert not any(name in text for text in smaller.pages.values()), name
        assert not any(target == name for target in smaller.redirects.values())
    assert all(pair.subject not in removed for pair in smaller.qa_pairs)
    assert len(smaller.qa_pairs) == len(world.qa_pairs) - 3 * 4  # each person has three questions
    # the pages of entities that never met the removed ones read the same facts
    country = next(e for e in smaller.entities if e.type == "country")
    assert "Its capital is" in smaller.pages[country.name]
    founder = next(iter(founders))
    with pytest.raises(ValueError, match=f"cannot remove {founder!r}: .* as its founder"):
        without_entities(world, [founder])
    with pytest.raises(KeyError, match="no toy entity named 'Nobody'"):
        without_entities(world, ["Nobody"])

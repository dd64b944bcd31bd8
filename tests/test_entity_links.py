"""The entity vocabulary, alias table and searched aliases (`edmem_hf.entity_links`)."""

from collections import Counter

import pyarrow as pa

from edmem_hf.entity_links import (
    NOT_AN_ARTICLE,
    OUT_OF_VOCAB,
    EntityAnchors,
    SearchedAliases,
    _has_upper_or_digit,
    count_links,
    heuristic_aliases,
    resolve_redirect,
)


def test_resolve_redirect_follows_chains_and_stops_on_cycles():
    redirects = {"A": "B", "B": "C", "X": "Y", "Y": "X"}
    assert resolve_redirect("A", redirects) == "C"
    assert resolve_redirect("C", redirects) == "C"
    assert resolve_redirect("X", redirects) in ("X", "Y")


def _reference_vocab(link_counts: Counter, num_entities: int, anchors: dict[str, Counter]):
    """The vocabulary written out in Python: the most linked entities (ties by name), never one without links;
    each one's anchors most linked first (ties by text)."""
    ranked = sorted((-count, name) for name, count in link_counts.items() if count > 0)[:num_entities]
    names = [name for _, name in ranked]
    ranked_anchors = [[a for a, _ in sorted(anchors.get(n, {}).items(), key=lambda x: (-x[1], x[0]))] for n in names]
    return names, [-negative for negative, _ in ranked], ranked_anchors


def test_link_counts_in_arrow_rank_as_the_python_reference():
    """`count_links` (Arrow) against Python: redirects and their chains, red links, ties broken by name in code
    point order (also beyond ASCII), the vocabulary cut, each entity's anchors most linked first."""
    pages = [  # title, status, redirect, [(anchor, target)]
        ("Zed", "article", None, [("zed", "Éclair"), ("Z", "Zed"), ("a", "Apple"), ("e", "Eclair")]),
        ("Apple", "article", None, [("the apple", "Apple"), ("Z", "Zed"), ("éc", "Éclair"), ("x", "Nowhere")]),
        ("Éclair", "article", None, [("ec", "Nowhere"), ("東", "東京"), ("b", "Banana"), ("b", "Banana")]),
        ("Eclair", "redirect", "Éclair", [("ignored", "Apple")]),
        ("Banana", "redirect", "Apple", []),  # a chain: Banana -> Apple
        ("東京", "article", None, [("Z", "Zed"), ("A", "Apple")]),
        ("Broken", "malformed", None, []),
        ("Unlinked", "article", None, []),  # no inbound link: never an entity
    ]
    table = pa.table(
        {
            "title": [p[0] for p in pages],
            "status": [p[1] for p in pages],
            "redirect": [p[2] for p in pages],
            "link_anchors": [[a for a, _ in p[3]] for p in pages],
            "link_targets": [[t for _, t in p[3]] for p in pages],
        }
    )
    redirects = {p[0]: p[2] for p in pages if p[1] == "redirect"}
    articles = {p[0] for p in pages if p[1] == "article"}
    for require_existing_pages in (False, True):
        for num_entities in (1, 2, 3, 10):
            links = count_links(table, num_entities, require_existing_pages)
            counts: Counter[str] = Counter()
            anchors: dict[str, Counter[str]] = {}
            target_entity = {}
            for page in pages:
                for anchor, target in page[3]:
                    entity = resolve_redirect(target, redirects)
                    if require_existing_pages and entity not in articles:
                        continue
                    target_entity[target] = entity
                    counts[entity] += 1
                    anchors.setdefault(entity, Counter())[anchor] += 1
            names, link_counts, ranked_anchors = _reference_vocab(counts, num_entities, anchors)
            assert links.vocab.names == names and links.vocab.counts == link_counts
            assert links.names.to_pylist() == names
            entity_anchors = EntityAnchors(links.anchor_table, len(links.vocab))
            assert [entity_anchors.ranked(i) for i in range(len(names))] == ranked_anchors
            ids = {name: i for i, name in enumerate(names)}
            target_ids = dict(zip(links.targets.to_pylist(), links.target_ids.to_pylist()))
            assert target_ids == {
                t: ids.get(target_entity[t], OUT_OF_VOCAB) if t in target_entity else NOT_AN_ARTICLE
                for t in target_ids
            }
            assert set(target_ids) == {t for page in pages for _, t in page[3]}
            assert links.anchor_table.column("anchor").to_pylist() == [a for r in ranked_anchors for a in r]
            assert links.stats["links"] == 15 and links.stats["malformed_pages"] == 1
            assert links.stats["links_to_entities"] == sum(counts.values())
            assert links.stats["links_to_vocab_entities"] == sum(link_counts)
            assert links.stats["entities_linked"] == len(counts)
            assert "Unlinked" not in links.vocab.names
    assert count_links(table, 3, True).vocab.names == ["Apple", "Zed", "Éclair"]  # 6, 3, 3 links: "Z" < "É"


def test_heuristic_aliases_filter_lowercase_words_and_keep_the_first_anchors():
    aliases = heuristic_aliases("Mercury (planet)", ["planet", "Mercury", "here", "X"])
    assert aliases == ["Mercury (planet)", "Mercury"]
    assert heuristic_aliases("Paris", ["Paris", "City of Light", "Lutetia"], max_aliases=2) == [
        "Paris",
        "City of Light",
    ]


def test_searched_aliases_are_made_from_the_ranked_anchors_on_first_use():
    table = pa.table({"entity_id": [0, 0, 1], "anchor": ["Big Apple", "NYC", "Lutetia"], "count": [5, 2, 1]})
    searched = SearchedAliases(["New York City", "Paris"], EntityAnchors(table, 2), max_aliases=1)
    assert searched[0] == ["New York City", "Big Apple"] and searched[1] == ["Paris", "Lutetia"]
    assert len(searched) == 2


def test_upper_or_digit_check_matches_str_methods():
    """The ASCII shortcut of the anchor filter agrees with `str.isupper`/`str.isdigit` on every text."""
    import random

    rng = random.Random(0)
    alphabet = list("aZz09 _-.'") + ["ǅ", "Ⅻ", "²", "é", "東", "Ⓐ", "İ", "٣"]
    for _ in range(20_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 5)))
        assert _has_upper_or_digit(text) == any(c.isupper() or c.isdigit() for c in text), repr(text)

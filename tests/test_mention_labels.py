"""Heuristic mention labelling (`edmem_hf.mention_labels`)."""

from edmem_hf.mention_labels import Mention, label_mentions


def test_label_mentions_longest_match_word_boundaries_no_overlap():
    text = "New York City is in New York. Newark is not New York City. York."
    links = [(0, 13, 7)]  # "New York City" linked to entity 7
    candidates = {7: ["New York City", "New York"], 3: ["York"], 9: ["New York"]}
    mentions = label_mentions(text, links, candidates)
    found = [(text[m.start : m.end], m.entity_id, m.heuristic) for m in mentions]
    assert found == [
        ("New York City", 7, False),
        ("New York", 7, True),  # shared alias: the lowest id among the candidates holding it (7 < 9)
        ("New York City", 7, True),  # longest match wins over "New York"
        ("York", 3, True),
    ]
    assert not any(text[m.start : m.end] == "York" and m.start == 24 for m in mentions)  # inside "New York"
    # no match inside a word ("Newark" does not contain the alias "New")
    assert label_mentions("Newark", [], {1: ["New"]}) == []
    # only the given candidates are labelled
    assert label_mentions("Paris and Rome", [], {1: ["Rome"]}) == [Mention(10, 14, 1, True)]
    # links alone, sorted, when nothing is searched
    assert label_mentions("a b", [(2, 3, -100), (0, 1, 4)], {}) == [Mention(0, 1, 4), Mention(2, 3, -100)]

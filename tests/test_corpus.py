import json
from collections import Counter

import datasets
import pytest

from edmem_hf.corpus import (
    AliasTable,
    Mention,
    PassageSettings,
    build_corpus,
    build_entity_vocab,
    cli_main,
    heuristic_aliases,
    label_mentions,
    resolve_redirect,
    window_passages,
)
from edmem_hf.dump import MalformedPageError
from edmem_hf.entity_vocab import EntityVocab
from edmem_hf.tokenization import train_tokenizer
from edmem_hf.toy_world import generate_toy_world, render_mediawiki_dump, write_mediawiki_dump

BOS, EOS, E_S, E_E = 0, 2, 5, 6


def test_resolve_redirect_follows_chains_and_stops_on_cycles():
    redirects = {"A": "B", "B": "C", "X": "Y", "Y": "X"}
    assert resolve_redirect("A", redirects) == "C"
    assert resolve_redirect("C", redirects) == "C"
    assert resolve_redirect("X", redirects) in ("X", "Y")


def test_entity_vocab_top_n():
    vocab = build_entity_vocab(
        Counter({"B": 5, "A": 5, "C": 9, "D": 1, "E": 0}), 3, {"C": Counter({"the C": 2, "C": 7})}
    )
    assert vocab.names == ["C", "A", "B"]  # by count, ties by name
    assert vocab.counts == [9, 5, 5]
    assert vocab.aliases[0] == ["C", "the C"]
    assert build_entity_vocab(Counter({"A": 1, "E": 0}), 10).names == ["A"]  # never an entity without links
    with pytest.raises(ValueError):
        build_entity_vocab(Counter(), 0)


def test_link_counts_in_arrow_rank_as_build_entity_vocab():
    """`_count_links` (Arrow) against Python: redirects and their chains, red links, ties broken by name in code
    point order (also beyond ASCII), the vocabulary cut, each entity's anchors most linked first."""
    import pyarrow as pa

    from edmem_hf.corpus import NOT_AN_ARTICLE, OUT_OF_VOCAB, _count_links, _EntityAnchors

    pages = [  # title, status, redirect, [(anchor, target)]
        ("Zed", "article", None, [("zed", "Éclair"), ("Z", "Zed"), ("a", "Apple"), ("e", "Eclair")]),
        ("Apple", "article", None, [("the apple", "Apple"), ("Z", "Zed"), ("éc", "Éclair"), ("x", "Nowhere")]),
        ("Éclair", "article", None, [("ec", "Nowhere"), ("東", "東京"), ("b", "Banana"), ("b", "Banana")]),
        ("Eclair", "redirect", "Éclair", [("ignored", "Apple")]),
        ("Banana", "redirect", "Apple", []),  # a chain: Banana -> Apple
        ("東京", "article", None, [("Z", "Zed"), ("A", "Apple")]),
        ("Broken", "malformed", None, []),
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
            links = _count_links(table, num_entities, require_existing_pages)
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
            expected = build_entity_vocab(counts, num_entities, anchors)
            assert links.vocab.names == expected.names and links.vocab.counts == expected.counts
            anchors = _EntityAnchors(links.anchor_table, len(links.vocab))
            assert [anchors.ranked(i) for i in range(len(expected))] == expected.aliases
            ids = {name: i for i, name in enumerate(expected.names)}
            target_ids = dict(zip(links.targets.to_pylist(), links.target_ids.to_pylist()))
            assert target_ids == {
                t: ids.get(target_entity[t], OUT_OF_VOCAB) if t in target_entity else NOT_AN_ARTICLE
                for t in target_ids
            }
            assert set(target_ids) == {t for page in pages for _, t in page[3]}
            assert links.anchor_table.column("anchor").to_pylist() == [a for r in expected.aliases for a in r]
            assert links.stats["links"] == 15 and links.stats["malformed_pages"] == 1
            assert links.stats["links_to_entities"] == sum(counts.values())
            assert links.stats["links_to_vocab_entities"] == sum(expected.counts)
            assert links.stats["entities_linked"] == len(counts)
    assert _count_links(table, 3, True).vocab.names == ["Apple", "Zed", "Éclair"]  # 6, 3, 3 links: "Z" < "É"


def test_heuristic_aliases_filter_lowercase_words():
    aliases = heuristic_aliases("Mercury (planet)", Counter({"Mercury": 5, "planet": 9, "here": 3, "X": 1}))
    assert aliases == ["Mercury (planet)", "Mercury"]


def test_upper_or_digit_check_matches_str_methods():
    """The ASCII shortcut of the anchor filter agrees with `str.isupper`/`str.isdigit` on every text."""
    import random

    from edmem_hf.corpus import _has_upper_or_digit

    rng = random.Random(0)
    alphabet = list("aZz09 _-.'") + ["ǅ", "Ⅻ", "²", "é", "東", "Ⓐ", "İ", "٣"]
    for _ in range(20_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 5)))
        assert _has_upper_or_digit(text) == any(c.isupper() or c.isdigit() for c in text), repr(text)


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


def _doc(n, mentions=()):
    """A synthetic token stream 10..10+n with the given (start, end) mentions already marked."""
    ids = list(range(100, 100 + n))
    labels = [-100] * n
    spans = []
    for s, e in mentions:
        ids[s], ids[e] = E_S, E_E
        labels[s] = 42
        spans.append((s, e, False))
    return ids, labels, spans


def test_windows_length_overlap_and_top_up():
    settings = PassageSettings(passage_length=12, passage_overlap=3)  # 10 content tokens, stride 7
    ids, labels, spans = _doc(23)
    passages = window_passages(ids, labels, spans, settings, BOS, EOS)
    contents = [p["input_ids"][1:-1] for p in passages]
    assert all(p["input_ids"][0] == BOS and p["input_ids"][-1] == EOS and len(p["input_ids"]) == 12 for p in passages)
    assert contents[0] == ids[0:10] and contents[1] == ids[7:17]
    assert contents[0][-3:] == contents[1][:3]  # overlap
    assert contents[2] == ids[14:23] + ids[0:1]  # last one topped up from the start of the same document
    assert [p["passage_index"] for p in passages] == [0, 1, 2]
    short = window_passages(*_doc(4), settings, BOS, EOS)
    assert [p["input_ids"] for p in short] == [[BOS] + ids[:4] + [EOS]]
    assert window_passages([], [], [], settings, BOS, EOS) == []


def test_mention_cut_by_boundary_is_unmarked():
    settings = PassageSettings(passage_length=12, passage_overlap=3)
    ids, labels, spans = _doc(17, mentions=[(2, 4), (8, 11)])  # second mention crosses the first boundary (10)
    first, second = window_passages(ids, labels, spans, settings, BOS, EOS)
    assert first["input_ids"].count(E_S) == 1 and first["input_ids"].count(E_E) == 1
    assert first["entity_labels"].count(42) == 1 and first["num_link_mentions"] == 1
    assert len(first["input_ids"]) == 11  # the cut mention's <E_s> is dropped, its words stay
    assert 108 not in first["input_ids"] and 109 in first["input_ids"]
    assert second["input_ids"][1:6] == [107, E_S, 109, 110, E_E]  # whole in the second window: marked there
    assert second["input_ids"].count(E_S) == 1 and second["entity_labels"].count(42) == 1
    assert [first["passage_index"], second["passage_index"]] == [0, 1]
    for passage in (first, second):
        assert len(passage["input_ids"]) == len(passage["entity_labels"])
        for token, label in zip(passage["input_ids"], passage["entity_labels"]):
            assert label == -100 or token == E_S


def _reference_windows(ids, labels, spans, settings, bos, eos):
    """Windowing written out token list by token list (the specification `window_passages` is held to)."""
    content = settings.passage_length - 2
    stride = content - settings.passage_overlap
    n = len(ids)
    ranges_per_window = []
    start = 0
    while n:
        end = start + content
        if end >= n:
            ranges_per_window.append([(start, n)] + ([(0, end - n)] if end > n and n > content else []))
            break
        ranges_per_window.append([(start, end)])
        start += stride
    passages = []
    for index, ranges in enumerate(ranges_per_window):
        out_ids, out_labels, counts = [bos], [-100], [0, 0, 0]
        for low, high in ranges:
            drop = set()
            for e_s, e_e, heuristic in spans:
                inside = [p for p in (e_s, e_e) if low <= p < high]
                if len(inside) == 2:
                    counts[1 if heuristic else 0] += 1
                    counts[2] += labels[e_s] != -100
                else:
                    drop.update(inside)
            kept = [p for p in range(low, high) if p not in drop]
            out_ids += [ids[p] for p in kept]
            out_labels += [labels[p] for p in kept]
        passages.append({"input_ids": out_ids + [eos], "entity_labels": out_labels + [-100], "passage_index": index,
                         "num_link_mentions": counts[0], "num_heuristic_mentions": counts[1],
                         "num_labeled_mentions": counts[2]})  # fmt: skip
    return passages


def test_windows_match_the_token_by_token_reference():
    """`window_passages` (all windows of a document at once, as arrays) against the reference, on random
    documents: lengths around the window size, mentions cut by boundaries and by the top-up, short mentions."""
    import random

    rng = random.Random(3)
    for trial in range(1500):
        settings = PassageSettings(passage_length=rng.randint(8, 20), passage_overlap=0)
        settings = PassageSettings(settings.passage_length, rng.randint(0, settings.passage_length - 3))
        n = rng.choice([0, 1, rng.randint(2, 60), settings.passage_length - 2, settings.passage_length - 1])
        ids, labels, spans = [100 + i for i in range(n)], [-100] * n, []
        position = 0
        while n and position < n - 1:  # mentions as marker pairs in order, not overlapping
            e_s = rng.randint(position, n - 1)
            e_e = rng.randint(e_s + 1, min(n - 1, e_s + rng.randint(1, 6))) if e_s < n - 1 else None
            if e_e is None:
                break
            ids[e_s], ids[e_e] = E_S, E_E
            labels[e_s] = rng.choice([-100, 7, 8])
            spans.append((e_s, e_e, rng.random() < 0.5))
            position = e_e + 1
        got = window_passages(ids, labels, spans, settings, BOS, EOS)
        assert got == _reference_windows(ids, labels, spans, settings, BOS, EOS), (trial, n, spans, settings)


@pytest.fixture(scope="module")
def toy_dump(tmp_path_factory):
    return write_mediawiki_dump(generate_toy_world(60, seed=0), tmp_path_factory.mktemp("toy") / "toy.xml.bz2")


@pytest.fixture(scope="module")
def toy_tokenizer(tmp_path_factory):
    world = generate_toy_world(60, seed=0)
    path = tmp_path_factory.mktemp("tok")
    train_tokenizer(list(world.pages.values()), vocab_size=600, min_frequency=1).save_pretrained(path)
    return path


def test_build_corpus_end_to_end_via_cli(toy_dump, tmp_path):
    datasets.disable_progress_bars()
    out = tmp_path / "corpus"
    code = cli_main(
        ["--dump", str(toy_dump), "--out", str(out), "--num-entities", "30", "--vocab_size", "600",
         "--passage-length", "32", "--passage-stride", "4", "--validation_fraction", "0.1", "--num_proc", "2"]
    )  # fmt: skip
    assert code == 0
    passages = datasets.load_from_disk(str(out / "passages"))
    assert set(passages) == {"train", "validation"}
    assert passages["train"].column_names == ["input_ids", "entity_labels", "doc_id", "passage_index"]
    stats = json.loads((out / "stats.json").read_text())
    assert stats["validation_passages"] == round(stats["passages"] * 0.1) > 0
    assert stats["train_passages"] + stats["validation_passages"] == stats["passages"]
    assert stats["malformed_pages"] == 0 and stats["redirects"] == 30 and stats["articles"] == 60
    assert stats["heuristic_mentions"] > 0 and stats["link_mentions"] > 0
    vocab = EntityVocab.load(out)
    assert len(vocab) == 30 and vocab.counts == sorted(vocab.counts, reverse=True)
    aliases = AliasTable.load(out)
    assert any(alias.startswith("Republic of ") for alias in aliases.counts)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out / "tokenizer", local_files_only=True)
    for row in passages["train"]:
        ids, labels = row["input_ids"], row["entity_labels"]
        assert len(ids) == len(labels) <= 32 and ids[0] == 0 and ids[-1] == 2
        assert ids.count(E_S) == ids.count(E_E)
        for i, (token, label) in enumerate(zip(ids, labels)):
            if label != -100:
                assert token == E_S
                name = tokenizer.decode(ids[i + 1 : ids.index(E_E, i)]).strip()
                # hyperlink anchors or aliases of the labelled entity
                assert name == vocab.names[label] or name in vocab.aliases[label] or name in vocab.names[label]


def test_build_corpus_with_given_tokenizer_and_strict_malformed(toy_tokenizer, tmp_path):
    datasets.disable_progress_bars()
    xml = render_mediawiki_dump(generate_toy_world(30, seed=2))
    broken_page = (
        "  <page>\n    <title>Broken page</title>\n    <ns>0</ns>\n    <id>999</id>\n"
        "    <revision>\n      <id>5</id>\n    </revision>\n  </page>\n"
    )
    dump = tmp_path / "malformed.xml"
    dump.write_text(xml.replace("</mediawiki>", broken_page + "</mediawiki>"), encoding="utf-8")
    stats = build_corpus(dump, tmp_path / "lenient", num_entities=10, tokenizer=toy_tokenizer, passage_length=64)
    assert stats["malformed_pages"] == 1 and stats["articles"] == 30
    with pytest.raises(MalformedPageError, match="Broken page"):
        build_corpus(dump, tmp_path / "strict", num_entities=10, tokenizer=toy_tokenizer, strict=True)
    assert (
        cli_main(
            ["--dump", str(dump), "--out", str(tmp_path / "strict2"), "--tokenizer", str(toy_tokenizer), "--strict"]
        )
        == 1
    )


def test_build_corpus_bad_xml_is_a_clear_error(toy_tokenizer, tmp_path):
    dump = tmp_path / "bad.xml"
    dump.write_text("<mediawiki><page><title>A</title><ns>0", encoding="utf-8")
    with pytest.raises(ValueError, match="bad.xml"):
        build_corpus(dump, tmp_path / "out", num_entities=10, tokenizer=toy_tokenizer)


def test_piece_encoder_matches_encode_batch(wikipedia_sample_small, toy_tokenizer):
    from transformers import AutoTokenizer

    from edmem_hf.corpus import _PieceEncoder
    from edmem_hf.dump import iter_parsed_pages

    texts = [page.text for page in iter_parsed_pages(wikipedia_sample_small) if page.text]
    tokenizer = train_tokenizer(texts, vocab_size=800, min_frequency=1)
    pieces = [text[i : i + 301] for text in texts for i in range(0, len(text), 301)]
    pieces += [
        "", " ", "  ", "\t\t x", "a  \n\n b \n", "x  ", "don't 's 'S 'LL", "a <mask> b", "<s>x</s>", "x<E_s>y",
        "\x1c\x1d a\u2028b\u00a0c\u3000d", "東京 مرحبا Ελληνικά 𝔘 😀 e\u0301 ١٢٣ ²³", "1,000.5 -- ... !!! ??",
    ]  # fmt: skip
    for tok in (tokenizer, AutoTokenizer.from_pretrained(toy_tokenizer, local_files_only=True)):
        expected = [e.ids for e in tok.backend_tokenizer.encode_batch(pieces, add_special_tokens=False)]
        encoder = _PieceEncoder(tok)
        assert encoder.words is not None  # the fast path is in use for byte-level BPE
        assert encoder.encode(pieces) == expected
        assert encoder.encode(pieces) == expected  # from the word cache


def test_whole_text_tokenisation_matches_piece_by_piece(wikipedia_sample_small, toy_tokenizer):
    from transformers import AutoTokenizer

    from edmem_hf.corpus import _tokenize_documents, _tokenize_pieces
    from edmem_hf.dump import iter_parsed_pages

    tokenizer = AutoTokenizer.from_pretrained(toy_tokenizer, local_files_only=True)
    documents = []
    for page in iter_parsed_pages(wikipedia_sample_small):
        if page.text:
            mentions = [Mention(link.start, link.end, k % 3 - 1, bool(k % 2)) for k, link in enumerate(page.links)]
            documents.append((page.text, mentions))
    text = "Born in Washington, D.C.. The U.S.' (film), a  Paris-based <mask> band; x\n Rome's 1,000 km."
    spans = [(8, 24), (29, 35), (36, 42), (50, 55), (61, 67), (76, 80), (83, 88)]  # ends inside words too
    documents.append((text, [Mention(s, e, 1) for s, e in spans]))
    documents.append(("no mentions here", []))
    start_id, end_id = tokenizer.convert_tokens_to_ids(["<E_s>", "<E_e>"])
    assert _tokenize_documents(documents, tokenizer) == _tokenize_pieces(documents, tokenizer, start_id, end_id)


def test_ascii_word_pattern_matches_the_byte_level_pattern():
    import random
    import re

    import regex

    from edmem_hf.corpus import _ASCII_BYTE_LEVEL_WORDS, _BYTE_LEVEL_WORDS

    unicode_words, ascii_words = regex.compile(_BYTE_LEVEL_WORDS), re.compile(_ASCII_BYTE_LEVEL_WORDS)
    rng = random.Random(0)
    alphabet = [chr(i) for i in range(128)] + ["'s", "'ll", "  ", "\n\n", " \t "]
    for _ in range(20_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        assert ascii_words.findall(text) == unicode_words.findall(text), repr(text)


def test_build_corpus_missing_tokenizer_is_a_clear_error(wikipedia_sample_small, tmp_path):
    with pytest.raises(FileNotFoundError, match="no-such-tokenizer"):
        build_corpus(
            wikipedia_sample_small, tmp_path / "out", num_entities=10, tokenizer=tmp_path / "no-such-tokenizer"
        )


def test_build_corpus_output_does_not_depend_on_processes_or_dump_files(toy_tokenizer, tmp_path, monkeypatch):
    datasets.disable_progress_bars()
    xml = render_mediawiki_dump(generate_toy_world(40, seed=3))
    head, rest = xml.split("<page>", 1)
    pages = ["<page>" + page for page in rest.split("<page>")]
    tail = pages[-1][pages[-1].rindex("</page>") + len("</page>") :]
    pages[-1] = pages[-1][: len(pages[-1]) - len(tail)]
    whole = tmp_path / "whole.xml"
    whole.write_text(xml, encoding="utf-8")
    halves = [tmp_path / "part1.xml", tmp_path / "part2.xml"]
    middle = len(pages) // 2
    for path, part in zip(halves, (pages[:middle], pages[middle:])):
        path.write_text(head + "".join(part) + tail, encoding="utf-8")

    def build(dump, num_proc: int, name: str):
        out = tmp_path / name
        stats = build_corpus(dump, out, num_entities=25, tokenizer=toy_tokenizer, num_proc=num_proc, passage_length=32,
                             validation_fraction=0.1)  # fmt: skip
        splits = datasets.load_from_disk(str(out / "passages"))
        files = [(out / f).read_text(encoding="utf-8") for f in ("entity_vocab.json", "aliases.json")]
        kept = {k: v for k, v in stats.items() if k not in ("stage_seconds", "seconds", "articles_per_second", "num_proc", "dump_files")}  # fmt: skip
        return {split: splits[split].to_dict() for split in splits}, files, kept

    reference = build(whole, 1, "one-process")
    assert reference[2]["articles"] == 40 and len(reference[0]["validation"]["doc_id"]) > 0
    assert build(whole, 2, "two-processes") == reference
    assert build(halves, 2, "two-files") == reference
    import edmem_hf.corpus

    monkeypatch.setattr(edmem_hf.corpus, "_LOOKUP_PAGES", 7)  # the links' entity ids looked up a few pages at a time
    assert build(whole, 2, "small-look-ups") == reference


def test_build_corpus_without_validation_or_passages(toy_tokenizer, toy_dump, tmp_path):
    datasets.disable_progress_bars()
    stats = build_corpus(toy_dump, tmp_path / "all-train", num_entities=10, tokenizer=toy_tokenizer,
                         validation_fraction=0.0)  # fmt: skip
    splits = datasets.load_from_disk(str(tmp_path / "all-train" / "passages"))  # an empty split loads back too
    assert len(splits["validation"]) == 0 and len(splits["train"]) == stats["passages"] > 0
    assert splits["validation"].column_names == splits["train"].column_names
    redirects_only = render_mediawiki_dump(generate_toy_world(12, seed=1)).split("<page>")
    xml = redirects_only[0] + "".join("<page>" + page for page in redirects_only[1:] if "<redirect" in page)
    dump = tmp_path / "redirects.xml"
    dump.write_text(xml if xml.rstrip().endswith("</mediawiki>") else xml + "</mediawiki>\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no passages"):
        build_corpus(dump, tmp_path / "empty", num_entities=10, tokenizer=toy_tokenizer)


def test_markers_inserted_into_whole_text_tokens_match_piece_by_piece(wikipedia_sample_small):
    """The build tokenises each article while parsing and puts the markers in afterwards; the result must be
    what tokenising piece by piece gives, for any mention spans (cuts inside words, after punctuation runs such
    as "D.C." + ",", after runs of whitespace, empty mentions, unicode)."""
    import random

    import numpy as np

    from edmem_hf.corpus import _PieceEncoder, _tokenize_pieces, insert_mention_markers
    from edmem_hf.dump import iter_parsed_pages

    rng = random.Random(0)
    alphabet = list("abXY019 .,'-()\n\t") + [
        "  ",
        "\n\n",
        " \t ",
        "'s",
        "é",
        "東京",
        "½",
        "\u00a0",
        "U.S.",
        " Paris",
        "D.C.",
    ]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 25))) for _ in range(4000)]
    # trained on these texts, so that runs of whitespace and punctuation are tokens of their own ("ĊĊ", ".,"):
    # where the pieces' words differ from the whole text's, the ids differ too
    tokenizer = train_tokenizer(texts, vocab_size=400, min_frequency=2)
    assert len(tokenizer.backend_tokenizer.encode("\n\n", add_special_tokens=False).ids) == 1
    start_id, end_id = tokenizer.convert_tokens_to_ids(["<E_s>", "<E_e>"])
    encoder = _PieceEncoder(tokenizer)
    documents = []
    for text in texts:
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, 2 * rng.randint(0, 4))))
        mentions = [
            Mention(cuts[i], cuts[i + 1], rng.choice([-100, 3]), rng.random() < 0.5)
            for i in range(0, len(cuts) - 1, 2)
        ]
        documents.append((text, mentions))
    for page in iter_parsed_pages(wikipedia_sample_small):  # real text, links as mentions
        if page.text:
            documents.append((page.text, [Mention(link.start, link.end, 1) for link in page.links]))
    expected = _tokenize_pieces(documents, tokenizer, start_id, end_id)
    for (text, mentions), reference in zip(documents, expected):
        ids, starts = encoder.encode_words(text)
        assert ids.tolist() == tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
        got_ids, got_labels, got_spans = insert_mention_markers(
            text, ids, starts, mentions, start_id, end_id, encoder.piece_ids
        )
        assert (got_ids.tolist(), got_labels.tolist(), [tuple(span) for span in got_spans.tolist()]) == reference, (
            text,
            mentions,
        )
    assert encoder.encode_words("a <mask> b") is None  # an added token's text: tokenised with the mentions instead
    overlapping = [Mention(0, 3, 1), Mention(2, 4, 1)]
    assert (
        insert_mention_markers(
            "abcdef", np.array([1], dtype=np.int32), np.array([0]), overlapping, 5, 6, encoder.piece_ids
        )
        is None
    )


def test_whole_text_ids_gathered_from_the_word_table_as_it_grows_and_is_cleared(toy_tokenizer):
    """`encode_words` gathers ids from flat per-word arrays that grow as new words come (past their first
    capacities here) and are emptied when the cache bound is reached: the ids and word starts stay exact."""
    import random
    from itertools import accumulate

    import regex
    from transformers import AutoTokenizer

    from edmem_hf.corpus import _BYTE_LEVEL_WORDS, _PieceEncoder

    tokenizer = AutoTokenizer.from_pretrained(toy_tokenizer, local_files_only=True)
    pattern = regex.compile(_BYTE_LEVEL_WORDS)
    rng = random.Random(1)
    letters = "abcdefghijklmnopqrstuvwxyzé東"
    for bound in (100_000, 3_000):
        encoder = _PieceEncoder(tokenizer, max_cache_words=bound)
        for _ in range(12):
            words = ["".join(rng.choice(letters) for _ in range(rng.randint(1, 12))) for _ in range(2_500)]
            text = " ".join(words) + rng.choice(["", " ", ".\n", "  "])
            ids, starts = encoder.encode_words(text)
            encoding = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
            assert ids.tolist() == encoding.ids
            text_words = pattern.findall(text)
            word_starts = list(accumulate(map(len, text_words), initial=0))
            assert starts.tolist() == [word_starts[w] for w in encoding.word_ids]
        assert len(encoder.table) <= bound + 2_600
        if bound == 100_000:  # no clearing: the arrays grew past their first capacities
            assert len(encoder.table.flat) > 1 << 16 and len(encoder.table.rows) > 1 << 14
    empty_ids, empty_starts = encoder.encode_words("")
    assert len(empty_ids) == 0 and len(empty_starts) == 0


def test_word_split_by_lines_matches_the_byte_level_pattern(toy_tokenizer):
    import random

    import regex
    from transformers import AutoTokenizer

    from edmem_hf.corpus import _BYTE_LEVEL_WORDS, _PieceEncoder

    encoder = _PieceEncoder(AutoTokenizer.from_pretrained(toy_tokenizer, local_files_only=True))
    words = regex.compile(_BYTE_LEVEL_WORDS)
    rng = random.Random(1)
    alphabet = [
        "\n",
        "\n",
        " ",
        "a",
        "Z",
        "1",
        ".",
        "'s",
        "é",
        "東",
        "½",
        "\u00a0",
        "\u2028",
        "\x1c",
        "\x85",
        "\t",
        "😀",
    ]
    for _ in range(20_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14)))
        assert encoder._split_words(text) == words.findall(text), repr(text)


def test_build_corpus_broken_tokenizer_is_a_clear_error(toy_tokenizer, toy_dump, tmp_path, capfd):
    """A tokenizer.json that does not load stops the build with an error naming the directory, after only the
    first pages are read and before any worker starts (the parsing workers inherit the loaded tokenizer)."""
    import shutil

    broken = tmp_path / "broken-tokenizer"
    shutil.copytree(toy_tokenizer, broken)
    (broken / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="broken-tokenizer"):
        build_corpus(toy_dump, tmp_path / "out", num_entities=10, tokenizer=broken, num_proc=2)
    assert "Traceback" not in capfd.readouterr().err  # no worker died
    assert not (tmp_path / "out" / "passages").exists()

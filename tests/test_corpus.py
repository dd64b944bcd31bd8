"""`edmem build-corpus`: the whole build (`edmem_hf.corpus`), its output, options and errors."""

import json
import logging
import re

import datasets
import pytest

from edmem_hf.corpus import CorpusSettings, build_corpus, cli_main, format_stats
from edmem_hf.dump import MalformedPageError
from edmem_hf.entity_vocab import EntityVocab
from edmem_hf.tokenization import train_tokenizer
from edmem_hf.toy_world import generate_toy_world, render_mediawiki_dump, write_mediawiki_dump

E_S, E_E = 5, 6


@pytest.fixture(scope="module")
def toy_dump(tmp_path_factory):
    return write_mediawiki_dump(generate_toy_world(60, seed=0), tmp_path_factory.mktemp("toy") / "toy.xml.bz2")


@pytest.fixture(scope="module")
def toy_tokenizer(tmp_path_factory):
    world = generate_toy_world(60, seed=0)
    path = tmp_path_factory.mktemp("tok")
    train_tokenizer(list(world.pages.values()), vocab_size=600, min_frequency=1).save_pretrained(path)
    return path


def test_build_corpus_end_to_end_via_cli(toy_dump, tmp_path, capsys):
    datasets.disable_progress_bars()
    out = tmp_path / "corpus"
    options = ["--num-entities", "30", "--vocab_size", "600", "--passage-length", "32", "--passage-stride", "4"]
    code = cli_main(
        ["--dump", str(toy_dump), "--out", str(out), *options, "--validation_fraction", "0.1", "--num_proc", "2"]
    )
    assert code == 0
    printed = capsys.readouterr().out
    passages = datasets.load_from_disk(str(out / "passages"))
    assert set(passages) == {"train", "validation"}
    assert passages["train"].column_names == ["input_ids", "entity_labels", "doc_id", "passage_index"]
    stats = json.loads((out / "stats.json").read_text())
    assert stats["validation_passages"] == round(stats["passages"] * 0.1) > 0
    assert stats["train_passages"] + stats["validation_passages"] == stats["passages"]
    assert stats["malformed_pages"] == 0 and stats["redirects"] == 30 and stats["articles"] == 60
    assert stats["heuristic_mentions"] > 0 and stats["link_mentions"] > 0
    assert f"corpus written to {out}\n{format_stats(stats)}" in printed and "heuristic_mentions" in printed
    vocab = EntityVocab.load(out)
    assert len(vocab) == 30 and vocab.counts == sorted(vocab.counts, reverse=True)
    aliases = json.loads((out / "aliases.json").read_text(encoding="utf-8"))  # anchor -> entity name -> links
    assert any(alias.startswith("Republic of ") for alias in aliases)
    assert all(name in vocab.names for entities in aliases.values() for name in entities)
    assert all(alias.strip() == alias != "" for alias in aliases)
    assert all(count > 0 for entities in aliases.values() for count in entities.values())
    # Each entity's aliases in the vocabulary are anchors of its links in the alias table.
    assert all(aliases[alias][vocab.names[i]] > 0 for i in range(len(vocab)) for alias in vocab.aliases[i])
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
                # the labelled entity's name, its name without a trailing parenthetical, or one of its anchors
                spelled = {vocab.names[label], re.sub(r" \([^()]*\)$", "", vocab.names[label]), *vocab.aliases[label]}
                assert name in spelled, (name, vocab.names[label])
    links_only = tmp_path / "links-only"
    assert cli_main(["--dump", str(toy_dump), "--out", str(links_only), *options, "--no_heuristic_labels"]) == 0
    stats = json.loads((links_only / "stats.json").read_text())
    assert stats["heuristic_mentions"] == 0 and stats["link_mentions"] > 0


def test_bad_settings_are_clear_errors(toy_dump, tmp_path, capsys):
    for settings, problem in [
        ({"num_entities": 0}, "num_entities"),
        ({"num_proc": 0}, "num_proc"),
        ({"validation_fraction": 1.0}, "validation_fraction"),
        ({"passage_length": 4}, "passage_length"),
        ({"passage_length": 16, "passage_overlap": 14}, "passage_overlap"),
    ]:
        with pytest.raises(ValueError, match=problem):
            CorpusSettings(**settings)
        with pytest.raises(ValueError, match=problem):
            build_corpus(toy_dump, tmp_path / "out", **settings)
    with pytest.raises(TypeError, match="no_such_setting"):
        build_corpus(toy_dump, tmp_path / "out", no_such_setting=1)
    for settings, problem in [
        ({"num_proc": -1}, "num_proc must be at least 1, got -1"),
        ({"validation_fraction": -0.1}, r"validation_fraction must be in \[0, 1\), got -0.1"),
        ({"passage_overlap": -1}, r"passage_overlap=-1 must be in \[0, passage_length - 2\)"),
        ({"passage_length": 7}, r"passage_length=7 is too short \(at least 8\)"),
        ({"passage_length": 10, "passage_overlap": 8}, "passage_overlap=8"),
    ]:
        # Refused before the dump is read: the missing dump is never reached.
        with pytest.raises(ValueError, match=problem):
            build_corpus(tmp_path / "no-such-dump.xml", tmp_path / "out", **settings)
    # The edges of the ranges are accepted.
    edges = CorpusSettings(passage_length=8, passage_overlap=5, validation_fraction=0.0, num_proc=1)
    assert edges.passage_settings.passage_overlap == 5
    with pytest.raises(SystemExit) as exited:
        cli_main(["--dump", str(toy_dump), "--out", str(tmp_path / "out"), "--passage_length", "4"])
    assert exited.value.code == 2
    assert "passage_length=4 is too short" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_missing_dump_is_a_clear_error(tmp_path, capsys):
    missing = tmp_path / "no-such-dump.xml.bz2"
    with pytest.raises(FileNotFoundError, match=f"dump file {missing} does not exist"):
        build_corpus(missing, tmp_path / "out", num_entities=10)
    assert cli_main(["--dump", str(missing), "--out", str(tmp_path / "out")]) == 1
    assert f"edmem build-corpus: error: dump file {missing} does not exist" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # checked before anything is written


def test_build_corpus_with_given_tokenizer_and_strict_malformed(toy_tokenizer, tmp_path, caplog):
    datasets.disable_progress_bars()
    xml = render_mediawiki_dump(generate_toy_world(30, seed=2))
    broken_page = (
        "  <page>\n    <title>Broken page</title>\n    <ns>0</ns>\n    <id>999</id>\n"
        "    <revision>\n      <id>5</id>\n    </revision>\n  </page>\n"
    )
    dump = tmp_path / "malformed.xml"
    dump.write_text(xml.replace("</mediawiki>", broken_page + "</mediawiki>"), encoding="utf-8")
    # Without --strict the page is skipped with a warning naming it, counted, and the command succeeds.
    lenient = tmp_path / "lenient"
    options = ["--num_entities", "10", "--tokenizer", str(toy_tokenizer), "--passage_length", "64"]
    with caplog.at_level(logging.WARNING, logger="edmem_hf.corpus"):
        assert cli_main(["--dump", str(dump), "--out", str(lenient), *options]) == 0
    skipped = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert skipped == [f"skipping malformed page in {dump}: page 'Broken page' (id 999): no text"]
    stats = json.loads((lenient / "stats.json").read_text())
    assert stats["malformed_pages"] == 1 and stats["articles"] == 30
    assert 999 not in datasets.load_from_disk(str(lenient / "passages"))["train"]["doc_id"]
    with pytest.raises(MalformedPageError, match="Broken page"):
        build_corpus(dump, tmp_path / "strict", num_entities=10, tokenizer=toy_tokenizer, strict=True)
    assert (
        cli_main(
            ["--dump", str(dump), "--out", str(tmp_path / "strict2"), "--tokenizer", str(toy_tokenizer), "--strict"]
        )
        == 1
    )


def test_wikitext_that_fails_to_parse_is_a_skipped_malformed_page(toy_tokenizer, tmp_path, monkeypatch, caplog):
    """mwparserfromhell is tolerant and no text we know makes it raise: a parser raising on one page stands in."""
    import edmem_hf.dump

    parse_wikitext = edmem_hf.dump.parse_wikitext

    def parse_or_raise(text):
        if "Unparsable" in text:
            raise RecursionError("maximum recursion depth exceeded")
        return parse_wikitext(text)

    monkeypatch.setattr(edmem_hf.dump, "parse_wikitext", parse_or_raise)
    xml = render_mediawiki_dump(generate_toy_world(30, seed=2))
    page = (
        "  <page>\n    <title>Odd page</title>\n    <ns>0</ns>\n    <id>998</id>\n    <revision>\n      <id>4</id>\n"
    )
    page += "      <text>Unparsable [[markup]]</text>\n    </revision>\n  </page>\n"
    dump = tmp_path / "unparsable.xml"
    dump.write_text(xml.replace("</mediawiki>", page + "</mediawiki>"), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="edmem_hf.corpus"):
        stats = build_corpus(dump, tmp_path / "out", num_entities=10, tokenizer=toy_tokenizer, passage_length=64)
    assert stats["malformed_pages"] == 1 and stats["articles"] == 30
    assert "page 'Odd page' (id 998): wikitext does not parse: RecursionError" in caplog.text
    with pytest.raises(MalformedPageError, match="'Odd page' .*wikitext does not parse"):
        build_corpus(dump, tmp_path / "strict", num_entities=10, tokenizer=toy_tokenizer, strict=True)


def test_build_corpus_bad_xml_is_a_clear_error(toy_tokenizer, tmp_path):
    dump = tmp_path / "bad.xml"
    dump.write_text("<mediawiki><page><title>A</title><ns>0", encoding="utf-8")
    with pytest.raises(ValueError, match="bad.xml"):
        build_corpus(dump, tmp_path / "out", num_entities=10, tokenizer=toy_tokenizer)


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
        settings = {"num_entities": 25, "num_proc": num_proc, "passage_length": 32, "validation_fraction": 0.1}
        stats = build_corpus(dump, out, tokenizer=toy_tokenizer, **settings)
        splits = datasets.load_from_disk(str(out / "passages"))
        files = [(out / f).read_text(encoding="utf-8") for f in ("entity_vocab.json", "aliases.json")]
        varying = ("stage_seconds", "seconds", "articles_per_second", "num_proc", "dump_files")
        kept = {k: v for k, v in stats.items() if k not in varying}
        return {split: splits[split].to_dict() for split in splits}, files, kept

    reference = build(whole, 1, "one-process")
    assert reference[2]["articles"] == 40 and len(reference[0]["validation"]["doc_id"]) > 0
    assert build(whole, 2, "two-processes") == reference
    assert build(halves, 2, "two-files") == reference
    import edmem_hf.corpus

    monkeypatch.setattr(edmem_hf.corpus, "_LOOKUP_PAGES", 7)  # the links' entity ids looked up a few pages at a time
    assert build(whole, 2, "small-look-ups") == reference
    from edmem_hf.fast_tokenization import ByteLevelWordEncoder

    # every article through the reference tokenisation instead of the fast path
    monkeypatch.setattr(ByteLevelWordEncoder, "for_tokenizer", classmethod(lambda cls, tokenizer: None))
    assert build(whole, 2, "reference-tokenisation") == reference


def test_build_corpus_without_validation_or_passages(toy_tokenizer, toy_dump, tmp_path):
    datasets.disable_progress_bars()
    stats = build_corpus(
        toy_dump, tmp_path / "all-train", num_entities=10, tokenizer=toy_tokenizer, validation_fraction=0
    )
    splits = datasets.load_from_disk(str(tmp_path / "all-train" / "passages"))  # an empty split loads back too
    assert len(splits["validation"]) == 0 and len(splits["train"]) == stats["passages"] > 0
    assert splits["validation"].column_names == splits["train"].column_names
    redirects_only = render_mediawiki_dump(generate_toy_world(12, seed=1)).split("<page>")
    xml = redirects_only[0] + "".join("<page>" + page for page in redirects_only[1:] if "<redirect" in page)
    dump = tmp_path / "redirects.xml"
    dump.write_text(xml if xml.rstrip().endswith("</mediawiki>") else xml + "</mediawiki>\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no passages"):
        build_corpus(dump, tmp_path / "empty", num_entities=10, tokenizer=toy_tokenizer)


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

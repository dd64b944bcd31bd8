import bz2
import os

import pytest

from edmem_hf.dump import (
    DumpFormatError,
    Link,
    MalformedPageError,
    WikiPage,
    iter_pages,
    iter_parsed_pages,
    normalize_title,
    parse_page,
    parse_wikitext,
)


def test_normalize_title():
    assert normalize_title("  new_York  city#History") == "New York city"
    assert normalize_title("iPod") == "IPod"
    assert normalize_title("Paris") == "Paris"


def _spans(text, links):
    for link in links:
        assert text[link.start : link.end] == link.anchor
    return [(link.anchor, link.target) for link in links]


def test_links_anchors_trails_and_sections():
    text, links = parse_wikitext(
        "The [[river]]s of [[Foo_bar#History|the Foo]] and [[Baz]]. [[#Local|here]] and [[ Qux (band) | Qux ]]!"
    )
    assert text == "The rivers of the Foo and Baz. here and Qux!"
    assert _spans(text, links) == [("rivers", "River"), ("the Foo", "Foo bar"), ("Baz", "Baz"), ("Qux", "Qux (band)")]


def test_dropped_markup():
    wikitext = (
        "{{Infobox|name=[[Nope]]}}'''Alpha''' is a [[beta]].<ref>{{cite|[[Nope]]}}</ref><ref name=x/> "
        "[[File:A.jpg|thumb|Caption [[Nope]]]]It has [[wikt:gamma|gamma]] &amp; delta<!-- [[Nope]] -->.\n"
        "{| class=wikitable\n| [[Nope]]\n|}\n"
        "[[Category:Things]][[fr:Alpha]]\n== See also ==\n* [[Nope]]\n== References ==\n{{reflist}}"
    )
    text, links = parse_wikitext(wikitext)
    assert text == "Alpha is a beta. It has gamma & delta."
    assert _spans(text, links) == [("beta", "Beta")]


def test_unbalanced_braces_fall_back_to_full_parse():
    text, links = parse_wikitext("Open {{ brace and a [[Link]] here.")
    assert [link.target for link in links] == ["Link"]
    assert text[links[0].start : links[0].end] == "Link"


def test_malformed_pages():
    with pytest.raises(MalformedPageError, match="no text"):
        parse_page(WikiPage(page_id=7, title="Empty", namespace=0, text=None))
    with pytest.raises(MalformedPageError, match="page id 8: no title"):
        parse_page(WikiPage(page_id=8, title=None, namespace=0, text="x"))
    redirect = parse_page(WikiPage(page_id=9, title="A", namespace=0, text="#REDIRECT [[B]]", redirect="B"))
    assert redirect.redirect == "B" and redirect.links == []


def test_bad_xml_is_a_clear_error(tmp_path):
    path = tmp_path / "broken.xml.bz2"
    with bz2.open(path, "wt") as f:
        f.write("<mediawiki><siteinfo><namespaces></namespaces></siteinfo><page><title>A</title>")
    with pytest.raises(DumpFormatError, match="broken.xml.bz2"):
        list(iter_pages(path))
    with pytest.raises(FileNotFoundError):
        list(iter_pages(tmp_path / "missing.xml"))


def test_real_sample_small(wikipedia_sample_small):
    pages = list(iter_parsed_pages(wikipedia_sample_small))
    assert [(p.page_id, p.title, p.redirect) for p in pages] == [
        (10, "AccessibleComputing", "Computer accessibility"),
        (411964, "Computer accessibility", None),
        (302109, "Accessibility", None),
    ]
    for page in pages:
        _spans(page.text, page.links)
    assert [len(p.links) for p in pages] == [0, 117, 111]


@pytest.fixture(scope="module")
def parsed_206(wikipedia_sample_206):
    return list(iter_parsed_pages(wikipedia_sample_206))


def test_real_sample_206_counts(wikipedia_sample_206, parsed_206):
    pages = list(iter_pages(wikipedia_sample_206, namespaces=None))
    assert len(pages) == 206
    assert sum(p.namespace == 0 for p in pages) == 205
    parsed = parsed_206
    assert sum(p.redirect is not None for p in parsed) == 99
    assert sum(len(p.links) for p in parsed) == 21750  # prose only: reference/link sections skipped
    # sharding splits the pages between processes without loss or overlap
    shards = [{p.page_id for p in iter_pages(wikipedia_sample_206, shard_index=k, num_shards=3)} for k in range(3)]
    assert sum(map(len, shards)) == 205 and len(set.union(*shards)) == 205


def test_real_page_link_spans_checked_by_hand(parsed_206):
    # "Algorithms (journal)", checked against its raw wikitext: the infobox, the <ref>, the "See also" and
    # "References" sections and the categories are gone; "[[algorithm]]s" is a link with a trail.
    page = next(p for p in parsed_206 if p.title == "Algorithms (journal)")
    assert page.text.startswith("Algorithms is a peer-reviewed open access mathematics journal concerning design")
    assert "Algorithmica" not in page.text and "Category" not in page.text and "cite web" not in page.text
    expected = [
        Link(16, 29, "peer-reviewed", "Peer review"),
        Link(30, 41, "open access", "Open access"),
        Link(42, 61, "mathematics journal", "Mathematics journal"),
        Link(110, 120, "algorithms", "Algorithm"),
        Link(150, 154, "MDPI", "MDPI"),
        Link(220, 236, "Kyoto University", "Kyoto University"),
    ]
    for link in expected:
        assert link in page.links
        assert page.text[link.start : link.end] == link.anchor
    assert len(page.links) == 14
    assert page.links[-1] == Link(412, 429, "Zentralblatt MATH", "Zentralblatt MATH")


def test_real_disambiguation_page_formatted_anchors(parsed_206):
    page = next(p for p in parsed_206 if p.title == "Asia Minor (disambiguation)")
    assert page.links == [
        Link(38, 46, "Anatolia", "Anatolia"),
        Link(157, 184, '"Asia Minor" (instrumental)', "Asia Minor (instrumental)"),
        Link(266, 284, "Asia Minor (album)", "Asia Minor (album)"),  # anchor was ''Asia Minor'' (album)
    ]


TRICKY_WIKITEXT = [
    "A [[b]]c, [[d|e]]f and [[g|h ]]i. [[:Category:X|cat]] [[Category:Y]] [[fr:Z]] [[wikt:w|w]] [[#s|s]]",
    "[[A&amp;B]] [[A<!-- c -->B|x]] [[a|b|c]] [[ | x]] [[]] [[x|]] [[ :a ]]",
    "&amp; &#65; &#x42; &nbsp; &bogus; &#99999999; <br/> <br> <hr /> <p>p</p>",
    '<span style="color:red" class=x>red [[Link]]</span> <small>s</small> <div id="{{t}}">d</div>',
    "<ref>r</ref> <ref name=a/> <math>x^2</math> <gallery>a.jpg</gallery> <nowiki>[[not]]</nowiki> <sup>2</sup>",
    "[http://example.org Example [[inner]]] [http://bare] http://bare.example.org/x [[File:X.jpg|thumb|[[cap]]]]",
    "== Head [[link]] ==\nx\n=== Sub ===\ny\n== See also ==\n* [[A]]\n=== Deeper ===\n[[B]]\n== Next ==\n[[C]]s",
    "* a\n# b\n; c : d\n----\n:: e\n{| class=x\n| [[t]]\n|}",
    "{{unbalanced [[X]] ''it'' '''b'''",
    "{{{arg|[[Y]]}}} [[Z]]<!-- unterminated",
    "<b>bold [[l]]</b>s <i>[[m]]</i>n [[o]]<!-- -->p [[q]]{{t}}r [[s]]&amp;t [[u]]''v''",
    '<span [[x]]>y</span> <p class="a" / > <unknown attr=1>k</unknown> </span>',
]


@pytest.mark.parametrize("wikitext", TRICKY_WIKITEXT)
def test_fast_path_matches_node_tree(wikitext):
    assert parse_wikitext(wikitext) == parse_wikitext(wikitext, fast=False)


def test_fast_path_matches_node_tree_on_real_pages(wikipedia_sample_206):
    # every page of the real sample (redirects and other namespaces too): identical text and link spans
    pages = [page for page in iter_pages(wikipedia_sample_206, namespaces=None) if page.text]
    assert len(pages) == 206
    for page in pages:
        assert parse_wikitext(page.text) == parse_wikitext(page.text, fast=False), page.title


def test_clean_up_matches_its_regex_specification():
    import random

    from edmem_hf.dump import _CLEANUPS, _clean_up

    def by_the_patterns(text: str) -> str:
        for pattern, replacement in _CLEANUPS:
            text = pattern.sub(replacement, text)
        return text

    rng = random.Random(0)
    alphabet = [*" \t\u00a0\u2009\u200b\n,.;:!?()x'\ue000", "  ", "( ;", " \n ", "''"]
    for _ in range(20_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        assert _clean_up(text) == by_the_patterns(text), repr(text)


@pytest.mark.parametrize("fast", [True, False])
def test_character_references_in_link_titles_are_decoded(fast):
    # MediaWiki decodes them: [[OS&nbsp;X]] links to "OS X" (a no-break space is a space in a title)
    text, links = parse_wikitext("[[OS&nbsp;X]] and [[Kruskal&ndash;Wallis test|the K-W test]].", fast=fast)
    assert [(link.anchor, link.target) for link in links] == [
        ("OS X", "OS X"),  # the clean-up makes the no-break space of the text a space
        ("the K-W test", "Kruskal\u2013Wallis test"),
    ]
    assert text == "OS X and the K-W test."


def _decompress_threads() -> list:
    import threading

    return [thread for thread in threading.enumerate() if thread.name == "edmem-bz2-decompress"]


def test_threaded_bz2_reader_reads_like_bz2_open(tmp_path):
    """Several concatenated streams and trailing zero bytes read as `bz2.open` reads them, in small blocks (the
    decompression loop goes round many times); a truncated stream is an error, not a short text."""
    import random

    from edmem_hf.bz2_reader import ThreadedBZ2Reader

    rng = random.Random(0)
    parts = [bytes(rng.choice(b"abc <>\n") for _ in range(size)) for size in (50_000, 0, 123_457, 999)]
    path = tmp_path / "streams.bz2"
    path.write_bytes(b"".join(bz2.compress(part) for part in parts) + b"\0" * 10)
    with bz2.open(path) as f:
        expected = f.read()
    assert expected == b"".join(parts)
    for block_size, max_output in ((1 << 14, 1 << 17), (100, 1000), (7, 50_000)):
        reader = ThreadedBZ2Reader(str(path), block_size=block_size, max_output=max_output, max_blocks=3)
        chunks = []
        while chunk := reader.read(4096):
            chunks.append(chunk)
        reader.close()
        assert b"".join(chunks) == expected, (block_size, max_output)
    truncated = tmp_path / "truncated.bz2"
    truncated.write_bytes(bz2.compress(parts[0])[:-20])
    reader = ThreadedBZ2Reader(str(truncated), block_size=1000)
    with pytest.raises(EOFError):
        while reader.read(4096):
            pass
    reader.close()
    assert not _decompress_threads()


_FORK_PROBE = {"armed": False, "threads_after_fork": None}


def _record_threads_after_fork() -> None:
    if _FORK_PROBE["armed"]:
        _FORK_PROBE["threads_after_fork"] = len(_decompress_threads())


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_parent=_record_threads_after_fork)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_dump_reader_stops_its_thread_for_a_fork(tmp_path):
    """A dump being read has no decompressing thread while the process forks (a forked child would inherit its
    locks); reading goes on afterwards, nothing lost. Hooks run after the fork in registration order: this test's
    runs after the reader's own and sees whether a thread was restarted before the next read."""
    from edmem_hf.dump import open_dump

    payload = bytes(range(256)) * 20_000
    path = tmp_path / "data.bz2"
    path.write_bytes(bz2.compress(payload))
    with open_dump(path) as stream:
        head = stream.read(1000)
        assert _decompress_threads()  # decompressing ahead of the reader
        _FORK_PROBE["armed"] = True
        try:
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
        finally:
            _FORK_PROBE["armed"] = False
        assert _FORK_PROBE["threads_after_fork"] == 0
        rest = stream.read()
    assert head + rest == payload
    assert not _decompress_threads()


def test_failed_build_closes_the_dump(tmp_path, monkeypatch):
    """A build that fails while the dump is still being read closes it: its thread must not outlive the build (at
    interpreter exit a daemon thread holding the file's lock made the clean-up abort the process)."""
    import edmem_hf.bz2_reader as bz2_reader
    import edmem_hf.corpus as corpus
    from edmem_hf.toy_world import generate_toy_world, write_mediawiki_dump

    dump = write_mediawiki_dump(generate_toy_world(200, seed=0), tmp_path / "toy.xml.bz2")
    opened = []

    class RecordedReader(bz2_reader.ThreadedBZ2Reader):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            opened.append(self)

    def fail(*args, **kwargs):
        raise RuntimeError("parsing failed")

    monkeypatch.setattr(bz2_reader, "ThreadedBZ2Reader", RecordedReader)
    monkeypatch.setattr(corpus, "_parse_chunk", fail)
    with pytest.raises(RuntimeError, match="parsing failed") as failure:
        corpus.build_corpus(dump, tmp_path / "out", num_entities=10, num_proc=1)
    # closed while the error (and the frames it holds, as at the top level of a script) is still alive
    assert failure.traceback and len(opened) == 1 and opened[0].closed
    assert not _decompress_threads()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_dump_reader_inherited_by_a_forked_child_is_a_clear_error(tmp_path):
    """A forked child has no decompressing thread: reading on past the blocks it inherited raises, not hangs."""
    from edmem_hf.bz2_reader import ThreadedBZ2Reader

    path = tmp_path / "data.bz2"
    path.write_bytes(bz2.compress(bytes(range(256)) * 20_000))
    reader = ThreadedBZ2Reader(str(path), max_output=1000, max_blocks=2)  # cannot finish before the fork
    reader.read(10)
    pid = os.fork()
    if pid == 0:
        try:
            while reader.read(4096):
                pass
        except RuntimeError as err:
            os._exit(3 if "forked child" in str(err) else 4)
        os._exit(5)
    import signal
    import time

    deadline = time.monotonic() + 30
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:  # the child hangs waiting for a block
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("a forked child reading an inherited dump reader hung instead of raising")
    assert os.waitstatus_to_exitcode(done[1]) == 3
    assert len(reader.read()) == 256 * 20_000 - 10  # the parent reads on
    reader.close()

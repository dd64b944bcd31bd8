"""Reading a MediaWiki XML dump: pages, redirects, and wikitext turned into plain text with link spans.

Hyperlinks are EDMem's gold mention annotations, so the one thing this module must get exactly right is where
each link's anchor text sits in the plain text it returns (`Link.start`/`Link.end` are character offsets,
`text[start:end] == anchor`).

Speed: mwparserfromhell builds a full node tree, and most of a Wikipedia article's bytes are references and
templates (citations, infoboxes) that we throw away. They are cut out first with a linear scan, and only the
rest is parsed (about 4x faster on real articles). Wikitext whose braces do not balance goes through
mwparserfromhell whole.
"""

from __future__ import annotations

import logging
import os
import re
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import mwparserfromhell
import mwxml
from mwparserfromhell.nodes import (
    Argument,
    Comment,
    ExternalLink,
    Heading,
    HTMLEntity,
    Tag,
    Template,
    Text,
    Wikilink,
)
from mwxml.errors import MalformedXML

from .bz2_reader import open_bz2

logger = logging.getLogger(__name__)


class DumpFormatError(ValueError):
    """The dump file itself is unreadable (not XML, truncated, not a MediaWiki export)."""


class MalformedPageError(ValueError):
    """One page cannot be used (no title, no text, wikitext that does not parse)."""


# Namespaces whose links are not entity links. Files and categories are dropped with their text (captions,
# sort keys); the others keep their anchor text as plain text.
DROPPED_NAMESPACES = {"file", "image", "media", "category"}
OTHER_NAMESPACES = set(
    "talk|user|user talk|wikipedia|wikipedia talk|wp|project|file talk|image talk|mediawiki|mediawiki talk|template|"
    "template talk|help|help talk|category talk|portal|portal talk|book|book talk|draft|draft talk|education program|"
    "timedtext|module|module talk|special|topic|wikt|wiktionary|wikisource|wikiquote|wikibooks|wikinews|"
    "wikiversity|wikivoyage|wikispecies|species|commons|meta|metawikipedia|mw|d|wikidata|s|q|n|b|v|voy|c|m|w|"
    "simple|iarchive|google|doi|arxiv".split("|")
)
# Interlanguage links: [[fr:Paris]], [[zh-min-nan:...]] (lower-case codes, as written in dumps).
_LANGUAGE_PREFIX = re.compile(r"^[a-z]{2,3}(?:-[a-z]{1,8})*$")
# Sections that hold lists of references and links, not prose.
SKIPPED_SECTIONS = set(
    "references|external links|see also|further reading|notes|bibliography|sources|footnotes|notes and references|"
    "citations|works cited".split("|")
)
# Tags whose content is not running text.
DROPPED_TAGS = set(
    "ref references table gallery math chem ce timeline imagemap score graph templatedata mapframe maplink "
    "syntaxhighlight source pre code hiero inputbox categorytree noinclude includeonly onlyinclude style script".split()
)
_NEWLINE_TAGS = {"br", "hr", "p", "li", "dd", "dt", "tr"}
_LINK_TRAIL = re.compile(r"[a-z]+")  # enwiki's $linkTrail
_REDIRECT_TEXT = re.compile(r"^\s*#redirect\s*:?\s*\[\[([^\]|]*)", re.IGNORECASE)

# Link anchors are bracketed by two private-use characters while the text is cleaned up, so that cleaning
# (which shifts offsets) cannot lose track of them.
_OPEN, _CLOSE = "\ue000", "\ue001"
_MARKERS = re.compile(f"[{_OPEN}{_CLOSE}]")

_REFS_AND_COMMENTS = re.compile(
    r"<!--.*?(?:-->|\Z)|<ref(?:\s[^<>]*)?/>|<ref(?:\s[^<>]*)?>.*?</ref\s*>", re.DOTALL | re.IGNORECASE
)
_BRACES = re.compile(r"\{\{|\}\}|\{\||\|\}")
# Clean-up of the rendered text, in this order (`_clean_up` applies it; the patterns are its specification):
_CLEANUPS = [
    (re.compile(r"''+"), ""),  # bold/italic quotes (2+): parsed with skip_style_tags (faster), removed here
    # runs of spaces -> one space (a lone " " is left alone: same result, much less work)
    (re.compile(r" [ \t\u00a0\u2009\u200b]+|[\t\u00a0\u2009\u200b][ \t\u00a0\u2009\u200b]*"), " "),
    (re.compile(r"\((?: *[,;:] *)*\)"), ""),  # "( ; born 1950)" leftovers of dropped templates
    (re.compile(r"\((?: *[,;:])+ *"), "("),  # "(; 26 July 1894" after a dropped pronunciation template
    (re.compile(r"\( +"), "("),
    (re.compile(r" +([,.;:!?)])"), r"\1"),
    (re.compile(r" *\n[ \n]*"), "\n"),
]
_ODD_SPACES = ("\t", "\u00a0", "\u2009", "\u200b")


_NEWLINE_RUN = re.compile(r"\n[ \n]*")
_SPACED_PUNCTUATION = [(" " + mark, mark) for mark in ",.;:!?)"]


def _clean_up(text: str) -> str:
    """`_CLEANUPS`, with `str.replace` where the patterns would be tried at every space: runs of spaces are
    collapsed first, and while the text holds single spaces only, a space before punctuation or a newline is
    one space (`re` tries ` +` and ` *` at every position; most spaces are single)."""
    text = _CLEANUPS[0][0].sub("", text)
    for space in _ODD_SPACES:
        if space in text:
            text = text.replace(space, " ")
    while "  " in text:
        text = text.replace("  ", " ")
    if "(" in text:
        for pattern, replacement in _CLEANUPS[2:5]:
            text = pattern.sub(replacement, text)
        if "  " in text:  # left by an emptied "( ; )": the patterns as they are
            for pattern, replacement in _CLEANUPS[5:]:
                text = pattern.sub(replacement, text)
            return text
    for spaced, mark in _SPACED_PUNCTUATION:
        if spaced in text:
            text = text.replace(spaced, mark)
    if "\n" in text:
        # " *\n[ \n]*" -> "\n" is: drop the space before each newline, then collapse newline runs
        text = text.replace(" \n", "\n")
        if "\n\n" in text or "\n " in text:
            text = _NEWLINE_RUN.sub("\n", text)
    return text


def normalize_title(title: str) -> str:
    """MediaWiki title normalisation: underscores are spaces, runs of spaces collapse, the first letter is
    upper case ("first-letter" case), surrounding space and a `#section` part are removed."""
    title = title.split("#", 1)[0].replace("_", " ")
    title = " ".join(title.split())
    if title[:1].islower():
        title = title[0].upper() + title[1:]
    return title


class Link(NamedTuple):
    start: int  # character offsets into the plain text: text[start:end] == anchor
    end: int
    anchor: str
    target: str  # normalised title, before redirect resolution


@dataclass
class WikiPage:
    page_id: int
    title: str | None
    namespace: int
    text: str | None
    redirect: str | None = None  # normalised target title when the page is a redirect


@dataclass
class ParsedPage:
    page_id: int
    title: str
    text: str = ""
    links: list[Link] = field(default_factory=list)
    redirect: str | None = None


# --- reading the XML -----------------------------------------------------------------------------------------


def open_dump(path: str | os.PathLike):
    """Opens a dump as a binary stream, decompressing `.bz2` on the fly (`open_bz2`: in a background thread, so
    that decompression overlaps with the XML parsing that reads the stream)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"dump file {path} does not exist")
    if path.endswith(".bz2"):
        return open_bz2(path)
    return open(path, "rb")


def iter_pages(
    path: str | os.PathLike,
    namespaces: Iterable[int] | None = (0,),
    shard_index: int = 0,
    num_shards: int = 1,
) -> Iterator[WikiPage]:
    """Streams the pages of a dump (latest revision of each), one at a time.

    `shard_index`/`num_shards` keep every `num_shards`-th page (by position in the file), so that several
    processes can share one dump file. Raises `DumpFormatError` when the file is not a readable dump.
    """
    if not 0 <= shard_index < num_shards:
        raise ValueError(f"shard_index={shard_index} must be in [0, num_shards={num_shards})")
    namespaces = None if namespaces is None else set(namespaces)
    path = os.fspath(path)
    with open_dump(path) as stream:
        try:
            dump = mwxml.Dump.from_file(stream)
            for position, page in enumerate(dump):
                if position % num_shards != shard_index:
                    continue
                if namespaces is not None and page.namespace not in namespaces:
                    continue
                text = None
                for revision in page:  # pages-articles dumps hold one revision; keep the last
                    text = revision.text
                title = normalize_title(page.title) if page.title else None
                redirect = page.redirect
                if redirect is None and text:
                    match = _REDIRECT_TEXT.match(text)
                    redirect = match.group(1) if match else None
                redirect = normalize_title(redirect) if redirect else None
                yield WikiPage(
                    page_id=int(page.id), title=title, namespace=page.namespace, text=text, redirect=redirect
                )
        except (ElementTree.ParseError, MalformedXML, EOFError, OSError) as err:
            raise DumpFormatError(f"{path} is not a readable MediaWiki XML dump: {err}") from err
        except (KeyError, AttributeError, TypeError, ValueError) as err:
            if isinstance(err, DumpFormatError | MalformedPageError):
                raise
            raise DumpFormatError(f"{path} does not look like a MediaWiki XML export: {err!r}") from err


def parse_page(page: WikiPage) -> ParsedPage:
    """Plain text and links of one page; raises `MalformedPageError` naming the page when it is unusable."""
    if not page.title:
        raise MalformedPageError(f"page id {page.page_id}: no title")
    if page.redirect:
        return ParsedPage(page.page_id, page.title, redirect=page.redirect)
    if page.text is None:
        raise MalformedPageError(f"page {page.title!r} (id {page.page_id}): no text")
    try:
        text, links = parse_wikitext(page.text)
    except Exception as err:  # mwparserfromhell is tolerant; anything raised here means a page we cannot trust
        raise MalformedPageError(f"page {page.title!r} (id {page.page_id}): wikitext does not parse: {err!r}") from err
    return ParsedPage(page.page_id, page.title, text, links)


def iter_parsed_pages(path: str | os.PathLike, strict: bool = False) -> Iterator[ParsedPage]:
    """Parsed articles and redirects of a dump; malformed pages are skipped with a warning (raised if strict)."""
    for page in iter_pages(path):
        try:
            yield parse_page(page)
        except MalformedPageError as err:
            if strict:
                raise
            logger.warning("skipping malformed page: %s", err)


# --- wikitext -> plain text + links ---------------------------------------------------------------------------


def strip_references_and_templates(wikitext: str) -> str | None:
    """Removes comments, `<ref>`s, templates and tables with a linear scan; None when braces do not balance."""
    wikitext = _REFS_AND_COMMENTS.sub("", wikitext)
    if "{" not in wikitext:
        return wikitext
    pieces: list[str] = []
    depth = 0
    kept_from = 0
    for match in _BRACES.finditer(wikitext):
        token = match.group()
        if token[0] == "{":
            if depth == 0:
                pieces.append(wikitext[kept_from : match.start()])
            depth += 1
        elif depth > 0:
            depth -= 1
            if depth == 0:
                kept_from = match.end()
        elif token == "}}":
            return None  # a closing pair without an opening one
    if depth:
        return None
    pieces.append(wikitext[kept_from:])
    return "".join(pieces)


def parse_wikitext(wikitext: str, fast: bool = True) -> tuple[str, list[Link]]:
    """Plain text of an article and its entity links (anchor offsets into that text, normalised targets).

    Dropped: templates, tables, references, comments, files/images, categories, interlanguage links and the
    trailing reference/link sections. Kept: text, link anchors (with enwiki's link trail: `[[bus]]es` is one
    anchor "buses"), section headings as lines, the text of external links.

    The wikitext is tokenised by mwparserfromhell's C tokenizer. With `fast` (the default), the token stream
    is rendered directly (`_render_tokens`), without building mwparserfromhell's node tree (the Python
    `Builder` is most of `mwparserfromhell.parse`'s time); a page whose tokens hold anything that path does
    not render exactly like the node tree (see `_TokenFallback`) is rendered from the node tree instead.
    `fast=False` always renders the node tree (the reference; both give identical results).
    """
    wikitext = wikitext.replace(_OPEN, "").replace(_CLOSE, "")
    stripped = strip_references_and_templates(wikitext)
    source = stripped if stripped is not None else wikitext
    out: list[str] = []
    targets: list[str] = []
    rendered = False
    if fast and _TOKENIZER is not None:
        try:
            token_list = _TOKENIZER().tokenize(source, 0, True)
            token_list.reverse()
            nodes = _token_nodes(token_list, (), [None])
            if token_list:
                raise _TokenFallback("tokens left over")
            _render_lite(nodes, out, targets, allow_links=True)
            rendered = True
        except (_TokenFallback, IndexError, KeyError):
            out, targets = [], []
    if not rendered:
        code = mwparserfromhell.parse(source, skip_style_tags=True)
        _render(code.nodes, out, targets, allow_links=True)
    return _unmark(_clean_up("".join(out)).strip(), targets)


def _unmark(marked: str, targets: list[str]) -> tuple[str, list[Link]]:
    """Removes the link markers; each link's span is where its anchor ends up in the text."""
    segments = marked.split(_OPEN)
    if _CLOSE in segments[0] or len(segments) - 1 != len(targets):
        return _unmark_checked(marked, targets)
    text_parts = [segments[0]]
    links: list[Link] = []
    length = len(segments[0])
    for index, segment in enumerate(segments[1:]):
        anchor, close, rest = segment.partition(_CLOSE)
        if not close or _CLOSE in rest:
            return _unmark_checked(marked, targets)
        start = length
        length += len(anchor)
        # Cleanup may have emptied an anchor (e.g. a link whose text was only a dropped template).
        if anchor.strip():
            links.append(Link(start, length, anchor, targets[index]))
        text_parts.append(anchor)
        text_parts.append(rest)
        length += len(rest)
    return "".join(text_parts), links


def _unmark_checked(marked: str, targets: list[str]) -> tuple[str, list[Link]]:
    """`_unmark` for marker sequences that are not open/close pairs (never made by `_render`)."""
    text_parts: list[str] = []
    links: list[Link] = []
    length = 0
    position = 0
    open_at = None
    for match in _MARKERS.finditer(marked):
        piece = marked[position : match.start()]
        text_parts.append(piece)
        length += len(piece)
        position = match.end()
        if match.group() == _OPEN:
            open_at = length
        else:
            if open_at is None:
                raise ValueError("unbalanced link markers")  # a bug in _render, never the page's fault
            links.append(Link(open_at, length, "", targets[len(links)]))  # anchor filled in below
            open_at = None
    text_parts.append(marked[position:])
    text = "".join(text_parts)
    links = [Link(link.start, link.end, text[link.start : link.end], link.target) for link in links]
    # Cleanup may have emptied an anchor (e.g. a link whose text was only a dropped template).
    return text, [link for link in links if link.anchor.strip()]


def _node_plain_text(nodes) -> str:
    out: list[str] = []
    _render(nodes, out, [], allow_links=False)
    return "".join(out)


def _link_namespace(title: str) -> str | None:
    """'drop', 'text' (not an entity link, keep the anchor text) or None (an article link)."""
    if ":" not in title:
        return None
    prefix = title.split(":", 1)[0].strip()
    key = prefix.lower().replace("_", " ")
    if key in DROPPED_NAMESPACES:
        return "drop"
    if key in OTHER_NAMESPACES:
        return "text"
    if _LANGUAGE_PREFIX.match(prefix):
        return "drop"  # interlanguage link
    return None


def _append_text(out: list[str], text: str, after_link: bool) -> None:
    """Appends running text; right after a link, the link's trail (`[[Paris]]ian`) goes inside the link."""
    if after_link:
        trail = _LINK_TRAIL.match(text)
        if trail:  # out[-1] is the closing marker of the link just emitted
            out.insert(len(out) - 1, trail.group())
            text = text[trail.end() :]
    out.append(text)


def _render(nodes, out: list[str], targets: list[str], allow_links: bool) -> None:
    skip_level = 0  # > 0 while inside a skipped section (its heading level)
    pending_trail = False
    for node in nodes:
        if isinstance(node, Heading):
            if skip_level and node.level > skip_level:
                continue
            title = _node_plain_text(node.title.nodes).strip()
            skip_level = node.level if title.lower() in SKIPPED_SECTIONS else 0
            if not skip_level and title:
                out.append(f"\n{title}\n")
            continue
        if skip_level:
            continue
        if isinstance(node, Text):
            _append_text(out, node.value, after_link=pending_trail)
            pending_trail = False
            continue
        pending_trail = False
        if isinstance(node, Wikilink):
            pending_trail = _render_link(node, out, targets, allow_links)
        elif isinstance(node, Tag):
            tag = str(node.tag).strip().lower()
            if tag in DROPPED_TAGS:
                continue
            if tag in _NEWLINE_TAGS and not node.wiki_markup:
                out.append("\n")
            if node.contents is not None and not node.self_closing:
                _render(node.contents.nodes, out, targets, allow_links)
        elif isinstance(node, HTMLEntity):
            out.append(_entity_string(node))
        elif isinstance(node, ExternalLink):
            if node.title is not None:
                _render(node.title.nodes, out, targets, allow_links=False)
        elif isinstance(node, Template | Comment | Argument):
            continue
        # Any other node type (none today) is dropped rather than risk markup in the text.


def _emit_link(
    anchor: str, target: str, kind: str | None, out: list[str], targets: list[str], allow_links: bool
) -> bool:
    """Writes a link's anchor (marked as a link when it is one); True when a link trail may follow it.

    Shared by the node-tree and the fast renderer so that both mark links identically.
    """
    if kind is not None or not target or not allow_links:
        out.append(anchor)
        return False
    leading = anchor[: len(anchor) - len(anchor.lstrip())]
    trailing = anchor[len(anchor.rstrip()) :]
    anchor = anchor.strip()
    if not anchor:
        out.append(leading + trailing)
        return False
    out.extend([leading, _OPEN, anchor, _CLOSE])
    targets.append(target)
    if trailing:
        out.append(trailing)
        return False
    return True


def _entity_string(node: HTMLEntity) -> str:
    """The character a reference stands for, or the reference as written when it names none."""
    try:
        return node.normalize()
    except ValueError:
        return str(node)


def _title_source(nodes) -> str:
    """A link title's text with its character references decoded, as MediaWiki reads it (`[[OS&nbsp;X]]` is a
    link to "OS X"); any other markup is kept as written."""
    return "".join(_entity_string(node) if isinstance(node, HTMLEntity) else str(node) for node in nodes)


def _render_link(node: Wikilink, out: list[str], targets: list[str], allow_links: bool) -> bool:
    """Renders one wikilink; returns True when it opened a link whose trail may follow."""
    raw_title = _title_source(node.title.nodes).strip()
    leading_colon = raw_title.startswith(":")
    if leading_colon:
        raw_title = raw_title[1:].strip()
    kind = _link_namespace(raw_title)
    if kind == "drop" and not leading_colon:
        return False
    if node.text is not None:
        anchor = _node_plain_text(node.text.nodes)
    else:
        anchor = raw_title
    target = normalize_title(raw_title)
    return _emit_link(anchor, target, kind, out, targets, allow_links)


# --- the fast path: rendering mwparserfromhell's token stream without its node tree -------------------------
#
# `_token_nodes` mirrors `mwparserfromhell.parser.builder.Builder` (same recursion over the same tokens) but
# builds light nodes holding only what `_render` reads; `_render_lite` mirrors `_render` on them. Light nodes:
#   str                                   Text
#   (_HEADING, level, title_nodes)        Heading
#   (_LINK, title_str, text_nodes|None)   Wikilink (title made of text only, else fallback)
#   (_TAG, name, wiki_markup, contents|None, self_closing)   Tag (name made of text only, else fallback)
#   (_ENTITY, rendered_str)               HTMLEntity
#   (_EXTERNAL, title_nodes|None)         ExternalLink
#   _SKIPPED                              Template, Argument, Comment (rendered as nothing)

try:
    from mwparserfromhell.parser import tokens as _tokens
    from mwparserfromhell.parser._tokenizer import CTokenizer as _CTokenizer

    _TOKENIZER = _CTokenizer
except ImportError:  # no C tokenizer (pure-Python mwparserfromhell): always the node tree
    _TOKENIZER = None


class _TokenFallback(Exception):
    """The token stream holds something the fast path does not render exactly like the node tree."""


_HEADING, _LINK, _TAG, _ENTITY, _EXTERNAL = range(5)
_SKIPPED = ("skipped",)


def _skip_until(token_list: list, open_type, close_type) -> None:
    depth = 1
    while True:
        kind = type(token_list.pop())
        if kind is open_type:
            depth += 1
        elif kind is close_type:
            depth -= 1
            if depth == 0:
                return


def _text_only(nodes: list) -> str:
    if all(type(node) is str for node in nodes):
        return "".join(nodes)
    raise _TokenFallback("markup where plain text was expected")


def _title_text(nodes: list) -> str:
    """`_title_source` of light nodes: text and character references only, else the node tree decides."""
    if all(type(node) is str or node[0] == _ENTITY for node in nodes):
        return "".join(node if type(node) is str else node[1] for node in nodes)
    raise _TokenFallback("markup in a link title")


def _token_nodes(token_list: list, stop: tuple, last: list) -> list:
    """Light nodes until a token of a type in `stop` (popped and put in `last[0]` for the caller)."""
    nodes: list = []
    while token_list:
        token = token_list.pop()
        kind = type(token)
        if kind is _T_TEXT:
            nodes.append(token["text"])
        elif kind in stop:
            last[0] = token
            return nodes
        elif kind is _T_LINK_OPEN:
            # the common shapes, [[title]] and [[title|text]] with plain text, without recursing
            if len(token_list) >= 2 and type(token_list[-1]) is _T_TEXT:
                following = type(token_list[-2])
                if following is _T_LINK_CLOSE:
                    title = token_list.pop()["text"]
                    token_list.pop()
                    nodes.append((_LINK, title, None))
                    continue
                if (
                    following is _T_LINK_SEP
                    and len(token_list) >= 4
                    and type(token_list[-3]) is _T_TEXT
                    and type(token_list[-4]) is _T_LINK_CLOSE
                ):
                    title = token_list.pop()["text"]
                    token_list.pop()
                    text = token_list.pop()["text"]
                    token_list.pop()
                    nodes.append((_LINK, title, [text]))
                    continue
            title = _token_nodes(token_list, (_T_LINK_SEP, _T_LINK_CLOSE), last)
            text = None
            if type(last[0]) is _T_LINK_SEP:
                text = _token_nodes(token_list, (_T_LINK_CLOSE, _T_LINK_SEP), last)
                if type(last[0]) is _T_LINK_SEP:
                    raise _TokenFallback("second link separator")
            nodes.append((_LINK, _title_text(title), text))
        elif kind is _tokens.TemplateOpen:
            _skip_until(token_list, _tokens.TemplateOpen, _tokens.TemplateClose)
            nodes.append(_SKIPPED)
        elif kind is _tokens.CommentStart:
            _skip_until(token_list, _tokens.CommentStart, _tokens.CommentEnd)
            nodes.append(_SKIPPED)
        elif kind is _tokens.ArgumentOpen:
            _skip_until(token_list, _tokens.ArgumentOpen, _tokens.ArgumentClose)
            nodes.append(_SKIPPED)
        elif kind is _tokens.HeadingStart:
            title = _token_nodes(token_list, (_tokens.HeadingEnd,), last)
            nodes.append((_HEADING, token["level"], title))
        elif kind is _tokens.TagOpenOpen:
            nodes.append(_tag_node(token_list, token, last))
        elif kind is _tokens.HTMLEntityStart:
            nodes.append((_ENTITY, _entity_text(token_list)))
        elif kind is _tokens.ExternalLinkOpen:
            _token_nodes(token_list, (_tokens.ExternalLinkSeparator, _tokens.ExternalLinkClose), last)  # the URL
            title = None
            if type(last[0]) is _tokens.ExternalLinkSeparator:
                title = _token_nodes(token_list, (_tokens.ExternalLinkClose, _tokens.ExternalLinkSeparator), last)
                if type(last[0]) is not _tokens.ExternalLinkClose:
                    raise _TokenFallback("second external link separator")
            nodes.append((_EXTERNAL, title))
        else:
            raise _TokenFallback(f"unexpected {kind.__name__}")
    if stop:
        raise _TokenFallback("missing close token")
    return nodes


def _tag_node(token_list: list, open_token, last: list) -> tuple:
    wiki_markup = open_token.get("wiki_markup")
    stops = (
        _tokens.TagAttrStart,
        _tokens.TagCloseOpen,
        _tokens.TagCloseSelfclose,
        _tokens.TagOpenClose,
        _tokens.TagCloseClose,
    )
    name = None
    contents = None
    current = _token_nodes(token_list, stops, last)
    while True:
        kind = type(last[0])
        if kind is _tokens.TagAttrStart:
            if name is not None:
                raise _TokenFallback("attribute after the tag name was closed")
            name_nodes = current
            # an attribute runs to the next attribute or the end of the opening tag; its value is not rendered
            _token_nodes(token_list, (_tokens.TagAttrEquals, _tokens.TagAttrQuote, *stops), last)
            while type(last[0]) in (_tokens.TagAttrEquals, _tokens.TagAttrQuote):
                _token_nodes(token_list, (_tokens.TagAttrEquals, _tokens.TagAttrQuote, *stops), last)
            if type(last[0]) in (_tokens.TagOpenClose, _tokens.TagCloseClose):
                raise _TokenFallback("tag ended inside an attribute")
            current = name_nodes  # attributes do not add to the name
            continue
        if kind is _tokens.TagCloseOpen:
            if name is not None:
                raise _TokenFallback("second tag close-open")
            name = _text_only(current)
            contents = _token_nodes(token_list, stops, last)
            if type(last[0]) is not _tokens.TagOpenClose:
                raise _TokenFallback("tag contents not closed")
            _token_nodes(token_list, (_tokens.TagCloseClose,), last)  # the closing tag's name
            return (_TAG, name, wiki_markup, contents, False)
        if kind is _tokens.TagCloseSelfclose:
            if name is not None:
                raise _TokenFallback("self-closing after close-open")
            return (_TAG, _text_only(current), wiki_markup, None, True)
        raise _TokenFallback(f"unexpected {kind.__name__} in a tag")


def _entity_text(token_list: list) -> str:
    token = token_list.pop()
    try:
        if type(token) is _tokens.HTMLEntityNumeric:
            token = token_list.pop()
            if type(token) is _tokens.HTMLEntityHex:
                text = token_list.pop()
                node = HTMLEntity(text["text"], named=False, hexadecimal=True, hex_char=token["char"])
            else:
                node = HTMLEntity(token["text"], named=False, hexadecimal=False)
        else:
            node = HTMLEntity(token["text"], named=True, hexadecimal=False)
    except Exception as err:  # the node tree path meets it too: let it decide
        raise _TokenFallback(repr(err)) from None
    if type(token_list.pop()) is not _tokens.HTMLEntityEnd:
        raise _TokenFallback("entity not ended")
    try:
        return _entity_string(node)
    except Exception as err:  # the node tree path raises it (the page is malformed)
        raise _TokenFallback(repr(err)) from None


if _TOKENIZER is not None:
    _T_TEXT = _tokens.Text
    _T_LINK_OPEN, _T_LINK_SEP, _T_LINK_CLOSE = _tokens.WikilinkOpen, _tokens.WikilinkSeparator, _tokens.WikilinkClose


def _lite_plain_text(nodes: list) -> str:
    out: list[str] = []
    _render_lite(nodes, out, [], allow_links=False)
    return "".join(out)


def _render_lite(nodes: list, out: list[str], targets: list[str], allow_links: bool) -> None:
    """`_render` on light nodes."""
    skip_level = 0
    pending_trail = False
    for node in nodes:
        if type(node) is str:
            if skip_level:
                continue
            _append_text(out, node, after_link=pending_trail)
            pending_trail = False
            continue
        kind = node[0] if node is not _SKIPPED else None
        if kind == _HEADING:
            if skip_level and node[1] > skip_level:
                continue
            title = _lite_plain_text(node[2]).strip()
            skip_level = node[1] if title.lower() in SKIPPED_SECTIONS else 0
            if not skip_level and title:
                out.append(f"\n{title}\n")
            continue
        if skip_level:
            continue
        pending_trail = False
        if kind == _LINK:
            pending_trail = _render_lite_link(node, out, targets, allow_links)
        elif kind == _TAG:
            _, name, wiki_markup, contents, self_closing = node
            tag = name.strip().lower()
            if tag in DROPPED_TAGS:
                continue
            if tag in _NEWLINE_TAGS and not wiki_markup:
                out.append("\n")
            if contents is not None and not self_closing:
                _render_lite(contents, out, targets, allow_links)
        elif kind == _ENTITY:
            out.append(node[1])
        elif kind == _EXTERNAL:
            if node[1] is not None:
                _render_lite(node[1], out, targets, allow_links=False)


_LINK_TITLES: dict[str, tuple[str, str | None, bool, str]] = {}  # title -> what _render_link works out from it


def _link_title(title: str) -> tuple[str, str | None, bool, str]:
    """(raw title, namespace kind, leading colon, normalised target) of a link title, as `_render_link` has them."""
    known = _LINK_TITLES.get(title)
    if known is None:
        raw_title = title.strip()
        leading_colon = raw_title.startswith(":")
        if leading_colon:
            raw_title = raw_title[1:].strip()
        known = (raw_title, _link_namespace(raw_title), leading_colon, normalize_title(raw_title))
        if len(_LINK_TITLES) >= 200_000:
            _LINK_TITLES.clear()  # bounded: memory stays flat on a whole dump
        _LINK_TITLES[title] = known
    return known


def _render_lite_link(node: tuple, out: list[str], targets: list[str], allow_links: bool) -> bool:
    """`_render_link` on a light node."""
    _, title, text = node
    raw_title, kind, leading_colon, target = _link_title(title)
    if kind == "drop" and not leading_colon:
        return False
    if text is None:
        anchor = raw_title
    elif len(text) == 1 and type(text[0]) is str:
        anchor = text[0]  # what rendering a single text node gives
    else:
        anchor = _lite_plain_text(text)
    return _emit_link(anchor, target, kind, out, targets, allow_links)

"""The fast path of marked tokenisation for byte-level BPE tokenizers: each text tokenised whole with a Python
word splitter and a word table, markers put in afterwards; held equal to `marked_tokenization` by tests."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence

import numpy as np
import regex
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerBase

from .marked_tokenization import MarkedTokens, marked_tokens, mention_cuts
from .mention_labels import Mention

# GPT-2's pre-tokenisation pattern, as the `tokenizers` ByteLevel pre-tokenizer applies it (use_regex=True).
_BYTE_LEVEL_WORDS = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# The same on ASCII text, for `re` (twice as fast as `regex` there): letters, digits and Unicode White_Space
# spelled out (`re`'s `\s` also matches \x1c-\x1f, which are not White_Space).
_ASCII_SPACE = r"\t\n\x0b\x0c\r "
_ASCII_BYTE_LEVEL_WORDS = (
    rf"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^{_ASCII_SPACE}A-Za-z0-9]+"""
    rf"""|[{_ASCII_SPACE}]+(?![^{_ASCII_SPACE}])|[{_ASCII_SPACE}]+"""
)
# A newline between two non-space characters (`re`'s `\s` is a superset of the pattern's: never a wrong split).
# Spelled newline first, so that `re` scans for the newline instead of trying the look-behind at every character.
_LONE_NEWLINE = re.compile(r"\n(?<=\S\n)(?=\S)")


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (`tokenizers`' ByteLevel alphabet), keyed by Latin-1 code point."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1), *range(ord("\u00ae"), 256)]
    shifted = 0
    table = {}
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + shifted)
            shifted += 1
    return table


_BYTE_TO_UNICODE = _byte_to_unicode()


class _WordTable(dict):
    """Pre-tokenised word -> its row in flat arrays (its token ids, their count, its length in characters), so that
    a text's ids are gathered with numpy instead of joined as Python lists. A missed word goes through the BPE
    model (on its byte-level form, what the ByteLevel pre-tokenizer hands the model); new rows wait in Python
    lists until `arrays()` writes them into the arrays (a numpy write per word would cost more than the lookup)."""

    def __init__(self, model: BPE):
        super().__init__()
        self.tokenize = model.tokenize
        self.clear()

    def clear(self) -> None:
        super().clear()
        self.flat = np.zeros(1 << 16, dtype=np.int32)  # every row's token ids, one after another
        self.rows = np.zeros((1 << 14, 3), dtype=np.int64)  # per row: where its ids start in `flat`, how many, chars
        self.written = self.size = 0  # rows and ids in the arrays
        self.new_ids: list[int] = []
        self.new_rows: list[tuple[int, int, int]] = []

    def __missing__(self, word: str) -> int:
        ids = [token.id for token in self.tokenize(word.encode().decode("latin-1").translate(_BYTE_TO_UNICODE))]
        self.new_rows.append((self.size + len(self.new_ids), len(ids), len(word)))
        self.new_ids += ids
        row = self[word] = len(self)
        return row

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """`flat` and `rows`, with every row looked up so far."""
        if self.new_rows:
            rows, size = self.written + len(self.new_rows), self.size + len(self.new_ids)
            if rows > len(self.rows):
                self.rows = np.resize(self.rows, (max(2 * len(self.rows), rows), 3))
            if size > len(self.flat):
                self.flat = np.resize(self.flat, max(2 * len(self.flat), size))
            self.rows[self.written : rows] = self.new_rows
            self.flat[self.size : size] = self.new_ids
            self.written, self.size = rows, size
            self.new_rows, self.new_ids = [], []
        return self.flat, self.rows


class ByteLevelWordEncoder:
    """A whole text's token ids, the same as the tokenizer's backend gives, and where each token's word starts.

    The Rust ByteLevel pre-tokenizer (with its offset bookkeeping) is most of the backend's encoding time. A
    byte-level BPE encodes each pre-tokenised word independently, so the words are split here with the same
    pattern and each distinct word is encoded once (by the Rust BPE model) and kept in a bounded word table.
    Make one with `for_tokenizer`, which returns None for tokenizers of any other kind.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, max_cache_words: int = 300_000):
        self.backend = tokenizer.backend_tokenizer
        self.max_cache_words = max_cache_words
        self.table = _WordTable(self.backend.model)
        self.words = regex.compile(_BYTE_LEVEL_WORDS)
        self.ascii_words = re.compile(_ASCII_BYTE_LEVEL_WORDS)
        contents = sorted(
            {token.content for token in self.backend.get_added_tokens_decoder().values() if token.content}
        )
        self.added = re.compile("|".join(map(re.escape, contents))) if contents else None

    @classmethod
    def for_tokenizer(cls, tokenizer: PreTrainedTokenizerBase) -> ByteLevelWordEncoder | None:
        """An encoder for a byte-level BPE tokenizer (`tokenizers` ByteLevel + BPE, as trained here or BART's);
        None for any other tokenizer."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            return None
        # what the words' ids depend on, read from the parts (not the whole tokenizer's JSON: vocabulary and merges)
        pre_tokenizer = backend.pre_tokenizer
        pre = json.loads(pre_tokenizer.__getstate__()) if pre_tokenizer is not None else {}
        if (
            backend.normalizer is not None
            or pre.get("type") != "ByteLevel"
            or pre.get("add_prefix_space")
            or not pre.get("use_regex", True)
            or not isinstance(backend.model, BPE)
            or backend.model.dropout
        ):
            return None
        return cls(tokenizer)

    def _split_words(self, text: str) -> list[str]:
        """The words of `text`: `re` with the ASCII pattern on ASCII lines, else `regex`. A text is split into lines
        only at a newline between two non-space characters: there the newline is a word of its own and the words
        on either side do not depend on the other side."""
        if text.isascii():
            return self.ascii_words.findall(text)
        if "\n" not in text:
            return self.words.findall(text)
        words: list[str] = []
        for index, line in enumerate(_LONE_NEWLINE.split(text)):
            if index:
                words.append("\n")
            words += self.ascii_words.findall(line) if line.isascii() else self.words.findall(line)
        return words

    def encode_words(self, text: str) -> tuple[np.ndarray, np.ndarray] | None:
        """Token ids of a whole text and, for each token, the character offset where its word starts (both int32);
        None where the text holds an added token's text (`<mask>`): the backend splits those out first."""
        if self.added is not None and self.added.search(text):
            return None
        if len(self.table) > self.max_cache_words:  # a few hundred bytes a word: memory stays flat on a whole dump
            self.table.clear()
        words = self._split_words(text)
        table = self.table
        rows = np.fromiter(map(table.__getitem__, words), dtype=np.int64, count=len(words))
        flat, row_data = table.arrays()
        offsets, lengths, chars = row_data[rows].T
        ends = np.cumsum(lengths)
        # token k of word w is flat[offsets[w] + k]: one arange, shifted per word
        gather = np.arange(int(ends[-1]) if len(ends) else 0) + np.repeat(offsets - ends + lengths, lengths)
        return flat[gather], np.repeat(np.cumsum(chars) - chars, lengths).astype(np.int32)

    def piece_ids(self, piece: str) -> list[int]:
        """Token ids of a piece of text, from the backend (for the few pieces `insert_mention_markers` cannot take
        from the whole text's tokens)."""
        return self.backend.encode(piece, add_special_tokens=False).ids


def insert_mention_markers(
    text: str,
    ids: np.ndarray,
    token_starts: np.ndarray,
    mentions: Sequence[Mention],
    start_id: int,
    end_id: int,
    encode_piece: Callable[[str], list[int]],
) -> MarkedTokens | None:
    """`tokenize_with_mentions` from the whole text's tokens (`ByteLevelWordEncoder.encode_words`: ids and the
    character offset of each token's word), tokenising again only where the result would differ; None for
    overlapping or unsorted mentions.

    The reference cuts the text into pieces (a mention's piece starts at the space before it) and tokenises each
    piece alone. A piece gets the whole text's words exactly when both its ends are word starts of the whole
    text and it does not end in two or more whitespace characters (alone, such a piece keeps its trailing
    whitespace as one word; within the text the last character is a word of its own). Other pieces, such as a
    mention "D.C." followed by a comma (the whole text has the word ".,"), go to `encode_piece`.
    """
    cuts = mention_cuts(text, mentions)
    if cuts is None:
        return None
    if not cuts:
        return marked_tokens(ids, (), ())
    text_end = len(text)
    cuts_array = np.array(cuts, dtype=np.int64)
    at = np.searchsorted(token_starts, cuts_array)
    aligned = cuts_array == text_end  # past the last word: only the end of the text
    if len(token_starts):
        aligned |= (at < len(token_starts)) & (token_starts[np.minimum(at, len(token_starts) - 1)] == cuts_array)
    ends_in_spaces = [2 <= cut < text_end and text[cut - 1].isspace() and text[cut - 2].isspace() for cut in cuts]
    if aligned.all() and not any(ends_in_spaces):  # one vectorised insertion
        marked = np.insert(ids, at, np.tile(np.array([start_id, end_id], dtype=ids.dtype), len(mentions)))
        return marked_tokens(marked, mentions, at + np.arange(len(at)))  # the markers' positions in `marked`
    # piece by piece, the whole text's tokens where a piece's ends allow
    words = ids.tolist()
    token_at, is_aligned = at.tolist(), aligned.tolist()
    marked, positions = [], []
    previous = 0  # the cut that ends the previous piece (the text's start: aligned, index 0)
    previous_aligned, previous_at = True, 0
    for index, cut in enumerate(cuts + [text_end]):
        last = index == len(cuts)
        cut_aligned = True if last else is_aligned[index]
        cut_at = len(words) if last else token_at[index]
        if cut > previous or index % 2 == 1:  # a gap before a mention may be empty, a mention not
            if previous_aligned and cut_aligned and (last or not ends_in_spaces[index]):
                marked += words[previous_at:cut_at]
            else:
                marked += encode_piece(text[previous:cut])
        if not last:
            positions.append(len(marked))
            marked.append(start_id if index % 2 == 0 else end_id)
        previous, previous_aligned, previous_at = cut, cut_aligned, cut_at
    return marked_tokens(marked, mentions, positions)


__all__ = ["ByteLevelWordEncoder", "insert_mention_markers"]

"""Byte-level BPE tokenizer with EDMem's mention markers `<E_s>` and `<E_e>` (added special tokens)."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from .arguments import CommandArgumentParser
from .configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN

logger = logging.getLogger(__name__)

BOS_TOKEN, PAD_TOKEN, EOS_TOKEN, UNK_TOKEN, MASK_TOKEN = "<s>", "<pad>", "</s>", "<unk>", "<mask>"
# Order fixes the ids: <s>=0, <pad>=1, </s>=2, <unk>=3 (as in BART), then <mask>, <E_s>, <E_e>.
SPECIAL_TOKENS = [BOS_TOKEN, PAD_TOKEN, EOS_TOKEN, UNK_TOKEN, MASK_TOKEN, ENTITY_START_TOKEN, ENTITY_END_TOKEN]
DEFAULT_VOCAB_SIZE = 50265  # BART's


def _marker(token: str) -> AddedToken:
    # lstrip: the space before a marker belongs to the marker, the space after it to the next word, so that
    # "born in <E_s> Paris <E_e>." tokenises as `in`, `<E_s>`, `ĠParis`, `<E_e>`, `.`: the name keeps the leading
    # space it has in running text (byte-level BPE spells " Paris" and "Paris" differently) and each marker costs
    # exactly one token.
    return AddedToken(token, lstrip=True, rstrip=False, normalized=False, special=True)


def _wrap(tokenizer_object: Tokenizer) -> PreTrainedTokenizerFast:
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer_object,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        pad_token=PAD_TOKEN,
        cls_token=BOS_TOKEN,
        sep_token=EOS_TOKEN,
        mask_token=_marker(MASK_TOKEN),
        extra_special_tokens=[_marker(ENTITY_START_TOKEN), _marker(ENTITY_END_TOKEN)],
        model_max_length=1024,
    )
    return tokenizer


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    min_frequency: int = 2,
    show_progress: bool = False,
) -> PreTrainedTokenizerFast:
    """Trains a BART-style byte-level BPE on `texts` (any iterable, consumed once, never held in memory).

    Specials get ids 0..6 in the order of `SPECIAL_TOKENS`; encoding adds `<s> ... </s>`.
    """
    if vocab_size < len(SPECIAL_TOKENS) + 256:
        raise ValueError(f"vocab_size={vocab_size} is too small: byte-level BPE needs at least 256 + 7 entries")
    backend = Tokenizer(models.BPE(unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[
            _marker(t) if t in (MASK_TOKEN, ENTITY_START_TOKEN, ENTITY_END_TOKEN) else t for t in SPECIAL_TOKENS
        ],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    backend.post_processor = processors.RobertaProcessing(
        (EOS_TOKEN, backend.token_to_id(EOS_TOKEN)),
        (BOS_TOKEN, backend.token_to_id(BOS_TOKEN)),
        add_prefix_space=False,
        trim_offsets=True,
    )
    for expected_id, token in enumerate(SPECIAL_TOKENS):
        if backend.token_to_id(token) != expected_id:  # never expected; a wrong id would corrupt every corpus
            raise RuntimeError(f"tokenizer training put {token} at id {backend.token_to_id(token)}, not {expected_id}")
    return _wrap(backend)


def extend_tokenizer(path_or_tokenizer: str | os.PathLike | PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Adds `<E_s>`, `<E_e>` (and a `<mask>` if there is no mask token) to an existing tokenizer.

    Loads a local directory only (never downloads). Tokens already present are kept with their ids, so
    extending an EDMem tokenizer is a no-op. New ids come after the existing vocabulary: resize the model's
    embeddings afterwards.
    """
    if isinstance(path_or_tokenizer, PreTrainedTokenizerBase):
        tokenizer = path_or_tokenizer
    else:
        path = os.fspath(path_or_tokenizer)
        if not os.path.isdir(path):
            raise FileNotFoundError(f"tokenizer directory {path!r} does not exist (only local directories are read)")
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except Exception as err:
            raise ValueError(f"tokenizer directory {path!r} could not be loaded: {err}") from err
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:  # a look-up per token, not the whole vocabulary as a dict (50K entries for BART)
        in_vocab = [backend.token_to_id(t) is not None for t in (ENTITY_START_TOKEN, ENTITY_END_TOKEN)]
    else:
        vocab = tokenizer.get_vocab()
        in_vocab = [t in vocab for t in (ENTITY_START_TOKEN, ENTITY_END_TOKEN)]
    if tokenizer.mask_token is None:
        tokenizer.add_special_tokens({"mask_token": _marker(MASK_TOKEN)})
    special = tokenizer.all_special_tokens
    missing = [
        t for t, known in zip((ENTITY_START_TOKEN, ENTITY_END_TOKEN), in_vocab) if not known or t not in special
    ]
    if missing:
        tokenizer.add_special_tokens(
            {"extra_special_tokens": [_marker(t) for t in missing]}, replace_extra_special_tokens=False
        )
    return tokenizer


def load_tokenizer(path: str | os.PathLike) -> PreTrainedTokenizerBase:
    """Loads a local tokenizer directory and makes sure it has the EDMem markers."""
    return extend_tokenizer(path)


# --- command line ------------------------------------------------------------------------------------------


TEXT_SOURCES = (
    ".txt files (one document a line), directories of them, MediaWiki dumps (.xml, .xml.bz2) or the released task "
    "files (edmem_*.jsonl: their question and answers, or input and outputs)"
)


@dataclass
class TrainTokenizerArguments:
    out: str = field(metadata={"help": "Directory to save the tokenizer to."})
    corpus: list[str] = field(
        default_factory=list,
        metadata={"help": f"Text to train on: {TEXT_SOURCES}."},
    )
    vocab_size: int = field(default=DEFAULT_VOCAB_SIZE, metadata={"help": "BPE vocabulary size (with specials)."})
    min_frequency: int = field(default=2, metadata={"help": "Minimum pair frequency for a merge."})
    from_pretrained: str | None = field(
        default=None,
        metadata={
            "aliases": ["--from"],
            "help": "Extend this local tokenizer directory with <E_s>, <E_e> (and <mask>) instead of training.",
        },
    )


def iter_texts(sources: Iterable[str | os.PathLike]) -> Iterator[str]:
    """Streams documents from text files, directories of .txt files, MediaWiki dumps and the released task files
    (JSON lines: the texts of their fields, a space before each as fine-tuning tokenises them; never the JSON
    itself); refuses other JSON."""
    for source in sources:
        path = Path(source)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*.txt") if p.is_file())
            if not files:
                raise FileNotFoundError(f"no .txt files under {path}")
            yield from iter_texts(files)
        elif not path.exists():
            raise FileNotFoundError(f"corpus source {path} does not exist")
        elif path.name.endswith((".xml", ".xml.bz2")):
            from .dump import iter_parsed_pages

            for parsed in iter_parsed_pages(path):
                if parsed.text:
                    yield parsed.text
        elif path.suffix == ".json":
            raise ValueError(f"{path} is a JSON file, not text or a task file: give {TEXT_SOURCES}")
        elif path.suffix == ".jsonl" or _opens_with_json(path):
            from .task_features import in_running_text
            from .task_files import task_file_texts

            try:  # each with the space before it that fine-tuning tokenises it with
                yield from map(in_running_text, task_file_texts(path))
            except ValueError as err:
                raise ValueError(f"{err}: the tokenizer is trained on text, give {TEXT_SOURCES}") from None
        else:
            with open(path, encoding="utf-8") as f:
                for line in f:
                    if line.strip():
                        yield line


def _opens_with_json(path: Path) -> bool:
    """Whether the first non-blank line of a file is a JSON object (JSON lines under another name)."""
    with open(path, encoding="utf-8") as f:
        first = next((line.strip() for line in f if line.strip()), "")
    return first.startswith("{")


def cli_main(argv: list[str] | None = None) -> int:
    """`edmem train-tokenizer`: trains a tokenizer on text, or extends a pretrained one (--from)."""
    parser = CommandArgumentParser(
        TrainTokenizerArguments,
        prog="edmem train-tokenizer",
        description="Train a byte-level BPE tokenizer with the entity markers <E_s>, <E_e> and <mask> (BART's special "
        "tokens and ids) on text, or add the markers to an existing tokenizer (--from).",
    )
    (args,) = parser.parse_args_into_dataclasses(args=sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not args.from_pretrained and not args.corpus:
        parser.error("give --corpus (text to train on) or --from (a tokenizer directory to extend)")
    if args.from_pretrained:
        tokenizer = extend_tokenizer(args.from_pretrained)
    else:
        try:
            tokenizer = train_tokenizer(
                iter_texts(args.corpus), args.vocab_size, args.min_frequency, show_progress=True
            )
        except (ValueError, FileNotFoundError) as err:
            print(f"edmem train-tokenizer: error: {err}", file=sys.stderr)
            return 2
    tokenizer.save_pretrained(args.out)
    print(f"saved tokenizer ({len(tokenizer)} tokens) to {args.out}")
    return 0

"""`edmem add-entities`: new entities written into a trained model's memory, from a JSON Lines file of names and
texts (`--entities`) or the new pages of a MediaWiki dump (`--dump`), by `entity_growth.add_entities` (or
`row_fitting.fit_new_entities` with `--estimator fitted`); the grown model is saved.

A line of `--entities`: `{"name": "Ada Lovelace", "texts": ["Ada Lovelace was a mathematician.", ...],
"aliases": ["Augusta Ada King"]}` (`"text"` for one text; `aliases` optional)."""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

from ..arguments import CommandParser, missing_model
from ..configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN
from ..dump import iter_parsed_pages
from ..modeling_edmem import MODEL_WITH_HEADS
from .entity_growth import ESTIMATORS, add_entities, default_estimator
from .new_entity_text import TEXTS, new_entity_passages, other_names, own_page_sentences
from .row_fitting import fit_new_entities

# Said when rows are added to a model without a writer of entity rows: what docs/evidence.md measured of such rows.
NO_WRITER_CAUTION = (
    "caution: this model has no writer of entity rows, and rows written without one are seldom found: on "
    "docs/evidence.md's toy world the memory found people added by their mean query at 7.5 % of their questions "
    "(trained people: 96.3 %) and answered 5.8 % of them; docs/model.md, 'Entities written from text', says what "
    "does better"
)


def read_entities_file(path: str, vocab, mark: bool) -> tuple[list[str], list[list[str]], list[list[str]]]:
    """The names, texts and aliases of a JSON Lines file of new entities (`{"name", "text" or "texts", "aliases"}`);
    with `mark`, each text's first mention of the name (or an alias) marked `<E_s> ... <E_e>`, or the name put in
    front where it names neither (the mean query reads the memory's query at a marked mention). A ValueError names
    the line of a malformed record, or a name the model knows already."""
    names, texts, aliases = [], [], []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}, line {number}: not JSON ({error.msg})") from error
            given = record.get("texts", [record["text"]] if "text" in record else None)
            if not isinstance(record.get("name"), str) or not record["name"].strip() or not given:
                raise ValueError(f'{path}, line {number}: a record needs "name" and "text" or "texts"')
            if record["name"] in vocab:
                raise ValueError(f"{path}, line {number}: {record['name']!r} is an entity of the model already")
            others = list(record.get("aliases", []))
            names.append(record["name"])
            aliases.append(others)
            texts.append([_marked(text, [record["name"], *others]) if mark else text for text in given])
    if not names:
        raise ValueError(f"{path}: no entity")
    return names, texts, aliases


def _marked(text: str, spellings: list[str]) -> str:
    """`text` with its first mention of one of `spellings` marked, or the first spelling marked in front of it."""
    if ENTITY_START_TOKEN in text:
        return text
    for spelling in spellings:
        at = text.find(spelling)
        if at >= 0:
            return f"{text[:at]}{ENTITY_START_TOKEN} {spelling} {ENTITY_END_TOKEN}{text[at + len(spelling) :]}"
    return f"{ENTITY_START_TOKEN} {spellings[0]} {ENTITY_END_TOKEN} {text}"


def cli_main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="edmem add-entities", description=__doc__)
    parser.add_argument("--model", required=True, help="a trained EDMem or EncMem folder")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--entities", help='a JSON Lines file, a line an entity: {"name", "text" or "texts", "aliases"}'
    )
    source.add_argument("--dump", help="a MediaWiki XML dump (.xml or .xml.bz2) of the new pages")
    parser.add_argument("--out", required=True, help="where the grown model (and its tokenizer) is written")
    parser.add_argument("--tokenizer", help="defaults to --model")
    parser.add_argument("--batch_size", type=int, default=32,
                        help="passages encoded at once to read the memory's queries (default: 32)")  # fmt: skip
    parser.add_argument("--max_passages", type=int, default=32, help="passages (or sentences) read per entity")
    parser.add_argument("--estimator", choices=(*ESTIMATORS, "fitted"),
                        help="writer (the default for a model with a writer of entity rows): the mean of the rows it "
                             "writes from each text (--texts), no gradient step; mean_query (the default otherwise): the "
                             "scaled mean memory query at the mentions; fitted: the mean-query rows trained alone on "
                             "the pre-training objective (fit_new_entities), about 50 times slower and no better on "
                             "docs/evidence.md's toy world")  # fmt: skip
    parser.add_argument("--texts", choices=TEXTS,
                        help="writer: what rows are written from; own_sentences (the writer's default): each sentence "
                             "of the entity's own page (its passages where its page has none); passages: the text "
                             "around each of its mentions (the only choice of the other estimators)")  # fmt: skip
    parser.add_argument("--rows_apart", action=argparse.BooleanOptionalAction,
                        help="writer: also keep the row of each passage apart, each read as a row of its entity "
                             "(default: where the model was trained with a row a passage, writer_pools_texts false)")  # fmt: skip
    parser.add_argument("--fit_steps", type=int, default=300, help="fitted: optimisation steps")
    parser.add_argument("--fit_learning_rate", type=float, default=3e-2, help="fitted: Adam's learning rate")
    parser.add_argument("--negatives", type=int, default=64,
                        help="fitted: trained entities of the dump whose passages are negatives")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="fitted: seed of the batches and dropout")
    args = parser.parse_args(argv)
    for option, name in (("--model", args.model), ("--tokenizer", args.tokenizer)):
        if name is not None and (why := missing_model(name)):
            parser.error(f"{option} {name}: {why}")
    from transformers import AutoTokenizer

    from ..configuration_edmem import EDMemConfig

    model = MODEL_WITH_HEADS[EDMemConfig.from_pretrained(args.model).variant].from_pretrained(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.model)
    if model.entity_vocab is None:
        print(f"edmem add-entities: {args.model} has no entity_vocab.json", file=sys.stderr)
        return 1
    estimator = args.estimator or default_estimator(model)
    texts_from = args.texts or ("own_sentences" if estimator == "writer" else "passages")
    if texts_from == "own_sentences" and estimator != "writer":
        print(f"edmem add-entities: --texts own_sentences is the writer's; {estimator} reads marked mentions",
              file=sys.stderr)  # fmt: skip
        return 1
    aliases = without = None
    if args.entities:
        try:
            names, texts, aliases = read_entities_file(args.entities, model.entity_vocab, mark=estimator != "writer")
        except ValueError as error:
            print(f"edmem add-entities: {error}", file=sys.stderr)
            return 1
    else:
        known = [name for name in model.entity_vocab.names if name is not None]
        pages = list(iter_parsed_pages(args.dump))
        passages, without = new_entity_passages(pages, known, max_passages=args.max_passages)
        names = sorted(passages)
        sentences = own_page_sentences(pages, names, args.max_passages) if texts_from == "own_sentences" else {}
        texts = [sentences.get(name) or passages[name] for name in names]
        found = other_names(pages, names)
        aliases = [found[name] for name in names]
    if args.estimator == "fitted" and names:
        negatives = {}
        if args.dump:
            everyone, _ = new_entity_passages(pages, known=(), max_passages=4)
            trained = sorted(name for name in everyone if name in model.entity_vocab)
            chosen = random.Random(args.seed).sample(trained, min(args.negatives, len(trained)))
            negatives = {name: everyone[name] for name in chosen}
        ids = fit_new_entities(model, names, texts, tokenizer, negatives, steps=args.fit_steps,
                               learning_rate=args.fit_learning_rate, seed=args.seed)  # fmt: skip
    else:
        ids = add_entities(model, names, texts, tokenizer, estimator=estimator, rows_apart=args.rows_apart,
                           batch_size=args.batch_size, aliases=aliases)  # fmt: skip
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(f"added {len(ids)} entities (ids {ids[0]}..{ids[-1]})" if ids else "added no entity")
    if ids:
        counts = [len(t) for t in texts]
        print(f"rows written by {args.estimator or estimator}, from {min(counts)} to {max(counts)} texts an entity "
              f"({sum(counts) / len(counts):.1f} on average)")  # fmt: skip
    if ids and getattr(model, "entity_writer", None) is None:
        print(NO_WRITER_CAUTION)
    if without:
        print(f"skipped {len(without)} new pages never mentioned (first: {', '.join(without[:5])})")
    print(f"{model.config.entity_vocab_size} entities in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(cli_main())

"""`edmem add-entities`: the entities of new MediaWiki pages written into a trained model's memory, no training.

The dump is parsed as `edmem build-corpus` parses one (`dump.iter_parsed_pages`). An article whose title the model
does not know is a new entity; its passages are the text around each of its mentions, marked `<E_s> ... <E_e>`:
every link to it in the dump (through redirects) and each occurrence of its title on its own page. The rows are
computed by `model.add_entities` (docs/model.md, "New entities after training").
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable

from .configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN
from .dump import ParsedPage, iter_parsed_pages


def _marked(text: str, start: int, end: int, window: int) -> str:
    before, after = text[max(0, start - window) : start], text[end : end + window]
    return f"{before} {ENTITY_START_TOKEN} {text[start:end]} {ENTITY_END_TOKEN} {after}".strip()


def new_entity_passages(
    pages: Iterable[ParsedPage], known: Iterable[str], window: int = 200, max_passages: int = 32
) -> tuple[dict[str, list[str]], list[str]]:
    """The passages of each article whose title is not in `known`, and the new titles with no mention at all.

    Each passage is the text `window` characters either side of one mention, that mention marked; at most
    `max_passages` an entity, links first.
    """
    pages = list(pages)
    known = set(known)
    redirects = {page.title: page.redirect for page in pages if page.redirect is not None}
    new = [page for page in pages if page.redirect is None and page.title not in known]
    passages: dict[str, list[str]] = {page.title: [] for page in new}
    for page in pages:
        for link in page.links:
            target = redirects.get(link.target, link.target)
            if target in passages and len(passages[target]) < max_passages:
                passages[target].append(_marked(page.text, link.start, link.end, window))
    for page in new:
        start = page.text.find(page.title)
        while start >= 0 and len(passages[page.title]) < max_passages:
            passages[page.title].append(_marked(page.text, start, start + len(page.title), window))
            start = page.text.find(page.title, start + len(page.title))
    without = [title for title, texts in passages.items() if not texts]
    return {title: texts for title, texts in passages.items() if texts}, without


def cli_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edmem add-entities", description=__doc__)
    parser.add_argument("--model", required=True, help="a trained EDMem or EncMem folder")
    parser.add_argument("--dump", required=True, help="a MediaWiki XML dump (.xml or .xml.bz2) of the new pages")
    parser.add_argument("--out", required=True, help="where the grown model (and its tokenizer) is written")
    parser.add_argument("--tokenizer", help="defaults to --model")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_passages", type=int, default=32, help="passages read per entity")
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from .configuration_edmem import EDMemConfig
    from .modeling_edmem import EDMemForConditionalGeneration, EDMemForEntityLinking

    encoder_only = EDMemConfig.from_pretrained(args.model).variant == "encmem"
    model = (EDMemForEntityLinking if encoder_only else EDMemForConditionalGeneration).from_pretrained(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.model)
    if model.entity_vocab is None:
        print(f"edmem add-entities: {args.model} has no entity_vocab.json", file=sys.stderr)
        return 1
    known = [name for name in model.entity_vocab.names if name is not None]
    passages, without = new_entity_passages(iter_parsed_pages(args.dump), known, max_passages=args.max_passages)
    names = sorted(passages)
    ids = model.add_entities(names, [passages[name] for name in names], tokenizer, batch_size=args.batch_size)
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(f"added {len(ids)} entities (ids {ids[0]}..{ids[-1]})" if ids else "added no entity")
    if without:
        print(f"skipped {len(without)} new pages never mentioned (first: {', '.join(without[:5])})")
    print(f"{model.config.entity_vocab_size} entities in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(cli_main())

"""`edmem add-entities`: the entities of new MediaWiki pages written into a trained model's memory, no training.

The dump is parsed as `edmem build-corpus` parses one (`dump.iter_parsed_pages`). An article whose title the model
does not know is a new entity; its passages are the text around each of its mentions, marked `<E_s> ... <E_e>`:
every link to it in the dump (through redirects) and each occurrence of its title on its own page. The rows are
computed by `model.add_entities` (docs/model.md, "New entities after training").
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from collections.abc import Iterable

import torch

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
    parser.add_argument("--estimator", choices=("fitted", "mean_query"), default="fitted",
                        help="fitted: rows trained alone on the pre-training objective (fit_new_entities); "
                             "mean_query: the scaled mean memory query at the mentions, no gradient step")  # fmt: skip
    parser.add_argument("--fit_steps", type=int, default=300, help="fitted: optimisation steps")
    parser.add_argument("--fit_learning_rate", type=float, default=3e-2, help="fitted: Adam's learning rate")
    parser.add_argument("--negatives", type=int, default=64,
                        help="fitted: trained entities of the dump whose passages are negatives")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="fitted: seed of the batches and dropout")
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
    pages = list(iter_parsed_pages(args.dump))
    passages, without = new_entity_passages(pages, known, max_passages=args.max_passages)
    names = sorted(passages)
    texts = [passages[name] for name in names]
    if args.estimator == "fitted" and names:
        everyone, _ = new_entity_passages(pages, known=(), max_passages=4)
        trained = sorted(name for name in everyone if name in model.entity_vocab)
        chosen = random.Random(args.seed).sample(trained, min(args.negatives, len(trained)))
        ids = fit_new_entities(model, names, texts, tokenizer, {name: everyone[name] for name in chosen},
                               steps=args.fit_steps, learning_rate=args.fit_learning_rate, seed=args.seed)  # fmt: skip
    else:
        ids = model.add_entities(names, texts, tokenizer, batch_size=args.batch_size)
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(f"added {len(ids)} entities (ids {ids[0]}..{ids[-1]})" if ids else "added no entity")
    if without:
        print(f"skipped {len(without)} new pages never mentioned (first: {', '.join(without[:5])})")
    print(f"{model.config.entity_vocab_size} entities in {args.out}")
    return 0


# --- the fitted estimator ---------------------------------------------------------------------------------------


def _labelled_passage(text: str, entity_id: int, tokenizer, start_id: int, max_length: int) -> dict:
    """`text` tokenised (cut to `max_length` tokens around its first `<E_s>`), `entity_id` at each `<E_s>`."""
    ids = tokenizer(text).input_ids
    if len(ids) > max_length:
        first = ids.index(start_id) if start_id in ids else 0
        begin = max(0, min(first - max_length // 2, len(ids) - max_length))
        ids = ids[begin : begin + max_length]
    labels = [entity_id if token == start_id else -100 for token in ids]
    return {"input_ids": ids, "entity_labels": labels}


def fit_new_entities(
    model,
    names: list[str],
    passages: list[list[str]],
    tokenizer,
    negatives: dict[str, list[str]] | None = None,
    *,
    rows: torch.Tensor | None = None,
    steps: int = 300,
    learning_rate: float = 3e-2,
    batch_size: int = 16,
    seed: int = 0,
    max_length: int = 128,
) -> list[int]:
    """Adds `names` to the memory and trains their rows alone on the pre-training objective; returns their ids.

    The rows start as `add_entities` writes them (the scaled mean query at the mentions of `passages`, or `rows`
    when given). Then `steps` steps of Adam on the pre-training loss (masked passages reconstructed, plus entity
    linking at every `<E_s>`) over `passages` (the new entity's id at its mentions) and `negatives` (a trained
    entity's name -> passages marking its mentions, labelled with its id, so that new rows learn not to capture
    trained mentions), half a batch of each. Every other weight, the trained rows among them, stays bit-identical;
    dropout and the batches are drawn from `seed`: the fit is deterministic.

    `passages[i]` marks the mentions of `names[i]` (and only its) `<E_s> ... <E_e>`, as `add_entities` takes them.
    """
    from .collator import EDMemMaskingCollator

    if steps < 1 or learning_rate <= 0 or batch_size < 1:
        raise ValueError(f"fit_new_entities: steps={steps}, learning_rate={learning_rate} and batch_size={batch_size} "
                         "must be positive")  # fmt: skip
    if len(names) != len(passages):
        raise ValueError(f"fit_new_entities: {len(names)} names but {len(passages)} passage lists")
    negatives = negatives or {}
    if model.entity_vocab is None:
        raise ValueError("fit_new_entities needs model.entity_vocab: the new names are appended to it")
    unknown = [name for name in negatives if name not in model.entity_vocab]
    if unknown:
        raise ValueError(f"fit_new_entities: negative entity {unknown[0]!r} is not in the model's vocabulary")
    if rows is None:
        ids = model.add_entities(names, passages, tokenizer, max_length=max_length)
    else:
        ids = model.add_entities(names, rows=rows)
    start_id = model.config.entity_start_token_id
    max_length = min(max_length, model.config.max_position_embeddings)
    new = [_labelled_passage(text, i, tokenizer, start_id, max_length) for i, texts in zip(ids, passages)
           for text in texts]  # fmt: skip
    old = [_labelled_passage(text, model.entity_vocab.id_of(name), tokenizer, start_id, max_length)
           for name, texts in negatives.items() for text in texts]  # fmt: skip
    table = model.get_encoder().entity_embeddings.weight
    first = ids[0] if ids else table.shape[0]
    trained_rows = table.detach()[:first].clone()
    requires_grad = {name: p.requires_grad for name, p in model.named_parameters()}
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    table.requires_grad_(True)
    keep_trained = torch.zeros(table.shape[0], 1, dtype=table.dtype, device=table.device)
    keep_trained[first:] = 1
    hook = table.register_hook(lambda grad: grad * keep_trained)
    optimizer = torch.optim.Adam([table], lr=learning_rate)
    collator = EDMemMaskingCollator(tokenizer, seed=seed)
    encoder_only = model.config.variant == "encmem"
    rng = random.Random(seed)
    was_training = model.training
    model.train()  # the memory attends to every row in training (the top k only in eval)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # dropout drawn from the seed: the fit is deterministic
            for step in range(steps):
                chosen = [
                    ("new", rng.randrange(len(new))) for _ in range((batch_size + 1) // 2 if old else batch_size)
                ]
                chosen += [("old", rng.randrange(len(old))) for _ in range(batch_size // 2 if old else 0)]
                examples = [{**(new if kind == "new" else old)[i], "example_index": n, "epoch": step}
                            for n, (kind, i) in enumerate(chosen)]  # fmt: skip
                batch = {key: value.to(model.device) for key, value in collator(examples).items()}
                if encoder_only:
                    batch.pop("decoder_entity_labels")
                loss = model(**batch).loss
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    finally:
        hook.remove()
        with torch.no_grad():
            table[:first] = trained_rows  # Adam leaves rows with zero gradients as they were; kept exact regardless
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(requires_grad[name])
        model.train(was_training)
    return ids


if __name__ == "__main__":
    sys.exit(cli_main())

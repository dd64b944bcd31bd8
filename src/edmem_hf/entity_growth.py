"""New entities written into a trained model's memory, without training (docs/model.md, "New entities after
training").

`add_entities(model, ...)` appends rows to the entity table: for a model with a writer of entity rows
(`EDMemConfig.entity_row_writer`), the mean of the rows it writes from the entity's texts (`written_rows`);
otherwise, or with `estimator="mean_query"`, the mean of the memory's queries at the entity's marked mentions
(`memory_queries(model, ...)`). It is this package's code, not Hub custom code: it takes any EDMem or EncMem model,
one loaded with `trust_remote_code=True` too, and the model file does not import it. `edmem
add-entities` finds the new entities of a MediaWiki dump, parsed as `edmem build-corpus` parses one
(`dump.iter_parsed_pages`): an article whose title the model does not know is a new entity; its passages are the text
around each of its mentions, marked `<E_s> ... <E_e>`: every link to it in the dump (through redirects) and each
occurrence of its title on its own page. The writer writes from each sentence of the entity's own page instead
(`own_page_sentences`), by default.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
from collections.abc import Iterable

import torch
from torch import nn

from .configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN
from .dump import ParsedPage, iter_parsed_pages
from .entity_writer import writer_input_ids
from .modeling_edmem import MODEL_WITH_HEADS, EDMemForEntityLinking, key_queries

# How `add_entities` writes a new row: with the model's writer of entity rows, or as the mean memory query.
ESTIMATORS = ("writer", "mean_query")
# Texts read at once from which a progress bar is shown.
PROGRESS_FROM = 10_000


def _crop_around_first_mention(ids: list[int], start_id: int, max_length: int) -> list[int]:
    """`max_length` tokens of `ids` with its first `<E_s>` in the middle (all of `ids` when short enough)."""
    if len(ids) <= max_length:
        return ids
    first = ids.index(start_id) if start_id in ids else 0
    begin = max(0, min(first - max_length // 2, len(ids) - max_length))
    return ids[begin : begin + max_length]


def _entity_table(model) -> nn.Embedding:
    """The model's entity table (the one its encoder's memory reads); a ValueError for a model without memory."""
    table = getattr(model.get_encoder(), "entity_embeddings", None)
    if table is None:
        raise ValueError(f"{type(model).__name__} has no entity memory to add entities to")
    return table


@torch.no_grad()
def memory_queries(
    model, passages: list[list[str]], tokenizer, batch_size: int = 32, max_length: int = 128
) -> torch.Tensor:
    """`(len(passages), entity_embed_dim)`: for each list of texts, the mean of the memory's queries (`W_in h` of the
    encoder's lower layers at each `<E_s>`) over its marked mentions: what the memory is asked there.

    Only the encoder's lower layers run (`EDMemEncoder.lower_hidden_states`): the table is not read. A passage longer
    than `max_length` tokens is cut to `max_length` tokens (at most the model's positions) around its first mention.
    A list without a single marked mention is a ValueError naming its index.
    """
    _entity_table(model)
    config = model.config
    max_length = min(max_length, config.max_position_embeddings)
    encoder = model.get_encoder()
    owners = [i for i, texts in enumerate(passages) for _ in texts]
    texts = [text for texts in passages for text in texts]
    counts = torch.zeros(len(passages), dtype=torch.long)
    sums = torch.zeros(len(passages), config.entity_embed_dim)
    was_training = model.training
    model.eval()
    try:
        for begin in range(0, len(texts), batch_size):
            crops = [_crop_around_first_mention(ids, config.entity_start_token_id, max_length)
                     for ids in tokenizer(texts[begin : begin + batch_size]).input_ids]  # fmt: skip
            batch = tokenizer.pad({"input_ids": crops}, return_tensors="pt").to(model.device)
            hidden = encoder.lower_hidden_states(batch.input_ids, batch.attention_mask)
            starts = batch.input_ids == config.entity_start_token_id
            rows = torch.tensor(owners[begin : begin + batch_size])[starts.nonzero()[:, 0].cpu()]
            queries = key_queries(encoder.memory.query_proj(hidden[starts]), config.entity_embed_dim)
            sums.index_add_(0, rows, queries.float().cpu())
            counts += torch.bincount(rows, minlength=len(passages))
    finally:
        model.train(was_training)
    if (counts == 0).any():
        raise ValueError(f"no marked mention in passages[{int((counts == 0).nonzero()[0, 0])}]")
    return sums / counts[:, None]


def writer_inputs(
    model, names: list[str], passages: list[list[str]], tokenizer, max_length: int = 128
) -> list[list[list[int]]]:
    """For each name, one writer input `<s> <E_s> name <E_e> text </s>` per text of `passages[i]` (token ids, at most
    `max_length`; `entity_writer.writer_input_ids`): the texts' own markers are dropped, so they may mark the
    entity's mentions or not."""
    texts = [text for texts in passages for text in texts]
    text_ids = iter(tokenizer(texts, add_special_tokens=False).input_ids) if texts else iter(())
    marked = tokenizer([f"{ENTITY_START_TOKEN} {name} {ENTITY_END_TOKEN}" for name in names], add_special_tokens=False)
    max_length = min(max_length, model.config.max_position_embeddings)
    return [[writer_input_ids(name_ids[1:-1], next(text_ids), model.config, max_length, tokenizer.bos_token_id)
             for _ in texts] for name_ids, texts in zip(marked.input_ids, passages)]  # fmt: skip


@torch.no_grad()
def written_rows(
    model, inputs: list[list[list[int]]], batch_size: int = 64, progress: bool | None = None
) -> torch.Tensor:
    """`(len(inputs), entity_embed_dim)`: for each entity, the mean of the rows the model's writer makes of its writer
    inputs (`writer_inputs`), in eval mode, no gradient. Inputs are read in batches of similar length; a progress
    bar is shown when asked, or by default from `PROGRESS_FROM` inputs on."""
    from tqdm.auto import tqdm

    flat = sorted(((len(ids), owner, ids) for owner, texts in enumerate(inputs) for ids in texts),
                  key=lambda item: item[0])  # fmt: skip
    if any(not texts for texts in inputs):
        raise ValueError(f"no text to write entity {[len(t) for t in inputs].index(0)}'s row from")
    sums = torch.zeros(len(inputs), model.config.entity_embed_dim)
    counts = torch.zeros(len(inputs))
    pad = model.config.pad_token_id
    was_training = model.training
    model.eval()
    try:
        show = len(flat) >= PROGRESS_FROM if progress is None else progress
        for begin in tqdm(range(0, len(flat), batch_size), desc="writing rows", disable=not show, unit="batch"):
            chunk = flat[begin : begin + batch_size]
            width = chunk[-1][0]
            ids = torch.tensor([item[2] + [pad] * (width - item[0]) for item in chunk], device=model.device)
            mask = torch.tensor([[1] * item[0] + [0] * (width - item[0]) for item in chunk], device=model.device)
            owners = torch.tensor([item[1] for item in chunk])
            sums.index_add_(0, owners, model.write_entity_rows(ids, mask).float().cpu())
            counts += torch.bincount(owners, minlength=len(inputs)).float()
    finally:
        model.train(was_training)
    return sums / counts[:, None]


@torch.no_grad()
def write_rows_into_table(model, entity_ids: list[int], inputs: list[list[list[int]]], batch_size: int = 64) -> None:
    """Overwrites the table rows `entity_ids` with the rows the model's writer makes of their writer inputs
    (`written_rows`): the rows of entities that only ever had written rows in training, or trained rows replaced
    by written ones."""
    if len(entity_ids) != len(inputs):
        raise ValueError(f"{len(entity_ids)} entity ids but {len(inputs)} lists of writer inputs")
    if entity_ids:
        weight = _entity_table(model).weight
        weight[torch.tensor(entity_ids, device=weight.device)] = written_rows(model, inputs, batch_size).to(weight)


def default_estimator(model) -> str:
    """The way `add_entities` writes rows when none is named: the model's writer of entity rows when it has one."""
    return "writer" if getattr(model, "entity_writer", None) is not None else "mean_query"


@torch.no_grad()
def add_entities(
    model,
    names: list[str],
    passages: list[list[str]] | None = None,
    tokenizer=None,
    *,
    rows: torch.Tensor | None = None,
    estimator: str | None = None,
    rows_apart: bool | None = None,
    batch_size: int = 32,
    max_length: int = 128,
) -> list[int]:
    """Appends entities to the memory of a trained model, without gradient steps; returns their ids.

    A new row is, with `estimator="writer"` (the default for a model with a writer of entity rows), the mean of the
    rows the writer makes of `<E_s> name <E_e> text` for each of the entity's texts (`written_rows`); with
    `"mean_query"` (the default otherwise) what the memory is asked at the entity's mentions:
    `memory_queries(model, passages)`, each scaled to the mean norm of the existing rows (attention scores are dot
    products: a row far shorter or longer than the others would never, or always, win; benchmarks/toy_world_growth.py
    measures the choice). Forward passes only, in batches; a progress bar on long runs. The entity table (one
    parameter, read by every memory access and the entity-linking head) grows, and so do
    `config.entity_vocab_size`, `entity_vocab` (the prefix tree of names is rebuilt on the next constrained
    decoding) and an entity mask set with `set_entity_mask` (the new entities visible).

    Args:
        names: the new entities' names: not in `entity_vocab`, not blank, no repeats.
        passages: `passages[i]`, texts about `names[i]` in which its mentions (and only its) are marked
            `<E_s> ... <E_e>` (the writer reads them without marks too); each entity needs at least one.
            `max_length` tokens of each are read (around the first mention), `batch_size` texts at a time.
        tokenizer: the model's tokenizer (with `<E_s>` and `<E_e>`).
        rows: instead of `passages` and `tokenizer`, the new rows themselves, `(len(names), entity_embed_dim)`
            (another estimator's).
        estimator: `"writer"` or `"mean_query"` (`ESTIMATORS`); None: the writer when the model has one.
        rows_apart: with the writer, also keep the row of each text apart, beside the table
            (`config.written_entity_rows`): every memory access and the linking head then read an entity's rows,
            each on its own, in place of its table row (the mean), and a query may choose the row of the fact it
            asks. None: apart where the model was trained to read rows so (`config.writer_pools_texts` False).
    """
    table = _entity_table(model)
    if model.entity_vocab is None:
        raise ValueError("add_entities needs model.entity_vocab: the new names are appended to it")
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"add_entities: an empty or non-string entity name: {name!r}")
        if name in model.entity_vocab or name in seen:
            raise ValueError(f"add_entities: entity {name!r} is already in the vocabulary or named twice")
        seen.add(name)
    weight = table.weight
    if (rows is None) == (passages is None) or (passages is not None and tokenizer is None):
        raise ValueError("add_entities takes either passages with their tokenizer, or rows")
    has_writer = getattr(model, "entity_writer", None) is not None
    estimator = estimator or default_estimator(model)
    if estimator not in ESTIMATORS:
        raise ValueError(f"add_entities: estimator must be one of {ESTIMATORS}, got {estimator!r}")
    if estimator == "writer" and not has_writer:
        raise ValueError(f"add_entities: {type(model).__name__} has no writer of entity rows (entity_row_writer)")
    if rows_apart is None:
        rows_apart = estimator == "writer" and rows is None and not model.config.writer_pools_texts
    if rows_apart and (estimator != "writer" or rows is not None):
        raise ValueError(
            "add_entities: rows_apart keeps the writer's row of each text: it needs passages and the writer"
        )
    if rows is None:
        if len(names) != len(passages):
            raise ValueError(f"add_entities: {len(names)} names but {len(passages)} passage lists")
        marker = tokenizer.convert_ids_to_tokens(model.config.entity_start_token_id)
        for name, texts in zip(names, passages):
            if not texts:
                raise ValueError(f"add_entities: no passage about {name!r}")
            if estimator == "mean_query" and not any(marker in text for text in texts):
                raise ValueError(f"add_entities: no marked mention of {name!r} in its passages")
        if estimator == "writer":
            inputs = writer_inputs(model, names, passages, tokenizer, max_length=max_length)
            if rows_apart:
                each, owners, rows = _rows_apart(model, inputs, batch_size)
            else:
                rows = written_rows(model, inputs, batch_size=batch_size)
        else:
            means = memory_queries(model, passages, tokenizer, batch_size=batch_size, max_length=max_length)
            rows = means / means.norm(dim=-1, keepdim=True) * weight.norm(dim=-1).mean().cpu()
    elif tuple(rows.shape) != (len(names), weight.shape[1]):
        raise ValueError(
            f"add_entities: rows of shape {tuple(rows.shape)}, expected ({len(names)}, {weight.shape[1]})"
        )
    table.weight = nn.Parameter(torch.cat([weight.detach(), rows.to(weight)]), requires_grad=weight.requires_grad)
    table.num_embeddings = table.weight.shape[0]
    first = model.config.entity_vocab_size
    model.config.entity_vocab_size = first + len(names)
    model.entity_vocab = model.entity_vocab.extended(names)
    if rows_apart:
        _keep_written_rows(model, table, owners + first, each)
    mask = model._get_entity_mask("cpu")
    if mask is not None:
        model.set_entity_mask(torch.cat([mask, torch.ones(len(names), dtype=torch.bool)]))
    return list(range(first, first + len(names)))


def _keep_written_rows(model, table: nn.Embedding, entity_ids: torch.Tensor, rows: torch.Tensor) -> None:
    """Makes `rows` `(R, d)` the written rows the table keeps for the entities `entity_ids` `(R,)`, after those of the
    other entities (`config.written_entity_rows`, `modeling_edmem.new_entity_table`)."""
    device = table.weight.device
    entity_ids, rows = entity_ids.to(device), rows.to(device=device, dtype=torch.float32)
    if getattr(table, "written_rows", None) is None:
        table.register_buffer("written_rows", rows)
        table.register_buffer("written_row_entity_ids", entity_ids)
    else:
        others = ~torch.isin(table.written_row_entity_ids, entity_ids)
        table.written_rows = torch.cat([table.written_rows[others], rows])
        table.written_row_entity_ids = torch.cat([table.written_row_entity_ids[others], entity_ids])
    model.config.written_entity_rows = table.written_rows.shape[0]


def _rows_apart(model, inputs: list[list[list[int]]], batch_size: int) -> tuple[torch.Tensor, ...]:
    """The writer's row of each writer input `(T, d)`, the index in `inputs` of the entity it is about `(T,)`, and
    each entity's mean row `(len(inputs), d)`."""
    each = written_rows(model, [[ids] for texts in inputs for ids in texts], batch_size=batch_size)
    owners = torch.tensor([i for i, texts in enumerate(inputs) for _ in texts], dtype=torch.long)
    counts = torch.bincount(owners, minlength=len(inputs)).float()
    return each, owners, torch.zeros(len(inputs), each.shape[1]).index_add(0, owners, each) / counts[:, None]


@torch.no_grad()
def write_rows_apart(model, entity_ids: list[int], inputs: list[list[list[int]]], batch_size: int = 64) -> None:
    """As `write_rows_into_table`, and the row of each writer input kept apart beside the table in place of those
    entities' earlier kept rows: the rows a model trained with a row a passage (`config.writer_pools_texts` False)
    reads."""
    if len(entity_ids) != len(inputs):
        raise ValueError(f"{len(entity_ids)} entity ids but {len(inputs)} lists of writer inputs")
    if entity_ids:
        each, owners, means = _rows_apart(model, inputs, batch_size)
        table = _entity_table(model)
        ids = torch.tensor(entity_ids, device=table.weight.device)
        table.weight[ids] = means.to(table.weight)
        _keep_written_rows(model, table, ids[owners.to(ids.device)], each)


def write_rows_as_read(model, entity_ids: list[int], inputs: list[list[list[int]]], batch_size: int = 64) -> None:
    """The rows of `entity_ids` written from their writer inputs as the model reads an entity of several texts: one
    row, their mean (`write_rows_into_table`), or where it reads a row a text (`config.writer_pools_texts` False)
    each kept apart beside the table too (`write_rows_apart`)."""
    write = write_rows_into_table if model.config.writer_pools_texts else write_rows_apart
    write(model, entity_ids, inputs, batch_size)


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


TEXTS = ("own_sentences", "passages")  # what `edmem add-entities` writes rows from
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


def own_page_sentences(
    pages: Iterable[ParsedPage], names: Iterable[str], max_sentences: int | None = 32
) -> dict[str, list[str]]:
    """Each of `names`' own page cut into its sentences, in page order, at most `max_sentences` an entity (None: all);
    a line that does not end as a sentence does (a heading, a list item) is dropped. A biography's sentence states one
    fact, and rows written from each, kept apart, are what the writer's figures are best with (docs/evidence.md). A
    name without a page, or whose page has no sentence, is left out."""
    wanted = set(names)
    sentences: dict[str, list[str]] = {}
    for page in pages:
        if page.title not in wanted or page.redirect is not None:
            continue
        cut = (piece.strip() for piece in _SENTENCE_END.split(page.text))
        found = [piece for piece in cut if piece.endswith((".", "!", "?"))][:max_sentences]
        if found:
            sentences[page.title] = found
    return sentences


def cli_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edmem add-entities", description=__doc__)
    parser.add_argument("--model", required=True, help="a trained EDMem or EncMem folder")
    parser.add_argument("--dump", required=True, help="a MediaWiki XML dump (.xml or .xml.bz2) of the new pages")
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
    from transformers import AutoTokenizer

    from .configuration_edmem import EDMemConfig

    model = MODEL_WITH_HEADS[EDMemConfig.from_pretrained(args.model).variant].from_pretrained(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.model)
    if model.entity_vocab is None:
        print(f"edmem add-entities: {args.model} has no entity_vocab.json", file=sys.stderr)
        return 1
    known = [name for name in model.entity_vocab.names if name is not None]
    pages = list(iter_parsed_pages(args.dump))
    passages, without = new_entity_passages(pages, known, max_passages=args.max_passages)
    names = sorted(passages)
    estimator = args.estimator or default_estimator(model)
    texts_from = args.texts or ("own_sentences" if estimator == "writer" else "passages")
    if texts_from == "own_sentences" and estimator != "writer":
        print(f"edmem add-entities: --texts own_sentences is the writer's; {estimator} reads marked mentions",
              file=sys.stderr)  # fmt: skip
        return 1
    sentences = own_page_sentences(pages, names, args.max_passages) if texts_from == "own_sentences" else {}
    texts = [sentences.get(name) or passages[name] for name in names]
    if args.estimator == "fitted" and names:
        everyone, _ = new_entity_passages(pages, known=(), max_passages=4)
        trained = sorted(name for name in everyone if name in model.entity_vocab)
        chosen = random.Random(args.seed).sample(trained, min(args.negatives, len(trained)))
        ids = fit_new_entities(model, names, texts, tokenizer, {name: everyone[name] for name in chosen},
                               steps=args.fit_steps, learning_rate=args.fit_learning_rate, seed=args.seed)  # fmt: skip
    else:
        ids = add_entities(model, names, texts, tokenizer, estimator=estimator, rows_apart=args.rows_apart,
                           batch_size=args.batch_size)  # fmt: skip
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
    ids = _crop_around_first_mention(tokenizer(text).input_ids, start_id, max_length)
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
    when given), then `fit_rows` trains them over `passages` (the new entity's id at its mentions) against
    `negatives` (a trained entity's name -> passages marking its mentions, labelled with its id).

    `passages[i]` marks the mentions of `names[i]` (and only its) `<E_s> ... <E_e>`, as `add_entities` takes them.
    For passages with every mention marked and labelled, as pre-training reads them, call `fit_rows` on
    `pretraining_examples` instead.
    """
    if len(names) != len(passages):
        raise ValueError(f"fit_new_entities: {len(names)} names but {len(passages)} passage lists")
    negatives = negatives or {}
    if model.entity_vocab is None:
        raise ValueError("fit_new_entities needs model.entity_vocab: the new names are appended to it")
    unknown = [name for name in negatives if name not in model.entity_vocab]
    if unknown:
        raise ValueError(f"fit_new_entities: negative entity {unknown[0]!r} is not in the model's vocabulary")
    _check_fit_settings(steps, learning_rate, batch_size)
    if rows is None:
        ids = add_entities(model, names, passages, tokenizer, max_length=max_length)
    else:
        ids = add_entities(model, names, rows=rows)
    start_id = model.config.entity_start_token_id
    max_length = min(max_length, model.config.max_position_embeddings)
    new = [_labelled_passage(text, i, tokenizer, start_id, max_length) for i, texts in zip(ids, passages)
           for text in texts]  # fmt: skip
    old = [_labelled_passage(text, model.entity_vocab.id_of(name), tokenizer, start_id, max_length)
           for name, texts in negatives.items() for text in texts]  # fmt: skip
    fit_rows(model, ids, new, old, tokenizer, steps=steps, learning_rate=learning_rate, batch_size=batch_size,
             seed=seed)  # fmt: skip
    return ids


def corpus_entity_ids(corpus_dir: str | os.PathLike, vocab) -> list[int]:
    """For each entity id of an `edmem build-corpus` folder's vocabulary, the id of the same name in `vocab` (-100,
    unlabelled, where `vocab` lacks it): a corpus's labels in a trained model's ids."""
    from .entity_vocab import EntityVocab

    corpus_names = EntityVocab.load(os.fspath(corpus_dir)).names
    return [vocab.id_of(name) if name is not None and name in vocab else -100 for name in corpus_names]


def pretraining_examples(corpus_dir: str | os.PathLike, vocab, split: str = "train") -> list[dict]:
    """The passages of an `edmem build-corpus` folder as `fit_rows` takes them: `input_ids`, and `entity_labels` in
    `vocab`'s ids (`corpus_entity_ids`)."""
    from datasets import load_from_disk

    ids = corpus_entity_ids(corpus_dir, vocab)
    passages = load_from_disk(os.path.join(os.fspath(corpus_dir), "passages"))[split]
    return [
        {"input_ids": row["input_ids"], "entity_labels": [ids[i] if i >= 0 else -100 for i in row["entity_labels"]]}
        for row in passages
    ]


def fit_rows(
    model,
    new_ids: list[int],
    examples: list[dict],
    negatives: list[dict],
    tokenizer,
    *,
    steps: int = 300,
    learning_rate: float = 3e-2,
    batch_size: int = 16,
    seed: int = 0,
) -> None:
    """Trains the memory rows `new_ids` (the table's last rows, written by `add_entities`) alone, in place, on the
    pre-training objective: the masked passage reconstructed, plus entity linking at every labelled `<E_s>`.

    `examples` are passages about the new entities and `negatives` passages of trained entities only (so that new
    rows learn not to capture trained mentions), half a batch of each: dicts with `input_ids` and `entity_labels`
    in the model's ids (-100 where not scored), as `pretraining_examples` gives them. Every other weight, the trained
    rows among them, stays bit-identical; dropout and the batches are drawn from `seed`: the fit is deterministic.
    """
    from .collator import EDMemMaskingCollator

    _check_fit_settings(steps, learning_rate, batch_size)
    table = model.get_encoder().entity_embeddings.weight
    first = min(new_ids) if new_ids else table.shape[0]
    if sorted(new_ids) != list(range(first, table.shape[0])):
        raise ValueError(f"fit_rows: new_ids must be the table's last rows ({first}..{table.shape[0] - 1})")
    if not examples:
        raise ValueError("fit_rows: no example passage about the new entities")
    # Only the new rows are a leaf the optimiser sees: its state is `(new, dim)`, not the whole table's, and the
    # trained rows are never written. Each forward reads the table as the trained rows followed by the new ones.
    (table_name,) = [name for name, parameter in model.named_parameters() if parameter is table]
    trained_rows = table.detach()[:first]
    new_rows = table.detach()[first:].clone().requires_grad_(True)
    requires_grad = {name: p.requires_grad for name, p in model.named_parameters()}
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    optimizer = torch.optim.Adam([new_rows], lr=learning_rate)
    collator = EDMemMaskingCollator(tokenizer, seed=seed)
    encoder_only = isinstance(model, EDMemForEntityLinking)  # no decoder: no decoder entity labels
    rng = random.Random(seed)
    was_training = model.training
    model.train()  # the memory attends to every row in training (the top k only in eval)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # dropout drawn from the seed: the fit is deterministic
            for step in range(steps):
                new_half = (batch_size + 1) // 2 if negatives else batch_size
                chosen = [examples[rng.randrange(len(examples))] for _ in range(new_half)]
                chosen += [negatives[rng.randrange(len(negatives))] for _ in range(batch_size - new_half)]
                batch = collator([{"input_ids": e["input_ids"], "entity_labels": e["entity_labels"],
                                   "example_index": n, "epoch": step} for n, e in enumerate(chosen)])  # fmt: skip
                batch = {key: value.to(model.device) for key, value in batch.items()}
                if encoder_only:
                    batch.pop("decoder_entity_labels")
                rows = {table_name: torch.cat([trained_rows, new_rows])}
                loss = torch.func.functional_call(model, rows, args=(), kwargs=batch).loss
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    finally:
        with torch.no_grad():
            table[first:] = new_rows
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(requires_grad[name])
        model.train(was_training)


def _check_fit_settings(steps: int, learning_rate: float, batch_size: int) -> None:
    if steps < 1 or learning_rate <= 0 or batch_size < 1:
        raise ValueError(f"fit_new_entities: steps={steps}, learning_rate={learning_rate} and batch_size={batch_size} "
                         "must be positive")  # fmt: skip


if __name__ == "__main__":
    sys.exit(cli_main())

"""New entities written into a trained model's memory, without training (docs/model.md, "New entities after
training").

`add_entities(model, ...)` appends rows to the entity table: for a model with a writer of entity rows
(`EDMemConfig.entity_row_writer`), the mean of the rows it writes from the entity's texts (`written_rows`);
otherwise, or with `estimator="mean_query"`, the mean of the memory's queries at the entity's marked mentions
(`memory_queries(model, ...)`). It is this package's code, not Hub custom code: it takes any EDMem or EncMem model,
one loaded with `trust_remote_code=True` too, and the model file does not import it. Where new entities' texts come
from (a MediaWiki dump) is `new_entity_text`; rows trained by gradient, `row_fitting`; the command,
`add_entities_command`.
"""

from __future__ import annotations

import torch
from torch import nn

from ..configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN
from ..entity_writer import writer_input_ids
from ..modeling_edmem import key_queries

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
            rows = model.write_entity_rows(ids, mask, texts_per_pass=None)  # grouped by length here already
            sums.index_add_(0, owners, rows.float().cpu())
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
    aliases: list[list[str]] | None = None,
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
        aliases: `aliases[i]`, other names of `names[i]` (kept in `entity_vocab`; the name-guided read finds them).
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
    if aliases is not None and len(aliases) != len(names):
        raise ValueError(f"add_entities: {len(aliases)} alias lists for {len(names)} names")
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
    model.entity_vocab = model.entity_vocab.extended(names, aliases)
    if rows_apart:
        table.keep_rows(owners + first, each)
        model.config.written_entity_rows = table.written_rows.shape[0]
    mask = model._get_entity_mask("cpu")
    if mask is not None:
        model.set_entity_mask(torch.cat([mask, torch.ones(len(names), dtype=torch.bool)]))
    if getattr(model.config, "name_guided_read", False) and tokenizer is not None:
        model.name_candidates(tokenizer)  # the new names too
    return list(range(first, first + len(names)))


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
        table.keep_rows(ids[owners.to(ids.device)], each)
        model.config.written_entity_rows = table.written_rows.shape[0]


def write_rows_as_read(model, entity_ids: list[int], inputs: list[list[list[int]]], batch_size: int = 64) -> None:
    """The rows of `entity_ids` written from their writer inputs as the model reads an entity of several texts: one
    row, their mean (`write_rows_into_table`), or where it reads a row a text (`config.writer_pools_texts` False)
    each kept apart beside the table too (`write_rows_apart`)."""
    write = write_rows_into_table if model.config.writer_pools_texts else write_rows_apart
    write(model, entity_ids, inputs, batch_size)

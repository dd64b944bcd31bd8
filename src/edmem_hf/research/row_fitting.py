"""New entities' rows trained by gradient: the fitted estimator of `edmem add-entities` (`fit_new_entities`), and
`fit_rows`, which trains the new rows alone on the pre-training objective, every other weight unchanged."""

from __future__ import annotations

import os
import random

import torch

from ..modeling_edmem import EDMemForEntityLinking
from .entity_growth import _crop_around_first_mention, add_entities


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
    from ..entity_vocab import EntityVocab

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
    from ..collator import EDMemMaskingCollator

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

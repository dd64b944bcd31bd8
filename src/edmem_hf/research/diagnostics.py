"""Where does a model keep what it knows about an entity: in the entity's memory row, or in its layers, keyed by the
entity's name? The measurements of docs/evidence.md ("New entities after training"), for any EDMem and any
entities with questions about them in the released QA format (`edmem_*.jsonl`, each record with its `relation`).

- `row_swap`: each question's subject read through another subject's row: do the answers follow the row?
- `oracle_read`: each question's subject read through its own row alone: with finding the row solved, is the answer
  in it? (A miss is then what the row holds, or how it is read.)
- `rewrite`: the subjects' rows replaced by rows written from texts about them: are the answers kept?
- `row_content`: a linear probe fitted on some entities' rows reads a fact off other entities' rows: do rows carry
  the fact, or only who the entity is?
- `found_by_name`: how often the memory's top entity at a marked mention is the entity mentioned, with or without the
  name-guided read;
- `written_facts`: the writer's rows of sentences that state one fact, for made-up names and each value: how much of
  a written row is the name and how much the fact?

`memory_diagnostics` runs those a model and its files allow and returns their figures; each is a function of its
own too. Every one answers as `edmem evaluate` scores (free decoding, exact match) and leaves the model as it was.
"""

from __future__ import annotations

import contextlib
import os
import random
import statistics
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from ..configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN
from ..evaluation import exact_match, strip_generation
from ..task_features import EDMemSeq2SeqCollator, encode_qa_record
from ..task_files import read_jsonl, read_qa
from .entity_growth import default_estimator, memory_queries, write_rows_as_read, writer_inputs, written_rows

PathLike = str | os.PathLike
# Made-up names `written_facts` writes rows for, at most (fewer when the people's names allow fewer).
WRITTEN_FACT_NAMES = 24
# Questions decoded at once.
BATCH_SIZE = 64


@torch.no_grad()
def answer_questions(
    model: Any,
    tokenizer: Any,
    questions_file: PathLike,
    *,
    subjects_only: bool = False,
    reading: Mapping[int, int] | None = None,
) -> dict[str, str]:
    """Free greedy answers `{id: text}` to the questions of `questions_file` (the question encoded by
    `encode_qa_record`, 17 tokens at most, the markers kept), as `edmem finetune --do_predict` makes them.

    With `subjects_only`, the encoder's memory reads each question's subject's row and nothing else (the decoder's
    memory and the linking head see the whole table): the read forced onto the row, whatever the query finds. With
    `reading` (subject's entity id -> an entity id), it reads that entity's row instead, and only the questions
    whose subject `reading` names are answered."""
    rows = read_qa(questions_file, model.entity_vocab)
    collator = EDMemSeq2SeqCollator(tokenizer.pad_token_id)
    encoder = model.get_encoder()
    forced = subjects_only or reading is not None
    groups: dict[int, list[int]] = {}
    for i, entities in enumerate(rows["mention_entities"]):
        if reading is not None and entities[0] not in reading:
            continue
        groups.setdefault(entities[0] if forced else -1, []).append(i)
    answers = {}
    was_training, mask = model.training, getattr(encoder, "_entity_mask", None)
    model.eval()
    try:
        for subject, members in groups.items():
            if forced:
                row = subject if reading is None else reading[subject]
                encoder._entity_mask = torch.arange(model.config.entity_vocab_size) == row
            for begin in range(0, len(members), BATCH_SIZE):
                chosen = members[begin : begin + BATCH_SIZE]
                batch = collator(
                    [{"input_ids": encode_qa_record(rows[i], tokenizer, 64)["input_ids"]} for i in chosen]
                )
                batch = {name: tensor.to(model.device) for name, tensor in batch.items()}
                generated = model.generate(**batch, max_length=17, num_beams=1, entity_decoding="free")
                for i, text in zip(chosen, tokenizer.batch_decode(generated)):
                    answers[rows[i]["id"]] = strip_generation(text, tokenizer)
    finally:
        encoder._entity_mask = mask
        model.train(was_training)
    return answers


def exact_match_percent(answers: Mapping[str, str], questions_file: PathLike) -> float:
    """Exact match in percent of `answers` on the questions of `questions_file` (`edmem evaluate`'s rule)."""
    records = read_jsonl(questions_file)
    return round(100 * sum(exact_match(answers[r["id"]], r["answer"]) for r in records) / len(records), 2)


def row_swap(model: Any, tokenizer: Any, questions_file: PathLike, seed: int = 0) -> dict[str, float]:
    """Whether a subject's facts are read from its row: the subjects of `questions_file` in random pairs (drawn from
    `seed`), each question answered with the encoder's memory read forced onto the partner's row. Of the questions
    whose two answers differ (same `relation`), the share answered with the partner's answer (`follow`: the fact is
    read from the row) and with the subject's own (`kept`: it is in the layers, keyed by the name), and their count.

    The read is forced rather than the table's rows swapped: the memory finds a row by its content, so a table with
    two rows swapped is the same set of rows, read the same at every mention, and would move no answer."""
    records = read_jsonl(questions_file)
    partner = pair_up(sorted({r["link_target"][0] for r in records}), seed)
    vocab = model.entity_vocab
    reading = {vocab.id_of(person): vocab.id_of(other) for person, other in partner.items()}
    answers = answer_questions(model, tokenizer, questions_file, reading=reading)
    return answers_that_follow(records, partner, answers)


def pair_up(people: list[str], seed: int) -> dict[str, str]:
    """`people` shuffled by `seed` and paired in turn, each mapped to the other of its pair (the last of an odd count
    to none)."""
    random.Random(seed).shuffle(people)
    partner = {}
    for a, b in zip(people[0::2], people[1::2]):
        partner[a], partner[b] = b, a
    return partner


def answers_that_follow(
    records: list[dict], partner: Mapping[str, str], answers: Mapping[str, str]
) -> dict[str, float]:
    """`row_swap`'s figures: of the questions about a person of `partner` whose answer differs from the partner's
    answer to the same relation, the share of `answers` that are the partner's (`follow`) and the person's own
    (`kept`), and their count."""
    gold = {(r["link_target"][0], r["relation"]): r["answer"] for r in records}
    follow = kept = counted = 0
    for r in records:
        person = r["link_target"][0]
        if person not in partner or exact_match(gold[(partner[person], r["relation"])][0], r["answer"]):
            continue
        counted += 1
        follow += exact_match(answers[r["id"]], gold[(partner[person], r["relation"])])
        kept += exact_match(answers[r["id"]], r["answer"])
    return {"follow": round(100 * follow / max(counted, 1), 2), "kept": round(100 * kept / max(counted, 1), 2),
            "questions": counted}  # fmt: skip


def oracle_read(model: Any, tokenizer: Any, questions_file: PathLike) -> dict[str, float]:
    """EM on the questions as answered (`plain`) and with the encoder's memory read forced onto each subject's row
    (`oracle`): with finding solved, a miss is the row's content or its reading. For entities added after training,
    `plain` below `oracle` says the memory does not find them; both low, that their rows do not answer."""
    return {"plain": exact_match_percent(answer_questions(model, tokenizer, questions_file), questions_file),
            "oracle": exact_match_percent(answer_questions(model, tokenizer, questions_file, subjects_only=True),
                                          questions_file)}  # fmt: skip


def rewrite(
    model: Any,
    tokenizer: Any,
    questions_file: PathLike,
    texts: Mapping[str, Sequence[str]],
    estimator: str | None = None,
) -> dict[str, float]:
    """EM on the questions as answered (`plain`) and with the rows of the entities of `texts` (name -> texts about
    it, in the order given) replaced by rows written from those texts (`rewritten`), as `add_entities` would write
    them for new entities: by the model's writer (`estimator="writer"`, its default for a model with one; read as
    the model reads an entity's texts, their mean or a row each kept apart), or the scaled mean memory query at the
    texts' marked mentions (`"mean_query"`). Trained entities' answers kept under rewritten rows say that rows
    written for new entities would serve them as well. The model's rows are put back afterwards."""
    estimator = estimator or default_estimator(model)
    plain = exact_match_percent(answer_questions(model, tokenizer, questions_file), questions_file)
    people = list(texts)
    ids = [model.entity_vocab.id_of(person) for person in people]
    table = model.get_encoder().entity_embeddings.weight
    with _rows_put_back(model, ids):
        if estimator == "writer":
            write_rows_as_read(model, ids, writer_inputs(model, people, [list(texts[p]) for p in people], tokenizer))
        elif estimator == "mean_query":
            means = memory_queries(model, [list(texts[p]) for p in people], tokenizer)
            with torch.no_grad():
                table[torch.tensor(ids)] = (means / means.norm(dim=-1, keepdim=True) * table.norm(dim=-1).mean()).to(
                    table
                )
        else:
            raise ValueError(f"rewrite: estimator must be writer or mean_query, got {estimator!r}")
        rewritten = exact_match_percent(answer_questions(model, tokenizer, questions_file), questions_file)
    return {"plain": plain, "rewritten": rewritten}


@contextlib.contextmanager
def _rows_put_back(model: Any, ids: list[int]) -> Iterator[None]:
    """The table rows `ids`, the written rows kept beside the table and their count in the config, as they are now
    once the block ends."""
    table = model.get_encoder().entity_embeddings
    chosen = torch.tensor(ids, dtype=torch.long, device=table.weight.device)
    rows = table.weight.detach()[chosen].clone()
    kept = {name: getattr(table, name, None) for name in ("written_rows", "written_row_entity_ids")}
    count = getattr(model.config, "written_entity_rows", 0)
    try:
        yield
    finally:
        with torch.no_grad():
            table.weight[chosen] = rows
        for name, value in kept.items():
            if value is None:
                table._buffers.pop(name, None)
            else:
                setattr(table, name, value)
        model.config.written_entity_rows = count


def facts_by_subject(questions_files: Iterable[PathLike], relation: str) -> dict[str, str]:
    """Subject's name -> the first answer of its question of `relation`, over `questions_files` (a later file's
    answer wins)."""
    return {r["link_target"][0]: r["answer"][0] for f in questions_files for r in read_jsonl(f)
            if r["relation"] == relation}  # fmt: skip


def linear_probe(x: torch.Tensor, y: torch.Tensor, x_score: torch.Tensor, classes: int) -> torch.Tensor:
    """The classes a multinomial logistic regression fitted on `(x, y)` (standardised, L2-regularised, L-BFGS)
    predicts for `x_score`: whether a linear read-out of the rows finds a fact, as the memory's output projection
    would have to."""
    mean, std = x.mean(0), x.std(0) + 1e-6
    weight = torch.zeros(x.shape[1], classes, requires_grad=True)
    bias = torch.zeros(classes, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=200)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        logits = (x - mean) / std @ weight + bias
        loss = torch.nn.functional.cross_entropy(logits, y) + 1e-2 * weight.pow(2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(closure)
    return ((x_score - mean) / std @ weight + bias).argmax(-1)


def row_content(
    model: Any, fit_questions: Sequence[PathLike], score_questions: PathLike, relations: Sequence[str]
) -> dict[str, float]:
    """Whether table rows carry facts: for each of `relations` (each a fact of few values, many entities sharing
    one), a linear probe fitted on the table rows of the subjects asked in `fit_questions` (entities whose facts are
    known) predicts the value for the subjects of `score_questions` (say, entities added later): accuracy %
    (`{relation}`), beside the fitted subjects' majority value (`majority_{relation}`), and both averaged over the
    relations (`probe`, `majority`). Rows that are only keys of who an entity is give the probe nothing to beat the
    majority with."""
    table = model.get_encoder().entity_embeddings.weight.detach().float()
    result = {}
    for relation in relations:
        fit, score = facts_by_subject(fit_questions, relation), facts_by_subject([score_questions], relation)
        values = sorted(set(fit.values()) | set(score.values()))
        x, x_score = (
            table[torch.tensor([model.entity_vocab.id_of(person) for person in facts])] for facts in (fit, score)
        )
        y, y_score = (torch.tensor([values.index(value) for value in facts.values()]) for facts in (fit, score))
        predicted = linear_probe(x.cpu(), y, x_score.cpu(), len(values))
        majority = torch.bincount(y, minlength=len(values)).argmax()
        result[relation] = round(100 * predicted.eq(y_score).float().mean().item(), 2)
        result[f"majority_{relation}"] = round(100 * y_score.eq(majority).float().mean().item(), 2)
    result["probe"] = round(statistics.mean(result[r] for r in relations), 2)
    result["majority"] = round(statistics.mean(result[f"majority_{r}"] for r in relations), 2)
    return result


def variance_shares_and_probe(rows: torch.Tensor) -> dict[str, float]:
    """`rows` `(names, values, dim)`: rows written about each name with each value of one fact. The shares (%) of
    the rows' variance explained by the name and by the value (two-way main effects), and a linear probe's accuracy
    (%) at the value for the last third of the names, fitted on the others, beside chance: a row that says who and
    not what has a fact share near 0 and a probe at chance."""
    rows = rows.float()
    names, values, dim = rows.shape
    total = rows.reshape(-1, dim).var(0, unbiased=False).sum()
    by_name = rows.mean(1).var(0, unbiased=False).sum() / total
    by_value = rows.mean(0).var(0, unbiased=False).sum() / total
    fitted = names - names // 3
    y = torch.arange(values).repeat(names, 1)
    predicted = linear_probe(rows[:fitted].reshape(-1, dim), y[:fitted].reshape(-1), rows[fitted:].reshape(-1, dim),
                             values)  # fmt: skip
    return {"name_share": round(100 * by_name.item(), 2), "fact_share": round(100 * by_value.item(), 2),
            "probe": round(100 * predicted.eq(y[fitted:].reshape(-1)).float().mean().item(), 2),
            "chance": round(100 / values, 2)}  # fmt: skip


def written_facts(
    model: Any,
    tokenizer: Any,
    people: Iterable[str],
    facts: Mapping[str, tuple[str, Sequence[str]]],
    seed: int = 0,
    max_names: int = WRITTEN_FACT_NAMES,
) -> dict[str, float]:
    """What a row the model's writer writes is made of. For each fact of `facts` (relation -> a sentence form with
    `{S}` for the subject and `{V}` for the value, and the fact's values), the writer's rows of the form's sentences,
    `<E_s> name <E_e>` as the subject, for up to `max_names` made-up names (the first word of one of `people` and the
    last of another, no entity's name and none of `people`, drawn from `seed`; at least 3) and each value:
    `variance_shares_and_probe` per relation (`{key}_{relation}`) and averaged over the relations (`name_share`,
    `fact_share`, `probe`, `chance`)."""
    people = set(people)
    taken = set(model.entity_vocab.names) | people
    firsts, lasts = sorted({p.split()[0] for p in people}), sorted({p.split()[-1] for p in people})
    wanted = min(max_names, sum(f"{first} {last}" not in taken for first in firsts for last in lasts))
    if wanted < 3:
        raise ValueError(f"written_facts needs 3 names no entity has; the people's names give {wanted}")
    rng = random.Random(seed)
    names: list[str] = []
    while len(names) < wanted:
        name = f"{rng.choice(firsts)} {rng.choice(lasts)}"
        if name not in taken and name not in names:
            names.append(name)
    figures: dict[str, float] = {}
    for relation, (form, values) in facts.items():
        texts = [[form.format(S=f"{ENTITY_START_TOKEN} {name} {ENTITY_END_TOKEN}", V=value)]
                 for name in names for value in values]  # fmt: skip
        inputs = writer_inputs(model, [name for name in names for _ in values], texts, tokenizer)
        shares = variance_shares_and_probe(written_rows(model, inputs).view(len(names), len(values), -1))
        figures.update({f"{key}_{relation}": value for key, value in shares.items()})
    for key in ("name_share", "fact_share", "probe", "chance"):
        figures[key] = round(statistics.mean(figures[f"{key}_{r}"] for r in facts), 2)
    return figures


@torch.no_grad()
def found_by_name(
    model: Any, tokenizer: Any, texts: Mapping[str, Sequence[str]], name_guided: bool | None = None
) -> dict[str, float]:
    """How often the encoder memory's top entity at a marked mention is the entity mentioned: `texts` maps an entity's
    name to texts whose first marked mention is it (`new_entity_text.new_entity_passages`). `recall` (%) over all the
    texts, `entities` the names counted (those of the vocabulary with a text), `texts` the texts read. `name_guided`
    turns the name-guided read on or off meanwhile (`EDMemConfig.name_guided_read`; None: as the model has it)."""
    vocab, config = model.entity_vocab, model.config
    pairs = [(vocab.id_of(name), text) for name, group in texts.items() if name in vocab for text in group]
    kept = config.name_guided_read
    if name_guided is not None:
        config.name_guided_read = name_guided
    if config.name_guided_read:
        model.name_candidates(tokenizer)
    try:
        tops = first_mention_tops(model, tokenizer, [text for _, text in pairs])
    finally:
        config.name_guided_read = kept
    hits = sum(top == entity for top, (entity, _) in zip(tops, pairs))
    return {"recall": round(100 * hits / max(len(pairs), 1), 2), "entities": len({e for e, _ in pairs}),
            "texts": len(pairs)}  # fmt: skip


@torch.no_grad()
def first_mention_tops(model: Any, tokenizer: Any, texts: Sequence[str]) -> list[int | None]:
    """For each text, the encoder memory's top entity at its first marked mention (None: no mention), as `model`
    finds it with its entity mask; `BATCH_SIZE` texts at a time, cut to the model's positions."""
    tops: list[int | None] = []
    for begin in range(0, len(texts), BATCH_SIZE):
        chunk = list(texts[begin : begin + BATCH_SIZE])
        batch = tokenizer(chunk, padding=True, truncation=True, max_length=model.config.max_position_embeddings,
                          return_tensors="pt")  # fmt: skip
        access = model.get_encoder()(**batch, output_attended_entities=True).memory_access
        first: dict[int, int] = {}
        for (row, _), top in zip(access.positions.tolist(), access.top_entity_ids[:, 0].tolist()):
            first.setdefault(row, top)
        tops += [first.get(row) for row in range(len(chunk))]
    return tops


def memory_diagnostics(
    model: Any,
    tokenizer: Any,
    questions_file: PathLike,
    *,
    added_questions_file: PathLike | None = None,
    texts: Mapping[str, Sequence[str]] | None = None,
    estimator: str | None = None,
    probed_relations: Sequence[str] = (),
    facts: Mapping[str, tuple[str, Sequence[str]]] | None = None,
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """Where `model` keeps what it knows about the subjects of `questions_file` (entities it was trained on): each
    diagnostic the arguments allow, by name.

    - `row_swap` on `questions_file`;
    - `oracle_read` on `added_questions_file` (questions about entities added after training) when given, else on
      `questions_file`;
    - `rewrite` of the subjects of `texts` (name -> texts about it), answering `questions_file`, by `estimator`;
    - `row_content` with `probed_relations`, fitted on the subjects of `questions_file` and scored on those of
      `added_questions_file` (both needed);
    - `written_facts` with `facts` (relation -> sentence form and values), for a model with a writer of entity rows,
      its names made of the subjects' of both files.

    The model is left as it was."""
    result = {"row_swap": row_swap(model, tokenizer, questions_file, seed),
              "oracle_read": oracle_read(model, tokenizer, added_questions_file or questions_file)}  # fmt: skip
    if texts:
        result["rewrite"] = rewrite(model, tokenizer, questions_file, texts, estimator)
    if probed_relations and added_questions_file is not None:
        result["row_content"] = row_content(model, [questions_file], added_questions_file, probed_relations)
    if facts and getattr(model, "entity_writer", None) is not None:
        files = [questions_file] + ([added_questions_file] if added_questions_file is not None else [])
        people = {r["link_target"][0] for f in files for r in read_jsonl(f)}
        result["written_facts"] = written_facts(model, tokenizer, people, facts, seed)
    return result


__all__ = [
    "answer_questions",
    "answers_that_follow",
    "exact_match_percent",
    "facts_by_subject",
    "first_mention_tops",
    "found_by_name",
    "linear_probe",
    "memory_diagnostics",
    "oracle_read",
    "pair_up",
    "rewrite",
    "row_content",
    "row_swap",
    "variance_shares_and_probe",
    "written_facts",
]

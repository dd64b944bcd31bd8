"""Where a grown model keeps what it knows (`toy_world_growth.py`'s diagnostics, beside
`edmem_hf.research.diagnostics`): whether any row could be found with the encoder as trained, the committed table
row swap, rewritten rows, rows of one fact, a row a sentence, what the writer's training passages state, and how the
reader takes a row whatever its subject's name looks like."""

from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

import torch
from transformers import AutoTokenizer

from edmem_hf import EDMemForConditionalGeneration
from edmem_hf.dump import iter_parsed_pages
from edmem_hf.pretraining import load_corpus
from edmem_hf.research.diagnostics import (
    answer_questions,
    answers_that_follow,
    exact_match_percent,
    facts_by_subject,
    oracle_read,
    pair_up,
    row_content,
    row_swap,
    written_facts,
)
from edmem_hf.research.diagnostics import rewrite as rewrite_rows
from edmem_hf.research.entity_growth import add_entities, write_rows_into_table, writer_inputs, written_rows
from edmem_hf.research.writer_batches import EntityPassages, WriterCollator
from edmem_hf.research.writer_training import WriterTrainingArguments
from edmem_hf.tasks import EDMemSeq2SeqCollator, encode_qa_record, read_jsonl, read_qa
from experiments.growth import PROBED_RELATIONS, WRITER, WRITTEN_FACTS, writer_texts
from experiments.memory import memory_top_names, subject_queries


def rows_alone_ceiling(model_dir: Path, files: dict[str, Path]) -> dict[str, float]:
    """Whether any way of writing rows can make the memory find the added people, with the encoder as trained: how
    alike the queries at different people's names are (mean cosine between people's mean question queries; trained
    test-half people against added ones), and the memory recall at the added subjects if each added row were the
    mean query of that person's own questions (scaled to the trained rows' mean norm): rows written from the very
    questions asked, a bound on any estimator, not one."""
    model = EDMemForConditionalGeneration.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    table = model.get_encoder().entity_embeddings.weight.detach()
    result = {}
    for split in ("test", "added"):
        names, queries = subject_queries(model, tokenizer, files[split])
        people = sorted(set(names))
        means = torch.stack([queries[[n == person for n in names]].mean(0) for person in people])
        cosine = torch.nn.functional.cosine_similarity(means[:, None], means[None], dim=-1)
        result[f"{split}_query_cosine_between_people"] = round(
            float(cosine[~torch.eye(len(people), dtype=bool)].mean()), 3
        )
        if split == "added":
            rows = torch.cat([table, means / means.norm(dim=-1, keepdim=True) * table.norm(dim=-1).mean()])
            own = torch.tensor([len(table) + people.index(n) for n in names])
            result["added_recall_with_rows_from_their_questions"] = round(
                100 * float(((queries @ rows.T).argmax(-1) == own).float().mean()), 2
            )
    return result


def _loaded(model_dir: Path):
    """The model saved in `model_dir` and its tokenizer, as every diagnostic reads them: afresh."""
    return EDMemForConditionalGeneration.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)


def table_row_swap(model_dir: Path, data_file: Path, seed: int) -> dict[str, float]:
    """The committed results' `row_swap`: the trained people of `data_file` in random pairs, each pair's table rows
    swapped, then answered as usual; `follow`, `kept` and `questions` as `diagnostics.row_swap` counts them. It
    cannot move an answer: the memory finds a row by its content, and a table with two rows swapped is the same set
    of rows, read the same at every mention; its `follow` is the share of answers that are the partner's by chance.
    Kept so that the committed figures are reproduced; `row_swap_read` (`diagnostics.row_swap`) forces the read onto
    the partner's row instead."""
    model, tokenizer = _loaded(model_dir)
    records = list(read_jsonl(data_file))
    partner = pair_up(sorted({r["link_target"][0] for r in records}), seed)
    table = model.get_encoder().entity_embeddings
    ids = torch.tensor([model.entity_vocab.id_of(p) for p in partner], dtype=torch.long)
    partner_ids = torch.tensor([model.entity_vocab.id_of(partner[p]) for p in partner], dtype=torch.long)
    with torch.no_grad():
        table.weight[ids] = table.weight[partner_ids].clone()
    if getattr(table, "written_rows", None) is not None:  # rows kept apart change owners too
        owner = dict(zip(partner_ids.tolist(), ids.tolist()))
        table.written_row_entity_ids = torch.tensor([owner.get(i, i) for i in table.written_row_entity_ids.tolist()])
    return answers_that_follow(records, partner, answer_questions(model, tokenizer, data_file))


def rewrite(model_dir: Path, data_file: Path, new_dump: str, estimator: str, added_texts: str = "passages"
            ) -> dict[str, float]:  # fmt: skip
    """`diagnostics.rewrite` of the trained people of `data_file`, their rows written from their passages in the
    full world's dump (the writer's from `added_texts`)."""
    people = sorted({r["link_target"][0] for r in read_jsonl(data_file)})
    texts = writer_texts(list(iter_parsed_pages(new_dump)), people, added_texts if estimator == WRITER else "passages")
    return rewrite_rows(*_loaded(model_dir), data_file, dict(zip(people, texts)), estimator)


def fact_rows(model_dir: Path, data_file: Path, new_dump: str) -> dict[str, float]:
    """EM on the added people's questions with each subject's row written by the model's writer from only the
    sentences of their own page that hold the asked answer, one fact a row as the one-fact practice people's rows
    are: found by the memory (`plain`) and with the read forced onto it (`oracle`). Beside `oracle_read`, a miss of
    rows written from whole biographies is then either six facts mixed in one row or a row not read. Then every
    fact's row of each person at once, an entity each (`"{name} ({relation})"`), their own rows hidden: EM
    (`several`) and how often the memory's top row at the subject is one of the person's (`several_person_found`)
    and the asked fact's (`several_fact_found`): whether the query picks a person's fact among their rows."""
    model = without_kept_rows(EDMemForConditionalGeneration.from_pretrained(model_dir))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    records = list(read_jsonl(data_file))
    people = sorted({record["link_target"][0] for record in records})
    sentences = dict(zip(people, writer_texts(list(iter_parsed_pages(new_dump)), people, "own-sentences")))
    table = model.get_encoder().entity_embeddings.weight
    rows_as_grown = table.detach().clone()
    answers: dict[str, dict[str, str]] = {"plain": {}, "oracle": {}}
    fact_texts: dict[tuple[str, str], list[str]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for relation in sorted({record["relation"] for record in records}):  # one question a person each
            asked = [record for record in records if record["relation"] == relation]
            names = [record["link_target"][0] for record in asked]
            for record, name in zip(asked, names):
                answer = record["answer"][0].lower()
                fact_texts[name, relation] = [text for text in sentences[name] if answer in text.lower()]
            ids = [model.entity_vocab.id_of(name) for name in names]
            texts = [fact_texts[name, relation] for name in names]
            write_rows_into_table(model, ids, writer_inputs(model, names, texts, tokenizer))
            asked_file = Path(folder) / f"{relation}.jsonl"
            asked_file.write_text("".join(json.dumps(record) + "\n" for record in asked), encoding="utf-8")
            answers["plain"].update(answer_questions(model, tokenizer, asked_file))
            answers["oracle"].update(answer_questions(model, tokenizer, asked_file, subjects_only=True))
            with torch.no_grad():
                table.copy_(rows_as_grown)
    figures = {mode: exact_match_percent(given, data_file) for mode, given in answers.items()}
    several = rows_as_entities(model_dir, data_file, fact_texts)
    figures["several"], figures["several_person_found"] = several["em"], several["person_found"]
    asked = [(record["link_target"][0], record["relation"]) for record in records]
    figures["several_fact_found"] = round(100 * sum(f == a for f, a in zip(several["found"], asked)) / len(asked), 2)
    return figures


def without_kept_rows(model):
    """`model` without the written rows its table keeps (`add_entities(..., rows_apart=True)`): each entity read
    through its table row again, which the diagnostics that write rows of their own need."""
    table = model.get_encoder().entity_embeddings
    if getattr(table, "written_rows", None) is not None:
        del table.written_rows, table.written_row_entity_ids
        model.config.written_entity_rows = 0
    return model


def sentence_rows(model_dir: Path, data_file: Path, new_dump: str) -> dict[str, float]:
    """Every sentence of each added person's own page a row, an entity each (`"{name} (i)"`), their own rows hidden,
    with no knowledge of which sentence states what: EM on their questions (`em`) and how often the memory's top row
    at the subject is one of the person's (`person_found`). How entities are added to a model trained with a row a
    passage (`--writer-rows-apart`); beside `fact_rows`' `several`, whose rows are chosen by the asked answer."""
    people = sorted({record["link_target"][0] for record in read_jsonl(data_file)})
    sentences = writer_texts(list(iter_parsed_pages(new_dump)), people, "own-sentences")
    texts = {(name, str(i)): [text] for name, own in zip(people, sentences) for i, text in enumerate(own)}
    figures = rows_as_entities(model_dir, data_file, texts)
    return {"em": figures["em"], "person_found": figures["person_found"]}


def rows_as_entities(model_dir: Path, data_file: Path, texts: dict[tuple[str, str], list[str]]) -> dict:
    """The people of `data_file` each read through several rows the writer writes, an entity each: `texts[name,
    label]` the texts of one row of `name` (entity `"{name} ({label})"`), their own rows hidden. EM on their
    questions (`em`), how often the memory's top row at the subject is one of the person's (`person_found`), and the
    `(name, label)` of that row at each question, in order (`found`; None where it is none of these)."""
    model = EDMemForConditionalGeneration.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    records = list(read_jsonl(data_file))
    people_ids = [model.entity_vocab.id_of(name) for name in {record["link_target"][0] for record in records}]
    keys = list(texts)
    rows = written_rows(model, writer_inputs(model, [name for name, _ in keys], list(texts.values()), tokenizer))
    entity_names = [f"{name} ({label})" for name, label in keys]
    add_entities(model, entity_names, rows=rows)
    mask = torch.ones(model.config.entity_vocab_size, dtype=torch.bool)
    mask[people_ids] = False
    model.set_entity_mask(mask)
    em = exact_match_percent(answer_questions(model, tokenizer, data_file), data_file)
    key_of = dict(zip(entity_names, keys))
    found = [key_of.get(name) for name in memory_top_names(model.eval(), tokenizer, data_file)]
    subjects = [record["link_target"][0] for record in records]
    person_found = sum(key is not None and key[0] == subject for key, subject in zip(found, subjects))
    return {"em": em, "person_found": round(100 * person_found / len(found), 2), "found": found}


def passage_facts(corpus: Path, files: list[Path]) -> dict[str, dict[str, float]]:
    """How often the passage a row is written from in the writer's training states the fact a question asks: for
    each relation of the questions in `files`, the share (%) of the subject's train passages that contain the answer,
    drawn uniformly and in proportion to their mentions of the subject (`--writer_passages_by_mentions`), averaged
    over the questions. A row written from a passage that does not state the fact cannot carry it."""
    datasets, vocab, tokenizer = load_corpus(str(corpus))
    passages = datasets["train"]
    index = EntityPassages.from_dataset(passages, len(vocab))
    texts = [tokenizer.decode(ids).lower() for ids in passages.with_format("numpy")["input_ids"]]
    shares: dict[str, dict[str, list[float]]] = {"uniform": {}, "by_mentions": {}}
    for record in (r for f in files for r in read_jsonl(f)):
        entity = vocab.id_of(record["link_target"][0])
        states = [record["answer"][0].lower() in texts[p] for p in index.of(entity)]
        if not states:
            continue
        mentions = index.mentions_of(entity)
        shares["uniform"].setdefault(record["relation"], []).append(statistics.fmean(states))
        by_mentions = float(mentions[states].sum() / mentions.sum())
        shares["by_mentions"].setdefault(record["relation"], []).append(by_mentions)
    result = {}
    for draw, by_relation in shares.items():
        result[draw] = {relation: round(100 * statistics.fmean(v), 2) for relation, v in sorted(by_relation.items())}
        result[draw]["all"] = round(statistics.fmean(result[draw].values()), 2)
    return result


def name_shape(model_dir: Path, corpus: Path, practice_people: Path, data_file: Path, seed: int,
               passages_per_row: int = 1) -> dict[str, float]:  # fmt: skip
    """Whether the reader takes a row whatever its subject's name looks like: the share of `data_file`'s questions
    (about practice people) whose answer the model predicts whole, teacher-forced, each question's subject read
    through a row written from its passages as the writer's training wrote it (`WriterCollator`: the mean of
    `passages_per_row` passages' rows), the subject named by its own name (`own_name`), by a fresh name of any two
    entities' words (`fresh_any_words`, how the writer's training renames by default), or by a fresh name of practice
    people's words (`fresh_people_words`). A reader that reads rows only for names no person could have answers
    `fresh_any_words` well and the others poorly."""
    model = without_kept_rows(EDMemForConditionalGeneration.from_pretrained(model_dir)).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    vocab = model.entity_vocab
    practice = [vocab.id_of(line.strip()) for line in practice_people.read_text(encoding="utf-8").splitlines()]
    options = WriterTrainingArguments(written_row_share=0.0, written_only_share=0.0,
                                      writer_passages_per_row=passages_per_row)  # fmt: skip
    written = WriterCollator.from_corpus(EDMemSeq2SeqCollator(tokenizer.pad_token_id), str(corpus), model, tokenizer,
                                         options, seed)  # fmt: skip
    written = replace(written, written_only_ids=practice)
    features = [encode_qa_record(row, tokenizer) for row in read_qa(str(data_file), vocab)]
    namings = {"own_name": dict(fresh_names=False), "fresh_any_words": {},
               "fresh_people_words": dict(fresh_names_like_written_only=True)}  # fmt: skip
    figures = {}
    for naming, changes in namings.items():
        collator = replace(written, options=replace(options, **changes))
        whole = []
        for start in range(0, len(features), 16):
            batch = collator(features[start : start + 16])
            with torch.no_grad():
                logits = model(**batch).logits
            labels = batch["labels"]
            whole += ((logits.argmax(-1) == labels) | (labels == -100)).all(1).tolist()
        figures[naming] = round(100 * sum(whole) / len(whole), 2)
    return {**figures, "questions": len(features)}


def diagnostics(trained: Path, grown: Path, estimator: str, files: dict[str, Path], new_dump: str, seed: int,
                out: Path, practice: tuple[Path, Path] | None = None, added_texts: str = "passages",
                passages_per_row: int = 1) -> dict[str, dict[str, float]]:  # fmt: skip
    """The diagnostics of a trained model and of it grown by `estimator` (kept in `out`, not run again; one added
    to the file when it lacks it). `practice`: the corpus and the practice people's file, for `name_shape`;
    `added_texts`: what the writer writes rewritten rows from; `passages_per_row`: as the writer's training pooled."""
    result = json.loads(out.read_text()) if out.exists() else {}
    todo = {"row_swap": lambda: table_row_swap(trained, files["test"], seed),
            "oracle_read": lambda: oracle_read(*_loaded(grown), files["added"]),
            "rewrite": lambda: rewrite(trained, files["test"], new_dump, estimator, added_texts),
            "row_content": lambda: row_content(_loaded(grown)[0], [files["train"], files["test"]], files["added"],
                                               tuple(PROBED_RELATIONS))}  # fmt: skip
    if estimator == WRITER:
        todo["fact_rows"] = lambda: fact_rows(grown, files["added"], new_dump)
        todo["sentence_rows"] = lambda: sentence_rows(grown, files["added"], new_dump)
        asked = [files[split] for split in ("train", "test", "added")]
        todo["written_facts"] = lambda: written_facts(  # the people are read only when the figure is not kept yet
            *_loaded(trained),
            {person for r in PROBED_RELATIONS for person in facts_by_subject(asked, r)},
            WRITTEN_FACTS,
            seed,
        )
        if practice is not None and "practice" in files:
            todo["name_shape"] = lambda: name_shape(trained, *practice, files["practice"], seed, passages_per_row)
    todo["row_swap_read"] = lambda: row_swap(*_loaded(trained), files["test"], seed)
    for name, measure in todo.items():
        if name not in result:
            result[name] = measure()
            out.write_text(json.dumps(result, indent=1))
    return result

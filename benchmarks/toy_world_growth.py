"""New entities the model uses: people written into a trained EDMem's memory from their biographies, asked the same
questions as the people it was trained with (issue 27, item 5; docs/evidence.md).

For each seed, a knowledge world (`edmem_hf.knowledge_world`) loses some of its people (`without_people`: their
pages, every link to them, every question about them). EDMem is pre-trained on that smaller world and fine-tuned
on the questions about half of its people, as `toy_world_qa.py` does. Then the full world's dump arrives, the held-
out people's biographies among its pages, and they are added as `edmem add-entities` adds them
(`new_entity_passages`), each way of writing the rows in turn:

- `mean_query`: `entity_growth.add_entities` (the scaled mean memory query at their mentions, no gradient step);
- `fitted`: `row_fitting.fit_new_entities` (those rows, then trained alone on the pre-training objective over
  the new passages, with trained people's passages as negatives; every other weight frozen);
- `fitted_pretraining`: the mean-query rows trained alone (`row_fitting.fit_rows`) on the full world's
  pre-training passages (`edmem build-corpus` of the new dump: every mention marked and labelled, the places a
  person links to among them), those that mention a new person against the others;
- `random` (a control with no information, at the trained rows' norm).

Beside it, EDMem with a writer of entity rows (`EDMemConfig.entity_row_writer`; off with `--no-writer`), pre-trained
and fine-tuned reading rows written from other passages (`writer_batches.WriterCollator`), grown by
`add_entities` with its writer (`writer`; before adding: `writer_before`). With `--practice-people N`, N more people
are in the old world's pages (and its mixed questions), asked in no question file: the writer's training reads them
through written rows only (docs/model.md, "Practice entities"); every model reads the same pages. A stream of them
(docs/model.md, "A stream of practice entities"): `--practice-biographies K` puts each on their own page of K
biographies, linked from no other, `--practice-share S` makes their passages and questions S of those every model
reads (`edmem pretrain --balanced_entities_file`), `--practice-questions-people M` mixes the questions of M of them
(a world of its own: give it its own `--out`). `--practice-one-fact-pages K` states each practice person by one fact
only, on K pages of one sentence (`knowledge_world.one_fact_people`; a world of its own too);
`--practice-sentence-pages K` states each by every fact, each fact on K pages of one sentence
(`knowledge_world.sentence_page_people`, another world). With
`--written-table`, the writer's model leaves pre-training with every entity's row written from its passages
(`edmem pretrain --written_table`), in folders of its own (`writer-written-table`). With `--reader-steps N`, a second
stage of N steps follows, the writer and its table frozen (`edmem pretrain --frozen_writer`, TOME's second stage), in
folders of its own (`...-frozen-writer-N`); `--reader-names-like-written-only`, `--reader-row-autoencoding-share`,
`--reader-fresh-name-share` and `--reader-decoy-rows` are levers of that stage alone. `--writer-mean-row-probability`
trains the writer's model to give an entity of several rows the mean of their probabilities (`edmem pretrain
--writer_mean_row_probability`, `...-mean-rows`); `--mean-row-probability-at-test` reads a model trained without it
with it (a copy, `...-mean-rows-at-test`).
`--added-texts own-sentences` writes an added person's row (and a rewritten one) as
the mean of rows written from each sentence of their own page, not from the passages around their mentions.

Scored by `edmem evaluate`'s code, free and static decoding: *added*, the six questions about each added person;
*trained*, the questions about the test-half people (read in pre-training, never fine-tuned on), before and after
adding. *Memory recall* is how often the memory's top entity at the question's marked subject is the subject. The
*floor* is the majority answer of each question form. The ceiling is continued pre-training: the grown pre-trained
model pre-trained further on the full world (`--continued-steps`, with the questions the pre-training mixed in), then
fine-tuned as before (skipped in `--quick`). Where each model keeps what it knows (`diagnostics`, for the default
EDMem with mean-query rows and for the writer; `edmem_hf.research.diagnostics`): *row swap*, trained people in
pairs, each one's questions answered with the encoder's memory read forced onto the partner's row, the share of
their answers that follow the row (`row_swap_read`; `row_swap`, the committed figure, swaps the table's rows, which
moves no answer: `table_row_swap`); *oracle read*, the added people's questions with the encoder's memory read forced
onto the subject's new row (EM with finding solved); *rewrite*, the trained
people's rows replaced by rows written from their passages (their EM kept); *row content*, a linear probe fitted on
the trained people's rows reading the added people's occupation and field from theirs; for the writer, *written
facts*, the shares of its rows' variance that a sentence's name and its fact explain, and a probe at the fact, and
*fact rows*, the added people's questions with each subject's row written from only the sentences holding the asked
answer (found, and with the read forced onto it), and with every fact's row of each in the table at once (which the
memory finds); with
practice people, *name shape*, their questions answered (teacher-forced) through a row written in the batch, the
subject under its own name, a fresh name of any entities' words, or a fresh name of people's words.
Time to add 1,000 (and 100,000) entities is measured.

    python benchmarks/toy_world_growth.py --quick --out runs/growth-quick
    python benchmarks/toy_world_growth.py --out runs/growth

A rerun with the same `--out` reuses what is done. Ends with one line `RESULT key=value ...` (means over seeds).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from experiments.memory import hidden_rows, memory_top_names, memory_tops_and_subjects, save_entity_mask  # noqa: E402
from experiments.options import experiment_parser, quiet_logging, with_overrides  # noqa: E402
from experiments.qa_world import with_questions_in_pages, write_released_format  # noqa: E402
from experiments.scoring import em, majority_answers, question_hits  # noqa: E402
from experiments.training import finetune_model, predict, pretrain_variant, pretraining_schedule  # noqa: E402
from toy_world_qa import QUICK as QA_QUICK  # noqa: E402
from toy_world_qa import RECIPES, Settings  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from edmem_hf import EDMemForConditionalGeneration, EntityVocab  # noqa: E402
from edmem_hf.corpus import build_corpus  # noqa: E402
from edmem_hf.dump import iter_parsed_pages  # noqa: E402
from edmem_hf.knowledge_world import (  # noqa: E402
    FIELDS,
    OCCUPATIONS,
    TEMPLATES,
    KnowledgeWorldSettings,
    generate_knowledge_world,
    one_fact_people,
    page_only_people,
    sentence_page_people,
    split_people,
    without_people,
)
from edmem_hf.pretraining import PretrainingArguments, build_config, load_corpus, pretrain, pretraining_options  # noqa: E402
from edmem_hf.research.diagnostics import (  # noqa: E402
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
from edmem_hf.research.diagnostics import rewrite as rewrite_rows  # noqa: E402
from edmem_hf.research.entity_growth import (  # noqa: E402
    add_entities,
    write_rows_into_table,
    writer_inputs,
    written_rows,
)
from edmem_hf.research.new_entity_text import new_entity_passages, own_page_sentences  # noqa: E402
from edmem_hf.research.row_fitting import corpus_entity_ids, fit_new_entities, fit_rows, pretraining_examples  # noqa: E402
from edmem_hf.research.writer_batches import EntityPassages, WriterCollator  # noqa: E402
from edmem_hf.research.writer_training import WriterTrainingArguments  # noqa: E402
from edmem_hf.task_features import in_running_text  # noqa: E402
from edmem_hf.tasks import EDMemSeq2SeqCollator, encode_qa_record, read_jsonl, read_qa  # noqa: E402
from edmem_hf.toy_world import write_mediawiki_dump  # noqa: E402

logger = logging.getLogger("toy_world_growth")
ESTIMATORS = ("mean_query", "fitted", "fitted_pretraining", "random")  # of the default EDMem
DEFAULT_ESTIMATOR = "mean_query"  # what `edmem add-entities` uses for a model without a writer
WRITER = "writer"  # EDMem with a writer of entity rows, grown with it; `writer_before`: that model before adding


@dataclass
class GrowthSettings:
    qa: Settings = field(default_factory=Settings)
    held_out_fraction: float = 0.2  # of the people: added after training
    fit_steps: int = 300
    fit_learning_rate: float = 3e-2
    negatives: int = 64  # trained people whose passages are the fit's negatives
    continued_steps: int = 1000  # continued pre-training on the full world, the ceiling (0: none)
    timed_additions: tuple[int, ...] = (1_000, 100_000)
    timed_estimators: tuple[str, ...] = ("mean_query", "fitted", "writer")
    time_the_base_shape: bool = True
    estimators: tuple[str, ...] = ESTIMATORS  # the default EDMem's ways of writing rows (mean_query always)
    writer: bool = True  # also EDMem with a writer of entity rows (pre-trained and fine-tuned reading written rows)
    written_row_share: float = 0.5
    written_only_share: float = 0.2
    writer_in_finetuning: bool = True  # fine-tuning reads written rows too (`--writer_corpus` of finetune_qa.py)
    # people in pre-training only (pages, and questions when they sit in the batches), never asked at test; the
    # writer's training reads them through written rows only, under fresh names (`--written_only_entities_file`)
    practice_people: int = 0
    # a stream of practice people: each on its own page only, of this many biographies (0: as the others), their
    # passages (and mixed questions) this share of those read in pre-training, every model alike
    # (`--balanced_entities_file`; 0: as the corpus has them), the questions of this many of them mixed (0: all)
    practice_biographies: int = 0
    practice_share: float = 0.0
    practice_questions_people: int = 0
    # each practice person stated by one fact only, on this many one-sentence pages (0: as the others)
    practice_one_fact_pages: int = 0
    # each practice person stated by every fact, each fact on this many one-sentence pages (0: as the others)
    practice_sentence_pages: int = 0
    written_table: bool = False  # the writer's model leaves pre-training with every row written (`--written_table`)
    row_autoencoding_share: float = 0.0  # the writer's training: passages read as their written row alone
    row_autoencoding_written_only: bool = False  # ... only passages about written-only (practice) entities
    writer_passages_by_mentions: bool = False  # the writer's training writes from passages that mention most
    writer_passages_per_row: int = 1  # the writer's training: each written row the mean of this many passages' rows
    writer_pools_texts: bool = True  # ... False: a row each of those passages, the query choosing among them
    writer_answer_rows: bool = False  # ... the linking gold among them: the rows naming what the passage hides
    writer_reads_answer_rows: bool = False  # ... and in training what such a mention reads
    writer_answer_rows_by_text: bool = False  # ... and, for a question, the rows whose passage holds its answer
    writer_mean_row_probability: bool = False  # the writer's model: an entity of several rows scored by their mean
    mean_row_probability_at_test: bool = False  # ... only once trained (a copy of the trained model with the option)
    entity_key_dim: int | None = None  # the writer's model: a row's columns that queries score (the rest its value)
    writer_dropout: float | None = None  # the writer's model's pre-training dropout (None: every model's, 0.1)
    # what the writer writes an added (and a rewritten) person's row from: "passages", the windows around their
    # mentions that `edmem add-entities` takes; "own-sentences", each sentence of their own page, a row the mean of
    # one-sentence rows (as one-fact practice people's rows were written in training)
    added_texts: str = "passages"
    fresh_names_like_written_only: bool = False  # the writer's training: fresh names of written-only entities' words
    writer_decoy_rows: int = 0  # the writer's training: decoys sharing a word with each renamed entity's fresh name
    # the writer's training continued this many steps more (`--model_name_or_path`, the same options, a schedule of
    # its own): whether a first stage that reads no written row learns to with more steps
    writer_more_steps: int = 0
    # TOME's second stage: after the writer's pre-training, this many steps with the writer, the lower encoder layers
    # and the table frozen (`--frozen_writer`), every entity of a batch read through a row written from another passage
    reader_steps: int = 0
    reader_names_like_written_only: bool = False  # the second stage only: fresh names of written-only entities' words
    reader_row_autoencoding_share: float = 0.0  # the second stage only: practice people's passages auto-encoded
    reader_fresh_name_share: float = 0.0  # the second stage only: that share of the other written entities renamed
    reader_decoy_rows: int = 0  # the second stage only: decoys of each renamed entity (else the first stage's)
    reader_decoys_for_every_entity: bool = False  # ... of every written entity, the trained ones too
    recipe: str = "paper"  # pre-training and fine-tuning levers of toy_world_qa's RECIPES (every model alike)


QUICK = GrowthSettings(qa=QA_QUICK, fit_steps=150, continued_steps=0, timed_additions=(1_000,),
                       time_the_base_shape=False)  # fmt: skip


# --- data -------------------------------------------------------------------------------------------------------


def make_worlds(settings: GrowthSettings, seed: int, out: Path) -> dict:
    """The old world (without the held-out people): dump, corpus, question files of its two halves; the full
    world's dump; the questions about the held-out people. With `practice_people`, that many more people in the
    old world's pages (and its mixed questions), their names in `practice_people.txt`, none of them in the train,
    validation, test or added questions; 20 of them are asked in `practice` (what each model learnt of them)."""
    qa = settings.qa
    world = generate_knowledge_world(KnowledgeWorldSettings(qa.num_people + settings.practice_people, qa.biographies),
                                     seed=seed)  # fmt: skip
    people = sorted(entity.name for entity in world.entities if entity.type == "person")
    practice = sorted(random.Random(f"{seed}-practice").sample(people, settings.practice_people))
    practice_set = set(practice)
    people = [name for name in people if name not in practice_set]
    held = sorted(random.Random(seed).sample(people, max(2, round(settings.held_out_fraction * len(people)))))
    worlds = ("practice_biographies", "practice_one_fact_pages", "practice_sentence_pages")
    if sum(bool(getattr(settings, name)) for name in worlds) > 1:
        raise ValueError(f"{', '.join('--' + name.replace('_', '-') for name in worlds)} are worlds of their own: "
                         "give one")  # fmt: skip
    old = without_people(world, held)
    if settings.practice_biographies:  # after without_people, which lists every person it keeps on place pages
        world, old = (page_only_people(w, practice, settings.practice_biographies) for w in (world, old))
    if settings.practice_one_fact_pages:
        world, old = (one_fact_people(w, practice, settings.practice_one_fact_pages) for w in (world, old))
    if settings.practice_sentence_pages:
        world, old = (sentence_page_people(w, practice, settings.practice_sentence_pages) for w in (world, old))
    splits = split_people(without_people(old, practice), seed)
    out.mkdir(parents=True, exist_ok=True)
    old_dump = write_mediawiki_dump(with_questions_in_pages(old, splits["train"]) if qa.questions_on_pages else old,
                                    out / "old-wiki.xml.bz2")  # fmt: skip
    new_dump = write_mediawiki_dump(world, out / "new-wiki.xml.bz2")
    corpus = out / "corpus"
    if not (corpus / "entity_vocab.json").exists():
        build_corpus(old_dump, corpus, num_entities=100_000, num_proc=2, vocab_size=3000, seed=seed)
    splits["added"] = [pair for pair in world.qa_pairs if pair.subject in held]
    if practice:  # questions of 20 practice people, asked to see what the models learnt of them
        asked = set(random.Random(f"{seed}-practice-asked").sample(practice, min(20, len(practice))))
        splits["practice"] = [pair for pair in world.qa_pairs if pair.subject in asked]
    files = {}
    for split, pairs in splits.items():
        files[split], files[f"{split}_links"] = write_released_format(pairs, split, out)
    mixed = qa.mixed_questions(files["train"])
    if practice:
        (out / "practice_people.txt").write_text("".join(f"{name}\n" for name in practice), encoding="utf-8")
        if mixed is not None:  # the train questions and the practice people's
            asked_in_mix = practice_set
            if settings.practice_questions_people:
                rng = random.Random(f"{seed}-practice-mixed")
                asked_in_mix = set(rng.sample(practice, min(settings.practice_questions_people, len(practice))))
            pairs = splits["train"] + [pair for pair in world.qa_pairs if pair.subject in asked_in_mix]
            mixed = write_released_format(pairs, "train_and_practice", out)[0]
    test_people = sorted({pair.subject for pair in splits["test"]})
    return {"held": held, "corpus": corpus, "new_dump": new_dump, "files": files, "test_people": test_people,
            "train_people": sorted({pair.subject for pair in splits["train"]}), "mixed_questions": mixed,
            "practice_people": out / "practice_people.txt" if practice else None, "practice": practice}  # fmt: skip


# --- growing ----------------------------------------------------------------------------------------------------


ADDED_TEXTS = ("passages", "own-sentences")


def writer_texts(pages: list, names: list[str], added_texts: str) -> list[list[str]]:
    """The texts the writer writes `names`' rows from (`GrowthSettings.added_texts`)."""
    if added_texts == "own-sentences":
        sentences = own_page_sentences(pages, names, max_sentences=None)
        if missing := [name for name in names if name not in sentences]:
            raise ValueError(f"no page with a sentence to write from for {missing}")
        return [sentences[name] for name in names]
    if added_texts != "passages":
        raise ValueError(f"added_texts must be one of {ADDED_TEXTS}, got {added_texts!r}")
    passages, _ = new_entity_passages(pages, known=())
    return [passages[name] for name in names]


def grow(model_dir: Path, new_dump: str, estimator: str, out: Path, held: list[str], settings: GrowthSettings,
         seed: int, negatives_from: list[str]) -> tuple[Path, float]:  # fmt: skip
    """The model at `model_dir` with the new pages' people added (rows by `estimator`), saved to `out`; the
    seconds the rows took (0 when reused). The writer writes from `settings.added_texts`."""
    if (out / "model.safetensors").exists():
        return out, json.loads((out / "seconds_to_add.json").read_text())
    model = EDMemForConditionalGeneration.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    known = [name for name in model.entity_vocab.names if name is not None]
    pages = list(iter_parsed_pages(new_dump))
    passages, _ = new_entity_passages(pages, known)
    if set(held) - set(passages):  # places no old page linked are new too: only the people are added here
        raise RuntimeError(f"no passages for the held-out {sorted(set(held) - set(passages))}")
    names = held
    if estimator == WRITER and settings.added_texts != "passages":
        texts = writer_texts(pages, names, settings.added_texts)
    else:
        texts = [passages[name] for name in names]
    started = time.perf_counter()
    if estimator in ("mean_query", WRITER):
        add_entities(model, names, texts, tokenizer, estimator=estimator)
    elif estimator == "fitted":
        everyone, _ = new_entity_passages(pages, known=())
        chosen = random.Random(seed).sample(negatives_from, min(settings.negatives, len(negatives_from)))
        negatives = {name: everyone[name][:4] for name in chosen if name in everyone}
        fit_new_entities(model, names, texts, tokenizer, negatives, steps=settings.fit_steps,
                         learning_rate=settings.fit_learning_rate, seed=seed)  # fmt: skip
    elif estimator == "fitted_pretraining":
        ids = add_entities(model, names, texts, tokenizer)
        examples = pretraining_examples(new_world_corpus(new_dump, out.parent, model_dir, seed), model.entity_vocab)
        new, about_new, others = set(ids), [], []
        for example in examples:
            (about_new if new & set(example["entity_labels"]) else others).append(example)
        fit_rows(model, ids, about_new, others, tokenizer, steps=settings.fit_steps,
                 learning_rate=settings.fit_learning_rate, seed=seed)  # fmt: skip
    elif estimator == "random":
        rows = torch.randn(len(names), model.config.entity_embed_dim, generator=torch.Generator().manual_seed(seed))
        norm = model.get_encoder().entity_embeddings.weight.norm(dim=-1).mean()
        add_entities(model, names, rows=rows / rows.norm(dim=-1, keepdim=True) * norm)
    else:
        raise ValueError(f"unknown estimator {estimator!r}")
    seconds = round(time.perf_counter() - started, 2)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "seconds_to_add.json").write_text(json.dumps(seconds))
    return out, seconds


def new_world_corpus(new_dump: str, out: Path, tokenizer_dir: Path, seed: int) -> Path:
    """`edmem build-corpus` of the full world's dump with the trained model's tokenizer (built once, in `out`)."""
    corpus = out / "corpus-new"
    if not (corpus / "entity_vocab.json").exists():
        build_corpus(new_dump, corpus, tokenizer=tokenizer_dir, num_entities=100_000, num_proc=2, seed=seed)
    return corpus


def corpus_in_model_ids(corpus: Path, vocab: EntityVocab):
    """The passages of an `edmem build-corpus` folder with their entity labels turned from the corpus vocabulary's
    ids into `vocab`'s (by name; an entity `vocab` lacks is unlabelled)."""
    datasets, _, _ = load_corpus(str(corpus))
    ids = corpus_entity_ids(corpus, vocab)
    return datasets.map(lambda row: {"entity_labels": [ids[i] if i >= 0 else i for i in row["entity_labels"]]})


def continued_folder(settings: GrowthSettings) -> str:
    """The ceiling's folder name (after `pretrain-` and `finetune-`): its steps in it where they are not the
    default's, so that a run of other steps never reuses another's model."""
    steps = settings.continued_steps
    return "continued" if steps == GrowthSettings.continued_steps else f"continued-{steps}"


def continue_pretraining(pretrained: Path, new_dump: str, out: Path, settings: GrowthSettings, seed: int,
                         held: list[str], questions: Path | None = None) -> Path:  # fmt: skip
    """The ceiling's model: the pre-trained model grown with the new people, pre-trained `continued_steps` more on
    the full world's corpus (its entity labels in the grown model's ids), with `questions` mixed into the batches as
    the pre-training had them (none of the added people's: they are the test)."""
    if (out / "model.safetensors").exists():
        return out
    grown, _ = grow(pretrained, new_dump, "mean_query", out.parent / "pretrain-grown", held, settings, seed, [])
    model = EDMemForConditionalGeneration.from_pretrained(grown)
    tokenizer = AutoTokenizer.from_pretrained(grown)
    datasets = corpus_in_model_ids(new_world_corpus(new_dump, out.parent, grown, seed), model.entity_vocab)
    options = pretraining_options(
        output_dir=str(out), decoder_target=RECIPES[settings.recipe].decoder_target,
        mixed_questions_file=questions and str(questions),
        **pretraining_schedule(settings.qa, settings.continued_steps, seed),
    )  # fmt: skip
    pretrain(**options, model=model, tokenizer=tokenizer, datasets=datasets, entity_vocab=model.entity_vocab)
    return out


# --- measuring --------------------------------------------------------------------------------------------------


def memory_finding(model_dir: Path, data_file: Path, hidden: list[str] | None = None) -> dict[str, float]:
    """`recall`: how often the memory's top entity at a question's marked subject is the subject (%);
    `misses_sharing_a_name_word`: how often it is another entity whose name shares a word with the subject's (%, of
    all the questions): whether a query that misses is keyed on one word of the name. `hidden`: names of entities
    whose rows are hidden meanwhile."""
    tops, subjects = memory_tops_and_subjects(model_dir, data_file, hidden or ())
    misses = [(top, subject) for top, subject in zip(tops, subjects) if top != subject]
    sharing = sum(top is not None and bool(set(top.split()) & set(subject.split())) for top, subject in misses)
    return {
        "recall": round(100 * (1 - len(misses) / len(subjects)), 2),
        "misses_sharing_a_name_word": round(100 * sharing / len(subjects), 2),
    }


def time_additions(
    model_dir: Path, sizes: tuple[int, ...], settings: GrowthSettings, record: Path, base_shape: bool,
    writer_dir: Path | None = None,
) -> dict[str, dict[str, dict[str, float]]]:  # fmt: skip
    """Seconds to add n new names (one passage each: a biography sentence, the name swapped in), by shape (the toy
    model of `model_dir`, or of `writer_dir` for the writer; the `edmem-base` preset's, random weights and a 1M-row
    table), estimator and n. Each figure is kept in `record` as soon as it is measured, and not measured again."""
    seconds = json.loads(record.read_text()) if record.exists() else {}
    shapes = ("toy_model", "edmem_base_shape") if base_shape else ("toy_model",)
    for shape in shapes:
        for n in sizes:
            for estimator in settings.timed_estimators:
                if str(n) in seconds.get(shape, {}).get(estimator, {}) or (estimator == WRITER and not writer_dir):
                    continue
                writer = estimator == WRITER
                model, tokenizer = _model_to_grow(writer_dir if writer else model_dir, shape, writer)
                figure = _timed_addition(model, tokenizer, n, estimator, settings)
                seconds.setdefault(shape, {}).setdefault(estimator, {})[str(n)] = figure
                record.write_text(json.dumps(seconds, indent=1))
                logger.info("%s: %d entities added (%s) in %.1f s", shape, n, estimator, figure)
    return seconds


def _model_to_grow(model_dir: Path, shape: str, writer: bool = False):
    """The fine-tuned toy model, or a model of the `edmem-base` preset's shape (random weights, 1M-row table; with a
    writer of entity rows when timing it)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if shape == "toy_model":
        return EDMemForConditionalGeneration.from_pretrained(model_dir), tokenizer
    size = 1_000_010
    with tempfile.TemporaryDirectory() as scratch:
        arguments = PretrainingArguments(output_dir=scratch, preset="edmem-base")
        config = build_config(arguments, tokenizer, size, WriterTrainingArguments(entity_row_writer=writer or None))
    model = EDMemForConditionalGeneration(config)
    model.entity_vocab = EntityVocab([f"Entity {i}" for i in range(size)], [[] for _ in range(size)], [0] * size)
    return model, tokenizer


def _timed_addition(model, tokenizer, n: int, estimator: str, settings: GrowthSettings) -> float:
    names = [f"Newcomer {i}" for i in range(n)]
    passages = [[f"<E_s> {name} <E_e> was born in 1931. She studied history at a university."] for name in names]
    started = time.perf_counter()
    if estimator in ("mean_query", WRITER):
        add_entities(model, names, passages, tokenizer, estimator=estimator, batch_size=256)
    else:
        fit_new_entities(model, names, passages, tokenizer, steps=settings.fit_steps,
                         learning_rate=settings.fit_learning_rate)  # fmt: skip
    return round(time.perf_counter() - started, 2)


@torch.no_grad()
def subject_queries(model, tokenizer, data_file: Path) -> tuple[list[str], torch.Tensor]:
    """The encoder memory's query at each question's marked subject (file order) for `model` in eval mode: the
    subjects' names and the `(questions, entity_embed_dim)` queries."""
    encoder = model.get_encoder()
    captured = []
    hook = encoder.memory.query_proj.register_forward_hook(lambda module, inputs, output: captured.append(output))
    names, queries = [], []
    for record, question in zip(read_jsonl(data_file), read_qa(data_file, model.entity_vocab)["question"]):
        captured.clear()
        encoder(**tokenizer([in_running_text(question)], return_tensors="pt"))
        names.append(record["link_target"][0])
        queries.append(captured[0][0])  # the first mention of the question is its subject
    hook.remove()
    return names, torch.stack(queries)


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


# --- where the knowledge is: the diagnostics ----------------------------------------------------------------------


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
    ids = torch.tensor([model.entity_vocab.id_of(p) for p in partner])
    partner_ids = torch.tensor([model.entity_vocab.id_of(partner[p]) for p in partner])
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


# Literal facts of 16 values each: enough people share a value for a linear probe to be fitted on 80 people.
PROBED_RELATIONS = {"occupation": OCCUPATIONS, "field": FIELDS}
# Their first sentence form and values, as `diagnostics.written_facts` takes them.
WRITTEN_FACTS = {relation: (TEMPLATES[relation][0], values) for relation, values in PROBED_RELATIONS.items()}


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


def floors(files: dict[str, Path], out: Path) -> dict[str, float]:
    """EM of the majority answer of each question form (from the fine-tuning questions) on each split."""
    return {split: em(question_hits(files[split], files[f"{split}_links"],
                                    majority_answers(files["train"], files[split], out / f"majority-{split}.json")))["all"]
            for split in ("added", "test")}  # fmt: skip


def writer_folder(settings: GrowthSettings) -> str:
    """The name in the folders of the writer's model (`pretrain-`, `finetune-`, `grown-`): a written table is a
    model of its own."""
    name = "writer-written-table" if settings.written_table else "writer"
    if settings.row_autoencoding_share:
        name += f"-row-autoencoding-{settings.row_autoencoding_share}"
        name += "-written-only" if settings.row_autoencoding_written_only else ""
    name += "-by-mentions" if settings.writer_passages_by_mentions else ""
    if settings.writer_passages_per_row != 1 or not settings.writer_pools_texts:  # a model of its own either way
        name += f"-{'pooled' if settings.writer_pools_texts else 'rows'}-{settings.writer_passages_per_row}"
    name += "-answer-rows" if settings.writer_answer_rows else ""
    name += "-by-text" if settings.writer_answer_rows_by_text else ""
    name += "-read" if settings.writer_reads_answer_rows else ""
    name += "-mean-rows" if settings.writer_mean_row_probability else ""
    name += "-names-like-written-only" if settings.fresh_names_like_written_only else ""
    name += f"-share-{settings.written_row_share}" if settings.written_row_share != 0.5 else ""
    name += f"-decoys-{settings.writer_decoy_rows}" if settings.writer_decoy_rows else ""
    name += f"-key-{settings.entity_key_dim}" if settings.entity_key_dim else ""
    name += f"-dropout-{settings.writer_dropout}" if settings.writer_dropout is not None else ""
    name += f"-more-{settings.writer_more_steps}" if settings.writer_more_steps else ""
    if settings.reader_steps:
        name += f"-frozen-writer-{settings.reader_steps}"
        name += "-names-like-written-only" if settings.reader_names_like_written_only else ""
        share = settings.reader_row_autoencoding_share
        name += f"-row-autoencoding-{share}" if share else ""
        name += f"-fresh-names-{settings.reader_fresh_name_share}" if settings.reader_fresh_name_share else ""
        name += f"-decoys-{settings.reader_decoy_rows}" if settings.reader_decoy_rows else ""
        name += "-every-entity" if settings.reader_decoys_for_every_entity else ""
    name += "-mean-rows-at-test" if settings.mean_row_probability_at_test else ""
    return name


def with_mean_row_probability(trained: Path, out: Path) -> Path:
    """`out`: a copy of the model in `trained` that gives an entity of several rows the mean of their probabilities
    (`writer_mean_row_probability`), for a model trained without the option: what the option does at reading alone."""
    if not (out / "model.safetensors").exists():
        model = EDMemForConditionalGeneration.from_pretrained(trained, writer_mean_row_probability=True)
        model.save_pretrained(out)
        AutoTokenizer.from_pretrained(trained).save_pretrained(out)
    return out


def texts_suffix(settings: GrowthSettings) -> str:
    """What the writer's grown model and diagnostics add to their names when added people are written from other
    texts than their passages."""
    return "" if settings.added_texts == "passages" else f"-from-{settings.added_texts}"


def models_folder(seed_dir: Path, settings: GrowthSettings) -> Path:
    """Where a seed's models go: beside its world for the paper's recipe, in `recipe-NAME` for another, so that a
    run with another recipe never reuses the paper's models."""
    return seed_dir if settings.recipe == "paper" else seed_dir / f"recipe-{settings.recipe}"


def run_seed(settings: GrowthSettings, seed: int, out: Path) -> dict:
    started = time.perf_counter()
    data = make_worlds(settings, seed, out)
    world, out = out, models_folder(out, settings)
    out.mkdir(parents=True, exist_ok=True)
    files, held = data["files"], data["held"]
    recipe, questions = RECIPES[settings.recipe], data["mixed_questions"]
    balance = practice_balance(settings, data)
    pretrained = pretrain_variant("edmem", data["corpus"], out / "pretrain-edmem", settings.qa, seed, None, recipe,
                                  questions, **balance)  # fmt: skip
    weight = recipe.finetune_entity_loss_weight
    finetuned = finetune_model(pretrained, files["train"], out / "finetune", settings.qa, seed, None, weight)
    logger.info("seed %d: pre-trained and fine-tuned without %d people (%.0f s)", seed, len(held),
                time.perf_counter() - started)  # fmt: skip
    models, seconds = {"before": finetuned}, {}
    for estimator in dict.fromkeys((DEFAULT_ESTIMATOR, *settings.estimators)):
        models[estimator], seconds[estimator] = grow(finetuned, data["new_dump"], estimator, out / f"grown-{estimator}",
                                                     held, settings, seed, data["train_people"])  # fmt: skip
    if settings.writer:
        folder = writer_folder(settings)
        first_stage = replace(settings, reader_steps=0, mean_row_probability_at_test=False)
        writer_options = dict(entity_row_writer=True, written_row_share=settings.written_row_share,
                              written_table=settings.written_table,
                              row_autoencoding_share=settings.row_autoencoding_share,
                              row_autoencoding_written_only=settings.row_autoencoding_written_only,
                              writer_pools_texts=settings.writer_pools_texts,
                              writer_mean_row_probability=settings.writer_mean_row_probability or None,
                              fresh_names_like_written_only=settings.fresh_names_like_written_only,
                              writer_decoy_rows=settings.writer_decoy_rows, entity_key_dim=settings.entity_key_dim,
                              **written_rows_options(settings, data), **balance, **writer_dropout(settings))  # fmt: skip
        trained_alone = out / f"pretrain-{writer_folder(replace(first_stage, writer_more_steps=0))}"
        writer = pretrain_variant("edmem", data["corpus"], trained_alone, settings.qa, seed, None, recipe, questions,
                                  **writer_options)  # fmt: skip
        if settings.writer_more_steps:
            writer = pretrain_variant("edmem", data["corpus"], out / f"pretrain-{writer_folder(first_stage)}",
                                      replace(settings.qa, pretrain_steps=settings.writer_more_steps), seed, None,
                                      recipe, questions, model_name_or_path=str(writer), **writer_options)  # fmt: skip
        if settings.reader_steps:
            trained = writer_folder(replace(settings, mean_row_probability_at_test=False))
            writer = pretrain_reader(writer, data, out / f"pretrain-{trained}", settings, seed, recipe, questions)
        if settings.mean_row_probability_at_test:
            writer = with_mean_row_probability(writer, out / f"pretrain-{folder}")
        options = ("--writer_corpus", str(data["corpus"])) if settings.writer_in_finetuning else ()
        options += ("--frozen_writer",) if options and settings.reader_steps else ()  # the second stage's writer kept
        models[f"{WRITER}_before"] = finetune_model(writer, files["train"], out / f"finetune-{folder}", settings.qa, seed,
                                                    None, weight, options=options)  # fmt: skip
        models[WRITER], seconds[WRITER] = grow(models[f"{WRITER}_before"], data["new_dump"], WRITER,
                                               out / f"grown-{folder}{texts_suffix(settings)}", held, settings, seed,
                                               data["train_people"])  # fmt: skip
    if settings.continued_steps:
        ceiling = continued_folder(settings)
        continued = continue_pretraining(pretrained, data["new_dump"], out / f"pretrain-{ceiling}", settings, seed,
                                         held, questions)  # fmt: skip
        models["continued_pretraining"] = finetune_model(continued, files["train"], out / f"finetune-{ceiling}",
                                                         settings.qa, seed, None, weight)  # fmt: skip
    results: dict[str, dict] = {}
    for name, model_dir in models.items():
        # what the practice people's rows take: the figures again with them hidden (one mask file a model)
        practice_mask = (
            practice_rows_mask(model_dir, data["practice"]) if data["practice_people"] is not None else None
        )
        for split in ("added", "test", "practice"):
            if split == "test" and name == "random":
                continue
            if split == "practice" and (split not in files or name not in ("before", f"{WRITER}_before")):
                continue
            figures = {}
            for mode in ("free", "static"):
                path = predict(model_dir, files[split], model_dir / f"predict-{split}-{mode}", mode, settings.qa, seed)
                figures[mode] = em(question_hits(files[split], files[f"{split}_links"], path))
            finding = memory_finding(model_dir, files[split])
            figures["memory_recall"] = finding["recall"]
            figures["memory_misses_sharing_a_name_word"] = finding["misses_sharing_a_name_word"]
            if practice_mask is not None and split != "practice":
                finding = memory_finding(model_dir, files[split], hidden=data["practice"])
                figures["memory_recall_practice_rows_hidden"] = finding["recall"]
                figures["memory_misses_sharing_a_name_word_practice_rows_hidden"] = finding[
                    "misses_sharing_a_name_word"
                ]
                path = predict(model_dir, files[split], model_dir / f"predict-{split}-free-practice-rows-hidden", "free",
                               settings.qa, seed, entity_mask_file=practice_mask)  # fmt: skip
                figures["free_practice_rows_hidden"] = em(question_hits(files[split], files[f"{split}_links"], path))
            results.setdefault(split, {})[name] = figures
    results["rows_alone"] = rows_alone_ceiling(finetuned, files)
    asked = [files[split] for split in ("train", "test", "practice") if split in files]
    results["passage_facts"] = passage_facts(data["corpus"], asked)
    results["floor"] = floors(files, world)
    results["diagnostics"] = {"default": diagnostics(finetuned, models[DEFAULT_ESTIMATOR], DEFAULT_ESTIMATOR, files,
                                                     data["new_dump"], seed, out / "diagnostics-default.json")}  # fmt: skip
    if settings.writer:
        results["diagnostics"][WRITER] = diagnostics(models[f"{WRITER}_before"], models[WRITER], WRITER, files,
                                                     data["new_dump"], seed,
                                                     out / f"diagnostics-{folder}{texts_suffix(settings)}.json",
                                                     (data["corpus"], data["practice_people"]) if data["practice"] else None,
                                                     settings.added_texts, settings.writer_passages_per_row)  # fmt: skip
    sizes = {split: sum(1 for _ in open(files[split], encoding="utf-8")) for split in ("train", "test", "added")}
    # this call's time: what a rerun with the same --out reuses (pre-training, fine-tuning) costs nothing here
    return {"seed": seed, "held_out": held, "questions": sizes, "results": results, "seconds_to_add": seconds,
            "models": {name: str(path) for name, path in models.items()},
            "seconds_this_call": round(time.perf_counter() - started)}  # fmt: skip


def pretrain_reader(
    writer: Path, data: dict, out: Path, settings: GrowthSettings, seed: int, recipe, questions
) -> Path:
    """TOME's second stage: the writer's model pre-trained `reader_steps` more with the writer, what it reads and the
    table it writes frozen (`--frozen_writer`), every entity of a batch (up to `max_written_rows`) read through a row
    written from another passage than the one read: the rows it searches and reads are the rows added people get.
    `reader_names_like_written_only`, `reader_row_autoencoding_share` (of the practice people's passages only),
    `reader_fresh_name_share` and `reader_decoy_rows` are this stage's own levers, the first stage trained without
    them."""
    return pretrain_variant("edmem", data["corpus"], out, replace(settings.qa, pretrain_steps=settings.reader_steps),
                            seed, None, recipe, questions, model_name_or_path=str(writer), frozen_writer=True,
                            written_row_share=1.0, **written_rows_options(settings, data),
                            fresh_names_like_written_only=settings.fresh_names_like_written_only
                            or settings.reader_names_like_written_only,
                            row_autoencoding_share=settings.reader_row_autoencoding_share,
                            row_autoencoding_written_only=bool(settings.reader_row_autoencoding_share),
                            fresh_name_share=settings.reader_fresh_name_share,
                            writer_decoy_rows=settings.reader_decoy_rows or settings.writer_decoy_rows,
                            writer_decoys_for_every_entity=settings.reader_decoys_for_every_entity,
                            **practice_balance(settings, data),
                            **writer_dropout(settings))  # fmt: skip


def written_rows_options(settings: GrowthSettings, data: dict) -> dict:
    """The pre-training options both stages of the writer's model share: which entities are read only through
    written rows, and which passages a row is written from and which rows answer."""
    return dict(written_only_share=settings.written_only_share,
                written_only_entities_file=data["practice_people"] and str(data["practice_people"]),
                writer_passages_by_mentions=settings.writer_passages_by_mentions,
                writer_passages_per_row=settings.writer_passages_per_row,
                writer_answer_rows=settings.writer_answer_rows,
                writer_reads_answer_rows=settings.writer_reads_answer_rows,
                writer_answer_rows_by_text=settings.writer_answer_rows_by_text)  # fmt: skip


def writer_dropout(settings: GrowthSettings) -> dict:
    """The writer's model's `dropout` pre-training option (none: every model's)."""
    return {} if settings.writer_dropout is None else {"dropout": settings.writer_dropout}


def practice_balance(settings: GrowthSettings, data: dict) -> dict:
    """The pre-training options that make the practice people's examples `practice_share` of those read (none when
    it is 0): the same for every model, so that each reads the other people as often."""
    if not settings.practice_share or data["practice_people"] is None:
        return {}
    return {"balanced_entities_file": str(data["practice_people"]), "balanced_entities_share": settings.practice_share}


def practice_rows_mask(model_dir: Path, practice: list[str]) -> Path:
    """A memory mask file (`--entity_mask_file`) hiding the practice people's rows from the model's memory: they are
    scaffolding of the writer's training, asked nothing at test, and their written rows take other people's queries."""
    vocab = EntityVocab.load(model_dir)
    return save_entity_mask(hidden_rows(len(vocab), practice, vocab), model_dir / "practice_rows_hidden_mask.pt")


def summarise(runs: list[dict]) -> dict:
    """Mean and spread over the seeds of every figure."""

    def walk(path: tuple[str, ...], node):
        if isinstance(node, dict):
            return {key: walk(path + (key,), value) for key, value in node.items()}
        values = []
        for run in runs:
            value = run["results"]
            for key in path:
                value = value[key]
            values.append(value)
        return {"mean": round(statistics.fmean(values), 2), "std": round(statistics.pstdev(values), 2)}

    return walk((), runs[0]["results"])


def plot(summary: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [("added", "before", "added people, before adding"), ("added", "random", "added, random rows"),
            ("added", "mean_query", "added, mean query"), ("added", "fitted", "added, fitted rows"),
            ("added", "fitted_pretraining", "added, rows fitted on pre-training passages"),
            ("added", "continued_pretraining", "added, continued pre-training"),
            ("added", "writer", "added, rows by the writer (EDMem with a writer)"),
            ("test", "writer_before", "trained, EDMem with a writer"),
            ("test", "before", "trained test-half people, before"), ("test", "fitted", "trained, after fitted rows")]  # fmt: skip
    bars = [bar for bar in bars if bar[1] in summary[bar[0]]]
    groups = [("free", "all"), ("free", "entity"), ("free", "literal"), ("static", "entity"), ("memory_recall", None)]
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / len(bars)
    for i, (split, name, label) in enumerate(bars):
        figures = summary[split][name]
        means = [figures[m][k]["mean"] if k else figures[m]["mean"] for m, k in groups]
        stds = [figures[m][k]["std"] if k else figures[m]["std"] for m, k in groups]
        ax.bar([x + i * width for x in range(len(groups))], means, width, yerr=stds, label=label, capsize=2)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(groups))],
                  ["EM free", "EM free, entity", "EM free, literal", "EM static, entity", "memory recall@1"])  # fmt: skip
    ax.set_ylabel("%")
    ax.set_title("People added after training against people trained in pre-training")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "growth.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def headline_figures(summary: dict, writer: bool) -> dict:
    """The issue's figures, for the writer (or, without it, the default EDMem with its default estimator): the added
    people's EM over the trained people's, above the floor (`(added - floor) / (trained - floor)`, each split's
    majority-answer EM its floor) and with it; the added people's memory recall; the trained people's EM change on
    adding; the share of answers that follow a swapped row (the default EDMem's is `row_swap_follow_default` among
    the diagnostics); and the trained people's EM lost to training the writer (the default EDMem's less the
    writer's, before adding). With practice people, the same EMs with their rows hidden from the memory
    (`..._practice_rows_hidden`): they are scaffolding of the writer's training, asked nothing at test. A ratio whose
    trained EM is at its floor is None."""

    def mean(*path: str) -> float:
        node = summary
        for key in path:
            node = node[key]
        return node["mean"]

    system, before = (WRITER, f"{WRITER}_before") if writer else (DEFAULT_ESTIMATOR, "before")
    trained, added = mean("test", before, "free", "all"), mean("added", system, "free", "all")
    floor_added, floor_trained = mean("floor", "added"), mean("floor", "test")

    def above_floor(added: float, trained: float) -> float | None:
        return round((added - floor_added) / (trained - floor_trained), 3) if trained > floor_trained else None

    diagnostics = summary["diagnostics"]
    figures = {
        "estimator": system,
        "added_over_trained_em": above_floor(added, trained),
        "added_over_trained_em_with_floor": round(added / trained, 3) if trained else None,
        "added_recall": mean("added", system, "memory_recall"),
        "trained_em_change": round(mean("test", system, "free", "all") - trained, 2),
        "trained_em": trained,
        "added_em": added,
        "row_swap_follow": diagnostics["writer" if writer else "default"]["row_swap"]["follow"]["mean"],
    }  # fmt: skip
    if writer:
        figures["writer_cost_on_trained_em"] = round(mean("test", "before", "free", "all") - trained, 2)
    hidden = "free_practice_rows_hidden"
    if hidden in summary["test"][before]:  # the same, the practice people's rows hidden
        hidden_trained, hidden_added = mean("test", before, hidden, "all"), mean("added", system, hidden, "all")
        figures["added_over_trained_em_practice_rows_hidden"] = above_floor(hidden_added, hidden_trained)
        figures["trained_em_practice_rows_hidden"] = hidden_trained
        figures["added_em_practice_rows_hidden"] = hidden_added
        figures["trained_em_change_practice_rows_hidden"] = round(
            mean("test", system, hidden, "all") - hidden_trained, 2
        )
        if writer:
            default = mean("test", "before", hidden, "all")
            figures["writer_cost_on_trained_em_practice_rows_hidden"] = round(default - hidden_trained, 2)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = experiment_parser(__doc__.split("\n")[0], "runs/toy-world-growth")
    parser.add_argument("--fit-steps", type=int, help="override the fitted estimator's steps")
    parser.add_argument("--continued-steps", type=int, help="override the continued pre-training steps (0: none)")
    parser.add_argument("--timed-additions", type=int, nargs="*", help="override the sizes timed (none: no timing)")
    parser.add_argument("--no-base-shape", action="store_true", help="skip timing at the edmem-base shape")
    parser.add_argument("--timed-estimators", nargs="+", choices=GrowthSettings.timed_estimators,
                        help="override the estimators timed (default: all)")  # fmt: skip
    parser.add_argument("--estimators", nargs="+", choices=ESTIMATORS,
                        help="the default EDMem's ways of writing rows to run (default: all; mean_query always)")  # fmt: skip
    parser.add_argument("--writer", action=argparse.BooleanOptionalAction,
                        help="also EDMem with a writer of entity rows (default: on)")  # fmt: skip
    parser.add_argument("--written-row-share", type=float, help="the writer's training: share of written rows")
    parser.add_argument("--written-only-share", type=float, help="the writer's training: written-only entities")
    parser.add_argument("--practice-people", type=int,
                        help="people in pre-training only, read by the writer's training through written rows only")  # fmt: skip
    parser.add_argument("--practice-biographies", type=int,
                        help="a stream of practice people: each on its own page only, of this many biographies "
                             "(default: 0, as the others, on place pages too)")  # fmt: skip
    parser.add_argument("--practice-one-fact-pages", type=int,
                        help="each practice person stated by one fact only, on this many one-sentence pages "
                             "(default: 0, as the others)")  # fmt: skip
    parser.add_argument("--practice-sentence-pages", type=int,
                        help="each practice person stated by every fact, each fact on this many one-sentence pages "
                             "(default: 0, as the others)")  # fmt: skip
    parser.add_argument("--practice-share", type=float,
                        help="the practice people's passages (and mixed questions) this share of those read in "
                             "pre-training, every model alike (default: 0, as the corpus has them)")  # fmt: skip
    parser.add_argument("--practice-questions-people", type=int,
                        help="the questions of this many practice people mixed into pre-training (default: 0, all)")  # fmt: skip
    parser.add_argument("--written-table", action=argparse.BooleanOptionalAction,
                        help="the writer's model leaves pre-training with every row written from text (default: off)")  # fmt: skip
    parser.add_argument("--row-autoencoding-share", type=float,
                        help="the writer's training: share of the passages about a written entity read as its "
                             "written row alone, the decoder rebuilding the passage (default: 0)")  # fmt: skip
    parser.add_argument("--row-autoencoding-written-only", action=argparse.BooleanOptionalAction,
                        help="row auto-encoding of passages about written-only (practice) entities only (default: off)")  # fmt: skip
    parser.add_argument("--writer-passages-by-mentions", action=argparse.BooleanOptionalAction,
                        help="the writer's training draws the passage a row is written from in proportion to its "
                             "mentions of the entity (default: off, uniformly)")  # fmt: skip
    parser.add_argument("--writer-passages-per-row", type=int,
                        help="the writer's training: each written row the mean of the rows written from this many "
                             "passages (default: 1)")  # fmt: skip
    parser.add_argument("--writer-rows-apart", dest="writer_pools_texts", action="store_false", default=None,
                        help="the writer's training: the passages of --writer-passages-per-row each a row of their "
                             "own, the query choosing among them (`edmem pretrain --writer_pools_texts false`)")  # fmt: skip
    parser.add_argument("--writer-answer-rows", action="store_true", default=None,
                        help="with --writer-rows-apart: the linking loss's gold among an entity's rows, those written "
                             "from a passage that names what the passage read hides (`edmem pretrain "
                             "--writer_answer_rows`)")  # fmt: skip
    parser.add_argument("--writer-reads-answer-rows", action="store_true", default=None,
                        help="with --writer-answer-rows: in training, a mention reads its entity's rows that answer "
                             "alone (`edmem pretrain --writer_reads_answer_rows`)")  # fmt: skip
    parser.add_argument("--writer-answer-rows-by-text", action="store_true", default=None,
                        help="with --writer-answer-rows: a question's rows that answer are also those whose passage "
                             "holds its answer's words, for facts that are no entity (`edmem pretrain "
                             "--writer_answer_rows_by_text`)")  # fmt: skip
    parser.add_argument("--writer-mean-row-probability", action="store_true", default=None,
                        help="the writer's model: an entity of several rows given the mean of their probabilities, "
                             "not their sum (`edmem pretrain --writer_mean_row_probability`)")  # fmt: skip
    parser.add_argument("--mean-row-probability-at-test", action="store_true", default=None,
                        help="the writer's model trained without --writer-mean-row-probability, read with it: a copy "
                             "of the trained model with the option set")  # fmt: skip
    parser.add_argument("--entity-key-dim", type=int,
                        help="the writer's model: the columns of a row that queries score, its key; the rest are its "
                             "value, read by the memory (default: all, the paper's row)")  # fmt: skip
    parser.add_argument("--writer-dropout", type=float,
                        help="the writer's model's pre-training dropout (default: every model's, 0.1)")  # fmt: skip
    parser.add_argument("--added-texts", choices=ADDED_TEXTS,
                        help="what the writer writes an added person's row from: the passages around their mentions, "
                             "or each sentence of their own page, the row the mean (default: passages)")  # fmt: skip
    parser.add_argument("--fresh-names-like-written-only", action=argparse.BooleanOptionalAction,
                        help="the writer's training renames written-only entities with the words of their own names "
                             "(people's, for practice people), not of every entity's (default: off)")  # fmt: skip
    parser.add_argument("--writer-decoy-rows", type=int,
                        help="the writer's training: decoys each renamed entity brings, written under fresh names "
                             "that share a word with its own (default: 0)")  # fmt: skip
    parser.add_argument("--writer-more-steps", type=int,
                        help="the writer's training continued this many steps more from its model, with its options "
                             "(default: 0, none)")  # fmt: skip
    parser.add_argument("--reader-steps", type=int,
                        help="the writer's model: steps of a second pre-training with the writer and its table frozen "
                             "(--frozen_writer; default: 0, none)")  # fmt: skip
    parser.add_argument("--reader-names-like-written-only", action=argparse.BooleanOptionalAction,
                        help="the second stage only: fresh names of the practice people's words (default: off)")  # fmt: skip
    parser.add_argument("--reader-row-autoencoding-share", type=float,
                        help="the second stage only: share of the practice people's passages read as their written "
                             "row alone, the decoder rebuilding them (default: 0)")  # fmt: skip
    parser.add_argument("--reader-fresh-name-share", type=float,
                        help="the second stage only: share of the batch's written entities other than the practice "
                             "people renamed as they are, their answers then read from their rows (default: 0)")  # fmt: skip
    parser.add_argument("--reader-decoy-rows", type=int,
                        help="the second stage only: decoys of each renamed entity, written under fresh names that "
                             "share a word with its own (default: the first stage's --writer-decoy-rows)")  # fmt: skip
    parser.add_argument("--reader-decoys-for-every-entity", action="store_true", default=None,
                        help="the second stage only: decoys of every written entity, the trained ones under their own "
                             "names too (`edmem pretrain --writer_decoys_for_every_entity`)")  # fmt: skip
    parser.add_argument("--recipe", choices=tuple(RECIPES),
                        help="toy_world_qa's pre-training and fine-tuning levers, for every model (default: paper); "
                             "another recipe's models go to seed-N/recipe-NAME")  # fmt: skip
    args = parser.parse_args(argv)
    if args.mean_row_probability_at_test and args.writer_mean_row_probability:
        parser.error("--mean-row-probability-at-test reads a model trained without --writer-mean-row-probability")
    if args.writer_more_steps is not None and args.writer_more_steps < 0:
        parser.error(f"--writer-more-steps must be 0 or more, got {args.writer_more_steps}")
    if args.writer_more_steps and args.writer is False:
        parser.error("--writer-more-steps continues the writer's training, and --no-writer trains no writer")
    quiet_logging()
    settings = QUICK if args.quick else GrowthSettings()
    settings = replace(settings, qa=with_overrides(settings.qa, args))
    overrides = ("fit_steps", "continued_steps", "writer", "written_row_share", "written_only_share", "recipe")
    for key in (*overrides, "practice_people", "practice_biographies", "practice_one_fact_pages", "practice_sentence_pages",
                "practice_share",
                "practice_questions_people", "written_table", "row_autoencoding_share",
                "row_autoencoding_written_only", "writer_passages_by_mentions", "writer_passages_per_row",
                "writer_pools_texts", "writer_answer_rows", "writer_reads_answer_rows", "writer_answer_rows_by_text",
                "writer_mean_row_probability",
                "mean_row_probability_at_test",
                "entity_key_dim", "writer_dropout",
                "added_texts", "fresh_names_like_written_only", "writer_decoy_rows", "writer_more_steps", "reader_steps", "reader_names_like_written_only",
                "reader_row_autoencoding_share", "reader_fresh_name_share", "reader_decoy_rows",
                "reader_decoys_for_every_entity"):  # fmt: skip
        if getattr(args, key) is not None:
            settings = replace(settings, **{key: getattr(args, key)})
    if args.timed_additions is not None:
        settings = replace(settings, timed_additions=tuple(args.timed_additions))
    if args.estimators:
        settings = replace(settings, estimators=tuple(args.estimators))
    if args.timed_estimators:
        settings = replace(settings, timed_estimators=tuple(args.timed_estimators))
    if args.no_base_shape:
        settings = replace(settings, time_the_base_shape=False)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = [run_seed(settings, seed, out / f"seed-{seed}") for seed in settings.qa.seeds]
    summary = summarise(runs)
    headline = headline_figures(summary, settings.writer)
    result = {"settings": asdict(settings), "headline": headline, "runs": runs, "summary": summary}
    (out / "results.json").write_text(json.dumps(result, indent=1))  # the answers, before the timing
    first = {name: Path(path) for name, path in runs[0]["models"].items()}  # fine-tuned, or pre-trained without it
    timing = time_additions(first["before"], settings.timed_additions, settings, out / "seconds_to_add.json",
                            settings.time_the_base_shape, first.get(f"{WRITER}_before"))  # fmt: skip
    result["seconds_to_add"] = timing
    (out / "results.json").write_text(json.dumps(result, indent=1))
    if not args.no_plots:
        result["plot"] = str(plot(summary, out))
    print(json.dumps({"headline": headline, "summary": summary, "seconds_to_add": timing}, indent=1))

    def figure(split: str, name: str, mode: str, kind: str = "all") -> float:
        return summary[split][name][mode][kind]["mean"]

    fields = [
        f"seeds={len(runs)}",
        f"people_added={len(runs[0]['held_out'])}",
        f"practice_people={settings.practice_people}",
        f"practice_biographies={settings.practice_biographies}",
        f"practice_one_fact_pages={settings.practice_one_fact_pages}",
        f"practice_sentence_pages={settings.practice_sentence_pages}",
        f"practice_share={settings.practice_share}",
        f"practice_questions_people={settings.practice_questions_people}",
        f"pretrain_steps={settings.qa.pretrain_steps}",
        f"written_table={int(settings.written_table)}",
        f"row_autoencoding_share={settings.row_autoencoding_share}",
        f"row_autoencoding_written_only={int(settings.row_autoencoding_written_only)}",
        f"writer_passages_by_mentions={int(settings.writer_passages_by_mentions)}",
        f"writer_passages_per_row={settings.writer_passages_per_row}",
        f"writer_pools_texts={int(settings.writer_pools_texts)}",
        f"writer_answer_rows={int(settings.writer_answer_rows)}",
        f"writer_reads_answer_rows={int(settings.writer_reads_answer_rows)}",
        f"writer_answer_rows_by_text={int(settings.writer_answer_rows_by_text)}",
        f"writer_mean_row_probability={int(settings.writer_mean_row_probability)}",
        f"mean_row_probability_at_test={int(settings.mean_row_probability_at_test)}",
        f"entity_key_dim={settings.entity_key_dim}",
        f"writer_dropout={settings.writer_dropout}",
        f"added_texts={settings.added_texts}",
        f"fresh_names_like_written_only={int(settings.fresh_names_like_written_only)}",
        f"writer_decoy_rows={settings.writer_decoy_rows}",
        f"written_row_share={settings.written_row_share}",
        f"writer_more_steps={settings.writer_more_steps}",
        f"reader_steps={settings.reader_steps}",
        f"reader_names_like_written_only={int(settings.reader_names_like_written_only)}",
        f"reader_row_autoencoding_share={settings.reader_row_autoencoding_share}",
        f"reader_fresh_name_share={settings.reader_fresh_name_share}",
        f"reader_decoy_rows={settings.reader_decoy_rows}",
        f"reader_decoys_for_every_entity={int(settings.reader_decoys_for_every_entity)}",
        f"added_questions={runs[0]['questions']['added']}",
        f"trained_questions={runs[0]['questions']['test']}",
    ]
    fields += [f"{key}={value}" for key, value in headline.items()]  # fmt: skip
    for name in summary["added"]:
        fields += [f"added_em_{name}={figure('added', name, 'free')}",
                   f"added_em_entity_{name}={figure('added', name, 'free', 'entity')}",
                   f"added_memory_recall_{name}={summary['added'][name]['memory_recall']['mean']}"]  # fmt: skip
    for name in summary["test"]:
        fields += [f"trained_em_{name}={figure('test', name, 'free')}",
                   f"trained_memory_recall_{name}={summary['test'][name]['memory_recall']['mean']}"]  # fmt: skip
        if "memory_recall_practice_rows_hidden" in summary["test"][name]:
            hidden = summary["test"][name]["memory_recall_practice_rows_hidden"]["mean"]
            fields.append(f"trained_memory_recall_practice_rows_hidden_{name}={hidden}")
    for name in summary.get("practice", {}):  # questions in pre-training, through written rows for the writer
        fields.append(f"practice_em_{name}={figure('practice', name, 'free')}")
    fields += [f"{key}={value['mean']}" for key, value in summary["rows_alone"].items()]
    fields += [f"floor_em_{split}={value['mean']}" for split, value in summary["floor"].items()]
    fields += [f"passage_facts_{draw}={value['all']['mean']}" for draw, value in summary["passage_facts"].items()]
    for system, figures in summary["diagnostics"].items():
        fields += [f"{name}_{key}_{system}={value['mean']}" for name, group in figures.items()
                   for key, value in group.items()]  # fmt: skip
    for shape, estimators in timing.items():
        for estimator, sizes in estimators.items():
            at = "" if shape == "toy_model" else "_at_edmem_base_shape"
            fields += [f"seconds_to_add_{n}_{estimator}{at}={s}" for n, s in sizes.items()]
    print("RESULT " + " ".join(fields))
    return 0


if __name__ == "__main__":
    sys.exit(main())

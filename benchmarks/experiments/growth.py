"""The machinery of `toy_world_growth.py`: the old world (without the held-out people, with practice people) and the
full one, the grown models (rows by each estimator, or by the writer), the ceiling (continued pre-training), the
writer's model's two stages of pre-training, and the folders that keep each model apart."""

from __future__ import annotations

import json
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import AutoTokenizer

from edmem_hf import EDMemForConditionalGeneration, EntityVocab
from edmem_hf.corpus import build_corpus
from edmem_hf.dump import iter_parsed_pages
from edmem_hf.knowledge_world import (
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
from edmem_hf.pretraining import (
    LOG_NAME,
    load_corpus,
    pretrain,
    pretraining_options,
)
from edmem_hf.research.entity_growth import add_entities
from edmem_hf.research.new_entity_text import new_entity_passages, own_page_sentences
from edmem_hf.research.row_fitting import corpus_entity_ids, fit_new_entities, fit_rows, pretraining_examples
from edmem_hf.task_files import read_jsonl
from edmem_hf.toy_world import write_mediawiki_dump
from experiments.qa_world import with_questions_in_pages, write_released_format
from experiments.training import PAPER, Recipe, pretrain_variant, pretraining_schedule

if TYPE_CHECKING:
    from toy_world_growth import GrowthSettings

ESTIMATORS = ("mean_query", "fitted", "fitted_pretraining", "random")  # of the default EDMem
DEFAULT_ESTIMATOR = "mean_query"  # what `edmem add-entities` uses for a model without a writer
WRITER = "writer"  # EDMem with a writer of entity rows, grown with it; `writer_before`: that model before adding
TIMED_ESTIMATORS = ("mean_query", "fitted", WRITER)  # what the time to add entities is measured of
# Literal facts of 16 values each: enough people share a value for a linear probe to be fitted on 80 people.
PROBED_RELATIONS = {"occupation": OCCUPATIONS, "field": FIELDS}
# Their first sentence form and values, as `diagnostics.written_facts` takes them.
WRITTEN_FACTS = {relation: (TEMPLATES[relation][0], values) for relation, values in PROBED_RELATIONS.items()}
SIGNALS_A_STAGE = 12  # evaluations of the writer's first stage that log the reading signal


def make_worlds(settings: GrowthSettings, seed: int, out: Path) -> dict:
    """The old world (without the held-out people): dump, corpus, question files of its two halves; the full
    world's dump; the questions about the held-out people. With `practice_people`, that many more people in the
    old world's pages (and its mixed questions), their names in `practice_people.txt`, none of them in the train,
    validation, test or added questions; 20 of them are asked in `practice` (what each model learnt of them). The
    validation groups, for every choice made on the experiment: `validation_added_people` more held-out people, asked
    in `added_validation` (the rest in `added`, the test group), and `validation_practice_people` of the practice
    people, whose questions no batch mixes, asked in `practice_validation`."""
    qa = settings.qa
    world = generate_knowledge_world(KnowledgeWorldSettings(qa.num_people + settings.practice_people, qa.biographies),
                                     seed=seed)  # fmt: skip
    people = sorted(entity.name for entity in world.entities if entity.type == "person")
    practice = sorted(random.Random(f"{seed}-practice").sample(people, settings.practice_people))
    practice_set = set(practice)
    people = [name for name in people if name not in practice_set]
    held = sorted(random.Random(seed).sample(people, max(2, round(settings.held_out_fraction * len(people)))
                                             + settings.validation_added_people))  # fmt: skip
    added_validation = set(random.Random(f"{seed}-added-validation").sample(held, settings.validation_added_people))
    practice_validation = set(random.Random(f"{seed}-practice-validation").sample(
        practice, settings.validation_practice_people))  # fmt: skip
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
    _same_validation_groups(settings, out)
    old_dump = write_mediawiki_dump(with_questions_in_pages(old, splits["train"]) if qa.questions_on_pages else old,
                                    out / "old-wiki.xml.bz2")  # fmt: skip
    new_dump = write_mediawiki_dump(world, out / "new-wiki.xml.bz2")
    corpus = out / "corpus"
    if not (corpus / "entity_vocab.json").exists():
        build_corpus(old_dump, corpus, num_entities=100_000, num_proc=2, vocab_size=3000, seed=seed)
    splits["added"] = [
        pair for pair in world.qa_pairs if pair.subject in held and pair.subject not in added_validation
    ]
    if added_validation:
        splits["added_validation"] = [pair for pair in world.qa_pairs if pair.subject in added_validation]
    practice_mixed = [name for name in practice if name not in practice_validation]
    if practice:  # questions of 20 practice people, asked to see what the models learnt of them
        asked = set(random.Random(f"{seed}-practice-asked").sample(practice_mixed, min(20, len(practice_mixed))))
        splits["practice"] = [pair for pair in world.qa_pairs if pair.subject in asked]
    if practice_validation:  # practice people whose questions no batch mixes: what reading written rows gives
        splits["practice_validation"] = [pair for pair in world.qa_pairs if pair.subject in practice_validation]
    files = {}
    for split, pairs in splits.items():
        files[split], files[f"{split}_links"] = write_released_format(pairs, split, out)
    written_facts = out / "written_facts.json"  # what the writer's reading signal probes rows with
    written_facts.write_text(json.dumps(WRITTEN_FACTS))
    mixed = qa.mixed_questions(files["train"])
    if practice:
        (out / "practice_people.txt").write_text("".join(f"{name}\n" for name in practice), encoding="utf-8")
        if mixed is not None:  # the train questions and the practice people's
            asked_in_mix = set(practice_mixed)
            if settings.practice_questions_people:
                rng = random.Random(f"{seed}-practice-mixed")
                asked_in_mix = set(rng.sample(practice_mixed, min(settings.practice_questions_people,
                                                                  len(practice_mixed))))  # fmt: skip
            pairs = splits["train"] + [pair for pair in world.qa_pairs if pair.subject in asked_in_mix]
            mixed = write_released_format(pairs, "train_and_practice", out)[0]
    test_people = sorted({pair.subject for pair in splits["test"]})
    return {"held": held, "corpus": corpus, "new_dump": new_dump, "files": files, "test_people": test_people,
            "train_people": sorted({pair.subject for pair in splits["train"]}), "mixed_questions": mixed,
            "practice_people": out / "practice_people.txt" if practice else None, "practice": practice,
            "written_facts": written_facts}  # fmt: skip


def _same_validation_groups(settings: GrowthSettings, out: Path) -> None:
    """Records the validation groups' sizes beside a new world; a world built with others is refused (its corpus
    and models would be reused for people they never held out)."""
    groups = {"validation_added_people": settings.validation_added_people,
              "validation_practice_people": settings.validation_practice_people}  # fmt: skip
    record = out / "validation_groups.json"
    built = (out / "corpus" / "entity_vocab.json").exists()
    found = json.loads(record.read_text()) if record.exists() else dict.fromkeys(groups, 0) if built else groups
    if found != groups:
        raise ValueError(f"{out} holds a world with validation groups {found}, not {groups}: give it its own --out")
    record.write_text(json.dumps(groups))


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
    return "continued" if steps == type(settings).continued_steps else f"continued-{steps}"


def continue_pretraining(pretrained: Path, new_dump: str, out: Path, settings: GrowthSettings, seed: int,
                         held: list[str], questions: Path | None = None, recipe: Recipe = PAPER) -> Path:  # fmt: skip
    """The ceiling's model: the pre-trained model grown with the new people, pre-trained `continued_steps` more on
    the full world's corpus (its entity labels in the grown model's ids), with `questions` mixed into the batches as
    the pre-training had them (none of the added people's: they are the test), and `recipe`'s decoder target (the
    run's, `settings.recipe`)."""
    if (out / "model.safetensors").exists():
        return out
    grown, _ = grow(pretrained, new_dump, "mean_query", out.parent / "pretrain-grown", held, settings, seed, [])
    model = EDMemForConditionalGeneration.from_pretrained(grown)
    tokenizer = AutoTokenizer.from_pretrained(grown)
    datasets = corpus_in_model_ids(new_world_corpus(new_dump, out.parent, grown, seed), model.entity_vocab)
    options = pretraining_options(
        output_dir=str(out), decoder_target=recipe.decoder_target,
        mixed_questions_file=questions and str(questions),
        **pretraining_schedule(settings.qa, settings.continued_steps, seed),
    )  # fmt: skip
    pretrain(**options, model=model, tokenizer=tokenizer, datasets=datasets, entity_vocab=model.entity_vocab)
    return out


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
    masked = settings.writer_random_mask_prob
    name += f"-random-mask-{masked}" if masked is not None else ""
    name += "-restarts" if settings.writer_restart_unless_learned else ""
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


NAME_GUIDED = "_name_guided"  # a model's name-guided copy: `with_name_guided_read`


def with_name_guided_read(trained: Path) -> Path:
    """A copy of the model in `trained` whose encoder memory reads among the candidates a mention's name gives
    (`EDMemConfig.name_guided_read`), beside it (`<folder>-name-guided`): what candidates by name do to finding and
    answering, the model otherwise the same."""
    out = trained.parent / f"{trained.name}-name-guided"
    if not (out / "model.safetensors").exists():
        EDMemForConditionalGeneration.from_pretrained(trained, name_guided_read=True).save_pretrained(out)
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


def pretrain_writer(settings: GrowthSettings, data: dict, out: Path, seed: int, recipe: Recipe,
                    questions: Path | None) -> Path:  # fmt: skip
    """EDMem with a writer of entity rows pre-trained on the old world (`data`: `make_worlds`'), with `questions`
    mixed in, each stage in a folder of `out` named by `writer_folder`: the first stage (`writer_options`), continued
    `writer_more_steps` more from its model, then TOME's second stage (`pretrain_reader`); with
    `mean_row_probability_at_test`, a copy read with the mean of row probabilities. Returns the last one's folder."""
    first_stage = replace(settings, reader_steps=0, mean_row_probability_at_test=False)
    options = writer_options(settings, data)
    writer = first_stage_with_restarts(settings, data["corpus"], out / first_stage_folder(settings), seed, recipe,
                                       questions, options)  # fmt: skip
    if settings.writer_more_steps:
        writer = pretrain_variant("edmem", data["corpus"], out / f"pretrain-{writer_folder(first_stage)}",
                                  replace(settings.qa, pretrain_steps=settings.writer_more_steps), seed, None,
                                  recipe, questions, model_name_or_path=str(writer), **options)  # fmt: skip
    if settings.reader_steps:
        trained = writer_folder(replace(settings, mean_row_probability_at_test=False))
        writer = pretrain_reader(writer, data, out / f"pretrain-{trained}", settings, seed, recipe, questions)
    if settings.mean_row_probability_at_test:
        writer = with_mean_row_probability(writer, out / f"pretrain-{writer_folder(settings)}")
    return writer


READING_LEARNED = 50.0  # % answered with the read forced onto the subjects' rows (oracle read): reading is learnt
# `writer_restart_unless_learned` (issue 64's rule, choice_rule.json): a first stage that ends without reading learnt
# on practice_validation is set aside and begun again with the seed + RESTART_SEED_STRIDE * k (initialisation, batch
# order, masking; the world is the seed's), at most RESTARTS times; the last attempt is kept whatever its signal.
RESTARTS = 2
RESTART_SEED_STRIDE = 100


def first_stage_with_restarts(settings: GrowthSettings, corpus: Path, folder: Path, seed: int, recipe: Recipe,
                              questions: Path | None, options: dict) -> Path:  # fmt: skip
    """The writer's first stage in `folder` (`options`: `writer_options`'); with `writer_restart_unless_learned`,
    begun again in `folder-restart-K` where it ends without reading learnt (the constants above). A rerun reuses each
    attempt trained, so it takes the same path. Returns the attempt kept."""
    for k in range(RESTARTS + 1 if settings.writer_restart_unless_learned else 1):
        attempt = folder if k == 0 else folder.with_name(f"{folder.name}-restart-{k}")
        trained = pretrain_variant("edmem", corpus, attempt, settings.qa, seed + RESTART_SEED_STRIDE * k, None,
                                   recipe, questions, **options)  # fmt: skip
        if settings.writer_restart_unless_learned and reading_learned(trained):
            break
    return trained


def reading_learned(model: Path) -> bool:
    """Whether the writer's first stage in `model` ended reading written rows: the last reading_oracle_em its log
    holds (the reading signal on practice_validation) at least READING_LEARNED."""
    signal = [record["reading_oracle_em"] for record in read_jsonl(model / LOG_NAME) if "reading_oracle_em" in record]
    if not signal:
        raise RuntimeError(f"{model / LOG_NAME} holds no reading signal: the first stage needs practice_validation")
    return signal[-1] >= READING_LEARNED


def first_stage_folder(settings: GrowthSettings) -> str:
    """The folder of the writer's first stage, its first attempt: the plain run's, with or without restarts (a
    restart's is this name and `-restart-K`)."""
    plain = replace(settings, reader_steps=0, writer_more_steps=0, writer_restart_unless_learned=False,
                    mean_row_probability_at_test=False)  # fmt: skip
    return f"pretrain-{writer_folder(plain)}"


def first_stage_restarts(out: Path, settings: GrowthSettings) -> int:
    """How many times the writer's first stage in `out` was begun again (`first_stage_with_restarts`' folders)."""
    return len(list(out.glob(f"{first_stage_folder(settings)}-restart-*")))


def first_stage_signal(settings: GrowthSettings, seed: int, out: Path, recipe: Recipe = PAPER) -> dict:
    """The writer's first stage alone on the world of `seed` (in `out`; validation groups required), and its reading
    signal as training went (`reading_signal_options`): per evaluation the practice_validation people answered
    through the rows the writer writes, found and with the read forced onto them, and the rows' fact share. What a
    lever of the first stage is chosen on, without the default EDMem, the second stage or the test groups."""
    data = make_worlds(settings, seed, out)
    first_stage = replace(settings, reader_steps=0, writer_more_steps=0, mean_row_probability_at_test=False)
    model = pretrain_writer(first_stage, data, models_folder(out, settings), seed, recipe, data["mixed_questions"])
    keys = ("reading_em", "reading_oracle_em", "written_fact_share")
    records = read_jsonl(model / LOG_NAME)
    signal = [{"step": r["step"], **{key: r[key] for key in keys}} for r in records if "reading_em" in r]
    restarts = first_stage_restarts(models_folder(out, settings), settings)
    return {"seed": seed, "model": str(model), "signal": signal, "restarts": restarts,
            "reading_learned": reading_learned(model)}  # fmt: skip


def writer_options(settings: GrowthSettings, data: dict) -> dict:
    """The first stage's pre-training options beyond every model's (`pretraining_options` takes them): the writer,
    how its rows are read (`written_rows_options`), the practice people's share and the writer's corruption."""
    return dict(entity_row_writer=True, written_row_share=settings.written_row_share,
                written_table=settings.written_table,
                row_autoencoding_share=settings.row_autoencoding_share,
                row_autoencoding_written_only=settings.row_autoencoding_written_only,
                writer_pools_texts=settings.writer_pools_texts,
                writer_mean_row_probability=settings.writer_mean_row_probability or None,
                fresh_names_like_written_only=settings.fresh_names_like_written_only,
                writer_decoy_rows=settings.writer_decoy_rows, entity_key_dim=settings.entity_key_dim,
                **written_rows_options(settings, data), **practice_balance(settings, data),
                **writer_corruption(settings), **reading_signal_options(settings, data))  # fmt: skip


def reading_signal_options(settings: GrowthSettings, data: dict) -> dict:
    """With a validation group of practice people (`make_worlds`): the first stage's options that log, at
    `SIGNALS_A_STAGE` evaluations, their questions answered through the rows its writer writes and the written rows'
    fact share (`edmem_hf.research.reading_signal`): whether reading is being learnt, while it trains."""
    files = data.get("files", {})
    if "practice_validation" not in files:
        return {}
    return {"reading_signal_questions_file": str(files["practice_validation"]),
            "reading_signal_facts_file": str(data["written_facts"]),
            "eval_steps": max(settings.qa.pretrain_steps // SIGNALS_A_STAGE, 1)}  # fmt: skip


def pretrain_reader(
    writer: Path, data: dict, out: Path, settings: GrowthSettings, seed: int, recipe, questions
) -> Path:
    """TOME's second stage: the writer's model pre-trained `reader_steps` more with the writer, what it reads and the
    table it writes frozen (`--frozen_writer`), every entity of a batch (up to `max_written_rows`) read through a row
    written from another passage than the one read: the rows it searches and reads are the rows added people get.
    `reader_names_like_written_only`, `reader_row_autoencoding_share` (of the practice people's passages only),
    `reader_fresh_name_share` and `reader_decoy_rows` are this stage's own levers, the first stage trained without
    them (`reader_options`)."""
    return pretrain_variant("edmem", data["corpus"], out, replace(settings.qa, pretrain_steps=settings.reader_steps),
                            seed, None, recipe, questions, model_name_or_path=str(writer),
                            **reader_options(settings, data))  # fmt: skip


def reader_options(settings: GrowthSettings, data: dict) -> dict:
    """The second stage's pre-training options beyond every model's (`pretrain_reader`)."""
    return dict(frozen_writer=True,
                written_row_share=1.0, **written_rows_options(settings, data),
                fresh_names_like_written_only=settings.fresh_names_like_written_only
                or settings.reader_names_like_written_only,
                row_autoencoding_share=settings.reader_row_autoencoding_share,
                row_autoencoding_written_only=bool(settings.reader_row_autoencoding_share),
                fresh_name_share=settings.reader_fresh_name_share,
                writer_decoy_rows=settings.reader_decoy_rows or settings.writer_decoy_rows,
                writer_decoys_for_every_entity=settings.reader_decoys_for_every_entity,
                **practice_balance(settings, data),
                **writer_corruption(settings))  # fmt: skip


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


def writer_corruption(settings: GrowthSettings) -> dict:
    """The writer's model's `dropout` and `random_mask_prob` pre-training options, in both stages (none: every
    model's)."""
    options = {"dropout": settings.writer_dropout, "random_mask_prob": settings.writer_random_mask_prob}
    return {name: value for name, value in options.items() if value is not None}


def practice_balance(settings: GrowthSettings, data: dict) -> dict:
    """The pre-training options that make the practice people's examples `practice_share` of those read (none when
    it is 0): the same for every model, so that each reads the other people as often."""
    if not settings.practice_share or data["practice_people"] is None:
        return {}
    return {"balanced_entities_file": str(data["practice_people"]), "balanced_entities_share": settings.practice_share}

"""Knowledge the memory holds: EDMem against EncDec (no memory) and EncMem (encoder + memory) on closed-book QA
about people the models have only read about, with the paper's orderings (Tables 1-2, Figures 3-4) as the
questions asked, in the protocol of Allen-Zhu and Li, *Physics of Language Models, Part 3.1* (2023).

For each seed: a knowledge world (`edmem_hf.knowledge_world`: people named from shared pools of first and last
names, with independent attributes, each in several biographies of varied templates and sentence orders) is
rendered as a MediaWiki dump; `edmem build-corpus` turns it into passages; EDMem, EncDec and EncMem are pre-trained
from scratch by `edmem pretrain` with the same steps, widths and seed. Every person is in pre-training. The people
are then cut in three groups: question answering is fine-tuned on the questions about half of them (all six
forms; `edmem finetune`, the stock Seq2SeqTrainer; EncMem with the authors' linking recipe); the
validation group's questions are asked to choose recipes and settings (`--no-test` asks nothing else); the test
group's are read once a recipe. Exact match (`edmem evaluate`'s code), overall, on entity answers and on literal
answers, beside the majority answer of each question form, with 95 % intervals that resample the seeds and then
each seed's questions.

Also measured: memorisation (each pre-trained model filling a masked fact in a person's first biography, and the
same fact with the subject named to the encoder only: what a question can read out); the memory's share (the
fine-tuned EDMem and EncMem tested with every memory row hidden, or only the asked subjects' rows, at test time
only; and EDMem fine-tuned and tested with the memory hidden, the authors' entity mask); parameter counts with and
without the entity table; the single-biography ablation beside the varied world. `--recipes` runs the levers
(`RECIPES`: the linking loss's weight and reduction, numbers as salient spans) beside the paper's settings.

The plain command runs the recipe of docs/evidence.md's headline (`HEADLINE`: the fine-tuning group's questions in
the pre-training batches, 30,000 steps, no fine-tuning, `--recipes el_per_token`, EDMem and EncDec only); `--setup
paper` runs the paper's (7,500 steps, the questions on the pages, fine-tuning, every system and ablation).

    python benchmarks/toy_world_qa.py --out runs/toy-qa                  # the headline's recipe, 3 seeds
    python benchmarks/toy_world_qa.py --setup paper --out runs/toy-qa-paper
    python benchmarks/toy_world_qa.py --quick --out runs/toy-qa-quick    # one seed of the paper's setup, small

A rerun with the same `--out` reuses what is done (corpus, pre-training, fine-tuning, predictions).
Ends with one line `RESULT key=value ...` (means over seeds).
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import random
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import AutoTokenizer, Trainer, TrainingArguments  # noqa: E402

from edmem_hf import EDMemForConditionalGeneration, EDMemForEntityLinking  # noqa: E402
from edmem_hf.collator import EDMemMaskingCollator  # noqa: E402
from edmem_hf.configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN, EDMemConfig  # noqa: E402
from edmem_hf.corpus import build_corpus  # noqa: E402
from edmem_hf.knowledge_world import (  # noqa: E402
    PERSON_ATTRIBUTES,
    PRONOUNS,
    TEMPLATES,
    KnowledgeWorldSettings,
    generate_knowledge_world,
    split_people,
)
from edmem_hf.pretraining import pretrain, pretraining_options  # noqa: E402
from edmem_hf.task_features import in_running_text  # noqa: E402
from edmem_hf.tasks import IGNORE_INDEX, EDMemSeq2SeqCollator, exact_match, read_jsonl, read_qa  # noqa: E402
from edmem_hf.toy_world import QAPair, ToyEntity, ToyWorld, write_mediawiki_dump  # noqa: E402

logger = logging.getLogger("toy_world_qa")
MODES = ("free", "static", "dynamic")
ENTITY_RELATIONS = tuple(relation for relation, _, is_entity in PERSON_ATTRIBUTES if is_entity)


@dataclass(frozen=True)
class Recipe:
    """Pre-training and fine-tuning options beyond the paper's: the levers tried on the validation group."""

    entity_loss_weight: float = 1.0  # lambda_EL in pre-training (`edmem pretrain --entity_loss_weight`)
    entity_loss_reduction: str = "labelled_accesses"  # `--entity_loss_reduction`
    number_mask_prob: float = 0.0  # dates and numbers as salient spans (`--number_mask_prob`)
    decoder_target: str = "passage"  # what the pre-training decoder writes (`--decoder_target`)
    finetune_entity_loss_weight: float = 1.0  # lambda_EL in fine-tuning (`edmem finetune --entity_loss_weight`)

    def pretraining_suffix(self, variant: str) -> str:
        """What sets this recipe's pre-training of `variant` apart from the paper's, as a folder suffix ("" when
        nothing does)."""
        fields = ["decoder_target", "number_mask_prob"]
        if variant != "encdec":  # EncDec has no linking loss: only the masking changes its pre-training
            fields += ["entity_loss_reduction", "entity_loss_weight"]
        return "".join(
            f"-{name}={getattr(self, name)}" for name in sorted(fields) if getattr(self, name) != getattr(PAPER, name)
        )

    def finetuning_suffix(self, variant: str) -> str:
        """This recipe's pre-training suffix, and its fine-tuning weight where it differs from the paper's."""
        suffix = self.pretraining_suffix(variant)
        if variant != "encdec" and self.finetune_entity_loss_weight != PAPER.finetune_entity_loss_weight:
            suffix += f"-finetune_entity_loss_weight={self.finetune_entity_loss_weight}"
        return suffix


PAPER = Recipe()
RECIPES = {
    "paper": PAPER,
    "el_weight_0.5": Recipe(entity_loss_weight=0.5, finetune_entity_loss_weight=0.5),
    "el_per_token": Recipe(entity_loss_reduction="per_lm_token"),
    "salient_numbers": Recipe(number_mask_prob=0.5),
    "finetune_el_weight_0.5": Recipe(finetune_entity_loss_weight=0.5),
    "finetune_el_weight_2": Recipe(finetune_entity_loss_weight=2.0),
    "masked_spans": Recipe(decoder_target="masked_spans"),
}


@dataclass
class Settings:
    num_people: int = 100  # the standard size: 25 test people, 150 test questions a seed
    biographies: int = 5
    fullname: bool = False  # every sentence names the person in full (the study's fullname augmentation)
    seeds: tuple[int, ...] = (0, 1, 2)
    d_model: int = 64
    layers: int = 1  # lower and upper layers on each side (each)
    entity_embed_dim: int = 64
    pretrain_steps: int = 7500  # about 150 readings of each passage
    pretrain_batch_size: int = 8
    pretrain_learning_rate: float = 3e-3
    mix_qa: bool = True  # the fine-tuning half's questions and answers also in pre-training (every system)
    shuffled_questions: bool = False  # ... on pages of their own, people mixed (else a section of each person's page)
    questions_in_batches: bool = False  # ... in the training batches in the fine-tuning format (not on pages)
    finetune_epochs: float = 60.0
    finetune_learning_rate: float = 1e-3
    finetune_batch_size: int = 32
    encmem: bool = True
    encdec_matched: bool = True  # also an EncDec of EDMem's parameter count (its feed-forward layers widened)
    memory_hidden_in_finetuning: bool = True  # EDMem fine-tuned and tested with no memory row visible
    single_biography_ablation: bool = True  # on the first seed, EDMem and EncDec
    bootstrap_samples: int = 1000
    validation_fraction: float = 0.25  # people asked questions only to choose recipes and settings
    read_test: bool = True  # False: choose on the validation group; the test group is neither predicted nor scored
    recipes: tuple[str, ...] = ("paper",)  # the first is the one the RESULT line reports
    valid_entity_em: float = 50.0  # the bar of a valid experiment (issue 27, item 4)
    valid_entity_margin: float = 30.0
    valid_literal_margin: float | None = 10.0  # None: not required
    pretrain_jobs: int = 2  # pre-trainings run side by side, one process and one thread each

    @property
    def questions_on_pages(self) -> bool:
        """The fine-tuning half's questions are text on pages of the pre-training world."""
        return self.mix_qa and not self.questions_in_batches

    def mixed_questions(self, train_file: Path) -> Path | None:
        """The QA file mixed into the pre-training batches (`train_file`), or None when no questions go there."""
        return train_file if self.mix_qa and self.questions_in_batches else None


# The recipe of the headline (docs/evidence.md, "The fair world": the settings recorded in
# docs/images/toy_world_qa_fair_world/test_3seeds_questions_in_batches_30000_steps_el_per_token.json): the fine-tuning
# group's questions in the pre-training batches, 30,000 steps, no fine-tuning, a mention's linking loss weighed as one
# LM token, EDMem beside EncDec alone, one pre-training at a time. What the plain command runs.
HEADLINE = Settings(pretrain_steps=30_000, questions_in_batches=True, finetune_epochs=0.0, encmem=False,
                    encdec_matched=False, memory_hidden_in_finetuning=False, single_biography_ablation=False,
                    recipes=("el_per_token",), pretrain_jobs=1)  # fmt: skip
# `--setup`: the headline's recipe, or the paper's (`Settings`' defaults: 7,500 steps, the questions as text on their
# subjects' pages, 60 epochs of fine-tuning, every system and ablation beside EDMem).
SETUPS = {"headline": HEADLINE, "paper": Settings()}

# One seed of a 40-person world (20 fine-tuning people: at 10, EncDec's fine-tuning does not learn the task; 10
# validation and 10 test people), as many readings of each biography as the standard run.
QUICK = Settings(num_people=40, pretrain_steps=3000, seeds=(0,), encmem=False, encdec_matched=False,
                 memory_hidden_in_finetuning=False, single_biography_ablation=False, valid_entity_em=40.0,
                 valid_entity_margin=25.0, valid_literal_margin=None)  # fmt: skip


# --- data -------------------------------------------------------------------------------------------------------


def write_released_format(pairs: list[QAPair], split: str, out: Path) -> tuple[Path, Path]:
    """The questions as the authors' released files: `edmem_*.jsonl` (the subject linked in the question) and
    `sling_invocab-*.json` (null for a literal answer), so that the readers and `edmem evaluate` take them as is."""
    data, links = out / f"edmem_toy-{split}.jsonl", out / f"sling_invocab-{split}.json"
    answer_links = {}
    with open(data, "w", encoding="utf-8") as f:
        for i, pair in enumerate(pairs):
            qid = f"{split}-{i}"
            start = pair.question.index(pair.subject)
            record = {
                "id": qid,
                "question": pair.question,
                "answer": [pair.answer],
                "relation": pair.relation,
                "link_offset": [start],
                "link_length": [len(pair.subject)],
                "link_target": [pair.subject],
                "entity_name": [pair.subject],
                "answer_entity": [[pair.answer, pair.answer]] if pair.answer_is_entity else [],
            }
            f.write(json.dumps(record) + "\n")
            answer_links[qid] = {pair.answer: ["", pair.answer, pair.answer]} if pair.answer_is_entity else None
    links.write_text(json.dumps(answer_links))
    return data, links


QUESTIONS_A_PAGE = 24


def with_questions_in_pages(world: ToyWorld, pairs: list[QAPair], shuffled: bool = False, seed: int = 0) -> ToyWorld:
    """`world` with the fine-tuning group's questions and answers (`pairs`) pre-trained on too: the study's mixed
    training. By default each person's questions are a section of their page; `shuffled` puts them, in a random
    order, on pages of their own (`QUESTIONS_A_PAGE` a page, the subject and an entity answer linked), so that a
    question's neighbours are about other people and its subject is known only by its name."""
    pages = dict(world.pages)
    if shuffled:
        order = list(pairs)
        random.Random(seed).shuffle(order)
        for start in range(0, len(order), QUESTIONS_A_PAGE):
            lines = []
            for pair in order[start : start + QUESTIONS_A_PAGE]:
                answer = f"[[{pair.answer}]]" if pair.answer_is_entity else pair.answer
                lines.append(f"{pair.question.replace(pair.subject, f'[[{pair.subject}]]', 1)} {answer}.")
            pages[f"Questions {start // QUESTIONS_A_PAGE + 1}"] = " ".join(lines)
        return replace(world, pages=pages)
    for pair in pairs:
        answer = f"[[{pair.answer}]]" if pair.answer_is_entity else pair.answer
        section = "\n\n== Questions ==\n" if "== Questions ==" not in pages[pair.subject] else "\n"
        pages[pair.subject] += f"{section}{pair.question} {answer}."
    return replace(world, pages=pages)


def make_world(settings: Settings, seed: int, out: Path, varied: bool = True) -> dict:
    """The world, its dump and corpus (with its tokenizer), and the question files of the three groups."""
    biographies = settings.biographies if varied else 1
    world_settings = KnowledgeWorldSettings(settings.num_people, biographies, varied, fullname=settings.fullname)
    world = generate_knowledge_world(world_settings, seed=seed)
    splits = split_people(world, seed, settings.validation_fraction)
    read = world
    if settings.questions_on_pages:
        read = with_questions_in_pages(world, splits["train"], settings.shuffled_questions, seed)
    out.mkdir(parents=True, exist_ok=True)
    dump = write_mediawiki_dump(read, out / "wiki.xml.bz2")
    corpus = out / "corpus"
    if not (corpus / "entity_vocab.json").exists():
        build_corpus(dump, corpus, num_entities=100_000, num_proc=2, vocab_size=3000, seed=seed)
    files = {}
    for split, pairs in splits.items():
        files[split], files[f"{split}_links"] = write_released_format(pairs, split, out)
    return {"world": world, "corpus": corpus, "files": files, "splits": splits,
            "mixed_questions": settings.mixed_questions(files["train"])}  # fmt: skip


# --- training ---------------------------------------------------------------------------------------------------


def pretrain_variant(variant: str, corpus: Path, out: Path, settings: Settings, seed: int,
                     ffn_dim: int | None = None, recipe: Recipe = PAPER, questions: Path | None = None,
                     **options) -> Path:  # fmt: skip
    """`edmem pretrain` of `variant` at the settings' widths and schedule, with `questions` (a QA file) mixed into
    its batches when given (`options`: more of `edmem pretrain`'s options by name, the writer's and the mixing's
    too, as `pretraining_options` takes them). A folder that holds a finished pre-training of other steps is refused
    (resumed, it would go on with a schedule that is neither run's)."""
    finished = out / "trainer_state.json"
    steps = json.loads(finished.read_text())["max_steps"] if finished.exists() else settings.pretrain_steps
    if steps != settings.pretrain_steps:
        raise ValueError(f"{out} holds a pre-training of {steps} steps and this run asks {settings.pretrain_steps}: "
                         "give the run its own --out")  # fmt: skip
    d = settings.d_model
    if questions is not None:
        options["mixed_questions_file"] = str(questions)
    linking = {} if variant == "encdec" else dict(entity_loss_weight=recipe.entity_loss_weight,
                                                  entity_loss_reduction=recipe.entity_loss_reduction)  # fmt: skip
    pretrain(
        **pretraining_options(
            output_dir=str(out),
            corpus_dir=str(corpus),
            variant=variant,
            d_model=d,
            encoder_lower_layers=settings.layers,
            encoder_upper_layers=settings.layers,
            decoder_lower_layers=settings.layers,
            decoder_upper_layers=settings.layers,
            encoder_ffn_dim=ffn_dim or 4 * d,
            decoder_ffn_dim=ffn_dim or 4 * d,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            entity_embed_dim=settings.entity_embed_dim,
            max_position_embeddings=160,
            dropout=options.pop("dropout", 0.1),
            number_mask_prob=recipe.number_mask_prob,
            decoder_target=recipe.decoder_target,
            **linking,
            **pretraining_schedule(settings, settings.pretrain_steps, seed),
            **options,
        )
    )
    return out


def pretrain_side_by_side(calls: dict[str, tuple], jobs: int) -> dict[str, Path]:
    """`pretrain_variant(*arguments)` for each name -> arguments, `jobs` at a time, each in a process of its own
    (one thread each; a pre-training of this size does not gain from a second thread). Returns name -> folder."""
    if jobs <= 1 or len(calls) == 1:
        return {name: pretrain_variant(*arguments) for name, arguments in calls.items()}
    with ProcessPoolExecutor(min(jobs, len(calls)), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {name: pool.submit(_pretrain_on_one_thread, *arguments) for name, arguments in calls.items()}
        return {name: future.result() for name, future in futures.items()}


def _pretrain_on_one_thread(*arguments) -> Path:
    torch.set_num_threads(1)  # side by side: one core each, not every core each
    return pretrain_variant(*arguments)


def matched_ffn_dim(edmem: Path, encdec: Path, settings: Settings) -> int:
    """The feed-forward width that gives an EncDec of `encdec`'s other sizes EDMem's parameter count (with its
    entity table): each unit of width adds `2 d + 1` parameters to each of the `4 * layers` layers."""
    missing = parameter_counts(edmem)["with_table"] - parameter_counts(encdec)["with_table"]
    per_unit = 4 * settings.layers * (2 * settings.d_model + 1)
    return 4 * settings.d_model + max(0, round(missing / per_unit))


def pretraining_schedule(settings: Settings, steps: int, seed: int) -> dict:
    """The pre-training options of the training loop: batch, learning rate, `steps`, a save every 500 steps
    and at the end, resumed on a rerun."""
    return dict(per_device_train_batch_size=settings.pretrain_batch_size, learning_rate=settings.pretrain_learning_rate,
                max_steps=steps, eval_steps=0, save_steps=min(steps, 500), save_total_limit=1,
                logging_steps=max(steps // 20, 1), seed=seed, report_to="none", resume="auto",
                disable_tqdm=True)  # fmt: skip


def _finetune_argv(settings: Settings, seed: int) -> list[str]:
    return [
        *("--learning_rate", str(settings.finetune_learning_rate), "--num_train_epochs", str(settings.finetune_epochs)),
        *("--per_device_train_batch_size", str(settings.finetune_batch_size), "--per_device_eval_batch_size", "64"),
        *("--eval_strategy", "no", "--save_strategy", "no", "--load_best_model_at_end", "false"),
        *("--early_stopping_patience", "0", "--warmup_steps", "10", "--logging_steps", "50", "--seed", str(seed)),
        *("--report_to", "none", "--use_cpu", "true", "--disable_tqdm", "true", "--max_target_length", "16"),
    ]  # fmt: skip


def finetune_model(model_dir: Path, train_file: Path, out: Path, settings: Settings, seed: int,
                   entity_mask_file: Path | None = None, entity_loss_weight: float = 1.0,
                   options: tuple[str, ...] = ()) -> Path:  # fmt: skip
    """`edmem finetune` on the training questions (skipped when `out` has a model: a rerun goes on); `options`: more
    of its command-line options. With `settings.finetune_epochs` 0 there is no fine-tuning: the pre-trained model
    is asked (the study's mixed training, whose questions were in pre-training: `questions_in_batches`)."""
    from edmem_hf.finetuning import QA, run

    if settings.finetune_epochs == 0:
        if entity_mask_file is not None:
            raise ValueError("a fine-tuning with hidden memory rows needs --finetune-epochs > 0")
        return model_dir
    if not (out / "model.safetensors").exists():
        mask = ["--entity_mask_file", str(entity_mask_file)] if entity_mask_file else []
        mask += ["--entity_loss_weight", str(entity_loss_weight)]
        argv = ["--model_name_or_path", str(model_dir), "--output_dir", str(out), "--do_train"]
        run(QA, argv + ["--train_file", str(train_file)] + _finetune_argv(settings, seed) + mask + list(options))
    return out


def predict(model_dir: Path, test_file: Path, out: Path, mode: str, settings: Settings, seed: int,
            entity_mask_file: Path | None = None) -> Path:  # fmt: skip
    """`edmem finetune --do_predict` in one decoding mode; returns the predictions file (reused)."""
    from edmem_hf.finetuning import QA, run

    path = out / f"{mode}_predictions.json"
    if not path.exists():
        mask = ["--entity_mask_file", str(entity_mask_file)] if entity_mask_file else []
        argv = ["--model_name_or_path", str(model_dir), "--output_dir", str(out), "--do_predict"]
        argv += ["--test_file", str(test_file), "--entity_decoding", mode, "--entity_candidates", "3"]
        run(QA, argv + _finetune_argv(settings, seed) + mask)
    return path


def _encmem_features(rows, tokenizer, with_answer: bool) -> list[dict]:
    """EncMem's QA input: the question, then a masked mention `<E_s> <mask> <E_e>` whose entity the head predicts
    (the authors appended a bare `<E_s>`; an encoder input needs its mentions closed, and a masked mention is what
    EncMem pre-trains on). The head is supervised with the answer entity there."""
    start, end = tokenizer.convert_tokens_to_ids([ENTITY_START_TOKEN, ENTITY_END_TOKEN])
    features = []
    for row in rows:
        if with_answer and row["answer_entity"] == IGNORE_INDEX:
            continue  # a literal answer: EncMem cannot produce it, nothing to train
        question = tokenizer(in_running_text(row["question"])).input_ids
        input_ids = question[:-1] + [start, tokenizer.mask_token_id, end, question[-1]]
        labels = [IGNORE_INDEX] * len(input_ids)
        positions = [i for i, token in enumerate(input_ids) if token == start]
        for position, entity in zip(positions, row["mention_entities"] + [row["answer_entity"]]):
            labels[position] = entity
        features.append({"input_ids": input_ids, "entity_labels": labels})
    return features


def finetune_encmem(model_dir: Path, train_file: Path, out: Path, settings: Settings, seed: int) -> Path:
    """Fine-tunes EncMem on the entity-answer training questions (skipped when `out` has a model)."""
    if (out / "model.safetensors").exists():
        return out
    model = EDMemForEntityLinking.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    args = TrainingArguments(
        output_dir=str(out),
        learning_rate=settings.finetune_learning_rate,
        num_train_epochs=settings.finetune_epochs,
        per_device_train_batch_size=settings.finetune_batch_size,
        warmup_steps=10,
        logging_steps=50,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=seed,
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    collator = EDMemSeq2SeqCollator(tokenizer.pad_token_id)
    train = _encmem_features(read_qa(train_file, model.entity_vocab), tokenizer, with_answer=True)
    Trainer(model=model, args=args, train_dataset=train, data_collator=collator).train()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@torch.no_grad()
def predict_encmem(model_dir: Path, test_file: Path, path: Path, hidden: torch.Tensor | None = None) -> Path:
    """EncMem's answer to each question: the entity its head links at the final `<E_s>`, written `<E_s> name
    <E_e>` (as EDMem writes one). `hidden`: the authors' entity mask (1 = hidden), at test time."""
    if path.exists():
        return path
    model = EDMemForEntityLinking.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if hidden is not None:
        model.set_entity_mask(hidden == 0)
    vocab = model.entity_vocab
    collator = EDMemSeq2SeqCollator(tokenizer.pad_token_id)
    rows = read_qa(test_file, vocab)
    features = _encmem_features(rows, tokenizer, with_answer=False)
    predictions = {}
    for begin in range(0, len(features), 64):
        chunk = features[begin : begin + 64]
        batch = collator([{"input_ids": f["input_ids"]} for f in chunk])
        linked = model(**batch, output_attended_entities=True).linked_entities
        last = {}  # row -> the entity linked at its last <E_s>
        for (row, column), ids in zip(linked.positions.tolist(), linked.top_entity_ids.tolist()):
            if column >= last.get(row, (-1, None))[0]:
                last[row] = (column, ids[0])
        for row, (_, entity) in last.items():
            predictions[rows[begin + row]["id"]] = f"{ENTITY_START_TOKEN} {vocab.name_of(entity)} {ENTITY_END_TOKEN}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(predictions, indent=1))
    return path


def majority_answers(train_file: Path, test_file: Path, path: Path) -> Path:
    """The floor every model must clear: for each question form ("Where was X born?"), the answer most often
    right for that form in the training questions, given to every test question of the form. No model, no facts."""
    answers: dict[str, Counter] = {}
    for record in read_jsonl(train_file):
        answers.setdefault(record["relation"], Counter())[record["answer"][0]] += 1
    predictions = {}
    for record in read_jsonl(test_file):
        counts = answers.get(record["relation"])
        predictions[record["id"]] = counts.most_common(1)[0][0] if counts else ""
    path.write_text(json.dumps(predictions, indent=1))
    return path


def save_entity_mask(hidden: torch.Tensor, path: Path) -> Path:
    """The authors' memory mask file (their get_memory_mask.py, read by `--entity_mask_file`): a long tensor, 1 for a
    hidden entity."""
    torch.save(hidden.long(), path)
    return path


def write_entity_mask(num_entities: int, visible_fraction: float, seed: int, path: Path) -> Path:
    """The authors' random memory mask: each entity hidden with probability `1 - visible_fraction`, saved."""
    return save_entity_mask(random_entity_mask(num_entities, visible_fraction, seed), path)


def hidden_rows(num_entities: int, names: list[str] | None, vocab) -> torch.Tensor:
    """1 for each entity of `names` (every entity when None), 0 for the others."""
    if names is None:
        return torch.ones(num_entities, dtype=torch.long)
    hidden = torch.zeros(num_entities, dtype=torch.long)
    hidden[[vocab.id_of(name) for name in names]] = 1
    return hidden


def random_entity_mask(num_entities: int, visible_fraction: float, seed: int) -> torch.Tensor:
    """The authors' random memory mask: 1 for a hidden entity, each hidden with probability `1 - visible_fraction`."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.rand(num_entities, generator=generator) >= visible_fraction).long()


# --- memorisation -----------------------------------------------------------------------------------------------


def marked_biography(world: ToyWorld, person: str) -> str:
    """The person's first biography as the corpus marks it: links and the person's names `<E_s> ... <E_e>`."""
    entity = world.entity(person)
    text = world.pages[person].split("\n\n== ")[0]
    text = re.sub(r"\[\[([^\]|]+)\]\]", rf"{ENTITY_START_TOKEN} \1 {ENTITY_END_TOKEN}", text)
    names = re.compile(rf"\b({re.escape(person)}|{re.escape(entity.aliases[0])})\b")
    return names.sub(rf"{ENTITY_START_TOKEN} \1 {ENTITY_END_TOKEN}", text)


def _percent_by_kind(hits: dict[str, list[bool]]) -> dict[str, float]:
    """% of hits over every relation, over the entity relations and over the literal ones."""
    kinds = {"all": list(hits), "entity": list(ENTITY_RELATIONS),
             "literal": [relation for relation in hits if relation not in ENTITY_RELATIONS]}  # fmt: skip
    out = {}
    for kind, relations in kinds.items():
        values = [hit for relation in relations for hit in hits[relation]]
        out[kind] = round(100 * sum(values) / len(values), 2)
    return out


@torch.no_grad()
def _probe_target(spans: EDMemMaskingCollator | None, ids: torch.Tensor, inside: list[int]):
    """What the decoder is teacher-forced on to fill the masked positions `inside` of `ids`, and where in it the
    filled tokens are: the passage itself (the paper's target), or with `spans` (a collator of the `masked_spans`
    target) the masked span alone, as pre-training made it."""
    return (ids, inside) if spans is None else spans.masked_span_target(ids, inside)


def _span_collator(tokenizer, decoder_target: str) -> EDMemMaskingCollator | None:
    """The collator whose targets the probes ask a `--decoder_target masked_spans` model for (None: the passage)."""
    return EDMemMaskingCollator(tokenizer, decoder_target="masked_spans") if decoder_target == "masked_spans" else None


def memorisation(model_dir: Path, world: ToyWorld, people: dict[str, list[str]], decoder_target: str = "passage"
                 ) -> dict:  # fmt: skip
    """How often the pre-trained model fills a masked fact of a person's first biography (read in pre-training):
    every token of the value masked, the value's tokens predicted (teacher-forced decoder for the seq2seq models,
    the masked-LM head for EncMem), a hit when all are right. By half (`people`: half -> names) and relation.
    For a model with a memory, also how often the memory's top entity at a masked entity value is that value.
    For the seq2seq models, also `decoder_alone`: the same facts filled with every encoder input token masked, what
    the decoder holds keyed on its own prefix, which a question (whose subject only the encoder reads) cannot use;
    and `question_form`: the facts filled with the subject named to the encoder only (`question_form_hits`), what
    a question can read out of what was memorised. For a model with a memory, also `memory_finds_the_person`.
    `decoder_target`: what the model's pre-training decoder wrote (`--decoder_target`), which the probes ask for."""
    config = EDMemConfig.from_pretrained(model_dir)
    encoder_only = config.variant == "encmem"
    model = (EDMemForEntityLinking if encoder_only else EDMemForConditionalGeneration).from_pretrained(model_dir)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    has_memory = config.variant != "encdec"
    spans = _span_collator(tokenizer, decoder_target)
    result = {}
    for half, names in people.items():
        hits: dict[str, list[bool]] = {}
        decoder_alone: list[bool] = []
        linked: list[bool] = []
        question_form: dict[str, list[bool]] = {}
        for person in names:
            if not encoder_only:
                found = question_form_hits(model, tokenizer, world.entity(person), spans)
                for relation, hit in found.items():
                    question_form.setdefault(relation, []).append(hit)
            text = marked_biography(world, person)
            encoded = tokenizer(text, return_offsets_mapping=True, return_tensors="pt")
            ids, offsets = encoded.input_ids[0], encoded.offset_mapping[0].tolist()
            blank = torch.full_like(ids, tokenizer.mask_token_id)
            blank[[0, -1]] = ids[[0, -1]]  # <s> and </s> kept: the encoder reads nothing else
            alone_of: dict[tuple[int, ...], torch.Tensor] = {}  # the blank input's fill, by target (the passage: one)
            for relation, _, is_entity in PERSON_ATTRIBUTES:
                value = world.entity(person).attributes[relation]
                match = re.search(rf"(?<![\w-]){re.escape(value)}(?![\w-])", text, flags=re.IGNORECASE)
                if match is None:
                    raise RuntimeError(f"{person!r}'s first biography does not state {relation} = {value!r}")
                inside = [i for i, (s, e) in enumerate(offsets) if e > s and s < match.end() and e > match.start()]
                masked = ids.clone()
                masked[inside] = tokenizer.mask_token_id
                target, filled = _probe_target(spans, ids, inside)
                labels = {} if encoder_only else {"labels": target[None]}  # the decoder teacher-forced
                output = model(input_ids=masked[None], output_attended_entities=is_entity and has_memory, **labels)
                predicted = output.logits[0].argmax(-1)
                hits.setdefault(relation, []).append(bool((predicted[filled] == target[filled]).all()))
                if not encoder_only:
                    key = tuple(target.tolist())
                    if key not in alone_of:
                        alone_of[key] = model(input_ids=blank[None], **labels).logits[0].argmax(-1)
                    alone = alone_of[key]
                    decoder_alone.append(bool((alone[filled] == target[filled]).all()))
                if is_entity and has_memory:
                    access = output.attended_entities if encoder_only else output.encoder_attended_entities
                    position = inside[0] - 1  # the value's <E_s>
                    row = (access.positions[:, 1] == position).nonzero()[0, 0]
                    linked.append(model.entity_vocab.name_of(int(access.top_entity_ids[row, 0])) == value)
        per_relation = {relation: round(100 * sum(v) / len(v), 2) for relation, v in hits.items()}
        entity = [hit for relation in ENTITY_RELATIONS for hit in hits[relation]]
        literal = [hit for relation, v in hits.items() if relation not in ENTITY_RELATIONS for hit in v]
        result[half] = {"all": round(100 * sum(map(sum, hits.values())) / sum(map(len, hits.values())), 2),
                        "entity": round(100 * sum(entity) / len(entity), 2),
                        "literal": round(100 * sum(literal) / len(literal), 2), "by_relation": per_relation}  # fmt: skip
        if decoder_alone:
            result[half]["decoder_alone"] = round(100 * sum(decoder_alone) / len(decoder_alone), 2)
        if question_form:
            result[half]["question_form"] = _percent_by_kind(question_form)
        if has_memory:
            result[half]["memory_finds_the_person"] = memory_finds_the_person(model, tokenizer, world, names)
        if linked:
            result[half]["memory_names_the_masked_entity"] = round(100 * sum(linked) / len(linked), 2)
    return result


def _value_positions(tokenizer, text: str, value: str) -> tuple[torch.Tensor, list[int]]:
    """`text`'s token ids and the positions of the tokens of `value` (its first whole-word occurrence)."""
    encoded = tokenizer(text, return_offsets_mapping=True, return_tensors="pt")
    match = re.search(rf"(?<![\w-]){re.escape(value)}(?![\w-])", text, flags=re.IGNORECASE)
    if match is None:
        raise RuntimeError(f"{text!r} does not state {value!r}")
    offsets = encoded.offset_mapping[0].tolist()
    return encoded.input_ids[0], [
        i for i, (s, e) in enumerate(offsets) if e > s and s < match.end() and e > match.start()
    ]


@torch.no_grad()
def question_form_hits(model, tokenizer, person: ToyEntity, spans: EDMemMaskingCollator | None = None
                       ) -> dict[str, bool]:  # fmt: skip
    """Per relation: does the pre-trained seq2seq model fill the value when only its encoder names the subject?

    The encoder reads a statement of the fact (the first template) with the subject marked and the value masked;
    the decoder is teacher-forced on the same statement with the pronoun as its subject, so that, as when it answers
    a question, it can reach the fact only through the encoder (with `spans`, a collator of the `masked_spans`
    target, the decoder writes the masked value alone). A hit when every token of the value is right."""
    subject_pronoun, _ = PRONOUNS[person.attributes["pronoun"]]
    subject = f"{ENTITY_START_TOKEN} {person.name} {ENTITY_END_TOKEN}"
    hits = {}
    for relation, _, is_entity in PERSON_ATTRIBUTES:
        value = person.attributes[relation]
        marked = f"{ENTITY_START_TOKEN} {value} {ENTITY_END_TOKEN}" if is_entity else value
        template = TEMPLATES[relation][0]
        # in running text, as a question is tokenised: " She", not the sentence-initial "S" "he"
        target = in_running_text(template.format(S=subject_pronoun.capitalize(), s=subject_pronoun, V=marked))
        source = in_running_text(template.format(S=subject, s=subject, V=marked))
        source, masked = _value_positions(tokenizer, source, value)
        source = source.clone()
        source[masked] = tokenizer.mask_token_id
        if spans is None:
            target_ids, inside = _value_positions(tokenizer, target, value)
        else:
            target_ids, inside = spans.masked_span_target(source, masked)
        predicted = model(input_ids=source[None], labels=target_ids[None]).logits[0].argmax(-1)
        hits[relation] = bool((predicted[inside] == target_ids[inside]).all())
    return hits


PERSON_CONTEXTS = {  # how a person is named to the memory in `memory_finds_the_person`
    "name_alone": lambda world, person: f"{ENTITY_START_TOKEN} {person} {ENTITY_END_TOKEN}",
    "question": lambda world, person: in_running_text(
        PERSON_ATTRIBUTES[0][1].format(f"{ENTITY_START_TOKEN} {person} {ENTITY_END_TOKEN}")
    ),
    "first_biography": lambda world, person: marked_biography(world, person),
}


@torch.no_grad()
def memory_finds_the_person(model, tokenizer, world: ToyWorld, people: list[str]) -> dict[str, float]:
    """How often the memory's top entity at a person's first mention is the person, when the person is named alone,
    in a question, or in their first biography (which also states their facts): whether the memory finds a person
    by name or by the facts around the name."""
    found = {}
    for context, text_of in PERSON_CONTEXTS.items():
        hits = []
        for person in people:
            batch = tokenizer([text_of(world, person)], return_tensors="pt", truncation=True,
                              max_length=model.config.max_position_embeddings)  # fmt: skip
            if isinstance(model, EDMemForEntityLinking):
                access = model(**batch, output_attended_entities=True).attended_entities
            else:
                access = model.get_encoder()(**batch, output_attended_entities=True).memory_access
            hits.append(model.entity_vocab.name_of(int(access.top_entity_ids[0, 0])) == person)
        found[context] = round(100 * sum(hits) / len(hits), 2)
    return found


@torch.no_grad()
def memory_tops_and_subjects(
    model_dir: Path, data_file: Path, hidden: Sequence[str] = ()
) -> tuple[list[str | None], list[str]]:
    """For each question (file order): the memory's top entity at its marked subject (`memory_top_names`), and the
    subject. `hidden`: names of entities whose rows are hidden from the memory meanwhile."""
    model = EDMemForConditionalGeneration.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if hidden:
        model.set_entity_mask(hidden_rows(model.config.entity_vocab_size, list(hidden), model.entity_vocab) == 0)
    subjects = [record["link_target"][0] for record in read_jsonl(data_file)]
    return memory_top_names(model, tokenizer, data_file), subjects


def memory_hits(model_dir: Path, data_file: Path, hidden: Sequence[str] = ()) -> list[bool]:
    """For each question (file order): is the memory's top entity at the marked subject the subject?"""
    tops, subjects = memory_tops_and_subjects(model_dir, data_file, hidden)
    return [top == subject for top, subject in zip(tops, subjects)]


def memory_top_names(model, tokenizer, data_file: Path) -> list[str | None]:
    """For each question (file order): the name of the encoder memory's top entity at its marked subject, as `model`
    (in eval mode, with its entity mask) finds it; None where the question has no marked subject."""
    rows = read_qa(data_file, model.entity_vocab)
    tops = {}
    for begin in range(0, len(rows), 64):
        chunk = rows[begin : begin + 64]
        batch = tokenizer([in_running_text(q) for q in chunk["question"]], padding=True, return_tensors="pt")
        access = model.get_encoder()(**batch, output_attended_entities=True).memory_access
        for (row, _), top in zip(access.positions.tolist(), access.top_entity_ids[:, 0].tolist()):
            tops.setdefault(chunk["id"][row], model.entity_vocab.name_of(top))  # the first mention: the subject
    return [tops.get(record["id"]) for record in read_jsonl(data_file)]


# --- scoring ----------------------------------------------------------------------------------------------------


def question_hits(test_file: Path, links_file: Path, predictions: Path) -> list[tuple[bool, bool]]:
    """Per test question, in file order: (answer is an entity, exact match), by `edmem evaluate`'s rule."""
    predicted = json.loads(predictions.read_text())
    links = json.loads(links_file.read_text())
    return [(links[record["id"]] is not None, exact_match(predicted[record["id"]], record["answer"]))
            for record in read_jsonl(test_file)]  # fmt: skip


def em(hits: list[tuple[bool, bool]]) -> dict[str, float]:
    """Exact match in percent: all questions, entity answers, literal answers."""
    groups = {
        "all": [h for _, h in hits],
        "entity": [h for e, h in hits if e],
        "literal": [h for e, h in hits if not e],
    }
    return {name: round(100 * sum(g) / len(g), 2) if g else float("nan") for name, g in groups.items()}


def bootstrap(per_seed: list[list[tuple[bool, bool]]], samples: int, seed: int = 0) -> dict[str, list[float]]:
    """95 % intervals of the mean over seeds of each EM, by a two-level bootstrap: the seeds resampled with
    replacement, then the questions of each drawn seed. The spread between seeds (a world, a split and models each)
    is in the interval: with one seed it is the questions' spread alone."""
    rng = random.Random(seed)
    draws: dict[str, list[float]] = {"all": [], "entity": [], "literal": []}
    for _ in range(samples):
        means = {name: [] for name in draws}
        for hits in (per_seed[rng.randrange(len(per_seed))] for _ in per_seed):
            resampled = em([hits[rng.randrange(len(hits))] for _ in hits])
            for name in draws:
                means[name].append(resampled[name])
        for name in draws:
            draws[name].append(statistics.fmean(means[name]))
    interval = {}
    for name, values in draws.items():
        values.sort()
        interval[name] = [round(values[int(0.025 * samples)], 2), round(values[int(0.975 * samples) - 1], 2)]
    return interval


def parameter_counts(model_dir: Path) -> dict[str, int]:
    """Parameters with and without the entity table (tied copies counted once)."""
    config = EDMemConfig.from_pretrained(model_dir)
    cls = EDMemForEntityLinking if config.variant == "encmem" else EDMemForConditionalGeneration
    model = cls.from_pretrained(model_dir)
    total = model.num_parameters()
    table = 0 if config.variant == "encdec" else model.get_encoder().entity_embeddings.weight.numel()
    return {"with_table": total, "without_table": total - table}


# --- the experiment ---------------------------------------------------------------------------------------------


def run_condition(settings: Settings, seed: int, out: Path, varied: bool = True, ablation: bool = False,
                  recipe: Recipe = PAPER) -> dict:  # fmt: skip
    """One seed's world, models and predictions under `recipe`; `ablation` trains EDMem and EncDec only, tested
    plainly. Questions are asked of the validation group, and of the test group when `settings.read_test`. Models
    are kept under folders named by what sets them apart from the paper's, so that recipes share what they can."""
    started = time.perf_counter()
    data = make_world(settings, seed, out, varied)
    files, world, splits = data["files"], data["world"], data["splits"]
    asked = ["validation", "test"] if settings.read_test else ["validation"]
    variants = ("edmem", "encdec") if ablation or not settings.encmem else ("edmem", "encdec", "encmem")
    folders = {variant: out / f"pretrain-{variant}{recipe.pretraining_suffix(variant)}" for variant in variants}
    t0 = time.perf_counter()
    models = pretrain_side_by_side(
        {
            variant: (variant, data["corpus"], where, settings, seed, None, recipe, data["mixed_questions"])
            for variant, where in folders.items()
        },
        settings.pretrain_jobs,
    )
    logger.info("seed %d: pre-trained %s in %.0f s", seed, ", ".join(variants), time.perf_counter() - t0)
    if settings.encdec_matched and not ablation:
        ffn_dim = matched_ffn_dim(models["edmem"], models["encdec"], settings)
        where = out / f"pretrain-encdec-matched{recipe.pretraining_suffix('encdec')}"
        models["encdec_matched"] = pretrain_variant(
            "encdec", data["corpus"], where, settings, seed, ffn_dim, recipe, data["mixed_questions"]
        )
    groups = {group: sorted({pair.subject for pair in pairs}) for group, pairs in splits.items() if pairs}
    memorised = {variant: memorisation(path, world, groups, recipe.decoder_target) for variant, path in models.items()}
    predictions: dict[str, dict[str, Path]] = {group: {} for group in ["train", *asked]}  # -> system -> file
    vocab = EDMemForConditionalGeneration.from_pretrained(models["edmem"]).entity_vocab
    size = len(vocab)
    every_row = save_entity_mask(hidden_rows(size, None, vocab), out / "mask-every-row.pt")
    subject_rows = {group: save_entity_mask(hidden_rows(size, groups[group], vocab), out / f"mask-{group}-subjects.pt")
                    for group in asked}  # fmt: skip

    def finetuned(variant: str, model_dir: Path, mask: Path | None = None, name: str = "") -> Path:
        weight = recipe.finetune_entity_loss_weight if variant != "encdec" else 1.0
        where = out / f"finetune-{name or variant}{recipe.finetuning_suffix(variant)}"
        return finetune_model(model_dir, files["train"], where, settings, seed, mask, weight)

    edmem = finetuned("edmem", models["edmem"])
    predictions["train"]["edmem_free"] = predict(edmem, files["train"], edmem / "train-free", "free", settings, seed)
    for group in asked:
        tag = "" if group == "test" else f"{group}-"
        for mode in ("free",) if ablation else MODES:
            predictions[group][f"edmem_{mode}"] = predict(edmem, files[group], edmem / f"{tag}{mode}", mode,
                                                          settings, seed)  # fmt: skip
        if not ablation:
            for mode in ("free", "static"):
                for name, mask in (("every_row", every_row), ("subject_rows", subject_rows[group])):
                    predictions[group][f"edmem_{mode}_{name}_hidden_at_test"] = predict(
                        edmem, files[group], edmem / f"{tag}{mode}-{name}-hidden", mode, settings, seed, mask
                    )
    seq2seq = {"encdec": models["encdec"]}
    if "encdec_matched" in models:
        seq2seq["encdec_matched"] = models["encdec_matched"]
    for system, model_dir in seq2seq.items():
        tuned = finetuned("encdec", model_dir, name=system.replace("_", "-"))
        predictions["train"][system] = predict(tuned, files["train"], tuned / "train-free", "free", settings, seed)
        for group in asked:
            tag = "" if group == "test" else f"{group}-"
            predictions[group][system] = predict(tuned, files[group], tuned / f"{tag}free", "free", settings, seed)
    if "encmem" in models:
        encmem = finetune_encmem(models["encmem"], files["train"], out / "finetune-encmem", settings, seed)
        predictions["train"]["encmem"] = predict_encmem(encmem, files["train"], encmem / "train_predictions.json")
        for group in asked:
            predictions[group]["encmem"] = predict_encmem(encmem, files[group], encmem / f"{group}_predictions.json")
            predictions[group]["encmem_subject_rows_hidden_at_test"] = predict_encmem(
                encmem, files[group], encmem / f"{group}_subject_rows_hidden.json", torch.load(subject_rows[group])
            )
    if settings.memory_hidden_in_finetuning and not ablation:
        hidden = finetuned("edmem", models["edmem"], every_row, name="edmem-memory-hidden")
        for group in asked:
            tag = "" if group == "test" else f"{group}-"
            for mode in ("free", "static"):
                predictions[group][f"edmem_{mode}_hidden_in_finetuning"] = predict(
                    hidden, files[group], hidden / f"{tag}{mode}", mode, settings, seed, every_row
                )
    for group in predictions:
        predictions[group]["majority_answer"] = majority_answers(files["train"], files[group],
                                                                 out / f"majority_predictions_{group}.json")  # fmt: skip
    recall = {group: memory_hits(edmem, files[group]) for group in predictions}
    hits = {group: {system: question_hits(files[group], files[f"{group}_links"], path)
                    for system, path in systems.items()} for group, systems in predictions.items()}  # fmt: skip
    return {
        "seed": seed,
        "varied": varied,
        "recipe": asdict(recipe),
        "questions": {group: len(pairs) for group, pairs in splits.items()},
        "entities": size,
        "parameters": {variant: parameter_counts(path) for variant, path in models.items()},
        "memorisation": memorised,
        "edmem_memory_recall_at_subject": {group: round(100 * sum(h) / len(h), 2) for group, h in recall.items()},
        "hits": hits,
        "em": {group: {system: em(h) for system, h in systems.items()} for group, systems in hits.items()},
        # this call's time: what a rerun with the same --out reuses (pre-training, fine-tuning) costs nothing here
        "seconds_this_call": round(time.perf_counter() - started),
    }


def pretraining_curve(settings: Settings, seed: int, out: Path, budgets: list[int]) -> list[dict]:
    """EM against pre-training steps: EDMem and EncDec pre-trained from scratch for each budget on the world of
    `seed` (its corpus, in `out / f"seed-{seed}"`), fine-tuned as in the run; memorisation and EM (free decoding)
    of the validation group a budget (a choice: made on the validation group)."""
    data = make_world(settings, seed, out / f"seed-{seed}")
    people = sorted({pair.subject for pair in data["splits"]["validation"]})
    files = data["files"]
    points = []
    for steps in budgets:
        budget = replace(settings, pretrain_steps=steps)
        where = out / f"curve-seed-{seed}" / f"steps-{steps}"
        point: dict = {"steps": steps}
        pretrained_models = pretrain_side_by_side(
            {variant: (variant, data["corpus"], where / f"pretrain-{variant}", budget, seed, None, PAPER,
                       data["mixed_questions"]) for variant in
             ("edmem", "encdec")}, settings.pretrain_jobs)  # fmt: skip
        for variant in ("edmem", "encdec"):
            pretrained = pretrained_models[variant]
            finetuned = finetune_model(pretrained, data["files"]["train"], where / f"finetune-{variant}", budget, seed)
            predictions = predict(finetuned, files["validation"], finetuned / "validation-free", "free", budget, seed)
            memorised = memorisation(pretrained, data["world"], {"validation": people})["validation"]["all"]
            point[variant] = {
                "memorisation_validation": memorised,
                "em_validation": em(question_hits(files["validation"], files["validation_links"], predictions)),
            }
            logger.info("curve, seed %d, %d steps, %s: %s", seed, steps, variant, point[variant])
        points.append(point)
    return points


def summarise(runs: list[dict], samples: int) -> dict:
    """Per half and system: the mean EM over seeds with its 95 % bootstrap interval."""
    summary = {}
    for half in runs[0]["hits"]:
        summary[half] = {}
        for system in runs[0]["hits"][half]:
            per_seed = [run["hits"][half][system] for run in runs]
            means = {name: round(statistics.fmean(run["em"][half][system][name] for run in runs), 2)
                     for name in ("all", "entity", "literal")}  # fmt: skip
            summary[half][system] = {"em": means, "interval": bootstrap(per_seed, samples)}
    return summary


def reported_group(summary: dict) -> str:
    """The group the figures are read on: the test group when it was asked, else the validation group."""
    return "test" if "test" in summary else "validation"


def validity(summary: dict, settings: Settings) -> dict:
    """A system answers entity questions about people seen only in pre-training at `valid_entity_em` or more and
    `valid_entity_margin` points over the floor, and literal ones `valid_literal_margin` over theirs: both bars met
    by one system (`valid_system`, the best on entity answers of those that meet both)."""
    group = reported_group(summary)
    scores = summary[group]
    systems = {name: s["em"] for name, s in scores.items() if name != "majority_answer" and "hidden" not in name}
    floor = scores["majority_answer"]["em"]
    entity_bar = max(settings.valid_entity_em, floor["entity"] + settings.valid_entity_margin)
    literal_bar = floor["literal"] + (settings.valid_literal_margin or 0.0)
    meets = {name: em["entity"] >= entity_bar and (settings.valid_literal_margin is None or em["literal"] >= literal_bar)
             for name, em in systems.items()}  # fmt: skip
    best_entity = max(systems, key=lambda name: systems[name]["entity"])
    best_literal = max(systems, key=lambda name: systems[name]["literal"] if name != "encmem" else -1)
    valid_systems = [name for name in systems if meets[name]]
    valid_system = max(valid_systems, key=lambda name: systems[name]["entity"]) if valid_systems else None
    return {"valid": valid_system is not None, "valid_system": valid_system, "group": group,
            "best_entity_system": best_entity, "best_entity_em": systems[best_entity]["entity"],
            "floor_entity": floor["entity"], "best_literal_system": best_literal,
            "best_literal_em": systems[best_literal]["literal"], "floor_literal": floor["literal"],
            "entity_bar": entity_bar, "literal_bar": literal_bar if settings.valid_literal_margin is not None else None}  # fmt: skip


def gaps(summary: dict) -> dict[str, float]:
    """EDMem (free decoding) minus EncDec, on entity and on literal answers, in the reported group."""
    scores = summary[reported_group(summary)]
    edmem, encdec = scores["edmem_free"]["em"], scores["encdec"]["em"]
    return {f"{kind}_gap_edmem_minus_encdec": round(edmem[kind] - encdec[kind], 2) for kind in ("entity", "literal")}


def orderings(summary: dict) -> dict[str, bool]:
    """The paper's orderings, on the means of the reported group."""
    test = {name: s["em"] for name, s in summary[reported_group(summary)].items()}
    found = {
        "free_over_encdec_on_entity_answers": test["edmem_free"]["entity"] > test["encdec"]["entity"],
        "static_at_least_free_on_entity_answers": test["edmem_static"]["entity"] >= test["edmem_free"]["entity"],
        "hiding_the_memory_moves_edmem_toward_encdec": abs(
            test["edmem_free_every_row_hidden_at_test"]["entity"] - test["encdec"]["entity"]
        )
        < abs(test["edmem_free"]["entity"] - test["encdec"]["entity"]),
    }
    if "encdec_matched" in test:
        found["free_over_parameter_matched_encdec_on_entity_answers"] = (
            test["edmem_free"]["entity"] > test["encdec_matched"]["entity"]
        )
    if "encmem" in test:
        found["encmem_zero_on_literal_answers"] = test["encmem"]["literal"] == 0.0
    return found


def plot(summary: dict, out: Path, curve: list[dict] | None = None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    group = reported_group(summary)
    test = summary[group]
    names = [n for n in ("edmem_free", "edmem_static", "edmem_dynamic", "encdec", "encdec_matched", "encmem",
                         "majority_answer") if n in test]  # fmt: skip
    fig, ax = plt.subplots(figsize=(9, 4))
    keys = (("all", "all"), ("entity", "entity answers"), ("literal", "literal answers"))
    width = 0.8 / len(keys)
    for i, (key, label) in enumerate(keys):
        means = [test[n]["em"][key] for n in names]
        errors = [[m - test[n]["interval"][key][0] for n, m in zip(names, means)],
                  [test[n]["interval"][key][1] - m for n, m in zip(names, means)]]  # fmt: skip
        ax.bar([x + i * width for x in range(len(names))], means, width, yerr=errors, label=label, capsize=3)
    ax.set_xticks([x + width for x in range(len(names))], [n.replace("_", "\n") for n in names])
    ax.set_ylabel("exact match (%), 95 % interval (seeds, then questions)")
    ax.set_title(f"Questions about people seen only in pre-training ({group} group)")
    ax.legend()
    fig.tight_layout()
    paths.append(out / "em_by_model.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    memory = [("edmem_free", "whole memory"), ("edmem_free_subject_rows_hidden_at_test", "subjects' rows hidden\nat test"),
              ("edmem_free_every_row_hidden_at_test", "every row hidden\nat test"),
              ("edmem_free_hidden_in_finetuning", "every row hidden in\nfine-tuning and test"), ("encdec", "EncDec")]  # fmt: skip
    memory = [(name, label) for name, label in memory if name in test]
    fig, ax = plt.subplots(figsize=(8, 4))
    for i, (key, label) in enumerate((("entity", "entity answers"), ("literal", "literal answers"))):
        means = [test[n]["em"][key] for n, _ in memory]
        errors = [[m - test[n]["interval"][key][0] for (n, _), m in zip(memory, means)],
                  [test[n]["interval"][key][1] - m for (n, _), m in zip(memory, means)]]  # fmt: skip
        ax.bar([x + i * 0.4 for x in range(len(memory))], means, 0.4, yerr=errors, label=label, capsize=3)
    ax.set_xticks([x + 0.2 for x in range(len(memory))], [label for _, label in memory], fontsize=8)
    ax.set_ylabel("exact match (%)")
    ax.set_title("EDMem (free decoding) with its memory hidden")
    ax.legend()
    fig.tight_layout()
    paths.append(out / "em_memory_hidden.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    if curve:
        fig, ax = plt.subplots(figsize=(7, 4))
        steps = [point["steps"] for point in curve]
        for variant, label in (("edmem", "EDMem (free)"), ("encdec", "EncDec")):
            for key, style, what in (("entity", "-o", "entity EM"), ("literal", ":o", "literal EM")):
                ax.plot(steps, [p[variant]["em_validation"][key] for p in curve], style, label=f"{label}, {what}")
            ax.plot(steps, [p[variant]["memorisation_validation"] for p in curve], "--x", label=f"{label}, memorised")
        ax.set_xlabel("pre-training steps")
        ax.set_ylabel("% (validation group)")
        ax.set_title("Memorisation and question answering against pre-training steps")
        ax.legend(fontsize=7)
        fig.tight_layout()
        paths.append(out / "em_against_steps.png")
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths


def experiment_parser(description: str, default_out: str) -> argparse.ArgumentParser:
    """The options the toy-world experiments share."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default=default_out, help="working directory; results.json and plots")
    parser.add_argument("--quick", action="store_true", help="a small world, one seed (< 20 minutes on 2 cores)")
    parser.add_argument("--seeds", type=int, nargs="+", help="override the seeds")
    parser.add_argument("--num-people", type=int, help="override the world's number of people")
    parser.add_argument("--pretrain-steps", type=int, help="override the pre-training steps")
    parser.add_argument("--finetune-epochs", type=float, help="override the fine-tuning epochs")
    parser.add_argument("--finetune-learning-rate", type=float, help="override the fine-tuning learning rate")
    parser.add_argument("--finetune-batch-size", type=int, help="override the fine-tuning batch size")
    parser.add_argument("--pretrain-batch-size", type=int, help="override the pre-training batch size")
    parser.add_argument("--pretrain-learning-rate", type=float, help="override the pre-training learning rate")
    parser.add_argument("--pretrain-jobs", type=int, help="pre-trainings run side by side (default: 2)")
    parser.add_argument("--d-model", type=int, help="override the width")
    parser.add_argument("--layers", type=int, help="override the lower and upper layers of each side")
    parser.add_argument("--fullname", action=argparse.BooleanOptionalAction,
                        help="every sentence names the person in full (the study's fullname augmentation)")  # fmt: skip
    parser.add_argument("--shuffled-questions", action=argparse.BooleanOptionalAction,
                        help="the mixed-in questions on pages of their own, people mixed (default: each person's on "
                             "their page)")  # fmt: skip
    parser.add_argument("--questions-in-batches", action=argparse.BooleanOptionalAction,
                        help="the mixed-in questions in the pre-training batches in the fine-tuning format "
                             "(`edmem pretrain --mixed_questions_file`), not as text on pages")  # fmt: skip
    parser.add_argument("--mix-qa", action=argparse.BooleanOptionalAction,
                        help="the fine-tuning half's questions in pre-training too (default: on)")  # fmt: skip
    parser.add_argument("--no-plots", action="store_true")
    return parser


def qa_parser() -> argparse.ArgumentParser:
    parser = experiment_parser(__doc__.split("\n")[0], "runs/toy-world-qa")
    parser.add_argument("--setup", choices=tuple(SETUPS),
                        help="headline (the default): the recipe of docs/evidence.md's headline, the questions in the "
                             "pre-training batches, 30,000 steps, no fine-tuning, --recipes el_per_token, EDMem and "
                             "EncDec; paper: the paper's, 7,500 steps, the questions on the pages, 60 epochs of "
                             "fine-tuning, EncMem, a matched EncDec and the ablations beside them. The options below "
                             "change either; --quick is a small world of the paper's setup")  # fmt: skip
    parser.add_argument("--curve", type=int, nargs="+", metavar="STEPS",
                        help="also EDMem and EncDec pre-trained for each of these step budgets on the first seed's "
                             "world (EM against pre-training steps)")  # fmt: skip
    parser.add_argument("--encdec-matched", action=argparse.BooleanOptionalAction,
                        help="also an EncDec of EDMem's parameter count (default: on, off in --quick)")  # fmt: skip
    parser.add_argument("--encmem", action=argparse.BooleanOptionalAction,
                        help="also EncMem (default: on, off in --quick)")  # fmt: skip
    parser.add_argument("--recipes", nargs="+", choices=tuple(RECIPES), metavar="RECIPE",
                        help=f"pre-training and fine-tuning recipes, each run on every seed; the first is reported "
                             f"(default: paper). Choices: {', '.join(RECIPES)}")  # fmt: skip
    parser.add_argument("--no-test", dest="read_test", action="store_false", default=None,
                        help="choose on the validation group: the test group is neither predicted nor scored")  # fmt: skip
    parser.add_argument("--memory-hidden-in-finetuning", action=argparse.BooleanOptionalAction,
                        help="also EDMem fine-tuned and tested with every memory row hidden (default: on, off in "
                             "--quick)")  # fmt: skip
    parser.add_argument("--single-biography-ablation", action=argparse.BooleanOptionalAction,
                        help="also the single-biography world on the first seed (default: on, off in --quick)")  # fmt: skip
    return parser


def with_overrides(settings: Settings, args: argparse.Namespace) -> Settings:
    """`settings` with the shared options given on the command line."""
    overrides = dict(seeds=tuple(args.seeds) if args.seeds else None, num_people=args.num_people,
                     pretrain_steps=args.pretrain_steps, finetune_epochs=args.finetune_epochs, d_model=args.d_model,
                     finetune_learning_rate=args.finetune_learning_rate, finetune_batch_size=args.finetune_batch_size,
                     pretrain_batch_size=args.pretrain_batch_size, pretrain_learning_rate=args.pretrain_learning_rate,
                     layers=args.layers, mix_qa=args.mix_qa, pretrain_jobs=args.pretrain_jobs,
                     fullname=args.fullname, shuffled_questions=args.shuffled_questions,
                     questions_in_batches=args.questions_in_batches)  # fmt: skip
    return replace(settings, **{k: v for k, v in overrides.items() if v is not None})


def qa_settings(args: argparse.Namespace) -> Settings:
    """The run's settings: `--quick`'s, or `--setup`'s (the headline's by default), with the command line's
    overrides and switches."""
    if args.quick and args.setup:
        raise ValueError("--quick is a small world of the paper's setup: give --quick or --setup")
    settings = with_overrides(QUICK if args.quick else SETUPS[args.setup or "headline"], args)
    if args.recipes:
        settings = replace(settings, recipes=tuple(args.recipes))
    for switch in (
        "encdec_matched",
        "encmem",
        "single_biography_ablation",
        "memory_hidden_in_finetuning",
        "read_test",
    ):
        if getattr(args, switch) is not None:
            settings = replace(settings, **{switch: getattr(args, switch)})
    return settings


def quiet_logging() -> None:
    """Progress lines from the experiment; warnings only from the libraries."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for name in ("transformers", "datasets", "edmem_hf", "accelerate"):
        logging.getLogger(name).setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    parser = qa_parser()
    args = parser.parse_args(argv)
    try:
        settings = qa_settings(args)
    except ValueError as error:
        parser.error(str(error))
    quiet_logging()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {name: [] for name in settings.recipes}
    for seed in settings.seeds:
        for name in settings.recipes:
            runs[name].append(run_condition(settings, seed, out / f"seed-{seed}", recipe=RECIPES[name]))
            write_results(settings, runs, [], out, plots=False)  # each seed's figures as soon as they exist
    reported = settings.recipes[0]
    ablation = []
    if settings.single_biography_ablation:
        ablation.append(run_condition(settings, settings.seeds[0], out / f"single-seed-{settings.seeds[0]}",
                                      varied=False, ablation=True, recipe=RECIPES[reported]))  # fmt: skip
    curve = pretraining_curve(settings, settings.seeds[0], out, args.curve) if args.curve else []
    result = write_results(settings, runs, ablation, out, plots=not args.no_plots, curve=curve)
    print(json.dumps({key: result[key] for key in ("validity", "orderings", "memory_hidden_drop")}, indent=1))
    print("RESULT " + " ".join(result_fields(settings, result)))
    return 0


def result_fields(settings: Settings, result: dict) -> list[str]:
    """The RESULT line's `key=value` fields: the reported recipe (its losses and masking by name, then the run's
    steps, where its questions go and its fine-tuning), its figures, then each other recipe's gaps."""
    validity = result["validity"]
    group = validity["group"]
    scores = result["summary"][group]
    fields = [f"seeds={len(result['runs'])}", f"people={settings.num_people}", f"group={group}",
              f"{group}_questions={result['runs'][0]['questions'][group]}", f"recipe={result['recipe']}",
              f"pretrain_steps={settings.pretrain_steps}", f"questions_in_batches={int(settings.questions_in_batches)}",
              f"finetune_epochs={settings.finetune_epochs:g}", f"valid={int(validity['valid'])}",
              f"valid_system={validity['valid_system']}", "seed_level_interval=1"]  # fmt: skip
    fields += [
        f"{key}={validity[key]}" for key in ("best_entity_em", "floor_entity", "best_literal_em", "floor_literal")
    ]
    fields += [f"{key}={value}" for key, value in result["gaps"].items()]
    fields += [f"memory_hidden_drop={result['memory_hidden_drop']}"]
    for name, system in scores.items():
        fields += [f"{name}_{key}={system['em'][key]}" for key in ("entity", "literal")]
    fields += [f"{name}={int(holds)}" for name, holds in result["orderings"].items()]
    for name, other in result.get("other_recipes", {}).items():
        fields += [f"{key}[{name}]={value}" for key, value in other["gaps"].items()]
    return fields


def recipe_result(settings: Settings, runs: list[dict]) -> dict:
    """One recipe's figures: validity, orderings, gaps, the memory's share, the summary and every seed's run."""
    summary = summarise(runs, settings.bootstrap_samples)
    scores = summary[reported_group(summary)]
    return {
        "recipe": runs[0]["recipe"],
        "validity": validity(summary, settings),
        "orderings": orderings(summary),
        "gaps": gaps(summary),
        "memory_hidden_drop": round(
            scores["edmem_free"]["em"]["entity"] - scores["edmem_free_every_row_hidden_at_test"]["em"]["entity"], 2
        ),
        "summary": summary,
        "runs": [{key: value for key, value in run.items() if key != "hits"} for run in runs],
    }


def write_results(settings: Settings, runs: dict[str, list[dict]], ablation: list[dict], out: Path, plots: bool,
                  curve: list[dict] | None = None) -> dict:  # fmt: skip
    """results.json (every figure of every seed, without the per-question hits) and the plots: the first recipe's
    figures at the top level, each other recipe's under `other_recipes`."""
    done = {name: recipe_runs for name, recipe_runs in runs.items() if recipe_runs}
    reported = next(iter(done))
    result = {"settings": asdict(settings), **recipe_result(settings, done[reported]), "recipe": reported,
              "recipe_settings": asdict(RECIPES[reported])}  # fmt: skip
    result["other_recipes"] = {name: recipe_result(settings, recipe_runs) for name, recipe_runs in done.items()
                               if name != reported}  # fmt: skip
    if ablation:
        result["single_biography"] = {
            "summary": summarise(ablation, settings.bootstrap_samples),
            "runs": [{key: value for key, value in run.items() if key != "hits"} for run in ablation],
        }
    if curve:
        full = done[reported][0]
        result["curve"] = [*curve, {"steps": settings.pretrain_steps, **{
            variant: {"memorisation_validation": full["memorisation"][variant]["validation"]["all"],
                      "em_validation": full["em"]["validation"]["edmem_free" if variant == "edmem" else "encdec"]}
            for variant in ("edmem", "encdec")}}]  # fmt: skip
    (out / "results.json").write_text(json.dumps(result, indent=1))
    if plots:
        result["plots"] = [str(p) for p in plot(result["summary"], out, result.get("curve"))]
        if result["other_recipes"]:
            result["plots"].append(str(plot_recipes(result, out)))
    return result


def plot_recipes(result: dict, out: Path) -> Path:
    """EM of EDMem (free decoding) and EncDec under each recipe, entity and literal answers, in the reported group,
    with the seed-level intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recipes = {result["recipe"]: result, **result["other_recipes"]}
    group = result["validity"]["group"]
    bars = [
        (f"{system} {kind}", system, kind) for system in ("edmem_free", "encdec") for kind in ("entity", "literal")
    ]
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(recipes)
    for i, (name, recipe) in enumerate(recipes.items()):
        scores = recipe["summary"][group]
        means = [scores[system]["em"][kind] for _, system, kind in bars]
        errors = [[m - scores[system]["interval"][kind][0] for (_, system, kind), m in zip(bars, means)],
                  [scores[system]["interval"][kind][1] - m for (_, system, kind), m in zip(bars, means)]]  # fmt: skip
        ax.bar([x + i * width for x in range(len(bars))], means, width, yerr=errors, label=name, capsize=3)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(bars))], [label for label, _, _ in bars])
    ax.set_ylabel(f"exact match (%), {group} group, 95 % interval")
    ax.set_title("Recipes: EDMem (free decoding) and EncDec")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "em_by_recipe.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(main())

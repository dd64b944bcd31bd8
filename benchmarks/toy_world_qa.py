"""Knowledge the memory holds: EDMem against EncDec (no memory) and EncMem (encoder + memory) on closed-book QA
about people the models have only read about, with the paper's orderings (Tables 1-2, Figures 3-4) as the
questions asked, in the protocol of Allen-Zhu and Li, *Physics of Language Models, Part 3.1* (2023).

For each seed: a knowledge world (`edmem_hf.knowledge_world`: people with independent attributes, each in several
biographies of varied templates and sentence orders) is rendered as a MediaWiki dump; `edmem build-corpus` turns
it into passages; EDMem, EncDec and EncMem are pre-trained from scratch by `edmem pretrain` with the same steps,
widths and seed. Every person is in pre-training. The people are then cut in two halves: question answering is
fine-tuned on the questions about the first half (all six forms; `examples/finetune_qa.py`, the stock
Seq2SeqTrainer; EncMem with the authors' linking recipe) and tested on the questions about the second, whose facts
the models have read only in pre-training. Exact match (`edmem evaluate`'s code) on both halves, overall, on entity
answers and on literal answers, beside the majority answer of each question form, with 95 % bootstrap intervals.

Also measured: memorisation (each pre-trained model filling a masked fact in a person's first biography); the
memory's share (the fine-tuned EDMem and EncMem tested with every memory row hidden, or only the test subjects'
rows, at test time only; and EDMem fine-tuned and tested with the memory hidden, the authors' entity mask);
parameter counts with and without the entity table; the single-biography ablation (one biography per person, one
template per attribute, one sentence order) beside the varied world.

    python benchmarks/toy_world_qa.py --quick --out runs/toy-qa-quick    # one seed, the bar of a valid run
    python benchmarks/toy_world_qa.py --out runs/toy-qa                  # 3 seeds; results.json and PNG plots

A rerun with the same `--out` reuses what is done (corpus, pre-training, fine-tuning, predictions).
Ends with one line `RESULT key=value ...` (means over seeds).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import statistics
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import AutoTokenizer, Trainer, TrainingArguments  # noqa: E402

from edmem_hf import EDMemForConditionalGeneration, EDMemForEntityLinking  # noqa: E402
from edmem_hf.configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN, EDMemConfig  # noqa: E402
from edmem_hf.corpus import build_corpus  # noqa: E402
from edmem_hf.knowledge_world import (  # noqa: E402
    PERSON_ATTRIBUTES,
    KnowledgeWorldSettings,
    generate_knowledge_world,
    split_people,
)
from edmem_hf.pretraining import PretrainingArguments, pretrain  # noqa: E402
from edmem_hf.task_features import in_running_text  # noqa: E402
from edmem_hf.tasks import IGNORE_INDEX, EDMemSeq2SeqCollator, exact_match, read_jsonl, read_qa  # noqa: E402
from edmem_hf.toy_world import QAPair, ToyWorld, write_mediawiki_dump  # noqa: E402

logger = logging.getLogger("toy_world_qa")
MODES = ("free", "static", "dynamic")
ENTITY_RELATIONS = tuple(relation for relation, _, is_entity in PERSON_ATTRIBUTES if is_entity)


@dataclass
class Settings:
    num_people: int = 334  # 167 test-half people: 1,002 test questions a seed
    biographies: int = 5
    seeds: tuple[int, ...] = (0, 1, 2)
    d_model: int = 64
    layers: int = 1  # lower and upper layers on each side (each)
    entity_embed_dim: int = 64
    pretrain_steps: int = 25000  # about 95 readings of each biography, as in --quick
    pretrain_batch_size: int = 8
    pretrain_learning_rate: float = 3e-3
    mix_qa: bool = True  # the fine-tuning half's questions and answers also in pre-training (every system)
    finetune_epochs: float = 60.0
    finetune_learning_rate: float = 1e-3
    finetune_batch_size: int = 32
    encmem: bool = True
    encdec_matched: bool = True  # also an EncDec of EDMem's parameter count (its feed-forward layers widened)
    memory_hidden_in_finetuning: bool = True  # EDMem fine-tuned and tested with no memory row visible
    single_biography_ablation: bool = True  # on the first seed, EDMem and EncDec
    bootstrap_samples: int = 1000
    valid_entity_em: float = 50.0  # the bar of a valid experiment (issue 27, item 4)
    valid_entity_margin: float = 30.0
    valid_literal_margin: float | None = 10.0  # None: not required


# One seed of a 40-person world (20 fine-tuning people: at 10, EncDec's fine-tuning does not learn the task), as many
# readings of each biography as the full run: about 12 minutes on 2 free cores, 20 beside three other jobs.
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


def with_questions_in_pages(world: ToyWorld, pairs: list[QAPair]) -> ToyWorld:
    """`world` with each person's questions and answers (`pairs`) as a section of their page: the study's mixed
    training, where the fine-tuning half's questions are pre-trained on too."""
    pages = dict(world.pages)
    for pair in pairs:
        answer = f"[[{pair.answer}]]" if pair.answer_is_entity else pair.answer
        section = "\n\n== Questions ==\n" if "== Questions ==" not in pages[pair.subject] else "\n"
        pages[pair.subject] += f"{section}{pair.question} {answer}."
    return replace(world, pages=pages)


def make_world(settings: Settings, seed: int, out: Path, varied: bool = True) -> dict:
    """The world, its dump and corpus (with its tokenizer), and the question files of the two halves."""
    biographies = settings.biographies if varied else 1
    world = generate_knowledge_world(KnowledgeWorldSettings(settings.num_people, biographies, varied), seed=seed)
    splits = split_people(world, seed)
    read = with_questions_in_pages(world, splits["train"]) if settings.mix_qa else world
    out.mkdir(parents=True, exist_ok=True)
    dump = write_mediawiki_dump(read, out / "wiki.xml.bz2")
    corpus = out / "corpus"
    if not (corpus / "entity_vocab.json").exists():
        build_corpus(dump, corpus, num_entities=100_000, num_proc=2, vocab_size=3000, seed=seed)
    files = {}
    for split, pairs in splits.items():
        files[split], files[f"{split}_links"] = write_released_format(pairs, split, out)
    return {"world": world, "corpus": corpus, "files": files, "splits": splits}


# --- training ---------------------------------------------------------------------------------------------------


def pretrain_variant(variant: str, corpus: Path, out: Path, settings: Settings, seed: int,
                     ffn_dim: int | None = None) -> Path:  # fmt: skip
    d = settings.d_model
    pretrain(
        PretrainingArguments(
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
            dropout=0.1,
            **pretraining_schedule(settings, settings.pretrain_steps, seed),
        )
    )
    return out


def matched_ffn_dim(edmem: Path, encdec: Path, settings: Settings) -> int:
    """The feed-forward width that gives an EncDec of `encdec`'s other sizes EDMem's parameter count (with its
    entity table): each unit of width adds `2 d + 1` parameters to each of the `4 * layers` layers."""
    missing = parameter_counts(edmem)["with_table"] - parameter_counts(encdec)["with_table"]
    per_unit = 4 * settings.layers * (2 * settings.d_model + 1)
    return 4 * settings.d_model + max(0, round(missing / per_unit))


def pretraining_schedule(settings: Settings, steps: int, seed: int) -> dict:
    """The `PretrainingArguments` of the training loop: batch, learning rate, `steps`, a save every 500 steps
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
                   entity_mask_file: Path | None = None) -> Path:  # fmt: skip
    """`examples/finetune_qa.py` on the training questions (skipped when `out` has a model: a rerun goes on)."""
    from finetune_common import run
    from finetune_qa import QA

    if not (out / "model.safetensors").exists():
        mask = ["--entity_mask_file", str(entity_mask_file)] if entity_mask_file else []
        argv = ["--model_name_or_path", str(model_dir), "--output_dir", str(out), "--do_train"]
        run(QA, argv + ["--train_file", str(train_file)] + _finetune_argv(settings, seed) + mask)
    return out


def predict(model_dir: Path, test_file: Path, out: Path, mode: str, settings: Settings, seed: int,
            entity_mask_file: Path | None = None) -> Path:  # fmt: skip
    """`examples/finetune_qa.py --do_predict` in one decoding mode; returns the predictions file (reused)."""
    from finetune_common import run
    from finetune_qa import QA

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


@torch.no_grad()
def memorisation(model_dir: Path, world: ToyWorld, people: dict[str, list[str]]) -> dict:
    """How often the pre-trained model fills a masked fact of a person's first biography (read in pre-training):
    every token of the value masked, the value's tokens predicted (teacher-forced decoder for the seq2seq models,
    the masked-LM head for EncMem), a hit when all are right. By half (`people`: half -> names) and relation.
    For a model with a memory, also how often the memory's top entity at a masked entity value is that value.
    For the seq2seq models, also `decoder_alone`: the same facts filled with every encoder input token masked, what
    the decoder holds keyed on its own prefix, which a question (whose subject only the encoder reads) cannot use."""
    config = EDMemConfig.from_pretrained(model_dir)
    encoder_only = config.variant == "encmem"
    model = (EDMemForEntityLinking if encoder_only else EDMemForConditionalGeneration).from_pretrained(model_dir)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    has_memory = config.variant != "encdec"
    result = {}
    for half, names in people.items():
        hits: dict[str, list[bool]] = {}
        decoder_alone: list[bool] = []
        linked: list[bool] = []
        for person in names:
            text = marked_biography(world, person)
            encoded = tokenizer(text, return_offsets_mapping=True, return_tensors="pt")
            ids, offsets = encoded.input_ids[0], encoded.offset_mapping[0].tolist()
            labels = {} if encoder_only else {"labels": ids[None]}  # the decoder teacher-forced
            if not encoder_only:  # one pass a biography: the blank input is the same whichever fact is asked
                blank = torch.full_like(ids, tokenizer.mask_token_id)
                blank[[0, -1]] = ids[[0, -1]]  # <s> and </s> kept: the encoder reads nothing else
                alone = model(input_ids=blank[None], **labels).logits[0].argmax(-1)
            for relation, _, is_entity in PERSON_ATTRIBUTES:
                value = world.entity(person).attributes[relation]
                match = re.search(rf"(?<![\w-]){re.escape(value)}(?![\w-])", text, flags=re.IGNORECASE)
                if match is None:
                    raise RuntimeError(f"{person!r}'s first biography does not state {relation} = {value!r}")
                inside = [i for i, (s, e) in enumerate(offsets) if e > s and s < match.end() and e > match.start()]
                masked = ids.clone()
                masked[inside] = tokenizer.mask_token_id
                output = model(input_ids=masked[None], output_attended_entities=is_entity and has_memory, **labels)
                predicted = output.logits[0].argmax(-1)
                hits.setdefault(relation, []).append(bool((predicted[inside] == ids[inside]).all()))
                if not encoder_only:
                    decoder_alone.append(bool((alone[inside] == ids[inside]).all()))
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
        if linked:
            result[half]["memory_names_the_masked_entity"] = round(100 * sum(linked) / len(linked), 2)
    return result


@torch.no_grad()
def memory_hits(model_dir: Path, data_file: Path) -> list[bool]:
    """For each question (file order): is the memory's top entity at the marked subject the subject?"""
    model = EDMemForConditionalGeneration.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    subjects = {record["id"]: record["link_target"][0] for record in read_jsonl(data_file)}
    rows = read_qa(data_file, model.entity_vocab)
    hits = {}
    for begin in range(0, len(rows), 64):
        chunk = rows[begin : begin + 64]
        batch = tokenizer([in_running_text(q) for q in chunk["question"]], padding=True, return_tensors="pt")
        access = model.get_encoder()(**batch, output_attended_entities=True).memory_access
        for (row, _), top in zip(access.positions.tolist(), access.top_entity_ids[:, 0].tolist()):
            question = chunk["id"][row]
            hits[question] = model.entity_vocab.name_of(top) == subjects[question]
    return [hits.get(question, False) for question in subjects]


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
    """95 % intervals of the mean over seeds of each EM, the questions of each seed resampled with replacement."""
    rng = random.Random(seed)
    draws: dict[str, list[float]] = {"all": [], "entity": [], "literal": []}
    for _ in range(samples):
        means = {name: [] for name in draws}
        for hits in per_seed:
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


def run_condition(settings: Settings, seed: int, out: Path, varied: bool = True, ablation: bool = False) -> dict:
    """One seed's world, models and predictions; `ablation` trains EDMem and EncDec only, tested plainly."""
    started = time.perf_counter()
    data = make_world(settings, seed, out, varied)
    files, world, splits = data["files"], data["world"], data["splits"]
    variants = ("edmem", "encdec") if ablation or not settings.encmem else ("edmem", "encdec", "encmem")
    models = {}
    for variant in variants:
        t0 = time.perf_counter()
        models[variant] = pretrain_variant(variant, data["corpus"], out / f"pretrain-{variant}", settings, seed)
        logger.info("seed %d: pre-trained %s in %.0f s", seed, variant, time.perf_counter() - t0)
    if settings.encdec_matched and not ablation:
        ffn_dim = matched_ffn_dim(models["edmem"], models["encdec"], settings)
        models["encdec_matched"] = pretrain_variant("encdec", data["corpus"], out / "pretrain-encdec-matched",
                                                    settings, seed, ffn_dim)  # fmt: skip
    halves = {half: sorted({pair.subject for pair in pairs}) for half, pairs in splits.items()}
    memorised = {variant: memorisation(path, world, halves) for variant, path in models.items()}
    predictions: dict[str, dict[str, Path]] = {"train": {}, "test": {}}  # half -> system -> predictions file
    vocab = EDMemForConditionalGeneration.from_pretrained(models["edmem"]).entity_vocab
    size = len(vocab)
    every_row = save_entity_mask(hidden_rows(size, None, vocab), out / "mask-every-row.pt")
    subject_rows = save_entity_mask(hidden_rows(size, halves["test"], vocab), out / "mask-test-subjects.pt")
    edmem = finetune_model(models["edmem"], files["train"], out / "finetune-edmem", settings, seed)
    for mode in ("free",) if ablation else MODES:
        predictions["test"][f"edmem_{mode}"] = predict(edmem, files["test"], out / "finetune-edmem" / mode, mode,
                                                       settings, seed)  # fmt: skip
    predictions["train"]["edmem_free"] = predict(edmem, files["train"], edmem / "train-free", "free", settings, seed)
    if not ablation:
        for mode in ("free", "static"):
            for name, mask in (("every_row", every_row), ("subject_rows", subject_rows)):
                predictions["test"][f"edmem_{mode}_{name}_hidden_at_test"] = predict(
                    edmem, files["test"], edmem / f"{mode}-{name}-hidden", mode, settings, seed, mask
                )
    encdec = finetune_model(models["encdec"], files["train"], out / "finetune-encdec", settings, seed)
    predictions["test"]["encdec"] = predict(encdec, files["test"], encdec / "free", "free", settings, seed)
    predictions["train"]["encdec"] = predict(encdec, files["train"], encdec / "train-free", "free", settings, seed)
    if "encdec_matched" in models:
        matched = finetune_model(models["encdec_matched"], files["train"], out / "finetune-encdec-matched", settings,
                                 seed)  # fmt: skip
        predictions["test"]["encdec_matched"] = predict(matched, files["test"], matched / "free", "free", settings,
                                                        seed)  # fmt: skip
        predictions["train"]["encdec_matched"] = predict(matched, files["train"], matched / "train-free", "free",
                                                         settings, seed)  # fmt: skip
    if "encmem" in models:
        encmem = finetune_encmem(models["encmem"], files["train"], out / "finetune-encmem", settings, seed)
        predictions["test"]["encmem"] = predict_encmem(encmem, files["test"], encmem / "test_predictions.json")
        predictions["train"]["encmem"] = predict_encmem(encmem, files["train"], encmem / "train_predictions.json")
        predictions["test"]["encmem_subject_rows_hidden_at_test"] = predict_encmem(
            encmem, files["test"], encmem / "test_subject_rows_hidden.json", torch.load(subject_rows)
        )
    if settings.memory_hidden_in_finetuning and not ablation:
        hidden = out / "finetune-edmem-memory-hidden"
        finetune_model(models["edmem"], files["train"], hidden, settings, seed, every_row)
        for mode in ("free", "static"):
            predictions["test"][f"edmem_{mode}_hidden_in_finetuning"] = predict(
                hidden, files["test"], hidden / mode, mode, settings, seed, every_row
            )
    for half in ("train", "test"):
        predictions[half]["majority_answer"] = majority_answers(files["train"], files[half],
                                                                out / f"majority_predictions_{half}.json")  # fmt: skip
    recall = {half: memory_hits(edmem, files[half]) for half in ("train", "test")}
    hits = {half: {system: question_hits(files[half], files[f"{half}_links"], path)
                   for system, path in systems.items()} for half, systems in predictions.items()}  # fmt: skip
    return {
        "seed": seed,
        "varied": varied,
        "questions": {half: len(pairs) for half, pairs in splits.items()},
        "entities": size,
        "parameters": {variant: parameter_counts(path) for variant, path in models.items()},
        "memorisation": memorised,
        "edmem_memory_recall_at_subject": {half: round(100 * sum(h) / len(h), 2) for half, h in recall.items()},
        "hits": hits,
        "em": {half: {system: em(h) for system, h in systems.items()} for half, systems in hits.items()},
        # this call's time: what a rerun with the same --out reuses (pre-training, fine-tuning) costs nothing here
        "seconds_this_call": round(time.perf_counter() - started),
    }


def pretraining_curve(settings: Settings, seed: int, out: Path, budgets: list[int]) -> list[dict]:
    """EM against pre-training steps: EDMem and EncDec pre-trained from scratch for each budget on the world of
    `seed` (its corpus, in `out / f"seed-{seed}"`), fine-tuned and tested as in the run; memorisation of the test half
    and test-half EM (free decoding) a budget."""
    data = make_world(settings, seed, out / f"seed-{seed}")
    halves = {half: sorted({pair.subject for pair in pairs}) for half, pairs in data["splits"].items()}
    points = []
    for steps in budgets:
        budget = replace(settings, pretrain_steps=steps)
        where = out / f"curve-seed-{seed}" / f"steps-{steps}"
        point: dict = {"steps": steps}
        for variant in ("edmem", "encdec"):
            pretrained = pretrain_variant(variant, data["corpus"], where / f"pretrain-{variant}", budget, seed)
            finetuned = finetune_model(pretrained, data["files"]["train"], where / f"finetune-{variant}", budget, seed)
            predictions = predict(finetuned, data["files"]["test"], finetuned / "free", "free", budget, seed)
            memorised = memorisation(pretrained, data["world"], {"test": halves["test"]})["test"]["all"]
            point[variant] = {
                "memorisation_test_half": memorised,
                "em_test_half": em(question_hits(data["files"]["test"], data["files"]["test_links"], predictions)),
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


def validity(summary: dict, settings: Settings) -> dict:
    """Issue 27, item 4: a system answers entity questions about test-half people at `valid_entity_em` or more and
    `valid_entity_margin` points over the floor (and literal ones `valid_literal_margin` over theirs)."""
    test = summary["test"]
    systems = {name: s["em"] for name, s in test.items() if name != "majority_answer" and "hidden" not in name}
    floor = test["majority_answer"]["em"]
    best_entity = max(systems, key=lambda name: systems[name]["entity"])
    best_literal = max(systems, key=lambda name: systems[name]["literal"] if name != "encmem" else -1)
    entity_ok = systems[best_entity]["entity"] >= max(settings.valid_entity_em,
                                                      floor["entity"] + settings.valid_entity_margin)  # fmt: skip
    literal_ok = settings.valid_literal_margin is None or (
        systems[best_literal]["literal"] >= floor["literal"] + settings.valid_literal_margin
    )
    return {"valid": entity_ok and literal_ok, "best_entity_system": best_entity,
            "best_entity_em_test_half": systems[best_entity]["entity"], "floor_entity": floor["entity"],
            "best_literal_system": best_literal, "best_literal_em_test_half": systems[best_literal]["literal"],
            "floor_literal": floor["literal"], "entity_bar_met": entity_ok, "literal_bar_met": literal_ok}  # fmt: skip


def orderings(summary: dict) -> dict[str, bool]:
    """The paper's orderings, on the means of the test half."""
    test = {name: s["em"] for name, s in summary["test"].items()}
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
    test = summary["test"]
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
    ax.set_ylabel("exact match (%), 95 % bootstrap interval")
    ax.set_title("Questions about people seen only in pre-training (test half)")
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
                ax.plot(steps, [p[variant]["em_test_half"][key] for p in curve], style, label=f"{label}, {what}")
            ax.plot(steps, [p[variant]["memorisation_test_half"] for p in curve], "--x", label=f"{label}, memorised")
        ax.set_xlabel("pre-training steps")
        ax.set_ylabel("% (test half)")
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
    parser.add_argument("--d-model", type=int, help="override the width")
    parser.add_argument("--layers", type=int, help="override the lower and upper layers of each side")
    parser.add_argument("--mix-qa", action=argparse.BooleanOptionalAction,
                        help="the fine-tuning half's questions in pre-training too (default: on)")  # fmt: skip
    parser.add_argument("--no-plots", action="store_true")
    return parser


def qa_parser() -> argparse.ArgumentParser:
    parser = experiment_parser(__doc__.split("\n")[0], "runs/toy-world-qa")
    parser.add_argument("--curve", type=int, nargs="+", metavar="STEPS",
                        help="also EDMem and EncDec pre-trained for each of these step budgets on the first seed's "
                             "world (EM against pre-training steps)")  # fmt: skip
    parser.add_argument("--encdec-matched", action=argparse.BooleanOptionalAction,
                        help="also an EncDec of EDMem's parameter count (default: on, off in --quick)")  # fmt: skip
    parser.add_argument("--encmem", action=argparse.BooleanOptionalAction,
                        help="also EncMem (default: on, off in --quick)")  # fmt: skip
    parser.add_argument("--single-biography-ablation", action=argparse.BooleanOptionalAction,
                        help="also the single-biography world on the first seed (default: on, off in --quick)")  # fmt: skip
    return parser


def with_overrides(settings: Settings, args: argparse.Namespace) -> Settings:
    """`settings` with the shared options given on the command line."""
    overrides = dict(seeds=tuple(args.seeds) if args.seeds else None, num_people=args.num_people,
                     pretrain_steps=args.pretrain_steps, finetune_epochs=args.finetune_epochs, d_model=args.d_model,
                     finetune_learning_rate=args.finetune_learning_rate, finetune_batch_size=args.finetune_batch_size,
                     pretrain_batch_size=args.pretrain_batch_size, pretrain_learning_rate=args.pretrain_learning_rate,
                     layers=args.layers, mix_qa=args.mix_qa)  # fmt: skip
    return replace(settings, **{k: v for k, v in overrides.items() if v is not None})


def qa_settings(args: argparse.Namespace) -> Settings:
    """The run's settings: `--quick`'s or the full run's, with the command line's overrides and switches."""
    settings = with_overrides(QUICK if args.quick else Settings(), args)
    for switch in ("encdec_matched", "encmem", "single_biography_ablation"):
        if getattr(args, switch) is not None:
            settings = replace(settings, **{switch: getattr(args, switch)})
    return settings


def quiet_logging() -> None:
    """Progress lines from the experiment; warnings only from the libraries."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for name in ("transformers", "datasets", "edmem_hf", "accelerate"):
        logging.getLogger(name).setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    args = qa_parser().parse_args(argv)
    quiet_logging()
    settings = qa_settings(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for seed in settings.seeds:
        runs.append(run_condition(settings, seed, out / f"seed-{seed}"))
        write_results(settings, runs, [], out, plots=False)  # each seed's figures as soon as they exist
    ablation = []
    if settings.single_biography_ablation:
        ablation.append(run_condition(settings, settings.seeds[0], out / f"single-seed-{settings.seeds[0]}",
                                      varied=False, ablation=True))  # fmt: skip
    curve = pretraining_curve(settings, settings.seeds[0], out, args.curve) if args.curve else []
    result = write_results(settings, runs, ablation, out, plots=not args.no_plots, curve=curve)
    print(json.dumps({key: result[key] for key in ("validity", "orderings", "memory_hidden_drop")}, indent=1))
    test = result["summary"]["test"]
    fields = [f"seeds={len(runs)}", f"people={settings.num_people}", f"test_questions={runs[0]['questions']['test']}"]
    fields += [f"valid={int(result['validity']['valid'])}"]
    fields += [f"{key}={result['validity'][key]}" for key in
               ("best_entity_em_test_half", "floor_entity", "best_literal_em_test_half", "floor_literal")]  # fmt: skip
    fields += [f"edmem_free_entity={test['edmem_free']['em']['entity']}",
               f"encdec_entity={test['encdec']['em']['entity']}",
               f"memory_hidden_drop={result['memory_hidden_drop']}"]  # fmt: skip
    for name, scores in test.items():
        fields += [f"{name}_{key}={scores['em'][key]}" for key in ("entity", "literal")]
    fields += [f"{name}={int(holds)}" for name, holds in result["orderings"].items()]
    print("RESULT " + " ".join(fields))
    return 0


def write_results(settings: Settings, runs: list[dict], ablation: list[dict], out: Path, plots: bool,
                  curve: list[dict] | None = None) -> dict:  # fmt: skip
    """results.json (every figure of every seed, without the per-question hits) and the plots."""
    summary = summarise(runs, settings.bootstrap_samples)
    test = summary["test"]
    result = {
        "settings": asdict(settings),
        "validity": validity(summary, settings),
        "orderings": orderings(summary),
        "memory_hidden_drop": round(
            test["edmem_free"]["em"]["entity"] - test["edmem_free_every_row_hidden_at_test"]["em"]["entity"], 2
        ),
        "summary": summary,
        "runs": [{key: value for key, value in run.items() if key != "hits"} for run in runs],
    }
    if ablation:
        result["single_biography"] = {
            "summary": summarise(ablation, settings.bootstrap_samples),
            "runs": [{key: value for key, value in run.items() if key != "hits"} for run in ablation],
        }
    if curve:
        full = runs[0]
        result["curve"] = [*curve, {"steps": settings.pretrain_steps, **{
            variant: {"memorisation_test_half": full["memorisation"][variant]["test"]["all"],
                      "em_test_half": full["em"]["test"]["edmem_free" if variant == "edmem" else "encdec"]}
            for variant in ("edmem", "encdec")}}]  # fmt: skip
    (out / "results.json").write_text(json.dumps(result, indent=1))
    if plots:
        result["plots"] = [str(p) for p in plot(summary, out, result.get("curve"))]
    return result


if __name__ == "__main__":
    sys.exit(main())

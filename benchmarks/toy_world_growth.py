"""Memory growth: entities written into a trained EDMem without training, against the same entities unknown, the
entities it was trained with, and continued pre-training (issue 18; docs/evidence.md).

For each seed, a toy world (`edmem_hf.toy_world`) loses some of its people (`without_entities`: their pages, every
mention of them and every question about them). EDMem is pre-trained on that smaller world (`edmem build-corpus`,
`edmem pretrain`, the settings of `toy_world_qa.py`) and fine-tuned on its questions (`examples/finetune_qa.py`).
Then the full world's dump arrives, the new pages among them, and the people are added as `edmem add-entities` adds
them (`new_entity_passages`, `model.add_entities`: no gradient step). Scored by `edmem evaluate`'s code:

- *new*: the questions about the added people ("Where was X born?", "When was X born?", "What was X's
  occupation?"), before adding, after adding with each row estimator, and after continued pre-training (the
  ceiling: the grown pre-trained model trained on the full world's corpus, then fine-tuned as before);
- *seen*: the held-out test questions of the same three forms about people the model was trained with.

Besides exact match in the free, static and dynamic settings, *memory recall* is how often the memory's top entity
at the question's marked subject is that subject: whether the memory finds the new row at all. It is also given,
pooled over the seeds, for the seen questions whose subject no fine-tuning question names. And as a check of what
the estimator reads: how often a trained person's mean memory query over their own passages finds their own row.

Row estimators compared: the mean memory query at the entity's mentions scaled to the trained rows' mean norm
(what `add_entities` does), the same mean unscaled, and two controls of that norm: a random row (no information),
and the mean query at the name put in the three question forms (the row the questions find, with no facts in it).
The time to add 1,000 and 100,000 entities is measured on the fine-tuned toy model and, for 1,000, on the
`edmem-base` preset's shape (random weights, 1M-row table).

    python benchmarks/toy_world_growth.py --quick --out runs/growth-quick    # one small world, < 10 min
    python benchmarks/toy_world_growth.py --out runs/growth                  # 3 seeds; results.json, a PNG plot

A rerun with the same `--out` reuses what is done. Ends with one line `RESULT key=value ...` (means over seeds).
"""

from __future__ import annotations

import json
import logging
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from toy_world_qa import (  # noqa: E402
    MODES,
    Settings,
    experiment_parser,
    finetune_model,
    predict,
    pretrain_variant,
    pretraining_schedule,
    quiet_logging,
    split_questions,
    stats,
    with_overrides,
    write_released_format,
)
from transformers import AutoTokenizer  # noqa: E402

from edmem_hf import EDMemForConditionalGeneration, EntityVocab  # noqa: E402
from edmem_hf.corpus import build_corpus  # noqa: E402
from edmem_hf.dump import iter_parsed_pages  # noqa: E402
from edmem_hf.entity_growth import new_entity_passages  # noqa: E402
from edmem_hf.evaluation import evaluate_files  # noqa: E402
from edmem_hf.pretraining import PretrainingArguments, build_config, load_corpus, pretrain  # noqa: E402
from edmem_hf.tasks import read_jsonl, read_qa  # noqa: E402
from edmem_hf.toy_world import generate_toy_world, without_entities, write_mediawiki_dump  # noqa: E402

logger = logging.getLogger("toy_world_growth")
PERSON_QUESTIONS = ("born_in", "born_year", "occupation")
ESTIMATORS = ("mean_query_scaled", "mean_query", "random", "question_query")


@dataclass
class GrowthSettings:
    qa: Settings = field(default_factory=Settings)
    held_out_fraction: float = 0.3  # of the people who founded no company (a founder is named on other pages)
    continued_steps: int = 200  # continued pre-training on the full world, for the ceiling
    timed_additions: tuple[int, ...] = (1_000, 100_000)
    time_the_base_shape: bool = True


QUICK = GrowthSettings(
    qa=Settings(num_entities=120, seeds=(0,), pretrain_steps=500), continued_steps=150, time_the_base_shape=False
)


# --- data -------------------------------------------------------------------------------------------------------


def held_out_people(world, fraction: float, seed: int) -> list[str]:
    """A random `fraction` (at least 2) of the people who founded no company."""
    founders = {entity.attributes["founder"] for entity in world.entities if entity.type == "company"}
    people = sorted(e.name for e in world.entities if e.type == "person" and e.name not in founders)
    return sorted(random.Random(seed).sample(people, max(2, round(fraction * len(people)))))


def make_worlds(settings: GrowthSettings, seed: int, out: Path) -> dict:
    """The old world's dump, corpus and questions; the full world's dump (the new pages in it); the held-out names."""
    world = generate_toy_world(settings.qa.num_entities, seed=seed)
    held = held_out_people(world, settings.held_out_fraction, seed)
    old = without_entities(world, held)
    out.mkdir(parents=True, exist_ok=True)
    old_dump = write_mediawiki_dump(old, out / "old-wiki.xml.bz2")
    new_dump = write_mediawiki_dump(world, out / "new-wiki.xml.bz2")
    corpus = out / "corpus"
    if not (corpus / "entity_vocab.json").exists():
        build_corpus(old_dump, corpus, num_entities=100_000, num_proc=2, vocab_size=3000, seed=seed)
    splits = split_questions(old.qa_pairs, settings.qa.test_fraction, seed)
    splits["seen"] = [pair for pair in splits.pop("test") if pair.relation in PERSON_QUESTIONS]
    splits["new"] = [pair for pair in world.qa_pairs if pair.subject in held]
    files = {}
    for split, pairs in splits.items():
        files[split], files[f"{split}_links"] = write_released_format(pairs, split, out)
    trained_people = sorted(e.name for e in old.entities if e.type == "person")
    forms = {}  # one training question of each person form, its subject marked: "Where was <E_s> {} <E_e> born?"
    for pair in splits["train"]:
        if pair.relation in PERSON_QUESTIONS:
            forms.setdefault(pair.relation, pair.question.replace(pair.subject, "<E_s> {} <E_e>"))
    return {"held": held, "corpus": corpus, "old_dump": old_dump, "new_dump": new_dump, "files": files,
            "trained_people": trained_people, "question_forms": sorted(forms.values())}  # fmt: skip


# --- growing ----------------------------------------------------------------------------------------------------


def grow(model_dir: Path, new_dump: str, estimator: str, out: Path, expected: list[str], seed: int,
         question_forms: Sequence[str] = ()) -> Path:  # fmt: skip
    """The model at `model_dir` with the new pages' entities added (rows by `estimator`), saved to `out`.

    `question_query` is a control: the scaled mean query at the name put in `question_forms`, the row that
    questions about the entity find, made from no text about it."""
    if (out / "model.safetensors").exists():
        return out
    model = EDMemForConditionalGeneration.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    known = [name for name in model.entity_vocab.names if name is not None]
    passages, _ = new_entity_passages(iter_parsed_pages(new_dump), known)
    if sorted(passages) != expected:
        raise RuntimeError(f"the new pages' entities are {sorted(passages)}, expected the held-out {expected}")
    names = sorted(passages)
    texts = [passages[name] for name in names]
    if estimator == "mean_query_scaled":
        model.add_entities(names, texts, tokenizer)
    elif estimator == "mean_query":
        model.add_entities(names, rows=model.memory_queries(texts, tokenizer))
    elif estimator == "question_query":
        asked = [[form.format(name) for form in question_forms] for name in names]
        model.add_entities(names, rows=at_trained_norm(model, model.memory_queries(asked, tokenizer)))
    elif estimator == "random":
        rows = torch.randn(len(names), model.config.entity_embed_dim, generator=torch.Generator().manual_seed(seed))
        model.add_entities(names, rows=at_trained_norm(model, rows))
    else:
        raise ValueError(f"unknown estimator {estimator!r}")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def at_trained_norm(model: EDMemForConditionalGeneration, rows: torch.Tensor) -> torch.Tensor:
    """`rows` rescaled to the mean norm of the model's entity rows, as `add_entities` scales its own."""
    norm = model.get_encoder().entity_embeddings.weight.norm(dim=-1).mean()
    return rows / rows.norm(dim=-1, keepdim=True) * norm


def corpus_in_model_ids(corpus: Path, vocab: EntityVocab):
    """The passages of an `edmem build-corpus` folder with their entity labels turned from the corpus vocabulary's
    ids into `vocab`'s (by name; an entity `vocab` lacks is unlabelled)."""
    datasets, corpus_vocab, _ = load_corpus(str(corpus))
    ids = [vocab.id_of(name) if name in vocab else -100 for name in corpus_vocab.names]
    return datasets.map(lambda row: {"entity_labels": [ids[i] if i >= 0 else i for i in row["entity_labels"]]})


def continue_pretraining(pretrained: Path, new_dump: str, out: Path, settings: GrowthSettings, seed: int,
                         held: list[str]) -> Path:  # fmt: skip
    """The ceiling's model: the pre-trained model grown with the new entities, then pre-trained for
    `continued_steps` on the full world's corpus (its entity labels mapped to the grown model's ids)."""
    if (out / "model.safetensors").exists():
        return out
    grown = grow(pretrained, new_dump, "mean_query_scaled", out.parent / "pretrain-grown", held, seed)
    model = EDMemForConditionalGeneration.from_pretrained(grown)
    tokenizer = AutoTokenizer.from_pretrained(grown)
    corpus = out.parent / "corpus-new"
    if not (corpus / "entity_vocab.json").exists():
        build_corpus(new_dump, corpus, tokenizer=grown, num_entities=100_000, num_proc=2, seed=seed)
    datasets = corpus_in_model_ids(corpus, model.entity_vocab)
    args = PretrainingArguments(
        output_dir=str(out), **pretraining_schedule(settings.qa, settings.continued_steps, seed)
    )
    pretrain(args, model=model, tokenizer=tokenizer, datasets=datasets, entity_vocab=model.entity_vocab)
    return out


# --- measuring --------------------------------------------------------------------------------------------------


def score(files: dict, split: str, predictions: Path) -> dict[str, float]:
    scores = evaluate_files("qa", files[split], predictions, answer_links=files[f"{split}_links"])
    return {key: round(value, 2) for key, value in scores.items() if isinstance(value, float)}


def subjects_of(data_file: Path) -> dict[str, str]:
    return {record["id"]: record["link_target"][0] for record in read_jsonl(data_file)}


@torch.no_grad()
def memory_hits(model_dir: Path, data_file: Path) -> dict[str, bool]:
    """For each question id: is the memory's top entity at the marked subject the subject?"""
    model = EDMemForConditionalGeneration.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    subjects = subjects_of(data_file)
    rows = read_qa(data_file, model.entity_vocab)
    hits = {}
    for begin in range(0, len(rows), 64):
        chunk = rows[begin : begin + 64]
        batch = tokenizer(chunk["question"], padding=True, return_tensors="pt")
        access = model.get_encoder()(**batch, output_attended_entities=True).memory_access
        for (row, _), top in zip(access.positions.tolist(), access.top_entity_ids[:, 0].tolist()):
            question = chunk["id"][row]
            hits[question] = model.entity_vocab.name_of(top) == subjects[question]
    return hits


@torch.no_grad()
def passage_query_recall(model_dir: Path, dump: str, names: list[str]) -> float:
    """% of `names` (entities the model was trained with) whose mean memory query over their passages in `dump`
    finds their own row first: whether what `add_entities` reads points at the right row for an entity whose row was
    trained."""
    model = EDMemForConditionalGeneration.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    passages, _ = new_entity_passages(iter_parsed_pages(dump), known=())
    names = [name for name in names if name in passages and name in model.entity_vocab]
    queries = model.memory_queries([passages[name] for name in names], tokenizer)
    top = (queries @ model.get_encoder().entity_embeddings.weight.T).argmax(-1)
    own = torch.tensor([model.entity_vocab.id_of(name) for name in names])
    return round(100 * (top == own).float().mean().item(), 2)


def time_additions(model_dir: Path, sizes: tuple[int, ...]) -> dict[str, float]:
    """Seconds for `add_entities` of n new names, one passage each (a sentence from the world, the name swapped)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    seconds = {}
    for n in sizes:
        model = EDMemForConditionalGeneration.from_pretrained(model_dir)
        seconds[str(n)] = _timed_addition(model, tokenizer, n)
    return seconds


def time_base_shape(tokenizer_dir: Path, n: int) -> float:
    """Seconds to add `n` entities to a model of the `edmem-base` preset's shape (random weights, 1M-row table)."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    size = 1_000_010
    with tempfile.TemporaryDirectory() as scratch:
        config = build_config(PretrainingArguments(output_dir=scratch, preset="edmem-base"), tokenizer, size)
    model = EDMemForConditionalGeneration(config)
    model.entity_vocab = EntityVocab([f"Entity {i}" for i in range(size)], [[] for _ in range(size)], [0] * size)
    return _timed_addition(model, tokenizer, n)


def _timed_addition(model, tokenizer, n: int) -> float:
    names = [f"Newcomer {i}" for i in range(n)]
    passages = [
        [f"Notable people born in the city include <E_s> {name} <E_e>, a poet and engineer."] for name in names
    ]
    started = time.perf_counter()
    model.add_entities(names, passages, tokenizer, batch_size=256)
    return round(time.perf_counter() - started, 2)


def run_seed(settings: GrowthSettings, seed: int, out: Path) -> dict:
    started = time.perf_counter()
    data = make_worlds(settings, seed, out)
    files, held = data["files"], data["held"]
    pretrained = pretrain_variant("edmem", data["corpus"], out / "pretrain-edmem", settings.qa, seed)
    logger.info(
        "seed %d: pre-trained without %d people (%.0f s so far)", seed, len(held), time.perf_counter() - started
    )
    finetuned = finetune_model(pretrained, files["train"], out / "finetune", settings.qa, seed)
    logger.info("seed %d: fine-tuned (%.0f s so far)", seed, time.perf_counter() - started)
    models = {"before": finetuned}
    for estimator in ESTIMATORS:
        models[estimator] = grow(finetuned, data["new_dump"], estimator, out / f"grown-{estimator}", held, seed,
                                 data["question_forms"])  # fmt: skip
    continued = continue_pretraining(pretrained, data["new_dump"], out / "pretrain-continued", settings, seed, held)
    models["continued_pretraining"] = finetune_model(continued, files["train"], out / "finetune-continued",
                                                     settings.qa, seed)  # fmt: skip
    logger.info("seed %d: grown and pre-trained further (%.0f s so far)", seed, time.perf_counter() - started)
    results: dict[str, dict] = {}
    asked, seen_subjects = set(subjects_of(files["train"]).values()), subjects_of(files["seen"])
    not_asked: dict[str, dict] = {}
    for name, model_dir in models.items():
        splits = ("new", "seen") if name in ("before", "mean_query_scaled", "continued_pretraining") else ("new",)
        for split in splits:
            figures = {mode: score(files, split, predict(model_dir, files[split], model_dir / f"predict-{split}-{mode}",
                                                         mode, settings.qa, seed)) for mode in MODES}  # fmt: skip
            hits = memory_hits(model_dir, files[split])
            figures["memory_recall"] = round(100 * sum(hits.values()) / len(hits), 2)
            results.setdefault(split, {})[name] = figures
            if split == "seen":  # the trained people no fine-tuning question names: pooled over seeds, too few a seed
                unasked = [hits[q] for q, subject in seen_subjects.items() if subject not in asked]
                not_asked[name] = {"hits": sum(unasked), "questions": len(unasked)}
    results["trained_people_passage_query_recall"] = passage_query_recall(finetuned, data["old_dump"],
                                                                          data["trained_people"])  # fmt: skip
    sizes = {split: sum(1 for _ in open(files[split], encoding="utf-8")) for split in ("train", "seen", "new")}
    return {"seed": seed, "held_out": held, "questions": sizes, "results": results,
            "seen_not_asked_in_finetuning": not_asked, "seconds": round(time.perf_counter() - started)}  # fmt: skip


def summarise(runs: list[dict]) -> dict:
    """`stats` of every figure over the seeds; the memory recall of trained people no fine-tuning question names,
    pooled."""

    def walk(path: tuple[str, ...], node):
        if isinstance(node, dict):
            return {key: walk(path + (key,), value) for key, value in node.items()}
        values = []
        for run in runs:
            value = run["results"]
            for key in path:
                value = value[key]
            values.append(value)
        return stats(values)

    summary = walk((), runs[0]["results"])
    summary["seen_not_asked_in_finetuning"] = {}
    for name in runs[0]["seen_not_asked_in_finetuning"]:
        hits = sum(run["seen_not_asked_in_finetuning"][name]["hits"] for run in runs)
        questions = sum(run["seen_not_asked_in_finetuning"][name]["questions"] for run in runs)
        recall = round(100 * hits / questions, 2) if questions else None
        summary["seen_not_asked_in_finetuning"][name] = {"hits": hits, "questions": questions, "memory_recall": recall}
    return summary


def plot(summary: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [("new", "before", "new, before adding"), ("new", "random", "new, random rows"),
            ("new", "mean_query", "new, mean query"), ("new", "mean_query_scaled", "new, added (shipped)"),
            ("new", "question_query", "new, the questions' query (control)"),
            ("new", "continued_pretraining", "new, continued pre-training"),
            ("seen", "mean_query_scaled", "seen from the start, after adding")]  # fmt: skip
    fig, ax = plt.subplots(figsize=(10, 4))
    groups = [(mode, "exact_match") for mode in MODES] + [("memory_recall", None)]
    width = 0.8 / len(bars)
    for i, (split, name, label) in enumerate(bars):
        figures = summary[split][name]
        means = [figures[m][k]["mean"] if k else figures[m]["mean"] for m, k in groups]
        stds = [figures[m][k]["std"] if k else figures[m]["std"] for m, k in groups]
        ax.bar([x + i * width for x in range(len(groups))], means, width, yerr=stds, label=label, capsize=2)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(groups))],
                  ["EM free", "EM static", "EM dynamic", "memory recall@1\nat the subject"])  # fmt: skip
    ax.set_ylabel("%")
    ax.set_title("Entities added after training: questions about them against questions about trained entities")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "growth.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = experiment_parser(__doc__.split("\n")[0], "runs/toy-world-growth")
    parser.add_argument("--continued-steps", type=int, help="override the continued pre-training steps")
    parser.add_argument("--timed-additions", type=int, nargs="*", help="override the sizes timed (none: no timing)")
    parser.add_argument("--no-base-shape", action="store_true", help="skip timing at the edmem-base shape")
    args = parser.parse_args(argv)
    quiet_logging()
    settings = QUICK if args.quick else GrowthSettings()
    settings = replace(settings, qa=with_overrides(settings.qa, args))
    if args.continued_steps is not None:
        settings = replace(settings, continued_steps=args.continued_steps)
    if args.timed_additions is not None:
        settings = replace(settings, timed_additions=tuple(args.timed_additions))
    if args.no_base_shape:
        settings = replace(settings, time_the_base_shape=False)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = [run_seed(settings, seed, out / f"seed-{seed}") for seed in settings.qa.seeds]
    summary = summarise(runs)
    first = out / f"seed-{settings.qa.seeds[0]}"
    timing = {"toy_model": time_additions(first / "finetune", settings.timed_additions)}
    if settings.time_the_base_shape and settings.timed_additions:
        timing["edmem_base_shape"] = {"1000": time_base_shape(first / "finetune", 1_000)}
    result = {"settings": asdict(settings), "runs": runs, "summary": summary, "seconds_to_add": timing}
    (out / "results.json").write_text(json.dumps(result, indent=1))
    if not args.no_plots:
        result["plot"] = str(plot(summary, out))
    print(json.dumps({"summary": summary, "seconds_to_add": timing}, indent=1))

    def em(split: str, name: str, mode: str) -> float:
        return summary[split][name][mode]["exact_match"]["mean"]

    fields = [f"seeds={len(runs)}", f"entities_added={len(runs[0]['held_out'])}",
              f"new_questions={runs[0]['questions']['new']}", f"seen_questions={runs[0]['questions']['seen']}"]  # fmt: skip
    for mode in MODES:
        fields += [f"new_em_before_{mode}={em('new', 'before', mode)}",
                   f"new_em_added_{mode}={em('new', 'mean_query_scaled', mode)}",
                   f"new_em_random_rows_{mode}={em('new', 'random', mode)}",
                   f"new_em_question_query_rows_{mode}={em('new', 'question_query', mode)}",
                   f"new_em_continued_{mode}={em('new', 'continued_pretraining', mode)}",
                   f"seen_em_{mode}={em('seen', 'mean_query_scaled', mode)}"]  # fmt: skip
    for name in ("before", *ESTIMATORS, "continued_pretraining"):
        fields.append(f"new_memory_recall_{name}={summary['new'][name]['memory_recall']['mean']}")
    fields.append(f"seen_memory_recall={summary['seen']['mean_query_scaled']['memory_recall']['mean']}")
    fields.append(f"trained_people_passage_query_recall={summary['trained_people_passage_query_recall']['mean']}")
    not_asked = summary["seen_not_asked_in_finetuning"]
    fields += [
        f"seen_not_asked_memory_recall_{name}={figures['memory_recall']}" for name, figures in not_asked.items()
    ]
    fields.append(f"seen_not_asked_questions={not_asked['before']['questions']}")
    fields += [f"seconds_to_add_{n}={s}" for n, s in timing["toy_model"].items()]
    if "edmem_base_shape" in timing:
        fields.append(f"seconds_to_add_1000_at_edmem_base_shape={timing['edmem_base_shape']['1000']}")
    print("RESULT " + " ".join(fields))
    return 0


if __name__ == "__main__":
    sys.exit(main())

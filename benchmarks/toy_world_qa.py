"""Evidence that the memory works: EDMem against EncDec (no memory) and EncMem (encoder + memory) on closed-book
QA over a generated toy world, with the paper's orderings (Tables 1-2, Figures 3-4) as the questions asked.

For each seed: a toy world (`edmem_hf.toy_world`) is rendered as a MediaWiki dump; `edmem build-corpus` turns it
into passages; EDMem, EncDec and EncMem are pre-trained from scratch by `edmem pretrain` with the same steps,
widths and seed. The world's questions (entity answers, "Where was X born?", and literal ones, "When was X born?";
no question's wording is on a page) are split into train / dev / test; EDMem and EncDec are fine-tuned with
`examples/finetune_qa.py` (stock Seq2SeqTrainer), EncMem with the authors' recipe (the question then `<E_s>`, the
entity-linking head supervised with the answer entity). The test questions are scored by `edmem evaluate`'s code:
exact match overall, on entity answers and on literal answers. EDMem is decoded free, static and dynamic; and, for
the memory-size study, fine-tuned and decoded with the memory cut to a random fraction of the entities (the
authors' `--entity_mask_file`).

    python benchmarks/toy_world_qa.py --quick --out runs/toy-qa-quick    # one small world, one seed, < 10 min
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

from edmem_hf import EDMemForEntityLinking  # noqa: E402
from edmem_hf.configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN  # noqa: E402
from edmem_hf.corpus import build_corpus  # noqa: E402
from edmem_hf.evaluation import evaluate_files  # noqa: E402
from edmem_hf.pretraining import PretrainingArguments, pretrain  # noqa: E402
from edmem_hf.tasks import IGNORE_INDEX, EDMemSeq2SeqCollator, read_jsonl, read_qa  # noqa: E402
from edmem_hf.toy_world import QAPair, generate_toy_world, write_mediawiki_dump  # noqa: E402

logger = logging.getLogger("toy_world_qa")
MODES = ("free", "static", "dynamic")


@dataclass
class Settings:
    num_entities: int = 150
    seeds: tuple[int, ...] = (0, 1, 2)
    d_model: int = 128
    layers: int = 1  # lower and upper layers on each side (each)
    entity_embed_dim: int = 64
    pretrain_steps: int = 600
    pretrain_batch_size: int = 32
    pretrain_learning_rate: float = 1e-3
    finetune_epochs: float = 30.0
    finetune_learning_rate: float = 1e-3
    finetune_batch_size: int = 32
    test_fraction: float = 0.2
    memory_fractions: tuple[float, ...] = (1.0, 0.1, 0.0)


QUICK = Settings(num_entities=120, seeds=(0,), pretrain_steps=500, memory_fractions=(1.0, 0.1))


# --- data -------------------------------------------------------------------------------------------------------


def split_questions(pairs: list[QAPair], test_fraction: float, seed: int) -> dict[str, list[QAPair]]:
    """Train / dev / test questions, drawn at random (dev: a tenth of the rest, at least one)."""
    pairs = list(pairs)
    random.Random(seed).shuffle(pairs)
    n_test = max(1, round(test_fraction * len(pairs)))
    n_dev = max(1, (len(pairs) - n_test) // 10)
    return {"test": pairs[:n_test], "dev": pairs[n_test : n_test + n_dev], "train": pairs[n_test + n_dev :]}


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


def make_world(settings: Settings, seed: int, out: Path) -> dict:
    """The dump, the corpus (with its tokenizer) and the question files of one seed."""
    world = generate_toy_world(settings.num_entities, seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    dump = write_mediawiki_dump(world, out / "toy-wiki.xml.bz2")
    corpus = out / "corpus"
    if not (corpus / "entity_vocab.json").exists():
        build_corpus(dump, corpus, num_entities=100_000, num_proc=2, vocab_size=3000, seed=seed)
    files = {}
    for split, pairs in split_questions(world.qa_pairs, settings.test_fraction, seed).items():
        files[split], files[f"{split}_links"] = write_released_format(pairs, split, out)
    return {"world": world, "corpus": corpus, "files": files}


# --- training ---------------------------------------------------------------------------------------------------


def pretrain_variant(variant: str, corpus: Path, out: Path, settings: Settings, seed: int) -> Path:
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
            encoder_ffn_dim=4 * d,
            decoder_ffn_dim=4 * d,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            entity_embed_dim=settings.entity_embed_dim,
            max_position_embeddings=160,
            dropout=0.1,
            **pretraining_schedule(settings, settings.pretrain_steps, seed),
        )
    )
    return out


def pretraining_schedule(settings: Settings, steps: int, seed: int) -> dict:
    """The `PretrainingArguments` of the training loop: batch, learning rate, `steps`, one save at the end,
    resumed on a rerun."""
    return dict(per_device_train_batch_size=settings.pretrain_batch_size, learning_rate=settings.pretrain_learning_rate,
                max_steps=steps, eval_steps=0, save_steps=steps, logging_steps=max(steps // 10, 1), seed=seed,
                report_to="none", resume="auto", disable_tqdm=True)  # fmt: skip


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


def finetune_seq2seq(model_dir: Path, files: dict, out: Path, settings: Settings, seed: int, modes=MODES,
                     entity_mask_file: Path | None = None) -> dict[str, Path]:  # fmt: skip
    """Fine-tunes on the training questions, then predicts the test questions in each decoding mode; returns
    `{mode: predictions file}`."""
    finetune_model(model_dir, files["train"], out, settings, seed, entity_mask_file)
    return {mode: predict(out, files["test"], out / mode, mode, settings, seed, entity_mask_file) for mode in modes}


def _encmem_features(rows, tokenizer, with_answer: bool) -> list[dict]:
    """EncMem's QA input: the question, then a masked mention `<E_s> <mask> <E_e>` whose entity the head predicts
    (the authors appended a bare `<E_s>`; an encoder input needs its mentions closed, and a masked mention is what
    EncMem pre-trains on). The head is supervised with the answer entity there."""
    start, end = tokenizer.convert_tokens_to_ids([ENTITY_START_TOKEN, ENTITY_END_TOKEN])
    features = []
    for row in rows:
        if with_answer and row["answer_entity"] == IGNORE_INDEX:
            continue  # a literal answer: EncMem cannot produce it, nothing to train
        question = tokenizer(row["question"]).input_ids
        input_ids = question[:-1] + [start, tokenizer.mask_token_id, end, question[-1]]
        labels = [IGNORE_INDEX] * len(input_ids)
        positions = [i for i, token in enumerate(input_ids) if token == start]
        for position, entity in zip(positions, row["mention_entities"] + [row["answer_entity"]]):
            labels[position] = entity
        features.append({"input_ids": input_ids, "entity_labels": labels})
    return features


def finetune_encmem(model_dir: Path, files: dict, out: Path, settings: Settings, seed: int) -> Path:
    """Fine-tunes EncMem on the entity-answer training questions; its answer to each test question is the entity
    its head links at the final `<E_s>`, written `<E_s> name <E_e>` (as EDMem writes one)."""
    path = out / "encmem_predictions.json"
    if path.exists():  # a rerun goes on where the last one stopped
        return path
    model = EDMemForEntityLinking.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    vocab = model.entity_vocab
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
    train = _encmem_features(read_qa(files["train"], vocab), tokenizer, with_answer=True)
    Trainer(model=model, args=args, train_dataset=train, data_collator=collator).train()
    model.eval()
    test_rows = read_qa(files["test"], vocab)
    predictions = {}
    features = _encmem_features(test_rows, tokenizer, with_answer=False)  # the answer is not read: labels unused
    with torch.no_grad():
        for begin in range(0, len(features), 64):
            chunk = features[begin : begin + 64]
            batch = collator([{"input_ids": f["input_ids"]} for f in chunk])
            linked = model(**batch, output_attended_entities=True).linked_entities
            last = {}  # row -> the entity linked at its last <E_s>
            for (row, column), ids in zip(linked.positions.tolist(), linked.top_entity_ids.tolist()):
                if column >= last.get(row, (-1, None))[0]:
                    last[row] = (column, ids[0])
            for row, (_, entity) in last.items():
                name = vocab.name_of(entity)
                predictions[test_rows[begin + row]["id"]] = f"{ENTITY_START_TOKEN} {name} {ENTITY_END_TOKEN}"
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(predictions, indent=1))
    return path


def majority_answers(files: dict, out: Path) -> Path:
    """The floor every model must clear: for each question form ("Where was X born?"), the answer most often
    right for that form in the training questions, given to every test question of the form. No model, no facts."""

    def form(record: dict) -> str:
        start, length = record["link_offset"][0], record["link_length"][0]
        return record["question"][:start] + "X" + record["question"][start + length :]

    answers: dict[str, Counter] = {}
    for record in read_jsonl(files["train"]):
        answers.setdefault(form(record), Counter())[record["answer"][0]] += 1
    predictions = {}
    for record in read_jsonl(files["test"]):
        counts = answers.get(form(record))
        predictions[record["id"]] = counts.most_common(1)[0][0] if counts else ""
    path = out / "majority_predictions.json"
    path.write_text(json.dumps(predictions, indent=1))
    return path


def write_entity_mask(num_entities: int, visible_fraction: float, seed: int, path: Path) -> Path:
    """The authors' memory mask: 1 for a hidden entity, each hidden with probability `1 - visible_fraction`."""
    generator = torch.Generator().manual_seed(seed)
    hidden = (torch.rand(num_entities, generator=generator) >= visible_fraction).long()
    torch.save(hidden, path)
    return path


# --- the experiment ---------------------------------------------------------------------------------------------


def score(files: dict, predictions: Path) -> dict[str, float]:
    scores = evaluate_files("qa", files["test"], predictions, answer_links=files["test_links"])
    return {key: round(value, 2) for key, value in scores.items() if isinstance(value, float)}


def run_seed(settings: Settings, seed: int, out: Path) -> dict:
    started = time.perf_counter()
    data = make_world(settings, seed, out)
    files, results = data["files"], {}
    models = {}
    for variant in ("edmem", "encdec", "encmem"):
        t0 = time.perf_counter()
        models[variant] = pretrain_variant(variant, data["corpus"], out / f"pretrain-{variant}", settings, seed)
        logger.info("seed %d: pre-trained %s in %.0f s", seed, variant, time.perf_counter() - t0)
    for mode, path in finetune_seq2seq(models["edmem"], files, out / "finetune-edmem", settings, seed).items():
        results[f"edmem_{mode}"] = score(files, path)
    path = finetune_seq2seq(models["encdec"], files, out / "finetune-encdec", settings, seed, modes=("free",))["free"]
    results["encdec"] = score(files, path)
    results["encmem"] = score(files, finetune_encmem(models["encmem"], files, out / "finetune-encmem", settings, seed))
    results["majority_answer"] = score(files, majority_answers(files, out))
    num_entities = EDMemForEntityLinking.config_class.from_pretrained(models["edmem"]).entity_vocab_size
    memory = {}
    for fraction in settings.memory_fractions:
        if fraction == 1.0:
            memory["1.0"] = {mode: results[f"edmem_{mode}"] for mode in ("free", "static")}
            continue
        mask = write_entity_mask(num_entities, fraction, seed, out / f"memory_mask_{fraction}.pt")
        ft = out / f"finetune-edmem-memory-{fraction}"
        paths = finetune_seq2seq(models["edmem"], files, ft, settings, seed, ("free", "static"), entity_mask_file=mask)
        memory[str(fraction)] = {mode: score(files, path) for mode, path in paths.items()}
    sizes = {split: sum(1 for _ in open(files[split], encoding="utf-8")) for split in ("train", "dev", "test")}
    return {
        "seed": seed,
        "questions": sizes,
        "entities": num_entities,
        "results": results,
        "memory_fraction": memory,
        "seconds": round(time.perf_counter() - started),
    }


def stats(values: list[float]) -> dict[str, float]:
    """Mean and spread (population standard deviation; 0 for one value) of one figure over the seeds."""
    return {"mean": round(statistics.fmean(values), 2), "std": round(statistics.pstdev(values), 2)}


def summarise(runs: list[dict]) -> dict:
    """`stats` of every figure over the seeds."""

    systems = runs[0]["results"]
    summary = {
        system: {key: stats([run["results"][system][key] for run in runs]) for key in systems[system]}
        for system in systems
    }
    memory = {
        fraction: {
            mode: {key: stats([run["memory_fraction"][fraction][mode][key] for run in runs]) for key in scores}
            for mode, scores in modes.items()
        }
        for fraction, modes in runs[0]["memory_fraction"].items()
    }
    return {"systems": summary, "memory_fraction": memory}


def orderings(summary: dict) -> dict[str, bool]:
    """The paper's orderings, on the means."""
    systems = {
        name: {key: value["mean"] for key, value in scores.items()} for name, scores in summary["systems"].items()
    }
    entity = {name: scores.get("exact_match_entity", 0.0) for name, scores in systems.items()}
    fractions = sorted(summary["memory_fraction"], key=float)
    low = summary["memory_fraction"][fractions[0]]["free"]["exact_match_entity"]["mean"]
    return {
        "static_over_free_on_entity_answers": entity["edmem_static"] > entity["edmem_free"],
        "free_over_encdec_on_entity_answers": entity["edmem_free"] > entity["encdec"],
        "encmem_zero_on_literal_answers": systems["encmem"]["exact_match_non_entity"] == 0.0,
        "edmem_nonzero_on_literal_answers": systems["edmem_free"]["exact_match_non_entity"] > 0.0,
        "smaller_memory_falls_toward_encdec": abs(low - entity["encdec"]) < abs(entity["edmem_free"] - entity["encdec"]),
    }  # fmt: skip


def plot(summary: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    names = list(summary["systems"])
    keys = [("exact_match", "all"), ("exact_match_entity", "entity answers"), ("exact_match_non_entity", "literal")]
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(keys)
    for i, (key, label) in enumerate(keys):
        means = [summary["systems"][n][key]["mean"] for n in names]
        stds = [summary["systems"][n][key]["std"] for n in names]
        ax.bar([x + i * width for x in range(len(names))], means, width, yerr=stds, label=label, capsize=3)
    ax.set_xticks([x + width for x in range(len(names))], [n.replace("_", "\n") for n in names])
    ax.set_ylabel("exact match (%)")
    ax.set_title("Toy-world closed-book QA, held-out questions")
    ax.legend()
    fig.tight_layout()
    paths.append(out / "em_by_model.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fractions = sorted(summary["memory_fraction"], key=float)
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode in ("free", "static"):
        for key, style in (("exact_match_entity", "-o"), ("exact_match_non_entity", "--s")):
            ys = [summary["memory_fraction"][f][mode][key]["mean"] for f in fractions]
            ax.plot([float(f) for f in fractions], ys, style, label=f"EDMem {mode}, {key.replace('exact_match_', '')}")
    ax.axhline(
        summary["systems"]["encdec"]["exact_match_entity"]["mean"], color="grey", ls=":", label="EncDec, entity"
    )
    ax.set_xlabel("visible fraction of the entity memory")
    ax.set_ylabel("exact match (%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out / "em_by_memory_fraction.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


def experiment_parser(description: str, default_out: str) -> argparse.ArgumentParser:
    """The options the toy-world experiments share."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default=default_out, help="working directory; results.json and plots")
    parser.add_argument("--quick", action="store_true", help="a small world, one seed (< 10 minutes on 2 cores)")
    parser.add_argument("--seeds", type=int, nargs="+", help="override the seeds")
    parser.add_argument("--num-entities", type=int, help="override the world's size")
    parser.add_argument("--pretrain-steps", type=int, help="override the pre-training steps")
    parser.add_argument("--finetune-epochs", type=float, help="override the fine-tuning epochs")
    parser.add_argument("--no-plots", action="store_true")
    return parser


def with_overrides(settings: Settings, args: argparse.Namespace) -> Settings:
    """`settings` with the shared options given on the command line."""
    overrides = dict(seeds=tuple(args.seeds) if args.seeds else None, num_entities=args.num_entities,
                     pretrain_steps=args.pretrain_steps, finetune_epochs=args.finetune_epochs)  # fmt: skip
    return replace(settings, **{k: v for k, v in overrides.items() if v is not None})


def quiet_logging() -> None:
    """Progress lines from the experiment; warnings only from the libraries."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for name in ("transformers", "datasets", "edmem_hf", "accelerate"):
        logging.getLogger(name).setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    args = experiment_parser(__doc__.split("\n")[0], "runs/toy-world-qa").parse_args(argv)
    quiet_logging()
    settings = with_overrides(QUICK if args.quick else Settings(), args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = [run_seed(settings, seed, out / f"seed-{seed}") for seed in settings.seeds]
    summary = summarise(runs)
    result = {"settings": asdict(settings), "runs": runs, **summary, "orderings": orderings(summary)}
    (out / "results.json").write_text(json.dumps(result, indent=1))
    if not args.no_plots:
        result["plots"] = [str(p) for p in plot(summary, out)]
    print(json.dumps({"systems": summary["systems"], "orderings": result["orderings"]}, indent=1))
    means = {name: scores for name, scores in summary["systems"].items()}
    fields = [
        f"seeds={len(runs)}",
        f"entities={runs[0]['entities']}",
        f"test_questions={runs[0]['questions']['test']}",
    ]
    for name in means:
        for key, short in (("exact_match", "em"), ("exact_match_entity", "em_entity"),
                           ("exact_match_non_entity", "em_literal")):  # fmt: skip
            fields.append(f"{name}_{short}={means[name][key]['mean']}")
    low = min(summary["memory_fraction"], key=float)
    fields.append(
        f"edmem_free_em_entity_at_memory_{low}={summary['memory_fraction'][low]['free']['exact_match_entity']['mean']}"
    )
    fields += [f"{name}={int(holds)}" for name, holds in result["orderings"].items()]
    print("RESULT " + " ".join(fields))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`edmem demo`: the whole path, offline, on a toy world we generate: dump, corpus, tokenizer, pre-training,
fine-tuning, reload, and answers in the free, static and dynamic decoding settings.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)

from .arguments import CommandArgumentParser
from .corpus import build_corpus, format_stats
from .entity_vocab import EntityVocab
from .pretraining import PretrainingArguments, pretrain
from .progress import show_training_progress
from .tasks import EDMemSeq2SeqCollator, QAExample, encode_qa_example, exact_match
from .toy_world import generate_toy_world, write_mediawiki_dump

logger = logging.getLogger(__name__)

DEMO_MINUTES = "about 1 1/2 minutes"  # 87 s measured from a fresh clone, 2 idle cores (README.md, "Two commands")
VALIDATION_FRACTION = 0.1  # of the passages, held out of pre-training for its validation figure
MENTIONS_SHOWN = 3  # of each generated answer


@dataclass
class DemoArguments:
    """`edmem demo`: generate a toy world, build its corpus, pre-train and fine-tune a tiny EDMem on it, reload it
    and answer the world's questions in the free, static and dynamic decoding settings (offline, CPU)."""

    out: str = field(metadata={"help": "Directory for the dump, corpus, checkpoints and the final model."})
    num_entities: int = field(default=80, metadata={"help": "Entities in the toy world."})
    seed: int = field(default=0, metadata={"help": "Seed of the world, the initialisation and the data order."})
    d_model: int = field(default=128, metadata={"help": "Hidden width of the tiny model."})
    layers: int = field(default=1, metadata={"help": "Lower and upper layers on each side (each)."})
    pretrain_steps: int = field(default=600, metadata={"help": "Pre-training optimizer steps (batch 16)."})
    finetune_epochs: float = field(default=60.0, metadata={"help": "Fine-tuning epochs over the training questions."})
    held_out_every: int = field(
        default=5, metadata={"help": "Every N-th question is held out of fine-tuning and scored apart."}
    )
    num_proc: int = field(default=2, metadata={"help": "Processes building the corpus."})
    show_questions: int = field(default=4, metadata={"help": "Questions of each set printed in each decoding mode."})
    entity_candidates: int = field(default=3, metadata={"help": "Entities a mention may spell in dynamic decoding."})


def _section(title: str) -> None:
    print(f"\n=== {title} " + "=" * max(0, 72 - len(title)), flush=True)


def _qa_examples(world, vocab: EntityVocab) -> list[QAExample]:
    """The world's questions with an entity answer, the subject linked in the question and the answer entity as the
    target."""
    examples = []
    for pair in world.qa_pairs:
        if not pair.answer_is_entity or pair.subject not in vocab or pair.answer not in vocab:
            continue
        start = pair.question.find(pair.subject)
        mentions = [(start, start + len(pair.subject), vocab.id_of(pair.subject))] if start >= 0 else []
        examples.append(QAExample(pair.question, [pair.answer], mentions, vocab.id_of(pair.answer)))
    return examples


def run_demo(args: DemoArguments) -> dict:
    """Runs the five steps; returns a summary (also written to `OUT/demo_summary.json`).

    1. Generate a small fictional world and render it as a MediaWiki XML dump with links, aliases, redirects,
       templates and references.
    2. Build the corpus from the dump: plain text with link spans, entity vocabulary, aliases, heuristic labels,
       a byte-level BPE tokenizer with `<E_s>`/`<E_e>`, 128-token passages (a tenth held out for validation).
    3. Pre-train a tiny EDMem on the passages with the Accelerate loop (random-token and salient-span masking).
    4. Fine-tune it briefly on the world's questions, and save model, tokenizer and entity vocabulary to
       `OUT/model`.
    5. Reload it with `AutoModelForSeq2SeqLM` and answer the questions in each decoding mode, with the candidate
       entities behind each generated mention.

    Pre-training and fine-tuning show their progress on stderr: a bar on a terminal, else a line every few seconds.
    """
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    timings = {}
    print(
        f"edmem demo: {DEMO_MINUTES} on 2 idle CPU cores with the default settings (longer on a busy machine); "
        "pre-training and fine-tuning show their progress and the time left.",
        flush=True,
    )

    _section("1. toy world -> MediaWiki dump")
    world = generate_toy_world(num_entities=args.num_entities, seed=args.seed)
    dump = write_mediawiki_dump(world, out / "toy-wiki.xml.bz2")
    print(f"{len(world.entities)} entities, {len(world.pages)} articles, {len(world.redirects)} redirects -> {dump}")
    timings["world"] = time.perf_counter() - started

    _section("2. build the corpus (links, aliases, heuristic labels, tokenizer, passages)")
    t0 = time.perf_counter()
    corpus_dir = out / "corpus"
    stats = build_corpus(
        dump,
        corpus_dir,
        num_entities=10_000,
        num_proc=args.num_proc,
        vocab_size=3000,
        validation_fraction=VALIDATION_FRACTION,
        seed=args.seed,
    )
    print(format_stats(stats))
    timings["corpus"] = time.perf_counter() - t0

    _section("3. pre-train a tiny EDMem (Accelerate)")
    t0 = time.perf_counter()
    pretrain_args = PretrainingArguments(
        output_dir=str(out / "pretrain"),
        corpus_dir=str(corpus_dir),
        d_model=args.d_model,
        encoder_lower_layers=args.layers,
        encoder_upper_layers=args.layers,
        decoder_lower_layers=args.layers,
        decoder_upper_layers=args.layers,
        encoder_ffn_dim=4 * args.d_model,
        decoder_ffn_dim=4 * args.d_model,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        entity_embed_dim=64,
        max_position_embeddings=160,
        dropout=0.1,
        per_device_train_batch_size=16,
        learning_rate=1e-3,
        max_steps=args.pretrain_steps,
        eval_steps=max(args.pretrain_steps // 2, 1),
        save_steps=max(args.pretrain_steps // 2, 1),
        logging_steps=max(min(args.pretrain_steps // 10, 20), 1),
        seed=args.seed,
        report_to="none",
        resume="auto",
    )
    summary = pretrain(pretrain_args)
    train, evaluation = summary["train"] or {}, summary["eval"] or {}
    print(
        f"pre-training: {summary['global_step']} steps of {pretrain_args.per_device_train_batch_size} passages; "
        f"training loss {train.get('loss', float('nan')):.3f} over the last {pretrain_args.logging_steps} steps"
    )
    print(
        f"pre-training validation, on the {stats.get('validation_passages')} passages held out of pre-training "
        f"({evaluation.get('eval_masked_tokens')} masked tokens, {evaluation.get('eval_masked_mentions')} masked "
        f"mentions): perplexity of the masked tokens {evaluation.get('eval_ppl', float('nan')):.1f}, entity "
        f"linking accuracy at the masked mentions {100 * evaluation.get('eval_acc', float('nan')):.1f}% "
        f"({round(evaluation.get('eval_acc', 0) * evaluation.get('eval_masked_mentions', 0))} of "
        f"{evaluation.get('eval_masked_mentions')})"
    )
    timings["pretrain"] = time.perf_counter() - t0

    _section("4. fine-tune on the world's questions (closed-book QA)")
    t0 = time.perf_counter()
    model = AutoModelForSeq2SeqLM.from_pretrained(out / "pretrain")
    tokenizer = AutoTokenizer.from_pretrained(out / "pretrain")
    vocab = model.entity_vocab
    examples = _qa_examples(world, vocab)
    random.Random(args.seed).shuffle(examples)
    question_sets = {
        "training": [e for i, e in enumerate(examples) if (i + 1) % args.held_out_every],
        "held-out": [e for i, e in enumerate(examples) if (i + 1) % args.held_out_every == 0],
    }
    features = [encode_qa_example(e, tokenizer) for e in question_sets["training"]]
    training_args = Seq2SeqTrainingArguments(
        output_dir=str(out / "finetune"),
        per_device_train_batch_size=16,
        learning_rate=1e-3,
        num_train_epochs=args.finetune_epochs,
        warmup_steps=10,
        logging_steps=10,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=args.seed,
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    trainer = Seq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=features,
        data_collator=EDMemSeq2SeqCollator(tokenizer.pad_token_id),
        processing_class=tokenizer,
    )
    show_training_progress(trainer, "fine-tune")
    result = trainer.train()
    print(
        f"fine-tuning: {len(features)} training questions ({len(question_sets['held-out'])} held out), "
        f"{result.global_step} steps, training loss {result.training_loss:.3f} (the mean over the steps)"
    )
    final_dir = out / "model"
    model.save_pretrained(final_dir)
    tokenizer.save_pretrained(final_dir)
    timings["finetune"] = time.perf_counter() - t0

    _section("5. reload with AutoModelForSeq2SeqLM and answer in each decoding mode")
    t0 = time.perf_counter()
    model = AutoModelForSeq2SeqLM.from_pretrained(final_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(final_dir)
    print(f"{type(model).__name__} from {final_dir}: {len(model.entity_vocab)} entities in memory")
    answers = _answer_in_each_mode(model, tokenizer, question_sets, args)
    exact = {
        name: {mode: round(100 * answers[mode][name].hits / len(questions), 2) for mode in answers}
        for name, questions in question_sets.items()
        if questions
    }
    print(
        "\nThe held-out questions were not fine-tuned on: their answers come from what pre-training put in the model "
        "and its memory; the training questions' figure says how well fine-tuning fitted them."
    )
    print(_static_against_dynamic(answers, question_sets))
    timings["generate"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - started
    summary = {
        "model_dir": str(final_dir),
        "entities": len(model.entity_vocab),
        "passages": stats.get("passages"),
        "validation_passages": stats.get("validation_passages"),
        "exact_match": exact,  # percent: {"training": {mode: EM}, "held-out": {mode: EM}}
        "questions": {name: len(questions) for name, questions in question_sets.items()},
        "finetune_steps": result.global_step,
        "seconds": {k: round(v, 1) for k, v in timings.items()},
    }
    (out / "demo_summary.json").write_text(json.dumps(summary, indent=2))
    _section("done")
    seconds = summary["seconds"]
    print(
        f"{seconds['total']:.0f} s in all: pre-training {seconds['pretrain']:.0f} s, fine-tuning "
        f"{seconds['finetune']:.0f} s, the rest {seconds['total'] - seconds['pretrain'] - seconds['finetune']:.0f} "
        f"s; the figures above are in {out / 'demo_summary.json'} (exact match in percent)."
    )
    print(f"\nThe model, its tokenizer and its entity vocabulary are in {final_dir}. Load them with:\n")
    for line in load_snippet(final_dir):
        print(f"    {line}")
    print(
        "\nRead next: docs/quickstart.md (your own entities and data, the three decoding settings), "
        "docs/fine_tuning.md (the paper's QA and generation tasks), docs/pretraining.md (pre-training on Wikipedia)."
    )
    return summary


def load_snippet(model_dir: str | os.PathLike) -> list[str]:
    """Two lines of Python that load the demo's model and tokenizer (`import edmem_hf` registers EDMem with the
    Auto classes; without the package, `trust_remote_code=True` loads the model's own code)."""
    path = json.dumps(str(model_dir))
    return [
        "import edmem_hf; from transformers import AutoModelForSeq2SeqLM, AutoTokenizer",
        f"model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained({path}), AutoTokenizer.from_pretrained({path})",
    ]


@dataclass
class _Answers:
    """One decoding mode's answers to one question set: plain texts, the generated mentions, exact-match hits."""

    texts: list[str]
    mentions: list[list]
    hits: int


def _answer_in_each_mode(model, tokenizer, question_sets, args: DemoArguments) -> dict[str, dict[str, _Answers]]:
    """Generates the answers of every question set in the free, static and dynamic modes, and prints, for each
    mode, its exact match and the first `args.show_questions` questions of each set with their answers and the
    candidate entities of each generated mention."""
    collate = EDMemSeq2SeqCollator(tokenizer.pad_token_id)
    answers: dict[str, dict[str, _Answers]] = {}
    for mode in ("free", "static", "dynamic"):
        answers[mode] = {}
        for name, questions in question_sets.items():
            if not questions:
                continue
            batch = collate([{"input_ids": encode_qa_example(e, tokenizer)["input_ids"]} for e in questions])
            output = model.generate(
                **batch,
                entity_decoding=mode,
                entity_candidates=args.entity_candidates,
                tokenizer=tokenizer,
                max_new_tokens=12,
                num_beams=3,
                return_dict_in_generate=True,
            )
            texts = [" ".join(t.split()) for t in tokenizer.batch_decode(output.sequences, skip_special_tokens=True)]
            hits = sum(exact_match(text, example.answers) for text, example in zip(texts, questions))
            answers[mode][name] = _Answers(texts, list(output.entity_mentions), hits)
        scores = ", ".join(
            f"{100 * sets.hits / len(question_sets[name]):.1f}% on the {len(question_sets[name])} {name} questions"
            for name, sets in answers[mode].items()
        )
        print(f"\n--- {mode}: exact match {scores}")
        for name, sets in answers[mode].items():
            shown = zip(question_sets[name], sets.texts, sets.mentions)
            for example, text, mentions in list(shown)[: args.show_questions]:
                print(f"[{name}] Q: {example.question}")
                print(f"   gold: {example.answers[0]}   generated: {text or '(no words)'}")
                for mention in mentions[:MENTIONS_SHOWN]:
                    candidates = ", ".join(f"{entity} ({score:.2f})" for _, entity, score in mention.candidates[:5])
                    print(f"   mention -> {mention.entity_name or '(no entity)'}; candidates: {candidates or '-'}")
                if len(mentions) > MENTIONS_SHOWN:
                    print(f"   ... and {len(mentions) - MENTIONS_SHOWN} more mentions")
    return answers


def _static_against_dynamic(answers: dict[str, dict[str, _Answers]], question_sets) -> str:
    """Where the static and dynamic answers differ, or why they agree."""
    differ, total, at_start = [], 0, True
    for name, static in answers["static"].items():
        dynamic = answers["dynamic"][name]
        for example, static_text, dynamic_text, mentions in zip(
            question_sets[name], static.texts, dynamic.texts, dynamic.mentions
        ):
            total += 1
            if static_text != dynamic_text:
                differ.append(f"  [{name}] {example.question} static: {static_text}   dynamic: {dynamic_text}")
            at_start &= len(mentions) == 1 and mentions[0].start == 1  # position 0 is the decoder's start token
    if differ:
        return f"Static and dynamic decoding answer {len(differ)} of the {total} questions differently:\n" + "\n".join(
            differ
        )
    why = (
        "every answer is one entity that opens the answer, where the dynamic setting reads the entity-linking head "
        "after the same decoder input as the static one (the start token, then the opening marker): both offer the "
        "same candidates, and the model spells the same one of them. They differ where a mention comes after other "
        "generated words (the dynamic setting reads the head there, the static one only before generating)."
        if at_start
        else "the dynamic setting's candidates at each mention led to the same names as the static setting's."
    )
    return f"Static and dynamic decoding give the same answer to all {total} questions: {why}"


def cli_main(argv: list[str] | None = None) -> int:
    parser = CommandArgumentParser(DemoArguments, prog="edmem demo", description=DemoArguments.__doc__)
    (args,) = parser.parse_args_into_dataclasses(args=argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with quiet_tied_weight_saving():
        run_demo(args)
    return 0


class _TiedWeightNotice(logging.Filter):
    """Drops Accelerate's "Removed shared tensor ... while saving" notice: the model's tied copies (token
    embeddings and LM head, the entity table's) are saved once and tied again on loading, as it says they should."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()  # "[RANK 0] Removed shared tensor {...} while saving. ..."
        return not ("Removed shared tensor" in message and "while saving" in message)


@contextlib.contextmanager
def quiet_tied_weight_saving():
    """While inside, Accelerate's notice about tied weights is not printed; every other message is."""
    logger_ = logging.getLogger("accelerate.utils.other")
    notice = _TiedWeightNotice()
    logger_.addFilter(notice)
    try:
        yield
    finally:
        logger_.removeFilter(notice)


if __name__ == "__main__":
    sys.exit(cli_main())

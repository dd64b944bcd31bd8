"""Training and asking the systems of the knowledge experiments: `edmem pretrain` of a variant at an experiment's
widths and schedule (side by side in processes of their own), `edmem finetune` and its predictions, EncMem's
fine-tuning and answers, and parameter counts. `Recipe`: the pre-training and fine-tuning levers beyond the paper's
(`toy_world_qa.RECIPES` names them)."""

from __future__ import annotations

import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import AutoTokenizer, Trainer, TrainingArguments

from edmem_hf import EDMemForConditionalGeneration, EDMemForEntityLinking
from edmem_hf.configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN, EDMemConfig
from edmem_hf.pretraining import pretrain, pretraining_options
from edmem_hf.task_features import in_running_text
from edmem_hf.tasks import IGNORE_INDEX, EDMemSeq2SeqCollator, read_qa

if TYPE_CHECKING:
    from toy_world_qa import Settings


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
            **{**pretraining_schedule(settings, settings.pretrain_steps, seed), **options},  # options win
        )
    )
    return out


def pretrain_side_by_side(calls: dict[str, tuple], jobs: int, options: dict[str, dict] | None = None
                          ) -> dict[str, Path]:  # fmt: skip
    """`pretrain_variant(*arguments, **options[name])` for each name -> arguments, `jobs` at a time, each in a
    process of its own (one thread each; a pre-training of this size does not gain from a second thread).
    `options`: a name's own pre-training options (a system's recipe of its own). Returns name -> folder."""
    own = {name: dict((options or {}).get(name, {})) for name in calls}  # copies: pretrain_variant pops from them
    if jobs <= 1 or len(calls) == 1:
        return {name: pretrain_variant(*arguments, **own[name]) for name, arguments in calls.items()}
    with ProcessPoolExecutor(min(jobs, len(calls)), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {name: pool.submit(_pretrain_on_one_thread, *arguments, **own[name])
                   for name, arguments in calls.items()}  # fmt: skip
        return {name: future.result() for name, future in futures.items()}


def _pretrain_on_one_thread(*arguments, **options) -> Path:
    torch.set_num_threads(1)  # side by side: one core each, not every core each
    return pretrain_variant(*arguments, **options)


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


def parameter_counts(model_dir: Path) -> dict[str, int]:
    """Parameters with and without the entity table (tied copies counted once)."""
    config = EDMemConfig.from_pretrained(model_dir)
    cls = EDMemForEntityLinking if config.variant == "encmem" else EDMemForConditionalGeneration
    model = cls.from_pretrained(model_dir)
    total = model.num_parameters()
    table = 0 if config.variant == "encdec" else model.get_encoder().entity_embeddings.weight.numel()
    return {"with_table": total, "without_table": total - table}

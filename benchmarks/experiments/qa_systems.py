"""The systems of `toy_world_qa.py`, one seed's: pre-trained side by side (EDMem, EncDec, EncMem, and an EncDec of
EDMem's parameter count), then fine-tuned and asked each group's questions, EDMem in each decoding mode and with its
memory hidden at test or in fine-tuning, beside the majority answer of each question form; and what each system
knows and answers (`measure_systems`: memorisation, the memory's recall at the subject, EM by group)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from edmem_hf import EDMemForConditionalGeneration, EntityVocab
from experiments.memory import hidden_rows, memory_hits, save_entity_mask
from experiments.probes import memorisation
from experiments.scoring import em, majority_answers, question_hits
from experiments.training import (
    Recipe,
    finetune_encmem,
    finetune_model,
    matched_ffn_dim,
    parameter_counts,
    predict,
    predict_encmem,
    pretrain_side_by_side,
    pretrain_variant,
)

if TYPE_CHECKING:
    from toy_world_qa import Settings

logger = logging.getLogger("toy_world_qa")
MODES = ("free", "static", "dynamic")


def pretrain_systems(settings: Settings, seed: int, out: Path, data: dict, recipe: Recipe, variants: tuple[str, ...],
                     matched: bool) -> dict[str, Path]:  # fmt: skip
    """`variants` pre-trained on the world's corpus (`data`, `make_world`'s) under `recipe`, side by side, each in a
    folder named by what sets it apart from the paper's; with `matched`, then an EncDec of EDMem's parameter count
    (`encdec_matched`). Returns system -> folder."""
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
    if matched:
        ffn_dim = matched_ffn_dim(models["edmem"], models["encdec"], settings)
        where = out / f"pretrain-encdec-matched{recipe.pretraining_suffix('encdec')}"
        models["encdec_matched"] = pretrain_variant(
            "encdec", data["corpus"], where, settings, seed, ffn_dim, recipe, data["mixed_questions"]
        )
    return models


def ask_systems(settings: Settings, seed: int, out: Path, models: dict[str, Path], files: dict[str, Path],
                groups: dict[str, list[str]], asked: list[str], recipe: Recipe, ablation: bool
                ) -> tuple[dict[str, dict[str, Path]], Path]:  # fmt: skip
    """Each pre-trained system of `models` fine-tuned on the train group's questions (`files`) and asked the train
    group's and each `asked` group's (`groups`: group -> its people); EDMem in every decoding mode and, but in an
    `ablation`, with every row or the asked subjects' rows hidden at test (`mask-*.pt`), and fine-tuned and tested
    with every row hidden (`settings.memory_hidden_in_finetuning`); the majority answer of each question form beside
    them. Returns group -> system -> predictions file, and the fine-tuned EDMem's folder."""
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
    return predictions, edmem


def measure_systems(settings: Settings, seed: int, out: Path, data: dict, models: dict[str, Path], asked: list[str],
                    recipe: Recipe, ablation: bool = False) -> dict:  # fmt: skip
    """What one seed's pre-trained systems (`models`, on the world `data`) know and answer: each model's
    memorisation of every group's facts, then each system fine-tuned and asked (`ask_systems`) the `asked` groups'
    questions, the memory's recall at each question's subject, and the per-question hits and EM by group."""
    splits, files = data["splits"], data["files"]
    groups = {group: sorted({pair.subject for pair in pairs}) for group, pairs in splits.items() if pairs}
    memorised = {variant: memorisation(path, data["world"], groups, recipe.decoder_target)
                 for variant, path in models.items()}  # fmt: skip
    predictions, edmem = ask_systems(settings, seed, out, models, files, groups, asked, recipe, ablation)
    recall = {group: memory_hits(edmem, files[group]) for group in predictions}
    hits = {group: {system: question_hits(files[group], files[f"{group}_links"], path)
                    for system, path in systems.items()} for group, systems in predictions.items()}  # fmt: skip
    return {
        "entities": len(EntityVocab.load(models["edmem"])),
        "parameters": {variant: parameter_counts(path) for variant, path in models.items()},
        "memorisation": memorised,
        "edmem_memory_recall_at_subject": {group: round(100 * sum(h) / len(h), 2) for group, h in recall.items()},
        "hits": hits,
        "em": {group: {system: em(h) for system, h in systems.items()} for group, systems in hits.items()},
    }

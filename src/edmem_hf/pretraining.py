"""EDMem pre-training with Accelerate: one loop for one CPU, N GPUs and several nodes (`edmem pretrain`).

The paper's recipe (Appendix A) with exact resume from Accelerate checkpoints; see docs/pretraining.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from .collator import IGNORE_INDEX, EDMemMaskingCollator

logger = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"  # Accelerate's automatic naming: OUTPUT_DIR/checkpoints/checkpoint_<i>
TRAINER_STATE_NAME = "trainer_state.json"
LOG_NAME = "log.jsonl"
ARGUMENTS_NAME = "pretraining_args.json"  # the arguments of the run's last start: `edmem pretrain <that file>`
_CHECKPOINT_NAME = re.compile(r"^checkpoint_(\d+)$")
_OLD_CHECKPOINT_NAME = re.compile(r"^step-(\d+)$")  # earlier versions of this loop: no Accelerate state to resume


# Options `edmem pretrain` accepts without listing them in its help (docs/pretraining.md lists them): levers of
# the experiments in docs/evidence.md, and settings of the tests' and the progress display's.
EXPERT_OPTIONS = {
    "entity_key_dim": "Columns of a row that queries score (its key); the rest are its value (default: all).",
    "entity_loss_reduction": "How the linking loss is averaged: labelled_accesses (default: a mean over mentions), all_accesses (the authors' code) or per_lm_token (a mention weighs one token of the LM loss).",
    "decoder_target": "What the decoder writes: passage (the paper, BART's denoising: the whole passage) or masked_spans (T5's span corruption: each masked run after a <mask>, masked mentions with their markers), so that a fact is recalled from what the encoder read rather than the decoder's own prefix.",
    "number_mask_prob": "Per-number whole-span mask rate: dates and numbers as salient spans, as in REALM (paper and default: 0, numbers masked token by token at P_rtm).",
    "eval_seed": "Fixed masking seed of the validation split.",
    "max_steps_this_run": "Stop (without saving) after this many optimizer steps in this run: simulates a kill.",
    "progress_seconds": "Without a bar: a progress line (step, loss, time left) at most every N seconds.",
}
_EXPERT = {"help": argparse.SUPPRESS}


@dataclass
class PretrainingArguments:
    """Options of `edmem pretrain` (also the argument of `pretrain`). Architecture options left unset take the
    `--preset`'s values, or else the `EDMemConfig` defaults (the paper's edmem-large widths and depths)."""

    output_dir: str = field(metadata={"help": "Where checkpoints, log.jsonl and the final model go."})
    corpus_dir: str | None = field(
        default=None,
        metadata={"help": "Output of `edmem build-corpus`: passages/, entity_vocab.json, tokenizer/."},
    )
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Start from this EDMem checkpoint directory instead of a new model."}
    )
    config_name: str | None = field(
        default=None, metadata={"help": "An EDMemConfig JSON to build a new model from (overridden by the options)."}
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Tokenizer directory; default: CORPUS_DIR/tokenizer."}
    )
    preset: str | None = field(
        default=None,
        metadata={"help": "Build a new model from this preset (edmem-base, edmem-large; the authors' settings)."},
    )
    # --- architecture of a new model (None: the preset's value or the EDMemConfig default) ---
    d_model: int | None = field(default=None, metadata={"help": "Hidden width (BART-large: 1024)."})
    encoder_lower_layers: int | None = field(
        default=None, metadata={"help": "Encoder layers below the memory read (paper: 4)."}
    )
    encoder_upper_layers: int | None = field(
        default=None, metadata={"help": "Encoder layers above the memory read (paper: 8)."}
    )
    decoder_lower_layers: int | None = field(
        default=None, metadata={"help": "Decoder layers below the memory read (paper: 4)."}
    )
    decoder_upper_layers: int | None = field(
        default=None, metadata={"help": "Decoder layers above the memory read (paper: 8)."}
    )
    encoder_ffn_dim: int | None = field(default=None, metadata={"help": "Encoder feed-forward width."})
    decoder_ffn_dim: int | None = field(default=None, metadata={"help": "Decoder feed-forward width."})
    encoder_attention_heads: int | None = field(default=None, metadata={"help": "Encoder attention heads."})
    decoder_attention_heads: int | None = field(default=None, metadata={"help": "Decoder attention heads."})
    entity_embed_dim: int | None = field(default=None, metadata={"help": "Entity embedding width (paper: 256)."})
    entity_key_dim: int | None = field(
        default=None,
        metadata=_EXPERT,
    )
    max_position_embeddings: int | None = field(
        default=None, metadata={"help": "Longest sequence the position embeddings cover."}
    )
    dropout: float | None = field(default=None, metadata={"help": "Dropout (paper: 0.1)."})
    entity_loss_weight: float | None = field(default=None, metadata={"help": "lambda_EL (paper: 1.0)."})
    entity_loss_reduction: str | None = field(
        default=None,
        metadata=_EXPERT,
    )
    variant: str | None = field(default=None, metadata={"help": "edmem | encdec | encmem."})
    # --- masking ---
    random_mask_prob: float = field(default=0.3, metadata={"help": "P_rtm: per-token mask rate."})
    mention_mask_prob: float = field(default=0.5, metadata={"help": "P_ssm: per-mention whole-span mask rate."})
    decoder_target: str = field(
        default="passage",
        metadata=_EXPERT,
    )
    number_mask_prob: float = field(
        default=0.0,
        metadata=_EXPERT,
    )
    # --- optimisation ---
    per_device_train_batch_size: int = field(default=8, metadata={"help": "Training passages per process per step."})
    per_device_eval_batch_size: int = field(default=8, metadata={"help": "Validation passages per process per batch."})
    gradient_accumulation_steps: int = field(
        default=1, metadata={"help": "Micro-batches summed into one optimizer step."}
    )
    learning_rate: float = field(default=1e-4, metadata={"help": "Peak learning rate (the authors' runs: 1e-4)."})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay (the authors' runs: 0.01)."})
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1."})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW beta2."})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "AdamW epsilon."})
    adam_fused: bool = field(
        default=True,
        metadata={
            "help": "Fused AdamW kernel (2-3x faster update of the entity table on CPU); falls back if unsupported."
        },
    )
    max_grad_norm: float = field(
        default=0.1, metadata={"help": "Gradient clipping (the authors' runs: 0.1); <= 0 disables it."}
    )
    warmup_ratio: float = field(default=0.1, metadata={"help": "Share of max_steps spent warming up."})
    max_steps: int = field(default=-1, metadata={"help": "Optimizer steps; <= 0: num_train_epochs epochs."})
    num_train_epochs: float = field(default=1.0, metadata={"help": "Epochs over the passages when max_steps <= 0."})
    mixed_precision: str = field(default="no", metadata={"help": "no | fp16 | bf16."})
    seed: int = field(default=42, metadata={"help": "Seed of the initialisation, data order and masking."})
    # --- evaluation, logging, checkpoints ---
    eval_steps: int = field(
        default=1000, metadata={"help": "Evaluate every N optimizer steps; <= 0: only at the end."}
    )
    eval_seed: int = field(default=1234, metadata=_EXPERT)
    max_eval_samples: int | None = field(default=None, metadata={"help": "Evaluate on the first N passages."})
    logging_steps: int = field(default=10, metadata={"help": "Log the training losses every N optimizer steps."})
    save_steps: int = field(default=1000, metadata={"help": "Save a checkpoint every N optimizer steps."})
    save_total_limit: int | None = field(default=3, metadata={"help": "Keep the last K checkpoints."})
    resume: str = field(
        default="auto",
        metadata={
            "help": "auto: continue from the last complete checkpoint in OUTPUT_DIR/checkpoints if there is one; "
            "no: start afresh (refused if checkpoints exist, unless --overwrite_output_dir); or a checkpoint path."
        },
    )
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "With --resume no: delete the checkpoints and log of OUTPUT_DIR first."}
    )
    report_to: str = field(
        default="auto",
        metadata={"help": "auto (tensorboard if installed) | none | tensorboard | wandb | comma list."},
    )
    dataloader_num_workers: int = field(
        default=0, metadata={"help": "Worker processes loading batches (0: in the training process)."}
    )
    max_steps_this_run: int | None = field(
        default=None,
        metadata=_EXPERT,
    )
    disable_tqdm: bool = field(
        default=False,
        metadata={
            "help": "No progress bar on a terminal: progress lines instead, as in a log that is not a terminal."
        },
    )
    progress_seconds: float = field(
        default=10.0,
        metadata=_EXPERT,
    )

    def __post_init__(self) -> None:
        if self.mixed_precision not in ("no", "fp16", "bf16"):
            raise ValueError(f"mixed_precision must be no, fp16 or bf16, got {self.mixed_precision!r}")
        for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.warmup_ratio <= 1.0:
            raise ValueError(f"warmup_ratio must be in [0, 1], got {self.warmup_ratio}")
        if self.logging_steps < 1 or self.save_steps < 1:
            raise ValueError("logging_steps and save_steps must be >= 1")
        if self.save_total_limit is not None and self.save_total_limit < 1:
            raise ValueError(f"save_total_limit must be >= 1 or unset, got {self.save_total_limit}")
        if self.preset is not None:
            from .presets import preset_settings

            preset_settings(self.preset)  # an unknown name fails here, not after the corpus is loaded


# --- data ------------------------------------------------------------------------------------------------


class _EpochShuffleSampler(Sampler):
    """Yields `(epoch, index)`: a permutation seeded by `seed + epoch`, so the order is a function of the epoch.

    The epoch travels with each index so that the masking seed (collator) sees it, even in worker processes.
    """

    def __init__(self, num_samples: int, seed: int, shuffle: bool = True):
        self.num_samples = num_samples
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.num_samples, generator=g).tolist()
        else:
            order = range(self.num_samples)
        for i in order:
            yield (self.epoch, i)

    def __len__(self) -> int:
        return self.num_samples


class _IndexedPassages(Dataset):
    """A corpus split seen through `(epoch, index)` keys; adds `example_index` and `epoch` for the collator.

    `fixed_epoch` pins the epoch (evaluation: accelerate bumps the sampler's epoch at every pass). `order`: the
    split's passages an epoch reads, some of them more than once (`balanced_order`); default each once.
    """

    def __init__(self, data: Any, fixed_epoch: int | None = None, order: np.ndarray | None = None):
        missing = {"input_ids", "entity_labels"} - set(
            getattr(data, "column_names", None) or ["input_ids", "entity_labels"]
        )
        if missing:
            raise ValueError(f"the corpus split lacks the column(s) {sorted(missing)}")
        self.data = data
        self.fixed_epoch = fixed_epoch
        self.order = order

    def __len__(self) -> int:
        return len(self.data) if self.order is None else len(self.order)

    def __getitem__(self, key: tuple[int, int] | int) -> dict[str, Any]:
        epoch, index = key if isinstance(key, tuple) else (0, key)
        if self.fixed_epoch is not None:
            epoch = self.fixed_epoch
        if self.order is not None:
            index = self.order[index]
        row = self.data[int(index)]
        return {
            "input_ids": row["input_ids"],
            "entity_labels": row.get("entity_labels"),
            "example_index": int(index),
            "epoch": epoch,
        }


def load_corpus(corpus_dir: str) -> tuple[Any, Any, Any]:
    """Reads an `edmem build-corpus` directory: (DatasetDict of passages, EntityVocab, tokenizer)."""
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from .entity_vocab import EntityVocab

    passages_dir = os.path.join(corpus_dir, "passages")
    if not os.path.isdir(passages_dir):
        raise ValueError(f"{corpus_dir} is not an EDMem corpus: no passages/ directory (run `edmem build-corpus`)")
    if not os.path.isfile(os.path.join(corpus_dir, "entity_vocab.json")):
        raise ValueError(f"{corpus_dir} is not a whole EDMem corpus: no entity_vocab.json (run `edmem build-corpus`)")
    passages = load_from_disk(passages_dir)
    if "train" not in passages:
        raise ValueError(f"{passages_dir} has no 'train' split (splits: {list(passages)})")
    vocab = EntityVocab.load(corpus_dir)
    tokenizer_dir = os.path.join(corpus_dir, "tokenizer")
    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    except Exception as err:  # a broken tokenizer.json raises json's or tokenizers' errors, which name no file
        raise ValueError(f"tokenizer directory {tokenizer_dir!r} could not be loaded: {err}") from err
    return passages, vocab, tokenizer


# --- model -----------------------------------------------------------------------------------------------

_ARCH_FIELDS = (
    "d_model",
    "encoder_lower_layers",
    "encoder_upper_layers",
    "decoder_lower_layers",
    "decoder_upper_layers",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "entity_embed_dim",
    "entity_key_dim",
    "max_position_embeddings",
    "dropout",
    "entity_loss_weight",
    "entity_loss_reduction",
    "variant",
)
# options a checkpoint given with --model_name_or_path takes anew (no weight changes shape); the others are its shape
_CHECKPOINT_OVERRIDABLE = ("dropout", "entity_loss_weight", "entity_loss_reduction", "writer_mean_row_probability")


def _architecture(args: PretrainingArguments, writer: Any = None) -> dict[str, Any]:
    """The architecture options given: `args`'s, and the writer's model options (`writer_training.MODEL_OPTIONS`)."""
    from .research.writer_training import MODEL_OPTIONS

    given = {name: getattr(args, name) for name in _ARCH_FIELDS}
    given.update({name: getattr(writer, name) for name in MODEL_OPTIONS} if writer is not None else {})
    return {name: value for name, value in given.items() if value is not None}


_TOKENIZER_IDS = ("vocab_size", "entity_vocab_size", "entity_start_token_id", "entity_end_token_id", "pad_token_id",
                  "bos_token_id", "eos_token_id", "decoder_start_token_id", "forced_eos_token_id")  # fmt: skip


def build_config(args: PretrainingArguments, tokenizer: Any, entity_vocab_size: int, writer: Any = None) -> Any:
    """An EDMemConfig from the options: widths from `args` (and the writer's model options from `writer`), N from the
    entity vocabulary, ids from the tokenizer."""
    from .configuration_edmem import EDMemConfig

    kwargs: dict[str, Any] = {}
    if args.preset:
        from .presets import preset_settings

        kwargs.update(preset_settings(args.preset))
    if args.config_name:
        with open(args.config_name, encoding="utf-8") as f:
            kwargs.update(json.load(f))
        for key in ("model_type", "transformers_version", "architectures", "encoder_layers", "decoder_layers"):
            kwargs.pop(key, None)
    kwargs.update(_architecture(args, writer))
    for key in _TOKENIZER_IDS:  # the tokenizer's and the vocabulary's, whatever a preset or a config file says
        kwargs.pop(key, None)
    config = EDMemConfig.from_tokenizer(tokenizer, entity_vocab_size, **kwargs)
    if hasattr(config, "validate_architecture"):
        config.validate_architecture()
    return config


def build_model(args: PretrainingArguments, tokenizer: Any, entity_vocab: Any, writer: Any = None) -> Any:
    """A new EDMem from the options, or the checkpoint at `--model_name_or_path`, in its variant's class with heads
    (`modeling_edmem.MODEL_WITH_HEADS`): `EDMemForConditionalGeneration`, `EDMemEncDecForConditionalGeneration`
    (`encdec`) or `EDMemForEntityLinking` (`encmem`)."""
    from .configuration_edmem import EDMemConfig
    from .modeling_edmem import MODEL_WITH_HEADS

    if args.model_name_or_path:
        config = _checkpoint_config(args, EDMemConfig.from_pretrained(args.model_name_or_path), writer)
    else:
        config = build_config(args, tokenizer, len(entity_vocab), writer)
    model_class = MODEL_WITH_HEADS[config.variant]
    if not args.model_name_or_path:
        model = model_class(config)
    else:
        model = model_class.from_pretrained(args.model_name_or_path, config=config)
        n = model.config.entity_vocab_size
        if entity_vocab is not None and len(entity_vocab) != n:
            raise ValueError(
                f"{args.model_name_or_path} has {n} entities but the corpus vocabulary has {len(entity_vocab)}"
            )
        if model.config.vocab_size < len(tokenizer):
            raise ValueError(
                f"{args.model_name_or_path} has {model.config.vocab_size} tokens but the tokenizer has {len(tokenizer)}"
            )
    if entity_vocab is not None:
        model.entity_vocab = entity_vocab
    return model


def _checkpoint_config(args: PretrainingArguments, config: Any, writer: Any = None) -> Any:
    """The config of the checkpoint at `--model_name_or_path` with the training options given anew
    (`_CHECKPOINT_OVERRIDABLE`). Any other architecture option that differs from the checkpoint's, or a preset or
    config file beside it, is refused: it would otherwise be ignored in silence."""
    where = args.model_name_or_path
    if args.preset or args.config_name:
        raise ValueError(
            f"--preset and --config_name build a new model: leave them out with --model_name_or_path {where}"
        )
    for name, given in _architecture(args, writer).items():
        saved = getattr(config, name, None)
        if given == saved:
            continue
        if name not in _CHECKPOINT_OVERRIDABLE:
            raise ValueError(
                f"--{name} {given}: the checkpoint at {where} has {name}={saved}, and a checkpoint keeps its "
                f"architecture; leave --{name} out (only {', '.join(_CHECKPOINT_OVERRIDABLE)} may change)"
            )
        setattr(config, name, given)
    return config


def _parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: no weight decay on biases, LayerNorm weights (1-d parameters)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if param.ndim < 2 or name.endswith(".bias") or "layer_norm" in name.lower() or "layernorm" in name.lower():
            no_decay.append(param)
        else:
            decay.append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _shard_token_embeddings_together(model: torch.nn.Module, accelerator: Any) -> None:
    """One FSDP2 group for every module that holds the token embeddings, before Accelerate wraps the rest.

    `fully_shard` wants each parameter in exactly one group. Accelerate groups the input embeddings
    (`model.shared`) with the tied output ones (`lm_head`), but BART's encoder and decoder hold the same weight in
    their own `embed_tokens`, which would fall to the root group as well: `fully_shard` then refuses the model at
    its first forward ("... is shared with a parameter already managed by another FSDP group"). The entity table
    needs nothing: the memories read its weight directly, so all its holders stay in the root group, which is
    gathered for the whole forward. Like Accelerate's own embedding group, this one stays gathered from its
    first use to the backward."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    tied = {id(m.weight) for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None}
    holders = [m for m in model.modules() if any(id(p) in tied for p in m.parameters(recurse=False))]
    if len(holders) > 1:
        plugin, mesh = accelerator.state.fsdp_plugin, getattr(accelerator, "torch_device_mesh", None)
        fully_shard(  # the settings Accelerate gives its own groups
            holders,
            reshard_after_forward=False,
            offload_policy=plugin.cpu_offload,
            mp_policy=plugin.mixed_precision_policy or MixedPrecisionPolicy(),
            mesh=mesh[tuple(accelerator.parallelism_config.fsdp_dim_names)] if mesh is not None else None,
        )


def _gather_entity_reads_with_the_model(model: torch.nn.Module) -> None:
    """DeepSpeed ZeRO-3 gathers a parameter only while the module that owns it runs, or when a forward reads it
    through its module's attribute (as the memories read the entity table). The anchor term of the entity loss
    (`_mean_entity_loss`) goes over the memories' and the entity-linking head's parameters with `parameters()` once
    those modules have run, and meets them partitioned again: the first backward fails ("SumBackward0 returned an
    invalid gradient"). Declared the whole model's, they and the entity table (read outside its `nn.Embedding`)
    stay gathered through the model's forward and backward, as the table does in FSDP's root unit."""
    import deepspeed

    from .modeling_edmem import EntityLinkingHead, EntityMemory

    tables = [param for name, param in model.named_parameters() if name.endswith("entity_embeddings.weight")]
    readers = [module for module in model.modules() if isinstance(module, (EntityMemory, EntityLinkingHead))]
    for param in [*tables, *(param for module in readers for param in module.parameters())]:
        deepspeed.zero.register_external_parameter(model, param)


def _adamw(model: torch.nn.Module, args: PretrainingArguments) -> torch.optim.AdamW:
    """AdamW with the paper's settings; the fused kernel when asked for and available (else the foreach one)."""
    kwargs = dict(lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon)
    if args.adam_fused:
        try:
            return torch.optim.AdamW(_parameter_groups(model, args.weight_decay), fused=True, **kwargs)
        except (RuntimeError, ValueError) as err:
            logger.warning("fused AdamW unavailable (%s): using the foreach implementation", err)
    return torch.optim.AdamW(_parameter_groups(model, args.weight_decay), **kwargs)


# --- checkpoints -----------------------------------------------------------------------------------------


def _checkpoint_dirs(output_dir: str) -> list[tuple[int, str]]:
    """Accelerate's `checkpoint_<i>` directories under OUTPUT_DIR/checkpoints, as (i, path), by save number."""
    root = os.path.join(output_dir, CHECKPOINT_DIR)
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        match = _CHECKPOINT_NAME.match(name)
        if match:
            found.append((int(match.group(1)), os.path.join(root, name)))
    return sorted(found)


def _is_complete(checkpoint: str) -> bool:
    return os.path.isfile(os.path.join(checkpoint, TRAINER_STATE_NAME))


def list_checkpoints(output_dir: str) -> list[str]:
    """Complete checkpoints (with trainer_state.json, which is written last) in OUTPUT_DIR/checkpoints, oldest first."""
    return [path for _, path in _checkpoint_dirs(output_dir) if _is_complete(path)]


def _resolve_resume(args: PretrainingArguments) -> str | None:
    """The checkpoint that `--resume auto | no | PATH` designates, or None to start afresh. Refuses the `step-N`
    checkpoints of earlier versions of this loop (they lack its Accelerate state) unless the run deletes them."""
    if args.resume not in ("auto", "no") and _OLD_CHECKPOINT_NAME.match(
        os.path.basename(os.path.normpath(args.resume))
    ):
        raise ValueError(
            f"--resume {args.resume}: a step-N checkpoint of an earlier version of edmem pretrain cannot be resumed "
            "(it has no Accelerate state); start afresh with --resume no"
        )
    resolved = _designated_checkpoint(args)
    root = os.path.join(args.output_dir, CHECKPOINT_DIR)
    old = sorted(
        (int(match.group(1)), name)
        for name in (os.listdir(root) if os.path.isdir(root) else [])
        if (match := _OLD_CHECKPOINT_NAME.match(name))
    )
    if old and not (resolved is None and args.overwrite_output_dir):  # --overwrite_output_dir deletes them
        raise ValueError(
            f"{root} holds step-N checkpoints of an earlier version of edmem pretrain ({', '.join(n for _, n in old)}), "
            "which cannot be resumed (they have no Accelerate state) and would count against --save_total_limit: "
            f"move them out of {root}, or start afresh with --resume no --overwrite_output_dir (which deletes them)"
        )
    return resolved


def _designated_checkpoint(args: PretrainingArguments) -> str | None:
    checkpoints = list_checkpoints(args.output_dir)
    if args.resume == "auto":
        return checkpoints[-1] if checkpoints else None
    if args.resume == "no":
        if checkpoints and not args.overwrite_output_dir:
            raise ValueError(
                f"{args.output_dir} already has checkpoints; use --resume auto to continue, or "
                "--overwrite_output_dir to start afresh"
            )
        return None
    if not _is_complete(args.resume):
        raise ValueError(f"--resume {args.resume}: not a complete checkpoint (no {TRAINER_STATE_NAME})")
    return args.resume


def _remove_incomplete_checkpoints(output_dir: str) -> None:
    """Deletes checkpoint directories left without trainer_state.json by a run that died while saving: they are
    never resumed from, and Accelerate would count them against `total_limit` and refuse to save over them."""
    for _, path in _checkpoint_dirs(output_dir):
        if not _is_complete(path):
            logger.warning("skipping the incomplete checkpoint %s (no %s): deleting it", path, TRAINER_STATE_NAME)
            shutil.rmtree(path)


@dataclass
class _Progress:
    """Where the run is, saved and restored with the Accelerate state (`register_for_checkpointing`)."""

    global_step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # micro-batches of the epoch already trained on, per process
    num_processes: int = 1

    def state_dict(self) -> dict[str, int]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, int]) -> None:
        for name, value in state.items():
            setattr(self, name, value)


# --- evaluation ------------------------------------------------------------------------------------------


def _access_hits(access: Any, gold_labels: torch.Tensor, chosen: torch.Tensor, shift: int) -> tuple[torch.Tensor, ...]:
    """Per-example (correct, counted) top-1 hits of an `EntityMemoryAccess` on the chosen mentions.

    `shift` maps an access position to the gold position: 1 for decoder accesses (their positions are on the
    decoder input, i.e. labels shifted right), 0 for encoder accesses.
    """
    batch = gold_labels.shape[0]
    correct = torch.zeros(batch, dtype=torch.float64, device=gold_labels.device)
    counted = torch.zeros_like(correct)
    ids = getattr(access, "top_entity_ids", None)
    positions = getattr(access, "positions", None)
    if ids is None or positions is None or ids.numel() == 0:
        return correct, counted
    rows = positions[:, 0].to(gold_labels.device)
    cols = positions[:, 1].to(gold_labels.device) - shift
    valid = cols >= 0
    rows, cols, top1 = rows[valid], cols[valid], ids[valid, 0].to(gold_labels.device)
    gold = gold_labels[rows, cols]
    use = chosen[rows, cols] & (gold != IGNORE_INDEX)
    correct.index_add_(0, rows, ((top1 == gold) & use).double())
    counted.index_add_(0, rows, use.double())
    return correct, counted


@torch.no_grad()
def evaluate(model: Any, dataloader: Any, accelerator: Any) -> dict[str, float]:
    """The paper's pre-training metrics on the validation split.

    - `eval_ppl`: exp of the mean NLL over the masked target positions only (input token != original token);
    - `eval_acc`: top-1 accuracy of the entity-linking head (decoder, at each target `<E_s>`) on linked
      mentions whose tokens were salient-span-masked in the input;
    - `eval_encoder_acc`: the same for the encoder's memory read at the masked input mention (EaE-style);
    - `eval_loss`, `eval_lm_loss`, `eval_entity_loss`: the model's losses, averaged over batches.
    """
    was_training = model.training
    model.eval()
    # nll, masked tokens, EL-head hits, EL-head mentions, encoder-memory hits, encoder-memory mentions
    totals = torch.zeros(6, dtype=torch.float64, device=accelerator.device)
    loss_sums = torch.zeros(3, dtype=torch.float64, device=accelerator.device)
    batches = 0
    for batch in dataloader:
        if "salient_span_mask" not in batch:
            raise ValueError("evaluate() needs batches from EDMemMaskingCollator(..., return_salient_span_mask=True)")
        span_mask = batch.pop("salient_span_mask")
        decoder_span_mask, scored = batch.pop("decoder_salient_span_mask"), batch.pop("scored_target")
        encoder_only = _is_encoder_only(model, accelerator)
        outputs = model(**_model_inputs(batch, encoder_only), output_attended_entities=True)  # top-1 of each access
        labels = batch["labels"]
        logits = outputs.logits.float()
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1).clamp(min=0), reduction="none"
        ).view_as(labels)
        per_example = [
            (nll * scored).sum(dim=1).double(),
            scored.sum(dim=1).double(),
        ]
        # The entity-linking head reads each target <E_s> (decoder side; EncMem: the input's), the encoder memory
        # each input <E_s>.
        if encoder_only:
            per_example += _access_hits(outputs.linked_entities, batch["entity_labels"], span_mask, shift=0)
            per_example += _access_hits(outputs.attended_entities, batch["entity_labels"], span_mask, shift=0)
        else:
            per_example += _access_hits(
                outputs.linked_entities, batch["decoder_entity_labels"], decoder_span_mask, shift=1
            )
            per_example += _access_hits(outputs.encoder_attended_entities, batch["entity_labels"], span_mask, shift=0)
        stacked = torch.stack(per_example, dim=1)
        totals += accelerator.gather_for_metrics(stacked).sum(dim=0)
        losses = torch.stack(
            [_scalar(outputs, "loss"), _scalar(outputs, "lm_loss"), _scalar(outputs, "entity_loss")]
        ).to(accelerator.device)
        loss_sums += accelerator.reduce(losses, reduction="mean")
        batches += 1
    if was_training:
        model.train()
    nll_sum, masked_n, correct_n, mention_n, enc_correct, enc_n = totals.tolist()
    result = {
        "eval_ppl": math.exp(nll_sum / masked_n) if masked_n else float("nan"),
        "eval_acc": correct_n / mention_n if mention_n else float("nan"),
        "eval_encoder_acc": enc_correct / enc_n if enc_n else float("nan"),
        "eval_masked_tokens": int(masked_n),
        "eval_masked_mentions": int(mention_n),
    }
    for name, value in zip(("eval_loss", "eval_lm_loss", "eval_entity_loss"), loss_sums.tolist()):
        result[name] = value / batches if batches else float("nan")
    return result


def _is_encoder_only(model: Any, accelerator: Any) -> bool:
    from .modeling_edmem import EDMemForEntityLinking

    return isinstance(accelerator.unwrap_model(model), EDMemForEntityLinking)


def _model_inputs(batch: dict[str, torch.Tensor], encoder_only: bool) -> dict[str, torch.Tensor]:
    """The batch as the model takes it. EncMem has no decoder: its masked-LM labels are the original sequence,
    aligned with the input and scored at every token (the authors' default), and it has no decoder entity labels."""
    return {k: v for k, v in batch.items() if k != "decoder_entity_labels"} if encoder_only else batch


def _scalar(outputs: Any, name: str) -> torch.Tensor:
    value = getattr(outputs, name, None)
    if value is None:
        return torch.tensor(0.0, dtype=torch.float64)
    return value.detach().double().reshape(())


# --- the loop --------------------------------------------------------------------------------------------


def _trackers(report_to: str) -> list[str]:
    import importlib.util

    wanted = [t.strip().lower() for t in (report_to or "none").split(",") if t.strip()]
    if wanted == ["none"]:
        return []
    have = {
        "tensorboard": any(importlib.util.find_spec(m) for m in ("tensorboard", "tensorboardX")),
        "wandb": importlib.util.find_spec("wandb") is not None,
    }
    if wanted == ["auto"]:
        return ["tensorboard"] if have["tensorboard"] else []
    out = []
    for name in wanted:
        if name not in have:
            raise ValueError(f"--report_to: unknown tracker {name!r} (tensorboard, wandb, none, auto)")
        if not have[name]:
            logger.warning("--report_to %s: not installed, logging to log.jsonl only", name)
            continue
        out.append(name)
    return out


class _JsonlLog:
    def __init__(self, path: str, enabled: bool):
        self.path = path
        self.enabled = enabled

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def _load_inputs(
    args: PretrainingArguments, model: Any, tokenizer: Any, datasets: Any, entity_vocab: Any
) -> tuple[Any, Any, Any]:
    """(tokenizer, datasets, entity vocabulary): those given to `pretrain`, the rest read from `--corpus_dir`
    (a given model may bring its own vocabulary)."""
    if datasets is None or tokenizer is None or (entity_vocab is None and model is None):
        if not args.corpus_dir:
            raise ValueError("--corpus_dir is required (or pass datasets, tokenizer and entity_vocab)")
        corpus, corpus_vocab, corpus_tokenizer = load_corpus(args.corpus_dir)
        datasets = corpus if datasets is None else datasets
        entity_vocab = corpus_vocab if entity_vocab is None else entity_vocab
        tokenizer = corpus_tokenizer if tokenizer is None else tokenizer
    if args.tokenizer_name:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_name)
    return tokenizer, datasets, entity_vocab


def _given_or_new_model(
    args: PretrainingArguments, model: Any, tokenizer: Any, entity_vocab: Any, writer: Any = None
) -> Any:
    """The model passed to `pretrain` (its entity table checked against the vocabulary), else `build_model`."""
    if model is None:
        return build_model(args, tokenizer, entity_vocab, writer)
    if entity_vocab is not None and hasattr(getattr(model, "config", None), "entity_vocab_size"):
        if len(entity_vocab) != model.config.entity_vocab_size:
            raise ValueError(
                f"the model has {model.config.entity_vocab_size} entities but the vocabulary has {len(entity_vocab)}"
            )
        model.entity_vocab = entity_vocab
    return model


def _dataloaders(
    args: PretrainingArguments,
    datasets: Any,
    tokenizer: Any,
    num_processes: int,
    model: Any = None,
    writer: Any = None,
    mixing: Any = None,
) -> tuple[_EpochShuffleSampler, DataLoader, DataLoader | None]:
    """The train loader (every process reads the whole seeded order; Accelerate shards its batches), its sampler,
    and the validation loader (fixed masks), if there is a validation split. `mixing`
    (`research.example_mixing.ExampleMixingArguments`) mixes other examples into the batches; a model with a writer of
    entity rows trains on batches that read written rows (`writer`: `research.writer_training`)."""
    from .modeling_edmem import EDMemForEntityLinking
    from .research import example_mixing, writer_training

    writer = writer or writer_training.WriterTrainingArguments()
    mixing = mixing or example_mixing.ExampleMixingArguments()
    if args.decoder_target != "passage" and isinstance(model, EDMemForEntityLinking):
        raise ValueError(f"--decoder_target {args.decoder_target} needs a decoder: EncMem predicts at the input")
    balanced = example_mixing.balanced_passages(mixing, datasets["train"], model)
    train_set = _IndexedPassages(datasets["train"], order=None if balanced is None else balanced[0])
    if len(train_set) < args.per_device_train_batch_size * num_processes:
        raise ValueError(
            f"the train split has {len(train_set)} passages, fewer than one global batch "
            f"({args.per_device_train_batch_size} x {num_processes} processes)"
        )
    # Masking seeds differ from the data-order seed; train and eval masks are independent.
    train_collator = EDMemMaskingCollator(
        tokenizer,
        args.random_mask_prob,
        args.mention_mask_prob,
        seed=args.seed + 1_000_003,
        number_mask_prob=args.number_mask_prob,
        decoder_target=args.decoder_target,
    )
    train_set, train_collator = example_mixing.with_questions(
        mixing, train_set, train_collator, tokenizer, model, None if balanced is None else balanced[1]
    )
    if getattr(getattr(model, "config", None), "entity_row_writer", False):  # questions too read written rows
        train_collator = writer_training.writer_collator(
            writer, train_collator, datasets["train"], tokenizer, model, args.seed
        )
    elif given := writer.given():
        raise ValueError(f"--{given[0]} is an option of training the writer of entity rows; the model has none "
                         "(--entity_row_writer true)")  # fmt: skip
    sampler = _EpochShuffleSampler(len(train_set), seed=args.seed)
    train_dl = DataLoader(
        train_set,
        batch_size=args.per_device_train_batch_size,
        sampler=sampler,
        collate_fn=train_collator,
        drop_last=True,
        num_workers=args.dataloader_num_workers,
        generator=torch.Generator().manual_seed(args.seed),  # keeps iterator creation off the global RNG
    )
    if "validation" not in datasets:
        return sampler, train_dl, None
    eval_data = datasets["validation"]
    if args.max_eval_samples is not None:
        eval_data = eval_data.select(range(min(args.max_eval_samples, len(eval_data))))
    eval_collator = EDMemMaskingCollator(
        tokenizer,
        args.random_mask_prob,
        args.mention_mask_prob,
        seed=args.eval_seed,
        return_salient_span_mask=True,
        number_mask_prob=args.number_mask_prob,
        decoder_target=args.decoder_target,
    )
    eval_dl = DataLoader(
        _IndexedPassages(eval_data, fixed_epoch=0),  # the same masks at every evaluation
        batch_size=args.per_device_eval_batch_size,
        sampler=_EpochShuffleSampler(len(eval_data), seed=0, shuffle=False),
        collate_fn=eval_collator,
        num_workers=args.dataloader_num_workers,
        generator=torch.Generator().manual_seed(0),
    )
    return sampler, train_dl, eval_dl


class _PretrainingRun:
    """One `pretrain` call: `__init__` sets up (accelerator, data, model, optimiser, resume), `train` runs the
    optimizer steps, `finish` evaluates and saves the model."""

    def __init__(
        self,
        args: PretrainingArguments,
        model: Any,
        tokenizer: Any,
        datasets: Any,
        entity_vocab: Any,
        writer: Any = None,
        mixing: Any = None,
    ):
        from accelerate import Accelerator, PartialState
        from accelerate.utils import DataLoaderConfiguration, DistributedType, ProjectConfiguration, set_seed
        from transformers import get_linear_schedule_with_warmup

        from .research import example_mixing, writer_training

        self.writer = writer = writer or writer_training.WriterTrainingArguments()
        self.mixing = mixing = mixing or example_mixing.ExampleMixingArguments()
        if writer.frozen_writer and model is None and not args.model_name_or_path:
            raise ValueError("--frozen_writer keeps a trained writer as it is: give it with --model_name_or_path")
        if args.mixed_precision == "fp16" and PartialState().device.type == "cpu":
            # Accelerate accepts it, then trains in float32 without a grad scaler under an "fp16" label.
            raise ValueError("--mixed_precision fp16 needs a GPU (on CPU it would train in float32); use bf16")
        tokenizer, datasets, entity_vocab = _load_inputs(args, model, tokenizer, datasets, entity_vocab)
        resume_from = _resolve_resume(args)
        self.args, self.tokenizer, self.entity_vocab = args, tokenizer, entity_vocab
        self.trackers = _trackers(args.report_to)
        self.accelerator = accelerator = Accelerator(
            gradient_accumulation_steps=args.gradient_accumulation_steps,
            mixed_precision=args.mixed_precision,
            log_with=self.trackers or None,
            project_config=ProjectConfiguration(
                project_dir=args.output_dir, automatic_checkpoint_naming=True, total_limit=args.save_total_limit
            ),
            step_scheduler_with_optimizer=False,
            dataloader_config=DataLoaderConfiguration(even_batches=True),
        )
        self._prepare_output_dir(resume_from)

        set_seed(args.seed)
        model = _given_or_new_model(args, model, tokenizer, entity_vocab, writer)
        self.sampler, train_dl, eval_dl = _dataloaders(
            args, datasets, tokenizer, accelerator.num_processes, model, writer, mixing
        )
        self.writer_collator = train_dl.collate_fn if hasattr(train_dl.collate_fn, "rows_to_write") else None
        sharded = accelerator.distributed_type in (DistributedType.DEEPSPEED, DistributedType.FSDP)
        if self.writer_collator is not None and sharded:
            raise ValueError("training the entity row writer runs on one process or DDP, not FSDP or DeepSpeed")
        if self.writer_collator is not None:
            writer_training.start_training(writer, model, self.writer_collator)
        self.batches_per_epoch = len(train_dl) // accelerator.num_processes or 1
        steps_per_epoch = max(math.ceil(self.batches_per_epoch / args.gradient_accumulation_steps), 1)
        self.max_steps = args.max_steps if args.max_steps > 0 else math.ceil(args.num_train_epochs * steps_per_epoch)
        if accelerator.is_fsdp2:
            _shard_token_embeddings_together(model, accelerator)
        elif accelerator.deepspeed_plugin is not None and accelerator.deepspeed_plugin.zero_stage == 3:
            _gather_entity_reads_with_the_model(model)
        optimizer = _adamw(model, args)
        scheduler = get_linear_schedule_with_warmup(optimizer, int(args.warmup_ratio * self.max_steps), self.max_steps)
        self.model, self.optimizer, self.train_dl, self.scheduler = accelerator.prepare(
            model, optimizer, train_dl, scheduler
        )
        self.eval_dl = accelerator.prepare(eval_dl) if eval_dl is not None else None
        self.encoder_only = _is_encoder_only(self.model, accelerator)  # once: 3% of a small step

        self.progress = _Progress(num_processes=accelerator.num_processes)
        accelerator.register_for_checkpointing(self.progress)
        self.state = self._new_trainer_state(math.ceil(self.max_steps / steps_per_epoch))
        if resume_from is not None:
            self._resume(resume_from)
        self.last_train: dict[str, Any] = {}
        self.last_eval: dict[str, Any] | None = None
        self._start_logging(resume_from)

    def _prepare_output_dir(self, resume_from: str | None) -> None:
        """Creates OUTPUT_DIR (emptied of checkpoints and log with --overwrite_output_dir), deletes incomplete
        checkpoints, and numbers the next checkpoint after the last one kept."""
        args, accelerator = self.args, self.accelerator
        if accelerator.is_main_process:
            os.makedirs(args.output_dir, exist_ok=True)
            if resume_from is None and args.overwrite_output_dir:
                shutil.rmtree(os.path.join(args.output_dir, CHECKPOINT_DIR), ignore_errors=True)
                if os.path.exists(os.path.join(args.output_dir, LOG_NAME)):
                    os.remove(os.path.join(args.output_dir, LOG_NAME))
            _remove_incomplete_checkpoints(args.output_dir)
        accelerator.wait_for_everyone()
        kept = _checkpoint_dirs(args.output_dir)
        # save_state writes checkpoint_<iteration> and refuses an existing directory: continue after the last one.
        accelerator.project_configuration.iteration = kept[-1][0] + 1 if kept else 0
        self.log = _JsonlLog(os.path.join(args.output_dir, LOG_NAME), accelerator.is_main_process)

    def _new_trainer_state(self, num_train_epochs: int) -> Any:
        from transformers import TrainerState

        return TrainerState(
            max_steps=self.max_steps,
            logging_steps=self.args.logging_steps,
            eval_steps=self.args.eval_steps,
            save_steps=self.args.save_steps,
            train_batch_size=self.args.per_device_train_batch_size,
            num_train_epochs=num_train_epochs,
            is_local_process_zero=self.accelerator.is_local_main_process,
            is_world_process_zero=self.accelerator.is_main_process,
        )

    def _resume(self, checkpoint: str) -> None:
        """Restores model, optimizer, scheduler, grad scaler, RNG states and `progress` (Accelerate's
        `load_state`), and the log history and best metric from trainer_state.json."""
        from transformers import TrainerState

        accelerator, progress = self.accelerator, self.progress
        accelerator.load_state(checkpoint)
        saved = TrainerState.load_from_json(os.path.join(checkpoint, TRAINER_STATE_NAME))
        self.state.log_history = saved.log_history
        self.state.best_metric, self.state.best_global_step = saved.best_metric, saved.best_global_step
        self.state.best_model_checkpoint = saved.best_model_checkpoint
        if saved.max_steps != self.max_steps:
            logger.warning(
                "resuming at step %d a run of %d steps as one of %d: its learning rate follows the schedule of %d "
                "steps from here, so the model is not the one a fresh run of %d steps would make",
                progress.global_step, saved.max_steps, self.max_steps, self.max_steps, self.max_steps,
            )  # fmt: skip
        if progress.num_processes != accelerator.num_processes:
            logger.warning(
                "resuming a %s-process run on %s processes: the run continues, but not bit-exactly",
                progress.num_processes,
                accelerator.num_processes,
            )
            progress.batch_in_epoch = progress.batch_in_epoch * progress.num_processes // accelerator.num_processes
            progress.num_processes = accelerator.num_processes
        accelerator.print(f"Resumed from {checkpoint} at step {progress.global_step}")

    def _start_logging(self, resume_from: str | None) -> None:
        if self.accelerator.is_main_process:
            with open(os.path.join(self.args.output_dir, ARGUMENTS_NAME), "w", encoding="utf-8") as f:
                json.dump({**asdict(self.args), **asdict(self.writer), **asdict(self.mixing)}, f, indent=1)
                f.write("\n")
        if self.trackers:
            self.accelerator.init_trackers(
                "edmem-pretraining",
                config={k: v for k, v in asdict(self.args).items() if isinstance(v, (int, float, str, bool))},
            )
        self.log.write(
            {
                "type": "start",
                "step": self.progress.global_step,
                "max_steps": self.max_steps,
                "num_processes": self.accelerator.num_processes,
                "distributed_type": str(self.accelerator.distributed_type),
                "mixed_precision": self.accelerator.mixed_precision,
                "resumed_from": resume_from,
                "time": time.time(),
            }
        )

    def train(self) -> bool:
        """Trains up to `max_steps` optimizer steps; False if `--max_steps_this_run` stopped it first."""
        from .progress import TrainingProgress

        args, accelerator, progress = self.args, self.accelerator, self.progress
        self.model.train()
        self._reset_window()
        steps_this_run = 0
        with TrainingProgress(
            self.max_steps,
            "pretrain",
            progress.global_step,
            enabled=accelerator.is_local_main_process,
            bar=not args.disable_tqdm,
            every_seconds=args.progress_seconds,
        ) as bar:
            while progress.global_step < self.max_steps:
                self.sampler.set_epoch(progress.epoch)
                self.train_dl.set_epoch(progress.epoch)
                seen = progress.batch_in_epoch  # on resume, the epoch's batches already trained on
                for batch in accelerator.skip_first_batches(self.train_dl, seen) if seen else self.train_dl:
                    self._forward_backward(batch)
                    progress.batch_in_epoch += 1
                    if not accelerator.sync_gradients:
                        continue
                    self.scheduler.step()
                    progress.global_step += 1
                    steps_this_run += 1
                    self._log_evaluate_save()
                    bar.update(progress.global_step, self.last_train.get("loss"))
                    if progress.global_step >= self.max_steps:
                        break
                    if args.max_steps_this_run is not None and steps_this_run >= args.max_steps_this_run:
                        return False
                else:
                    progress.epoch += 1
                    progress.batch_in_epoch = 0
        return True

    def _forward_backward(self, batch: dict[str, torch.Tensor]) -> None:
        """One micro-batch; the optimizer steps when Accelerate syncs the gradients (end of an accumulation)."""
        accelerator = self.accelerator
        with accelerator.accumulate(self.model):
            outputs = self.model(**_model_inputs(batch, self.encoder_only))
            accelerator.backward(outputs.loss)
            if accelerator.sync_gradients and self.args.max_grad_norm > 0:
                accelerator.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)
            self.optimizer.step()
            self.optimizer.zero_grad()
        for i, name in enumerate(("loss", "lm_loss", "entity_loss")):
            self.window[i] += _scalar(outputs, name).to(self.window.device)
        self.window[3] += 1
        self.window_tokens += batch["attention_mask"].sum().double()

    def _log_evaluate_save(self) -> None:
        step, args = self.progress.global_step, self.args
        if step % args.logging_steps == 0 or step == self.max_steps:
            self._log_train()
        if args.eval_steps > 0 and step % args.eval_steps == 0 and step < self.max_steps:
            self._evaluate()
        if step % args.save_steps == 0 or step == self.max_steps:
            self.save_checkpoint()

    def _reset_window(self) -> None:
        device = self.accelerator.device
        self.window = torch.zeros(4, dtype=torch.float64, device=device)  # loss, lm, entity sums; micro-batches
        self.window_tokens = torch.zeros((), dtype=torch.float64, device=device)
        self.window_start = time.perf_counter()

    def _log_train(self) -> None:
        """Losses averaged over the micro-batches of all processes since the last log; input tokens per second."""
        sums = self.accelerator.reduce(self.window, reduction="sum")
        tokens = self.accelerator.reduce(self.window_tokens, reduction="sum")
        elapsed = max(time.perf_counter() - self.window_start, 1e-9)
        micro_batches = max(float(sums[3]), 1.0)
        metrics = {name: float(sums[i]) / micro_batches for i, name in enumerate(("loss", "lm_loss", "entity_loss"))}
        metrics["learning_rate"] = self.scheduler.get_last_lr()[0]
        metrics["tokens_per_s"] = float(tokens) / elapsed
        self.last_train = self._record("train", metrics)
        self._reset_window()

    def _evaluate(self) -> None:
        """`evaluate` on the validation split, and the writer's reading signal when asked for
        (`research.reading_signal`); the lowest `eval_ppl` is the Trainer state's best metric."""
        if self.eval_dl is None:
            return
        metrics = evaluate(self.model, self.eval_dl, self.accelerator)
        if self.writer_collator is not None and self.writer.reading_signal_questions_file:
            from .research.reading_signal import reading_signal

            metrics.update(reading_signal(self.accelerator.unwrap_model(self.model), self.tokenizer,
                                          self.writer_collator, self.writer.reading_signal_questions_file,
                                          self.writer.reading_signal_facts_file))  # fmt: skip
        self.last_eval = self._record("eval", metrics)
        ppl, best = metrics["eval_ppl"], self.state.best_metric
        if not math.isnan(ppl) and (best is None or ppl < best):
            self.state.best_metric, self.state.best_global_step = ppl, self.progress.global_step

    def _record(self, kind: str, metrics: dict[str, float]) -> dict[str, Any]:
        """An entry of the log history (the Trainer's format: the metrics, `epoch`, `step`), also written to
        log.jsonl and the trackers."""
        progress = self.progress
        entry = {**metrics, "epoch": progress.epoch + progress.batch_in_epoch / self.batches_per_epoch}
        entry["step"] = progress.global_step
        self.state.log_history.append(entry)
        self.log.write({"type": kind, **entry})
        if self.trackers:
            self.accelerator.log(metrics, step=progress.global_step)
        return entry

    def save_checkpoint(self) -> None:
        """`save_state` into the next checkpoint_<i> (Accelerate names it, and deletes the oldest beyond
        --save_total_limit first); then, once every process has written its part, trainer_state.json, which
        marks the checkpoint complete."""
        checkpoint = str(self.accelerator.save_state())
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            if self.state.best_global_step == self.progress.global_step:
                self.state.best_model_checkpoint = checkpoint
            self._write_trainer_state(checkpoint)
        self.accelerator.wait_for_everyone()

    def _write_trainer_state(self, directory: str) -> None:
        progress = self.progress
        self.state.global_step = progress.global_step
        self.state.epoch = progress.epoch + progress.batch_in_epoch / self.batches_per_epoch
        path = os.path.join(directory, TRAINER_STATE_NAME)
        self.state.save_to_json(path + ".tmp")
        os.replace(path + ".tmp", path)

    def finish(self, completed: bool) -> dict[str, Any]:
        """After a completed run: the last evaluation, then the model, tokenizer and trainer_state.json in
        OUTPUT_DIR. Returns the summary of `pretrain`."""
        accelerator = self.accelerator
        if completed:
            self._evaluate()
            self._save_model()
            if accelerator.is_main_process:
                self._write_trainer_state(self.args.output_dir)
            self.log.write({"type": "end", "step": self.progress.global_step, "time": time.time()})
        else:
            self.log.write({"type": "stop", "step": self.progress.global_step, "reason": "max_steps_this_run"})
        # Unlike `end_training`, keeps the process group, so that `pretrain` may be called again in the same
        # distributed process; `cli_main` tears it down at exit.
        accelerator.wait_for_everyone()
        for tracker in accelerator.trackers:
            tracker.finish()
        return {
            "global_step": self.progress.global_step,
            "train": self.last_train,
            "eval": self.last_eval,
            "output_dir": self.args.output_dir,
            "completed": completed,
        }

    def _save_model(self) -> None:
        from accelerate.utils import DistributedType

        accelerator = self.accelerator
        accelerator.wait_for_everyone()
        unwrapped = accelerator.unwrap_model(self.model)
        if self.entity_vocab is not None and getattr(unwrapped, "entity_vocab", None) is None:
            unwrapped.entity_vocab = self.entity_vocab
        # Sharded engines (DeepSpeed ZeRO-3, FSDP) need the full state dict gathered; otherwise the model's own
        # save_pretrained knows its tied weights (token embeddings, entity table) best.
        sharded = accelerator.distributed_type in (DistributedType.DEEPSPEED, DistributedType.FSDP)
        state_dict = accelerator.get_state_dict(self.model) if sharded else None
        if self.writer_collator is not None:  # the rows the writer writes when training ends
            from .research.writer_training import finish_training

            finish_training(self.writer, unwrapped, self.writer_collator)
        with _as_unsharded_class(unwrapped):
            unwrapped.save_pretrained(
                self.args.output_dir,
                is_main_process=accelerator.is_main_process,
                save_function=accelerator.save,
                state_dict=state_dict,
            )
        if accelerator.is_main_process and self.tokenizer is not None:
            self.tokenizer.save_pretrained(self.args.output_dir)


@contextlib.contextmanager
def _as_unsharded_class(model: torch.nn.Module) -> Iterator[None]:
    """FSDP2's `fully_shard` swaps the model's class for a generated `FSDP<Class>` subclass. `save_pretrained` names
    the class in config.json (`architectures`, `auto_map`) and copies the file that defines it as the Hub's custom
    code: under FSDP2 it would write torch's FSDP files instead of modeling_edmem.py. The model is seen as its own
    class for the save (its parameters are not touched: the gathered state dict is what is written)."""
    sharded_class = type(model)
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule):
        yield
        return
    model.__class__ = next(c for c in sharded_class.__mro__ if not issubclass(c, FSDPModule))
    try:
        yield
    finally:
        model.__class__ = sharded_class


def pretrain(
    args: PretrainingArguments,
    model: Any = None,
    tokenizer: Any = None,
    datasets: Any = None,
    entity_vocab: Any = None,
    *,
    writer: Any = None,
    mixing: Any = None,
) -> dict[str, Any]:
    """Pre-trains EDMem; returns a summary (`global_step`, last train and eval log entries, `output_dir`,
    `completed`).

    `model`, `tokenizer`, `datasets` (a DatasetDict with `train` and optionally `validation`) and
    `entity_vocab` override what is read from `args.corpus_dir` / `args.model_name_or_path`. `writer`
    (`research.writer_training.WriterTrainingArguments`) trains a model with a writer of entity rows; `mixing`
    (`research.example_mixing.ExampleMixingArguments`) mixes questions into the batches. Accelerate keeps
    one state per process: calls in the same process must use the same `mixed_precision` (Accelerate raises a
    ValueError otherwise); `edmem pretrain` starts a fresh process each time.
    """
    from .arguments import missing_model

    for option in ("model_name_or_path", "tokenizer_name"):  # one line, before anything tries to download it
        if model is None and getattr(args, option) is not None and (why := missing_model(getattr(args, option))):
            raise ValueError(f"--{option} {getattr(args, option)}: {why}")
    run = _PretrainingRun(args, model, tokenizer, datasets, entity_vocab, writer, mixing)
    return run.finish(run.train())


def cli_main(argv: Sequence[str] | None = None) -> int:
    """`edmem pretrain [options]` (or `edmem pretrain RUN/pretraining_args.json`, the arguments a run saved): parse
    PretrainingArguments and run `pretrain`."""
    from accelerate.state import PartialState

    from .arguments import CommandArgumentParser
    from .research.example_mixing import ExampleMixingArguments
    from .research.writer_training import WriterTrainingArguments

    parser = CommandArgumentParser(
        (PretrainingArguments, WriterTrainingArguments, ExampleMixingArguments),
        negations={"adam_fused": argparse.SUPPRESS},  # `--adam_fused false` says it
        prog="edmem pretrain",
        description="Pre-train EDMem on a corpus of `edmem build-corpus` with Accelerate (one CPU, N GPUs, several "
        "nodes; `accelerate launch -m edmem_hf.cli pretrain ...`), resuming from the last checkpoint after a crash. "
        f"A run saves its arguments as OUTPUT_DIR/{ARGUMENTS_NAME}; `edmem pretrain OUTPUT_DIR/{ARGUMENTS_NAME}` "
        "runs it again.",
    )
    argv = list(argv) if argv is not None else sys.argv[1:]
    try:
        if len(argv) == 1 and argv[0].endswith(".json"):  # a run's pretraining_args.json: the same run again
            if not os.path.isfile(argv[0]):
                raise ValueError(f"{argv[0]}: no such arguments file (a run saves OUTPUT_DIR/{ARGUMENTS_NAME})")
            args, writer, mixing = parser.parse_json_file(argv[0])
        else:
            args, writer, mixing = parser.parse_args_into_dataclasses(args=argv)
        pretrain(args, writer=writer, mixing=mixing)
    except ValueError as err:
        print(f"edmem pretrain: error: {err}", flush=True)
        return 2
    state = PartialState()
    if state.use_distributed:
        state.wait_for_everyone()
        state.destroy_process_group()
    return 0


def pretraining_options(**options: Any) -> dict[str, Any]:
    """`edmem pretrain`'s options, given by name, as `pretrain`'s arguments: `{"args": PretrainingArguments,
    "writer": WriterTrainingArguments, "mixing": ExampleMixingArguments}` (`pretrain(**pretraining_options(...))`).
    An unknown name is a ValueError."""
    from transformers import HfArgumentParser

    from .research.example_mixing import ExampleMixingArguments
    from .research.writer_training import WriterTrainingArguments

    parser = HfArgumentParser((PretrainingArguments, WriterTrainingArguments, ExampleMixingArguments))
    args, writer, mixing = parser.parse_dict(options)
    return {"args": args, "writer": writer, "mixing": mixing}


__all__ = [
    "PretrainingArguments",
    "pretraining_options",
    "pretrain",
    "evaluate",
    "build_config",
    "build_model",
    "load_corpus",
    "list_checkpoints",
    "cli_main",
]

"""`edmem-base` and `edmem-large`: EDMem settings by name, offline, and `edmem write-preset` to save one as a folder.

Both are the authors' model: 4 lower + 8 upper layers on each side (their `num_lower_layers` / `num_upper_layers`
defaults, whichever BART they start from; the paper's EDMem is the bart-large one), their 1,000,010-row x 256 entity
table (ids 10..1000009 are entities, 0 means none), top-100 memory reads and their dropouts and loss settings
(`convert_original.AUTHORS_DEFAULTS`); the widths are BART-base's or BART-large's, the vocabulary BART's 50,265
tokens + `<E_s>`, `<E_e>` (50265, 50266).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassError

from .configuration_edmem import EDMemConfig
from .convert_original import AUTHORS_DEFAULTS, parse_set_options
from .model_card import edmem_model_card, save_model_card
from .modeling_edmem import EDMemForConditionalGeneration

_AUTHORS_MODEL: dict[str, Any] = dict(
    AUTHORS_DEFAULTS,
    vocab_size=50267,
    max_position_embeddings=1024,
    encoder_lower_layers=4,
    encoder_upper_layers=8,
    decoder_lower_layers=4,
    decoder_upper_layers=8,
    entity_vocab_size=1_000_010,
    entity_embed_dim=256,
)
PRESETS: dict[str, dict[str, Any]] = {
    "edmem-base": dict(
        _AUTHORS_MODEL,
        d_model=768,
        encoder_attention_heads=12,
        decoder_attention_heads=12,
        encoder_ffn_dim=3072,
        decoder_ffn_dim=3072,
    ),
    "edmem-large": dict(
        _AUTHORS_MODEL,
        d_model=1024,
        encoder_attention_heads=16,
        decoder_attention_heads=16,
        encoder_ffn_dim=4096,
        decoder_ffn_dim=4096,
    ),
}
# Training settings of the authors' pre-training runs (not part of a model): `edmem pretrain` defaults to them.
AUTHORS_TRAINING: dict[str, Any] = dict(max_grad_norm=0.1, learning_rate=1e-4, weight_decay=0.01, warmup_ratio=0.1)


def preset_settings(name: str) -> dict[str, Any]:
    """The `EDMemConfig` keyword arguments of preset `name` (a copy)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}: choose one of {', '.join(PRESETS)}")
    return dict(PRESETS[name])


def preset_config(name: str, **overrides: Any) -> EDMemConfig:
    """The `EDMemConfig` of preset `name`, with `overrides` (e.g. your tokenizer's `vocab_size`, or your entity
    vocabulary's size as `entity_vocab_size`)."""
    return EDMemConfig(**{**preset_settings(name), **overrides})


def _preset_notes(name: str, random_weights: bool) -> str:
    training = ", ".join(f"`{key}={value}`" for key, value in AUTHORS_TRAINING.items())
    weights = (
        "The weights are random (a fresh initialisation): pre-train them before use."
        if random_weights
        else "There are no weights: the folder holds the configuration, the generation configuration and the code."
    )
    return (
        f"Preset `{name}`, written by `edmem write-preset`. {weights} No tokenizer is shipped: BART's tokenizer "
        "extended with `<E_s>` and `<E_e>` (`edmem train-tokenizer --from DIR`) gives the ids 50265 and 50266 this "
        f"configuration expects. The authors pre-trained with {training} (`edmem pretrain` defaults), which are "
        "training settings and not part of the saved model."
    )


def _preset_usage(folder: str, random_weights: bool) -> str:
    if random_weights:
        return f"""```python
from transformers import AutoModelForSeq2SeqLM

model = AutoModelForSeq2SeqLM.from_pretrained("{folder}", trust_remote_code=True)
```"""
    return f"""```python
from transformers import AutoConfig, AutoModelForSeq2SeqLM

config = AutoConfig.from_pretrained("{folder}", trust_remote_code=True)
model = AutoModelForSeq2SeqLM.from_config(config, trust_remote_code=True)  # random weights
```"""


def write_preset(name: str, folder: str | os.PathLike, random_weights: bool = False, **overrides: Any) -> EDMemConfig:
    """Writes preset `name` (with `overrides`) as a folder that loads offline: config.json, generation_config.json,
    the Hub custom code, a model card and, with `random_weights`, freshly initialised weights (float32: about 2.0 GB
    for `edmem-base`, 2.7 GB for `edmem-large`). Without weights the model is built on the meta device, so nothing
    is allocated. A README.md of the user's in `folder` is kept."""
    config = preset_config(name, **overrides)
    folder = os.fspath(folder)
    if random_weights:
        model = EDMemForConditionalGeneration(config)
        model.save_pretrained(folder)
    else:
        with torch.device("meta"):
            model = EDMemForConditionalGeneration(config)
        _save_without_weights(model, folder)
    card = edmem_model_card(
        model.config,
        folder,
        num_parameters=model.num_parameters(),
        notes=_preset_notes(name, random_weights),
        usage=_preset_usage(folder, random_weights),
    )
    save_model_card(card, folder)
    return model.config


def _save_without_weights(model: EDMemForConditionalGeneration, folder: str) -> None:
    """What `save_pretrained` writes before the weights: the code, config.json and generation_config.json."""
    from transformers.dynamic_module_utils import custom_object_save

    os.makedirs(folder, exist_ok=True)
    model.config.auto_map = model._hub_auto_map(model.config)
    model.config.architectures = [type(model).__name__]
    custom_object_save(model, folder, config=model.config)
    model.config.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)


def cli_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edmem write-preset", description=__doc__)
    parser.add_argument("preset", choices=list(PRESETS))
    parser.add_argument("output_dir")
    parser.add_argument("--random-weights", action="store_true", help="also write freshly initialised weights")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a config value (JSON), e.g. vocab_size=50270"
    )
    args = parser.parse_args(argv)
    overrides = parse_set_options(args.set, parser)
    try:
        config = write_preset(args.preset, args.output_dir, random_weights=args.random_weights, **overrides)
    except (ValueError, TypeError, StrictDataclassError) as error:  # the last: a bad --set value
        print(f"edmem write-preset: {error}", file=sys.stderr)
        return 1
    what = "config and random weights" if args.random_weights else "config (no weights)"
    print(
        f"{args.preset}: {what}, d_model {config.d_model}, {config.encoder_lower_layers}+"
        f"{config.encoder_upper_layers} layers a side, {config.entity_vocab_size} x {config.entity_embed_dim} entity "
        f"table -> {Path(args.output_dir)}"
    )
    return 0


__all__ = ["AUTHORS_TRAINING", "PRESETS", "preset_config", "preset_settings", "write_preset"]

"""`edmem convert-original`: the authors' EDMem checkpoints (github DM2-ND/EDMem) as an `EDMemForConditionalGeneration`.

Their layout names the stacks `Lower/Upper{Encoder,Decoder}` and keeps the entity table as an `nn.Linear` weight
`(entity_dim, rows)`; ours is BART's layout with the memory between the lower and upper layers. Every width and
depth is read from the shapes; the rest comes from overrides with the authors' values as defaults.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassError

from .configuration_edmem import EDMemConfig
from .model_card import save_model_card
from .modeling_edmem import EDMemForConditionalGeneration

# What shapes cannot tell: bart-large's heads and dropouts, the authors' marker ids (50265, 50266 after
# bart-large's vocabulary), their top-100 memory read, and their loss and dropout choices.
AUTHORS_DEFAULTS: dict[str, Any] = dict(
    encoder_attention_heads=16,
    decoder_attention_heads=16,
    entity_start_token_id=50265,
    entity_end_token_id=50266,
    memory_top_k=100,
    dropout=0.1,
    attention_dropout=0.1,
    activation_dropout=0.1,
    memory_dropout=0.1,
    upper_input_dropout=0.1,
    entity_loss_reduction="all_accesses",
    lower_decoder_attends_to="upper",
)
# Their copies of tied weights, and a loss weight that is not a parameter: read, checked, not converted.
_COPIES = {
    "LowerEncoder.embed_tokens.weight": "shared.weight",
    "LowerDecoder.embed_tokens.weight": "shared.weight",
    "LMHead.weight": "shared.weight",
    "EncoderEntityMemory.EntityEmbedding.weight": "EntityEmbedding.weight",
    "DecoderEntityMemory.EntityEmbedding.weight": "EntityEmbedding.weight",
    "EntityLinkHead.EntityEmbedding.weight": "EntityEmbedding.weight",
}
_IGNORED = {"LMLoss.weight"}
_LAYER = re.compile(r"^(Lower|Upper)(Encoder|Decoder)\.layers\.(\d+)\.(.+)$")


def load_original_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The authors' `pytorch_model.bin` (read with `weights_only=True`: no arbitrary pickle) or a safetensors file."""
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    try:
        state_dict = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises UnpicklingError subclasses and RuntimeErrors here
        raise ValueError(f"{path}: not a plain state dict of tensors ({error.__class__.__name__})") from None
    if not isinstance(state_dict, Mapping) or not all(isinstance(v, torch.Tensor) for v in state_dict.values()):
        raise ValueError(f"{path}: not a plain state dict of tensors")
    return dict(state_dict)


def _layer_counts(state_dict: Mapping[str, torch.Tensor]) -> dict[str, int]:
    counts = {f"{side}_{part}_layers": 0 for side in ("encoder", "decoder") for part in ("lower", "upper")}
    for key in state_dict:
        match = _LAYER.match(key)
        if match:
            name = f"{match[2].lower()}_{match[1].lower()}_layers"
            counts[name] = max(counts[name], int(match[3]) + 1)
    return counts


def infer_config(state_dict: Mapping[str, torch.Tensor], **overrides: Any) -> EDMemConfig:
    """The `EDMemConfig` of an authors' state dict: widths and depths from the shapes, the rest from `overrides`
    over `AUTHORS_DEFAULTS`."""
    for key in ("shared.weight", "EntityEmbedding.weight", "LowerEncoder.embed_positions.weight"):
        if key not in state_dict:
            raise ValueError(f"not an EDMem checkpoint in the authors' layout: {key!r} is missing")
    if any(key.startswith("LMHead.transform.") for key in state_dict):
        raise ValueError("this is an EncMem checkpoint (LMHead.transform.*): only EDMem checkpoints convert so far")
    vocab_size, d_model = state_dict["shared.weight"].shape
    entity_embed_dim, entity_vocab_size = state_dict["EntityEmbedding.weight"].shape
    settings: dict[str, Any] = dict(
        vocab_size=vocab_size,
        d_model=d_model,
        entity_embed_dim=entity_embed_dim,
        entity_vocab_size=entity_vocab_size,
        max_position_embeddings=state_dict["LowerEncoder.embed_positions.weight"].shape[0] - 2,
        **_layer_counts(state_dict),
    )
    for side in ("encoder", "decoder"):
        fc1 = next(v for k, v in state_dict.items() if k.endswith(".fc1.weight") and side.capitalize() in k)
        settings[f"{side}_ffn_dim"] = fc1.shape[0]
    settings.update(AUTHORS_DEFAULTS)
    settings.update(overrides)
    return EDMemConfig(**settings)


def _our_key(key: str, config: EDMemConfig) -> str | None:
    """Our name for one of their keys (None for keys that have no place of their own)."""
    match = _LAYER.match(key)
    if match:
        part, side, index, rest = match[1], match[2].lower(), int(match[3]), match[4]
        offset = getattr(config, f"{side}_lower_layers") if part == "Upper" else 0
        return f"model.{side}.layers.{offset + index}.{rest}"
    fixed = {"shared.weight": "model.shared.weight", "final_logits_bias": "final_logits_bias"}
    if key in fixed:
        return fixed[key]
    for side in ("Encoder", "Decoder"):
        ours = f"model.{side.lower()}"
        for theirs, mine in (("embed_positions", "embed_positions"), ("layernorm_embedding", "layernorm_embedding")):
            if key.startswith(f"Lower{side}.{theirs}."):
                return key.replace(f"Lower{side}.{theirs}.", f"{ours}.{mine}.")
        if key.startswith(f"{side}EntityMemory.InputLayer.linear."):
            return key.replace(f"{side}EntityMemory.InputLayer.linear.", f"{ours}.memory.query_proj.")
        if key.startswith(f"{side}EntityMemory.OutputLayer.linear."):
            return key.replace(f"{side}EntityMemory.OutputLayer.linear.", f"{ours}.memory.output_proj.")
        if key.startswith(f"{side}MemoryLayerNorm."):
            return key.replace(f"{side}MemoryLayerNorm.", f"{ours}.memory.layer_norm.")
    if key.startswith("EntityLinkHead.InputLayer.linear."):
        return key.replace("EntityLinkHead.InputLayer.linear.", "entity_linking_head.query_proj.")
    return None


def convert_state_dict(
    state_dict: Mapping[str, torch.Tensor], **config_overrides: Any
) -> EDMemForConditionalGeneration:
    """An `EDMemForConditionalGeneration` computing what the authors' checkpoint computed.

    Every unexpected key, missing weight, copy of a tied weight that differs from it, or shape that does not fit is
    a `ValueError` naming it. The entity id space is kept whole (all rows; in theirs 0 means no entity).
    """
    config = infer_config(state_dict, **config_overrides)
    model = EDMemForConditionalGeneration(config)
    expected = model.state_dict()
    converted: dict[str, torch.Tensor] = {}
    unexpected = []
    for key, tensor in state_dict.items():
        if key in _IGNORED:
            continue
        if key in _COPIES:
            original = state_dict.get(_COPIES[key])
            if original is None or not torch.equal(tensor, original):
                raise ValueError(f"{key} should be a copy of {_COPIES[key]} (tied) but differs from it")
            continue
        if key == "EntityEmbedding.weight":
            converted["model.entity_embeddings.weight"] = tensor.t()
            continue
        ours = _our_key(key, config)
        if ours is None or ours not in expected:
            unexpected.append(key)
            continue
        if tuple(tensor.shape) != tuple(expected[ours].shape):
            raise ValueError(f"{key} has shape {tuple(tensor.shape)} but {ours} needs {tuple(expected[ours].shape)}")
        converted[ours] = tensor
    if unexpected:
        raise ValueError(f"unexpected keys in the checkpoint: {', '.join(sorted(unexpected))}")
    tied = {"model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"}
    tied |= {"model.encoder.entity_embeddings.weight", "model.decoder.entity_embeddings.weight"}
    missing = sorted(set(expected) - set(converted) - tied)
    if missing:
        raise ValueError(f"missing from the checkpoint: {', '.join(missing)}")
    model.load_state_dict(converted, strict=False)
    model.tie_weights()
    return model.eval()


def write_model_card(model: EDMemForConditionalGeneration, folder: str | Path, source: str) -> None:
    """The model's README.md card (`EDMemForConditionalGeneration.model_card`) saying what was converted, from where,
    with what."""
    config = model.config
    summary = (
        f"{config.encoder_lower_layers}+{config.encoder_upper_layers} encoder and "
        f"{config.decoder_lower_layers}+{config.decoder_upper_layers} decoder layers, d_model {config.d_model}, "
        f"a {config.entity_vocab_size} x {config.entity_embed_dim} entity table"
    )
    settings = ", ".join(f"`{key}={getattr(config, key)!r}`" for key in AUTHORS_DEFAULTS)
    notes = (
        f"Converted by `edmem convert-original` from `{source}`, a checkpoint of the authors' code "
        f"(github DM2-ND/EDMem): {summary}. Settings the weights could not tell were set to the authors' values or "
        f"given with `--set`: {settings}. Entity ids are the authors' (every row of their table kept; in their "
        "labels 0 means no entity)."
    )
    save_model_card(model.model_card(str(folder), notes=notes), folder)  # a README.md of the user's is kept


def cli_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edmem convert-original", description=__doc__)
    parser.add_argument("checkpoint", help="the authors' pytorch_model.bin (or a .safetensors file)")
    parser.add_argument("output_dir")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a config value (JSON), e.g. memory_top_k=50"
    )
    parser.add_argument("--tokenizer", help="a tokenizer folder to save beside the model (bart-large + markers)")
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set takes KEY=VALUE, got {item!r}")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    try:
        model = convert_state_dict(load_original_state_dict(args.checkpoint), **overrides)
    except (OSError, ValueError, TypeError, StrictDataclassError) as error:  # the last: a bad --set value
        print(f"edmem convert-original: {error}", file=sys.stderr)
        return 1
    model.save_pretrained(args.output_dir)
    write_model_card(model, args.output_dir, source=Path(args.checkpoint).name)
    if args.tokenizer:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(args.tokenizer).save_pretrained(args.output_dir)
    config = model.config
    print(
        f"converted: {config.encoder_lower_layers}+{config.encoder_upper_layers} encoder and "
        f"{config.decoder_lower_layers}+{config.decoder_upper_layers} decoder layers, d_model {config.d_model}, "
        f"{config.entity_vocab_size} x {config.entity_embed_dim} entity table -> {args.output_dir}"
    )
    return 0


__all__ = ["AUTHORS_DEFAULTS", "convert_state_dict", "infer_config", "load_original_state_dict", "write_model_card"]

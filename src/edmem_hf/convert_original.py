"""`edmem convert-original`: the authors' checkpoints (github DM2-ND/EDMem) as an `EDMemForConditionalGeneration`
(EDMem), an `EDMemForEntityLinking` (EncMem) or an `EDMemEncDecForConditionalGeneration` (their EncDec baseline).

Their EDMem layout names the stacks `Lower/Upper{Encoder,Decoder}` and keeps the entity table as an `nn.Linear`
weight `(entity_dim, rows)`; ours is BART's layout with the memory between the lower and upper layers. Their EncDec
baseline is a BART (`BartForConditionalGeneration`), whose layout is ours already. Every width and depth is read
from the shapes; the rest comes from overrides with the authors' values as defaults. Their entity ids are kept (all
rows; 0 means "no entity" in their labels); names come from a names file or the released task files.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassError

from .arguments import CommandParser
from .configuration_edmem import EDMemConfig
from .entity_vocab import AUTHORS_FIRST_ENTITY, AUTHORS_ID_SPACE, AUTHORS_NO_ENTITY, ENTITY_VOCAB_NAME, EntityVocab
from .model_card import save_model_card
from .modeling_edmem import (
    MODEL_WITH_HEADS,
    EDMemEncDecForConditionalGeneration,
    EDMemForConditionalGeneration,
    EDMemForEntityLinking,
)

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
    "LMHead.decoder.weight": "shared.weight",  # EncMem's BERT-style head: tied decoder, bias under two names
    "LMHead.decoder.bias": "LMHead.bias",
}
_IGNORED = {"LMLoss.weight"}
# The EncDec baseline, a BART: its key of the token embeddings, and its copies of them.
_BART_KEY = "model.shared.weight"
_BART_COPIES = {
    "model.encoder.embed_tokens.weight": _BART_KEY,
    "model.decoder.embed_tokens.weight": _BART_KEY,
    "lm_head.weight": _BART_KEY,
}
_BART_LAYER = re.compile(r"^model\.(encoder|decoder)\.layers\.(\d+)\.")
_LAYER = re.compile(r"^(Lower|Upper)(Encoder|Decoder)\.layers\.(\d+)\.(.+)$")
_ENCMEM_KEY = "LMHead.transform.dense.linear.weight"


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


def is_bart_layout(state_dict: Mapping[str, torch.Tensor]) -> bool:
    """Whether the state dict is a BART's (the authors' EncDec baseline) rather than in their EDMem layout."""
    return _BART_KEY in state_dict and "shared.weight" not in state_dict


def _bart_settings(state_dict: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The EncDec baseline's widths and depths. It has no memory, so the split of each stack into lower and upper
    layers changes nothing it computes; it is the paper's (a third of the layers lower: 4 + 8 for bart-large's 12)."""
    vocab_size, d_model = state_dict[_BART_KEY].shape
    settings: dict[str, Any] = dict(
        variant="encdec",
        vocab_size=vocab_size,
        d_model=d_model,
        max_position_embeddings=state_dict["model.encoder.embed_positions.weight"].shape[0] - 2,
    )
    for side in ("encoder", "decoder"):
        layers = 1 + max((int(m[2]) for m in map(_BART_LAYER.match, state_dict) if m and m[1] == side), default=-1)
        settings[f"{side}_lower_layers"] = layers // 3
        settings[f"{side}_upper_layers"] = layers - layers // 3
        if layers:
            settings[f"{side}_ffn_dim"] = state_dict[f"model.{side}.layers.0.fc1.weight"].shape[0]
    return settings


def infer_config(state_dict: Mapping[str, torch.Tensor], **overrides: Any) -> EDMemConfig:
    """The `EDMemConfig` of an authors' state dict: widths and depths from the shapes, the rest from `overrides`
    over `AUTHORS_DEFAULTS`."""
    if is_bart_layout(state_dict):
        if "model.encoder.embed_positions.weight" not in state_dict:
            raise ValueError("not a BART checkpoint: 'model.encoder.embed_positions.weight' is missing")
        settings = {**_bart_settings(state_dict), **AUTHORS_DEFAULTS}
        for marker in ("entity_start_token_id", "entity_end_token_id"):  # a BART without the markers has none
            if settings[marker] >= settings["vocab_size"]:
                settings[marker] = None
        return EDMemConfig(**{**settings, **overrides})
    for key in ("shared.weight", "EntityEmbedding.weight", "LowerEncoder.embed_positions.weight"):
        if key not in state_dict:
            raise ValueError(
                f"not an EDMem checkpoint in the authors' layout: {key!r} is missing (nor a BART, their EncDec "
                f"baseline: {_BART_KEY!r} is missing too)"
            )
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
    if _ENCMEM_KEY in state_dict:  # their auto-encoder: encoder, memory, BERT-style LM head, entity-linking head
        settings["variant"] = "encmem"
    for side in ("encoder", "decoder"):
        fc1 = [v for k, v in state_dict.items() if k.endswith(".fc1.weight") and side.capitalize() in k]
        if fc1:
            settings[f"{side}_ffn_dim"] = fc1[0].shape[0]
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
    for theirs, mine in (
        ("LMHead.transform.dense.linear.", "lm_head.dense."),
        ("LMHead.transform.LayerNorm.", "lm_head.layer_norm."),
    ):
        if key.startswith(theirs):
            return key.replace(theirs, mine)
    if key == "LMHead.bias":
        return "lm_head.decoder.bias"
    return None


def convert_state_dict(
    state_dict: Mapping[str, torch.Tensor], **config_overrides: Any
) -> EDMemForConditionalGeneration | EDMemForEntityLinking | EDMemEncDecForConditionalGeneration:
    """The model computing what the authors' checkpoint computed: an `EDMemForConditionalGeneration`, an
    `EDMemForEntityLinking` for their EncMem (recognised by its `LMHead.transform.*`), or an
    `EDMemEncDecForConditionalGeneration` for their EncDec baseline (a BART: `model.shared.weight`, ...).

    Every unexpected key, missing weight, copy of a tied weight that differs from it, or shape that does not fit is
    a `ValueError` naming it. The entity id space is kept whole (all rows; in theirs 0 means no entity).
    """
    config = infer_config(state_dict, **config_overrides)
    model = MODEL_WITH_HEADS[config.variant](config)
    bart = is_bart_layout(state_dict)
    copies = _BART_COPIES if bart else _COPIES
    expected = model.state_dict()
    converted: dict[str, torch.Tensor] = {}
    unexpected = []
    for key, tensor in state_dict.items():
        if key in _IGNORED:
            continue
        if key in copies:
            original = state_dict.get(copies[key])
            if original is None or not torch.equal(tensor, original):
                raise ValueError(f"{key} should be a copy of {copies[key]} (tied) but differs from it")
            continue
        if key == "EntityEmbedding.weight" and not bart:
            converted["model.entity_embeddings.weight"] = tensor.t()
            continue
        ours = key if bart else _our_key(key, config)
        if ours is None or ours not in expected:
            unexpected.append(key)
            continue
        if tuple(tensor.shape) != tuple(expected[ours].shape):
            raise ValueError(f"{key} has shape {tuple(tensor.shape)} but {ours} needs {tuple(expected[ours].shape)}")
        converted[ours] = tensor
    if unexpected:
        raise ValueError(f"unexpected keys in the checkpoint: {', '.join(sorted(unexpected))}")
    tied = {"lm_head.weight", "lm_head.decoder.weight"}
    tied |= {f"model.{stack}.embed_tokens.weight" for stack in ("encoder", "decoder")}
    missing = sorted(set(expected) - set(converted) - tied)
    if missing:
        raise ValueError(f"missing from the checkpoint: {', '.join(missing)}")
    model.load_state_dict(converted, strict=False)
    model.tie_weights()
    return model.eval()


def entity_labels_from_authors(labels: torch.Tensor) -> torch.Tensor:
    """Entity labels in the authors' convention (0 = no entity, ids kept) -> ours (-100 = no label)."""
    return labels.masked_fill(labels == AUTHORS_NO_ENTITY, -100)


def read_entity_names(path: str | Path, num_rows: int) -> dict[int, str]:
    """`{entity id: name}` from a names file in one of the authors' shapes: a JSON list of names in row order (all
    `num_rows` rows, or the entities only, starting at row 10; `null` for a row without a name), a JSON object
    `{id: name}`, or text lines `id<TAB>name` (or one name per line, in row order as for the list)."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not JSON ({error.msg})") from None
    elif all("\t" in line for line in text.splitlines() if line):
        data = dict(line.split("\t", 1) for line in text.splitlines() if line)
    else:
        data = text.splitlines()
    if isinstance(data, list):
        if len(data) not in (num_rows, num_rows - AUTHORS_FIRST_ENTITY):
            raise ValueError(
                f"{path}: {len(data)} names for a table of {num_rows} rows (expected {num_rows}, or "
                f"{num_rows - AUTHORS_FIRST_ENTITY} starting at row {AUTHORS_FIRST_ENTITY})"
            )
        first = num_rows - len(data)
        data = {first + i: name for i, name in enumerate(data) if name is not None}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a list of names or an object mapping ids to names")
    names = {}
    for key, name in data.items():
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{path}: entity {key} has no usable name: {name!r}")
        try:
            names[int(key)] = name.strip()
        except ValueError:
            raise ValueError(f"{path}: {key!r} is not an entity id") from None
    return names


def entity_names_from_task_files(paths: Iterable[str | Path]) -> dict[int, str]:
    """`{entity id: name}` as the authors' released task files give them (`.jsonl` files, or folders searched for
    them): the linked mentions' `link_target` and `entity_name`. Their answer fields are not read: they name an
    answer entity by the answer as written ("lithium" for Lithium). An id given two names is an error naming both."""
    names: dict[int, str] = {}
    files: list[Path] = []
    for path in map(Path, paths):
        files += sorted(path.rglob("*.jsonl")) if path.is_dir() else [path]
    if not files:
        raise ValueError(f"no task files (*.jsonl) found in {', '.join(map(str, paths))}")
    for file in files:
        with open(file, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                record, where = json.loads(line), f"{file}, line {number}"
                targets, entity_names = record.get("link_target", []), record.get("entity_name", [])
                if len(targets) != len(entity_names):
                    raise ValueError(f"{where}: {len(targets)} link targets but {len(entity_names)} entity names")
                for entity_id, name in zip(map(int, targets), entity_names):
                    if names.setdefault(entity_id, name) != name:
                        raise ValueError(
                            f"{where}: entity {entity_id} is named {name!r} here and {names[entity_id]!r} elsewhere"
                        )
    return names


def authors_entity_vocab(num_rows: int, names: Mapping[int, str]) -> EntityVocab:
    """The `EntityVocab` of a converted table: every row kept, the ones without a name unnamed (`None`)."""
    rows: list[str | None] = [None] * num_rows
    for entity_id, name in names.items():
        if not AUTHORS_FIRST_ENTITY <= entity_id < num_rows:
            raise ValueError(
                f"entity id {entity_id} ({name!r}) is outside the table's entities "
                f"({AUTHORS_FIRST_ENTITY}..{num_rows - 1})"
            )
        rows[entity_id] = name
    return EntityVocab(rows, id_space=AUTHORS_ID_SPACE)


def write_model_card(
    model: EDMemForConditionalGeneration | EDMemForEntityLinking | EDMemEncDecForConditionalGeneration,
    folder: str | Path,
    source: str,
) -> None:
    """The model's README.md card (`model.model_card`) saying what was converted, from where, with what, and how
    many entities have a name."""
    config = model.config
    settings = ", ".join(f"`{key}={getattr(config, key)!r}`" for key in AUTHORS_DEFAULTS)
    vocab = model.entity_vocab
    if isinstance(model, EDMemEncDecForConditionalGeneration):
        entities = "It is the EncDec baseline: no entity memory, free decoding only."
    else:
        names = (
            "No entity names were given: entity decoding needs them (convert again with `--entity-names`)."
            if vocab is None or vocab.num_unnamed == len(vocab)
            else f"{len(vocab) - vocab.num_unnamed} of the {len(vocab)} rows have a name (`entity_vocab.json`); "
            "the others take part in the memory but are never spelled."
        )
        entities = (
            f"Entity ids are the authors' (every row of their table kept; in their labels 0 means no entity). {names}"
        )
    notes = (
        f"Converted by `edmem convert-original` from `{source}`, a checkpoint of the authors' code "
        f"(github DM2-ND/EDMem): {_summary(config)}. Settings the weights could not tell were set to the authors' "
        f"values or given with `--set`: {settings}. {entities}"
    )
    save_model_card(model.model_card(str(folder), notes=notes), folder)  # a README.md of the user's is kept


def parse_set_options(items: list[str], parser: argparse.ArgumentParser) -> dict[str, Any]:
    """`--set KEY=VALUE` options as config overrides: values read as JSON (`0.1`, `true`, `[1, 2]`), else strings."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set takes KEY=VALUE, got {item!r}")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return overrides


def cli_main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="edmem convert-original", description=__doc__)
    parser.add_argument("checkpoint", help="the authors' pytorch_model.bin (or a .safetensors file)")
    parser.add_argument("output_dir", help="the folder to write the converted model (and --tokenizer) to")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a config value (JSON), e.g. memory_top_k=50"
    )
    parser.add_argument("--tokenizer", help="a tokenizer folder to save beside the model (bart-large + markers)")
    names = parser.add_mutually_exclusive_group()
    names.add_argument(
        "--entity-names",
        metavar="FILE",
        help="the authors' entity names: a JSON list or {id: name}, or id<TAB>name lines",
    )
    names.add_argument(
        "--task-data",
        nargs="+",
        metavar="PATH",
        help="the authors' released task files (or folders of them): name the entities their linked mentions name",
    )
    args = parser.parse_args(argv)
    overrides = parse_set_options(args.set, parser)
    try:
        model = convert_state_dict(load_original_state_dict(args.checkpoint), **overrides)
        if isinstance(model, EDMemEncDecForConditionalGeneration) and (args.entity_names or args.task_data):
            raise ValueError("the checkpoint is the EncDec baseline (a BART): it has no entity memory to name")
        rows = model.config.entity_vocab_size
        if args.entity_names:
            model.entity_vocab = authors_entity_vocab(rows, read_entity_names(args.entity_names, rows))
        elif args.task_data:
            model.entity_vocab = authors_entity_vocab(rows, entity_names_from_task_files(args.task_data))
    except (OSError, ValueError, TypeError, StrictDataclassError) as error:  # the last: a bad --set value
        print(f"edmem convert-original: {error}", file=sys.stderr)
        return 1
    model.save_pretrained(args.output_dir)
    write_model_card(model, args.output_dir, source=Path(args.checkpoint).name)
    if args.tokenizer:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(args.tokenizer).save_pretrained(args.output_dir)
    print(f"converted {type(model).__name__}: {_summary(model.config)} -> {args.output_dir}")
    if isinstance(model, EDMemEncDecForConditionalGeneration):
        return 0
    vocab = model.entity_vocab
    named = 0 if vocab is None else len(vocab) - vocab.num_unnamed
    print(f"entity names: {named} of {model.config.entity_vocab_size} rows named ({ENTITY_VOCAB_NAME})")
    if not named:
        print("  entity decoding needs names: give --entity-names FILE or --task-data PATH", file=sys.stderr)
    return 0


def _summary(config: EDMemConfig) -> str:
    layers = f"{config.encoder_lower_layers}+{config.encoder_upper_layers} encoder"
    if config.variant != "encmem":
        layers += f" and {config.decoder_lower_layers}+{config.decoder_upper_layers} decoder"
    if config.variant == "encdec":
        return f"{layers} layers, d_model {config.d_model}, no entity memory (the EncDec baseline)"
    return (
        f"{layers} layers, d_model {config.d_model}, a {config.entity_vocab_size} x {config.entity_embed_dim} "
        "entity table"
    )


__all__ = [
    "AUTHORS_DEFAULTS",
    "authors_entity_vocab",
    "convert_state_dict",
    "entity_labels_from_authors",
    "entity_names_from_task_files",
    "infer_config",
    "is_bart_layout",
    "load_original_state_dict",
    "read_entity_names",
    "write_model_card",
]

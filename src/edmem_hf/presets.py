"""`edmem-base` and `edmem-large`: EDMem settings by name, offline, and `edmem write-preset` to save one as a folder.

Both are the authors' model: 4 lower + 8 upper layers on each side (their `num_lower_layers` / `num_upper_layers`
defaults, whichever BART they start from; the paper's EDMem is the bart-large one), their 1,000,010-row x 256 entity
table (ids 10..1000009 are entities, 0 means none), top-100 memory reads and their dropouts and loss settings
(`convert_original.AUTHORS_DEFAULTS`); the widths are BART-base's or BART-large's, the vocabulary BART's 50,265
tokens + `<E_s>`, `<E_e>` (50265, 50266).

`edmem write-preset` writes a folder that loads offline; with `--tokenizer` and `--entity-vocab` (or `--task-data`)
it is complete: the vocabulary size, marker and special token ids from the tokenizer, the entity count from the
entity vocabulary, both saved beside the config, ready for `edmem finetune`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassError

from .arguments import CommandParser
from .configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN, EDMemConfig
from .convert_original import AUTHORS_DEFAULTS, entity_names_from_task_files, parse_set_options
from .entity_vocab import AUTHORS_ID_SPACE, EntityVocab
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


def _preset_notes(name: str, random_weights: bool, tokenizer: Any = None, entity_vocab: Any = None) -> str:
    training = ", ".join(f"`{key}={value}`" for key, value in AUTHORS_TRAINING.items())
    weights = (
        "The weights are random (a fresh initialisation): pre-train them before use."
        if random_weights
        else "There are no weights: the folder holds the configuration, the generation configuration and the code."
    )
    if tokenizer is None:
        tokens = (
            "No tokenizer is shipped: BART's tokenizer extended with `<E_s>` and `<E_e>` (`edmem train-tokenizer "
            "--from DIR`) gives the ids 50265 and 50266 this configuration expects."
        )
    else:
        start, end = tokenizer.convert_tokens_to_ids([ENTITY_START_TOKEN, ENTITY_END_TOKEN])
        tokens = f"The tokenizer is shipped ({len(tokenizer)} tokens, `<E_s>` = {start}, `<E_e>` = {end})."
    if entity_vocab is not None:
        tokens += f" `entity_vocab.json` names the {len(entity_vocab)} entities of the memory."
    return (
        f"Preset `{name}`, written by `edmem write-preset`. {weights} {tokens} The authors pre-trained with "
        f"{training} (`edmem pretrain` defaults), which are training settings and not part of the saved model."
    )


def tokenizer_settings(tokenizer: Any) -> dict[str, int]:
    """The config values a tokenizer fixes: `vocab_size`, the `<E_s>`/`<E_e>` ids and the special token ids (BART's
    convention: generation starts from `</s>`). A tokenizer without the markers is an error naming them."""
    start, end = tokenizer.convert_tokens_to_ids([ENTITY_START_TOKEN, ENTITY_END_TOKEN])
    if None in (start, end) or tokenizer.unk_token_id in (start, end):
        raise ValueError(
            f"the tokenizer has no {ENTITY_START_TOKEN}/{ENTITY_END_TOKEN} markers: add them with "
            "`edmem train-tokenizer --from DIR`"
        )
    eos = tokenizer.eos_token_id
    return dict(
        vocab_size=len(tokenizer),
        entity_start_token_id=start,
        entity_end_token_id=end,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos,
        decoder_start_token_id=eos,
        forced_eos_token_id=eos,
    )


def entity_vocab_from_task_files(paths: list[str | os.PathLike]) -> EntityVocab:
    """An entity vocabulary of our own (ids 0..N-1, every row an entity) for the entities the authors' released
    task files link: the `link_target` / `entity_name` pairs of the inputs, as `edmem convert-original --task-data`
    reads them, and the `answer_link_target` / `answer_entity_name` pairs of the training answers, in the order of
    the authors' ids. Each row keeps its id in theirs (`authors_ids`): their files' ids map to its rows, also where
    they name an entity otherwise (a test answer "lawyer" for the entity Lawyer)."""
    names = entity_names_from_task_files(paths)
    files = [f for path in map(Path, paths) for f in (sorted(path.rglob("*.jsonl")) if path.is_dir() else [path])]
    for file in files:
        with open(file, encoding="utf-8") as f:
            for line in f:
                record = json.loads(line)
                targets, answer_names = record.get("answer_link_target", []), record.get("answer_entity_name", [])
                for entity_ids, entity_names in zip(targets, answer_names):
                    for entity_id, name in zip(map(int, entity_ids), entity_names):
                        names.setdefault(entity_id, name)
    rows: dict[str, int] = {}
    for entity_id, name in sorted(names.items()):
        if rows.setdefault(name, entity_id) != entity_id:
            raise ValueError(f"the task files name two entities {name!r} (ids {rows[name]} and {entity_id})")
    return EntityVocab(list(rows), authors_ids=list(rows.values()))


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


def write_preset(
    name: str,
    folder: str | os.PathLike,
    random_weights: bool = False,
    tokenizer: Any = None,
    entity_vocab: EntityVocab | None = None,
    seed: int = 0,
    **overrides: Any,
) -> EDMemConfig:
    """Writes preset `name` (with `overrides`) as a folder that loads offline: config.json, generation_config.json,
    the Hub custom code, a model card and, with `random_weights`, freshly initialised weights (float32: about 2.0 GB
    for `edmem-base`, 2.7 GB for `edmem-large`). Without weights the model is built on the meta device, so nothing
    is allocated. A README.md of the user's in `folder` is kept. The random weights are drawn from `seed` (the
    caller's random state is left as it was): the same call writes the same folder.

    With `tokenizer`, the vocabulary size and the marker and special token ids are the tokenizer's
    (`tokenizer_settings`) and it is saved in the folder; with `entity_vocab`, the entity count is its size and it
    is saved as `entity_vocab.json`. `overrides` win over both."""
    from_files = {} if tokenizer is None else tokenizer_settings(tokenizer)
    if entity_vocab is not None:
        from_files["entity_vocab_size"] = len(entity_vocab)
    config = preset_config(name, **{**from_files, **overrides})
    folder = os.fspath(folder)
    if random_weights:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = EDMemForConditionalGeneration(config)
        model.entity_vocab = entity_vocab
        model.save_pretrained(folder)
    else:
        with torch.device("meta"):
            model = EDMemForConditionalGeneration(config)
        _save_without_weights(model, folder)
        if entity_vocab is not None:
            entity_vocab.save(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    card = edmem_model_card(
        model.config,
        folder,
        num_parameters=model.num_parameters(),
        notes=_preset_notes(name, random_weights, tokenizer, entity_vocab),
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
    parser = CommandParser(
        prog="edmem write-preset", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("preset", choices=list(PRESETS), help="the authors' model at BART-base or BART-large widths")
    parser.add_argument("output_dir", help="the folder to write")
    parser.add_argument("--random-weights", action="store_true", help="also write freshly initialised weights")
    parser.add_argument("--seed", type=int, default=0, help="the random weights' seed (default: 0)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a config value (JSON), e.g. d_model=64"
    )
    parser.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="a tokenizer folder with <E_s>/<E_e> (edmem train-tokenizer): sets vocab_size and the token ids, and "
        "is saved in the folder",
    )
    entities = parser.add_mutually_exclusive_group()
    entities.add_argument(
        "--entity-vocab",
        metavar="FILE",
        help="an entity_vocab.json (edmem build-corpus writes one): sets entity_vocab_size, saved in the folder",
    )
    entities.add_argument(
        "--task-data",
        nargs="+",
        metavar="PATH",
        help="the authors' released task files (or folders of them): an entity vocabulary of the entities they link",
    )
    args = parser.parse_args(argv)
    overrides = parse_set_options(args.set, parser)
    try:
        tokenizer = entity_vocab = None
        if args.tokenizer is not None:
            from .tokenization import extend_tokenizer

            if not os.path.isdir(args.tokenizer):
                raise ValueError(f"--tokenizer {args.tokenizer}: no such folder")
            tokenizer = extend_tokenizer(args.tokenizer)
        if args.entity_vocab is not None:
            entity_vocab = EntityVocab.load(args.entity_vocab)
        elif args.task_data is not None:
            entity_vocab = entity_vocab_from_task_files(args.task_data)
        config = write_preset(
            args.preset,
            args.output_dir,
            random_weights=args.random_weights,
            seed=args.seed,
            tokenizer=tokenizer,
            entity_vocab=entity_vocab,
            **overrides,
        )
    except (OSError, ValueError, TypeError, StrictDataclassError) as error:  # the last: a bad --set value
        print(f"edmem write-preset: {error}", file=sys.stderr)
        return 1
    what = "config and random weights" if args.random_weights else "config (no weights)"
    print(
        f"{args.preset}: {what}, d_model {config.d_model}, {config.encoder_lower_layers}+"
        f"{config.encoder_upper_layers} layers a side, {config.entity_vocab_size} x {config.entity_embed_dim} entity "
        f"table -> {Path(args.output_dir)}"
    )
    if tokenizer is not None:
        print(
            f"  tokenizer: {config.vocab_size} tokens, <E_s> = {config.entity_start_token_id}, <E_e> = "
            f"{config.entity_end_token_id}"
        )
    if entity_vocab is not None:
        ids = "the authors' ids" if entity_vocab.id_space == AUTHORS_ID_SPACE else f"ids 0..{len(entity_vocab) - 1}"
        if entity_vocab.authors_ids is not None:
            ids += ", each with its id in the authors' files"
        print(f"  entity vocabulary: {len(entity_vocab)} entities (entity_vocab.json: {ids})")
    return 0


__all__ = [
    "AUTHORS_TRAINING",
    "PRESETS",
    "entity_vocab_from_task_files",
    "preset_config",
    "preset_settings",
    "tokenizer_settings",
    "write_preset",
]

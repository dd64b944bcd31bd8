"""The model card (README.md) written beside a saved EDMem: what the model is, how to load it, what to cite.

Copied to the Hub as custom code next to `hub_edmem.py` (whose `save_pretrained` and `push_to_hub` write the card):
it imports nothing of ours.
"""

from __future__ import annotations

import copy
import os

from huggingface_hub import ModelCard, ModelCardData

README_NAME = "README.md"
DEFAULT_LICENSE = "apache-2.0"  # this project's licence
# The first line of every card we write: a README.md without it is the user's and is never overwritten.
CARD_MARKER = "<!-- edmem-hf model card: rewritten on each save; delete this line to keep your own edits -->"

CITATION = """@inproceedings{zhang-etal-2022-unified,
  title = {A Unified Encoder-Decoder Framework with Entity Memory},
  author = {Zhang, Zhihan and Yu, Wenhao and Zhu, Chenguang and Jiang, Meng},
  booktitle = {Proceedings of the 2022 Conference on Empirical Methods in Natural Language Processing},
  pages = {689--705},
  publisher = {Association for Computational Linguistics},
  year = {2022},
  url = {https://aclanthology.org/2022.emnlp-main.43},
}"""

# The Auto class that loads each architecture (the others load with this package).
_AUTO_CLASSES = {
    "EDMemForConditionalGeneration": "AutoModelForSeq2SeqLM",
    "EDMemEncDecForConditionalGeneration": "AutoModelForSeq2SeqLM",
    "EDMemModel": "AutoModel",
    "EDMemEncDecModel": "AutoModel",
    "EDMemEncMemModel": "AutoModel",
}
_PIPELINE_TAGS = {"AutoModelForSeq2SeqLM": "text2text-generation"}


def _usage(architecture: str, path: str) -> str:
    """The usage snippet for a folder that holds this architecture's weights (and a tokenizer, for generation)."""
    auto_class = _AUTO_CLASSES.get(architecture)
    if auto_class == "AutoModelForSeq2SeqLM":
        return f"""```python
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{path}", trust_remote_code=True)
model = AutoModelForSeq2SeqLM.from_pretrained("{path}", trust_remote_code=True)
inputs = tokenizer(["Who wrote <E_s> Hamlet <E_e>?"], return_tensors="pt")
outputs = model.generate(**inputs, max_new_tokens=32)
print(tokenizer.batch_decode(outputs))
```

The tokenizer is the one saved beside the model (`tokenizer.save_pretrained` into this folder). Mentions are
marked `<E_s> ... <E_e>`; `model.generate(..., entity_decoding="static" | "dynamic", tokenizer=tokenizer)` makes
every generated mention the name of an entity in `entity_vocab.json` (saved here when the model has one)."""
    if auto_class == "AutoModel":
        return f"""```python
from transformers import AutoModel

model = AutoModel.from_pretrained("{path}", trust_remote_code=True)  # hidden states and memory accesses, no heads
```"""
    return f"""```python
from edmem_hf import {architecture}

model = {architecture}.from_pretrained("{path}")
```

This class is not one of the Auto classes the folder maps (`pip install` this project to load it)."""


def _model_table(config, num_parameters: int | None) -> str:
    rows = [
        ("variant", f"`{config.variant}`"),
        ("encoder layers", f"{config.encoder_lower_layers} lower + {config.encoder_upper_layers} upper"),
        ("decoder layers", f"{config.decoder_lower_layers} lower + {config.decoder_upper_layers} upper"),
        (
            "width",
            f"d_model {config.d_model}, {config.encoder_attention_heads} / {config.decoder_attention_heads} heads "
            f"(encoder / decoder), feed-forward {config.encoder_ffn_dim} / {config.decoder_ffn_dim}",
        ),
        (
            "vocabulary",
            f"{config.vocab_size:,} tokens, `<E_s>` = {config.entity_start_token_id}, "
            f"`<E_e>` = {config.entity_end_token_id}, up to {config.max_position_embeddings} positions",
        ),
        ("entity memory", f"{config.entity_vocab_size:,} rows x {config.entity_embed_dim}"),
        ("memory read at inference", f"top {config.memory_top_k}" if config.memory_top_k else "the whole table"),
        (
            "dropout",
            f"{config.dropout} (attention {config.attention_dropout}, activation {config.activation_dropout}, "
            f"memory {config.memory_dropout}, upper-layer input {config.upper_input_dropout})",
        ),
        ("entity-linking loss", f"weight {config.entity_loss_weight}, reduction `{config.entity_loss_reduction}`"),
    ]
    if config.variant == "encdec":
        rows = [row for row in rows if row[0] not in ("entity memory", "memory read at inference")]
    if num_parameters is not None:
        rows.append(("parameters", f"{num_parameters:,}"))
    return "\n".join(["| | |", "|---|---|"] + [f"| {name} | {value} |" for name, value in rows])


def edmem_model_card(
    config,
    path: str,
    card_data: ModelCardData | None = None,
    architecture: str = "EDMemForConditionalGeneration",
    num_parameters: int | None = None,
    notes: str = "",
    usage: str | None = None,
) -> ModelCard:
    """The card of an EDMem with this `config`, to be loaded from `path` (a folder or a Hub repository id).

    `card_data` carries what only the user knows (`license`, default apache-2.0; `datasets`; `eval_results` with
    `model_name`; more `tags`, `language`, `base_model`, ...); the library, pipeline and the `edmem` and
    `custom_code` tags are always set. `notes` is a paragraph about where the weights come from; `usage` replaces
    the usage snippet (for a folder without weights).
    """
    data = copy.deepcopy(card_data) if card_data is not None else ModelCardData()
    if not isinstance(data, ModelCardData):
        raise TypeError(f"card_data must be a huggingface_hub.ModelCardData, got {type(card_data).__name__}")
    data.license = data.license or DEFAULT_LICENSE
    data.library_name = "transformers"
    data.pipeline_tag = data.pipeline_tag or _PIPELINE_TAGS.get(_AUTO_CLASSES.get(architecture))
    data.tags = ["edmem", "custom_code"] + [tag for tag in data.tags or [] if tag not in ("edmem", "custom_code")]
    title = data.model_name or os.path.basename(os.path.normpath(path)) or "EDMem"
    sections = [
        CARD_MARKER,
        f"# {title}",
        "An EDMem (Zhang et al., EMNLP 2022): a BART-style encoder-decoder whose encoder and decoder read an entity "
        "memory at each `<E_s>` token between their lower and upper layers, and an entity-linking head on the "
        "decoder. Saved by edmem-hf, the EDMem extension of Hugging Face Transformers: the modelling code is in "
        "this folder (load with `trust_remote_code=True`, or import `edmem_hf`). The authors' code is "
        "[DM2-ND/EDMem](https://github.com/DM2-ND/EDMem).",
        notes,
        "## Model",
        _model_table(config, num_parameters),
        "## Usage",
        usage if usage is not None else _usage(architecture, path),
        "## Citation",
        f"```bibtex\n{CITATION}\n```",
    ]
    body = "\n\n".join(section for section in sections if section)
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}\n")


def is_edmem_card(folder: str | os.PathLike) -> bool:
    """Whether `folder/README.md` is a card we wrote (so that it may be rewritten); False when there is none."""
    readme = os.path.join(os.fspath(folder), README_NAME)
    if not os.path.isfile(readme):
        return False
    with open(readme, encoding="utf-8") as f:
        return CARD_MARKER in f.read()


def save_model_card(card: ModelCard, folder: str | os.PathLike, overwrite: bool = False) -> bool:
    """Writes `card` as `folder/README.md` unless the folder holds a README.md of the user's (one without our
    marker) and `overwrite` is False. Returns whether it was written."""
    readme = os.path.join(os.fspath(folder), README_NAME)
    if os.path.exists(readme) and not overwrite and not is_edmem_card(folder):
        return False
    card.save(readme)
    return True


__all__ = ["CARD_MARKER", "CITATION", "DEFAULT_LICENSE", "edmem_model_card", "is_edmem_card", "save_model_card"]

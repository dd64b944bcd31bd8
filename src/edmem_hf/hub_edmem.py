"""What an EDMem saves and loads beside its weights: `entity_vocab.json`, the entity mask, the model card, the Hub
code's `auto_map`.

`EDMemHubMixin` gives the model classes of `modeling_edmem.py` their `save_pretrained`, `from_pretrained` and
`push_to_hub`. Copied to the Hub as custom code with `modeling_edmem.py`: it imports nothing else of ours.
"""

from __future__ import annotations

import os
import tempfile

import torch
from huggingface_hub import ModelCard, ModelCardData
from safetensors.torch import load_file, save_file
from transformers.configuration_utils import PreTrainedConfig
from transformers.dynamic_module_utils import custom_object_save

from .entity_vocab import ENTITY_VOCAB_NAME, EntityVocab
from .model_card import CARD_MARKER, README_NAME, edmem_model_card, is_edmem_card, save_model_card

# The entities hidden with `set_entity_mask`, saved beside the weights ("shown": a `(entity_vocab_size,)` bool tensor)
ENTITY_MASK_NAME = "entity_mask.safetensors"


class EDMemHubMixin:
    """`model.entity_vocab` and the entity mask (`set_entity_mask`), saved beside the weights and restored by
    `from_pretrained`; a model card (README.md) written by `save_pretrained` and `push_to_hub`; `config.auto_map`
    naming the classes of the model's variant.

    A model class using it defines `_hub_auto_map(config)` (the Auto classes' entries for the config's variant) and
    `_class_for_variant(config)` (the class that builds a saved model's variant where this class was asked for).
    """

    # What the model card says that only the user knows: license (default apache-2.0), datasets, eval_results
    # (with model_name), tags, ... (a huggingface_hub.ModelCardData; see model_card.py).
    card_data: ModelCardData | None = None

    @property
    def entity_vocab(self) -> EntityVocab | None:
        return getattr(self, "_entity_vocab", None)

    @entity_vocab.setter
    def entity_vocab(self, vocab: EntityVocab | None) -> None:
        if vocab is not None:
            if not isinstance(vocab, EntityVocab):
                raise TypeError(f"entity_vocab must be an EntityVocab, got {type(vocab).__name__}")
            if len(vocab) != self.config.entity_vocab_size:
                raise ValueError(
                    f"entity vocabulary / memory mismatch: the vocabulary has {len(vocab)} entities but the entity "
                    f"memory has {self.config.entity_vocab_size} rows (config.entity_vocab_size)"
                )
        self._entity_vocab = vocab
        self._entity_trie = None  # spelled the old vocabulary's names

    def model_card(self, path: str, notes: str = "") -> ModelCard:
        """This model's card (README.md), with `path` (a folder or a Hub repository id) in its usage snippet."""
        return edmem_model_card(
            self.config,
            path,
            card_data=self.card_data,
            architecture=type(self).__name__,
            num_parameters=self.num_parameters(),
            notes=notes,
        )

    def save_pretrained(
        self, save_directory, *args, push_to_hub: bool = False, overwrite_model_card: bool = False, **kwargs
    ):
        """`PreTrainedModel.save_pretrained`, plus `entity_vocab.json`, the entity mask where entities are hidden
        (`entity_mask.safetensors`), a model card (README.md) and the Hub code with the `auto_map` of the model's
        variant. A README.md of the user's (one we did not write) is kept unless
        `overwrite_model_card=True`. With `push_to_hub=True` the folder then goes to `repo_id` (default: the
        folder's name) with a card chosen as `push_to_hub` chooses it (Transformers' own upload would replace
        README.md with the Hub's card or a generic one)."""
        if push_to_hub:
            repo_id = kwargs.pop("repo_id", os.path.basename(os.path.normpath(os.fspath(save_directory))))
            push = {
                key: kwargs.pop(key) for key in ("commit_message", "create_pr", "token", "private") if key in kwargs
            }
        self.config.auto_map = self._hub_auto_map(self.config)
        super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            folder = os.fspath(save_directory)
            if not self.is_remote_code():  # a class no Auto class loads: its code goes along all the same
                custom_object_save(self, folder)
            if self.entity_vocab is not None:
                self.entity_vocab.save(os.path.join(folder, ENTITY_VOCAB_NAME))
            mask, mask_file = self._get_entity_mask("cpu"), os.path.join(folder, ENTITY_MASK_NAME)
            if mask is not None:
                save_file({"shown": mask.contiguous()}, mask_file)
            elif os.path.isfile(mask_file):  # the folder held a model that hid entities: this one hides none
                os.remove(mask_file)
            save_model_card(self.model_card(folder), folder, overwrite=overwrite_model_card)
        if push_to_hub:
            return self._upload_with_card(save_directory, repo_id, **push)
        return None

    def push_to_hub(
        self,
        repo_id: str,
        *,
        commit_message: str | None = None,
        commit_description: str | None = None,
        private: bool | None = None,
        token: bool | str | None = None,
        revision: str | None = None,
        create_pr: bool = False,
        max_shard_size: int | str | None = "50GB",
        tags: list[str] | None = None,
    ):
        """`PreTrainedModel.push_to_hub`, with this model's card as README.md unless the repository already has a
        card of the user's (Transformers' own would upload the Hub's card or a generic one)."""
        with tempfile.TemporaryDirectory() as folder:
            self.save_pretrained(folder, max_shard_size=max_shard_size)
            return self._upload_with_card(
                folder,
                repo_id,
                commit_message=commit_message,
                commit_description=commit_description,
                private=private,
                token=token,
                revision=revision,
                create_pr=create_pr,
                tags=tags,
            )

    def _upload_with_card(self, folder, repo_id: str, *, token=None, private=None, tags=None, **commit):
        """Uploads a saved folder with a README.md: the folder's if it is the user's, else the Hub repository's if it
        is the user's, else ours (its snippet loading `repo_id`); `tags` are added to it."""
        from huggingface_hub import HfApi
        from huggingface_hub.errors import EntryNotFoundError

        api = HfApi(token=token)
        repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
        readme = os.path.join(os.fspath(folder), README_NAME)
        users_readme = os.path.isfile(readme) and not is_edmem_card(folder)
        if users_readme:
            with open(readme, encoding="utf-8") as f:
                card = ModelCard(f.read())
        else:
            try:
                card = ModelCard.load(repo_id, token=token)
            except EntryNotFoundError:
                card = None
            if card is None or CARD_MARKER in card.text:
                card = self.model_card(repo_id)
        known = card.data.tags or []
        added = [tag for tag in dict.fromkeys([*(self.model_tags or []), *(tags or [])]) if tag not in known]
        if added:
            card.data.tags = known + added
        if added or not users_readme:
            card.save(readme)
        commit["commit_message"] = commit.get("commit_message") or "Upload EDMem"
        return api.upload_folder(repo_id=repo_id, folder_path=folder, **commit)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """`PreTrainedModel.from_pretrained` into the class of the saved model's variant (see `_class_for_variant`),
        with `entity_vocab.json` and the entity mask when the folder has them."""
        config = kwargs.get("config")
        if not isinstance(config, PreTrainedConfig):  # (under trust_remote_code, AutoConfig's copy of EDMemConfig)
            config_kwargs = {k: kwargs[k] for k in _CONFIG_LOADING_KWARGS if k in kwargs}
            config = cls.config_class.from_pretrained(config or pretrained_model_name_or_path, **config_kwargs)
        model_class = cls._class_for_variant(config)
        if model_class is not cls:
            return model_class.from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        loaded = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        model = loaded[0] if kwargs.get("output_loading_info") else loaded  # (model, loading info)
        vocab_file = _resolve_file(pretrained_model_name_or_path, ENTITY_VOCAB_NAME, kwargs)
        if vocab_file is not None:
            vocab = EntityVocab.load(vocab_file)
            if len(vocab) != model.config.entity_vocab_size:
                raise ValueError(
                    f"checkpoint mismatch in {pretrained_model_name_or_path}: {ENTITY_VOCAB_NAME} lists {len(vocab)} "
                    f"entities but the entity table has {model.config.entity_vocab_size} rows"
                )
            model.entity_vocab = vocab
        mask_file = _resolve_file(pretrained_model_name_or_path, ENTITY_MASK_NAME, kwargs)
        if mask_file is not None:
            shown = load_file(mask_file)["shown"]
            if shown.shape != (model.config.entity_vocab_size,) or shown.dtype != torch.bool:
                raise ValueError(
                    f"checkpoint mismatch in {pretrained_model_name_or_path}: {ENTITY_MASK_NAME} holds a "
                    f"{shown.dtype} tensor of shape {tuple(shown.shape)}, not the table's "
                    f"({model.config.entity_vocab_size},) bool"
                )
            model.set_entity_mask(shown)
        return loaded

    @classmethod
    def _from_config(cls, config, **kwargs):
        """`from_config` (as the Auto classes call it) builds the class of the config's variant."""
        model_class = cls._class_for_variant(config)
        if model_class is not cls:
            return model_class._from_config(config, **kwargs)
        return super()._from_config(config, **kwargs)


# What `from_pretrained` passes on to the config's own `from_pretrained` when it loads the config to pick the class.
_CONFIG_LOADING_KWARGS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder")


def _resolve_file(path, name: str, kwargs) -> str | None:
    """Finds the file `name` (`entity_vocab.json`, `entity_mask.safetensors`) in a local directory or a Hub
    repository; None when there is none."""
    if path is None:  # from_pretrained(None, config=..., state_dict=...)
        return None
    path = os.fspath(path)
    if os.path.isdir(path):
        candidate = os.path.join(path, kwargs.get("subfolder", "") or "", name)
        return candidate if os.path.isfile(candidate) else None
    from transformers.utils import cached_file

    return cached_file(
        path,
        name,
        revision=kwargs.get("revision"),
        cache_dir=kwargs.get("cache_dir"),
        token=kwargs.get("token"),
        local_files_only=kwargs.get("local_files_only", False),
        subfolder=kwargs.get("subfolder", "") or "",
        _raise_exceptions_for_missing_entries=False,
        _raise_exceptions_for_connection_errors=False,
    )


__all__ = ["EDMemHubMixin"]

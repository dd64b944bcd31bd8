"""edmem-hf: EDMem (encoder-decoder with an entity memory) for Hugging Face Transformers.

Importing the package registers the EDMem config and models with the Auto classes and for Hub custom code.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from .configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN, EDMemConfig
from .entity_vocab import EntityVocab
from .modeling_edmem import (
    EDMemEncDecForConditionalGeneration,
    EDMemEncDecModel,
    EDMemEncMemModel,
    EDMemForConditionalGeneration,
    EDMemForEntityLinking,
    EDMemModel,
    EDMemPreTrainedModel,
    EntityMemory,
    EntityMemoryAccess,
)
from .notices import quiet_third_party_notices

__version__ = "0.1.0"

quiet_third_party_notices()  # DeepSpeed's hardware warning where DeepSpeed is not in use; the Trainer's "share" line

AutoConfig.register("edmem", EDMemConfig, exist_ok=True)
AutoModel.register(EDMemConfig, EDMemModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(EDMemConfig, EDMemForConditionalGeneration, exist_ok=True)
# A config class maps to one class per Auto class: these two load a saved EncDec or EncMem into its own class
# (modeling_edmem.VARIANT_CLASSES). Each class is saved as Hub code for its Auto class.
EDMemConfig.register_for_auto_class()
EDMemModel.register_for_auto_class("AutoModel")
EDMemEncDecModel.register_for_auto_class("AutoModel")
EDMemEncMemModel.register_for_auto_class("AutoModel")
EDMemForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")
EDMemEncDecForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")

__all__ = [
    "ENTITY_END_TOKEN",
    "ENTITY_START_TOKEN",
    "EDMemConfig",
    "EDMemEncDecForConditionalGeneration",
    "EDMemEncDecModel",
    "EDMemEncMemModel",
    "EDMemForConditionalGeneration",
    "EDMemForEntityLinking",
    "EDMemModel",
    "EDMemPreTrainedModel",
    "EntityMemory",
    "EntityMemoryAccess",
    "EntityVocab",
]

"""EDMem follows Transformers' conventions where its common tests found it did not (issue 13's four defects)."""

import pytest
import torch
from transformers import BartConfig, BartForConditionalGeneration

from edmem_hf import (
    EDMemConfig,
    EDMemEncDecForConditionalGeneration,
    EDMemEncDecModel,
    EDMemEncMemModel,
    EDMemForConditionalGeneration,
    EDMemForEntityLinking,
    EDMemModel,
)
from edmem_hf.modeling_edmem import EDMemDecoder, EDMemEncoder
from tiny_models import EE, ES, N_ENTITIES, tiny_batch, tiny_config, tiny_model


def test_return_dict_false_returns_tuples():
    model = tiny_model()
    model.eval()
    batch = tiny_batch()
    expected = model(**batch)
    as_tuple = model(**batch, return_dict=False)
    assert isinstance(as_tuple, tuple)
    assert torch.equal(as_tuple[0], expected.loss) and torch.equal(as_tuple[1], expected.logits)

    model.config.return_dict = False  # the config's default, as Transformers' tests set it
    from_config = model(**batch)
    assert isinstance(from_config, tuple) and torch.equal(from_config[1], expected.logits)
    base = EDMemModel(tiny_config(return_dict=False)).eval()
    assert isinstance(base(batch["input_ids"], batch["attention_mask"]), tuple)
    encmem = EDMemForEntityLinking(tiny_config(variant="encmem")).eval()
    assert isinstance(encmem(batch["input_ids"], batch["attention_mask"], return_dict=False), tuple)


def test_from_pretrained_without_a_path_takes_config_and_state_dict():
    model = tiny_model(seed=3).eval()
    loaded = EDMemForConditionalGeneration.from_pretrained(None, config=model.config, state_dict=model.state_dict())
    loaded.eval()
    batch = tiny_batch()
    assert torch.equal(model(**batch).logits, loaded(**batch).logits)
    assert loaded.entity_vocab is None


def _bart_twin(config: EDMemConfig) -> BartForConditionalGeneration:
    """A BART of EDMem's widths and depths: the paper's starting point."""
    shared = "vocab_size d_model encoder_layers decoder_layers encoder_attention_heads decoder_attention_heads"
    shared += " encoder_ffn_dim decoder_ffn_dim max_position_embeddings pad_token_id"
    return BartForConditionalGeneration(BartConfig(**{name: getattr(config, name) for name in shared.split()}))


def test_loading_a_bart_checkpoint_reports_and_initialises_every_edmem_weight(tmp_path):
    config = tiny_config()
    torch.manual_seed(0)
    bart = _bart_twin(config)
    bart.save_pretrained(tmp_path)

    model, info = EDMemForConditionalGeneration.from_pretrained(tmp_path, config=config, output_loading_info=True)
    edmem_only = {
        name
        for name, _ in model.named_parameters(remove_duplicate=False)
        if "entity" in name or ".memory." in name or name.startswith("entity_linking_head")
    }
    assert edmem_only, "the tiny model has memory weights"
    assert {"model.entity_embeddings.weight", "entity_linking_head.query_proj.weight"} <= set(info["missing_keys"])
    assert {"model.encoder.memory.query_proj.weight", "model.decoder.memory.output_proj.bias"} <= set(
        info["missing_keys"]
    )
    assert not info["unexpected_keys"]
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        assert tensor.device.type != "meta", f"{name} was left on the meta device"
        assert torch.isfinite(tensor).all(), f"{name} was not initialised"
    table = model.model.entity_embeddings.weight
    assert table.std() > 0
    assert model.model.encoder.entity_embeddings.weight is table
    assert model.model.decoder.entity_embeddings.weight is table
    # BART's own weights arrive unchanged, and a forward with mentions runs
    assert torch.equal(model.model.shared.weight, bart.model.shared.weight)
    assert torch.equal(model.model.encoder.layers[1].fc1.weight, bart.model.encoder.layers[1].fc1.weight)
    model.eval()
    out = model(**tiny_batch(), output_attended_entities=True)
    assert torch.isfinite(out.loss)
    assert out.encoder_attended_entities.top_entity_ids.shape[0] == 3


def test_get_encoder_takes_the_modality_argument():
    model = tiny_model()
    assert model.get_encoder() is model.model.encoder
    assert model.get_encoder(modality=None) is model.model.encoder
    assert model.get_decoder() is model.model.decoder


def test_memory_reports_are_none_unless_asked_for():
    model = tiny_model().eval()
    batch = {k: v for k, v in tiny_batch().items() if k in ("input_ids", "attention_mask")}
    plain = model(**batch)
    assert plain.encoder_attended_entities is None
    assert plain.decoder_attended_entities is None and plain.linked_entities is None
    assert plain.lm_loss is None and plain.entity_loss is None
    # the same fields as BART's output for the same call
    assert set(plain.keys()) == {"logits", "past_key_values", "encoder_last_hidden_state"}
    reported = model(**batch, output_attended_entities=True)
    assert reported.encoder_attended_entities.top_entity_ids.shape == (3, model.config.memory_top_k)
    assert torch.equal(plain.logits, reported.logits)
    linked = model(**batch, entity_linking_top_k=2).linked_entities
    assert linked.top_entity_ids.shape[1] == 2


def test_weights_are_tied_by_tied_weights_keys_alone():
    model = tiny_model()
    keys = model.model._tied_weights_keys
    assert keys == {"encoder.embed_tokens.weight": "shared.weight", "decoder.embed_tokens.weight": "shared.weight"}
    # each stack has a module of its own; tying shares the parameter
    assert model.model.encoder.embed_tokens is not model.model.shared
    assert model.model.encoder.embed_tokens.weight is model.model.shared.weight
    assert model.lm_head.weight is model.model.shared.weight
    # the entity table is one parameter of the model's, which both memories read: nothing ties it
    table = [name for name, _ in model.named_parameters(remove_duplicate=False) if "entity_embeddings" in name]
    assert table == ["model.entity_embeddings.weight"]
    assert (
        model.model.encoder.entity_embeddings is model.model.decoder.entity_embeddings is model.model.entity_embeddings
    )


def _untied_classes_and_configs():
    edmem = tiny_config(tie_word_embeddings=False)
    encdec = tiny_config(variant="encdec", tie_word_embeddings=False)
    encmem = tiny_config(variant="encmem", tie_word_embeddings=False)
    return [
        (EDMemModel, edmem),
        (EDMemForConditionalGeneration, edmem),
        (EDMemEncDecModel, encdec),
        (EDMemEncDecForConditionalGeneration, encdec),
        (EDMemEncMemModel, encmem),
        (EDMemForEntityLinking, encmem),
    ]


@pytest.mark.parametrize("model_class, config", _untied_classes_and_configs())
def test_load_save_without_tied_weights(tmp_path, model_class, config):
    """Transformers' common test of that name (`ModelTesterMixin`), for every class: with tie_word_embeddings=False
    the token embeddings and LM head are parameters of their own, as in BART, saved and loaded with none missing;
    the entity table stays one parameter."""
    torch.manual_seed(0)
    model = model_class(config)
    model.save_pretrained(tmp_path)
    reloaded, info = model_class.from_pretrained(tmp_path, output_loading_info=True)
    reloaded_state = reloaded.state_dict()
    for name, tensor in model.state_dict().items():
        assert name in reloaded_state, f"{name} is missing from the reloaded model"
        torch.testing.assert_close(tensor, reloaded_state[name], msg=f"{name} differs after reloading")
    assert not info["missing_keys"] and not info["unexpected_keys"]
    base = reloaded.base_model
    assert base.encoder.embed_tokens.weight is not base.shared.weight
    output_embeddings = reloaded.get_output_embeddings()
    if output_embeddings is not None:
        assert output_embeddings.weight is not base.shared.weight
    if config.variant != "encdec":
        assert base.encoder.entity_embeddings is base.entity_embeddings
        assert sum("entity_embeddings" in name for name in reloaded_state) == 1


def test_forward_does_not_depend_on_generate():
    """Nothing generate() sets changes what forward computes: same logits before and after, same attributes."""
    model = tiny_model().eval()
    batch = tiny_batch()
    before = model(**batch, output_attended_entities=True)
    attributes = set(vars(model))
    model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=3)
    after = model(**batch, output_attended_entities=True)
    assert torch.equal(before.logits, after.logits)
    assert set(vars(model)) == attributes
    assert N_ENTITIES == model.config.entity_vocab_size


@pytest.mark.parametrize(
    "overrides, problem",
    [
        ({"variant": "bart"}, "variant must be one of"),
        ({"lower_decoder_attends_to": "nowhere"}, "lower_decoder_attends_to must be one of"),
        ({"encoder_lower_layers": -1}, "encoder_lower_layers must be >= 0"),
        ({"decoder_upper_layers": -2}, "decoder_upper_layers must be >= 0"),
        ({"entity_vocab_size": 0}, "entity_vocab_size must be >= 1"),
        ({"entity_start_token_id": None}, "entity_start_token_id and entity_end_token_id must be set"),
        ({"entity_end_token_id": 10_000}, "entity_end_token_id=10000 is outside the vocabulary"),
        ({"entity_start_token_id": -1}, "entity_start_token_id=-1 is outside the vocabulary"),
        ({"entity_end_token_id": ES}, f"entity_start_token_id and entity_end_token_id are both {ES}"),
        ({"pad_token_id": ES}, f"entity_start_token_id and pad_token_id are both {ES}"),
        ({"pad_token_id": EE}, f"entity_end_token_id and pad_token_id are both {EE}"),
        ({"eos_token_id": EE}, f"entity_end_token_id and eos_token_id are both {EE}"),
        ({"bos_token_id": ES}, f"entity_start_token_id and bos_token_id are both {ES}"),
        ({"decoder_start_token_id": ES}, f"entity_start_token_id and decoder_start_token_id are both {ES}"),
        ({"entity_loss_reduction": "sum"}, "entity_loss_reduction must be one of"),
        ({"memory_dropout": 1.0}, "memory_dropout must be in"),
        ({"upper_input_dropout": -0.1}, "upper_input_dropout must be in"),
        ({"memory_top_k": 0}, "memory_top_k must be >= 1 or None"),
        ({"memory_chunk_size": 0}, "memory_chunk_size must be >= 1"),
        ({"decoder_attention_heads": 5}, "d_model must be divisible by the number of attention heads"),
    ],
)
def test_out_of_range_config_values_fail_when_the_config_is_built(overrides, problem):
    """docs/model.md: a ValueError naming the value, raised (wrapped by the strict dataclass) when the config is
    built, directly or from a saved dict."""
    for build in (
        lambda: tiny_config(**overrides),
        lambda: EDMemConfig.from_dict({**tiny_config().to_dict(), **overrides}),
    ):
        with pytest.raises(Exception, match=problem) as raised:
            build()
        assert isinstance(raised.value.__cause__, ValueError) and problem in str(raised.value.__cause__)


def test_in_range_edge_config_values_build():
    # The edges of the ranges above are accepted: no memory top-k, no lower layers, a one-entity memory.
    config = tiny_config(memory_top_k=None, encoder_lower_layers=0, entity_vocab_size=1, memory_chunk_size=1)
    assert config.encoder_layers == 1 and config.memory_top_k is None
    assert tiny_config(variant="encdec", entity_start_token_id=None, entity_end_token_id=None).variant == "encdec"


def test_the_generating_classes_list_generation_mixin_among_their_own_bases():
    """Transformers' common test `test_inherits_generation_mixin`, and the first check of `can_generate()`: the class
    itself lists a `GenerationMixin` (ours is `EDMemGenerationMixin`), not a base one level down."""
    for model_class in (EDMemForConditionalGeneration, EDMemEncDecForConditionalGeneration):
        assert "GenerationMixin" in str(model_class.__bases__), model_class.__bases__
        assert model_class.can_generate()
    for model_class in (EDMemModel, EDMemEncDecModel, EDMemEncMemModel, EDMemForEntityLinking):
        assert not model_class.can_generate(), model_class


@pytest.mark.parametrize("variant", ["edmem", "encdec"])
def test_a_stack_saved_alone_loads_with_its_memory(tmp_path, variant):
    """Transformers' common test `test_encoder_decoder_model_standalone` (BART's tester), with mentions in the input:
    the encoder and the decoder saved alone and loaded with their own class compute what they computed in the model,
    their memory reading the table it read there."""
    model = tiny_model(seed=2, variant=variant).eval()
    if variant == "edmem":
        with torch.no_grad():  # rows far apart, so that what the memory reads shows in the hidden states
            model.model.entity_embeddings.weight.normal_(0.0, 1.0)
    batch = tiny_batch()
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(batch["labels"].clamp_min(0))
    with torch.no_grad():
        outputs = model.model(batch["input_ids"], batch["attention_mask"], decoder_input_ids=decoder_input_ids)
    encoder_output = outputs.encoder_last_hidden_state
    parameters = [name for name, _ in model.named_parameters()]

    model.get_encoder().save_pretrained(tmp_path / "encoder")
    model.get_decoder().save_pretrained(tmp_path / "decoder")
    encoder = EDMemEncoder.from_pretrained(tmp_path / "encoder").eval()
    decoder = EDMemDecoder.from_pretrained(tmp_path / "decoder").eval()
    with torch.no_grad():
        encoded = encoder(batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        decoded = decoder(
            input_ids=decoder_input_ids,
            encoder_hidden_states=encoder_output,
            encoder_attention_mask=batch["attention_mask"],
        ).last_hidden_state
    torch.testing.assert_close(encoded, encoder_output, rtol=0, atol=1e-6)
    torch.testing.assert_close(decoded, outputs.last_hidden_state, rtol=0, atol=1e-6)
    # the model is as it was: one table, read by both stacks through a reference
    assert [name for name, _ in model.named_parameters()] == parameters
    if variant == "edmem":
        table = model.model.entity_embeddings.weight
        assert model.model.encoder.entity_embeddings.weight is table
        assert torch.equal(encoder.entity_embeddings.weight, table) and encoder.memory is not None
        # the memory's reads show: another table gives other hidden states
        with torch.no_grad():
            encoder.entity_embeddings.weight.normal_(0.0, 1.0)
            other = encoder(batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        assert (other - encoder_output).abs().max() > 1e-2
    else:
        assert encoder.memory is None and decoder.memory is None


def test_the_trainer_finds_only_the_fields_every_batch_has_as_labels():
    """The Trainer takes every forward argument named `*label*` as a label and reports `eval_loss` only for batches
    that have all of them: an optional field so named (the writer's) would drop the loss from every evaluation."""
    from transformers.utils import find_labels

    from edmem_hf import EDMemForConditionalGeneration

    assert find_labels(EDMemForConditionalGeneration) == ["labels", "entity_labels", "decoder_entity_labels"]

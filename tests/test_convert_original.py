"""`edmem convert-original`: a state dict in the authors' layout converts to the same model; bad ones name the key."""

from __future__ import annotations

import pickle

import pytest
import torch
from huggingface_hub import ModelCard
from transformers import AutoModelForSeq2SeqLM

from authors_reference import authors_forward
from edmem_hf.cli import main as edmem
from edmem_hf.convert_original import AUTHORS_DEFAULTS, convert_state_dict, load_original_state_dict
from tiny_models import tiny_batch, tiny_model

# What a tiny model's config carries that the shapes cannot tell (the authors' defaults are bart-large's).
TINY = dict(encoder_attention_heads=4, decoder_attention_heads=4, entity_start_token_id=5, entity_end_token_id=6)
TINY |= dict(memory_top_k=8, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
TINY |= dict(forced_eos_token_id=2, memory_chunk_size=16, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
TINY |= dict(memory_dropout=0.0, upper_input_dropout=0.0, entity_loss_reduction="labelled_accesses")


def authors_layout(model) -> dict[str, torch.Tensor]:
    """Our weights under the authors' names (the inverse of the conversion, written from their model's modules)."""
    config, ours = model.config, model.state_dict()
    theirs = {"shared.weight": ours["model.shared.weight"], "final_logits_bias": ours["final_logits_bias"]}
    theirs["EntityEmbedding.weight"] = ours["model.entity_embeddings.weight"].t().contiguous()
    for copy in ("EncoderEntityMemory", "DecoderEntityMemory", "EntityLinkHead"):
        theirs[f"{copy}.EntityEmbedding.weight"] = theirs["EntityEmbedding.weight"]
    theirs["LMHead.weight"] = theirs["LowerEncoder.embed_tokens.weight"] = ours["model.shared.weight"]
    theirs["LowerDecoder.embed_tokens.weight"] = ours["model.shared.weight"]
    theirs["LMLoss.weight"] = torch.ones(config.vocab_size + 2)
    for side in ("encoder", "decoder"):
        Side, lower = side.capitalize(), getattr(config, f"{side}_lower_layers")
        for key, tensor in ours.items():
            prefix = f"model.{side}."
            if not key.startswith(prefix):
                continue
            rest = key[len(prefix) :]
            if rest.startswith("layers."):
                index, name = rest[len("layers.") :].split(".", 1)
                part, index = ("Lower", int(index)) if int(index) < lower else ("Upper", int(index) - lower)
                theirs[f"{part}{Side}.layers.{index}.{name}"] = tensor
            elif rest.startswith(("embed_positions.", "layernorm_embedding.")):
                theirs[f"Lower{Side}.{rest}"] = tensor
            elif rest.startswith("memory.query_proj."):
                theirs[f"{Side}EntityMemory.InputLayer.linear.{rest.split('.')[-1]}"] = tensor
            elif rest.startswith("memory.output_proj."):
                theirs[f"{Side}EntityMemory.OutputLayer.linear.{rest.split('.')[-1]}"] = tensor
            elif rest.startswith("memory.layer_norm."):
                theirs[f"{Side}MemoryLayerNorm.{rest.split('.')[-1]}"] = tensor
    for name in ("weight", "bias"):
        theirs[f"EntityLinkHead.InputLayer.linear.{name}"] = ours[f"entity_linking_head.query_proj.{name}"]
    return theirs


def _perturbed_model():
    model = tiny_model(seed=3, max_position_embeddings=64)
    torch.manual_seed(1)
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.copy_(torch.randn_like(tensor) * 0.3)
    return model.eval()


def test_the_authors_layout_converts_back_to_identical_logits_and_losses():
    model = _perturbed_model()
    converted = convert_state_dict(authors_layout(model), **TINY)
    for name in ("encoder_lower_layers", "encoder_upper_layers", "decoder_lower_layers", "decoder_upper_layers"):
        assert getattr(converted.config, name) == getattr(model.config, name), name
    assert converted.config.entity_vocab_size == model.config.entity_vocab_size
    assert converted.config.encoder_ffn_dim == model.config.encoder_ffn_dim
    batch = tiny_batch()
    expected, out = model(**batch, output_attended_entities=True), converted(**batch, output_attended_entities=True)
    assert torch.equal(expected.logits, out.logits) and torch.equal(expected.loss, out.loss)
    assert torch.equal(expected.linked_entities.top_entity_ids, out.linked_entities.top_entity_ids)
    assert converted.lm_head.weight is converted.model.shared.weight
    assert converted.model.encoder.entity_embeddings.weight is converted.model.entity_embeddings.weight
    assert torch.equal(
        model.generate(batch["input_ids"], max_new_tokens=6), converted.generate(batch["input_ids"], max_new_tokens=6)
    )


def test_the_authors_settings_are_the_defaults():
    fitted = dict(encoder_attention_heads=4, decoder_attention_heads=4, entity_start_token_id=5, entity_end_token_id=6)
    converted = convert_state_dict(authors_layout(_perturbed_model()), **fitted)  # a 64-token vocabulary, 4 heads
    for key, value in AUTHORS_DEFAULTS.items():
        if key not in fitted:
            assert getattr(converted.config, key) == value, key


def test_bad_checkpoints_name_the_key():
    good = authors_layout(_perturbed_model())
    wrong_shape = {**good, "EncoderEntityMemory.InputLayer.linear.bias": torch.zeros(3)}
    with pytest.raises(
        ValueError,
        match=r"EncoderEntityMemory.InputLayer.linear.bias has shape \(3,\) but model.encoder.memory.query_proj.bias needs \(16,\)",
    ):
        convert_state_dict(wrong_shape, **TINY)
    missing = {k: v for k, v in good.items() if k != "DecoderMemoryLayerNorm.weight"}
    with pytest.raises(ValueError, match="missing from the checkpoint: model.decoder.memory.layer_norm.weight"):
        convert_state_dict(missing, **TINY)
    with pytest.raises(ValueError, match="unexpected keys in the checkpoint: Extra.weight"):
        convert_state_dict({**good, "Extra.weight": torch.zeros(1)}, **TINY)
    untied = {**good, "LMHead.weight": good["shared.weight"] + 1}
    with pytest.raises(ValueError, match="LMHead.weight should be a copy of shared.weight"):
        convert_state_dict(untied, **TINY)
    with pytest.raises(ValueError, match="EncMem checkpoint"):
        convert_state_dict({**good, "LMHead.transform.dense.linear.weight": torch.zeros(1)}, **TINY)
    with pytest.raises(ValueError, match="'EntityEmbedding.weight' is missing"):
        convert_state_dict({k: v for k, v in good.items() if k != "EntityEmbedding.weight"}, **TINY)


class _Payload:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_cli_writes_a_folder_that_loads_and_refuses_pickled_code(tmp_path, capsys):
    model = _perturbed_model()
    checkpoint = tmp_path / "pytorch_model.bin"
    torch.save(authors_layout(model), checkpoint)
    out = tmp_path / "converted"
    settings = [f"{key}={value}" for key, value in TINY.items()]
    assert edmem(["convert-original", str(checkpoint), str(out), *[a for s in settings for a in ("--set", s)]]) == 0
    assert "1+1 encoder and 1+2 decoder layers" in capsys.readouterr().out
    card = ModelCard.load(out / "README.md")
    assert card.data.pipeline_tag == "text2text-generation" and "custom_code" in card.data.tags
    assert "from `pytorch_model.bin`" in card.text and "1+1 encoder and 1+2 decoder layers" in card.text
    assert "`memory_top_k=8`" in card.text  # the --set value, not the authors' default
    loaded = AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    batch = tiny_batch()
    assert torch.equal(loaded(**batch).logits, model(**batch).logits)
    tiny_options = [a for s in settings for a in ("--set", s)]
    bad = ["convert-original", str(checkpoint), str(tmp_path / "bad"), *tiny_options, "--set", "memory_top_k=0"]
    assert edmem(bad) == 1
    assert "memory_top_k must be >= 1" in capsys.readouterr().err
    malicious = tmp_path / "malicious.bin"
    with open(malicious, "wb") as f:
        pickle.dump({"shared.weight": _Payload()}, f)
    with pytest.raises(ValueError, match="not a plain state dict of tensors"):
        load_original_state_dict(malicious)
    assert "this must never run" not in capsys.readouterr().out
    assert edmem(["convert-original", str(malicious), str(tmp_path / "never")]) == 1
    assert "not a plain state dict" in capsys.readouterr().err and not (tmp_path / "never").exists()


@pytest.mark.parametrize("lower_encoder", [False, True])
def test_converted_model_computes_what_the_authors_forward_computes(lower_encoder):
    """A forward pass written from the authors' code (tests/authors_reference.py) on their state dict, against the
    converted model: logits, the memory's and the entity-linking head's top-k, with a left-padded decoder row."""
    source = "lower" if lower_encoder else "upper"
    model = tiny_model(seed=3, lower_decoder_attends_to=source)
    torch.manual_seed(2)
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.copy_(torch.randn_like(tensor) * 0.3)
    state_dict = authors_layout(model)
    converted = convert_state_dict(state_dict, **{**TINY, "lower_decoder_attends_to": source})
    batch = tiny_batch()
    decoder_input_ids = torch.tensor([[2, 5, 20, 21, 6, 22], [1, 1, 2, 23, 5, 24]])
    decoder_attention_mask = (decoder_input_ids != 1).long()
    with torch.no_grad():
        ours = converted(
            batch["input_ids"],
            batch["attention_mask"],
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            output_attended_entities=True,
        )
        logits, head_top, encoder_top = authors_forward(
            state_dict,
            batch["input_ids"],
            batch["attention_mask"],
            decoder_input_ids,
            decoder_attention_mask,
            heads=4,
            start_id=5,
            top_k=8,
            lower_encoder=lower_encoder,
        )
    real = decoder_attention_mask.bool()
    torch.testing.assert_close(ours.logits[real], logits[real], atol=1e-4, rtol=1e-4)
    assert torch.equal(ours.linked_entities.top_entity_ids, head_top)
    assert torch.equal(ours.encoder_attended_entities.top_entity_ids, encoder_top)

"""`edmem convert-original`: a state dict in the authors' layout converts to the same model; bad ones name the key."""

from __future__ import annotations

import json
import pickle

import pytest
import torch
from huggingface_hub import ModelCard
from transformers import AutoModelForSeq2SeqLM, BartConfig, BartForConditionalGeneration

from authors_reference import authors_encmem_forward, authors_forward, authors_greedy
from conftest import shared_data_path
from edmem_hf import EDMemEncDecForConditionalGeneration, EDMemForEntityLinking, EntityVocab
from edmem_hf.cli import main as edmem
from edmem_hf.convert_original import (
    AUTHORS_DEFAULTS,
    authors_entity_vocab,
    convert_state_dict,
    entity_labels_from_authors,
    entity_names_from_task_files,
    load_original_state_dict,
    read_entity_names,
)
from edmem_hf.entity_vocab import AUTHORS_ID_SPACE
from tiny_models import tiny_batch, tiny_config, tiny_model

# What a tiny model's config carries that the shapes cannot tell (the authors' defaults are bart-large's).
TINY = dict(encoder_attention_heads=4, decoder_attention_heads=4, entity_start_token_id=5, entity_end_token_id=6)
TINY |= dict(memory_top_k=8, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
TINY |= dict(forced_eos_token_id=2, memory_chunk_size=16, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
TINY |= dict(memory_dropout=0.0, upper_input_dropout=0.0, entity_loss_reduction="labelled_accesses")


def authors_layout(model) -> dict[str, torch.Tensor]:
    """Our weights under the authors' names (the inverse of the conversion, written from their model's modules)."""
    config, ours = model.config, model.state_dict()
    encmem = config.variant == "encmem"
    theirs = {"shared.weight": ours["model.shared.weight"]}
    theirs["EntityEmbedding.weight"] = ours["model.entity_embeddings.weight"].t().contiguous()
    for copy in (
        ("EncoderEntityMemory", "EntityLinkHead")
        if encmem
        else ("EncoderEntityMemory", "DecoderEntityMemory", "EntityLinkHead")
    ):
        theirs[f"{copy}.EntityEmbedding.weight"] = theirs["EntityEmbedding.weight"]
    theirs["LowerEncoder.embed_tokens.weight"] = ours["model.shared.weight"]
    theirs["LMLoss.weight"] = torch.ones(config.vocab_size + 2)
    if encmem:  # the BERT-style head of their auto-encoder (src/Modules.py: LMHead)
        theirs["LMHead.decoder.weight"] = ours["model.shared.weight"]
        theirs["LMHead.bias"] = theirs["LMHead.decoder.bias"] = ours["lm_head.decoder.bias"]
        for name in ("weight", "bias"):
            theirs[f"LMHead.transform.dense.linear.{name}"] = ours[f"lm_head.dense.{name}"]
            theirs[f"LMHead.transform.LayerNorm.{name}"] = ours[f"lm_head.layer_norm.{name}"]
    else:
        theirs["final_logits_bias"] = ours["final_logits_bias"]
        theirs["LMHead.weight"] = theirs["LowerDecoder.embed_tokens.weight"] = ours["model.shared.weight"]
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


def _perturbed_model(**overrides):
    model = tiny_model(seed=3, max_position_embeddings=64, **overrides)
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


def _authors_encdec_baseline() -> BartForConditionalGeneration:
    """The authors' EncDec baseline: a `BartForConditionalGeneration` (theirs from transformers 4.15, whose weights
    and layout are 5.23's), tiny, every weight and the final-logits bias random."""
    config = BartConfig(vocab_size=64, d_model=32, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4,
                        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=48,
                        max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(4)
    bart = BartForConditionalGeneration(config)
    with torch.no_grad():
        for tensor in [*bart.parameters(), *bart.buffers()]:
            tensor.copy_(torch.randn_like(tensor) * 0.3)
    return bart.eval()


def test_the_authors_encdec_baseline_converts_to_encdec(tmp_path, capsys):
    """Their EncDec baseline is saved in BART's layout (`model.shared.weight`, ...): it converts to an
    `EDMemEncDecForConditionalGeneration` computing BART's logits."""
    bart = _authors_encdec_baseline()
    checkpoint = tmp_path / "pytorch_model.bin"
    torch.save(bart.state_dict(), checkpoint)  # with the tied copies: embed_tokens and lm_head
    out = tmp_path / "encdec"
    options = ["--set", "encoder_attention_heads=4", "--set", "decoder_attention_heads=4", "--set", "dropout=0.0"]
    assert edmem(["convert-original", str(checkpoint), str(out), *options]) == 0
    printed = capsys.readouterr().out
    assert "converted EDMemEncDecForConditionalGeneration: 1+2 encoder and 1+2 decoder layers" in printed
    assert "no entity memory" in printed and "entity names" not in printed
    loaded = AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    assert isinstance(loaded, EDMemEncDecForConditionalGeneration) and loaded.config.decoder_ffn_dim == 48
    assert "no entity memory, free decoding only" in ModelCard.load(out / "README.md").text
    batch = tiny_batch()  # mentions in the input: tokens like any other to a model without memory
    decoder_input_ids = loaded.prepare_decoder_input_ids_from_labels(batch["labels"])
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    with torch.no_grad():
        expected, ours = (
            bart(**inputs, decoder_input_ids=decoder_input_ids),
            loaded(**inputs, decoder_input_ids=decoder_input_ids),
        )
    torch.testing.assert_close(ours.logits, expected.logits, rtol=0, atol=1e-5)
    # a copy that is not one, and names for a model without memory, are named
    state_dict = bart.state_dict()
    with pytest.raises(ValueError, match="lm_head.weight should be a copy of model.shared.weight"):
        convert_state_dict({**state_dict, "lm_head.weight": state_dict["model.shared.weight"] + 1}, **TINY)
    names = ["--task-data", str(tmp_path / "any.jsonl")]
    assert edmem(["convert-original", str(checkpoint), str(tmp_path / "named"), *options, *names]) == 1
    assert "the EncDec baseline (a BART): it has no entity memory to name" in capsys.readouterr().err


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


def _randomized(model):
    torch.manual_seed(2)
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.copy_(torch.randn_like(tensor) * 0.3)
    return model


def _authors_labels(labels):
    """Our entity labels (-100 = none) in the authors' convention (0 = none)."""
    return labels.masked_fill(labels == -100, 0)


REFERENCE = dict(heads=4, start_id=5, top_k=8)


def test_converted_training_losses_are_the_authors():
    """With dropout off and their divide-by-three, the LM, entity-linking and total losses of a training step."""
    model = _randomized(tiny_model(seed=3))
    state_dict = authors_layout(model)
    converted = convert_state_dict(state_dict, **{**TINY, "entity_loss_reduction": "all_accesses"}).train()
    converted.config.entity_loss_weight = 0.5
    batch = tiny_batch()
    decoder_input_ids = converted.prepare_decoder_input_ids_from_labels(batch["labels"])
    decoder_entity_labels = torch.cat(
        [torch.full_like(batch["decoder_entity_labels"][:, :1], -100), batch["decoder_entity_labels"][:, :-1]], 1
    )  # aligned with the decoder input, as their collator shifts them
    ours = converted(**batch)
    logits, loss, lm_loss, entity_loss = authors_forward(
        state_dict,
        batch["input_ids"],
        batch["attention_mask"],
        decoder_input_ids,
        torch.ones_like(decoder_input_ids),
        lower_encoder=False,
        labels=batch["labels"],
        entity_labels=_authors_labels(batch["entity_labels"]),
        decoder_entity_labels=_authors_labels(decoder_entity_labels),
        entity_loss_weight=0.5,
        **REFERENCE,
    )
    torch.testing.assert_close(ours.logits, logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ours.lm_loss, lm_loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.entity_loss, entity_loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.loss, loss, atol=1e-5, rtol=1e-5)
    # a target without a mention: the decoder's two accesses have none and count as 0 in their mean of three
    labels = torch.tensor([[20, 21, 22, 2], [23, 24, 2, -100]])
    ours = converted(batch["input_ids"], batch["attention_mask"], labels=labels, entity_labels=batch["entity_labels"])
    decoder_input_ids = converted.prepare_decoder_input_ids_from_labels(labels)
    _, _, _, entity_loss = authors_forward(
        state_dict,
        batch["input_ids"],
        batch["attention_mask"],
        decoder_input_ids,
        torch.ones_like(decoder_input_ids),
        lower_encoder=False,
        labels=labels,
        entity_labels=_authors_labels(batch["entity_labels"]),
        decoder_entity_labels=torch.zeros_like(labels),
        **REFERENCE,
    )
    torch.testing.assert_close(ours.entity_loss, entity_loss, atol=1e-5, rtol=1e-5)


def test_converted_greedy_generation_is_the_authors():
    """Cached generation against whole-prefix passes, from a decoder prompt with a mention (the decoder memory)."""
    model = tiny_model(seed=2)
    torch.manual_seed(2)
    with torch.no_grad():  # random weights, LayerNorms left at 1 and 0 (random ones make every step alike)
        for name, tensor in model.named_parameters():
            if "norm" not in name:
                tensor.copy_(torch.randn_like(tensor))
    state_dict = authors_layout(model)
    converted = convert_state_dict(state_dict, **TINY)
    batch = tiny_batch()
    prompt = torch.tensor([[2, 5, 20], [2, 23, 5]])
    options = dict(num_beams=1, do_sample=False, forced_eos_token_id=None, min_length=0)
    ours = converted.generate(
        batch["input_ids"],
        attention_mask=batch["attention_mask"],
        decoder_input_ids=prompt,
        max_new_tokens=8,
        **options,
    )
    theirs = authors_greedy(
        state_dict, batch["input_ids"], batch["attention_mask"], prompt, steps=8, eos=2, pad=1, **REFERENCE
    )
    assert len(set(ours[:, 3:].flatten().tolist())) > 2  # not one token repeated
    assert torch.equal(ours, theirs[:, : ours.shape[1]])


def _perturbed_encmem():
    torch.manual_seed(3)
    model = EDMemForEntityLinking(tiny_config(variant="encmem", decoder_lower_layers=0, decoder_upper_layers=0))
    return _randomized(model).eval()


def test_an_encmem_checkpoint_converts_to_the_authors_encmem():
    model = _perturbed_encmem()
    state_dict = authors_layout(model)
    assert "LMHead.transform.dense.linear.weight" in state_dict and "final_logits_bias" not in state_dict
    converted = convert_state_dict(state_dict, **TINY)
    assert isinstance(converted, EDMemForEntityLinking) and converted.config.variant == "encmem"
    assert converted.lm_head.decoder.weight is converted.model.shared.weight
    batch = tiny_batch()
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    with torch.no_grad():
        ours = converted(**inputs, output_attended_entities=True)
        logits, head_top, encoder_top = authors_encmem_forward(state_dict, **inputs, **REFERENCE)
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(ours.logits[real], logits[real], atol=1e-4, rtol=1e-4)
    assert torch.equal(ours.linked_entities.top_entity_ids, head_top)
    assert torch.equal(ours.attended_entities.top_entity_ids, encoder_top)
    # training: masked-LM labels, the two accesses' NLLs divided by two
    converted = convert_state_dict(state_dict, **{**TINY, "entity_loss_reduction": "all_accesses"}).train()
    mlm_labels = torch.full_like(batch["input_ids"], -100)
    mlm_labels[0, 3], mlm_labels[1, 4] = 12, 17
    ours = converted(**inputs, labels=mlm_labels, entity_labels=batch["entity_labels"])
    _, loss, lm_loss, entity_loss = authors_encmem_forward(
        state_dict, **inputs, labels=mlm_labels, entity_labels=_authors_labels(batch["entity_labels"]), **REFERENCE
    )
    torch.testing.assert_close(ours.lm_loss, lm_loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.entity_loss, entity_loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.loss, loss, atol=1e-5, rtol=1e-5)
    untied = {**state_dict, "LMHead.decoder.weight": state_dict["shared.weight"] * 2}
    with pytest.raises(ValueError, match="LMHead.decoder.weight should be a copy of shared.weight"):
        convert_state_dict(untied, **TINY)


def test_labels_in_the_authors_convention_convert_to_ours():
    labels = torch.tensor([[0, 12, 0], [10, 0, 999]])
    assert entity_labels_from_authors(labels).tolist() == [[-100, 12, -100], [10, -100, 999]]


def test_names_files_in_each_of_the_authors_shapes(tmp_path):
    rows = 14  # rows 0-9 reserved, entities 10-13
    (tmp_path / "entities.json").write_text('["Paris", "Lyon", null, "Nice"]')
    (tmp_path / "all_rows.json").write_text(json.dumps([None] * 10 + ["Paris", "Lyon", None, "Nice"]))
    (tmp_path / "by_id.json").write_text('{"10": "Paris", "11": "Lyon", "13": "Nice"}')
    (tmp_path / "idx2entity.txt").write_text("10\tParis\n11\tLyon\n13\tNice\n")
    expected = {10: "Paris", 11: "Lyon", 13: "Nice"}
    for name in ("entities.json", "all_rows.json", "by_id.json", "idx2entity.txt"):
        assert read_entity_names(tmp_path / name, rows) == expected, name
    vocab = authors_entity_vocab(rows, expected)
    assert len(vocab) == rows and vocab.num_unnamed == 11 and vocab.id_space == AUTHORS_ID_SPACE
    assert vocab.id_of("Nice") == 13 and vocab.names[12] is None
    with pytest.raises(ValueError, match="entity id 12 has no name"):
        vocab.name_of(12)
    vocab.save(tmp_path / "vocab")
    assert EntityVocab.load(tmp_path / "vocab") == vocab
    with pytest.raises(ValueError, match="3 names for a table of 14 rows"):
        (tmp_path / "short.json").write_text('["a", "b", "c"]')
        read_entity_names(tmp_path / "short.json", rows)
    with pytest.raises(ValueError, match="entity id 3 \\('Paris'\\) is outside the table's entities \\(10..13\\)"):
        authors_entity_vocab(rows, {3: "Paris"})
    with pytest.raises(ValueError, match="'x' is not an entity id"):
        (tmp_path / "bad.json").write_text('{"x": "Paris"}')
        read_entity_names(tmp_path / "bad.json", rows)


def test_names_from_the_released_task_files(tmp_path):
    names = entity_names_from_task_files([shared_data_path("edmem_release/data")])
    assert len(names) == 16052
    assert names[3601] == "Nobel Prize in Physics" and names[63130] == "Deadpool (film)"  # nq-test's first two
    conflicting = tmp_path / "conflict.jsonl"
    conflicting.write_text(
        '{"id": "a", "link_target": ["12"], "entity_name": ["Paris"]}\n'
        '{"id": "b", "link_target": ["12"], "entity_name": ["Paris (band)"]}\n'
    )
    with pytest.raises(ValueError, match="line 2: entity 12 is named 'Paris \\(band\\)' here and 'Paris' elsewhere"):
        entity_names_from_task_files([conflicting])


def test_cli_names_the_rows_and_the_names_drive_constrained_decoding(tmp_path, capsys):
    """The converted folder's vocabulary is in the authors' id space; unnamed rows take part in the memory and are
    never spelled: dynamic decoding spells only named entities."""
    from tiny_models import make_word_tokenizer

    model = _perturbed_model()
    checkpoint = tmp_path / "pytorch_model.bin"
    torch.save(authors_layout(model), checkpoint)
    names_file = tmp_path / "names.json"
    named = {i: f"ent{i}" for i in range(10, 40, 3)}
    names_file.write_text(json.dumps({str(i): name for i, name in named.items()}))
    out = tmp_path / "converted"
    options = [a for key, value in TINY.items() for a in ("--set", f"{key}={value}")]
    assert edmem(["convert-original", str(checkpoint), str(out), *options, "--entity-names", str(names_file)]) == 0
    assert f"entity names: {len(named)} of 40 rows named" in capsys.readouterr().out
    assert f"{len(named)} of the 40 rows have a name" in ModelCard.load(out / "README.md").text
    loaded = AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    assert loaded.entity_vocab.id_space == AUTHORS_ID_SPACE and loaded.entity_vocab.num_unnamed == 40 - len(named)
    tokenizer = make_word_tokenizer()
    loaded.resize_token_embeddings(len(tokenizer))
    loaded.config.entity_start_token_id, loaded.config.entity_end_token_id = tokenizer.convert_tokens_to_ids(
        ["<E_s>", "<E_e>"]
    )
    trie = loaded.entity_trie(tokenizer)
    assert len(trie) == 40 and trie.num_sequences == len(named)
    assert trie.sequences_for([13, 14]).tolist()[1] == [-1] * trie.sequences_for([13]).shape[1]
    start = tokenizer.convert_tokens_to_ids("<E_s>")
    input_ids = torch.tensor([[0, start, 7, 8, tokenizer.convert_tokens_to_ids("<E_e>"), 2]])
    output = loaded.generate(
        input_ids,
        entity_decoding="dynamic",
        tokenizer=tokenizer,
        max_new_tokens=12,
        decoder_input_ids=torch.tensor([[2, start]]),
    )
    spelled = tokenizer.decode(output[0, 2:]).split("<E_e>")[0].strip()
    assert spelled in named.values()

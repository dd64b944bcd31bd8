"""The edmem-base / edmem-large presets, `edmem write-preset` and `edmem pretrain --preset`."""

from __future__ import annotations

import json
import os

import pytest
import torch
from huggingface_hub import ModelCard
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer

from edmem_hf import EDMemForConditionalGeneration, EntityVocab
from edmem_hf.cli import main as edmem
from edmem_hf.convert_original import AUTHORS_DEFAULTS
from edmem_hf.presets import AUTHORS_TRAINING, preset_config
from edmem_hf.pretraining import PretrainingArguments, build_config
from edmem_hf.tasks import read_qa
from tiny_models import make_word_tokenizer, run_quietly

# Tiny widths for a preset that gets weights (the full ones are ~2-3 GB).
SMALL = dict(d_model=32, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64)
SMALL |= dict(entity_vocab_size=30, entity_embed_dim=8, max_position_embeddings=64, vocab_size=80)
SMALL |= dict(entity_start_token_id=5, entity_end_token_id=6)


@pytest.mark.parametrize(
    "name, width, heads, ffn, parameters",
    [("edmem-base", 768, 12, 3072, 495_650_816), ("edmem-large", 1024, 16, 4096, 663_613_696)],
)
def test_presets_are_the_authors_model_at_bart_widths(name, width, heads, ffn, parameters):
    config = preset_config(name)
    assert (config.d_model, config.encoder_attention_heads, config.decoder_attention_heads) == (width, heads, heads)
    assert (config.encoder_ffn_dim, config.decoder_ffn_dim) == (ffn, ffn)
    assert (config.vocab_size, config.entity_start_token_id, config.entity_end_token_id) == (50267, 50265, 50266)
    assert (config.encoder_lower_layers, config.encoder_upper_layers) == (4, 8)
    assert (config.decoder_lower_layers, config.decoder_upper_layers) == (4, 8)
    assert (config.entity_vocab_size, config.entity_embed_dim, config.memory_top_k) == (1_000_010, 256, 100)
    assert config.max_position_embeddings == 1024
    for key in ("dropout", "attention_dropout", "activation_dropout", "memory_dropout", "upper_input_dropout"):
        assert getattr(config, key) == 0.1, key
    if name == "edmem-large":
        assert all(getattr(config, key) == value for key, value in AUTHORS_DEFAULTS.items())
    with torch.device("meta"):  # the size docs/hub.md states, with nothing allocated
        assert EDMemForConditionalGeneration(config).num_parameters() == parameters
    assert preset_config(name, memory_top_k=50).memory_top_k == 50


def test_unknown_preset_and_bad_override_fail_naming_the_problem():
    with pytest.raises(ValueError, match="unknown preset 'edmem-xl': choose one of edmem-base, edmem-large"):
        preset_config("edmem-xl")
    with pytest.raises(Exception, match="memory_top_k must be >= 1"):
        preset_config("edmem-base", memory_top_k=0)


def test_pretrain_reads_the_authors_training_values_and_the_preset(tmp_path):
    defaults = PretrainingArguments(output_dir=str(tmp_path))
    assert {key: getattr(defaults, key) for key in AUTHORS_TRAINING} == AUTHORS_TRAINING
    tokenizer = make_word_tokenizer()
    args = PretrainingArguments(output_dir=str(tmp_path), preset="edmem-base", encoder_upper_layers=2)
    config = build_config(args, tokenizer, entity_vocab_size=40)
    assert (config.d_model, config.encoder_attention_heads, config.memory_dropout) == (768, 12, 0.1)
    assert (config.encoder_upper_layers, config.decoder_upper_layers) == (2, 8)  # the option overrides the preset
    assert (config.vocab_size, config.entity_vocab_size) == (len(tokenizer), 40)  # from the tokenizer and corpus
    with pytest.raises(ValueError, match="unknown preset"):
        PretrainingArguments(output_dir=str(tmp_path), preset="bart-large")


def test_write_preset_folders_load_offline_with_and_without_the_package(tmp_path, capsys):
    full, small = tmp_path / "edmem-large", tmp_path / "small"
    assert edmem(["write-preset", "edmem-large", str(full)]) == 0
    assert "edmem-large: config (no weights), d_model 1024" in capsys.readouterr().out
    assert not any(name.endswith(".safetensors") for name in os.listdir(full))
    saved, expected = AutoConfig.from_pretrained(full).to_dict(), preset_config("edmem-large").to_dict()
    for key in ("_name_or_path", "architectures", "auto_map", "transformers_version"):
        saved.pop(key, None), expected.pop(key, None)
    assert saved == expected
    card = ModelCard.load(full / "README.md")
    assert "| entity memory | 1,000,010 rows x 256 |" in card.text and "| parameters | 663,613,696 |" in card.text
    assert "No tokenizer is shipped" in card.text and "`max_grad_norm=0.1`" in card.text
    assert "There are no weights" in card.text

    settings = [arg for key, value in SMALL.items() for arg in ("--set", f"{key}={value}")]
    assert edmem(["write-preset", "edmem-base", str(small), "--random-weights", *settings]) == 0
    model, info = AutoModelForSeq2SeqLM.from_pretrained(small, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    # the random weights are the seed's, whatever the random state before: the same command writes the same folder
    torch.rand(3)
    again, other = tmp_path / "again", tmp_path / "other"
    assert edmem(["write-preset", "edmem-base", str(again), "--random-weights", *settings]) == 0
    assert edmem(["write-preset", "edmem-base", str(other), "--random-weights", "--seed", "1", *settings]) == 0
    weights = {folder: load_file(folder / "model.safetensors") for folder in (small, again, other)}
    assert all(torch.equal(weights[again][key], value) for key, value in weights[small].items())
    assert not all(torch.equal(weights[other][key], value) for key, value in weights[small].items())
    assert model.config.memory_dropout == 0.1 and model.config.entity_vocab_size == 30
    small_card = ModelCard.load(small / "README.md").text
    assert (
        "The weights are random" in small_card and f'from_pretrained("{small}", trust_remote_code=True)' in small_card
    )
    script = f"""
from transformers import AutoConfig, AutoModelForSeq2SeqLM
config = AutoConfig.from_pretrained({str(full)!r}, trust_remote_code=True)
model, info = AutoModelForSeq2SeqLM.from_pretrained({str(small)!r}, trust_remote_code=True, output_loading_info=True)
print(type(config).__name__, config.entity_vocab_size, config.d_model, type(model).__name__, model.config.d_model)
print(json.dumps({{key: sorted(value) for key, value in info.items()}}))
"""
    lines, reports = run_quietly(script, tmp_path)
    assert reports == []
    assert lines[-2] == "EDMemConfig 1000010 1024 EDMemForConditionalGeneration 32"
    assert json.loads(lines[-1]) == {
        "missing_keys": [],
        "unexpected_keys": [],
        "mismatched_keys": [],
        "error_msgs": [],
    }

    assert edmem(["write-preset", "edmem-base", str(tmp_path / "bad"), "--set", "memory_top_k=0"]) == 1
    assert "memory_top_k must be >= 1" in capsys.readouterr().err


def test_write_preset_makes_a_complete_folder_from_a_tokenizer_and_task_files(tmp_path, capsys):
    """Sizes and marker ids from the tokenizer, the entity vocabulary from the task files' links (inputs' and training
    answers'), both saved beside a model that loads and maps the files' entities by name."""
    tokenizer = make_word_tokenizer()
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    record = {"id": "1", "question": "where is paris?", "answer": ["France", "French Republic"]}
    record |= {"link_offset": [9], "link_length": [5], "link_target": ["20"], "entity_name": ["Paris"]}
    record |= {"answer_link_offset": [[0], [0]], "answer_link_length": [[6], [15]]}
    record |= {"answer_link_target": [["11"], ["11"]], "answer_entity_name": [["France"], ["France"]]}
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "edmem_x-train.jsonl").write_text(json.dumps(record) + "\n")
    small = [arg for key, value in SMALL.items() if "token_id" not in key and key not in ("vocab_size", "entity_vocab_size") for arg in ("--set", f"{key}={value}")]  # fmt: skip
    folder = tmp_path / "model"
    argv = ["write-preset", "edmem-base", str(folder), "--random-weights", "--tokenizer", str(tmp_path / "tokenizer")]
    assert edmem([*argv, "--task-data", str(tmp_path / "data"), *small]) == 0
    printed = capsys.readouterr().out
    start, end = tokenizer.convert_tokens_to_ids(["<E_s>", "<E_e>"])
    assert f"tokenizer: {len(tokenizer)} tokens, <E_s> = {start}, <E_e> = {end}" in printed
    assert "entity vocabulary: 2 entities" in printed
    model = AutoModelForSeq2SeqLM.from_pretrained(folder)
    config = model.config
    assert (config.vocab_size, config.entity_start_token_id, config.entity_end_token_id) == (
        len(tokenizer),
        start,
        end,
    )
    assert (config.pad_token_id, config.eos_token_id) == (tokenizer.pad_token_id, tokenizer.eos_token_id)
    assert (
        model.entity_vocab.names == ["France", "Paris"] and config.entity_vocab_size == 2
    )  # in the authors' id order
    assert AutoTokenizer.from_pretrained(folder).convert_tokens_to_ids("<E_s>") == start
    card = ModelCard.load(folder / "README.md").text
    assert f"The tokenizer is shipped ({len(tokenizer)} tokens, `<E_s>` = {start}" in card
    rows = read_qa(tmp_path / "data" / "edmem_x-train.jsonl", model.entity_vocab)
    assert rows[0]["mention_entities"] == [1] and rows[0]["target_mentions"] == [[[0, 6, 0]], [[0, 15, 0]]]
    # an entity_vocab.json instead; a tokenizer without markers, a missing folder: errors naming them
    EntityVocab(["A", "B", "C"]).save(tmp_path / "vocab.json")
    assert (
        edmem(
            [
                "write-preset",
                "edmem-base",
                str(tmp_path / "config-only"),
                "--entity-vocab",
                str(tmp_path / "vocab.json"),
            ]
        )
        == 0
    )
    assert EntityVocab.load(tmp_path / "config-only").names == ["A", "B", "C"]
    assert AutoConfig.from_pretrained(tmp_path / "config-only").entity_vocab_size == 3
    assert edmem(["write-preset", "edmem-base", str(tmp_path / "x"), "--tokenizer", str(tmp_path / "absent")]) == 1
    assert f"--tokenizer {tmp_path / 'absent'}: no such folder" in capsys.readouterr().err

"""The documented path on the released WebQuestions files, from nothing but the README's set-up (docs/fine_tuning.md,
"From the released files to scores"): a tokenizer, a tiny model folder written by one command, fine-tuning on a few
hundred training questions, the whole test file predicted in the dynamic setting, and `edmem evaluate` scoring every
question."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from conftest import shared_data_path
from edmem_hf import EntityVocab
from edmem_hf.cli import main as edmem

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import finetune_qa  # noqa: E402

TINY = dict(d_model=64, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128)
TINY |= dict(encoder_lower_layers=1, encoder_upper_layers=1, decoder_lower_layers=1, decoder_upper_layers=1)
TINY |= dict(entity_embed_dim=16, max_position_embeddings=128)


def test_the_released_wq_files_from_a_new_model_folder_to_scores(tmp_path, capfd, caplog):
    capsys = capfd  # the Trainer's and Transformers' logs go to the process's stderr
    wq = shared_data_path("edmem_release/data/openqa/wq")
    tokenizer, model, run = tmp_path / "wq-tokenizer", tmp_path / "wq-tiny", tmp_path / "wq-tiny-qa"
    corpus = ["--corpus", str(wq / "edmem_wq-train.jsonl"), "--out", str(tokenizer), "--vocab_size", "2000"]
    assert edmem(["train-tokenizer", *corpus]) == 0
    settings = [arg for key, value in TINY.items() for arg in ("--set", f"{key}={value}")]
    folder = ["edmem-base", str(model), "--random-weights", "--tokenizer", str(tokenizer), "--task-data", str(wq)]
    assert edmem(["write-preset", *folder, *settings]) == 0
    assert "<E_s> = 5, <E_e> = 6" in capsys.readouterr().out  # the ids a trained tokenizer gives the markers
    caplog.set_level("INFO", logger="edmem_hf.task_files")
    transformers_logs = logging.getLogger("transformers")  # its own handler, no propagation: caplog's added
    transformers_logs.addHandler(caplog.handler)
    metrics = finetune_qa.main(
        [
            "--model_name_or_path", str(model), "--output_dir", str(run),
            "--train_file", str(wq / "edmem_wq-train.jsonl"), "--max_train_samples", "200",
            "--test_file", str(wq / "edmem_wq-test.jsonl"), "--do_train", "--do_predict",
            "--entity_decoding", "dynamic", "--bad_records", "skip",
            "--num_train_epochs", "6", "--learning_rate", "3e-3", "--warmup_steps", "10", "--dropout", "0",
            "--per_device_train_batch_size", "16", "--per_device_eval_batch_size", "512", "--max_target_length", "8",
            "--save_strategy", "no", "--report_to", "none", "--use_cpu",
        ]
    )  # fmt: skip
    assert metrics["test_count"] == 2032  # every question, record 37's overlapping link left out, not the record
    transformers_logs.removeHandler(caplog.handler)
    log = capfd.readouterr().err + caplog.text
    assert "***** Running training *****" in log and "Num examples = 200" in log  # the Trainer's set-up, logged
    assert "wq-test.jsonl: left out: record '37'" in caplog.text
    assert "2032 records read, skipped: none" in caplog.text and "1 bad links left out" in caplog.text
    # and no noise: no configuration dump, no max_new_tokens/max_length warning, no progress bar in a log
    assert "EDMemConfig {" not in log and "Both `max_new_tokens`" not in log and "it/s]" not in log
    predictions = json.loads((run / "dynamic_predictions.json").read_text())
    test_ids = [json.loads(line)["id"] for line in (wq / "edmem_wq-test.jsonl").read_text().splitlines()]
    assert sorted(predictions) == sorted(test_ids)
    # non-empty, and what dynamic decoding promises: every mention spells an entity of the model's vocabulary (at this
    # budget the model answers most questions with the same frequent answer entity)
    assert all(predictions.values())
    names = set(EntityVocab.load(model).names)
    spans = [text.split("<E_s>")[1].split("<E_e>")[0].strip() for text in predictions.values() if "<E_s>" in text]
    assert len(spans) > 1000 and all(span in names for span in spans)
    capsys.readouterr()
    score = ["--task", "wq", "--data", str(wq / "edmem_wq-test.jsonl"), "--predictions", str(run / "dynamic_predictions.json")]  # fmt: skip
    assert (
        edmem(["evaluate", *score, "--answer-links", str(wq / "entity_linking/sling_invocab-test.json"), "--json"])
        == 0
    )
    scores = json.loads(capsys.readouterr().out)
    assert scores["count"] == 2032 and scores["count_entity"] + scores["count_non_entity"] == 2032
    assert scores["exact_match"] == metrics["test_exact_match"]

"""`edmem demo` runs the whole path offline and leaves a loadable model."""

from __future__ import annotations

import json

import torch
from transformers import AutoModelForSeq2SeqLM

import edmem_hf  # noqa: F401
from edmem_hf.cli import main


def test_demo_end_to_end_with_tiny_settings(tmp_path, capsys):
    out = tmp_path / "demo"
    code = main(
        [
            "demo",
            "--out",
            str(out),
            "--num_entities",
            "24",
            "--pretrain_steps",
            "6",
            "--finetune_epochs",
            "1",
            "--d_model",
            "32",
            "--show_questions",
            "1",
            "--num_proc",
            "1",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    for mode in ("free", "static", "dynamic"):
        assert f"--- {mode} (exact match" in printed
    assert "generated:" in printed and "gold:" in printed
    summary = json.loads((out / "demo_summary.json").read_text())
    assert set(summary["exact_match"]) == {"free", "static", "dynamic"}
    model = AutoModelForSeq2SeqLM.from_pretrained(out / "model")
    assert len(model.entity_vocab) == model.config.entity_vocab_size == summary["entities"]
    assert (out / "model" / "tokenizer.json").is_file()
    assert (out / "pretrain" / "checkpoints").is_dir()
    assert torch.isfinite(next(model.parameters())).all()

"""The README's examples run as written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quickstart_trains_saves_reloads_and_generates_entity_answers(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py"), "--out", str(tmp_path / "model")],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "reloaded EDMemForConditionalGeneration with 6 entities" in out
    for question, answer in (("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome")):
        line = next(line for line in out.splitlines() if f"<E_s> {question} <E_e>?" in line)
        assert line.split("->")[1].strip(" '") == f"<E_s> {answer}<E_e>", line
    assert (tmp_path / "model" / "entity_vocab.json").is_file()

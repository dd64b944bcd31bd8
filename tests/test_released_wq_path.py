"""The documented path on the released WebQuestions files, run as docs/fine_tuning.md writes it ("From the released
files to scores"), from an empty folder: a tokenizer, a tiny model folder written by one command, `edmem finetune` on
a few hundred training questions with the whole test file predicted in the dynamic setting, and `edmem evaluate`
scoring every question with the same figures the fine-tuning report gives."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shlex
from pathlib import Path

from conftest import shared_data_path
from edmem_hf import EntityVocab
from edmem_hf.cli import main as edmem

ROOT = Path(__file__).resolve().parents[1]
WQ = "edmem_release/data/openqa/wq"


def documented_lines() -> list[str]:
    """The lines of the section's bash block, without their comments."""
    section = (ROOT / "docs" / "fine_tuning.md").read_text(encoding="utf-8").split("## From the released files")[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line.split(" #")[0].strip() for line in block.splitlines() if line.strip()]


def run_as_written(lines: list[str], monkeypatch, watch) -> list[str]:
    """Runs the lines as the shell would, from the repository's root: `NAME=$(realpath PATH)`, `mkdir -p DIR && cd
    DIR`, then `edmem` commands with `$NAME` and `~` expanded, each inside `watch(command)`; returns the edmem
    commands run."""
    monkeypatch.chdir(ROOT)
    run = []
    for line in lines:
        if assignment := re.fullmatch(r"(\w+)=\$\(realpath (\S+)\)", line):
            monkeypatch.setenv(assignment.group(1), os.path.realpath(assignment.group(2)))
        elif folder := re.fullmatch(r"mkdir -p (\S+) && cd (\S+)", line):
            assert folder.group(1) == folder.group(2), line
            os.makedirs(os.path.expanduser(folder.group(1)), exist_ok=True)
            monkeypatch.chdir(os.path.expanduser(folder.group(1)))
        else:
            words = [os.path.expanduser(os.path.expandvars(word)) for word in shlex.split(line)]
            assert words[0] == "edmem", f"a line this test does not run: {line}"
            with watch(words[1]):
                assert edmem(words[1:]) == 0, line
            run.append(words[1])
    return run


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(path): (path.stat().st_size, path.stat().st_mtime_ns) for path in sorted(folder.rglob("*"))}


def test_the_documented_wq_path_runs_as_written_from_an_empty_folder(tmp_path, monkeypatch, capfd, caplog):
    data = shared_data_path(WQ)
    before = _snapshot(data)
    monkeypatch.setenv("HOME", str(tmp_path))  # the page's `~/edmem-wq`
    caplog.set_level("INFO", logger="edmem_hf.task_files")
    caplog.set_level("INFO", logger="transformers.trainer")
    transformers_logs = logging.getLogger("transformers")  # its own handler, no propagation: caplog's added
    printed, logged = {}, {}

    @contextlib.contextmanager
    def watch(command: str):
        capfd.readouterr()
        caplog.clear()
        transformers_logs.addHandler(caplog.handler)
        try:
            yield
        finally:
            transformers_logs.removeHandler(caplog.handler)
            printed[command], err = capfd.readouterr()
            logged[command] = err + caplog.text

    assert run_as_written(documented_lines(), monkeypatch, watch) == [
        "train-tokenizer",
        "write-preset",
        "finetune",
        "evaluate",
    ]
    work = tmp_path / "edmem-wq"
    assert os.getcwd() == str(work) and os.environ["WQ"] == str(data.resolve())
    # written only in the working folder (the fine-tuning only under --output_dir), nothing into the data
    assert sorted(os.listdir(work)) == ["wq-tiny", "wq-tiny-qa", "wq-tokenizer"]
    assert _snapshot(data) == before
    assert "<E_s> = 5, <E_e> = 6" in printed["write-preset"]  # the ids a trained tokenizer gives the markers
    log = logged["finetune"]
    assert "***** Running training *****" in log and "Num examples = 200" in log  # the Trainer's set-up, logged
    # the training file's line counts the 200 records used, not the file's 3,400
    assert "edmem_wq-train.jsonl: the first 200 of its 3400 records read (limit 200)" in log
    assert "wq-test.jsonl: left out: record '37'" in log
    assert "2032 records read, skipped: none" in log and "1 bad links left out" in log
    # and no noise: no configuration dump, no max_new_tokens/max_length warning, no progress bar in a log
    assert "EDMemConfig {" not in log and "Both `max_new_tokens`" not in log and "it/s]" not in log
    predictions = json.loads((work / "wq-tiny-qa" / "dynamic_predictions.json").read_text())
    test_ids = [json.loads(line)["id"] for line in (data / "edmem_wq-test.jsonl").read_text().splitlines()]
    assert sorted(predictions) == sorted(test_ids)
    # non-empty, and what dynamic decoding promises: every mention spells an entity of the model's vocabulary (at this
    # budget the model answers most questions with the same frequent answer entity)
    assert all(predictions.values())
    names = set(EntityVocab.load(work / "wq-tiny").names)
    spans = [text.split("<E_s>")[1].split("<E_e>")[0].strip() for text in predictions.values() if "<E_s>" in text]
    assert len(spans) > 1000 and all(span in names for span in spans)
    # edmem evaluate's figures are the fine-tuning report's, on the authors' split (1,803 entity answers, 229 not)
    scores = json.loads(printed["evaluate"])
    metrics = json.loads((work / "wq-tiny-qa" / "test_results.json").read_text())
    assert scores["count"] == metrics["test_count"] == 2032
    assert scores["count_entity"] == metrics["test_count_entity"] == 1803 and scores["count_non_entity"] == 229
    for name in ("exact_match", "exact_match_entity", "exact_match_non_entity"):
        assert scores[name] == metrics[f"test_{name}"], name
    # the model's own split, by its vocabulary: the answers it can spell as entities
    assert metrics["test_count_in_vocab_answer"] == 1246 and metrics["test_count_other_answer"] == 786

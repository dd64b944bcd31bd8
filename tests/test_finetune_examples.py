"""examples/finetune_qa.py and finetune_generation.py: 2-step Seq2SeqTrainer runs on a tiny model, generating in each
decoding mode, with the task's metrics and a predictions file that `edmem evaluate` scores."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edmem_hf import EntityVocab
from edmem_hf.cli import main as edmem
from tiny_models import make_word_tokenizer, make_words, tiny_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import finetune_generation  # noqa: E402
import finetune_qa  # noqa: E402

WORDS = make_words(400)
ENTITIES = [" ".join(WORDS[i : i + 2]) for i in range(0, 40, 2)]  # 20 two-word names


def _qa_record(i: int) -> dict:
    subject, answer = ENTITIES[i % 20], ENTITIES[(i * 7 + 3) % 20]
    question = f"{WORDS[100 + i % 5]} {subject} {WORDS[120 + i % 3]}"
    offset = len(WORDS[100 + i % 5]) + 1
    record = {"id": f"q{i}", "question": question, "answer": [answer if i % 4 else "1987"]}
    record |= {"link_offset": [offset], "link_length": [len(subject)], "link_target": ["0"], "entity_name": [subject]}
    if i % 4:
        record["answer_entity"] = [[0, answer]]
    return record


def _generation_record(i: int) -> dict:
    subject = ENTITIES[i % 20]
    record = {"id": str(i), "input": f"{subject} {WORDS[200 + i % 7]}", "output": [f"{WORDS[300 + i % 9]} {subject}"]}
    record |= {"link_offset": [0], "link_length": [len(subject)], "link_target": ["0"], "entity_name": [subject]}
    return record | {"output_entity_name": [[subject]]}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("finetune")
    tokenizer = make_word_tokenizer(bart_template=True)
    start, end = tokenizer.convert_tokens_to_ids(["<E_s>", "<E_e>"])
    model = tiny_model(vocab_size=len(tokenizer), entity_start_token_id=start, entity_end_token_id=end)
    model.entity_vocab = EntityVocab(ENTITIES + [f"Other {i}" for i in range(20)])
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    for name, make, count in (("qa", _qa_record, 24), ("generation", _generation_record, 16)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(make(i)) + "\n" for i in range(count)))
    return root


def _arguments(folders, out, data, extra=()):
    return [
        "--model_name_or_path", str(folders / "model"), "--output_dir", str(out),
        "--train_file", str(data), "--validation_file", str(data), "--test_file", str(data),
        "--do_train", "--do_eval", "--do_predict", "--max_steps", "2", "--per_device_train_batch_size", "8",
        "--per_device_eval_batch_size", "8", "--eval_strategy", "no", "--save_strategy", "no",
        "--load_best_model_at_end", "false", "--report_to", "none", "--use_cpu", "--max_target_length", "12",
        "--disable_tqdm", "true", *extra,
    ]  # fmt: skip


@pytest.mark.parametrize("mode", ["free", "static", "dynamic"])
def test_qa_fine_tuning_in_each_decoding_mode(folders, tmp_path, mode, capsys):
    data = folders / "qa.jsonl"
    metrics = finetune_qa.main(_arguments(folders, tmp_path, data, ["--entity_decoding", mode]))
    assert metrics["test_count"] == 24 and 0 <= metrics["test_exact_match"] <= 100
    assert "test_exact_match_entity" in metrics and "test_exact_match_non_entity" in metrics
    assert json.loads((tmp_path / "eval_results.json").read_text())["eval_count"] == 24
    predictions = json.loads((tmp_path / f"{mode}_predictions.json").read_text())
    assert sorted(predictions) == sorted(f"q{i}" for i in range(24))
    assert all(isinstance(text, str) for text in predictions.values())
    if mode != "free":  # constrained spans spell names of the vocabulary
        spans = [text.split("<E_s>")[1].split("<E_e>")[0].strip() for text in predictions.values() if "<E_s>" in text]
        assert all(span in ENTITIES or span.startswith("Other") for span in spans if span)
    capsys.readouterr()
    assert (
        edmem(
            [
                "evaluate",
                "--task",
                "nq",
                "--data",
                str(data),
                "--predictions",
                str(tmp_path / f"{mode}_predictions.json"),
                "--json",
            ]
        )
        == 0
    )
    scored = json.loads(capsys.readouterr().out)
    assert scored["exact_match"] == pytest.approx(metrics["test_exact_match"])


def test_the_static_linker_trains_on_entity_answers_only_and_drives_static_decoding(folders, tmp_path):
    data = folders / "qa.jsonl"
    linker = tmp_path / "linker"
    finetune_qa.main(["--objective", "static_linking", *_arguments(folders, linker, data)])
    assert math.isfinite(json.loads((linker / "eval_results.json").read_text())["eval_loss"])
    assert not (linker / "free_predictions.json").exists()  # the linker does not generate
    reader = tmp_path / "qa"
    extra = ["--entity_decoding", "static", "--entity_candidates", "1", "--static_linker", str(linker)]
    metrics = finetune_qa.main(_arguments(folders, reader, data, extra))
    assert metrics["test_count"] == 24 and (reader / "static_predictions.json").exists()


def test_generation_fine_tuning(folders, tmp_path):
    data = folders / "generation.jsonl"
    metrics = finetune_generation.main(
        ["--task", "wow", *_arguments(folders, tmp_path, data, ["--entity_decoding", "dynamic"])]
    )
    for key in ("test_rouge1", "test_rouge2", "test_rougeL", "test_f1", "test_entity_coverage"):
        assert 0 <= metrics[key] <= 100, key
    assert len(json.loads((tmp_path / "dynamic_predictions.json").read_text())) == 16


def test_qa_fine_tuning_runs_unchanged_under_torchrun(folders, tmp_path):
    """Two CPU processes (DDP over gloo): a training step, then predictions gathered in example order, the same as
    one process's (the distributed sampler pads 24 examples to 32)."""
    script = Path(__file__).resolve().parents[1] / "examples" / "finetune_qa.py"
    data = folders / "qa.jsonl"
    trained = _arguments(folders, tmp_path / "trained", data, ["--entity_decoding", "dynamic"])
    predict_only = [a for a in _arguments(folders, tmp_path / "two", data) if a not in ("--do_train", "--do_eval")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    logs = []
    for arguments in (trained, predict_only):
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(script), *arguments]
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        logs.append(result.stdout + result.stderr)
    assert "Total train batch size (w. parallel, distributed & accumulation) = 16" in logs[0]  # 2 x 8
    assert json.loads((tmp_path / "trained" / "test_results.json").read_text())["test_count"] == 24
    finetune_qa.main([a for a in _arguments(folders, tmp_path / "one", data) if a not in ("--do_train", "--do_eval")])
    two = json.loads((tmp_path / "two" / "free_predictions.json").read_text())
    assert two == json.loads((tmp_path / "one" / "free_predictions.json").read_text()) and len(two) == 24

"""`edmem pretrain` killed with SIGKILL in a fresh process, then the same command again: it resumes from the newest
complete checkpoint (skipping one left half-written) and ends with the uninterrupted run's weights, bit for bit.
Also: a resume on another number of processes, and fp16 refused on CPU (it would have no grad scaler to resume)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from transformers import TrainerState

from edmem_hf.pretraining import PretrainingArguments, pretrain

sys.path.insert(0, os.path.dirname(__file__))
from test_collator import make_corpus  # noqa: E402
from test_pretraining import TINY, _argv, _log, _weights  # noqa: E402

# Batch 4 over 64 passages: 16 micro-batches an epoch; accumulation 2: 8 optimizer steps an epoch. Checkpoints at
# steps 3, 6, 9, 12: the step-3 one is in the middle of epoch 0 (6 micro-batches done), and the resumed runs cross
# the epoch boundary. Dropout is on, so its RNG state must come back too.
RUN = ["--max_steps", "12", "--save_steps", "3", "--save_total_limit", "3", "--gradient_accumulation_steps", "2"]
RUN += ["--dropout", "0.1", "--eval_steps", "0", "--max_eval_samples", "8"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), n_train=64, n_validation=16)


def _start(out, corpus) -> subprocess.Popen:
    """`edmem pretrain` in a fresh process, as a user runs it."""
    env = dict(os.environ, ACCELERATE_USE_CPU="true", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "edmem_hf.cli", "pretrain", *_argv(out, corpus, *RUN)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> str:
    """Waits for a run that must succeed; returns its stderr."""
    _, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr[-4000:]
    return stderr


def _kill_when(proc: subprocess.Popen, ready, what: str) -> None:
    """SIGKILLs the run as soon as `ready()` holds (polled every 2 ms); fails if the run ended first."""
    deadline = time.monotonic() + 180
    while not ready():
        assert proc.poll() is None, f"the run ended before {what}: {proc.communicate()[1][-4000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def _logged_steps(out) -> list[int]:
    path = os.path.join(out, "log.jsonl")
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")[:-1]  # the last one may be partly written
    return [record["step"] for record in map(json.loads, lines) if record["type"] == "train"]


def _checkpoint(out, i: int) -> str:
    return os.path.join(out, "checkpoints", f"checkpoint_{i}")


@pytest.fixture(scope="module")
def uninterrupted(corpus, tmp_path_factory):
    """The reference run, started at once so that it overlaps with the killed runs; its weights, once done."""
    out = tmp_path_factory.mktemp("uninterrupted")
    proc = _start(out, corpus)
    weights = {}

    def result():
        if not weights:
            _finish(proc)
            weights.update(_weights(out))
        return weights

    yield result
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def _assert_same_weights(expected, out) -> None:
    resumed = _weights(out)
    assert expected.keys() == resumed.keys()
    for key in expected:
        assert torch.equal(expected[key], resumed[key]), key


def test_sigkill_in_the_middle_of_a_step(corpus, uninterrupted, tmp_path):
    out = tmp_path / "killed"
    proc = _start(out, corpus)
    # Step 4 is logged after its optimizer step: the checkpoint of step 3 is complete and step 5 is under way.
    _kill_when(proc, lambda: 4 in _logged_steps(out), "step 4")
    assert not os.path.exists(out / "model.safetensors")
    newest = TrainerState.load_from_json(os.path.join(_checkpoint(out, 0), "trainer_state.json"))
    assert (newest.global_step, newest.epoch) == (3, 0.375)  # 6 of the epoch's 16 micro-batches: mid-epoch
    killed_at = max(_logged_steps(out))
    assert 4 <= killed_at < 12

    _finish(_start(out, corpus))  # the same command: --resume auto
    starts = [r for r in _log(out) if r["type"] == "start"]
    assert len(starts) == 2 and starts[1]["step"] in (3, 6, 9)
    assert os.path.basename(starts[1]["resumed_from"]) == f"checkpoint_{starts[1]['step'] // 3 - 1}"
    _assert_same_weights(uninterrupted(), out)


def test_sigkill_while_writing_a_checkpoint(corpus, uninterrupted, tmp_path):
    out = tmp_path / "killed"
    proc = _start(out, corpus)
    half_written = _checkpoint(out, 1)  # the step-6 save
    _kill_when(proc, lambda: os.path.isfile(os.path.join(half_written, "model.safetensors")), "the second save")
    state = os.path.join(half_written, "trainer_state.json")
    if os.path.exists(state):
        # The kill landed after the save's last write: remove the file the save writes last, which leaves
        # exactly what a kill during the save leaves.
        os.remove(state)
    assert os.path.isfile(os.path.join(_checkpoint(out, 0), "trainer_state.json"))

    stderr = _finish(_start(out, corpus))  # the same command: --resume auto
    assert "incomplete checkpoint" in stderr and half_written in stderr
    start = [r for r in _log(out) if r["type"] == "start"][-1]
    assert start["resumed_from"] == _checkpoint(out, 0) and start["step"] == 3
    _assert_same_weights(uninterrupted(), out)
    # The incomplete checkpoint was deleted and its number reused by the resumed run.
    assert TrainerState.load_from_json(os.path.join(_checkpoint(out, 1), "trainer_state.json")).global_step == 6


def test_fp16_on_cpu_is_refused(corpus, tmp_path):
    # Accelerate would take fp16 on CPU and train in float32 with no grad scaler to save or resume.
    out = tmp_path / "fp16"
    with pytest.raises(ValueError, match="fp16 needs a GPU"):
        pretrain(
            PretrainingArguments(
                output_dir=str(out), corpus_dir=corpus, mixed_precision="fp16", max_steps=1, report_to="none", **TINY
            )
        )
    assert not os.path.exists(out)


def test_resume_on_another_number_of_processes(corpus, tmp_path):
    """A 1-process run stopped after its step-2 checkpoint, resumed by 2 processes (torchrun, gloo): the
    documented warning, and the run goes on to its last step."""
    out = tmp_path / "resized"
    env = dict(os.environ, ACCELERATE_USE_CPU="true", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    options = _argv(
        out, corpus, "--max_steps", "4", "--save_steps", "2", "--eval_steps", "0", "--max_eval_samples", "8"
    )
    pretrain_cmd = ["-m", "edmem_hf.cli", "pretrain", *options]
    first = subprocess.run([sys.executable, *pretrain_cmd, "--max_steps_this_run", "3"], env=env, capture_output=True)
    assert first.returncode == 0, first.stderr[-4000:]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    second = subprocess.run(torchrun + pretrain_cmd, env=env, capture_output=True, text=True, timeout=240)
    assert second.returncode == 0, second.stderr[-4000:]
    assert "resuming a 1-process run on 2 processes" in second.stderr
    starts = [r for r in _log(out) if r["type"] == "start"]
    assert [(r["num_processes"], r["step"]) for r in starts] == [(1, 0), (2, 2)]
    assert [r["step"] for r in _log(out) if r["type"] == "train"] == [1, 2, 3, 3, 4]
    assert _log(out)[-1] == {**_log(out)[-1], "type": "end", "step": 4}
    assert os.path.isfile(out / "model.safetensors")

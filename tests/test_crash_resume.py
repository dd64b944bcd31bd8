"""`edmem pretrain` killed with SIGKILL in fresh processes (one, or two under torchrun), then the same command again:
it resumes from the newest complete checkpoint (skipping one left half-written) and ends with the uninterrupted
run's weights, bit for bit. Also: the two ranks' batches split each epoch, a 2-process evaluation counts what a
1-process one does, a resume on another number of processes, and fp16's grad-scaler state resumed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch
from transformers import TrainerState

from edmem_hf.pretraining import PretrainingArguments, list_checkpoints, pretrain

sys.path.insert(0, os.path.dirname(__file__))
from test_collator import make_corpus  # noqa: E402
from test_pretraining import TINY, _args, _argv, _log, _weights  # noqa: E402

# Batch 4 over 64 passages: 16 micro-batches an epoch; accumulation 2: 8 optimizer steps an epoch. Checkpoints at
# steps 3, 6, 9, 12: the step-3 one is in the middle of epoch 0 (6 micro-batches done), and the resumed runs cross
# the epoch boundary. Dropout is on, so its RNG state must come back too.
RUN = ["--max_steps", "12", "--save_steps", "3", "--save_total_limit", "3", "--gradient_accumulation_steps", "2"]
RUN += ["--dropout", "0.1", "--eval_steps", "0", "--max_eval_samples", "8"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), n_train=64, n_validation=16)


def _start(out, corpus, options=RUN, hook=None, processes=1) -> subprocess.Popen:
    """`edmem pretrain` in a fresh process as a user runs it (under torchrun for several), in a session of its own
    so that it can be killed whole; with a `hook`, this file is the launcher (see `_launch`)."""
    env = dict(os.environ, ACCELERATE_USE_CPU="true", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    program = ["-m", "edmem_hf.cli", "pretrain"] if hook is None else [os.path.abspath(__file__), hook]
    # --standalone: a rendezvous on a free local port (other test runs may share the machine).
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
    cmd = [sys.executable, *(launcher if processes > 1 else []), *program, *_argv(out, corpus, *options)]
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def _finish(proc: subprocess.Popen) -> str:
    """Waits for a run that must succeed; returns its stderr."""
    _, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr[-4000:]
    return stderr


def _kill_when(proc: subprocess.Popen, ready, what: str) -> None:
    """SIGKILLs the run and every process it started as soon as `ready()` holds (polled every 2 ms); fails if the
    run ended first. torchrun starts each worker in a session of its own, so killing its process group alone
    would leave the workers training: they are killed one by one."""
    deadline = time.monotonic() + 180
    while not ready():
        assert proc.poll() is None, f"the run ended before {what}: {proc.communicate()[1][-4000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)
    workers = psutil.Process(proc.pid).children(recursive=True)
    os.killpg(proc.pid, signal.SIGKILL)
    for worker in workers:
        with contextlib.suppress(psutil.NoSuchProcess):
            worker.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    _, alive = psutil.wait_procs(workers, timeout=60)
    assert all(p.status() == psutil.STATUS_ZOMBIE for p in alive), alive


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
    """The reference run, started at once so that it overlaps with the killed runs; its output directory, once
    done."""
    out = tmp_path_factory.mktemp("uninterrupted")
    proc = _start(out, corpus)

    def result():
        if proc.returncode is None:
            _finish(proc)
        return out

    yield result
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def _assert_same_weights(reference, out) -> None:
    expected, resumed = _weights(reference), _weights(out)
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


# --- two processes ---------------------------------------------------------------------------------------

# Per process: batch 4 over 64 passages, 8 micro-batches an epoch (2 processes); accumulation 2: 4 optimizer steps
# an epoch, so the step-2 checkpoint is mid-epoch and the run crosses an epoch boundary. The 10 validation passages
# do not fill the last 2 x 4 evaluation batch: Accelerate pads it with repeated passages (even_batches).
TWO_PROCESS_RUN = ["--max_steps", "6", "--save_steps", "2", "--gradient_accumulation_steps", "2"]
TWO_PROCESS_RUN += ["--dropout", "0.1", "--eval_steps", "2", "--per_device_eval_batch_size", "4"]
TWO_PROCESS_RUN += ["--max_eval_samples", "10"]


@pytest.fixture(scope="module")
def two_processes(corpus, tmp_path_factory):
    """An uninterrupted 2-process run (torchrun, gloo) that records each rank's batches."""
    out = tmp_path_factory.mktemp("two_processes")
    _finish(_start(out, corpus, TWO_PROCESS_RUN, hook="record_batches", processes=2))
    return out


def _batches(out, corpus, rank: int) -> list[tuple[int, list[int]]]:
    """(epoch, passage indices) of each micro-batch rank `rank` trained on, from its labels (the passages)."""
    from datasets import load_from_disk

    train = load_from_disk(os.path.join(corpus, "passages"))["train"]
    index = {tuple(ids): i for i, ids in enumerate(train["input_ids"])}
    assert len(index) == len(train)  # distinct passages: a batch names its passages
    with open(os.path.join(out, f"batches_rank{rank}.jsonl"), encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    return [(r["epoch"], [index[tuple(ids)] for ids in r["passages"]]) for r in records]


def test_two_processes_split_each_epoch(corpus, two_processes):
    log = _log(two_processes)
    start = [r for r in log if r["type"] == "start"][0]
    assert start["num_processes"] == 2 and "MULTI_CPU" in start["distributed_type"]
    assert [r["step"] for r in log if r["type"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in log if r["type"] == "eval"] == [2, 4, 6]
    assert [os.path.basename(p) for p in list_checkpoints(str(two_processes))] == [
        "checkpoint_0",
        "checkpoint_1",
        "checkpoint_2",
    ]
    # Each rank saved its own RNG state.
    assert {f for f in os.listdir(_checkpoint(two_processes, 2)) if f.startswith("random_states")} == {
        "random_states_0.pkl",
        "random_states_1.pkl",
    }
    assert os.path.isfile(two_processes / "model.safetensors")

    ranks = [_batches(two_processes, corpus, rank) for rank in (0, 1)]
    for batches in ranks:
        assert [epoch for epoch, _ in batches] == [0] * 8 + [1] * 4  # 6 steps of 2 micro-batches
        assert all(len(passages) == 4 for _, passages in batches)
    epoch_0 = [[i for epoch, passages in batches if epoch == 0 for i in passages] for batches in ranks]
    assert len(set(epoch_0[0])) == len(set(epoch_0[1])) == 32
    assert not set(epoch_0[0]) & set(epoch_0[1])
    assert set(epoch_0[0]) | set(epoch_0[1]) == set(range(64))
    epoch_1 = [{i for epoch, passages in batches if epoch == 1 for i in passages} for batches in ranks]
    assert len(epoch_1[0]) == len(epoch_1[1]) == 16 and not epoch_1[0] & epoch_1[1]


def test_two_processes_evaluate_like_one(corpus, two_processes, tmp_path):
    """The masked tokens and mentions counted by a 2-process evaluation are a 1-process one's on the same data:
    the passages repeated to pad the last batch are not counted twice."""
    evals = [r for r in _log(two_processes) if r["type"] == "eval"]
    one = tmp_path / "one_process"
    pretrain(_args(corpus, one, max_steps=1, max_eval_samples=10, per_device_eval_batch_size=4))
    (expected,) = [r for r in _log(one) if r["type"] == "eval"]
    assert expected["eval_masked_tokens"] > 0 and expected["eval_masked_mentions"] > 0
    for record in evals:
        assert record["eval_masked_tokens"] == expected["eval_masked_tokens"]
        assert record["eval_masked_mentions"] == expected["eval_masked_mentions"]


def test_two_processes_sigkill_and_resume(corpus, two_processes, tmp_path):
    out = tmp_path / "killed"
    proc = _start(out, corpus, TWO_PROCESS_RUN, hook="record_batches", processes=2)
    # Step 3 is logged after its optimizer step: the step-2 checkpoint is complete and step 4 is under way.
    _kill_when(proc, lambda: 3 in _logged_steps(out), "step 3")
    assert not os.path.exists(out / "model.safetensors")
    for rank in (0, 1):
        os.remove(out / f"batches_rank{rank}.jsonl")  # keep the resumed run's batches only

    _finish(_start(out, corpus, TWO_PROCESS_RUN, hook="record_batches", processes=2))  # --resume auto
    starts = [r for r in _log(out) if r["type"] == "start"]
    assert len(starts) == 2 and starts[1]["step"] in (2, 4) and starts[1]["num_processes"] == 2
    assert os.path.basename(starts[1]["resumed_from"]) == f"checkpoint_{starts[1]['step'] // 2 - 1}"
    _assert_same_weights(two_processes, out)
    # Each rank went on with the very batches the uninterrupted run trained on after that step.
    for rank in (0, 1):
        resumed = _batches(out, corpus, rank)
        assert len(resumed) == 2 * (6 - starts[1]["step"])
        assert resumed == _batches(two_processes, corpus, rank)[-len(resumed) :]


# --- fp16 ------------------------------------------------------------------------------------------------


def _scaler_state(out, i: int) -> dict:
    return torch.load(os.path.join(_checkpoint(out, i), "scaler.pt"))


def test_fp16_grad_scaler_state_resumes(corpus, uninterrupted, tmp_path):
    """The real loop under fp16 autocast with a grad scaler (on CPU, only through the `cpu_fp16` hook: Accelerate
    gives none there), killed mid-step and resumed: the scaler's scale and growth tracker at every later
    checkpoint, and the final weights, are the uninterrupted run's."""
    options = [*RUN, "--save_total_limit", "4"]  # keep the four checkpoints (steps 3, 6, 9, 12)
    reference, out = tmp_path / "reference", tmp_path / "killed"
    reference_run = _start(reference, corpus, options, hook="cpu_fp16")
    proc = _start(out, corpus, options, hook="cpu_fp16")
    _kill_when(proc, lambda: 4 in _logged_steps(out), "step 4")
    _finish(_start(out, corpus, options, hook="cpu_fp16"))  # --resume auto
    _finish(reference_run)

    starts = [r for r in _log(out) if r["type"] == "start"]
    assert [r["mixed_precision"] for r in starts] == ["fp16", "fp16"]
    resumed_from = starts[1]["step"] // 3 - 1
    assert 0 <= resumed_from < 3
    # The scaler moved (grew every 2 good steps, backed off on overflows): a resume that lost its state would
    # restart from the initial scale and tracker.
    state = _scaler_state(out, resumed_from)
    assert (state["scale"], state["_growth_tracker"]) != (65536.0, 0)
    assert len({_scaler_state(reference, i)["scale"] for i in range(4)}) > 1
    for i in range(resumed_from + 1, 4):
        assert _scaler_state(out, i) == _scaler_state(reference, i), i
    _assert_same_weights(reference, out)
    # float16 autocast really ran: the first loss is near the float32 run's (same weights and batch), not equal.
    fp16_loss = next(r["loss"] for r in _log(reference) if r["type"] == "train")
    fp32_loss = next(r["loss"] for r in _log(uninterrupted()) if r["type"] == "train")
    assert fp16_loss != fp32_loss and fp16_loss == pytest.approx(fp32_loss, rel=0.01)


# --- the launcher of the hooked runs ---------------------------------------------------------------------


def _launch(hook: str, argv: list[str]) -> int:
    """`edmem pretrain ARGV` with a hook the test installs (this file run as a script, under torchrun too).

    - `record_batches`: before each micro-batch the loop trains on, appends its epoch and passages (the labels,
      which are the original passages) to OUTPUT_DIR/batches_rank<RANK>.jsonl;
    - `cpu_fp16`: gives Accelerate on CPU what it gives on a GPU for fp16, float16 autocast and a grad scaler
      (`torch.amp.GradScaler("cpu")`, growing every 2 steps), whatever `--mixed_precision` says; the loop,
      which refuses `--mixed_precision fp16` on CPU, runs unchanged.
    """
    from accelerate import Accelerator

    from edmem_hf import pretraining

    if hook == "record_batches":
        path = os.path.join(argv[argv.index("--output_dir") + 1], f"batches_rank{os.environ.get('RANK', '0')}.jsonl")
        forward_backward = pretraining._PretrainingRun._forward_backward

        def recording_forward_backward(run, batch):
            passages = [[t for t in row if t != -100] for row in batch["labels"].tolist()]
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"epoch": run.progress.epoch, "passages": passages}) + "\n")
            forward_backward(run, batch)

        pretraining._PretrainingRun._forward_backward = recording_forward_backward
    elif hook == "cpu_fp16":
        accelerator_init = Accelerator.__init__

        def fp16_accelerator_init(accelerator, *args, **kwargs):
            accelerator_init(accelerator, *args, **{**kwargs, "mixed_precision": "fp16"})
            accelerator.native_amp = True  # `prepare` wraps the model's forward in float16 autocast
            accelerator.scaler = torch.amp.GradScaler("cpu", growth_interval=2)

        Accelerator.__init__ = fp16_accelerator_init
    else:
        raise ValueError(f"unknown hook {hook!r}")
    return pretraining.cli_main(argv)


if __name__ == "__main__":
    sys.exit(_launch(sys.argv[1], sys.argv[2:]))

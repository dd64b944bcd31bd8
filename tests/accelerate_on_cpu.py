"""`edmem pretrain` under a sharding engine of examples/accelerate_configs (FSDP, DeepSpeed) on 2 CPU processes, as
tests/test_fsdp.py and tests/test_deepspeed.py run it: `accelerate launch` of a test file's hook (Accelerate runs
these engines on accelerators only, and on CPU falls back to plain data parallelism, `DistributedType.MULTI_CPU`),
a run killed with SIGKILL and resumed to an uninterrupted run's weights, and a final model loaded in one process."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable

import torch
import yaml

sys.path.insert(0, os.path.dirname(__file__))
from test_crash_resume import _assert_same_weights, _finish, _kill_when, _logged_steps  # noqa: E402
from test_pretraining import _argv, _log  # noqa: E402

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "examples", "accelerate_configs")

# Per process: batch 4 over 32 passages, 4 micro-batches an epoch (2 processes). Checkpoints at steps 2, 4, 6:
# the resumed run crosses the epoch boundary. Dropout is on, so its RNG state must come back too.
RUN = ["--max_steps", "6", "--save_steps", "2", "--save_total_limit", "3", "--dropout", "0.1"]
RUN += ["--eval_steps", "0", "--max_eval_samples", "8"]
CORPUS = dict(n_train=32, n_validation=8)  # test_collator.make_corpus


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_on_two_cpus(config_name: str, tmp_path, out, corpus, argv: list[str], hook: list[str] | None):
    """`accelerate launch` of `edmem pretrain ARGV` with examples/accelerate_configs/CONFIG_NAME turned into 2
    processes on this CPU machine, through `hook` (a script and its arguments, which runs `edmem pretrain`) or as a
    user runs it, in a session of its own so that it can be killed whole. Returns the `subprocess.Popen`."""
    with open(os.path.join(CONFIGS, config_name), encoding="utf-8") as f:
        config = yaml.safe_load(f)
    config.update(num_machines=1, num_processes=2, use_cpu=True, mixed_precision="no", main_process_ip="127.0.0.1")
    config["main_process_port"] = _free_port()
    config_file = tmp_path / f"cpu_{config['main_process_port']}_{config_name}"
    config_file.write_text(yaml.safe_dump(config))
    program = hook if hook is not None else ["-m", "edmem_hf.cli", "pretrain"]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_file), *program]
    env = dict(os.environ, ACCELERATE_USE_CPU="true", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.Popen(
        [*cmd, *_argv(out, corpus, *argv)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def sigkill_resume_and_compare(
    start: Callable[[object], subprocess.Popen], tmp_path, request, distributed_type: str, check_checkpoint
):
    """`start(output_dir)` (a RUN) twice at once: one run to the end, the other SIGKILLed after step 3 (the step-2
    checkpoint complete, step 4 under way), `check_checkpoint(path)` of its first checkpoint, then resumed by the
    same command (--resume auto) under `distributed_type`; the two end with the same weights, bit for bit. Returns
    the output directory of the resumed run."""
    reference, out = tmp_path / "uninterrupted", tmp_path / "killed"
    reference_run = start(reference)  # overlaps with the killed run
    request.addfinalizer(lambda: reference_run.poll() is None and os.killpg(reference_run.pid, signal.SIGKILL))
    proc = start(out)
    _kill_when(proc, lambda: 3 in _logged_steps(out), "step 3")
    assert not os.path.exists(out / "model.safetensors")
    check_checkpoint(os.path.join(out, "checkpoints", "checkpoint_0"))

    _finish(start(out))
    starts = [r for r in _log(out) if r["type"] == "start"]
    assert [r["distributed_type"] for r in starts] == [distributed_type] * 2
    assert len(starts) == 2 and starts[1]["step"] in (2, 4) and starts[1]["num_processes"] == 2
    assert os.path.basename(starts[1]["resumed_from"]) == f"checkpoint_{starts[1]['step'] // 2 - 1}"
    _finish(reference_run)
    assert [r["step"] for r in _log(reference) if r["type"] == "train"] == [1, 2, 3, 4, 5, 6]
    _assert_same_weights(reference, out)
    return out


def assert_loads_in_one_process(out) -> None:
    """The final model, gathered from the shards, loads in one process as the class it was trained as, with its
    own code (not the engine's wrapper classes, such as torch's FSDP ones) for the Hub."""
    from safetensors.torch import load_file
    from transformers import AutoModelForSeq2SeqLM

    with open(out / "config.json", encoding="utf-8") as f:
        config = json.load(f)
    assert config["architectures"] == ["EDMemForConditionalGeneration"]
    assert config["auto_map"]["AutoModelForSeq2SeqLM"] == "modeling_edmem.EDMemForConditionalGeneration"
    assert os.path.isfile(out / "modeling_edmem.py") and not [f for f in os.listdir(out) if f.startswith("_fsdp")]
    model = AutoModelForSeq2SeqLM.from_pretrained(out, trust_remote_code=True)
    assert type(model).__name__ == "EDMemForConditionalGeneration"
    saved = load_file(out / "model.safetensors")
    assert saved.keys() <= model.state_dict().keys()
    for name, param in model.state_dict().items():
        if name in saved:
            assert torch.equal(param, saved[name]), name
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight  # tied again on load
    ids = torch.tensor([[0, 5, 6, 7, 2]])
    assert torch.isfinite(model(input_ids=ids, labels=ids).loss)

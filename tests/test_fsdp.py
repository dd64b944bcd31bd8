"""`edmem pretrain` under FSDP (examples/accelerate_configs/fsdp.yaml, FSDP2's `fully_shard`) on 2 CPU processes
(gloo): sharded checkpoints, killed with SIGKILL and resumed to the uninterrupted run's weights bit for bit, and a
final model that loads in one process.

Accelerate runs FSDP on accelerators only: on CPU it silently falls back to plain data parallelism (pinned below,
so that the test fails once a release shards on CPU and the hook can go). The `cpu_fsdp` hook lets it shard here:
the distributed type is the only thing it changes; the sharding, the checkpoints and the loop are Accelerate's
and ours, unchanged.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest
import torch
import yaml

sys.path.insert(0, os.path.dirname(__file__))
from test_collator import make_corpus  # noqa: E402
from test_crash_resume import _assert_same_weights, _checkpoint, _finish, _kill_when, _logged_steps  # noqa: E402
from test_pretraining import _argv, _log  # noqa: E402

FSDP_YAML = os.path.join(os.path.dirname(__file__), "..", "examples", "accelerate_configs", "fsdp.yaml")

# Per process: batch 4 over 32 passages, 4 micro-batches an epoch (2 processes). Checkpoints at steps 2, 4, 6:
# the resumed run crosses the epoch boundary. Dropout is on, so its RNG state must come back too.
RUN = ["--max_steps", "6", "--save_steps", "2", "--save_total_limit", "3", "--dropout", "0.1"]
RUN += ["--eval_steps", "0", "--max_eval_samples", "8"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), n_train=32, n_validation=8)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tmp_path, out, corpus, *extra: str, hook: bool = True) -> subprocess.Popen:
    """`accelerate launch` of `edmem pretrain` with fsdp.yaml turned into 2 processes on this CPU machine, through
    this file's `cpu_fsdp` hook (or not), in a session of its own so that it can be killed whole."""
    with open(FSDP_YAML, encoding="utf-8") as f:
        config = yaml.safe_load(f)
    config.update(num_machines=1, num_processes=2, use_cpu=True, mixed_precision="no", main_process_ip="127.0.0.1")
    config["main_process_port"] = _free_port()
    config_file = tmp_path / f"fsdp_cpu_{config['main_process_port']}.yaml"
    config_file.write_text(yaml.safe_dump(config))
    program = [os.path.abspath(__file__), "cpu_fsdp"] if hook else ["-m", "edmem_hf.cli", "pretrain"]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_file), *program]
    env = dict(os.environ, ACCELERATE_USE_CPU="true", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.Popen(
        [*cmd, *_argv(out, corpus, *RUN, *extra)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_without_the_hook_accelerate_runs_multi_cpu_not_fsdp(corpus, tmp_path):
    out = tmp_path / "run"
    _finish(_start(tmp_path, out, corpus, "--max_steps", "2", hook=False))
    assert _log(out)[0]["distributed_type"] == "DistributedType.MULTI_CPU"  # FSDP would be DistributedType.FSDP
    # An unsharded checkpoint: one whole model file, not FSDP's per-rank shards (pytorch_model_fsdp_0/).
    assert "model.safetensors" in os.listdir(_checkpoint(out, 0))


def test_fsdp_sigkill_resume_and_load(corpus, tmp_path, request):
    reference, out = tmp_path / "uninterrupted", tmp_path / "killed"
    reference_run = _start(tmp_path, reference, corpus)  # overlaps with the killed run
    request.addfinalizer(lambda: reference_run.poll() is None and os.killpg(reference_run.pid, signal.SIGKILL))
    proc = _start(tmp_path, out, corpus)
    # Step 3 is logged after its optimizer step: the step-2 checkpoint is complete and step 4 is under way.
    _kill_when(proc, lambda: 3 in _logged_steps(out), "step 3")
    assert not os.path.exists(out / "model.safetensors")
    # A sharded checkpoint: each rank wrote its shard of the model and of the optimizer (torch.distributed.checkpoint).
    first = _checkpoint(out, 0)
    for state in ("pytorch_model_fsdp_0", "optimizer_0"):
        assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(os.listdir(os.path.join(first, state)))
    assert not [f for f in os.listdir(first) if f.endswith((".safetensors", ".bin")) and "model" in f]

    _finish(_start(tmp_path, out, corpus))  # the same command: --resume auto
    starts = [r for r in _log(out) if r["type"] == "start"]
    assert [r["distributed_type"] for r in starts] == ["DistributedType.FSDP"] * 2
    assert len(starts) == 2 and starts[1]["step"] in (2, 4) and starts[1]["num_processes"] == 2
    assert os.path.basename(starts[1]["resumed_from"]) == f"checkpoint_{starts[1]['step'] // 2 - 1}"
    _finish(reference_run)
    assert [r["step"] for r in _log(reference) if r["type"] == "train"] == [1, 2, 3, 4, 5, 6]
    _assert_same_weights(reference, out)

    # The final model, gathered from the shards, loads in one process as the class it was trained as, with its
    # own code (not torch's FSDP files) for the Hub.
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
    for name, param in model.state_dict().items():
        if name in saved:
            assert torch.equal(param, saved[name]), name
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight  # tied again on load
    ids = torch.tensor([[0, 5, 6, 7, 2]])
    assert torch.isfinite(model(input_ids=ids, labels=ids).loss)


# --- the launcher of the hooked runs ---------------------------------------------------------------------


def _launch_cpu_fsdp(argv: list[str]) -> int:
    """`edmem pretrain ARGV` (one process of `accelerate launch`) with Accelerate's distributed type set to FSDP on
    CPU: `AcceleratorState` takes the FSDP plugin only from a GPU-like distributed type (MULTI_GPU, MULTI_XPU, ...),
    and gives MULTI_CPU here. FSDP2 itself needs no device check, and `fully_shard` runs on CPU with gloo."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    from edmem_hf import pretraining

    state_init = AcceleratorState.__init__

    def fsdp_state_init(state, *args, fsdp_plugin=None, **kwargs):
        state_init(state, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and state.distributed_type == DistributedType.MULTI_CPU:
            # Both shared states: each AcceleratorState() copies PartialState's in again.
            PartialState().distributed_type = state.distributed_type = DistributedType.FSDP
            state.fsdp_plugin = fsdp_plugin

    AcceleratorState.__init__ = fsdp_state_init
    return pretraining.cli_main(argv)


if __name__ == "__main__":
    assert sys.argv[1] == "cpu_fsdp", sys.argv[1]
    sys.exit(_launch_cpu_fsdp(sys.argv[2:]))

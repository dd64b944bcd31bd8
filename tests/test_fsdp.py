"""FSDP from examples/accelerate_configs/fsdp.yaml on 2 CPU processes (gloo): what Accelerate does with it.

Accelerate shards with FSDP on accelerators only. On CPU it refuses the shipped configuration, and without
`fsdp_sync_module_states` it runs plain multi-CPU data parallelism instead (docs/pretraining.md quotes both).
These tests pin that behaviour, so that they fail when a release allows FSDP on CPU and the sharded path can be
tested here like the plain one.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import yaml

sys.path.insert(0, os.path.dirname(__file__))
from test_collator import make_corpus  # noqa: E402
from test_pretraining import _argv  # noqa: E402

FSDP_YAML = os.path.join(os.path.dirname(__file__), "..", "examples", "accelerate_configs", "fsdp.yaml")
REFUSAL = (
    "RuntimeError: There are currently no available devices found, must be one of 'XPU', 'CUDA', 'MLU', 'NPU', "
    "'MUSA', or 'HPU'."
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), n_train=32, n_validation=8)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch_fsdp_on_cpu(tmp_path, corpus, **fsdp_overrides) -> tuple[subprocess.CompletedProcess, str]:
    """`accelerate launch` of `edmem pretrain` with fsdp.yaml turned into 2 processes on this CPU machine."""
    with open(FSDP_YAML, encoding="utf-8") as f:
        config = yaml.safe_load(f)
    config["fsdp_config"].update(fsdp_overrides)
    config.update(num_machines=1, num_processes=2, use_cpu=True, mixed_precision="no", main_process_ip="127.0.0.1")
    config["main_process_port"] = _free_port()
    config_file = tmp_path / "fsdp_cpu.yaml"
    config_file.write_text(yaml.safe_dump(config))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_file)]
    cmd += ["-m", "edmem_hf.cli", "pretrain", *_argv(out, corpus, "--max_steps", "2", "--save_steps", "1")]
    env = dict(os.environ, ACCELERATE_USE_CPU="true", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    return proc, str(out)


def test_accelerate_refuses_the_fsdp_config_on_cpu(corpus, tmp_path):
    proc, out = _launch_fsdp_on_cpu(tmp_path, corpus)
    assert proc.returncode != 0
    assert REFUSAL in proc.stderr, proc.stderr[-4000:]
    assert not os.path.exists(os.path.join(out, "checkpoints"))


def test_without_sync_module_states_accelerate_runs_multi_cpu_not_fsdp(corpus, tmp_path):
    proc, out = _launch_fsdp_on_cpu(tmp_path, corpus, fsdp_sync_module_states=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(os.path.join(out, "log.jsonl"), encoding="utf-8") as f:
        start = json.loads(f.readline())
    assert start["num_processes"] == 2
    assert start["distributed_type"] == "DistributedType.MULTI_CPU"  # FSDP would be DistributedType.FSDP
    # Unsharded checkpoints: one whole model file, not FSDP's per-rank shards (pytorch_model_fsdp_0/).
    assert sorted(os.listdir(os.path.join(out, "checkpoints")))[-1] == "checkpoint_1"
    assert "model.safetensors" in os.listdir(os.path.join(out, "checkpoints", "checkpoint_1"))

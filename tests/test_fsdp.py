"""`edmem pretrain` under FSDP (examples/accelerate_configs/fsdp.yaml, FSDP2's `fully_shard`) on 2 CPU processes
(gloo): sharded checkpoints, killed with SIGKILL and resumed to the uninterrupted run's weights bit for bit, and a
final model that loads in one process.

Accelerate runs FSDP on accelerators only: on CPU it silently falls back to plain data parallelism (pinned below,
so that the test fails once a release shards on CPU and the hook can go). The `cpu_fsdp` hook lets it shard here:
the distributed type is the only thing it changes; the sharding, the checkpoints and the loop are Accelerate's
and ours, unchanged.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from accelerate_on_cpu import (  # noqa: E402
    CORPUS,
    RUN,
    assert_loads_in_one_process,
    sigkill_resume_and_compare,
    start_on_two_cpus,
)
from test_collator import make_corpus  # noqa: E402
from test_crash_resume import _checkpoint, _finish  # noqa: E402
from test_pretraining import _log  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), **CORPUS)


def _start(tmp_path, out, corpus, *extra: str, hook: bool = True) -> subprocess.Popen:
    """fsdp.yaml on 2 CPU processes, through this file's `cpu_fsdp` hook (or not)."""
    program = [os.path.abspath(__file__), "cpu_fsdp"] if hook else None
    return start_on_two_cpus("fsdp.yaml", tmp_path, out, corpus, [*RUN, *extra], program)


def test_without_the_hook_accelerate_runs_multi_cpu_not_fsdp(corpus, tmp_path):
    out = tmp_path / "run"
    _finish(_start(tmp_path, out, corpus, "--max_steps", "2", hook=False))
    assert _log(out)[0]["distributed_type"] == "DistributedType.MULTI_CPU"  # FSDP would be DistributedType.FSDP
    # An unsharded checkpoint: one whole model file, not FSDP's per-rank shards (pytorch_model_fsdp_0/).
    assert "model.safetensors" in os.listdir(_checkpoint(out, 0))


def _assert_sharded(checkpoint: str) -> None:
    """Each rank wrote its shard of the model and of the optimizer (torch.distributed.checkpoint), and no rank the
    whole model."""
    for state in ("pytorch_model_fsdp_0", "optimizer_0"):
        assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(os.listdir(os.path.join(checkpoint, state)))
    assert not [f for f in os.listdir(checkpoint) if f.endswith((".safetensors", ".bin")) and "model" in f]


def test_fsdp_sigkill_resume_and_load(corpus, tmp_path, request):
    start = functools.partial(_start, tmp_path, corpus=corpus)
    out = sigkill_resume_and_compare(start, tmp_path, request, "DistributedType.FSDP", _assert_sharded)
    assert_loads_in_one_process(out)


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

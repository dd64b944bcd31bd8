"""`edmem pretrain` under DeepSpeed ZeRO-2 and ZeRO-3 (examples/accelerate_configs/deepspeed_zero2.yaml,
deepspeed_zero3.yaml) on 2 CPU processes (gloo): DeepSpeed's per-rank checkpoints, a run killed with SIGKILL and
resumed to the uninterrupted run's weights bit for bit, and a final model that loads in one process.

Accelerate runs DeepSpeed on accelerators only: on CPU it silently falls back to plain data parallelism (pinned
below, so that the test fails once a release runs DeepSpeed on CPU and the hook can go). The `cpu_deepspeed` hook
lets DeepSpeed run here: it sets the distributed type, and skips building a kernel that training does not use;
the engine, the checkpoints and the loop are DeepSpeed's, Accelerate's and ours, unchanged.
"""

from __future__ import annotations

import functools
import importlib.util
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

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None,
    reason="DeepSpeed is not installed (it is in the test extra: pip install -e '.[test]')",
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), **CORPUS)


def _start(config_name, tmp_path, out, corpus, *extra: str, hook: bool = True) -> subprocess.Popen:
    """CONFIG_NAME on 2 CPU processes, through this file's `cpu_deepspeed` hook (or not)."""
    program = [os.path.abspath(__file__), "cpu_deepspeed"] if hook else None
    return start_on_two_cpus(config_name, tmp_path, out, corpus, [*RUN, *extra], program)


def test_without_the_hook_accelerate_runs_multi_cpu_not_deepspeed(corpus, tmp_path):
    out = tmp_path / "run"
    _finish(_start("deepspeed_zero2.yaml", tmp_path, out, corpus, "--max_steps", "2", hook=False))
    assert _log(out)[0]["distributed_type"] == "DistributedType.MULTI_CPU"  # not DistributedType.DEEPSPEED
    # Accelerate's whole-model checkpoint, not DeepSpeed's per-rank files (pytorch_model/).
    assert "model.safetensors" in os.listdir(_checkpoint(out, 0))


def _assert_written_per_rank(stage: int, checkpoint: str) -> None:
    """DeepSpeed's checkpoint: each rank wrote its shard of the optimizer states; under ZeRO-2 rank 0 wrote the
    whole model, under ZeRO-3 each rank its shard of it."""
    optimizer = {f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt" for rank in (0, 1)}
    model = {f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt" for rank in (0, 1)}
    expected = optimizer | (model if stage == 3 else {"mp_rank_00_model_states.pt"})
    assert set(os.listdir(os.path.join(checkpoint, "pytorch_model"))) == expected
    assert not [f for f in os.listdir(checkpoint) if f.endswith((".safetensors", ".bin")) and "model" in f]


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_sigkill_resume_and_load(stage, corpus, tmp_path, request):
    start = functools.partial(_start, f"deepspeed_zero{stage}.yaml", tmp_path, corpus=corpus)
    check_checkpoint = functools.partial(_assert_written_per_rank, stage)
    out = sigkill_resume_and_compare(start, tmp_path, request, "DistributedType.DEEPSPEED", check_checkpoint)
    assert_loads_in_one_process(out)


# --- the launcher of the hooked runs ---------------------------------------------------------------------


def _launch_cpu_deepspeed(argv: list[str]) -> int:
    """`edmem pretrain ARGV` (one process of `accelerate launch`) with Accelerate's distributed type set to DeepSpeed
    on CPU. `AcceleratorState` takes the DeepSpeed plugin only off CPU, and gives MULTI_CPU here; the hook sets the
    plugin up as it would (its mixed precision, selected as the active plugin). DeepSpeed's CPU accelerator then
    runs ZeRO over Accelerate's gloo process group.

    DeepSpeed's communication backend also compiles, at its first start on CPU, a shared-memory all-reduce kernel
    (`deepspeed_shm_comm`, ~50 s on one core) that only its tensor-parallel inference uses
    (`inference_all_reduce`); ZeRO's collectives go through torch.distributed. The hook does not build it."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    from edmem_hf import pretraining

    # The module, not `deepspeed.comm.torch`: that attribute is torch itself (deepspeed.comm imports it).
    torch_backend = importlib.import_module("deepspeed.comm.torch")
    assert hasattr(torch_backend, "build_shm_op"), "DeepSpeed builds its shared-memory kernel elsewhere now"
    torch_backend.build_shm_op = lambda: None
    state_init = AcceleratorState.__init__

    def deepspeed_state_init(state, *args, deepspeed_plugin=None, **kwargs):
        state_init(state, *args, deepspeed_plugin=deepspeed_plugin, **kwargs)
        if deepspeed_plugin is not None and state.distributed_type == DistributedType.MULTI_CPU:
            # Both shared states: each AcceleratorState() copies PartialState's in again.
            PartialState().distributed_type = state.distributed_type = DistributedType.DEEPSPEED
            deepspeed_plugin.set_mixed_precision(state._mixed_precision)
            deepspeed_plugin.select(_from_accelerator_state=True)
            state.deepspeed_plugins = deepspeed_plugin
            state._mixed_precision = "no"  # DeepSpeed's engine casts, as Accelerate leaves it on a GPU

    AcceleratorState.__init__ = deepspeed_state_init
    return pretraining.cli_main(argv)


if __name__ == "__main__":
    assert sys.argv[1] == "cpu_deepspeed", sys.argv[1]
    sys.exit(_launch_cpu_deepspeed(sys.argv[2:]))

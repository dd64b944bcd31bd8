"""Time and peak memory of one full-table memory access with its entity-linking loss, forward + backward.

Ours (`entity_attention`: chunked, running log-sum-exp, recomputing backward) against the dense formula (an
`(M, N)` score matrix, softmax, autograd), side by side in one run. The dense formula needs tens of GB at
N = 1M, so it runs at a smaller N (`--dense-entities`) and its time and extra memory are scaled linearly in N
(both are linear in N: every dense tensor is `(M, N)` or `(N, d)`; RESULT keys ending in `_scaled` are these
extrapolations); ours runs at the full N, in chunks of the model's `memory_chunk_size` unless `--chunk` is given.

Time is the process's CPU time with one torch thread by default (robust to other jobs on a shared machine;
`--threads N` changes it). Peak extra memory is measured in a fresh subprocess per case: peak RSS during the step minus RSS just before it
(inputs already allocated), so only what the access itself allocates counts.

    python benchmarks/bench_memory.py                      # N = 1M, 1,024 mentions, d = 256
    python benchmarks/bench_memory.py --entities 200000    # quicker

Target (issue): peak extra memory under 1/10 of dense at no more than 1.5x its time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def _case(kind: str, num_entities: int, mentions: int, dim: int, chunk: int, repeats: int, threads: int) -> dict:
    import resource

    import torch

    torch.set_num_threads(threads)

    from edmem_hf.entity_attention import dense_entity_attention, entity_attention

    torch.manual_seed(0)
    queries = torch.randn(mentions, dim, requires_grad=True)
    table = (torch.randn(num_entities, dim) * 0.05).requires_grad_(True)
    gold = torch.randint(0, num_entities, (mentions,))
    upstream = torch.randn(mentions, dim)

    def step():
        if kind == "ours":
            read, _, nll, _, _ = entity_attention(queries, table, labels=gold, chunk_size=chunk)
        else:
            read, log_partition = dense_entity_attention(queries, table)
            nll = log_partition - (queries * table[gold]).sum(-1)
        loss = (read * upstream).sum() + nll.mean()
        loss.backward()
        queries.grad = table.grad = None

    def rss_mb() -> float:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    step()  # warm-up (allocator, kernels); also the first peak
    before = rss_mb()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        step()
        times.append(time.process_time() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": min(times), "peak_extra_mb": max(peak - before, 0.0), "baseline_mb": before}


def run_case(kind: str, num_entities: int, mentions: int, dim: int, chunk: int, repeats: int, threads: int) -> dict:
    """Runs one case in a fresh interpreter so that peak RSS belongs to it alone."""
    call = f"_case({kind!r}, {num_entities}, {mentions}, {dim}, {chunk}, {repeats}, {threads})"
    code = f"import json, sys; sys.path.insert(0, {sys.path[0]!r}); from bench_memory import _case; print(json.dumps({call}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entities", type=int, default=1_000_000)
    parser.add_argument("--dense-entities", type=int, default=100_000, help="N for the dense formula (scaled up)")
    parser.add_argument("--mentions", type=int, default=1024)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument(
        "--chunk", type=int, default=None, help="entities per chunk (default: the model's memory_chunk_size)"
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.chunk is None:
        from edmem_hf import EDMemConfig

        args.chunk = EDMemConfig().memory_chunk_size

    # The dense formula at the same N as ours too, for a direct same-N time check where it fits.
    same_n = min(args.dense_entities, args.entities)
    print(f"mentions={args.mentions} d={args.dim} chunk={args.chunk}")
    ours_small = run_case("ours", same_n, args.mentions, args.dim, args.chunk, args.repeats, args.threads)
    dense_small = run_case("dense", same_n, args.mentions, args.dim, args.chunk, args.repeats, args.threads)
    ours = run_case("ours", args.entities, args.mentions, args.dim, args.chunk, args.repeats, args.threads)
    scale = args.entities / same_n
    dense_seconds = dense_small["seconds"] * scale
    dense_mb = dense_small["peak_extra_mb"] * scale
    for name, r, n in (("ours", ours_small, same_n), ("dense", dense_small, same_n), ("ours", ours, args.entities)):
        print(f"{name:>5} N={n:>9,}  {r['seconds']:.3f} s  peak extra {r['peak_extra_mb']:.0f} MB")
    print(f"dense N={args.entities:>9,}  {dense_seconds:.3f} s  peak extra {dense_mb:.0f} MB  (scaled x{scale:g})")
    time_ratio = ours["seconds"] / dense_seconds
    memory_ratio = ours["peak_extra_mb"] / dense_mb
    same_n_time_ratio = ours_small["seconds"] / dense_small["seconds"]
    # `*_scaled`: the dense formula's figures at N, extrapolated linearly from its run at `same_n`.
    print(
        f"RESULT entities={args.entities} mentions={args.mentions} chunk={args.chunk} ours_s={ours['seconds']:.3f} "
        f"dense_s_scaled={dense_seconds:.3f} time_ratio_scaled={time_ratio:.2f} "
        f"same_n_time_ratio={same_n_time_ratio:.2f} ours_peak_mb={ours['peak_extra_mb']:.0f} "
        f"dense_peak_mb_scaled={dense_mb:.0f} memory_ratio_scaled={memory_ratio:.3f}"
    )


if __name__ == "__main__":
    main()

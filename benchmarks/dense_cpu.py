"""The dense CPU kernel vs torch's matmul on a model's worth of weights, 1..16 rows of input, in one run.

    python benchmarks/dense_cpu.py                      # SmolLM2-135M's linear shapes, rows 1,2,3,4,5,6,8,12,16
    python benchmarks/dense_cpu.py --rows 1,4,8 --out dense.json

What a decoder at batch 1 pays: every linear of SmolLM2-135M (30 layers of q, k, v, o, gate, up,
down; the LM head left out) applied once to ``m`` rows of x, with random weights of those shapes
(538 MB fp32: far past the caches, so every pass reads them from memory: the cold figure; there
is no warm one to report). Contenders, timed interleaved in one process, rotating order:
``torch_fp32`` (``F.linear``), ``kernel_fp32`` and ``kernel_bf16`` (``linear_cpu`` with fp32 and
with bf16 weights, x fp32). ``*_over_m1``: a contender's time at m rows over its own time at 1
row: what a speculative verify of m - 1 drafts costs relative to one greedy token (1.0 = free
rows). ``torch_over_kernel``: torch's time over the kernel's at the same m, fp32 weights.
Medians over ``--rounds``; both figures are ratios of medians measured side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from paretolab.kernels.dense_cpu import dense_cpu_kernel, linear_cpu
from paretolab.measure.timing import cpu_name, node_lock, torch_threads

LAYER = ((576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536))  # SmolLM2-135M: q k v o gate up down
LAYERS = 30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,2,3,4,5,6,8,12,16", help="comma-separated row counts m")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=0, help="torch threads, also the kernel's (0: torch's default)")
    parser.add_argument("--out", default="dense_cpu.json")
    args = parser.parse_args()
    if dense_cpu_kernel() is None:
        raise SystemExit("the dense CPU kernel is not built (or PARETOLAB_CPU_KERNELS=0): nothing to compare; "
                         "build it with `pip install -e . --no-deps --no-build-isolation`")
    rows = [int(v) for v in args.rows.split(",")]
    load_before = os.getloadavg()
    with node_lock(), torch_threads(args.threads):
        gen = torch.Generator().manual_seed(0)
        w32 = [torch.randn(n, k, generator=gen) for n, k in LAYER * LAYERS]
        w16 = [w.bfloat16() for w in w32]
        xs = {(m, k): torch.randn(m, k, generator=gen) for m in rows for k in {k for _, k in LAYER}}

        def model_pass(m: int, weights: list[torch.Tensor], fn) -> None:  # type: ignore[no-untyped-def]
            for w in weights:
                fn(xs[(m, w.shape[1])], w)

        contenders = {"torch_fp32": (w32, F.linear), "kernel_fp32": (w32, linear_cpu), "kernel_bf16": (w16, linear_cpu)}
        for m in rows:  # a right answer before any timing
            torch.testing.assert_close(linear_cpu(xs[(m, 576)], w32[0]), F.linear(xs[(m, 576)], w32[0]), rtol=1e-4, atol=1e-4)
        times: dict[tuple[str, int], list[float]] = {}
        cells = [(name, m) for m in rows for name in contenders]
        for r in range(args.rounds + 1):  # round 0 warms up and is dropped
            for name, m in cells[r % len(cells):] + cells[: r % len(cells)]:
                weights, fn = contenders[name]
                start = time.perf_counter()
                model_pass(m, weights, fn)
                if r:
                    times.setdefault((name, m), []).append(time.perf_counter() - start)
        threads = torch.get_num_threads()
    med = {key: statistics.median(v) for key, v in times.items()}
    table = []
    for m in rows:
        cell = {"rows": m, **{f"{name}_ms": round(med[(name, m)] * 1e3, 2) for name in contenders},
                **{f"{name}_over_m1": round(med[(name, m)] / med[(name, rows[0])], 3) for name in contenders},
                "torch_over_kernel": round(med[("torch_fp32", m)] / med[("kernel_fp32", m)], 3)}
        table.append(cell)
        print(f"m={m:2d}  torch {cell['torch_fp32_ms']:6.1f} ms (x{cell['torch_fp32_over_m1']:.2f})  kernel fp32 {cell['kernel_fp32_ms']:6.1f} "
              f"(x{cell['kernel_fp32_over_m1']:.2f})  kernel bf16 {cell['kernel_bf16_ms']:6.1f} (x{cell['kernel_bf16_over_m1']:.2f})  "
              f"torch/kernel {cell['torch_over_kernel']:.2f}", flush=True)
    report = {"benchmark": "dense_cpu", "cpu": cpu_name(), "kernel": dense_cpu_kernel(), "threads": threads, "cpus": os.cpu_count(),
              "weights_mb_fp32": round(sum(w.numel() for w in w32) * 4 / 2**20, 1), "rounds": args.rounds,
              "load_average_before": load_before, "load_average_after": os.getloadavg(), "rows": table}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

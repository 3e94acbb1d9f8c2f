"""The one-token ReLU-GLU FFN on the CPU: the C kernel vs the dense FFN vs the index_select path, at SmolLM2's FFN shape.

    python benchmarks/sparse_ffn_cpu.py                     # 90/95/98 % zeros, torch's threads
    python benchmarks/sparse_ffn_cpu.py --threads 1 --sparsities 0.5 0.9 --out sparse_ffn_cpu_t1.json

Shape: SmolLM2-135M's FFN, hidden 576, intermediate 1536, fp32 weights (as l1_sparsity trains
them). An activation sparsity s is set exactly for the timed token: of the units its gate leaves
positive, all but ``round(1536 * (1 - s))`` get their gate row zeroed (the cost depends on how
many units are active, not which). Batch 1. The contenders, each computing
down(relu(x W_gate) * (x W_up)) for one token:

- ``dense``: three ``F.linear`` calls (what the model does without the sparse path);
- ``dense_kernel``: the same three products through the dense CPU kernel
  (``paretolab.kernels.dense_cpu``: each weight read once at memory speed; the strongest dense
  FFN here, so ``faster_dense_over_kernel`` is the ratio that counts);
- ``index_select``: l1_sparsity's PyTorch sparse path (dense gate, ``index_select`` of the
  active rows of up and of down transposed);
- ``kernel``: ``paretolab.kernels.sparse_ffn_cpu`` (dense gate, then only active rows, in C).

Two working sets: ``hot`` (one layer's weights, called again and again: they stay in the
caches) and ``cold`` (``--layers`` distinct layers cycled, 30 like SmolLM2: ~420 MB, so every
call reads its weights from memory, as in decoding). Calls interleaved, order rotating, medians;
ratios are medians of per-round ratios (> 1: the kernel is faster). ``avoided_share`` is the
honest byte accounting: the share of the dense FFN's weight bytes the kernel does not read
(gate is read in full: which units are active is known only after it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from paretolab.kernels.dense_cpu import dense_cpu_kernel, linear_cpu
from paretolab.kernels.sparse_ffn_cpu import ffn_bytes, sparse_ffn_cpu, sparse_ffn_kernel
from paretolab.measure.timing import cpu_name, node_lock, torch_threads
from paretolab.plugins import l1_sparsity

from macko_cpu import interleaved, ratio  # benchmarks/macko_cpu.py (the script folder is on sys.path)

HIDDEN, UNITS = 576, 1536


def layer(sparsity: float, x: torch.Tensor, seed: int) -> dict[str, torch.Tensor]:
    """Random weights whose gate leaves exactly ``round(UNITS * (1 - sparsity))`` units active for the token ``x``."""
    gen = torch.Generator().manual_seed(seed)
    gate, up = torch.randn(UNITS, HIDDEN, generator=gen) / 24, torch.randn(UNITS, HIDDEN, generator=gen) / 24
    down = torch.randn(HIDDEN, UNITS, generator=gen) / 40
    positive = torch.nonzero(gate @ x.reshape(-1) > 0).squeeze(1)
    keep = int(round(UNITS * (1 - sparsity)))
    if keep > positive.numel():
        raise ValueError(f"--sparsities {sparsity}: at most {positive.numel()} of {UNITS} units are active for this token; pass >= {1 - positive.numel() / UNITS:.2f}")
    gate[positive[torch.randperm(positive.numel(), generator=gen)[keep:]]] = 0.0
    return {"gate": gate, "up": up, "down": down, "down_t": down.t().contiguous()}


def index_select_path(x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    """l1_sparsity's sparse_token_ffn with the C kernel hidden from it: its index_select path."""
    real = l1_sparsity.sparse_ffn_kernel
    l1_sparsity.sparse_ffn_kernel = lambda: None  # type: ignore[assignment]
    try:
        return l1_sparsity.sparse_token_ffn(x, w["gate"], w["up"], w["down_t"], "relu")
    finally:
        l1_sparsity.sparse_ffn_kernel = real  # type: ignore[assignment]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sparsities", nargs="*", type=float, default=[0.9, 0.95, 0.98])
    parser.add_argument("--threads", type=int, default=0, help="torch threads, also the kernel's (0: torch's default)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--layers", type=int, default=30, help="distinct layers cycled in the cold working set")
    parser.add_argument("--out", default="sparse_ffn_cpu.json")
    args = parser.parse_args()
    load_before = os.getloadavg()
    cells = []
    with node_lock(), torch_threads(args.threads), torch.no_grad():
        threads = torch.get_num_threads()
        print(f"kernel path: {sparse_ffn_kernel()}, threads {threads}, load average {load_before[0]:.1f}", flush=True)
        for sparsity in args.sparsities:
            for regime, n in (("hot", 1), ("cold", args.layers)):
                x = torch.randn(1, 1, HIDDEN, generator=torch.Generator().manual_seed(99))
                layers = [layer(sparsity, x, seed=i) for i in range(n)]
                w0 = layers[0]
                dense_out = F.linear(torch.relu(F.linear(x, w0["gate"])) * F.linear(x, w0["up"]), w0["down"])
                kernel_out = sparse_ffn_cpu(x, w0["gate"], w0["up"], w0["down_t"], "relu")
                torch.testing.assert_close(kernel_out, dense_out, rtol=1e-4, atol=1e-5)  # time only a right answer
                active = int((F.linear(x, w0["gate"]) > 0).sum())
                at = {"kernel": 0, "dense": 0, "index_select": 0, "dense_kernel": 0}
                xf = x.reshape(1, HIDDEN)

                def cycled(name: str, call):  # type: ignore[no-untyped-def]
                    def run() -> object:
                        at[name] = (at[name] + 1) % n
                        return call(layers[at[name]])
                    return run

                times = interleaved({
                    "kernel": cycled("kernel", lambda w: sparse_ffn_cpu(x, w["gate"], w["up"], w["down_t"], "relu")),
                    "dense": cycled("dense", lambda w: F.linear(torch.relu(F.linear(x, w["gate"])) * F.linear(x, w["up"]), w["down"])),
                    "index_select": cycled("index_select", lambda w: index_select_path(x, w)),
                    **({"dense_kernel": cycled("dense_kernel", lambda w: linear_cpu(torch.relu(linear_cpu(xf, w["gate"])) * linear_cpu(xf, w["up"]), w["down"]))}
                       if dense_cpu_kernel() else {}),
                }, args.rounds, 30)
                med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
                cell = {"sparsity": sparsity, "regime": regime, "layers": n, "active_units": active,
                        "kernel_us": med["kernel"], "dense_us": med["dense"], "index_select_us": med["index_select"],
                        "dense_over_kernel": ratio(times, "dense", "kernel"),
                        "index_select_over_kernel": ratio(times, "index_select", "kernel"),
                        "dense_over_index_select": ratio(times, "dense", "index_select"),
                        **ffn_bytes(HIDDEN, UNITS, active)}
                if "dense_kernel" in times:
                    cell.update({"dense_kernel_us": med["dense_kernel"], "dense_kernel_over_kernel": ratio(times, "dense_kernel", "kernel")})
                cell["faster_dense_over_kernel"] = min(cell["dense_over_kernel"], cell.get("dense_kernel_over_kernel", float("inf")))
                cells.append(cell)
                print(f"{sparsity:>5.0%} {regime:>4} x{n:<3} active {active:>4}  kernel {med['kernel']:7.1f} us  dense {med['dense']:7.1f}  "
                      f"index_select {med['index_select']:7.1f}  | dense/kernel {cell['dense_over_kernel']:5.2f}  "
                      f"index_select/kernel {cell['index_select_over_kernel']:5.2f}  faster dense/kernel {cell['faster_dense_over_kernel']:5.2f}  "
                      f"bytes avoided {cell['avoided_share']:.0%}", flush=True)
                del layers
    report = {"benchmark": "sparse_ffn_cpu", "cpu": cpu_name(), "kernel": sparse_ffn_kernel(), "threads": threads, "cpus": os.cpu_count(),
              "shape": {"hidden": HIDDEN, "intermediate": UNITS}, "load_average_before": load_before,
              "load_average_after": os.getloadavg(), "cells": cells}
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

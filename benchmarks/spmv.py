"""MACKO SpMV vs dense fp16 matvec vs torch CSR (cuSPARSE on GPU), side by side in one run.

    python benchmarks/spmv.py                  # all shapes, sparsities 50/70/90%
    python benchmarks/spmv.py --reps 20 --shapes 576x576 --flush-l2

Shapes are SmolLM2-135M's (576x576 attention, 1536x576 gate/up, 576x1536 down) plus a 4096x4096
(Llama-7B attention). Each row of a random fp16 matrix gets exactly ``int(cols * sparsity)``
zeros, as per-row pruning leaves it. Every timing is a median over repeats after a warm-up,
with the device synchronized around each timed block. With a GPU: the Triton kernel, dense
fp16 ``torch.mv`` (cuBLAS) and fp16 CSR (cuSPARSE). Without one, the script says so and times
only the PyTorch reference paths on the CPU (fp32): those are NOT kernel timings, and no
speed claim may be made from them. Memory ratios (stored bytes / dense fp16 bytes) are exact
on any machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from paretolab.kernels.macko import (
    dense_bytes,
    macko_decode,
    macko_encode,
    macko_spmv_ref,
)

SHAPES = ((576, 576), (1536, 576), (576, 1536), (4096, 4096))
SPARSITIES = (0.5, 0.7, 0.9)


def pruned_matrix(rows: int, cols: int, sparsity: float, *, device: torch.device, seed: int = 0) -> torch.Tensor:
    """Random fp16 (rows, cols) with exactly ``int(cols * sparsity)`` zeros per row."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=gen)
    n_zero = int(cols * sparsity)
    if n_zero:
        w.scatter_(1, torch.rand(rows, cols, generator=gen).argsort(dim=1)[:, :n_zero], 0.0)
    return w.to(device=device, dtype=torch.float16)


def median_seconds(fn: Callable[[], object], device: torch.device, *, warmup: int, reps: int, inner: int, flush: torch.Tensor | None) -> float:
    """Median wall time of one call: ``inner`` calls per timed block (one with --flush-l2), synchronized."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(reps):
        calls = inner
        if flush is not None:
            flush.zero_()  # evict the matrix from L2, as the official benchmark does
            calls = 1
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def csr_bytes(csr: torch.Tensor) -> int:
    """Bytes torch's CSR tensor really holds (values plus its int64 or int32 indices)."""
    return sum(t.numel() * t.element_size() for t in (csr.values(), csr.col_indices(), csr.crow_indices()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="*", default=[f"{r}x{c}" for r, c in SHAPES], help="ROWSxCOLS (out x in)")
    parser.add_argument("--sparsities", nargs="*", type=float, default=list(SPARSITIES))
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--inner", type=int, default=20, help="calls per timed block on GPU (1 on CPU)")
    parser.add_argument("--flush-l2", action="store_true", help="GPU: clear L2 before every timed call (one call per block)")
    args = parser.parse_args(argv)

    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    if gpu:
        from paretolab.kernels.macko_triton import macko_spmv_triton

        print(f"GPU: {torch.cuda.get_device_name()} — Triton MACKO kernel vs cuBLAS fp16 matvec vs cuSPARSE fp16 CSR")
        flush = torch.empty(256 * 2**20, dtype=torch.uint8, device=device) if args.flush_l2 else None
        inner = args.inner
    else:
        print("NO CUDA GPU FOUND: timing only the CPU reference paths (PyTorch reference MACKO SpMV, dense fp32")
        print("matvec, torch CSR fp32 on CPU). These are CPU reference timings, NOT kernel timings; no GPU")
        print("speed claim can be made from them. Memory ratios are exact.")
        flush, inner = None, 1
    label = "kernel" if gpu else "CPU reference"
    dtype = torch.float16 if gpu else torch.float32

    header = (
        f"{'shape':>11} {'sparsity':>8} | {'macko us':>9} {'dense us':>9} {'csr us':>9} | "
        f"{'dense/macko':>11} {'csr/macko':>9} | {'mem macko/dense':>15} {'mem csr/dense':>13}"
    )
    print(f"\n[{label} timings; medians of {args.reps} after {args.warmup} warm-up calls; speed ratios > 1 mean MACKO is faster]")
    print(header)
    print("-" * len(header))
    for shape in args.shapes:
        rows, cols = (int(v) for v in shape.lower().split("x"))
        for sparsity in args.sparsities:
            w16 = pruned_matrix(rows, cols, sparsity, device=device)
            fmt = macko_encode(w16)
            w = w16.to(dtype)
            x = torch.randn(cols, device=device, dtype=torch.float16).to(dtype)
            csr = w.to_sparse_csr()
            if gpu:
                macko_fn: Callable[[], object] = lambda: macko_spmv_triton(fmt, x)  # noqa: E731
            else:
                macko_fn = lambda: macko_spmv_ref(fmt, x)  # noqa: E731
            expected = (macko_decode(fmt).float() @ x.float()).to(dtype)
            torch.testing.assert_close(macko_fn(), expected, rtol=2e-2, atol=2e-2)  # time only a correct result

            timing = dict(device=device, warmup=args.warmup, reps=args.reps, inner=inner, flush=flush)
            t_macko = median_seconds(macko_fn, **timing)
            t_dense = median_seconds(lambda: torch.mv(w, x), **timing)
            t_csr = median_seconds(lambda: csr @ x, **timing)
            dense16 = dense_bytes((rows, cols))
            print(
                f"{shape:>11} {sparsity:>8.0%} | {t_macko * 1e6:>9.1f} {t_dense * 1e6:>9.1f} {t_csr * 1e6:>9.1f} | "
                f"{t_dense / t_macko:>11.2f} {t_csr / t_macko:>9.2f} | "
                f"{fmt.nbytes / dense16:>15.3f} {csr_bytes(w16.to_sparse_csr()) / dense16:>13.3f}"
            )
    print("\nmem: stored bytes / dense fp16 bytes (MACKO: 16-bit values, 4-bit deltas, padding, int32 row pointers;")
    print("CSR: torch's own layout, fp16 values with int64 indices).")


if __name__ == "__main__":
    main()

"""MACKO SpMV on the CPU by the C kernel (``compute_kernels/_macko_cpu.c``), the PyTorch path where it is not built.

``macko_spmv_cpu(fmt, x)`` computes ``M @ x`` for ``x`` of shape (cols,) or (..., cols) straight
from the format's buffers: values widened from fp16/bf16 to fp32 in registers, x and the sums in
fp32, the result in x's dtype. Rows are shared among ``threads`` (default: torch's thread count)
by stored entries; each row is summed by one thread, so the result does not depend on the
thread count. Every vector of x costs one gather per stored entry, so the kernel is for a few
tokens at a time (decoding); for many, decoding the matrix once and one matmul is faster.

Fallback (extension not built, or ``PARETOLAB_CPU_KERNELS=0``): ``macko_decode`` then a dense
fp32 matmul, the same numbers up to summation order.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from paretolab.kernels.cpu_ext import extension, path_cap
from paretolab.kernels.macko_format import VALUE_DTYPES, MackoMatrix, macko_decode

NAME = "_macko_cpu"
PARALLEL_MIN = 1 << 15  # stored entries x vectors below which one thread does it all (waking a second costs more)


def macko_cpu_kernel() -> str | None:
    """The path ``macko_spmv_cpu`` takes now: ``"avx512"``, ``"avx2"`` or ``"scalar"`` (the C kernel), or None (PyTorch fallback)."""
    ext = extension(NAME)
    return None if ext is None else ext.isa()


def macko_spmv_cpu(fmt: MackoMatrix, x: torch.Tensor, *, threads: int | None = None, path: str | None = None) -> torch.Tensor:
    """y = M @ x on the CPU; ``path`` caps the kernel's instruction path (tests run each)."""
    rows, cols = fmt.shape
    if x.shape[-1] != cols:
        raise ValueError(f"x has {x.shape[-1]} features, the matrix has {cols} columns; pass x of shape (..., {cols})")
    ext = extension(NAME)
    if ext is None:
        return (macko_decode(fmt).float() @ x.float().unsqueeze(-1)).squeeze(-1).to(x.dtype)
    cap = path_cap(ext, path)
    values, deltas, row_ptr = fmt.values, fmt.deltas, fmt.row_ptr
    _check(values, deltas, row_ptr, fmt.shape)
    if x.device.type != "cpu":
        raise ValueError(f"macko_spmv_cpu runs on the CPU; got x on {x.device} (move it with .to('cpu'))")
    xf = x if x.dtype == torch.float32 and x.is_contiguous() else x.to(torch.float32).contiguous()
    batch = xf.numel() // cols if cols else x.shape[:-1].numel()
    y = torch.empty(*x.shape[:-1], rows, dtype=torch.float32)
    n = values.numel()
    if threads is None:
        threads = torch.get_num_threads() if n * batch >= PARALLEL_MIN else 1
    elif threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}; pass None for torch's thread count")
    ext.spmv(values.data_ptr(), deltas.data_ptr(), row_ptr.data_ptr(), rows, cols, n, values.dtype == torch.bfloat16,
             xf.data_ptr(), cols, batch, y.data_ptr(), threads, cap)
    return y if x.dtype == torch.float32 else y.to(x.dtype)


def spmv_runner(fmt: MackoMatrix) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``x -> M @ x`` by the C kernel with the format checked once, for a decoder that calls it each token; None without the kernel.

    The runner takes fp32, contiguous CPU ``x`` of shape (..., cols) and checks nothing else (the
    caller does: ``MackoLinear`` falls back to ``macko_spmv_cpu`` for anything else); the same
    kernel call as ``macko_spmv_cpu`` at torch's thread count, so the same bits. It holds the
    format's buffers: a module that replaces them needs a new runner.
    """
    ext = extension(NAME)
    if ext is None:
        return None
    values, deltas, row_ptr = fmt.values, fmt.deltas, fmt.row_ptr
    _check(values, deltas, row_ptr, fmt.shape)
    rows, cols = fmt.shape
    n, bf16, cap = values.numel(), values.dtype == torch.bfloat16, path_cap(ext, None)
    args = (values.data_ptr(), deltas.data_ptr(), row_ptr.data_ptr(), rows, cols, n, bf16)

    def run(x: torch.Tensor) -> torch.Tensor:
        batch = x.numel() // cols if cols else x.shape[:-1].numel()
        y = torch.empty(*x.shape[:-1], rows, dtype=torch.float32)
        ext.spmv(*args, x.data_ptr(), cols, batch, y.data_ptr(), torch.get_num_threads() if n * batch >= PARALLEL_MIN else 1, cap)
        return y

    run.buffers = (values, deltas, row_ptr)  # type: ignore[attr-defined]  # kept alive with the addresses it holds
    return run


def _check(values: torch.Tensor, deltas: torch.Tensor, row_ptr: torch.Tensor, shape: tuple[int, int]) -> None:
    """What the C kernel trusts: CPU, contiguous buffers of the format's dtypes and lengths (the data is checked in C)."""
    if (values.dtype in VALUE_DTYPES and deltas.dtype == torch.uint8 and row_ptr.dtype == torch.int32 and values.device.type == "cpu"
            and deltas.device.type == "cpu" and row_ptr.device.type == "cpu" and values.is_contiguous() and deltas.is_contiguous()
            and row_ptr.is_contiguous() and values.numel() == 2 * deltas.numel() and row_ptr.numel() == shape[0] + 1):
        return
    if values.device.type != "cpu" or deltas.device.type != "cpu" or row_ptr.device.type != "cpu":
        raise ValueError(f"macko_spmv_cpu runs on the CPU; got the format on {values.device} (move it with .to('cpu'))")
    if values.dtype not in VALUE_DTYPES or deltas.dtype != torch.uint8 or row_ptr.dtype != torch.int32:
        raise ValueError(f"MACKO buffers must be values {VALUE_DTYPES}, deltas uint8, row_ptr int32; got {values.dtype}, {deltas.dtype}, {row_ptr.dtype}")
    if not (values.is_contiguous() and deltas.is_contiguous() and row_ptr.is_contiguous()):
        raise ValueError("MACKO buffers must be contiguous; call .contiguous() on values, deltas and row_ptr")
    raise ValueError(f"MACKO buffers do not fit shape {shape}: {values.numel()} values, {deltas.numel()} delta bytes "
                     f"(need 2 values per byte), {row_ptr.numel()} row pointers (need rows + 1); re-encode with macko_encode")

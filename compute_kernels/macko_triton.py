"""Triton SpMV over the MACKO format, beside its reference ``macko.macko_spmv_ref``.

One program handles ``BLOCK_ROWS`` rows. For each chunk of ``BLOCK_K`` entries of those rows it
loads the values and the 4-bit codes, turns the codes into column steps (code + 1), takes their
prefix sum along the chunk to recover the columns, gathers ``x`` and accumulates in fp32; the
running column of each row is carried from chunk to chunk. This is the algorithm of the
official CUDA kernel (a warp per row, aligned 8-entry loads, prefix sums by warp shuffles)
expressed with Triton's block ops; the aligned 16-byte loads of the CUDA kernel are left to
Triton's code generator. Timings are only claimed from a GPU run (``benchmarks/spmv.py``).

Tests run it on CPU tensors with ``TRITON_INTERPRET=1`` (set before this module is imported).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from paretolab.kernels.macko_format import MackoMatrix


@triton.jit
def _macko_spmv_kernel(
    values_ptr,  # (P,) fp16/bf16
    deltas_ptr,  # (P // 2,) uint8, two codes per byte, low nibble first
    row_ptr_ptr,  # (rows + 1,) int32
    x_ptr,  # (cols,)
    y_ptr,  # (rows,)
    rows,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    r = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)  # (R,)
    r_mask = r < rows
    start = tl.load(row_ptr_ptr + r, mask=r_mask, other=0)
    end = tl.load(row_ptr_ptr + r + 1, mask=r_mask, other=0)
    length = end - start  # (R,)
    longest = tl.max(length, axis=0)
    acc = tl.zeros([BLOCK_ROWS], dtype=tl.float32)
    col_before = tl.full([BLOCK_ROWS], -1, dtype=tl.int32)  # each row starts at column -1
    for k0 in range(0, longest, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)  # (K,)
        in_row = k[None, :] < length[:, None]  # (R, K)
        idx = start[:, None] + k[None, :]  # (R, K) entry ordinals
        v = tl.load(values_ptr + idx, mask=in_row, other=0.0).to(tl.float32)
        packed = tl.load(deltas_ptr + (idx >> 1), mask=in_row, other=0).to(tl.int32)
        code = (packed >> ((idx & 1) * 4)) & 0xF
        step = tl.where(in_row, code + 1, 0)  # (R, K) column steps in [1, 16]
        col = col_before[:, None] + tl.cumsum(step, axis=1)
        xv = tl.load(x_ptr + col, mask=in_row, other=0.0).to(tl.float32)
        acc += tl.sum(v * xv, axis=1)
        col_before += tl.sum(step, axis=1)
    tl.store(y_ptr + r, acc.to(y_ptr.dtype.element_ty), mask=r_mask)


def macko_spmv_triton(fmt: MackoMatrix, x: torch.Tensor, *, block_rows: int = 4, block_k: int = 256) -> torch.Tensor:
    """y = M @ x for a vector x of shape (cols,) (fp32 accumulate, result in x's dtype)."""
    rows, cols = fmt.shape
    if x.dim() != 1 or x.shape[0] != cols:
        raise ValueError(f"macko_spmv_triton needs x of shape ({cols},), got {tuple(x.shape)}")
    if x.device != fmt.device:
        raise ValueError(f"x is on {x.device}, the matrix on {fmt.device}")
    x = x.contiguous()
    y = torch.empty(rows, dtype=x.dtype, device=x.device)
    if rows == 0:
        return y
    grid = (triton.cdiv(rows, block_rows),)
    _macko_spmv_kernel[grid](fmt.values, fmt.deltas, fmt.row_ptr, x, y, rows, BLOCK_ROWS=block_rows, BLOCK_K=block_k)
    return y

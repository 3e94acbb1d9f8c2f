"""MACKO sparse matrices: the format and its PyTorch reference (:mod:`paretolab.kernels.macko_format`), and the
Triton SpMV (:mod:`paretolab.kernels.macko_triton`) behind one signature. Triton is imported only when its kernel runs."""

from __future__ import annotations

import torch

from paretolab.kernels.macko_format import (
    ALIGN,
    DELTA_BITS,
    MAX_DELTA,
    VALUE_DTYPES,
    MackoMatrix,
    dense_bytes,
    macko_decode,
    macko_encode,
    macko_spmv_ref,
)

__all__ = ["ALIGN", "DELTA_BITS", "MAX_DELTA", "VALUE_DTYPES", "MackoMatrix", "dense_bytes", "macko_decode", "macko_encode",
           "macko_spmv_ref", "macko_spmv_triton"]


def macko_spmv_triton(fmt: MackoMatrix, x: torch.Tensor) -> torch.Tensor:
    """y = M @ x by the Triton kernel (``compute_kernels/macko_triton.py``); same signature as the reference."""
    from paretolab.kernels.macko_triton import macko_spmv_triton as kernel

    return kernel(fmt, x)

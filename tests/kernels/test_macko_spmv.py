"""MACKO SpMV: the Triton kernel (CPU interpreter) against the PyTorch reference and dense matmul."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported; benchmarks/gpu_check.sh sets 0

import pytest
import torch

try:
    import triton  # noqa: F401
except ImportError as exc:  # fail the run loudly: these tests are part of CI, never skipped
    raise ImportError("tests/kernels need triton (a dev dependency): pip install triton") from exc

from paretolab.kernels.macko import (
    macko_decode,
    macko_encode,
    macko_spmv_ref,
    macko_spmv_triton,
)

pytestmark = pytest.mark.triton

SHAPES = [(1, 1), (7, 33), (64, 64), (45, 300), (130, 20)]
SPARSITIES = [0.3, 0.5, 0.7, 0.9]


def random_sparse(rows: int, cols: int, sparsity: float, seed: int) -> torch.Tensor:
    """A random matrix with exactly ``int(cols * sparsity)`` zeros per row (as per-row pruning leaves it)."""
    gen = torch.Generator().manual_seed(seed)
    dense = torch.randn(rows, cols, generator=gen)
    n_zero = int(cols * sparsity)
    if n_zero:
        idx = torch.rand(rows, cols, generator=gen).argsort(dim=1)[:, :n_zero]
        dense.scatter_(1, idx, 0.0)
    return dense


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("sparsity", SPARSITIES)
def test_triton_matches_reference_and_dense(shape: tuple[int, int], sparsity: float) -> None:
    dense = random_sparse(*shape, sparsity, seed=shape[0] * 1000 + shape[1] + int(sparsity * 100))
    fmt = macko_encode(dense)
    x = torch.randn(shape[1], generator=torch.Generator().manual_seed(1))
    y_ref = macko_spmv_ref(fmt, x)
    y_tri = macko_spmv_triton(fmt, x)
    y_dense = macko_decode(fmt).float() @ x
    assert y_tri.shape == (shape[0],) and y_tri.dtype == x.dtype
    torch.testing.assert_close(y_tri, y_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y_tri, y_dense, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("value_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.float16])
def test_triton_handles_value_and_input_dtypes(value_dtype: torch.dtype, x_dtype: torch.dtype) -> None:
    dense = random_sparse(33, 80, 0.5, seed=3)
    fmt = macko_encode(dense, value_dtype=value_dtype)
    x = torch.randn(80).to(x_dtype)
    y_tri = macko_spmv_triton(fmt, x)
    assert y_tri.dtype == x_dtype
    torch.testing.assert_close(y_tri, macko_spmv_ref(fmt, x), rtol=2e-3, atol=2e-3)


def test_triton_long_gaps_empty_rows_and_small_blocks() -> None:
    """Rows longer than one block, rows needing padding, and empty rows, with tiny tiles to force many chunks."""
    dense = torch.zeros(9, 400)
    dense[0, [0, 399]] = 1.5  # one long gap: 24 padding zeros
    dense[2] = torch.randn(400)  # a full row: many chunks
    dense[5, 17::40] = -2.0
    fmt = macko_encode(dense)
    x = torch.randn(400)
    from paretolab.kernels.macko_triton import macko_spmv_triton as kernel

    y = kernel(fmt, x, block_rows=2, block_k=16)
    torch.testing.assert_close(y, macko_decode(fmt).float() @ x, rtol=1e-5, atol=1e-5)
    assert y[[1, 3, 4, 6, 7, 8]].eq(0).all()


def test_reference_accepts_batched_input() -> None:
    dense = random_sparse(20, 50, 0.7, seed=5)
    fmt = macko_encode(dense)
    x = torch.randn(3, 4, 50)
    torch.testing.assert_close(macko_spmv_ref(fmt, x), x @ macko_decode(fmt).float().T, rtol=1e-5, atol=1e-5)


def test_wrong_input_shape_is_refused() -> None:
    fmt = macko_encode(torch.eye(4))
    with pytest.raises(ValueError, match="4"):
        macko_spmv_triton(fmt, torch.ones(5))
    with pytest.raises(ValueError, match="columns"):
        macko_spmv_ref(fmt, torch.ones(5))

"""MACKO SpMV on the CPU (the C kernel, every instruction path the CPU runs) against the dense product."""

from __future__ import annotations

import pytest
import torch

from paretolab.kernels import cpu_ext
from paretolab.kernels.macko import MackoMatrix, macko_decode, macko_encode, macko_spmv_ref
from paretolab.kernels.macko_cpu import NAME, macko_cpu_kernel, macko_spmv_cpu

from .test_macko_spmv import random_sparse

if not cpu_ext.built(NAME):  # reported in the summary (-rs), never silent; the fallback tests below still run
    pytestmark = pytest.mark.skip(reason="paretolab.kernels._macko_cpu is not built (needs a C compiler with OpenMP): "
                                         "run `pip install -e . --no-deps --no-build-isolation`")

PATHS = cpu_ext.runnable_paths(NAME)  # every instruction path this CPU runs, best first (avx512, avx2, scalar)


def assert_matches_dense(y: torch.Tensor, fmt: MackoMatrix, x: torch.Tensor) -> None:
    """y equals W @ x to fp32 rounding: within 1e-5 of sum |w| |x| per row (sequential fp32 sums stay far inside)."""
    w = macko_decode(fmt).double()
    xd = x.double().reshape(x.shape[:-1].numel(), fmt.shape[1])
    exact = xd @ w.T
    bound = 1e-5 * (xd.abs() @ w.abs().T) + 1e-30
    err = (y.double().reshape(exact.shape) - exact).abs()
    assert bool((err <= bound).all()), f"max error {err.max().item():.3g} over bound {bound.min().item():.3g}"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("value_dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("sparsity", [0.5, 0.7, 0.9])
@pytest.mark.parametrize("shape", [(96, 576), (64, 1536), (45, 300)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_random_matrices_equal_the_dense_product(shape: tuple[int, int], sparsity: float, value_dtype: torch.dtype, path: str) -> None:
    fmt = macko_encode(random_sparse(*shape, sparsity, seed=shape[0] + int(sparsity * 100)), value_dtype=value_dtype)
    x = torch.randn(shape[1], generator=torch.Generator().manual_seed(1))
    y = macko_spmv_cpu(fmt, x, path=path)
    assert y.shape == (shape[0],) and y.dtype == torch.float32
    assert_matches_dense(y, fmt, x)


def pathological() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    mixed = torch.randn(9, 300, generator=gen)
    mixed[0] = 0.0  # an empty row
    mixed[2, :] = torch.randn(300, generator=gen)  # an all-dense row
    mixed[4] = 0.0
    mixed[4, [0, 17, 40, 299]] = 1.5  # gaps > 16: padding zeros
    mixed[5] = 0.0
    mixed[5, 299] = -2.0  # one entry at the last column after a run of padding
    mixed[6] = 0.0
    mixed[6, 0] = 3.0  # one entry, then a long tail with no padding
    mixed[7, ::2] = 0.0
    far = torch.zeros(3, 1000)
    far[:, 999] = 1.0  # 62 padding entries before the only value
    far[1, 500] = 2.0
    return {
        "mixed": mixed,
        "far": far,
        "all-zero": torch.zeros(5, 40),
        "all-dense": torch.randn(33, 50, generator=gen),
        "1xN": random_sparse(1, 777, 0.5, seed=1),
        "Nx1": random_sparse(37, 1, 0.0, seed=2) * (torch.arange(37) % 3 != 0).float().unsqueeze(1),
        "7x13": random_sparse(7, 13, 0.5, seed=3),
        "0 rows": torch.zeros(0, 12),
        "0 cols": torch.zeros(4, 0),
    }


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("value_dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", list(pathological()))
def test_pathological_matrices(name: str, value_dtype: torch.dtype, path: str) -> None:
    dense = pathological()[name]
    fmt = macko_encode(dense, value_dtype=value_dtype)
    x = torch.randn(dense.shape[1], generator=torch.Generator().manual_seed(4))
    y = macko_spmv_cpu(fmt, x, path=path)
    assert y.shape == (dense.shape[0],)
    assert_matches_dense(y, fmt, x)
    if name == "all-zero":
        assert torch.equal(y, torch.zeros(5))


@pytest.mark.parametrize("path", PATHS)
def test_thread_count_does_not_change_a_bit(path: str) -> None:
    fmt = macko_encode(random_sparse(301, 640, 0.6, seed=5))
    x = torch.randn(3, 640, generator=torch.Generator().manual_seed(5))
    one = macko_spmv_cpu(fmt, x, threads=1, path=path)
    for threads in (2, 3, 7):
        assert torch.equal(macko_spmv_cpu(fmt, x, threads=threads, path=path), one)


@pytest.mark.parametrize("path", PATHS)
def test_a_batch_equals_each_vector_alone(path: str) -> None:
    """Several tokens in one pass (more than the 8 a pass holds) give each token's own result exactly."""
    fmt = macko_encode(random_sparse(70, 200, 0.5, seed=6), value_dtype=torch.bfloat16)
    xs = torch.randn(2, 5, 200, generator=torch.Generator().manual_seed(6))
    ys = macko_spmv_cpu(fmt, xs, path=path)
    assert ys.shape == (2, 5, 70)
    for i in range(2):
        for j in range(5):
            assert torch.equal(ys[i, j], macko_spmv_cpu(fmt, xs[i, j], path=path))


def test_the_two_paths_agree_and_x_dtype_is_kept() -> None:
    fmt = macko_encode(random_sparse(50, 333, 0.7, seed=8))
    x = torch.randn(333, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    fast, portable = macko_spmv_cpu(fmt, x), macko_spmv_cpu(fmt, x, path="scalar")
    assert fast.dtype == torch.bfloat16
    torch.testing.assert_close(fast, portable)


def test_entries_not_stored_never_reach_the_sum() -> None:
    """Absent columns may hold inf in x: a row that stores nothing there stays finite (dense matmul would give nan)."""
    dense = random_sparse(20, 100, 0.5, seed=9)
    dense[:, 90:] = 0.0  # no row stores a column >= 90 (and no padding reaches there: trailing runs are not padded)
    dense[:, 89] = 1.0  # every row ends at 89: the lanes after a row's last entry would land on the infs
    fmt = macko_encode(dense)
    x = torch.randn(100, generator=torch.Generator().manual_seed(9))
    x[90:] = float("inf")
    for path in PATHS:
        y = macko_spmv_cpu(fmt, x, path=path)
        assert torch.isfinite(y).all()
        torch.testing.assert_close(y, macko_spmv_ref(fmt, x), rtol=1e-5, atol=1e-5)


def test_corrupt_formats_raise_instead_of_reading_out_of_bounds() -> None:
    fmt = macko_encode(random_sparse(10, 40, 0.5, seed=10))
    wide = macko_encode(random_sparse(10, 400, 0.5, seed=10))
    x = torch.randn(40)
    with pytest.raises(ValueError, match="past the matrix"):  # another shape's codes step past column 40
        macko_spmv_cpu(MackoMatrix(wide.values, wide.deltas, wide.row_ptr, (10, 40)), x)
    backwards = fmt.row_ptr.clone()
    backwards[4] = int(fmt.row_ptr[3]) - 2  # row 3 would end before it starts
    with pytest.raises(ValueError, match="row_ptr decreases at row 3"):
        macko_spmv_cpu(MackoMatrix(fmt.values, fmt.deltas, backwards, fmt.shape), x)
    with pytest.raises(ValueError, match="do not fit shape"):
        macko_spmv_cpu(MackoMatrix(fmt.values[:-8], fmt.deltas, fmt.row_ptr, fmt.shape), x)
    with pytest.raises(ValueError, match="x has 41 features, the matrix has 40 columns"):
        macko_spmv_cpu(fmt, torch.randn(41))
    with pytest.raises(ValueError, match="threads must be >= 1"):
        macko_spmv_cpu(fmt, x, threads=0)


def test_switched_off_it_runs_the_pytorch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    fmt = macko_encode(random_sparse(30, 64, 0.5, seed=11))
    x = torch.randn(2, 64)
    assert macko_cpu_kernel() in cpu_ext.PATHS
    monkeypatch.setenv(cpu_ext.ENV, "0")
    assert macko_cpu_kernel() is None
    y = macko_spmv_cpu(fmt, x)
    torch.testing.assert_close(y, x @ macko_decode(fmt).float().T)

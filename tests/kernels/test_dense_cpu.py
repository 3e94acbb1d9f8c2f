"""The dense few-row linear in C (every instruction path the CPU runs: AVX-512, AVX2, portable) against the exact product, and fast_linears on a model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from paretolab.kernels import cpu_ext
from paretolab.kernels.dense_cpu import MAX_ROWS, NAME, dense_cpu_kernel, fast_linears, fits, linear_cpu

if not cpu_ext.built(NAME):  # reported in the summary (-rs), never silent
    pytestmark = pytest.mark.skip(reason="paretolab.kernels._dense_cpu is not built (needs a C compiler with OpenMP): "
                                         "run `pip install -e . --no-deps --no-build-isolation`")

PATHS = cpu_ext.runnable_paths(NAME)  # every instruction path this CPU runs, best first (avx512, avx2, scalar)


def operands(rows: int, k: int, n: int, seed: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, k, generator=gen), torch.randn(n, k, generator=gen).to(dtype), torch.randn(n, generator=gen)


def assert_equals_exact(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> None:
    """y = x W^T + b to fp32 rounding: the exact product in float64, tolerance 1e-5 of the sum of |terms|."""
    exact = x.double() @ w.double().T + (0 if bias is None else bias.double())
    scale = float((x.double().abs() @ w.double().abs().T).max()) + 1e-30
    torch.testing.assert_close(y.double(), exact, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9, 16])
@pytest.mark.parametrize(("k", "n"), [(576, 1536), (1536, 576), (576, 49)])
def test_equals_the_product_at_smollm2_shapes(k: int, n: int, rows: int, path: str) -> None:
    x, w, b = operands(rows, k, n, seed=rows * 31 + k)
    assert_equals_exact(linear_cpu(x, w, path=path), x, w, None)
    assert_equals_exact(linear_cpu(x, w, b, path=path), x, w, b)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("k", "n"), [(1, 1), (15, 3), (16, 1), (17, 5), (31, 2), (33, 7), (577, 33)])
def test_odd_shapes_and_tails(k: int, n: int, path: str) -> None:
    for rows in (1, 4, 11):
        x, w, b = operands(rows, k, n, seed=k * 7 + n + rows)
        assert_equals_exact(linear_cpu(x, w, b, path=path), x, w, b)


@pytest.mark.parametrize("path", PATHS)
def test_bf16_weights_are_widened_exactly(path: str) -> None:
    x, w, b = operands(3, 100, 40, seed=5, dtype=torch.bfloat16)
    y = linear_cpu(x, w, b, path=path)
    assert_equals_exact(y, x, w.float(), b)  # the bf16 values themselves, widened, not some rounding of them


@pytest.mark.parametrize("path", PATHS)
def test_a_row_gets_the_same_bits_alone_or_beside_others_and_with_any_thread_count(path: str) -> None:
    """The property a speculative verify needs: a position's logits equal a one-token step's, bit for bit."""
    x, w, b = operands(MAX_ROWS, 576, 4099, seed=9)
    alone = torch.cat([linear_cpu(x[i : i + 1], w, b, threads=1, path=path) for i in range(MAX_ROWS)])
    for rows in (2, 5, 8, 13, MAX_ROWS):
        for threads in (1, 2, 3):
            assert torch.equal(linear_cpu(x[:rows], w, b, threads=threads, path=path), alone[:rows])


def test_leading_dimensions_are_kept() -> None:
    x, w, b = operands(6, 24, 10, seed=2)
    y = linear_cpu(x.view(2, 3, 24), w, b)
    assert y.shape == (2, 3, 10)
    assert_equals_exact(y.view(6, 10), x, w, b)


def test_what_it_refuses_names_the_problem() -> None:
    x, w, _ = operands(MAX_ROWS + 1, 8, 4, seed=1)
    assert not fits(x, w)
    with pytest.raises(ValueError, match=f"at most {MAX_ROWS} rows"):
        linear_cpu(x, w)
    with pytest.raises(ValueError, match="fp32 x"):
        linear_cpu(x[:2].double(), w)
    with pytest.raises(ValueError, match="contiguous"):
        linear_cpu(x[:2, :4], torch.randn(8, 4, device="cpu").T)
    with pytest.raises(ValueError, match="threads must be >= 1"):
        linear_cpu(x[:2], w, threads=0)


class TwoLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down = nn.Linear(64, 96), nn.Linear(96, 64, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.up(x)))


def test_fast_linears_routes_few_rows_through_the_kernel_and_puts_the_modules_back(monkeypatch) -> None:
    model = TwoLayer()
    x = torch.randn(3, 64)
    reference = model(x)
    calls: list[int] = []
    ext = cpu_ext.extension(NAME)
    real = ext.linear
    monkeypatch.setattr(ext, "linear", lambda *a: calls.append(1) or real(*a))  # every kernel call, lean path or linear_cpu
    with torch.no_grad(), fast_linears(model) as swapped:
        assert swapped == 2
        torch.testing.assert_close(model(x), reference, rtol=1e-5, atol=1e-5)
        assert len(calls) == 2
        model(torch.randn(MAX_ROWS + 1, 64))  # a prefill-sized input stays with torch
        assert len(calls) == 2
    assert all("forward" not in m.__dict__ for m in model.modules())
    model(x)
    assert len(calls) == 2  # back to torch's own forward


def test_fast_linears_gives_linear_cpus_bits_and_follows_a_replaced_weight() -> None:
    model = TwoLayer()
    x = torch.randn(2, 5, 64)
    with torch.no_grad(), fast_linears(model):
        hidden = model.up(x)
        assert torch.equal(hidden, linear_cpu(x, model.up.weight, model.up.bias))  # bias and leading dimensions too
        assert torch.equal(model.down(hidden.transpose(0, 1)), linear_cpu(hidden.transpose(0, 1).contiguous(), model.down.weight))  # a strided x
        model.up.weight = nn.Parameter(torch.randn(96, 64), requires_grad=False)  # swapped while active: the new weight counts
        assert torch.equal(model.up(x), linear_cpu(x, model.up.weight, model.up.bias))
        model.up.bias = None
        assert torch.equal(model.up(x), linear_cpu(x, model.up.weight))


def test_fast_linears_leaves_autograd_to_torch() -> None:
    model = TwoLayer()
    x = torch.randn(2, 64, requires_grad=True)
    with fast_linears(model):
        model(x).sum().backward()
    assert x.grad is not None and model.up.weight.grad is not None


def test_switched_off_it_changes_nothing(monkeypatch) -> None:
    monkeypatch.setenv(cpu_ext.ENV, "0")
    assert dense_cpu_kernel() is None
    model = TwoLayer()
    with fast_linears(model) as swapped:
        assert swapped == 0 and all("forward" not in m.__dict__ for m in model.modules())


def test_path_caps_the_instruction_path_and_names_what_this_cpu_runs() -> None:
    x, w, b = operands(2, 40, 24, seed=12)
    assert PATHS[0] == dense_cpu_kernel() and PATHS[-1] == "scalar" and set(PATHS) <= set(cpu_ext.PATHS)
    for path in PATHS:
        assert_equals_exact(linear_cpu(x, w, b, path=path), x, w, b)
    if len(PATHS) > 1:  # the cap is honoured: the portable path sums in another order, so some of 64 outputs differ in bits
        xl, wl, _ = operands(1, 576, 64, seed=13)
        assert not torch.equal(linear_cpu(xl, wl, path="scalar"), linear_cpu(xl, wl))
    with pytest.raises(ValueError, match=f"path='neon' is not one this CPU runs; it runs {', '.join(PATHS)}"):
        linear_cpu(x, w, path="neon")

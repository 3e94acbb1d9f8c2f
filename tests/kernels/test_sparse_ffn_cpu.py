"""The one-token ReLU-GLU FFN in C (every instruction path the CPU runs) against the dense FFN."""

from __future__ import annotations

import pytest
import torch

from paretolab.kernels import cpu_ext
from paretolab.kernels.sparse_ffn_cpu import NAME, ffn_bytes, sparse_ffn_cpu, sparse_ffn_kernel

if not cpu_ext.built(NAME):  # reported in the summary (-rs), never silent
    pytestmark = pytest.mark.skip(reason="paretolab.kernels._sparse_ffn_cpu is not built (needs a C compiler with OpenMP): "
                                         "run `pip install -e . --no-deps --no-build-isolation`")

PATHS = cpu_ext.runnable_paths(NAME)  # every instruction path this CPU runs, best first (avx512, avx2, scalar)


def ffn_weights(hidden: int, units: int, dead: float, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(gate, up, down) with the gate rows of a ``dead`` share of units zeroed: those units are 0 for every token."""
    gen = torch.Generator().manual_seed(seed)
    gate, up, down = torch.randn(units, hidden, generator=gen), torch.randn(units, hidden, generator=gen), torch.randn(hidden, units, generator=gen)
    gate[torch.randperm(units, generator=gen)[: int(round(units * dead))]] = 0.0
    return gate, up, down


def assert_equals_dense_ffn(y: torch.Tensor, x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, act: str) -> None:
    """y = down(act(gate x) * up x) to fp32 rounding (the exact FFN in float64; tolerance 1e-5 of the sum of |terms|)."""
    xd, gd, ud, dd = x.double().reshape(-1), gate.double(), up.double(), down.double()
    a = torch.relu(gd @ xd)
    h = (a * a if act == "relu2" else a) * (ud @ xd)
    exact = dd @ h
    scale = float((dd.abs() @ h.abs()).max()) + 1e-30
    assert y.shape == x.shape
    torch.testing.assert_close(y.double().reshape(-1), exact, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("act", ["relu", "relu2"])
@pytest.mark.parametrize("dead", [0.0, 0.5, 0.9, 0.95, 0.98, 1.0])
def test_equals_the_dense_ffn_at_smollm2_shape(dead: float, act: str, path: str) -> None:
    gate, up, down = ffn_weights(576, 1536, dead, seed=int(dead * 100))
    x = torch.randn(1, 1, 576, generator=torch.Generator().manual_seed(1))
    y = sparse_ffn_cpu(x, gate, up, down.t().contiguous(), act, path=path)
    assert_equals_dense_ffn(y, x, gate, up, down, act)
    if dead == 1.0:
        assert torch.equal(y, torch.zeros_like(x))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("hidden", "units"), [(1, 1), (7, 13), (37, 100), (100, 37), (64, 256)])
def test_odd_shapes(hidden: int, units: int, path: str) -> None:
    gate, up, down = ffn_weights(hidden, units, 0.5, seed=hidden * 7 + units)
    x = torch.randn(hidden, generator=torch.Generator().manual_seed(2))
    y = sparse_ffn_cpu(x, gate, up, down.t().contiguous(), "relu", path=path)
    assert_equals_dense_ffn(y, x, gate, up, down, "relu")


@pytest.mark.parametrize("path", PATHS)
def test_thread_count_does_not_change_a_bit(path: str) -> None:
    gate, up, down = ffn_weights(200, 700, 0.9, seed=3)
    x = torch.randn(200, generator=torch.Generator().manual_seed(3))
    down_t = down.t().contiguous()
    one = sparse_ffn_cpu(x, gate, up, down_t, "relu", threads=1, path=path)
    for threads in (2, 3, 5):
        assert torch.equal(sparse_ffn_cpu(x, gate, up, down_t, "relu", threads=threads, path=path), one)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("alive", [[0], [9], [0, 9], [4, 5], [3]], ids=["first", "last", "ends", "middle", "one"])
def test_a_few_active_units_at_the_edges_of_each_threads_share(alive: list[int], path: str) -> None:
    # the kernel walks from one active unit to the next (and asks for its rows ahead): the first and
    # last unit of each thread's share, and of the whole layer, must each count once
    gate, up, down = ffn_weights(40, 10, 1.0, seed=7)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(40, generator=gen)
    for unit in alive:  # a gate row along x: positive for this token
        gate[unit] = x / x.norm()
    for threads in (1, 2, 3):
        y = sparse_ffn_cpu(x, gate, up, down.t().contiguous(), "relu", threads=threads, path=path)
        assert_equals_dense_ffn(y, x, gate, up, down, "relu")


def test_the_two_paths_agree() -> None:
    gate, up, down = ffn_weights(576, 1536, 0.95, seed=4)
    x = torch.randn(576, generator=torch.Generator().manual_seed(4))
    down_t = down.t().contiguous()
    fast, portable = sparse_ffn_cpu(x, gate, up, down_t, "relu2"), sparse_ffn_cpu(x, gate, up, down_t, "relu2", path="scalar")
    torch.testing.assert_close(fast, portable, rtol=1e-5, atol=1e-5 * float(fast.abs().max()))  # sums in another order


def test_bad_inputs_name_what_to_pass() -> None:
    gate, up, down = ffn_weights(16, 32, 0.5, seed=5)
    x = torch.randn(16)
    with pytest.raises(ValueError, match="act must be one of relu, relu2, got 'silu'"):
        sparse_ffn_cpu(x, gate, up, down.t().contiguous(), "silu")
    with pytest.raises(ValueError, match="fp32 CPU tensors"):
        sparse_ffn_cpu(x, gate, up, down, "relu")  # down not transposed: (H, I)
    with pytest.raises(ValueError, match="fp32 CPU tensors"):
        sparse_ffn_cpu(x.double(), gate, up, down.t().contiguous(), "relu")
    with pytest.raises(ValueError, match="fp32 CPU tensors"):
        sparse_ffn_cpu(x, gate, up, down.t(), "relu")  # a transposed view, not contiguous
    with pytest.raises(ValueError, match="threads must be >= 1"):
        sparse_ffn_cpu(x, gate, up, down.t().contiguous(), "relu", threads=0)


def test_switched_off_the_caller_is_told(monkeypatch: pytest.MonkeyPatch) -> None:
    assert sparse_ffn_kernel() in cpu_ext.PATHS
    monkeypatch.setenv(cpu_ext.ENV, "off")
    assert sparse_ffn_kernel() is None
    gate, up, down = ffn_weights(16, 32, 0.5, seed=6)
    with pytest.raises(RuntimeError, match="PARETOLAB_CPU_KERNELS=0"):
        sparse_ffn_cpu(torch.randn(16), gate, up, down.t().contiguous(), "relu")


def test_bytes_read_on_a_hand_example() -> None:
    # 10 units of 4 features, 1 active: gate 10 rows + up 1 row + down 1 row = 12 rows of 16 bytes, against 30 rows dense
    assert ffn_bytes(4, 10, 1) == {"dense_bytes": 480, "sparse_bytes": 192, "avoided_share": pytest.approx(0.6)}

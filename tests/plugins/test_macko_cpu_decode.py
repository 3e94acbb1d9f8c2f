"""macko on the CPU: one-token forwards (decoding) run the C SpMV when it is built; switched off, the decode path."""

from __future__ import annotations

import pytest
import torch

from paretolab import TrialContext
from paretolab.generation import greedy_decode
from paretolab.kernels import cpu_ext
from paretolab.kernels.macko_cpu import NAME
from paretolab.plugin_api.subject import Subject
from paretolab.plugins.macko import CPU_KERNEL_MAX_TOKENS, Macko

if not cpu_ext.built(NAME):  # reported in the summary (-rs), never silent
    pytestmark = pytest.mark.skip(reason="paretolab.kernels._macko_cpu is not built (needs a C compiler with OpenMP): "
                                         "run `pip install -e . --no-deps --no-build-isolation`")


@pytest.fixture
def kernel_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the C kernel's calls (the extension module's ``spmv``, wrapped)."""
    ext = cpu_ext.extension(NAME)
    real = ext.spmv
    calls: list[int] = []

    def counting(*args: object) -> None:
        calls.append(1)
        real(*args)

    monkeypatch.setattr(ext, "spmv", counting)
    return calls


def packed(tiny: Subject, ctx: TrialContext) -> Subject:
    return Macko().transform(tiny, {"sparsity": 0.5, "score": "magnitude"}, ctx)


def test_decoding_runs_the_c_kernel_and_matches_the_decode_path(tiny: Subject, ctx: TrialContext, kernel_calls: list[int],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    subject = packed(tiny, ctx)
    prompt = torch.randint(3, 250, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        fast = greedy_decode(subject.model, prompt, 6)
        assert len(kernel_calls) >= 5 * 14  # 5 one-token steps after the prefill, 14 MACKO layers each
        step = subject.model(input_ids=prompt[:, :1]).logits
        monkeypatch.setenv(cpu_ext.ENV, "0")
        before = len(kernel_calls)
        slow = greedy_decode(subject.model, prompt, 6)
        step_slow = subject.model(input_ids=prompt[:, :1]).logits
    assert len(kernel_calls) == before  # switched off: not one call
    assert torch.equal(fast, slow)
    torch.testing.assert_close(step, step_slow, rtol=1e-5, atol=1e-5)  # fp32 sums in another order


def test_a_long_prefill_decodes_the_matrix_instead(tiny: Subject, ctx: TrialContext, kernel_calls: list[int]) -> None:
    subject = packed(tiny, ctx)
    with torch.no_grad():
        subject.model(input_ids=torch.randint(3, 250, (1, CPU_KERNEL_MAX_TOKENS + 1)))
        assert kernel_calls == []
        subject.model(input_ids=torch.randint(3, 250, (1, CPU_KERNEL_MAX_TOKENS)))
    assert len(kernel_calls) == 14


def test_gradients_still_flow_through_a_macko_layer(tiny: Subject, ctx: TrialContext, kernel_calls: list[int]) -> None:
    """Training through a MACKO model (e.g. a train stage after it) takes the differentiable decode path, not the kernel."""
    layer = next(m for m in packed(tiny, ctx).model.modules() if type(m).__name__ == "MackoLinear")
    x = torch.randn(1, layer.in_features, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert kernel_calls == []


def test_a_layer_checks_its_format_once_then_follows_new_buffers(monkeypatch: pytest.MonkeyPatch, kernel_calls: list[int]) -> None:
    import paretolab.plugins.macko as macko_plugin
    from paretolab.kernels.macko_cpu import macko_spmv_cpu
    from paretolab.plugins.macko import MackoLinear

    built: list[int] = []
    real_runner = macko_plugin.spmv_runner
    monkeypatch.setattr(macko_plugin, "spmv_runner", lambda fmt: built.append(1) or real_runner(fmt))
    torch.manual_seed(0)
    layer = MackoLinear.from_linear(torch.nn.Linear(40, 24))
    x = torch.randn(1, 1, 40)
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(layer(x), macko_spmv_cpu(layer.fmt, x) + layer.bias)  # the same kernel call, the same bits
        assert built == [1] and len(kernel_calls) == 6  # checked once; every call ran the C kernel
        other = MackoLinear.from_linear(torch.nn.Linear(40, 24))  # new buffers swapped in: a stale runner would read the old ones
        layer.values, layer.deltas, layer.row_ptr = other.values, other.deltas, other.row_ptr
        assert torch.equal(layer(x), macko_spmv_cpu(other.fmt, x) + layer.bias)
        assert built == [1, 1]


def test_a_used_layer_still_copies_and_pickles() -> None:
    import copy
    import pickle

    from paretolab.plugins.macko import MackoLinear

    layer = MackoLinear.from_linear(torch.nn.Linear(40, 24))
    x = torch.randn(2, 40)
    with torch.no_grad():
        y = layer(x)
        for twin in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
            assert torch.equal(twin(x), y)
            twin.values.zero_()  # the copy owns its buffers: its runner reads them, not the original's
            assert torch.equal(twin(x), twin.bias.expand(2, 24)) and torch.equal(layer(x), y)

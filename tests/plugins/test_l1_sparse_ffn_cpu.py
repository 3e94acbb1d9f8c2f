"""l1_sparsity on the CPU: one-token FFNs run the C kernel when it is built; switched off, the index_select path."""

from __future__ import annotations

import pytest
import torch

from paretolab import TrialContext
from paretolab.generation import greedy_decode
from paretolab.kernels import cpu_ext
from paretolab.kernels.sparse_ffn_cpu import NAME
from paretolab.plugin_api.subject import Subject
from paretolab.plugins.l1_sparsity import L1Sparsity, sparse_path

from .test_l1_sparsity import ids, kill_units

if not cpu_ext.built(NAME):  # reported in the summary (-rs), never silent
    pytestmark = pytest.mark.skip(reason="paretolab.kernels._sparse_ffn_cpu is not built (needs a C compiler with OpenMP): "
                                         "run `pip install -e . --no-deps --no-build-isolation`")


@pytest.mark.parametrize("act", ["relu", "relu2"])
def test_decoding_runs_the_c_kernel_and_matches_dense_and_index_select(tiny: Subject, ctx: TrialContext, act: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    model = L1Sparsity().transform(tiny.copy(), {"lam": 0.0, "act": act}, ctx).model
    kill_units(model, 0.9)
    ext = cpu_ext.extension(NAME)
    real, calls = ext.ffn, []
    monkeypatch.setattr(ext, "ffn", lambda *a: (calls.append(1), real(*a))[1])
    prompt = ids(8, 1)
    with torch.no_grad():
        fast = greedy_decode(model, prompt, 6)
        assert len(calls) == 2 * 5  # two layers × five one-token steps (the first token comes from the prefill)
        with sparse_path(model, False):
            dense = greedy_decode(model, prompt, 6)
        monkeypatch.setenv(cpu_ext.ENV, "0")
        index_select = greedy_decode(model, prompt, 6)
        mlp, x = model.model.layers[1].mlp, torch.randn(1, 1, 64, generator=torch.Generator().manual_seed(0))
        by_index = mlp(x)
        monkeypatch.delenv(cpu_ext.ENV)
        by_kernel = mlp(x)
        by_dense = mlp.down_proj(mlp.hidden(x))
    assert len(calls) == 10 + 1  # switched off: none; the last single call: one
    assert torch.equal(fast, dense) and torch.equal(fast, index_select)
    torch.testing.assert_close(by_kernel, by_dense, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(by_kernel, by_index, rtol=1e-5, atol=1e-6)

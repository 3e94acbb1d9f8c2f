"""Cost measures: sizes follow the storage the methods declare; latency is measured."""

from __future__ import annotations


from paretolab.measures import Latency, LatencyOptions, NoOptions, ParamCount, Size
from paretolab.plugins.baselines import RTN, Magnitude, linear_weights


def test_dense_size_is_four_bytes_per_distinct_param(tiny, ctx):
    params = ParamCount().measure(tiny, NoOptions(), ctx)["param_count"]
    assert params == sum(p.numel() for p in tiny.model.parameters())  # tied embedding counted once
    assert Size().measure(tiny, NoOptions(), ctx)["size_bytes"] == 4 * params


def test_rtn_and_magnitude_compose_in_size_bytes(tiny, ctx):
    dense = Size().measure(tiny, NoOptions(), ctx)["size_bytes"]
    linears = [(n, m.weight.numel()) for n, m in linear_weights(tiny.model)]
    linear_numel = sum(n for _, n in linears)
    q = RTN().transform(tiny.copy(), {"bits": 4, "group_size": 32}, ctx)
    expected = dense - 4 * linear_numel + linear_numel // 2 + (linear_numel // 32) * 2
    assert Size().measure(q, NoOptions(), ctx)["size_bytes"] == expected
    pq = RTN().transform(Magnitude().transform(tiny.copy(), {"sparsity": 0.5, "scope": "row"}, ctx), {"bits": 4, "group_size": 32}, ctx)
    kept = ParamCount().measure(pq, NoOptions(), ctx)["nonzero_params"]
    assert kept < ParamCount().measure(tiny, NoOptions(), ctx)["param_count"]
    assert Size().measure(pq, NoOptions(), ctx)["size_bytes"] < expected  # bitmap + kept 4-bit values


def test_latency_is_measured(tiny, ctx):
    result = Latency().measure(tiny, LatencyOptions(prompt_tokens=16, new_tokens=8, repeats=3), ctx)
    assert result["prefill_ms"] > 0 and result["decode_tok_s"] > 0

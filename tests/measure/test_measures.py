"""Cost measures: sizes follow the storage the methods declare; latency is measured."""

from __future__ import annotations

from paretolab.measure.measures import (
    Latency,
    LatencyOptions,
    NoOptions,
    ParamCount,
    Size,
)
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


def test_a_new_module_counts_dense_in_its_dtype(tiny, ctx):
    import torch

    dense = Size().measure(tiny, NoOptions(), ctx)["size_bytes"]
    tiny.model.adapter = torch.nn.Linear(8, 4, bias=False, dtype=torch.float16)
    assert Size().measure(tiny, NoOptions(), ctx)["size_bytes"] == dense + 8 * 4 * 2


def test_a_replaced_weight_drops_the_storage_of_the_one_it_replaced(tiny, ctx):
    import torch

    dense = Size().measure(tiny, NoOptions(), ctx)["size_bytes"]
    pruned = Magnitude().transform(tiny.copy(), {"sparsity": 0.5, "scope": "row"}, ctx).copy()  # the record survives a copy
    assert Size().measure(pruned, NoOptions(), ctx)["size_bytes"] < dense
    for name, linear in linear_weights(pruned.model):  # a later stage puts fresh dense weights in (say, a re-trained layer)
        linear.weight = torch.nn.Parameter(torch.randn_like(linear.weight))
        assert not pruned.storage_of(f"{name}.weight").sparse
    assert Size().measure(pruned, NoOptions(), ctx)["size_bytes"] == dense


def test_a_replaced_format_module_drops_its_stored_bytes(tiny, ctx):
    import torch

    dense = Size().measure(tiny, NoOptions(), ctx)["size_bytes"]
    mlp = tiny.model.model.layers[0].mlp
    up = mlp.up_proj
    mlp.up_proj = torch.nn.Identity()  # a format module with its own buffers would sit here
    tiny.set_storage("format:model.layers.0.mlp.up_proj", stored_bytes=100)
    assert Size().measure(tiny, NoOptions(), ctx)["size_bytes"] == dense - up.weight.numel() * 4 + 100
    mlp.up_proj = up  # a later stage swaps the module back to a dense Linear
    assert Size().measure(tiny.copy(), NoOptions(), ctx)["size_bytes"] == dense

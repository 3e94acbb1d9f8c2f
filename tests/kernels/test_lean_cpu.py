"""The lean forward's C operations (RMSNorm, rotary, attention over the cache, silu * up) against transformers' and torch's arithmetic."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from paretolab.kernels import cpu_ext
from paretolab.kernels import lean_cpu as L

if not cpu_ext.built(L.NAME):  # reported in the summary (-rs), never silent
    pytestmark = pytest.mark.skip(reason="paretolab.kernels._lean_cpu is not built (needs a C compiler): "
                                         "run `pip install -e . --no-deps --no-build-isolation`")

PATHS = cpu_ext.runnable_paths(L.NAME)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dim", [576, 50])  # SmolLM2's width; one that ends in a partial vector
def test_rms_norm_is_transformers_llama_rmsnorm(path: str, dim: int) -> None:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(dim, eps=1e-5)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(3, dim) * 3
    torch.testing.assert_close(L.rms_norm(x, norm.weight.detach(), 1e-5, path=path), norm(x).detach(), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dim", [64, 20])
def test_rotary_is_bit_identical_to_transformers(path: str, dim: int) -> None:
    tokens, heads = 3, 5
    t = torch.randn(1, tokens, heads * dim)
    cos, sin = torch.randn(tokens, dim), torch.randn(tokens, dim)
    q = t.view(1, tokens, heads, dim).transpose(1, 2)  # transformers: (1, heads, T, D) * (1, 1, T, D)
    expected = (q * cos + _rotate_half(q) * sin).transpose(1, 2).reshape(1, tokens, heads * dim)
    assert torch.equal(L.rotary_(t.clone(), cos, sin, heads, path=path), expected)


@pytest.mark.parametrize("path", PATHS)
def test_silu_mul_matches_torch_also_far_out(path: str) -> None:
    gate = torch.cat([torch.randn(1000) * 4, torch.tensor([-200.0, -90.0, 0.0, 90.0, 200.0])])
    up = torch.randn_like(gate)
    out = L.silu_mul(gate, up, path=path)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, F.silu(gate) * up, rtol=2e-6, atol=1e-6)


def _sdpa(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, past: int, heads: int, block: torch.Tensor) -> torch.Tensor:
    tokens, dim = q.shape[1], keys.shape[-1]
    mask = torch.cat([torch.ones(tokens, past, dtype=torch.bool), block], dim=1)
    out = F.scaled_dot_product_attention(q.view(1, tokens, heads, dim).transpose(1, 2), keys[:, :, : past + tokens],
                                         values[:, :, : past + tokens], attn_mask=mask, scale=0.125, enable_gqa=True)
    return out.transpose(1, 2).reshape(1, tokens, heads * dim)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dim", [64, 24])  # 24: not whole vectors, the scalar loop on every path
def test_attention_matches_sdpa_causal_and_tree_with_grouped_heads(path: str, dim: int) -> None:
    torch.manual_seed(0)
    tokens, heads, kv_heads, past, capacity = 4, 9, 3, 37, 64
    keys, values = torch.randn(1, kv_heads, capacity, dim), torch.randn(1, kv_heads, capacity, dim)
    q = torch.randn(1, tokens, heads * dim)
    causal = torch.ones(tokens, tokens, dtype=torch.bool).tril()
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    torch.testing.assert_close(L.attention(q, keys, values, past, 0.125, path=path), _sdpa(q, keys, values, past, heads, causal),
                               rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(L.attention(q, keys, values, past, 0.125, block_mask=tree, path=path),
                               _sdpa(q, keys, values, past, heads, tree), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("path", PATHS)
def test_a_row_alone_gets_the_bits_it_gets_inside_a_block(path: str) -> None:
    """What makes a speculative verify reproduce greedy decoding: row t of a block equals that token decoded alone."""
    torch.manual_seed(1)
    tokens, heads, kv_heads, dim, past = 5, 9, 3, 64, 20
    keys, values = torch.randn(1, kv_heads, 64, dim), torch.randn(1, kv_heads, 64, dim)
    q = torch.randn(1, tokens, heads * dim)
    block = L.attention(q, keys, values, past, 0.125, path=path)
    for t in range(tokens):
        alone = L.attention(q[:, t : t + 1].contiguous(), keys, values, past + t, 0.125, path=path)
        assert torch.equal(alone[0, 0], block[0, t])


@pytest.mark.parametrize("path", PATHS)
def test_attention_writes_and_rotates_the_new_keys_first(path: str) -> None:
    torch.manual_seed(2)
    tokens, heads, kv_heads, dim, past = 3, 6, 2, 64, 10
    keys, values = torch.randn(1, kv_heads, 32, dim), torch.randn(1, kv_heads, 32, dim)
    q, k, v = torch.randn(1, tokens, heads * dim), torch.randn(1, tokens, kv_heads * dim), torch.randn(1, tokens, kv_heads * dim)
    cos, sin = torch.randn(tokens, dim), torch.randn(tokens, dim)
    expect_k, expect_v = keys.clone(), values.clone()
    q2 = L.rotary_(q.clone(), cos, sin, heads, path=path)
    expect_k[:, :, past : past + tokens] = L.rotary_(k.clone(), cos, sin, kv_heads, path=path).view(1, tokens, kv_heads, dim).transpose(1, 2)
    expect_v[:, :, past : past + tokens] = v.view(1, tokens, kv_heads, dim).transpose(1, 2)
    expected = L.attention(q2, expect_k, expect_v, past, 0.125, path=path)
    out = L.attention(q, keys, values, past, 0.125, new=(k, v), rotary=(cos, sin), path=path)
    assert torch.equal(keys, expect_k) and torch.equal(values, expect_v) and torch.equal(out, expected)


def test_bad_inputs_are_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="contiguous fp32 CPU"):
        L.rms_norm(torch.randn(2, 8, dtype=torch.float64), torch.randn(8), 1e-5)
    with pytest.raises(ValueError, match="block_mask must be bool"):
        L.attention(torch.randn(1, 2, 128), torch.randn(1, 1, 8, 64), torch.randn(1, 1, 8, 64), 0, 0.125,
                    block_mask=torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="capacity"):
        L.attention(torch.randn(1, 2, 128), torch.randn(1, 1, 8, 64), torch.randn(1, 1, 8, 64), 7, 0.125)

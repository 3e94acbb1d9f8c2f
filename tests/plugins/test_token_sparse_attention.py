"""token_sparse_attention: prefill-time token selection in later layers, outputs scattered back, full KV cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from paretolab import TrialContext
from paretolab.errors import ConfigError
from paretolab.generation import forward_with_cache, generate
from paretolab.models import TinyLlama
from paretolab.plugin_api.subject import Subject
from paretolab.plugins.token_sparse_attention import (
    SparseSettings,
    TokenSparseAttention,
    select_tokens,
    token_sparse_attention_forward,
)
from paretolab.testing import MethodContract

# Small enough for the tiny model's 64-token prompts to be sparsified.
SMALL = {"tau": 0.4, "window": 8, "min_tokens": 8, "kernel_size": 3}


@pytest.fixture
def ctx(tmp_path: Path) -> TrialContext:
    return TrialContext(seed=0, workdir=tmp_path / "trial")


@pytest.fixture(scope="module")
def tiny4() -> Subject:
    return TinyLlama(layers=4).load()


def ids(length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 250, (1, length), generator=torch.Generator().manual_seed(seed))


def sparse(subject: Subject, ctx: TrialContext, **params: Any) -> Subject:
    return TokenSparseAttention().transform(subject.copy(), {**SMALL, "first_sparse_layer": 2, **params}, ctx)


def test_tau_zero_gives_dense_attention_exactly(tiny4: Subject, ctx: TrialContext) -> None:
    prompt = ids(80)
    with torch.no_grad():
        dense = tiny4.model(input_ids=prompt).logits
        same = sparse(tiny4, ctx, tau=0.0, first_sparse_layer=0).model(input_ids=prompt).logits
    assert torch.equal(dense, same)


def test_short_prompts_are_left_dense(tiny4: Subject, ctx: TrialContext) -> None:
    prompt = ids(16)  # 16 <= min_tokens + window: nothing to drop
    with torch.no_grad():
        assert torch.equal(tiny4.model(input_ids=prompt).logits, sparse(tiny4, ctx, first_sparse_layer=0).model(input_ids=prompt).logits)


def test_dropped_tokens_get_zero_output_and_kept_tokens_attend_only_to_kept_ones(tiny4: Subject, ctx: TrialContext) -> None:
    attn = sparse(tiny4, ctx, first_sparse_layer=0).model.model.layers[0].self_attn
    gen = torch.Generator().manual_seed(4)
    length, d = 60, 16
    q, k, v = torch.randn(1, 4, length, d, generator=gen), 3 * torch.randn(1, 2, length, d, generator=gen), torch.randn(1, 2, length, d, generator=gen)
    out, _ = token_sparse_attention_forward(attn, q, k, v, None, scaling=d**-0.5)
    kept = attn.token_sparse_last
    assert out.shape == (1, length, 4, d) and kept is not None
    n_keep = kept.shape[1]
    assert 8 + 8 <= n_keep < length  # at least min_tokens + the window, fewer than all
    for h in range(4):
        keep = torch.zeros(length, dtype=torch.bool)
        keep[kept[h]] = True
        assert bool(keep[-8:].all()), "the last W tokens are always kept"
        assert bool((out[0, ~keep, h] == 0).all()), "dropped tokens get a zero attention output"
        kh = k[0, h // 2]
        allowed = torch.ones(length, length, dtype=torch.bool).tril() & keep[None, :]
        logits = (q[0, h] @ kh.T / d**0.5).masked_fill(~allowed, float("-inf"))
        want = torch.softmax(logits, -1) @ v[0, h // 2]
        torch.testing.assert_close(out[0, keep, h], want[keep], rtol=1e-5, atol=1e-5)


def test_an_explicit_causal_mask_gives_the_same_selection_and_output(tiny4: Subject, ctx: TrialContext) -> None:
    attn = sparse(tiny4, ctx, first_sparse_layer=0).model.model.layers[0].self_attn
    gen = torch.Generator().manual_seed(7)
    q, k, v = torch.randn(1, 4, 50, 16, generator=gen), 3 * torch.randn(1, 2, 50, 16, generator=gen), torch.randn(1, 2, 50, 16, generator=gen)
    plain, _ = token_sparse_attention_forward(attn, q, k, v, None, scaling=0.25)
    kept = attn.token_sparse_last
    causal = torch.ones(50, 50, dtype=torch.bool).tril()[None, None]  # as transformers passes it with padding
    masked, _ = token_sparse_attention_forward(attn, q, k, v, causal, scaling=0.25)
    assert torch.equal(attn.token_sparse_last, kept)
    torch.testing.assert_close(masked, plain, rtol=1e-5, atol=1e-6)


def test_larger_tau_drops_more_and_min_tokens_is_a_floor() -> None:
    scores = torch.rand(3, 200, generator=torch.Generator().manual_seed(0)) ** 4  # (H, L - W)
    kept = []
    for tau in (0.01, 0.1, 0.3, 0.6):
        sel = select_tokens(scores, SparseSettings(tau, 16, 8, 1, "sdpa"), 216)
        kept.append(sel.shape[1] if sel is not None else 216)
    assert kept == sorted(kept, reverse=True) and kept[-1] < kept[0]
    floor = select_tokens(scores, SparseSettings(0.99, 16, 150, 1, "sdpa"), 216)
    assert floor is not None and floor.shape[1] == 150 + 16
    # the dropped mass (on the head-averaged distribution) is at least tau, and just so
    norm = scores / scores.sum(-1, keepdim=True)
    sel = select_tokens(scores, SparseSettings(0.3, 16, 8, 1, "sdpa"), 216)
    assert sel is not None
    dropped = 200 - (sel.shape[1] - 16)
    sorted_mass = torch.sort(norm.mean(0)).values.cumsum(0)
    assert sorted_mass[dropped - 1] >= 0.3 > sorted_mass[dropped - 2]


def test_earlier_layers_unchanged_cache_complete_and_decoding_works(tiny4: Subject, ctx: TrialContext) -> None:
    prompt = ids(64, seed=1)
    subject = sparse(tiny4, ctx)
    model = subject.model
    with torch.no_grad():
        dense = tiny4.model(input_ids=prompt, output_hidden_states=True)
        out = model(input_ids=prompt, output_hidden_states=True, use_cache=True)
    for i in range(3):  # embeddings and the outputs of layers 0-1 come before the first sparse layer
        assert torch.equal(out.hidden_states[i], dense.hidden_states[i])
    assert not torch.allclose(out.logits, dense.logits), "tau=0.4 must change the output"
    assert all(layer.self_attn.token_sparse_last is not None for layer in model.model.layers[2:])
    cache = out.cache if hasattr(out, "cache") else out.past_key_values
    assert cache.get_seq_length() == 64  # every token is in the KV cache of every layer
    _, dense_cache = forward_with_cache(tiny4.model, prompt)
    torch.testing.assert_close(cache.layers[2].keys, dense_cache.layers[2].keys)  # layer 2's input is unchanged
    result = generate(subject, [prompt[0].tolist()], max_new_tokens=5)
    assert len(result.sequences[0]) == 5
    assert TokenSparseAttention().evaluate(subject, ctx)["attn_kept_frac"] < 1.0


def test_a_token_dropped_by_every_head_keeps_its_residual(tiny4: Subject, ctx: TrialContext) -> None:
    model = sparse(tiny4, ctx, tau=0.9).model
    captured: dict[str, torch.Tensor] = {}
    handle = model.model.layers[2].self_attn.register_forward_hook(lambda m, a, out: captured.update(out=out[0]))
    with torch.no_grad():
        model(input_ids=ids(64, seed=2))
    handle.remove()
    kept = model.model.layers[2].self_attn.token_sparse_last
    everywhere = torch.ones(64, dtype=torch.bool)
    for h in range(kept.shape[0]):
        mask = torch.ones(64, dtype=torch.bool)
        mask[kept[h]] = False
        everywhere &= mask
    assert everywhere.any(), "with tau=0.9 some token is dropped by every head"
    assert bool((captured["out"][0, everywhere] == 0).all())  # o_proj(0) = 0: the residual passes unchanged
    assert bool((captured["out"][0, ~everywhere].abs().sum(-1) > 0).all())


def test_sequences_of_a_batch_are_selected_independently(tiny4: Subject, ctx: TrialContext) -> None:
    model = sparse(tiny4, ctx).model
    a, b = ids(48, seed=5), ids(48, seed=6)
    with torch.no_grad():
        both = model(input_ids=torch.cat([a, b])).logits
        alone = torch.cat([model(input_ids=a).logits, model(input_ids=b).logits])
    torch.testing.assert_close(both, alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "bad", [{"tau": 1.0}, {"tau": -0.1}, {"window": 0}, {"kernel_size": 4}, {"first_sparse_layer": 4}, {"min_tokens": -1}]
)
def test_bad_params_name_the_field(tiny4: Subject, ctx: TrialContext, bad: dict[str, Any]) -> None:
    field = next(iter(bad))
    with pytest.raises(ConfigError, match=f"token_sparse_attention.{field}"):
        sparse(tiny4, ctx, **bad)


class TestTokenSparseAttentionContract(MethodContract):
    @pytest.fixture
    def method(self) -> TokenSparseAttention:
        return TokenSparseAttention()

    @pytest.fixture
    def params(self) -> dict[str, Any]:
        return {**SMALL, "first_sparse_layer": 1}


@pytest.mark.slow
def test_smollm2_drops_tokens_on_real_text_with_a_complete_cache(ctx: TrialContext) -> None:
    from paretolab.data import encode, pydoc_text
    from paretolab.models import resolve_model

    subject = resolve_model("smollm2-135m").load()
    prompt = torch.tensor([encode(subject.tokenizer, pydoc_text()[:20000])[:1280]])
    params = {"tau": 0.05, "window": 64, "min_tokens": 256, "first_sparse_layer": 15}
    sparse_subject = TokenSparseAttention().transform(subject.copy(), params, ctx)
    with torch.no_grad():
        dense = subject.model(input_ids=prompt, output_hidden_states=True)
        out = sparse_subject.model(input_ids=prompt, output_hidden_states=True, use_cache=True)
    kept = TokenSparseAttention().evaluate(sparse_subject, ctx)["attn_kept_frac"]
    assert kept < 0.95, "real text at 1280 tokens has low-attention tokens to drop"
    for i in range(16):  # embeddings and layers 0-14 run dense
        assert torch.equal(out.hidden_states[i], dense.hidden_states[i])
    cache = out.cache if hasattr(out, "cache") else out.past_key_values
    assert cache.get_seq_length() == 1280 and torch.isfinite(out.logits).all()

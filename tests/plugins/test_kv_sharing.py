"""qk_v_sharing (values tied to keys), kv_heads (GQA/MQA regrouping) and the kv_cache measure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from paretolab import TrialContext
from paretolab.errors import ConfigError
from paretolab.models import TinyLlama
from paretolab.plugin_api.method import Method
from paretolab.plugin_api.subject import Subject
from paretolab.plugins import kv_sharing
from paretolab.plugins.kv_sharing import (
    KVCache,
    KVHeads,
    QKVSharing,
    SharedKVAttention,
    cache_bytes_per_token,
)
from paretolab.testing import MethodContract


@pytest.fixture
def tiny() -> Subject:
    return TinyLlama(layers=2, hidden=64).load()  # 4 heads, 2 key/value heads, head_dim 16, fp32


@pytest.fixture
def ctx(tmp_path: Path) -> TrialContext:
    return TrialContext(seed=0, workdir=tmp_path)


def ids(n: int = 24, batch: int = 2) -> torch.Tensor:
    return torch.randint(3, 250, (batch, n), generator=torch.Generator().manual_seed(1))


def expected_bytes(model: torch.nn.Module, *, shared: bool) -> int:
    """layers × kv heads × head_dim × dtype bytes × (1 if shared else 2)."""
    c = model.config
    return c.num_hidden_layers * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads) * 4 * (1 if shared else 2)


def test_values_are_the_unrotated_key_projection(tiny: Subject, ctx: TrialContext) -> None:
    # the reference: standard Llama attention with v_proj set to k_proj's weights (RoPE on keys only, values not rotated)
    reference = tiny.copy()
    for layer in reference.model.model.layers:
        layer.self_attn.v_proj.weight.data.copy_(layer.self_attn.k_proj.weight.data)
    shared = QKVSharing().transform(tiny.copy(), {}, ctx)
    assert all(isinstance(layer.self_attn, SharedKVAttention) and not hasattr(layer.self_attn, "v_proj") for layer in shared.model.model.layers)
    with torch.no_grad():
        torch.testing.assert_close(shared.model(input_ids=ids()).logits, reference.model(input_ids=ids()).logits, rtol=1e-5, atol=1e-5)


def test_cache_holds_one_tensor_per_layer_half_the_bytes(tiny: Subject, ctx: TrialContext) -> None:
    assert cache_bytes_per_token(tiny.model) == expected_bytes(tiny.model, shared=False) == 512
    shared = QKVSharing().transform(tiny.copy(), {}, ctx)
    assert cache_bytes_per_token(shared.model) == expected_bytes(shared.model, shared=True) == 256
    params_before = sum(p.numel() for p in tiny.model.parameters())
    params_after = sum(p.numel() for p in shared.model.parameters())
    assert params_before - params_after == 2 * 64 * 32  # each layer's v_proj (hidden 64 -> 2 heads × 16) is gone


def greedy(model: torch.nn.Module, prompt: torch.Tensor, new: int, *, cached: bool) -> list[int]:
    """Greedy tokens: one cached forward per token, or the whole sequence recomputed each step."""
    from paretolab.generation.decoding import forward_with_cache

    seq, out, cache = prompt, [], None
    with torch.no_grad():
        for _ in range(new):
            if cached:
                logits, cache = forward_with_cache(model, seq if cache is None else seq[:, -1:], cache)
            else:
                logits = model(input_ids=seq, use_cache=False).logits
            token = logits[:, -1].argmax(-1, keepdim=True)
            out.append(int(token))
            seq = torch.cat([seq, token], dim=1)
    return out


def test_cached_generation_equals_recompute(tiny: Subject, ctx: TrialContext) -> None:
    shared = QKVSharing().transform(tiny.copy(), {}, ctx)
    prompt = ids(12, batch=1)
    assert greedy(shared.model, prompt, 16, cached=True) == greedy(shared.model, prompt, 16, cached=False)
    hf = shared.model.generate(prompt, max_new_tokens=16, do_sample=False, use_cache=True, pad_token_id=0)
    assert hf[0, 12:].tolist() == greedy(shared.model, prompt, 16, cached=False)


def test_copies_use_their_own_rotary_embedding(tiny: Subject, ctx: TrialContext) -> None:
    copy = QKVSharing().transform(tiny, {}, ctx).copy()
    assert all(layer.self_attn._rotary[0] is copy.model.model.rotary_emb for layer in copy.model.model.layers)


def test_trains(tiny: Subject, ctx: TrialContext) -> None:
    shared = QKVSharing().transform(tiny.copy(), {}, ctx).model.train()
    loss = shared(input_ids=ids(), labels=ids()).loss
    loss.backward()
    assert all(layer.self_attn.kv_proj.weight.grad.abs().sum() > 0 for layer in shared.model.layers)


@pytest.mark.parametrize("kv_heads, params_per_layer", [(1, 2 * 64 * 16), (2, 2 * 64 * 32), (4, 2 * 64 * 64)])
def test_kv_heads_parameters_and_cache_bytes(tiny: Subject, ctx: TrialContext, kv_heads: int, params_per_layer: int) -> None:
    out = KVHeads().transform(tiny.copy(), {"kv_heads": kv_heads}, ctx)
    attention = out.model.model.layers[0].self_attn
    assert sum(p.numel() for m in (attention.k_proj, attention.v_proj) for p in m.parameters()) == params_per_layer
    assert cache_bytes_per_token(out.model) == expected_bytes(out.model, shared=False) == 2 * 2 * kv_heads * 16 * 4
    with torch.no_grad():
        assert torch.isfinite(out.model(input_ids=ids()).logits).all()


def test_kv_heads_up_keeps_the_function_and_mqa_matches_shared_bytes(tiny: Subject, ctx: TrialContext) -> None:
    mha = KVHeads().transform(tiny.copy(), {"kv_heads": 4}, ctx)  # repeating heads: same model
    with torch.no_grad():
        torch.testing.assert_close(mha.model(input_ids=ids()).logits, tiny.model(input_ids=ids()).logits, rtol=1e-5, atol=1e-5)
    # equal cache bytes: Q-K=V on MHA (4 shared heads) = GQA with 2 key/value heads
    shared = QKVSharing().transform(mha.copy(), {}, ctx)
    gqa = KVHeads().transform(mha.copy(), {"kv_heads": 2}, ctx)
    assert cache_bytes_per_token(shared.model) == cache_bytes_per_token(gqa.model) == cache_bytes_per_token(mha.model) / 2


def test_kv_heads_mean_pools_each_group(tiny: Subject, ctx: TrialContext) -> None:
    k = tiny.model.model.layers[0].self_attn.k_proj.weight.detach().reshape(2, 16, 64)
    out = KVHeads().transform(tiny.copy(), {"kv_heads": 1}, ctx)
    torch.testing.assert_close(out.model.model.layers[0].self_attn.k_proj.weight.reshape(1, 16, 64), k.mean(0, keepdim=True))


def test_kv_heads_refuses_a_count_that_does_not_divide_the_heads(tiny: Subject, ctx: TrialContext) -> None:
    with pytest.raises(ConfigError, match="kv_heads.kv_heads must divide the 4 attention heads.*got 3"):
        KVHeads().transform(tiny.copy(), {"kv_heads": 3}, ctx)


def test_kv_cache_measure_is_registered_for_every_model(tiny: Subject, ctx: TrialContext) -> None:
    measures, metrics = [], []
    kv_sharing.register_measures(measures.append)
    kv_sharing.register_metrics(metrics.append)
    assert [m.name for m in measures] == ["kv_cache"] and [m.name for m in metrics] == ["kv_bytes_per_token"]
    assert KVCache().measure(tiny, {}, ctx) == {"kv_bytes_per_token": 512.0}


class TestQKVSharingContract(MethodContract):
    @pytest.fixture
    def method(self) -> Method:
        return QKVSharing()


class TestKVHeadsContract(MethodContract):
    @pytest.fixture
    def method(self) -> Method:
        return KVHeads()

    @pytest.fixture
    def params(self) -> dict[str, Any]:
        return {"kv_heads": 1}  # tiny-llama has 2: 1 is a change (the space's 2 would be the identity)


@pytest.mark.parametrize("method, params, kv_bytes", [("qk_v_sharing", {}, 256.0), ("kv_heads", {"kv_heads": 1}, 256.0), ("none", {}, 512.0)])
def test_trains_as_a_trial_after_re_initialisation(tiny: Subject, tmp_path: Path, method: str, params: dict[str, Any], kv_bytes: float) -> None:
    import inspect
    import textwrap

    from paretolab.records import StagePlan, TrialSettings
    from paretolab.study.trial import run_trial

    text = tmp_path / "train.txt"
    text.write_text(inspect.getsource(textwrap), encoding="utf-8")
    tiny.info["weights"] = "random init"  # train's init: auto re-initialises the rebuilt projections
    train = {"tokens": 2048, "seq_len": 32, "batch": 8, "eval_every": 4, "eval_tokens": 256, "corpus": str(text)}
    settings = TrialSettings("t", "perplexity", {"corpus": "pydoc", "max_tokens": 256, "context": 64, "stride": 64},
                             {"kv_cache": {}}, seed=0, cpus=1, timeout_s=600)
    result = run_trial(tiny, [StagePlan("s0", method, params), StagePlan("s1", "train", train)], settings, number=0)
    assert not result.failed, result.traceback
    assert result.metrics["kv_bytes_per_token"] == kv_bytes and result.metrics["val_loss"] > 0

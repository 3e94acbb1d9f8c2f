"""The lean batch-1 forward: the same logits as transformers' forward, its cache rolled back the same way, and
only taken where it reproduces the model (hooks, swapped modules and padded batches keep their meaning)."""

import pytest
import torch

from paretolab.generation import generate
from paretolab.generation.decoding import forward_with_cache
from paretolab.generation.lean import LeanCache, lean_decoding, lean_supported


def _session(model, lean: bool, steps: int = 70):
    """Prefill, `steps` one-token steps (past the cache's first 64 positions), a 4-token verify, a crop, one more step."""
    with lean_decoding(lean), torch.no_grad():
        logits, cache = forward_with_cache(model, torch.tensor([[5, 9, 2, 7, 11, 3]]), last_only=True)
        seen = [logits[0, -1]]
        token = logits[:, -1:].argmax(-1)
        for _ in range(steps):
            logits, cache = forward_with_cache(model, token, cache, last_only=True)
            seen.append(logits[0, -1])
            token = logits[:, -1:].argmax(-1)
        block, cache = forward_with_cache(model, torch.tensor([[4, 8, 15, 16]]), cache)
        cache.crop(-2)  # keep two of the four verified tokens
        after, cache = forward_with_cache(model, torch.tensor([[23]]), cache, last_only=True)
    return torch.stack(seen), block[0], after[0, -1], type(cache), cache.get_seq_length()


def test_lean_logits_equal_transformers_through_decode_verify_and_crop(tiny):
    ref, lean = _session(tiny.model, False), _session(tiny.model, True)
    assert ref[3] is not LeanCache and lean[3] is LeanCache
    assert ref[4] == lean[4] == 6 + 70 + 2 + 1
    for a, b in zip(ref[:3], lean[:3], strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


def test_greedy_generation_is_unchanged_and_takes_the_lean_path(tiny, monkeypatch):
    import paretolab.generation.decoding as decoding
    from paretolab.generation import GreedyGenerator

    calls = []
    real = decoding.lean_forward
    monkeypatch.setattr(decoding, "lean_forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    prompts = [[5, 9, 2, 7], [1, 2, 3, 4, 5, 6, 7, 8]]
    with lean_decoding(False):
        ref = GreedyGenerator().generate(tiny, prompts, max_new_tokens=12).sequences
    assert not calls
    assert GreedyGenerator().generate(tiny, prompts, max_new_tokens=12).sequences == ref
    assert len(calls) == 2 * 12  # a prefill and 11 steps per prompt


def test_only_unpadded_single_sequences_of_unchanged_llamas_take_it(tiny):
    model = tiny.model
    assert lean_supported(model)
    with torch.no_grad():
        assert isinstance(forward_with_cache(model, torch.tensor([[5, 6]]))[1], LeanCache)
        assert not isinstance(forward_with_cache(model, torch.tensor([[5, 6], [7, 8]]))[1], LeanCache)  # a batch
        assert not isinstance(forward_with_cache(model, torch.tensor([[5, 6]]), attention_mask=torch.ones(1, 2))[1], LeanCache)
        assert not isinstance(forward_with_cache(model, torch.tensor([[5, 6]]), lean=False)[1], LeanCache)
    attn = model.model.layers[1].self_attn
    attn.forward = lambda *a, **k: (_ for _ in ()).throw(AssertionError("patched"))  # a method that rewrote attention
    assert not lean_supported(model)
    del attn.forward
    handle = attn.register_forward_hook(lambda *a: None)  # a hook on attention would be skipped: not lean
    assert not lean_supported(model)
    handle.remove()
    model.train()
    assert not lean_supported(model)
    model.eval()
    assert lean_supported(model)


def test_decoder_layer_hooks_see_what_they_see_in_transformers(tiny):
    """TargetFeatures (EAGLE's hidden states) hooks decoder layers: the lean path calls those hooks with the layer output."""
    from paretolab.plugins.speculative.generator import TargetFeatures

    feats = {}
    for lean in (False, True):
        with lean_decoding(lean), TargetFeatures(tiny.model, (0, 1)) as watch, torch.no_grad():
            _, cache = forward_with_cache(tiny.model, torch.tensor([[5, 9, 2, 7]]))
            forward_with_cache(tiny.model, torch.tensor([[3, 4]]), cache)
            feats[lean] = watch.last()
    assert feats[True].shape == (2, 2 * tiny.model.config.hidden_size)
    torch.testing.assert_close(feats[True], feats[False], rtol=0, atol=1e-5)


def test_a_swapped_mlp_or_linear_is_honoured(tiny):
    """Methods swap linears (MACKO, the CPU kernel) or MLPs (L1 sparsity): the lean path calls the modules it finds."""

    class Halved(torch.nn.Module):
        def __init__(self, mlp):
            super().__init__()
            self.mlp = mlp

        def forward(self, x):
            return self.mlp(x) * 0.5

    before = _session(tiny.model, True, steps=3)
    layer = tiny.model.model.layers[0]
    layer.mlp = Halved(layer.mlp)
    ref, lean = _session(tiny.model, False, steps=3), _session(tiny.model, True, steps=3)
    torch.testing.assert_close(lean[0], ref[0], rtol=0, atol=1e-5)
    assert not torch.allclose(before[0], lean[0])  # the swap changed what the lean path computed


def test_lean_cache_crop_follows_transformers_semantics():
    cache = LeanCache(layers=1)
    cache.length = 10
    cache.crop(12)
    assert cache.get_seq_length() == 10  # nothing to cut
    cache.crop(-3)
    assert cache.get_seq_length() == 7
    cache.crop(4)
    assert cache.get_seq_length() == 4


def test_lean_forward_refuses_a_batch(tiny):
    from paretolab.generation.lean import lean_forward

    with pytest.raises(ValueError, match=r"input_ids must be \(1, T\)"):
        lean_forward(tiny.model, torch.tensor([[1, 2], [3, 4]]))


def test_a_single_row_decoder_takes_the_lean_forward_and_refuses_a_batch(tiny):
    from paretolab.errors import ConfigError
    from paretolab.generation.decoding import BatchDecoder

    single, batched = BatchDecoder(tiny.model, single=True), BatchDecoder(tiny.model)
    torch.testing.assert_close(single.prefill([[5, 9, 2, 7]]), batched.prefill([[5, 9, 2, 7]]), rtol=0, atol=1e-5)
    assert isinstance(single.cache, LeanCache) and not isinstance(batched.cache, LeanCache)
    torch.testing.assert_close(single.extend(torch.tensor([3])), batched.extend(torch.tensor([3])), rtol=0, atol=1e-5)
    with pytest.raises(ConfigError, match="single"):
        BatchDecoder(tiny.model, single=True).prefill([[1, 2], [3, 4]])
    with pytest.raises(ConfigError, match="single"):
        single.repeat(2)


def test_the_default_loop_at_batch_1_takes_the_lean_forward(tiny, monkeypatch):
    """generate() without a generator (the baseline every speed-up is measured against) is the lean loop for one prompt."""
    import paretolab.generation.decoding as decoding

    calls = []
    real = decoding.lean_forward
    monkeypatch.setattr(decoding, "lean_forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    with lean_decoding(False):
        ref = generate(tiny, [[5, 9, 2, 7]], max_new_tokens=10).sequences
    assert not calls
    assert generate(tiny, [[5, 9, 2, 7]], max_new_tokens=10).sequences == ref
    assert len(calls) == 10  # the prefill and 9 steps
    generate(tiny, [[5, 9, 2, 7], [1, 2]], max_new_tokens=10)  # a padded batch keeps transformers' forward
    assert len(calls) == 10


def _c_ops_or_skip():
    from paretolab.kernels.lean_cpu import lean_ops

    ops = lean_ops()
    if ops is None:  # reported in the summary (-rs), never silent
        pytest.skip("the lean C operations need paretolab.kernels._lean_cpu built and an AVX-512 CPU")
    return ops


def test_c_operations_take_a_decoding_step_and_agree_with_torchs(tiny, monkeypatch):
    """Decode, verify (causal and tree), crop: the C path is taken and its logits are torch's path's up to rounding."""
    import paretolab.generation.lean as lean
    from paretolab.generation.lean import lean_forward
    from paretolab.kernels import cpu_ext

    _c_ops_or_skip()
    ext = cpu_ext.extension("_lean_cpu")
    calls = {"attention": 0, "rms_norm": 0, "silu_mul": 0}
    for name in calls:
        real = getattr(ext, name)
        monkeypatch.setattr(ext, name, lambda *a, _real=real, _name=name: (calls.__setitem__(_name, calls[_name] + 1), _real(*a))[1])
    layers = len(tiny.model.model.layers)
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)

    def session():
        logits, cache = lean_forward(tiny.model, torch.tensor([[5, 9, 2, 7, 11, 3]]))
        seen = [logits[0, -1]]
        for token in (4, 8, 15):
            logits, cache = lean_forward(tiny.model, torch.tensor([[token]]), cache)
            seen.append(logits[0, -1])
        block, cache = lean_forward(tiny.model, torch.tensor([[16, 23, 42]]), cache)
        cache.crop(-1)
        past = cache.length
        branch, cache = lean_forward(tiny.model, torch.tensor([[1, 2, 3]]), cache, positions=torch.tensor([past, past + 1, past + 1]),
                                     block_mask=tree)
        return torch.cat([torch.stack(seen), block[0], branch[0]])

    fast = session()
    assert calls["attention"] == 6 * layers and calls["silu_mul"] == 6 * layers and calls["rms_norm"] == 12 * layers  # 6 forwards, prefill too
    with lean.lean_c_operations(False):
        slow = session()
    assert calls["attention"] == 6 * layers  # switched off: torch's operations only
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-5)


def test_a_decoded_token_and_the_same_token_in_a_verify_block_get_the_same_bits(tiny):
    """With the linears through the dense kernel (as the speculative generator runs them), the C path keeps each row's bits."""
    from paretolab.generation.lean import lean_forward
    from paretolab.kernels.dense_cpu import dense_cpu_kernel, fast_linears

    _c_ops_or_skip()
    if dense_cpu_kernel() is None:
        pytest.skip("needs paretolab.kernels._dense_cpu (torch's matmul gives a row other bits beside other rows)")
    prompt, more = torch.tensor([[5, 9, 2, 7]]), [11, 3, 6]
    with fast_linears(tiny.model):
        _, cache = lean_forward(tiny.model, prompt)
        block, _ = lean_forward(tiny.model, torch.tensor([more]), cache)
        _, cache = lean_forward(tiny.model, prompt)
        for i, token in enumerate(more):
            alone, cache = lean_forward(tiny.model, torch.tensor([[token]]), cache)
            assert torch.equal(alone[0, -1], block[0, i])


def test_a_hooked_norm_linear_or_mlp_runs_as_its_module_beside_the_c_operations(tiny):
    from paretolab.generation.lean import lean_forward

    _c_ops_or_skip()
    seen = []
    layer = tiny.model.model.layers[0]
    handles = [layer.input_layernorm.register_forward_hook(lambda m, i, o: seen.append("norm")),
               layer.self_attn.q_proj.register_forward_hook(lambda m, i, o: seen.append("q_proj")),
               layer.mlp.register_forward_hook(lambda m, i, o: seen.append("mlp"))]
    try:
        lean_forward(tiny.model, torch.tensor([[5, 9, 2]]))
    finally:
        for handle in handles:
            handle.remove()
    assert seen == ["norm", "q_proj", "mlp"]

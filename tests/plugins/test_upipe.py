"""UPipe on one device: head-chunked attention computes plain attention's loss and gradients, with less memory held."""

from __future__ import annotations

import pytest
import torch

from paretolab.errors import ConfigError
from paretolab.measure.live_memory import LiveTensorBytes
from paretolab.plugins.upipe import ActMemory, UPipe, chunk_heads, chunking_off
from paretolab.testing import MethodContract


def _loss_and_grads(model: torch.nn.Module, ids: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("per_chunk, recompute", [(1, True), (1, False), (3, True)])  # tiny-llama: 2 key/value heads, 2 query heads each
def test_chunked_attention_gives_plain_attentions_loss_and_gradients(tiny, attn, per_chunk, recompute):
    model = tiny.model
    model.config._attn_implementation = attn
    model.train()
    ids = torch.randint(0, model.config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))
    plain_loss, plain = _loss_and_grads(model, ids)
    chunk_heads(model, per_chunk, recompute)
    loss, grads = _loss_and_grads(model, ids)
    assert loss == pytest.approx(plain_loss, rel=1e-6)
    assert grads.keys() == plain.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, plain[name], rtol=1e-4, atol=1e-6, msg=name)
    with chunking_off(model):  # switched off: the model's own attention again
        assert _loss_and_grads(model, ids)[0] == plain_loss


def test_decoding_with_a_cache_is_unchanged(tiny):
    model = tiny.model.eval()
    prompt = torch.randint(0, model.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(1))
    plain = model.generate(prompt, max_new_tokens=8, do_sample=False)
    chunk_heads(model, 1)
    assert torch.equal(model.generate(prompt, max_new_tokens=8, do_sample=False), plain)


def test_chunked_attention_holds_less_memory_in_a_training_step(tiny):
    model = tiny.model.train()
    model.config._attn_implementation = "eager"  # plain attention keeps each layer's (heads, S, S) scores for backward
    ids = torch.randint(0, model.config.vocab_size, (1, 512), generator=torch.Generator().manual_seed(2))

    def peak() -> float:
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()  # grads exist before counting
        with LiveTensorBytes() as live:
            model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        return live.peak

    plain = peak()
    chunk_heads(model, 1, recompute=True)
    chunked = peak()
    scores = model.config.num_attention_heads * 512 * 512 * 4  # one layer's attention probabilities, fp32 (4 MB)
    assert plain - chunked > model.config.num_hidden_layers * scores  # no layer holds its scores until backward (measured: 19.7 -> 10.2 MB)


def test_the_train_stage_trains_with_the_chunks_saving_less_and_counting_the_recompute(tiny, tmp_path):
    """The study's path: a train stage after upipe runs the chunked attention (its forwards carry no KV cache, which
    would hand them back to the model's own attention): less saved for backward, the recomputed forward counted."""
    from paretolab.plugin_api.manager import registries
    from tests.training.conftest import make_ctx

    tiny.model.config._attn_implementation = "eager"
    params = {"tokens": 1024, "seq_len": 128, "batch": 2, "eval_every": 4, "eval_tokens": 256, "corpus": "pystdlib-train"}
    train = registries().methods.get("train")
    plain = train.transform(tiny.copy(), params, make_ctx(tmp_path / "plain")).training.metrics
    chunked_subject = UPipe().transform(tiny.copy(), {"kv_heads_per_chunk": 1}, make_ctx(tmp_path / "u0"))
    chunked = train.transform(chunked_subject, params, make_ctx(tmp_path / "upipe")).training.metrics
    assert chunked["peak_act_mb"] < plain["peak_act_mb"]
    assert chunked["train_flops"] > plain["train_flops"]  # each chunk's forward runs again in backward
    assert chunked["val_loss"] == pytest.approx(plain["val_loss"], rel=1e-4)


def test_the_measure_reports_both_arms_on_the_same_model(tiny, ctx):
    chunk_heads(tiny.model, 1)
    tiny.model.config._attn_implementation = "eager"
    out = ActMemory().measure(tiny, {"seq_len": 256, "rounds": 2}, ctx)
    assert set(out) == set(ActMemory.metrics)
    assert 0 < out["step_peak_mb"] < out["step_peak_mb_plain"] and out["step_peak_ratio"] == pytest.approx(out["step_peak_mb"] / out["step_peak_mb_plain"])
    assert out["step_ms"] > 0 and out["step_time_ratio"] > 0
    assert all(p.grad is None for p in tiny.model.parameters())  # leaves no gradients behind


def test_chunks_hold_whole_key_value_groups_and_zero_is_refused(tiny, ctx):
    UPipe().transform(tiny, {"kv_heads_per_chunk": 1}, ctx)
    assert {layer.self_attn._upipe for layer in tiny.model.model.layers} == {(2, True)}  # 2 query heads share each key/value head
    with pytest.raises(ConfigError, match=r"upipe.kv_heads_per_chunk: expected at least 1 key/value head per chunk, got 0"):
        UPipe().transform(tiny, {"kv_heads_per_chunk": 0}, ctx)


class TestUPipeContract(MethodContract):
    @pytest.fixture
    def method(self) -> UPipe:
        return UPipe()


def test_the_multi_device_model_at_the_papers_70b_shape():
    from paretolab.plugins.upipe import PAPER_SHAPES, attention_buffer_bytes

    shape, tokens = PAPER_SHAPES["llama3-70b"], 2**20  # 64 query heads, 8 key/value heads; 8 per device on 8 devices
    ulysses = attention_buffer_bytes(shape, tokens, devices=8)
    assert ulysses == 2 * tokens * 8 * 128 * (2 + 2 * 1 / 8) * 2  # both sides of the all-to-all, bf16: 9 GiB
    assert attention_buffer_bytes(shape, tokens, devices=8, heads_per_chunk=1) == ulysses // 8
    one_device = attention_buffer_bytes(PAPER_SHAPES["llama3-8b"], 4096, devices=1)
    assert one_device == 4096 * 32 * 128 * (2 + 2 * 8 / 32) * 2  # no all-to-all

"""The export's formats without a study: dense twins of format modules, packed integer codes, MACKO buffers."""

from __future__ import annotations

import json

import pytest
import torch

import paretolab
from paretolab.api.compact import dense_twin, load_compact, write


def logits(model, vocab=200):
    ids = torch.arange(1, 17).remainder(vocab).unsqueeze(0)
    with torch.no_grad():
        return model(ids).logits


def save(out, folder):
    """What export writes, without the study: the dense twin, its config, compact/."""
    plain = dense_twin(out.subject)
    plain.save_pretrained(folder)
    return plain, write(out.subject, plain, folder / "compact")


@pytest.mark.parametrize(("bits", "group"), [(3, 32), (4, 16), (8, 64)])
def test_rtn_codes_pack_and_unpack_to_the_trials_weights_in_our_layout(tiny, tmp_path, monkeypatch, bits, group):
    from paretolab.data import compressed

    monkeypatch.setattr(compressed, "available", lambda: False)  # a machine without compressed-tensors
    out = paretolab.apply(tiny.model, "rtn", tokenizer=tiny.tokenizer, bits=bits, group_size=group)
    _, formats = save(out, tmp_path)
    assert set(formats.values()) == {f"int{bits}"}
    loaded = load_compact(tmp_path)
    ours = dict(out.model.named_parameters())
    for name, tensor in loaded.named_parameters():
        scale = ours[name].detach().abs().max()
        assert torch.allclose(tensor, ours[name], atol=float(scale) * 2e-3), name  # fp16 scales: 1e-3 relative
    layout = json.loads((tmp_path / "compact" / "layout.json").read_text())
    entry = next(v for v in layout["tensors"].values() if v["format"] != "dense")
    assert entry["bits"] == bits and entry["group_size"] == group


@pytest.mark.parametrize("method", ["rtn", "absmean_ternary"])
def test_quantized_weights_become_a_compressed_tensors_checkpoint_plain_transformers_loads(tiny, tmp_path, method):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    params = {"bits": 4, "group_size": 32} if method == "rtn" else {"group_size": 32}
    out = paretolab.apply(tiny.model, method, tokenizer=tiny.tokenizer, **params)
    _, formats = save(out, tmp_path)
    bits = 4 if method == "rtn" else 2
    assert set(formats.values()) == {f"int{bits} (pack-quantized)"}
    config = json.loads((tmp_path / "compact" / "config.json").read_text())["quantization_config"]
    assert config["format"] == "pack-quantized"
    with safe_open(str(tmp_path / "compact" / "model.safetensors"), "pt") as f:
        assert "model.layers.0.mlp.up_proj.weight_packed" in f.keys() and f.get_tensor("model.layers.0.mlp.up_proj.weight_packed").dtype == torch.int32
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "compact", dtype=torch.float32)
    assert torch.allclose(logits(loaded), logits(out.model), rtol=1e-5, atol=1e-5)


def test_weights_off_the_grid_stay_dense_rather_than_a_wrong_code(tiny, tmp_path):
    out = paretolab.apply(tiny.model, "rtn", tokenizer=tiny.tokenizer, bits=4, group_size=32)
    name, record = next(iter(out.subject.current_storage().items()))
    with torch.no_grad():
        out.model.get_parameter(name).add_(1e-3)  # storage still says int4, the values no longer sit on a grid
    _, formats = save(out, tmp_path)
    assert name not in formats and len(formats) > 0


def test_a_macko_trials_own_buffers_are_the_compact_form_and_its_dense_twin_computes_the_same(tiny, tmp_path):
    out = paretolab.apply(tiny.model, "macko", tokenizer=tiny.tokenizer, sparsity=0.7, score="magnitude")
    plain, formats = save(out, tmp_path)
    assert set(formats.values()) == {"macko"}
    assert torch.allclose(logits(plain), logits(out.model), rtol=1e-5, atol=1e-5)
    assert torch.allclose(logits(load_compact(tmp_path)), logits(out.model), rtol=1e-5, atol=1e-5)


def test_merged_experts_export_as_the_models_own_experts_module_and_dropped_ones_are_refused():
    merged = paretolab.apply("tiny-moe-random", "expert_average", memory=0.75)
    plain = dense_twin(merged.subject)
    assert type(plain.model.layers[0].mlp.experts).__name__ == "Qwen3MoeExperts"
    assert torch.allclose(logits(plain), logits(merged.model), rtol=1e-5, atol=1e-5)
    dropped = paretolab.apply("tiny-moe-random", "expert_drop", memory=0.75)
    with pytest.raises(TypeError, match=r"expert \d+ was dropped; a plain Qwen3MoeExperts has no router that skips it"):
        dense_twin(dropped.subject)


def test_activation_quantization_has_no_dense_twin(tiny):
    out = paretolab.apply(tiny.model, "cat", tokenizer=tiny.tokenizer, transform="cat", w_bits=4, a_bits=8, strength=1.0)
    with pytest.raises(TypeError, match="CATLinear"):
        dense_twin(out.subject)

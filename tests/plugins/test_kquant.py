"""kquant: llama.cpp's own quantizer (llama-cpp-python's ``llama_model_quantize``) as a method, run by llama.cpp.

The model is a tiny random Llama 256 wide (each K-quant row a whole superblock) with SmolLM2's tokenizer: llama.cpp's
converter refuses the byte tokenizer of ``tiny-llama`` ("BPE pre-tokenizer was not recognized"), and knows SmolLM2's.
Tests that quantize need the llama engine (``make engines-llama``, marker ``engine``); they skip, saying so, where it
is not built, and fail there where ``PARETOLAB_ENGINES_REQUIRED=1``. The missing-engine test needs nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.external import ToolError
from paretolab.plugin_api.subject import Subject
from paretolab.plugins.incumbents.kquant import LIBRARY, LLAMA, KQuant, describe_types
from paretolab.testing import MethodContract, logits_of, output_change, reported_bytes

MODULE = "paretolab.plugins.incumbents.kquant"


def engine_or_skip() -> None:
    """The llama engine (its Python with llama-cpp-python, and the converter), or a skip saying how to build it."""
    from paretolab.measure.engine_llama import EngineUnavailable, LlamaEngine

    try:
        LLAMA.require(LIBRARY)
        LlamaEngine.find()
    except (ToolError, EngineUnavailable) as exc:
        if os.environ.get("PARETOLAB_ENGINES_REQUIRED") == "1":
            pytest.fail(f"PARETOLAB_ENGINES_REQUIRED=1 but {exc}")
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def smollm2_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from paretolab.errors import ConfigError
    from paretolab.models.gguf import SmolLM2

    try:
        return AutoTokenizer.from_pretrained(SmolLM2().pull())
    except ConfigError as exc:
        pytest.skip(f"llama.cpp's converter needs a tokenizer it knows; SmolLM2's is not here: {exc}")


def tiny_256(tokenizer: Any) -> Subject:
    """A 2-layer random Llama, hidden 256 (rows of whole 256-value superblocks), tied embedding, SmolLM2's tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from paretolab.models.tiny import seeded

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=512, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True)
    with seeded(0):
        model = LlamaForCausalLM(config).eval()
    return Subject(model=model, tokenizer=tokenizer, model_name="tiny-llama-256")


@pytest.fixture
def registered(monkeypatch):
    """kquant in the method registry (run_trial looks methods up by name), whether or not paretolab registers it yet."""
    from paretolab.plugin_api import manager

    if "kquant" not in manager.registries().methods:
        monkeypatch.setattr(manager, "BUILTIN_PLUGINS", (*manager.BUILTIN_PLUGINS, MODULE))
        manager.reset()
    yield
    manager.reset()


@pytest.mark.engine
@pytest.mark.slow
class TestKquantContract(MethodContract):
    @pytest.fixture(autouse=True)
    def _engine(self, registered) -> None:
        engine_or_skip()

    @pytest.fixture
    def method(self) -> KQuant:
        return KQuant()

    @pytest.fixture
    def subject(self, smollm2_tokenizer) -> Subject:
        return tiny_256(smollm2_tokenizer)

    @pytest.fixture
    def params(self) -> dict[str, Any]:
        return {"type": "Q4_K_M"}


@pytest.mark.engine
@pytest.mark.slow
def test_size_bytes_are_the_gguf_tensor_bytes(smollm2_tokenizer, ctx) -> None:
    """size_bytes (the size measure a trial runs) is the quantized GGUF's tensor bytes, read by gguf-py, not the tool's table."""
    engine_or_skip()
    from gguf import GGUFReader

    subject = tiny_256(smollm2_tokenizer)
    out = KQuant().transform(subject.copy(), {"type": "Q4_K_M"}, ctx)
    tensors = GGUFReader(out.info["kquant_artifact"]).tensors
    gguf_bytes = sum(int(t.n_bytes) for t in tensors)
    assert reported_bytes(out, ctx) == gguf_bytes  # every tensor of this GGUF is a parameter (the embedding tied, stored once)
    assert gguf_bytes < reported_bytes(subject, ctx) / 4
    types = sorted(t.tensor_type.name for t in tensors)
    assert out.info["kquant_format"].startswith("Q4_K_M: ")
    for name in set(types):  # e.g. "Q4_K_M: 12 q4_K, 5 f32, 3 q6_K": each type llama.cpp chose, counted
        assert f"{types.count(name)} {name.lower().replace('_k', '_K')}" in out.info["kquant_format"]
    assert out.info["kquant_bits"] == 4 and out.info["kquant_library"].startswith("llama-cpp-python ")


@pytest.mark.engine
@pytest.mark.slow
def test_each_tensor_stores_its_gguf_bytes_and_q8_0_reads_back_the_weights(smollm2_tokenizer, tmp_path) -> None:
    """At Q8_0 every weight comes back within Q8_0's rounding of the one handed over (names and the q/k permutation
    right), and each tensor's stored_bytes is its own n_bytes in the GGUF."""
    engine_or_skip()
    from gguf import GGUFReader, TensorNameMap
    from gguf.constants import MODEL_ARCH

    subject = tiny_256(smollm2_tokenizer)
    before = {n: p.detach().clone() for n, p in subject.model.named_parameters()}
    out = KQuant().transform(subject.copy(), {"type": "Q8_0"}, TrialContext(seed=0, workdir=tmp_path / "trial"))
    names = TensorNameMap(MODEL_ARCH.LLAMA, 2)
    by_gguf = {t.name: t for t in GGUFReader(out.info["kquant_artifact"]).tensors}
    for name, param in out.model.named_parameters():
        tensor = by_gguf[names.get_name(name, try_suffixes=(".weight",))]
        assert out.storage_of(name).stored_bytes == int(tensor.n_bytes), name
        error = float((param.detach() - before[name]).abs().max() / before[name].abs().max())
        assert error <= (0.0 if tensor.tensor_type.name == "F32" else 1 / 127), f"{name}: {error:.3g}"  # half a step of 127 levels, at most
    assert out.info["kquant_format"] == "Q8_0: 15 q8_0, 5 f32"


@pytest.mark.engine
@pytest.mark.slow
def test_q8_0_keeps_the_logits_close_and_q3_k_m_moves_them_more(smollm2_tokenizer, tmp_path) -> None:
    engine_or_skip()
    subject = tiny_256(smollm2_tokenizer)
    base = logits_of(subject)
    gap = {kind: output_change(base, logits_of(KQuant().transform(subject.copy(), {"type": kind}, TrialContext(seed=0, workdir=tmp_path / kind))))
           for kind in ("Q8_0", "Q3_K_M")}
    assert 0 < gap["Q8_0"] < 0.05, gap  # measured 0.013
    assert gap["Q3_K_M"] > 4 * gap["Q8_0"], gap  # measured 0.15


def test_a_missing_engine_fails_with_one_line_naming_make_engines_llama(tiny, ctx, tmp_path, monkeypatch) -> None:
    empty = tmp_path / "no-engines"
    empty.mkdir()
    monkeypatch.setenv("PARETOLAB_ENGINES", str(empty))
    for var in ("PARETOLAB_LLAMA_PYTHON", "PARETOLAB_LLAMA_CONVERTER"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ToolError) as caught:
        KQuant().transform(tiny.copy(), {"type": "Q4_K_M"}, ctx)
    message = str(caught.value)
    assert "\n" not in message and "llama-cpp-python" in message and "`make engines-llama`" in message, message
    assert "not installed" in KQuant().library() and "make engines-llama" in KQuant().library()


@pytest.mark.engine
def test_a_missing_converter_fails_with_one_line_naming_make_engines_llama(smollm2_tokenizer, ctx, tmp_path, monkeypatch) -> None:
    engine_or_skip()
    monkeypatch.setenv("PARETOLAB_LLAMA_CONVERTER", str(tmp_path / "nowhere" / "convert_hf_to_gguf.py"))
    with pytest.raises(ToolError) as caught:
        KQuant().transform(tiny_256(smollm2_tokenizer), {"type": "Q4_K_M"}, ctx)
    message = str(caught.value)
    assert "\n" not in message and "llama-cpp-python" in message and "`make engines-llama`" in message, message
    assert KQuant().library().startswith("llama-cpp-python 0.") and "make engines-llama" in KQuant().library()


@pytest.mark.engine
def test_a_failing_quantizer_fails_the_trial_with_one_line(smollm2_tokenizer, ctx, monkeypatch, registered) -> None:
    """llama.cpp refuses the file it is given (here not a GGUF): ToolError, one line naming the library and the make target;
    as a trial, the trial fails with that line."""
    engine_or_skip()
    from paretolab.measure.engine_llama import LlamaEngine
    from paretolab.records import StagePlan, TrialSettings
    from paretolab.study.trial import run_trial

    def broken_convert(self, model_dir, out, outtype="f32", **kwargs):
        out.write_bytes(b"not a gguf file")
        return out

    monkeypatch.setattr(LlamaEngine, "convert", broken_convert)
    with pytest.raises(ToolError) as caught:
        KQuant().transform(tiny_256(smollm2_tokenizer), {"type": "Q4_K_M"}, ctx)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("llama-cpp-python failed") and "`make engines-llama`" in message, message
    assert "llama_model_quantize" in message, message
    settings = TrialSettings("kquant", "perplexity", {"max_tokens": 256, "context": 64, "stride": 64}, {"size": {}}, seed=0)
    result = run_trial(tiny_256(smollm2_tokenizer), [StagePlan("stage0", "kquant", {"type": "Q4_K_M"})], settings, number=0)
    assert result.failed and result.error.startswith("ToolError: llama-cpp-python failed") and "\n" not in result.error, result.error


def test_the_format_names_llama_cpps_fallbacks() -> None:
    """SmolLM2's 576-wide rows are no whole superblock: llama.cpp stores them in q5_0 at Q4_K_M, and the format says why."""
    types = {"a": "q4_K", "b": "q5_0", "c": "q5_0", "d": "f32", "e": "q6_K"}
    widths = {"a": 1536, "b": 576, "c": 576, "d": 576, "e": 576}
    assert describe_types("Q4_K_M", types, widths) == "Q4_K_M: 2 q5_0 (rows not a multiple of 256), 1 q4_K, 1 f32, 1 q6_K"
    assert describe_types("Q4_0", {"b": "q4_0", "d": "f32"}, widths) == "Q4_0: 1 q4_0, 1 f32"  # 32-value blocks: no fallback

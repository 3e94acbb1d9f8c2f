"""The engine measure: labels, options, and the whole path (write, convert, serve, load, stop) on a fake llama.cpp.

The fake engine is a converter script that checks the Hugging Face directory it is given and writes a
file, and a ``llama_cpp.server`` module that runs the fake OpenAI server; so the measure's own code
(its temp directory, command, lifecycle, metrics and labels) runs for real without llama.cpp. The
real engine's test (marker ``engine``) runs where ``make engines`` installed it.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from pathlib import Path

import psutil
import pytest

from paretolab.errors import ConfigError
from paretolab.measure.engine_llama import EngineUnavailable, LlamaEngine
from paretolab.measure.engine_load import EngineLoadError
from paretolab.measure.engine_formats import compressed_checkpoint
from paretolab.measure.engine_measure import DENSE_LABEL, Engine, EngineOptions, exact_bits, served_label, weight_kinds
from paretolab.measure.engine_server import EngineStartError, group_alive
from paretolab.plugin_api.options import parse_options
from paretolab.plugins.baselines import RTN, Magnitude

FAKE = Path(__file__).with_name("fake_openai_server.py")


def required(find) -> None:
    """The engine, or a skip that says how to install it; a failure where PARETOLAB_ENGINES_REQUIRED=1 (CI, make test-vllm)."""
    try:
        find()
    except EngineUnavailable as exc:
        if os.environ.get("PARETOLAB_ENGINES_REQUIRED") == "1":
            pytest.fail(f"PARETOLAB_ENGINES_REQUIRED=1 but {exc}")
        pytest.skip(str(exc))


def test_labels_say_what_is_served(tiny, ctx) -> None:
    assert set(weight_kinds(tiny)) == {"dense"}
    assert served_label(weight_kinds(tiny), "f32") == "F32"
    q = RTN().transform(tiny.copy(), {"bits": 4, "group_size": 32}, ctx)
    assert "int4 g32" in weight_kinds(q)
    assert served_label(weight_kinds(q), "f32") == f"F32 {DENSE_LABEL}"
    s = Magnitude().transform(tiny.copy(), {"sparsity": 0.5, "scope": "row"}, ctx)
    assert "sparse" in weight_kinds(s)
    assert "no engine kernel: dense cost" in served_label(weight_kinds(s), "f16")


def test_options_are_checked() -> None:
    assert parse_options(EngineOptions, {"concurrency": [1, 16]}, where="measures.engine").concurrency == [1, 16]
    for bad in ([3], [], [1, 1], "4"):
        with pytest.raises(ConfigError, match="concurrency"):
            parse_options(EngineOptions, {"concurrency": bad}, where="measures.engine")
    for bad in ("tgi", ["llama", "llama"], [], ["llama", "tgi"]):
        with pytest.raises(ConfigError, match="engine"):
            parse_options(EngineOptions, {"engine": bad}, where="measures.engine")
    assert parse_options(EngineOptions, {"engine": ["llama", "vllm"]}, where="m").engine == ["llama", "vllm"]


def test_missing_engine_says_how_to_install(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PARETOLAB_ENGINES", str(tmp_path))
    for var in ("PARETOLAB_LLAMA_PYTHON", "PARETOLAB_LLAMA_CONVERTER"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(EngineUnavailable, match="make engines"):
        LlamaEngine.find()



def test_converter_without_sentencepiece_says_which_target_adds_it(tmp_path, monkeypatch) -> None:
    """llama.cpp's converter runs in this Python; without the `engines` extra it died mid-conversion on an import."""
    (tmp_path / "llama" / "bin").mkdir(parents=True)
    (tmp_path / "llama" / "bin" / "python").write_text("")
    (tmp_path / "llama-convert" / "conversion").mkdir(parents=True)
    (tmp_path / "llama-convert" / "convert_hf_to_gguf.py").write_text("")
    monkeypatch.setenv("PARETOLAB_ENGINES", str(tmp_path))
    for var in ("PARETOLAB_LLAMA_PYTHON", "PARETOLAB_LLAMA_CONVERTER"):
        monkeypatch.delenv(var, raising=False)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sentencepiece" else real(name, *a))
    with pytest.raises(EngineUnavailable, match="lacks sentencepiece.*make engines-llama"):
        LlamaEngine.find()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "sentencepiece" else real(name, *a))
    assert LlamaEngine.find().converter == tmp_path / "llama-convert" / "convert_hf_to_gguf.py"

@pytest.fixture
def fake_llama(tmp_path, monkeypatch) -> Path:
    """A fake converter and ``llama_cpp.server`` (the fake OpenAI server); returns the file its server pids go to."""
    pids = tmp_path / "pids"
    conv = tmp_path / "convert" / "convert_hf_to_gguf.py"
    conv.parent.mkdir()
    conv.write_text(
        "import sys, pathlib\n"
        "src, out, kind = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[3]), sys.argv[5]\n"
        "assert (src / 'config.json').is_file() and (src / 'model.safetensors').is_file(), src\n"
        "out.write_bytes(b'GGUF' + kind.encode() + b'0' * 100)\n")
    pkg = tmp_path / "fakepkg" / "llama_cpp"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "server.py").write_text(
        "import os, runpy, sys\n"
        f"open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
        "a = sys.argv[1:]\n"
        "model, port = a[a.index('--model') + 1], a[a.index('--port') + 1]\n"
        "if 'broken' in open(model, 'rb').read().decode(errors='replace') or os.environ.get('FAKE_LLAMA_FAIL'):\n"
        "    print('llama_model_load: error loading model: unknown tensor type'); sys.exit(1)\n"
        f"sys.argv = ['fake', '--port', port, '--ttft', '0.02', '--itl', '0.005', '--mode', os.environ.get('FAKE_LLAMA_MODE', 'ok')]\n"
        f"runpy.run_path({str(FAKE)!r}, run_name='__main__')\n")
    monkeypatch.setenv("PARETOLAB_LLAMA_PYTHON", sys.executable)
    monkeypatch.setenv("PARETOLAB_LLAMA_CONVERTER", str(conv))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(pkg.parent), os.environ.get("PYTHONPATH", "")]))
    return pids


def _no_server_left(pids: Path) -> None:
    seen = [int(p) for p in pids.read_text().split()]
    assert seen
    for pid in seen:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid
        assert not group_alive(pid)


def test_measure_serves_a_trial_on_a_fake_llama(tiny, ctx, fake_llama) -> None:
    q = RTN().transform(tiny.copy(), {"bits": 4, "group_size": 32}, ctx)
    options = parse_options(EngineOptions, {"concurrency": [1, 2], "prompts": 2, "new_tokens": 4, "repeats": 2, "ready_s": 30, "exact_blocks": False},
                            where="measures.engine")
    out = Engine().measure(q, options, ctx)
    _no_server_left(fake_llama)
    assert set(out) <= set(Engine.metrics)
    assert all(math.isfinite(v) for v in out.values())
    for c in (1, 2):
        assert out[f"llama_tok_s_c{c}_ci_low"] <= out[f"llama_tok_s_c{c}"] <= out[f"llama_tok_s_c{c}_ci_high"]
        assert out[f"llama_errors_c{c}"] == 0
        assert out[f"llama_c{c}_j_per_token"] >= 0  # the fake server mostly sleeps
    assert out["llama_model_bytes"] == 107 and out["llama_peak_rss_mb"] > 1
    assert q.info["llama_format"] == f"F32 {DENSE_LABEL}"
    assert q.info["llama_server_stopped"].endswith("none left after the measure (checked)")
    assert q.info["llama_energy_source"] in ("rapl", "estimate")
    assert "int4 g32" in q.info["llama_weights"]


def test_a_server_that_crashes_mid_load_is_named_with_its_signal_and_last_words(tiny, ctx, fake_llama, monkeypatch) -> None:
    """llama.cpp's AMX kernel segfaulted on SmolLM2's Q4_0 after the server was up: the trial said only "connection
    refused"; it must say the server died, how, and its log's last words."""
    monkeypatch.setenv("FAKE_LLAMA_MODE", "crash")
    options = parse_options(EngineOptions, {"concurrency": [1], "prompts": 1, "new_tokens": 2, "repeats": 1, "ready_s": 30}, where="m")
    with pytest.raises(EngineLoadError, match=r"llama server was killed by SIGSEGV: .*ggml_backend_amx_mul_mat: about to crash .*during the load"):
        Engine().measure(tiny, options, ctx)
    _no_server_left(fake_llama)


def test_measure_refused_start_gives_the_engines_message_and_leaves_nothing(tiny, ctx, fake_llama, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_LLAMA_FAIL", "1")
    options = parse_options(EngineOptions, {"concurrency": [1], "prompts": 1, "new_tokens": 2, "repeats": 1, "ready_s": 30}, where="m")
    with pytest.raises(EngineStartError, match="exited with code 1 .*unknown tensor type"):
        Engine().measure(tiny, options, ctx)
    _no_server_left(fake_llama)


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch) -> Path:
    """A fake ``vllm.entrypoints.openai.api_server`` that, as vLLM's CPU build does for int8 weights, refuses a
    compressed-tensors checkpoint with vLLM's own exception, and serves a dense directory (the fake OpenAI server).
    Returns the file each start appends ``pid model`` to."""
    starts = tmp_path / "vllm-starts"
    pkg = tmp_path / "fakevllm" / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for d in (pkg, pkg.parent, pkg.parent.parent):
        (d / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(
        "import json, os, pathlib, runpy, sys\n"
        "a = sys.argv[1:]\n"
        "model, port = a[a.index('--model') + 1], a[a.index('--port') + 1]\n"
        f"open({str(starts)!r}, 'a').write(f'{{os.getpid()}} {{model}}\\n')\n"
        "if 'quantization_config' in json.loads((pathlib.Path(model) / 'config.json').read_text()):\n"
        "    print('(Worker pid=7) ERROR 12-06 04:35:34 [multiproc_executor.py:953] ValueError: Failed to find a kernel that can implement the WNA16 linear layer. Reasons: ')\n"
        "    print('(Worker pid=7) ERROR 12-06 04:35:34 [multiproc_executor.py:953]  CPUWNA16LinearKernel cannot implement due to: Quant type (uint8b128) not supported by CPUWNA16')\n"
        "    print('RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}'); sys.exit(1)\n"
        f"sys.argv = ['fake', '--port', port, '--ttft', '0.02', '--itl', '0.005']\n"
        f"runpy.run_path({str(FAKE)!r}, run_name='__main__')\n")
    monkeypatch.setenv("PARETOLAB_VLLM_PYTHON", sys.executable)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(pkg.parent.parent.parent), os.environ.get("PYTHONPATH", "")]))
    return starts


def test_vllm_refusing_the_compressed_checkpoint_is_recorded_and_the_dense_twin_served(tiny, ctx, fake_vllm) -> None:
    q = RTN().transform(tiny.copy(), {"bits": 8, "group_size": 32}, ctx)
    options = parse_options(EngineOptions, {"engine": "vllm", "concurrency": [1], "prompts": 2, "new_tokens": 4, "repeats": 2, "ready_s": 60},
                            where="measures.engine")
    out = Engine().measure(q, options, ctx)
    starts = [line.split() for line in fake_vllm.read_text().splitlines()]
    assert [Path(m).name for _, m in starts] == ["compressed", "hf"]  # the export's checkpoint first, then the dense twin
    for pid, _ in starts:
        assert not psutil.pid_exists(int(pid)) or psutil.Process(int(pid)).status() == psutil.STATUS_ZOMBIE, pid
        assert not group_alive(int(pid))
    assert q.info["vllm_refused"].startswith("vLLM did not serve the compressed-tensors checkpoint: ValueError: Failed to find a kernel")
    assert "uint8b128" in q.info["vllm_refused"]
    assert q.info["vllm_format"].startswith(f"F32 {DENSE_LABEL}: vLLM refused the compressed-tensors checkpoint (ValueError")
    assert out["vllm_errors_c1"] == 0 and out["vllm_tok_s_c1"] > 0


def test_an_rtn_trial_becomes_its_compressed_checkpoint_and_a_sparse_one_keeps_its_dense_label(tiny, ctx) -> None:
    q = RTN().transform(tiny.copy(), {"bits": 4, "group_size": 32}, ctx)
    kinds = weight_kinds(q)
    info: dict = {"vllm_format": served_label(kinds, "f32")}
    folder = compressed_checkpoint(q, kinds, ctx.workdir / "ct", info, "vllm")
    assert folder is not None and (folder / "config.json").is_file()
    assert info["vllm_format"] == "compressed-tensors pack-quantized (int4 g32: the trial's codes and scales; other tensors F32)"
    s = Magnitude().transform(tiny.copy(), {"sparsity": 0.5, "scope": "row"}, ctx)
    info = {"vllm_format": served_label(weight_kinds(s), "f32")}
    assert compressed_checkpoint(s, weight_kinds(s), ctx.workdir / "ct2", info, "vllm") is None
    assert info["vllm_format"] == f"F32 {DENSE_LABEL}"  # sparse: no checkpoint tried, the dense label stays


@pytest.mark.engine
@pytest.mark.slow
def test_real_llama_cpp_serves_smollm2(ctx) -> None:
    required(LlamaEngine.find)
    from paretolab.models.lookup import load_subject

    from paretolab.tasks.perplexity import Perplexity, PerplexityOptions

    subject = load_subject("smollm2-135m")
    ctx.task = {"name": "perplexity", "corpus": "pydoc", "max_tokens": 1024, "context": 512, "stride": 512}
    trial = Perplexity().evaluate(subject, parse_options(PerplexityOptions, {k: v for k, v in ctx.task.items() if k != "name"}, where="t"), ctx)
    options = parse_options(EngineOptions, {"concurrency": [1, 2], "prompts": 2, "new_tokens": 8, "repeats": 2}, where="m")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    out = Engine().measure(subject, options, ctx)
    after = {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}
    assert after <= before, "an engine process outlived the measure"
    assert subject.info["llama_format"] == "F32"
    for c in (1, 2):
        assert out[f"llama_errors_c{c}"] == 0 and out[f"llama_tok_s_c{c}"] > 0
    assert out["llama_model_bytes"] > 400e6  # 135M parameters in f32
    # the same fp32 weights in llama.cpp: the same perplexity, to float rounding
    assert out["llama_ppl"] == pytest.approx(trial["ppl"], rel=1e-3) and out["llama_ppl_gap"] == 0


@pytest.mark.engine
@pytest.mark.slow
def test_real_llama_cpp_serves_an_rtn_trial_as_its_exact_q4_0_blocks(ctx) -> None:
    """The engine study's RTN trials: llama.cpp serves the trial's own 4-bit codes as Q4_0 (a build whose AMX kernel
    segfaulted here served nothing: every request "connection refused")."""
    required(LlamaEngine.find)
    from paretolab.models.lookup import load_subject

    from paretolab.tasks.perplexity import Perplexity, PerplexityOptions

    subject = RTN().transform(load_subject("smollm2-135m"), {"bits": 4, "group_size": 32}, ctx)
    ctx.task = {"name": "perplexity", "corpus": "pydoc", "max_tokens": 1024, "context": 512, "stride": 512}
    trial = Perplexity().evaluate(subject, parse_options(PerplexityOptions, {k: v for k, v in ctx.task.items() if k != "name"}, where="t"), ctx)
    options = parse_options(EngineOptions, {"concurrency": [1], "prompts": 2, "new_tokens": 8, "repeats": 1}, where="m")
    out = Engine().measure(subject, options, ctx)
    assert subject.info["llama_format"].startswith("Q4_0 (exact: the trial's codes")
    assert out["llama_errors_c1"] == 0 and out["llama_tok_s_c1"] > 0
    assert out["llama_model_bytes"] < 250e6  # the linear layers in 4.5-bit blocks (the F32 file: 540 MB; the embedding stays F32)
    # the trial's own codes (block scales in fp16): the trial's perplexity, to the scales' rounding
    assert out["llama_ppl"] == pytest.approx(trial["ppl"], rel=1e-2)


@pytest.mark.vllm
@pytest.mark.slow
def test_real_vllm_refuses_an_int8_checkpoint_in_its_words_then_serves_the_dense_twin(ctx) -> None:
    """vLLM's CPU build has no int8 weight kernel: the RTN 8-bit trial's compressed-tensors checkpoint is refused at load
    (vLLM's ValueError recorded), the dense twin served eagerly (no compile warm-up: ~2 min on 2 cores), nothing left."""
    from paretolab.measure.engine_vllm import VllmEngine

    required(VllmEngine.find)
    from paretolab.models.lookup import load_subject

    from paretolab.tasks.perplexity import Perplexity, PerplexityOptions

    subject = RTN().transform(load_subject("smollm2-135m"), {"bits": 8, "group_size": 32}, ctx)
    ctx.task = {"name": "perplexity", "corpus": "pydoc", "max_tokens": 1024, "context": 512, "stride": 512}
    trial = Perplexity().evaluate(subject, parse_options(PerplexityOptions, {k: v for k, v in ctx.task.items() if k != "name"}, where="t"), ctx)
    options = parse_options(EngineOptions, {"engine": "vllm", "concurrency": [1, 2], "prompts": 2, "new_tokens": 8, "repeats": 2, "eager": True}, where="m")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    out = Engine().measure(subject, options, ctx)
    after = {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}
    assert after <= before, "an engine process outlived the measure"
    assert "ValueError: Failed to find a kernel that can implement the WNA16 linear layer" in subject.info["vllm_refused"]
    assert "uint8b128" in subject.info["vllm_refused"]
    assert subject.info["vllm_format"].startswith(f"F32 {DENSE_LABEL}: vLLM refused the compressed-tensors checkpoint")
    for c in (1, 2):
        assert out[f"vllm_errors_c{c}"] == 0 and out[f"vllm_tok_s_c{c}"] > 0
    assert "vllm_ppl_note" not in subject.info, subject.info.get("vllm_ppl_note")
    # the dense twin holds the trial's rounded weights: the same perplexity, to float rounding
    assert out["vllm_ppl"] == pytest.approx(trial["ppl"], rel=1e-3) and out["vllm_ppl_gap"] == 0

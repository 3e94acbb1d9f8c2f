"""The incumbents (GPTQ, AWQ, SparseGPT, AutoRound, HQQ) run by their own libraries in ENGINES/incumbents.

The tests that run a library carry the marker ``incumbents`` (``make test-incumbents``; CI builds the environment with
``make incumbents``). Without the environment they skip, saying so, unless PARETOLAB_INCUMBENTS_REQUIRED=1, where they
fail. The tests that need no library (a missing environment, a failing tool, a refused shape) run everywhere.

Every library run costs a process that imports its library (10-20 s), so the runs are few and shared: a library run is
keyed by what it was handed (the model's bytes, the calibration ids, the params) and each key runs once per session
(``shared_runs``); the determinism test runs its library again, uncached.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from paretolab.errors import ConfigError
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.cost_claims import LOSSLESS_TOLERANCE, output_change
from paretolab.plugin_api.external import ToolError
from paretolab.plugin_api.method import Method
from paretolab.plugin_api.subject import Subject
from paretolab.plugins.incumbents import base as incumbents
from paretolab.plugins.incumbents import ENV
from paretolab.plugins.incumbents.autoround import AutoRoundMethod
from paretolab.plugins.incumbents.hqq import HQQ
from paretolab.plugins.incumbents.llmcompressor import AWQ, GPTQ, SparseGPT
from paretolab.testing import MethodContract, logits_of, reported_bytes

REQUIRED = os.environ.get("PARETOLAB_INCUMBENTS_REQUIRED") == "1"
CALIB = {"calib_corpus": "pydoc", "calib_samples": 4, "calib_seq_len": 64, "calib_seed": 0}
METHODS: dict[str, Method] = {"gptq": GPTQ(), "awq": AWQ(), "sparsegpt": SparseGPT(), "autoround": AutoRoundMethod(), "hqq": HQQ()}
PARAMS: dict[str, dict[str, Any]] = {  # a few seconds of library work each on the tiny model
    "gptq": {"bits": 4, "group_size": 32, "dampening_frac": 0.01, "actorder": "static", **CALIB},
    "awq": {"bits": 4, "group_size": 32, **CALIB},
    "sparsegpt": {"sparsity": 0.5, "pattern": "2:4", **CALIB},
    "autoround": {"bits": 4, "group_size": 32, "iters": 20, **CALIB},
    "hqq": {"bits": 4, "group_size": 32, "optimize": True, "opt_iters": 20},
}
CALIBRATED = [name for name, method in METHODS.items() if method.calibrated]


def environment_problem() -> str | None:
    """Why the incumbents' libraries cannot run here (one line), or None."""
    if not ENV.python.exists():
        return f"the incumbents' environment {ENV.python.parent.parent} is missing: make incumbents builds it"
    missing = [lib for lib in ENV.libraries if ENV.version(lib) is None]
    return f"{', '.join(missing)} not installed in {ENV.python.parent.parent}: make incumbents" if missing else None


@pytest.fixture
def incumbents_env() -> None:
    """Skip (saying why) without the environment; fail instead where PARETOLAB_INCUMBENTS_REQUIRED=1 (CI)."""
    problem = environment_problem()
    if problem:
        if REQUIRED:
            pytest.fail(f"PARETOLAB_INCUMBENTS_REQUIRED=1 but {problem}")
        pytest.skip(problem)


# ---------------------------------------------------------------------------------------------------------------------
# One library run per distinct hand-over.

_RUNS: dict[str, dict[str, Any]] = {}
_real_run_tool = incumbents.run_tool


def _run_key(script: str, request: dict[str, Any]) -> str:
    digest = hashlib.sha256(script.encode())
    digest.update(json.dumps({k: v for k, v in request.items() if k not in ("model", "calibration")}, sort_keys=True).encode())
    for path in sorted(Path(request["model"]).glob("*.safetensors")) + [Path(request["model"]) / "config.json"]:
        digest.update(path.read_bytes())
    if request.get("calibration"):
        digest.update(Path(request["calibration"]).read_bytes())
    return digest.hexdigest()


def _shared_run_tool(env, library, script, request, workdir, **kwargs):  # noqa: ANN001, ANN202 (run_tool's signature)
    key = _run_key(script, request)
    if key not in _RUNS:
        report = _real_run_tool(env, library, script, request, workdir, **kwargs)
        kept = _STORE[0] / key[:16]  # a trial's workdir goes when the trial ends (run_trial's is temporary): keep a copy
        shutil.copytree(report["out"], kept)
        _RUNS[key] = {**report, "out": str(kept)}
    return dict(_RUNS[key])


_STORE: list[Path] = []


@pytest.fixture
def shared_runs(monkeypatch: pytest.MonkeyPatch, incumbents_env: None, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Transforms in this test reuse a library run made earlier in the session on the very same hand-over."""
    if not _STORE:
        _STORE.append(tmp_path_factory.mktemp("incumbent_runs"))
    monkeypatch.setattr(incumbents, "run_tool", _shared_run_tool)


def small() -> Subject:
    from paretolab.models import TinyLlama

    return TinyLlama(layers=2, hidden=64).load()


def run(name: str, params: dict[str, Any] | None = None, subject: Subject | None = None, *, where: Path) -> Subject:
    ctx = TrialContext(seed=0, workdir=where / f"{name}-trial")
    return METHODS[name].transform((subject or small()).copy(), dict(params or PARAMS[name]), ctx)


def linear_names(subject: Subject) -> list[str]:
    return [f"{name}.weight" for name, module in subject.model.named_modules()
            if isinstance(module, torch.nn.Linear) and not name.endswith("lm_head")]


# ---------------------------------------------------------------------------------------------------------------------
# (a) The bytes each wrapper reports are the bytes its artefact holds, read back from the artefact file.

def artefact_bytes(name: str, out: Subject) -> dict[str, int]:
    """Each quantized/pruned weight's bytes as the library's artefact file holds them (read with safetensors / torch.load)."""
    from safetensors import safe_open

    artefact = Path(out.info[f"{name}_artifact"])
    held: dict[str, int] = {}
    if name == "hqq":
        saved = torch.load(artefact / "qmodel.pt", map_location="cpu", weights_only=False)
        for module, entries in saved.items():
            tensors = [v for v in entries.values() if torch.is_tensor(v)]
            key = f"{module}.weight" if "W_q" in entries else None
            if key:
                held[key] = sum(t.numel() * t.element_size() for t in tensors)
        return held
    suffixes = {"autoround": ("qweight", "qzeros", "scales", "g_idx")}.get(
        name, ("weight_packed", "weight_scale", "weight_zero_point", "weight_g_idx", "weight_shape", "weight"))
    for path in sorted(artefact.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for key in f.keys():
                module, _, leaf = key.rpartition(".")
                if leaf in suffixes:
                    tensor = f.get_tensor(key)
                    held[f"{module}.weight"] = held.get(f"{module}.weight", 0) + tensor.numel() * tensor.element_size()
    return held


@pytest.mark.incumbents
@pytest.mark.parametrize("name", list(METHODS))
def test_reported_bytes_are_the_artefacts(name: str, shared_runs: None, tmp_path: Path) -> None:
    out = run(name, where=tmp_path)
    held = artefact_bytes(name, out)
    for weight in linear_names(out):
        reported = out.storage_of(weight).stored_bytes
        assert reported == held[weight], f"{name}: {weight} reported {reported} bytes, the artefact holds {held[weight]}"
    dense = reported_bytes(small(), TrialContext(seed=0, workdir=tmp_path / "dense"))
    if name == "sparsegpt":  # compressed-tensors 0.19 writes no sparse format: the pruned weights are stored dense
        assert reported_bytes(out, TrialContext(seed=0, workdir=tmp_path / "x")) == dense
        weight = out.model.model.layers[0].mlp.down_proj.weight.detach()
        assert (weight.reshape(-1, 4) == 0).sum(dim=1).ge(2).all(), "2:4: two of every four consecutive inputs are zero"
    else:
        assert reported_bytes(out, TrialContext(seed=0, workdir=tmp_path / "x")) < dense


# ---------------------------------------------------------------------------------------------------------------------
# (b) Lossless settings. SparseGPT's {"sparsity": 0.0} keeps the logits within the contract's tolerance (not exactly:
# the library still prunes each block's lowest-saliency weight). The quantizers have no 16-bit setting (llm-compressor's
# int packing, auto-round's export and HQQ top out at 8 bits) and their 8 bits do not keep the logits, so none declares one.

@pytest.mark.incumbents
def test_sparsegpt_at_zero_sparsity_keeps_the_logits(shared_runs: None, tmp_path: Path) -> None:
    base, method = small(), METHODS["sparsegpt"]
    assert method.lossless_setting == {"sparsity": 0.0, "pattern": "unstructured"}
    out = run("sparsegpt", {**PARAMS["sparsegpt"], **method.lossless_setting}, base, where=tmp_path)
    change = output_change(logits_of(base), logits_of(out))
    assert change <= LOSSLESS_TOLERANCE, f"sparsegpt at sparsity 0 moved the logits by {change:.3g} (at most {LOSSLESS_TOLERANCE:g})"


@pytest.mark.incumbents
@pytest.mark.parametrize("name", ["gptq", "hqq"])
def test_eight_bits_still_move_the_logits(name: str, shared_runs: None, tmp_path: Path) -> None:
    """The widest setting (8 bits, groups of 32: the run the contract's parameter check makes too) moves the logits
    beyond LOSSLESS_TOLERANCE (measured: about 3e-3 of their scale for both), so neither declares a lossless_setting."""
    base = small()
    out = run(name, {**PARAMS[name], "bits": 8}, base, where=tmp_path)
    change = output_change(logits_of(base), logits_of(out))
    assert LOSSLESS_TOLERANCE < change < 0.02, f"{name} at 8 bits moved the logits by {change:.3g}"
    assert not METHODS[name].lossless_setting


# ---------------------------------------------------------------------------------------------------------------------
# (c) Two calibration draws give two models.

@pytest.mark.incumbents
@pytest.mark.parametrize("name", CALIBRATED)
def test_the_calibration_draw_reaches_the_library(name: str, shared_runs: None, tmp_path: Path) -> None:
    first = run(name, where=tmp_path / "seed0")
    second = run(name, {**PARAMS[name], "calib_seed": 1}, where=tmp_path / "seed1")
    weights = linear_names(first)
    a, b = (dict(s.model.named_parameters()) for s in (first, second))
    differ = [w for w in weights if not torch.equal(a[w], b[w])]
    assert differ, f"{name}: calib_seed 0 and 1 gave the same weights: the library did not calibrate on paretolab's draw"


# ---------------------------------------------------------------------------------------------------------------------
# The library is deterministic (a run again, uncached, gives the same weights): what the contract's same-seed checks,
# which share runs, take for granted.

@pytest.mark.incumbents
@pytest.mark.parametrize("name", ["gptq"])
def test_the_library_run_is_deterministic(name: str, shared_runs: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cached = run(name, where=tmp_path / "cached")
    monkeypatch.setattr(incumbents, "run_tool", _real_run_tool)
    again = run(name, where=tmp_path / "again")
    a, b = (dict(s.model.named_parameters()) for s in (cached, again))
    assert all(torch.equal(a[k], b[k]) for k in a), f"{name}: two runs on the same hand-over gave different weights"


# ---------------------------------------------------------------------------------------------------------------------
# (d) A missing environment, or a tool failing mid-trial: ToolError, one line naming the library and `make incumbents`.

@pytest.mark.parametrize("name", list(METHODS))
def test_a_missing_environment_names_make_incumbents(name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PARETOLAB_INCUMBENTS_PYTHON", str(tmp_path / "nowhere" / "bin" / "python"))
    with pytest.raises(ToolError) as caught:
        run(name, where=tmp_path)
    message = str(caught.value)
    assert "\n" not in message and "make incumbents" in message and METHODS[name].library_name in message
    assert not list(tmp_path.glob(f"{name}-trial/*/model")), "nothing is handed over without an environment"


def fake_environment(root: Path, script: str) -> Path:
    """An environment whose 'python' runs ``script`` (bash), with the incumbents' dist-infos, as make incumbents lays it out."""
    site = root / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    for dist in ("llmcompressor-0.14.0.1", "auto_round-0.15.1", "hqq-0.2.8.post1"):
        (site / f"{dist}.dist-info").mkdir(parents=True)
    python = root / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f"#!/bin/bash\n{script}\n")
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return python


@pytest.mark.parametrize("name", ["gptq", "hqq"])
def test_a_tool_failing_mid_trial_is_one_line(name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    python = fake_environment(tmp_path / "env", 'echo "loading"; echo "Traceback (most recent call last):"; '
                                                 'echo "RuntimeError: the library broke half-way"; exit 1')
    monkeypatch.setenv("PARETOLAB_INCUMBENTS_PYTHON", str(python))
    with pytest.raises(ToolError) as caught:
        run(name, where=tmp_path)
    message = str(caught.value)
    assert "\n" not in message and "RuntimeError: the library broke half-way" in message
    assert METHODS[name].library_name in message and "make incumbents" in message


# ---------------------------------------------------------------------------------------------------------------------
# Shapes a library refuses: a ConfigError in one line before any process starts (llm-compressor's group divisibility).

def wide(hidden: int) -> Subject:
    from paretolab.models import TinyLlama

    return TinyLlama(layers=1, hidden=hidden).load()


@pytest.mark.parametrize("name", ["gptq", "awq"])
def test_a_group_the_rows_do_not_divide_is_refused_in_one_line(name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PARETOLAB_INCUMBENTS_PYTHON", str(tmp_path / "nowhere" / "bin" / "python"))  # refused before the library
    with pytest.raises(ConfigError, match=r"192 input columns are not a multiple of 128") as caught:
        run(name, {**PARAMS[name], "group_size": 128}, wide(192), where=tmp_path)
    assert "\n" not in str(caught.value)
    with pytest.raises(ToolError):  # a width the group divides (or narrower than it) passes the check
        run(name, {**PARAMS[name], "group_size": 64}, wide(192), where=tmp_path)


@pytest.mark.incumbents
def test_the_refusal_is_the_librarys(incumbents_env: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without paretolab's early check, llm-compressor itself refuses the same shape: ToolError, one line, its reason."""
    monkeypatch.setattr(GPTQ, "check", lambda self, params, subject: None)
    with pytest.raises(ToolError, match=r"refused gptq.*(divisible|group_size)") as caught:
        run("gptq", {**PARAMS["gptq"], "group_size": 128}, wide(192), where=tmp_path)
    assert "\n" not in str(caught.value)


def test_library_names_the_environment() -> None:
    for method in METHODS.values():
        text = method.describe()["library"]
        assert method.library_name in text and "make incumbents" in text


def test_registered() -> None:
    from paretolab.plugin_api.manager import BUILTIN_PLUGINS, registries

    if "paretolab.plugins.incumbents" not in BUILTIN_PLUGINS:
        pytest.skip("paretolab.plugins.incumbents is not in BUILTIN_PLUGINS yet")
    assert all(name in registries().methods for name in METHODS)


# ---------------------------------------------------------------------------------------------------------------------
# (e) The contract suite, on runs shared across its checks (each distinct setting runs its library once).

@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """The incumbents in the registries (run_trial looks methods up there), until BUILTIN_PLUGINS lists them."""
    from paretolab.plugin_api import manager

    if "paretolab.plugins.incumbents" in manager.BUILTIN_PLUGINS:
        yield
        return
    monkeypatch.setattr(manager, "BUILTIN_PLUGINS", (*manager.BUILTIN_PLUGINS, "paretolab.plugins.incumbents"))
    manager.reset()
    yield
    monkeypatch.undo()
    manager.reset()


class IncumbentContract(MethodContract):
    """The contract, on shared library runs (sized_by_artifact: its size check reads the artefact on disk)."""

    @pytest.fixture(autouse=True)
    def _shared(self, shared_runs: None, registered: None) -> None:
        pass


@pytest.mark.incumbents
class TestGPTQContract(IncumbentContract):
    @pytest.fixture
    def method(self) -> Method:
        return GPTQ()

    @pytest.fixture
    def params(self, method: Method) -> dict[str, Any]:
        return dict(PARAMS["gptq"])


@pytest.mark.incumbents
class TestHQQContract(IncumbentContract):
    @pytest.fixture
    def method(self) -> Method:
        return HQQ()

    @pytest.fixture
    def params(self, method: Method) -> dict[str, Any]:
        return dict(PARAMS["hqq"])

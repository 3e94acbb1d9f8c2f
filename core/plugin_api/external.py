"""Methods whose library lives in an environment of its own: hand the model over, run the library's tool, take the weights back.

A library whose pins clash with paretolab's (llm-compressor wants transformers <= 5.17 and compressed-tensors 0.19)
is never imported here, nor re-implemented: it is installed in an environment of its own by a make target, under
the engines folder (``$PARETOLAB_ENGINES``, where the engine measure's environments are), and a method runs it
in three steps, each one call:

1. :func:`hand_over` writes the trial's model as the export path writes it (a dense fp32 Hugging Face directory
   with its tokenizer), and the calibration token ids every calibrated method gets (:func:`write_calibration`);
2. :func:`run_tool` runs a tool script of ``paretolab/tools/`` with the environment's Python, as a subprocess: the
   script imports nothing of paretolab, reads ``request.json``, calls the library, and writes into its ``out``
   folder the library's own artefact (a compressed-tensors checkpoint, a GGUF), the weights it decompressed with
   the library's own code (``weights.safetensors``, dense, by parameter name) and ``report.json`` (the library
   and its version, each tensor's bytes as the artefact stores them, notes);
3. :func:`take_back` copies those weights into the trial's model by name, records each tensor's stored bytes
   (``size_bytes`` counts the library's format, scales, zero points and block metadata included) and keeps the
   artefact's path in ``subject.info`` for the export and the engines.

A missing environment or a tool that fails raises :class:`ToolError`: one line naming the library, what went wrong
(the tool's last error line, its log), and the make target that installs it; the trial fails, the study goes on.
No environment is ever built inside a trial.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from paretolab.errors import ConfigError, PluginError

TOOLS = Path(__file__).resolve().parent.parent / "tools"
"""The tool scripts (``paretolab/tools/*.py``): standalone, run by another environment's Python."""
REQUEST, REPORT, WEIGHTS = "request.json", "report.json", "weights.safetensors"
LAYOUT_FIELDS = ("value_bits", "group_size", "sparse")
"""What a report's optional ``layout`` may say of a stored tensor (``TensorStorage`` fields): how many bits each value
takes and over how many values a scale runs, so the size checks count distinct values per group, not per row."""
MAX_REPORT_BYTES = 8 << 20


class ToolError(PluginError):
    """A method's library is not installed, or its tool failed: the message is the one line a user reads."""


def engines_dir() -> Path:
    """Where the make targets build the engines' and the tools' environments (``$PARETOLAB_ENGINES``)."""
    from paretolab.data.files import cache_dir

    return Path(os.environ.get("PARETOLAB_ENGINES") or cache_dir() / "engines")


@dataclass(frozen=True)
class ToolEnv:
    """An environment of its own under the engines folder, made by ``make <target>``, holding ``libraries``."""

    name: str  # its folder under the engines folder ("incumbents", "llama")
    target: str  # the make target that builds it
    libraries: tuple[str, ...]  # the distributions it is made for, as pip names them

    @property
    def python(self) -> Path:
        override = os.environ.get(f"PARETOLAB_{self.name.upper()}_PYTHON")
        return Path(override) if override else engines_dir() / self.name / "bin" / "python"

    def require(self, library: str) -> Path:
        """The environment's Python, or ToolError naming the library and the make target."""
        if not self.python.exists():
            raise ToolError(f"{library} is not installed: its environment {self.python.parent.parent} is missing; "
                            f"run `make {self.target}` (or set PARETOLAB_ENGINES / PARETOLAB_{self.name.upper()}_PYTHON)")
        if self.version(library) is None:
            raise ToolError(f"{library} is not installed in {self.python.parent.parent}; run `make {self.target}`")
        return self.python

    def version(self, library: str) -> str | None:
        """The installed version of ``library`` in this environment (its dist-info, read without starting Python), or None."""
        root = self.python.parent.parent
        wanted = re.sub(r"[-_.]+", "_", library).lower()
        for info in root.glob("lib/python*/site-packages/*.dist-info"):
            dist, _, version = info.name[: -len(".dist-info")].partition("-")
            if re.sub(r"[-_.]+", "_", dist).lower() == wanted:
                return version
        return None

    def describe(self, library: str) -> str:
        """``"llmcompressor 0.14.0.1 (own environment, make incumbents)"`` or ``"... not installed: make ..."``."""
        version = self.version(library) if self.python.exists() else None
        where = f"own environment {self.name}, make {self.target}"
        return f"{library} {version} ({where})" if version else f"{library}, not installed ({where})"


def dense_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy with every format module replaced by the dense module it computes (``dense_module()``)."""
    model = copy.deepcopy(model)
    for name, module in list(model.named_modules()):
        if name and hasattr(module, "dense_module"):
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, leaf, module.dense_module())
    return model


def write_hf(subject: Any, folder: Path) -> Path:
    """The subject as a directory transformers (and llama.cpp's converter) reads: fp32 safetensors + tokenizer
    (what the engine measure serves and what a tool is handed)."""
    model = dense_copy(subject.model).to("cpu", torch.float32)
    if not hasattr(model, "save_pretrained"):
        raise ConfigError(f"an engine or another library takes Hugging Face models; this trial's model is {type(model).__name__}")
    model.save_pretrained(folder, safe_serialization=True)
    subject.tokenizer.save_pretrained(folder)
    return folder


def hand_over(subject: Any, folder: Path) -> Path:
    """The trial's model as the export path writes it (dense fp32 safetensors, config, tokenizer) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    return write_hf(subject, folder)


def write_calibration(ids: torch.Tensor, path: Path) -> Path:
    """The (N, L) calibration token ids a tool calibrates on, as JSON lists (the same draw every calibrated method gets)."""
    path.write_text(json.dumps({"input_ids": ids.detach().to("cpu").tolist()}))
    return path


def run_tool(env: ToolEnv, library: str, script: str | Path, request: dict[str, Any], workdir: Path, *,
             timeout_s: float = 3600.0) -> dict[str, Any]:
    """Run a tool script with ``env``'s Python on ``request``; its ``report.json`` (validated), with ``out``.

    ``script`` is a name under ``paretolab/tools/`` or a plugin's own file (an absolute path); either can ``import
    _toolkit`` (that folder is the tool's PYTHONPATH: the toolkit imports nothing of paretolab). ``workdir/out`` is
    where the tool writes; its output goes to ``workdir/<script>.log``. Failure (missing environment, a non-zero exit,
    a timeout, no report) raises ToolError with the tool's last error line and the log's path.
    """
    python = env.require(library)
    out = workdir / "out"
    out.mkdir(parents=True, exist_ok=True)
    (workdir / REQUEST).write_text(json.dumps({**request, "out": str(out)}, indent=1))
    log = workdir / f"{Path(script).stem}.log"
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "VIRTUAL_ENV"))}
    environ.update({"PYTHONPATH": str(TOOLS), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                    "PYTHONUNBUFFERED": "1"})
    start = time.monotonic()
    with log.open("wb") as sink:
        try:
            proc = subprocess.run([str(python), str(Path(script) if Path(script).is_absolute() else TOOLS / script), str(workdir / REQUEST)], stdout=sink, stderr=subprocess.STDOUT,
                                  env=environ, cwd=workdir, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise ToolError(f"{library}: its tool ran past {timeout_s:.0f} s and was stopped (log: {log})") from None
    if proc.returncode != 0:
        raise ToolError(f"{library} failed (exit {proc.returncode}): {last_error(log)} (log: {log}; `make {env.target}` installs it)")
    path = out / REPORT
    if not path.is_file() or path.stat().st_size > MAX_REPORT_BYTES:
        raise ToolError(f"{library}: its tool exited 0 without a report.json of at most {MAX_REPORT_BYTES >> 20} MiB (log: {log})")
    report = json.loads(path.read_text())
    stored = report.get("stored_bytes")
    if not isinstance(stored, dict) or not all(isinstance(v, int) and v >= 0 for v in stored.values()):
        raise ToolError(f"{library}: its report.json has no stored_bytes of whole byte counts per tensor (log: {log})")
    report["seconds"] = time.monotonic() - start
    report["out"] = str(out)
    return report


def last_error(log: Path, limit: int = 400) -> str:
    """The line of a tool's log a user should read: the last exception line, else the last non-empty line."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    errors = [line for line in lines if re.match(r"^[A-Za-z_.]*(Error|Exception|Interrupt)\b.*", line)]
    line = (errors or lines or ["no output"])[-1]
    return line[:limit]


def take_back(subject: Any, report: dict[str, Any], method: str, weights: dict[str, torch.Tensor] | None = None, *,
              kind: str | None = None, stage: str = "") -> Any:
    """Put the tool's decompressed weights into the trial's model and record each tensor's bytes as stored.

    Every tensor the report stores must name a parameter of the model with the same shape (else ToolError: the
    library changed the model's structure); tensors it does not name keep their values and their dense size.
    ``weights`` (by parameter name) replaces the tool's ``weights.safetensors``, for a tool whose environment has no
    torch (llama.cpp's quantizer: paretolab's side dequantizes the GGUF it wrote). ``kind`` (one of
    ``artifacts.KINDS``) records the report's artefact for the engines and the export (``artifacts.record``).
    """
    from safetensors.torch import load_file

    out = Path(report["out"])
    if weights is None:
        weights = load_file(str(out / WEIGHTS)) if (out / WEIGHTS).is_file() else {}
    params = dict(subject.model.named_parameters())
    missing = [n for n in report["stored_bytes"] if n not in params]
    if missing:
        raise ToolError(f"{method}: the library stored tensors the model does not have: {', '.join(missing[:5])}")
    with torch.no_grad():
        for name, value in weights.items():
            target = params.get(name)
            if target is None or tuple(target.shape) != tuple(value.shape):
                raise ToolError(f"{method}: the library's weight {name!r} {tuple(value.shape)} does not fit the model's "
                                f"{tuple(target.shape) if target is not None else 'no such parameter'}")
            target.copy_(value.to(target.dtype))
    layout = report.get("layout") or {}  # optional: name -> the format's value_bits / group_size / sparse, for the size checks
    for name, nbytes in report["stored_bytes"].items():
        shape = {k: v for k, v in (layout.get(name) or {}).items() if k in LAYOUT_FIELDS}
        subject.set_storage(name, stored_bytes=int(nbytes), **shape)
    artefact = report.get("artifact")
    if artefact is not None and (not isinstance(artefact, str) or not artefact or Path(artefact).is_absolute() or ".." in Path(artefact).parts):
        raise ToolError(f"{method}: the tool's report names artifact {str(artefact)[:100]!r}, not a path inside its out folder")
    subject.info[f"{method}_library"] = f"{report.get('library', '?')} {report.get('version', '?')}"
    if artefact:
        subject.info[f"{method}_artifact"] = str(out / artefact)
        subject.info[f"{method}_format"] = str(report.get("format", ""))
        if kind:
            from paretolab.plugin_api.artifacts import record

            record(subject, out / artefact, kind, method=method, stage=stage)
    notes = [str(note)[:500] for note in report.get("notes", [])[:20]]
    if notes:
        subject.info[f"{method}_notes"] = "; ".join(notes)
    return subject

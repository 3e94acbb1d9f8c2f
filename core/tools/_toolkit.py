"""What every tool script shares. Runs in the tool's own environment: the standard library, torch and safetensors only.

A tool is called as ``python TOOL.py REQUEST.json``; the request holds at least ``out`` (the folder it writes),
``model`` (the handed-over Hugging Face directory) and ``params``; ``calibration`` (a JSON file of ``input_ids``)
where the method calibrates. It writes ``out/report.json`` with :func:`write_report` and, where it changed the
weights, ``out/weights.safetensors`` with :func:`save_weights` (dense, decompressed by the library's own code).
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Any


def read_request() -> dict[str, Any]:
    if len(sys.argv) != 2:
        fail(f"usage: python {Path(sys.argv[0]).name} REQUEST.json")
    return json.loads(Path(sys.argv[1]).read_text())


def fail(message: str) -> None:
    """End the tool with the one line paretolab shows (the last ``...Error:`` line of its log)."""
    print(f"ToolError: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def calibration(request: dict[str, Any]) -> list[list[int]]:
    """The calibration token ids paretolab drew for the trial (the same draw for every calibrated method)."""
    path = request.get("calibration")
    if not path:
        fail("this method calibrates, but the request names no calibration file")
    ids = json.loads(Path(path).read_text())["input_ids"]
    if not ids or not all(isinstance(row, list) and row for row in ids):
        fail(f"calibration file {path}: no token ids")
    return ids


def save_weights(out: Path, state: dict[str, Any]) -> None:
    """The library's decompressed weights, by the model's parameter names, as fp32 safetensors."""
    import torch
    from safetensors.torch import save_file

    save_file({name: t.detach().to("cpu", torch.float32).contiguous() for name, t in state.items()}, str(out / "weights.safetensors"))


def write_report(out: Path, *, library: str, stored_bytes: dict[str, int], artifact: str | None = None, fmt: str = "",
                 notes: list[str] | None = None, extra: dict[str, Any] | None = None) -> None:
    """``report.json``: the library and its installed version, each tensor's bytes as the artefact stores them, notes."""
    report = {"library": library, "version": dist_version(library), "stored_bytes": {k: int(v) for k, v in stored_bytes.items()},
              "artifact": artifact, "format": fmt, "notes": notes or [], **(extra or {})}
    (out / "report.json").write_text(json.dumps(report, indent=1))


def safetensors_bytes(path: Path) -> dict[str, int]:
    """Each tensor's bytes in a safetensors file, read from its header's offsets (what the file holds, header aside)."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    return {name: int(meta["data_offsets"][1]) - int(meta["data_offsets"][0]) for name, meta in header.items() if name != "__metadata__"}


def handed_over_parameters(model_dir: Path) -> dict[str, list[int]]:
    """The handed-over model's tensors (name -> shape), as paretolab wrote them: the names the report and the weights use."""
    shapes: dict[str, list[int]] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        shapes.update({name: list(meta["shape"]) for name, meta in header.items() if name != "__metadata__"})
    return shapes

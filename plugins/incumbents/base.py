"""The base of the incumbent methods (GPTQ, AWQ, SparseGPT, AutoRound, HQQ): hand over, run the library's tool in the
incumbents' environment, take back; and the checks the quantizers share."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, ClassVar

from paretolab import Method, TrialContext
from paretolab.errors import ConfigError
from paretolab.plugin_api.calibration import HESSIAN_CALIB_DEFAULTS
from paretolab.plugin_api.external import ToolEnv, hand_over, run_tool, take_back, write_calibration
from paretolab.plugin_api.subject import Subject

ENV = ToolEnv("incumbents", "incumbents", ("llmcompressor", "auto-round", "hqq"))
"""The incumbents' environment under the engines folder, built by ``make incumbents``."""


class Incumbent(Method):
    """A weights method run by its own library in the incumbents' environment: hand over, run the tool, take back.

    Subclasses name the ``library`` (its pip name), the tool ``script`` under ``paretolab/tools`` and whether it
    ``calibrated``, check their params in :meth:`check` (ConfigError for what the library would refuse, before a
    process starts), and pick the params the tool gets in :meth:`tool_params`.
    """

    kind = "weights"
    cost_is = "real"  # the size is what the library's artefact stores
    sized_by_artifact = True  # ... while the model holds the weights the library decompressed
    works_on = ("linear",)
    library_name: ClassVar[str] = ""
    script: ClassVar[str] = ""
    calibrated: ClassVar[bool] = True
    artifact_kind: ClassVar[str] = ""  # what the library's artefact is (paretolab.plugin_api.artifacts.KINDS)
    timeout_s: ClassVar[float] = 3600.0

    def library(self) -> str:
        return ENV.describe(self.library_name)

    def defaults(self) -> dict[str, Any]:
        return dict(HESSIAN_CALIB_DEFAULTS) if self.calibrated else {}  # sized for Hessian-based methods

    def check(self, params: dict[str, Any], subject: Subject) -> None:
        """Raise ConfigError for a setting the library refuses on this model."""

    def tool_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """The params the tool passes to the library (the method's own; the calib_* ones act here)."""
        return {k: v for k, v in params.items() if not k.startswith("calib_")}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        self.check(p, subject)
        ENV.require(self.library_name)  # before the hand-over: a missing environment fails at once, in one line
        ctx.workdir.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix=f"{self.name}-", dir=ctx.workdir))
        request: dict[str, Any] = {"method": self.name, "model": str(hand_over(subject, workdir / "model")), "params": self.tool_params(p)}
        if self.calibrated:
            from paretolab.plugin_api.calibration import calibration_ids

            ids = calibration_ids(subject, ctx, p, method=self.name)
            request["calibration"] = str(write_calibration(ids, workdir / "calibration.json"))
        report = run_tool(ENV, self.library_name, self.script, request, workdir, timeout_s=self.timeout_s)
        take_back(subject, report, self.name, kind=self.artifact_kind or None, stage=ctx.stage)
        subject.info[f"{self.name}_tool_seconds"] = f"{float(report.get('seconds', 0.0)):.1f}"
        return subject


def quant_checks(method: str, params: dict[str, Any], bits_allowed: tuple[int, ...]) -> tuple[int, int]:
    """(bits, group_size) after the checks every weight quantizer shares."""
    bits, group = int(params["bits"]), int(params["group_size"])
    if bits not in bits_allowed:
        raise ConfigError(f"{method}.bits must be one of {', '.join(map(str, bits_allowed))}; got {bits}")
    if group == 0 or group < -1:
        raise ConfigError(f"{method}.group_size must be a positive number of input channels or -1 (one group per row), got {group}")
    return bits, group


def quantized_linears(subject: Subject) -> list[tuple[str, Any]]:
    """The Linear layers the incumbents quantize: every one but the LM head (each tool passes the same ignore)."""
    import torch

    return [(name, module) for name, module in subject.model.named_modules()
            if isinstance(module, torch.nn.Linear) and not name.split(".")[-1] == "lm_head"]

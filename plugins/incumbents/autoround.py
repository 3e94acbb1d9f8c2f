"""AutoRound (SignRound) as Intel's auto-round runs it, stored in its own ``auto_round`` export format.

The tool ``paretolab/tools/autoround_quantize.py`` runs ``AutoRound(model, bits=, group_size=, sym=True, iters=)``
on the trial's calibration ids (CPU, torch.compile off), exports ``format="auto_round"`` (GPTQ-style packed int32
``qweight``/``qzeros`` and float16 ``scales``) and dequantizes that artefact with the library's own ``QuantLinear``.
``size_bytes`` counts the artefact's tensors. auto-round is the version llm-compressor 0.14.0.1 pins (0.15.1).

``iters`` is auto-round's number of signed-gradient steps per block (its default 200); 0 is its RTN mode. auto-round
leaves a Linear unquantized when its group size does not divide the layer's input width (no refusal): that layer
stays dense, counted dense, and the trial's ``autoround_notes`` names it.
"""

from __future__ import annotations

from typing import Any

from optuna.distributions import CategoricalDistribution, IntDistribution

from paretolab import Paper
from paretolab.errors import ConfigError
from paretolab.plugin_api.subject import Subject
from paretolab.plugins.incumbents.base import Incumbent, quant_checks, quantized_linears

BITS = (2, 3, 4, 8)  # the widths the auto_round export packs


class AutoRoundMethod(Incumbent):
    """AutoRound: weight rounding and clipping tuned by signed gradient descent, block by block, on calibration data."""

    name = "autoround"
    library_name = "auto-round"
    script = "autoround_quantize.py"
    artifact_kind = "auto_round"
    paper = Paper("Optimize Weight Rounding via Signed Gradient Descent for the Quantization of LLMs", "EMNLP 2024 Findings",
                  "https://arxiv.org/abs/2309.05516")

    def search_space(self) -> dict[str, Any]:
        return {"bits": CategoricalDistribution(list(BITS)), "group_size": CategoricalDistribution([32, 64, 128, -1]),
                "iters": IntDistribution(0, 200)}

    def defaults(self) -> dict[str, Any]:  # auto-round's W4A16: 4 bits, group 128, symmetric; iters 200
        return {**super().defaults(), "bits": 4, "group_size": 128, "iters": 200}

    def check(self, params: dict[str, Any], subject: Subject) -> None:
        _, group = quant_checks(self.name, params, BITS)
        narrow = [(name, layer.in_features) for name, layer in quantized_linears(subject) if 0 < layer.in_features < group]
        if narrow:  # auto-round leaves a layer the group does not divide unquantized, but fails inside on one narrower than a group
            raise ConfigError(f"autoround.group_size={group}: auto-round fails on {narrow[0][0]} ({narrow[0][1]} input columns, fewer "
                              f"than one group) and {len(narrow) - 1} other layer(s); choose a group size of at most {narrow[0][1]}, or -1")
        if int(params["iters"]) < 0:
            raise ConfigError(f"autoround.iters must be >= 0 (0: auto-round's RTN mode), got {params['iters']}")

    def tool_params(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"bits": int(params["bits"]), "group_size": int(params["group_size"]), "iters": int(params["iters"])}

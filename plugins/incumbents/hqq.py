"""HQQ (Half-Quadratic Quantization) as the hqq library runs it, on CPU, stored in HQQ's own serialized format.

The tool ``paretolab/tools/hqq_quantize.py`` quantizes every Linear but the LM head with HQQ's model quantizer
(``AutoHQQHFModel.quantize_model`` with ``BaseQuantizeConfig(nbits, group_size)``: asymmetric, groups along the input
dimension, scale and zero in float16, its half-quadratic proximal optimizer), saves ``save_quantized`` (``qmodel.pt``)
and takes back each ``HQQLinear.dequantize()``. ``size_bytes`` counts the artefact's tensors per layer: the bit-packed
codes ``W_q`` (uint8; 3 bits pack into int32), ``scale`` and ``zero``. No calibration data: HQQ fits each weight alone.

HQQ groups run over the flattened weight (``reshape(-1, group_size)``), so a group wider than a row spans rows; it
refuses a weight whose size the group does not divide, and a group size that is not a multiple of 8 (ConfigError).
8 bits is HQQ's widest setting and no setting keeps the logits (its float16 scale and zero alone move them): no
``lossless_setting``.
"""

from __future__ import annotations

from typing import Any

from optuna.distributions import CategoricalDistribution, IntDistribution

from paretolab import Paper
from paretolab.errors import ConfigError
from paretolab.plugin_api.subject import Subject
from paretolab.plugins.incumbents.base import Incumbent, quant_checks, quantized_linears

BITS = (1, 2, 3, 4, 5, 6, 8)  # HQQ's Quantizer.SUPPORTED_BITS but 1.58


class HQQ(Incumbent):
    """HQQ: calibration-free quantization whose zero points (and the rounding) a half-quadratic solver fits per group."""

    name = "hqq"
    library_name = "hqq"
    script = "hqq_quantize.py"
    artifact_kind = "hqq"
    calibrated = False
    paper = Paper("Half-Quadratic Quantization of Large Machine Learning Models", "Mobius Labs blog, 2023",
                  "https://mobiusml.github.io/hqq_blog/")

    def search_space(self) -> dict[str, Any]:
        return {"bits": CategoricalDistribution([2, 3, 4, 8]), "group_size": CategoricalDistribution([32, 64, 128, -1]),
                "optimize": CategoricalDistribution([True, False]), "opt_iters": IntDistribution(1, 100)}

    def defaults(self) -> dict[str, Any]:  # BaseQuantizeConfig's: 4 bits, group 64, optimize; the proximal solver's 20 iterations
        return {"bits": 4, "group_size": 64, "optimize": True, "opt_iters": 20}

    def check(self, params: dict[str, Any], subject: Subject) -> None:
        _, group = quant_checks(self.name, params, BITS)
        if group > 0 and group % 8:
            raise ConfigError(f"hqq.group_size must be a multiple of 8 (HQQ's BaseQuantizeConfig), or -1; got {group}")
        if int(params["opt_iters"]) < 1:
            raise ConfigError(f"hqq.opt_iters must be >= 1, got {params['opt_iters']}")
        for name, layer in quantized_linears(subject):
            if group > 0 and layer.weight.numel() % group:
                raise ConfigError(f"hqq.group_size={group}: HQQ refuses {name}, whose {tuple(layer.weight.shape)} weight does not split "
                                  f"into groups of {group}")

    def tool_params(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"bits": int(params["bits"]), "group_size": int(params["group_size"]), "optimize": bool(params["optimize"]),
                "opt_iters": int(params["opt_iters"])}

"""GPTQ, AWQ and SparseGPT as llm-compressor runs them (``oneshot``), stored as compressed-tensors checkpoints.

The tool ``paretolab/tools/llmcompressor_oneshot.py`` builds the library's own recipe from a trial's params
(``GPTQModifier``; ``AWQModifier`` + ``QuantizationModifier``; ``SparseGPTModifier``), every Linear but the LM head,
runs ``oneshot`` on the trial's calibration ids, saves ``save_pretrained(save_compressed=True)`` and decompresses that
checkpoint with compressed-tensors. ``size_bytes`` counts what the checkpoint holds: the packed int32 codes, the
scales (the model's float32), the zero points (AWQ's asymmetric scheme), ``g_idx`` (GPTQ with ``actorder="group"``)
and each layer's ``weight_shape``.

What the library does that a reader may not expect, measured on its 0.14.0.1 with compressed-tensors 0.19:

* compressed-tensors refuses a group size that does not divide a layer's input width when the width is at least the
  group (SmolLM2's 576 at 128), and GPTQ fails inside the library on a layer narrower than one group (the tiny
  model's 64 at 128): either way the trial fails with a ConfigError saying so, before any process starts;
* compressed-tensors no longer writes sparse formats (its sparse-bitmask and sparse-24-bitmask are legacy), so a
  SparseGPT checkpoint keeps the pruned weights dense: sparsegpt's size is the dense size, zeros included;
* SparseGPT at ``sparsity=0.0`` still prunes the lowest-saliency weight of every 128-column block (its mask is
  ``score <= the block's smallest score``) and updates the others with the OBS step; the logits move by about 3e-6 of
  their scale on the tiny model, within the contract's tolerance, so ``{"sparsity": 0.0, "pattern": "unstructured"}``
  is its ``lossless_setting`` (under ``2:4`` the library prunes two of every four whatever ``sparsity`` says).
"""

from __future__ import annotations

from typing import Any

from optuna.distributions import CategoricalDistribution, FloatDistribution

from paretolab import Paper
from paretolab.errors import ConfigError
from paretolab.plugin_api.subject import Subject
from paretolab.plugins.incumbents.base import Incumbent, quant_checks, quantized_linears

BITS = (2, 3, 4, 8)  # pack-quantized packs 1..8 bits into int32; these are the widths the search tries
GROUPS = [32, 64, 128, -1]
ACTORDERS = ["static", "group", "none"]  # llm-compressor's actorder: "static" (= "weight", its default), "group" (g_idx), None
PATTERNS = ("unstructured", "2:4")


def divisibility_problem(method: str, subject: Subject, group: int) -> str | None:
    """A group size llm-compressor cannot use on this model: one line naming the first layer whose input width it does
    not divide, or None. compressed-tensors refuses a width of at least the group that the group does not divide
    (``validate_group_size_divisibility``: SmolLM2's 576 at 128); a width below the group passes that check and then
    fails inside the observers (``unflatten: Provided sizes [-1, 128] don't multiply up to ... (64)``), so it is refused
    here too."""
    if group <= 0:
        return None
    bad = [(name, layer.in_features) for name, layer in quantized_linears(subject) if layer.in_features % group]
    if not bad:
        return None
    name, cols = bad[0]
    why = (f"{cols} input columns are not a multiple of {group}" if cols >= group else
           f"{cols} input columns, fewer than one group of {group} (its observers fail on it)")
    return (f"{method}.group_size={group}: llm-compressor (compressed-tensors) refuses {name} and {len(bad) - 1} other layer(s): "
            f"{why}; choose a group size that divides every Linear's input width, or -1")


class _Quantizer(Incumbent):
    library_name = "llmcompressor"
    script = "llmcompressor_oneshot.py"
    artifact_kind = "compressed-tensors"

    def check(self, params: dict[str, Any], subject: Subject) -> None:
        _, group = quant_checks(self.name, params, BITS)
        problem = divisibility_problem(self.name, subject, group)
        if problem:
            raise ConfigError(problem)


class GPTQ(_Quantizer):
    """GPTQ (OPTQ) by llm-compressor's GPTQModifier: symmetric int weights, one scale per group, Hessian-guided rounding."""

    name = "gptq"
    paper = Paper("GPTQ: Accurate Post-Training Quantization for Generative Pre-trained Transformers", "ICLR 2023",
                  "https://arxiv.org/abs/2210.17323")

    def search_space(self) -> dict[str, Any]:
        return {"bits": CategoricalDistribution(list(BITS)), "group_size": CategoricalDistribution(GROUPS),
                "dampening_frac": FloatDistribution(0.001, 0.1, log=True), "actorder": CategoricalDistribution(ACTORDERS)}

    def defaults(self) -> dict[str, Any]:  # llm-compressor's: W4A16 (group 128), dampening_frac 0.01, actorder static
        return {**super().defaults(), "bits": 4, "group_size": 128, "dampening_frac": 0.01, "actorder": "static"}

    def check(self, params: dict[str, Any], subject: Subject) -> None:
        super().check(params, subject)
        if str(params["actorder"]) not in ACTORDERS:
            raise ConfigError(f"gptq.actorder must be one of {', '.join(ACTORDERS)}; got {params['actorder']!r}")
        if not 0.0 < float(params["dampening_frac"]) < 1.0:
            raise ConfigError(f"gptq.dampening_frac must be in (0, 1), got {params['dampening_frac']}")


class AWQ(_Quantizer):
    """AWQ by llm-compressor: AWQModifier's activation-aware channel scales, then QuantizationModifier's asymmetric int
    weights (the W4A16_ASYM scheme llm-compressor's AWQ examples use)."""

    name = "awq"
    paper = Paper("AWQ: Activation-aware Weight Quantization for LLM Compression and Acceleration", "MLSys 2024",
                  "https://arxiv.org/abs/2306.00978")

    def search_space(self) -> dict[str, Any]:
        return {"bits": CategoricalDistribution(list(BITS)), "group_size": CategoricalDistribution(GROUPS)}

    def defaults(self) -> dict[str, Any]:  # W4A16_ASYM: 4 bits, group 128
        return {**super().defaults(), "bits": 4, "group_size": 128}


class SparseGPT(Incumbent):
    """SparseGPT by llm-compressor's SparseGPTModifier: unstructured or 2:4 pruning with the OBS weight update."""

    name = "sparsegpt"
    library_name = "llmcompressor"
    script = "llmcompressor_oneshot.py"
    artifact_kind = "compressed-tensors"
    paper = Paper("SparseGPT: Massive Language Models Can Be Accurately Pruned in One-Shot", "ICML 2023", "https://arxiv.org/abs/2301.00774")
    # within LOSSLESS_TOLERANCE, not exact: the library still prunes each block's lowest-saliency weight at sparsity 0
    lossless_setting = {"sparsity": 0.0, "pattern": "unstructured"}

    def search_space(self) -> dict[str, Any]:
        return {"sparsity": FloatDistribution(0.0, 0.9), "pattern": CategoricalDistribution(list(PATTERNS))}

    def defaults(self) -> dict[str, Any]:
        return {**super().defaults(), "sparsity": 0.5, "pattern": "unstructured"}

    def check(self, params: dict[str, Any], subject: Subject) -> None:
        sparsity, pattern = float(params["sparsity"]), str(params["pattern"])
        if pattern not in PATTERNS:
            raise ConfigError(f"sparsegpt.pattern must be one of {', '.join(PATTERNS)}; got {pattern!r}")
        if not 0.0 <= sparsity < 1.0:
            raise ConfigError(f"sparsegpt.sparsity must be in [0, 1), got {sparsity}")
        if pattern == "2:4":
            odd = [name for name, layer in quantized_linears(subject) if layer.in_features % 4]
            if odd:
                raise ConfigError(f"sparsegpt.pattern=2:4 needs input widths divisible by 4; {odd[0]} is not")

    def tool_params(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"sparsity": float(params["sparsity"]), "pattern": str(params["pattern"])}

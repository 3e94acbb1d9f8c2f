"""Quantized weights as a compressed-tensors checkpoint (``pack-quantized``): what vLLM and transformers load.

``compact/`` is then a complete model directory: ``config.json`` with its ``quantization_config``,
``model.safetensors`` holding each quantized Linear as ``weight_packed`` (int32 words of ``b``-bit
codes), ``weight_scale`` (one per group, in the weight's dtype: the trial's exact scales) and
``weight_shape``, every other tensor dense, and the tokenizer. ``AutoModelForCausalLM.from_pretrained(DIR/compact)``
decompresses it (with ``compressed-tensors`` installed). Written only when every quantized tensor
sits on a symmetric grid of groups along its rows (rtn, absmean_ternary and the like), and kept only
when the reloaded model computes what the trial's model did; otherwise paretolab's own layout is used.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from paretolab.data.fidelity import logit_gap, probe_logits, quiet, reload

FORMAT = "pack-quantized"
TOLERANCE = 1e-5  # relative logit difference: the codes and fp32 scales are exact, so only float order changes it


def available() -> bool:
    try:
        import compressed_tensors  # noqa: F401
    except ImportError:
        return False
    return True


def write(plain: torch.nn.Module, quantized: dict[str, tuple[int, int]], folder: Path, tokenizer: Any, why: list[str] | None = None) -> bool:
    """Write ``plain`` with the Linear weights ``quantized`` names (tensor -> (bits, group size)) packed; True when kept.

    ``why``: gets the reason when it is not kept (compressed-tensors refused the scheme, or its reload computes otherwise)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme, apply_quantization_config

    model = copy.deepcopy(plain)
    reference = probe_logits(model)
    by_scheme: dict[tuple[int, int], list[str]] = {}
    for name, scheme in quantized.items():
        by_scheme.setdefault(scheme, []).append(name.removesuffix(".weight"))
    groups = {f"group_{i}": QuantizationScheme(targets=sorted(names), weights=QuantizationArgs(
        num_bits=bits, type="int", symmetric=True, strategy="group", group_size=group)) for i, ((bits, group), names) in enumerate(sorted(by_scheme.items()))}
    try:
        with quiet():
            apply_quantization_config(model, QuantizationConfig(config_groups=groups, quantization_status="frozen"))
            for name, (bits, group) in quantized.items():
                module = model.get_submodule(name.removesuffix(".weight"))
                with torch.no_grad():
                    module.weight_scale.copy_(_scales(module.weight, bits, group).to(module.weight_scale.dtype))
                    if hasattr(module, "weight_zero_point"):
                        module.weight_zero_point.zero_()
            compressor = ModelCompressor.from_pretrained_model(model, quantization_format=FORMAT)
            compressor.compress_model(model)
            model.save_pretrained(folder)
            compressor.update_config(folder)
            if tokenizer is not None:
                tokenizer.save_pretrained(folder)
            gap = logit_gap(reload(folder), reference)
            kept = gap <= TOLERANCE
            if not kept and why is not None:
                schemes = ", ".join(sorted({f"int{b} groups of {g}" for b, g in quantized.values()}))
                why.append(f"compressed-tensors' reload ({schemes}) differs from the trial's model by {gap:.2g} (relative, over {TOLERANCE:g})")
    except Exception as exc:  # a shape or scheme compressed-tensors does not take: paretolab's own layout instead
        kept = False
        if why is not None:
            why.append(f"compressed-tensors refused it: {type(exc).__name__}: {' '.join(str(exc).split())[:160]}")
    if not kept:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    return kept


def _scales(weight: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    rows, cols = weight.shape
    padded = torch.nn.functional.pad(weight.detach(), (0, (-cols) % group))
    return padded.reshape(rows, -1, group).abs().amax(-1) / (2 ** (bits - 1) - 1)

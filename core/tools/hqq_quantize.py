"""HQQ (Half-Quadratic Quantization) by the hqq library, on CPU, in the incumbents environment (``make incumbents``).

Run as ``python hqq_quantize.py REQUEST.json`` by :mod:`paretolab.plugin_api.external`; imports nothing of paretolab.
HQQ needs no calibration data: each Linear but the LM head is quantized on its own weights. It:

1. quantizes the handed-over model with HQQ's own model quantizer, ``AutoHQQHFModel.quantize_model`` with
   ``BaseQuantizeConfig(nbits, group_size)`` (every Linear becomes an ``HQQLinear``; scale and zero in HQQ's default
   compute dtype, float16), its half-quadratic optimizer (``optimize``; ``opt_iters`` iterations of the proximal solver
   HQQ uses by default) as the params say;
2. gives the modules HQQ does not quantize (embeddings, norms) back their handed-over float32 values: the model-level
   quantizer casts them to the compute dtype, which is no part of the method (paretolab keeps them as they came);
3. saves HQQ's own serialized model, ``AutoHQQHFModel.save_quantized`` (``out/hqq/qmodel.pt`` + config: the artefact);
4. writes each HQQLinear's ``dequantize()`` (HQQ's own unpacking, ``(W_q - zero) * scale``) as the dense weights;
5. reports each tensor's bytes as the artefact holds them: a quantized ``X.weight`` counts ``W_q`` (the bit-packed
   codes), ``scale`` and ``zero`` (and ``bias``), the tensors of ``X``'s entry in ``qmodel.pt``; its scalar metadata
   (nbits, shape, packing: a few pickled numbers per layer) is not counted.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _toolkit import fail, handed_over_parameters, read_request, save_weights, write_report  # noqa: E402

BITS = (1, 2, 3, 4, 5, 6, 8)


def main() -> None:
    request = read_request()
    params, out, model_dir = dict(request["params"]), Path(request["out"]), Path(request["model"])
    bits, group = int(params["bits"]), int(params["group_size"])
    if bits not in BITS:
        fail(f"hqq supports nbits {', '.join(map(str, BITS))}; got bits={bits}")
    if group != -1 and (group <= 0 or group % 8):
        fail(f"hqq needs a group_size that is a multiple of 8 (BaseQuantizeConfig), or -1 for whole rows; got {group}")
    start = time.monotonic()

    import functools

    import torch
    from transformers import AutoModelForCausalLM

    from hqq.core import optimize as hqq_optimize
    from hqq.core.quantize import BaseQuantizeConfig, HQQLinear, Quantizer
    from hqq.models.hf.base import AutoHQQHFModel

    torch.manual_seed(int(request.get("seed", 0)))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    names = handed_over_parameters(model_dir)
    original = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and not name.endswith("lm_head"):
            cols = module.in_features if group == -1 else group
            if module.weight.numel() % cols:
                fail(f"hqq refuses {name}: its {tuple(module.weight.shape)} weight does not split into groups of {cols} "
                     "(Quantizer.quantize asserts numel % group_size == 0)")

    config = BaseQuantizeConfig(nbits=bits, group_size=None if group == -1 else group)
    config["weight_quant_params"]["optimize"] = bool(params.get("optimize", True))
    iters = int(params.get("opt_iters", 20))
    Quantizer.optimize_weights = functools.partial(hqq_optimize.optimize_weights_proximal_legacy,
                                                   opt_params={"lp_norm": 0.7, "beta": 1e1, "kappa": 1.01, "iters": iters})
    AutoHQQHFModel.quantize_model(model, quant_config=config, compute_dtype=torch.float16, device="cpu")
    with torch.no_grad():  # the modules HQQ left unquantized, as they were handed over (float32)
        for key, value in model.state_dict().items():
            if key in original and value.dtype != original[key].dtype:
                owner, _, leaf = key.rpartition(".")
                module = model.get_submodule(owner)
                setattr(module, leaf, torch.nn.Parameter(original[key], requires_grad=False))
    seconds = time.monotonic() - start

    artefact = out / "hqq"
    AutoHQQHFModel.save_quantized(model, str(artefact) + "/")
    saved = torch.load(artefact / "qmodel.pt", map_location="cpu", weights_only=False)

    stored, weights, layout = {}, {}, {}
    for module_name, entries in saved.items():
        tensors = {k: v for k, v in entries.items() if torch.is_tensor(v)}
        module = model.get_submodule(module_name)
        if isinstance(module, HQQLinear):
            name = f"{module_name}.weight"
            stored[name] = sum(t.numel() * t.element_size() for t in tensors.values())
            weights[name] = module.dequantize().float()
            layout[name] = {"value_bits": bits, **({"group_size": group} if group > 0 else {})}
        else:
            for leaf, value in tensors.items():
                stored[f"{module_name}.{leaf}"] = value.numel() * value.element_size()
    uncounted = sorted(k for k in stored if k not in names)
    stored = {k: v for k, v in stored.items() if k in names}
    for name, value in model.state_dict().items():
        if name in names and name not in weights and torch.is_tensor(value) and list(value.shape) == names[name]:
            weights[name] = value
    save_weights(out, weights)
    write_report(out, library="hqq", stored_bytes=stored, artifact="hqq", fmt=f"hqq qmodel.pt ({bits}-bit, {'row' if group < 0 else group} groups)",
                 notes=["HQQ's scalar metadata per layer (nbits, shape, packing) is pickled beside its tensors and not counted",
                        "embeddings and norms kept as handed over (float32); HQQ's model quantizer would cast them to float16",
                        *([f"in the artefact but no tensor of the model (a tied weight HQQ serializes again): {', '.join(uncounted[:5])}"]
                          if uncounted else [])],
                 extra={"layout": layout, "library_seconds": seconds})


if __name__ == "__main__":
    main()

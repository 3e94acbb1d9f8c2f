"""AutoRound (SignRound) by Intel's auto-round, on CPU, in the incumbents environment (``make incumbents``).

Run as ``python autoround_quantize.py REQUEST.json`` by :mod:`paretolab.plugin_api.external`; imports nothing of
paretolab. The request names ``model`` (the handed-over fp32 Hugging Face directory), ``calibration`` (the token ids
paretolab drew) and ``params`` (bits, group_size, iters, sym). It:

1. runs ``AutoRound(model, tokenizer, bits=, group_size=, sym=, iters=, nsamples=, seqlen=, dataset=<the ids>)`` on
   the CPU (torch.compile off) and ``quantize_and_save(format="auto_round")``: auto-round's own export (packed int32
   ``qweight``/``qzeros`` and float16 ``scales`` per Linear, GPTQ-style), ``out/autoround/`` (the artefact);
2. loads the artefact's tensors back into auto-round's packed ``QuantLinear`` modules and dequantizes each with the
   library's own kernel (its forward on the identity matrix: ``scales * (q - zeros)``, exact), the dense weights;
3. reports each tensor's bytes as the artefact's safetensors hold them: a quantized ``X.weight`` counts ``X.qweight``,
   ``X.qzeros``, ``X.scales`` (and ``X.g_idx``, ``X.bias`` where written).

Layers auto-round leaves unquantized (it skips a Linear whose input width its group size does not divide) keep their
dense weights, and the report's notes name them.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _toolkit import calibration, fail, handed_over_parameters, read_request, safetensors_bytes, save_weights, write_report  # noqa: E402

PACKED = ("qweight", "qzeros", "scales", "g_idx", "bias")


def main() -> None:
    request = read_request()
    params, out, model_dir = dict(request["params"]), Path(request["out"]), Path(request["model"])
    ids = calibration(request)
    bits, group, iters = int(params["bits"]), int(params["group_size"]), int(params["iters"])
    if bits not in (2, 3, 4, 8):
        fail(f"auto-round's auto_round export packs 2, 3, 4 or 8 bits; got bits={bits}")
    if iters < 0:
        fail(f"autoround.iters must be >= 0 (0: auto-round's RTN mode), got {iters}")
    start = time.monotonic()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from auto_round import AutoRound

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    data = [torch.tensor([row], dtype=torch.long) for row in ids]
    seqlen = min(len(row) for row in ids)
    extra = {"lr": float(params["lr"])} if params.get("lr") else {}
    rounder = AutoRound(model, tokenizer=tokenizer, bits=bits, group_size=group, sym=bool(params.get("sym", True)), iters=iters,
                        nsamples=len(ids), seqlen=seqlen, dataset=data, batch_size=min(int(params.get("batch_size", 8)), len(ids)),
                        device_map="cpu", enable_torch_compile=False, low_cpu_mem_usage=False, seed=int(params.get("seed", 42)), **extra)
    artefact = out / "autoround"
    rounder.quantize_and_save(output_dir=str(artefact), format="auto_round")
    seconds = time.monotonic() - start

    folders = [p.parent for p in artefact.rglob("quantization_config.json")] or [artefact]
    folder = folders[0]
    held: dict[str, int] = {}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        fail(f"auto-round wrote no safetensors under {artefact}")
    for path in files:
        held.update(safetensors_bytes(path))

    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        tensors.update(load_file(str(path)))
    names = handed_over_parameters(model_dir)
    stored, weights, layout, dense_layers = {}, {}, {}, []
    with torch.no_grad():
        for name, module in model.named_modules():
            if not hasattr(module, "qweight"):
                if isinstance(module, torch.nn.Linear) and f"{name}.weight" in names and not name.endswith("lm_head"):
                    dense_layers.append(name)
                continue
            parts = {leaf: tensors[f"{name}.{leaf}"] for leaf in PACKED if f"{name}.{leaf}" in tensors}
            for leaf, value in parts.items():  # the dense weights come from the artefact's own tensors
                getattr(module, leaf).copy_(value)
            eye = torch.eye(module.infeatures, dtype=torch.float32)
            bias = getattr(module, "bias", None)
            dense = module(eye) - (bias.float() if bias is not None else 0.0)
            weights[f"{name}.weight"] = dense.t().contiguous()
            stored[f"{name}.weight"] = sum(held[f"{name}.{leaf}"] for leaf in parts if leaf != "bias")
            if "bias" in parts:
                stored[f"{name}.bias"] = held[f"{name}.bias"]
            layout[f"{name}.weight"] = {"value_bits": bits, **({"group_size": group} if group > 0 else {})}
    for name in names:  # the tensors auto-round keeps dense (embeddings, norms, skipped layers), from the artefact
        if name not in weights and name in tensors and list(tensors[name].shape) == names[name]:
            stored[name], weights[name] = held[name], tensors[name]
    save_weights(out, weights)
    notes = []
    if dense_layers:
        notes.append(f"auto-round left {len(dense_layers)} Linear layer(s) unquantized (group size {group} does not divide their "
                     f"input width): {', '.join(dense_layers[:4])}")
    write_report(out, library="auto-round", stored_bytes=stored, artifact=str(folder.relative_to(out)), fmt=f"auto_round (W{bits}, group {group})",
                 notes=notes, extra={"layout": layout, "library_seconds": seconds, "unquantized": dense_layers})


if __name__ == "__main__":
    main()

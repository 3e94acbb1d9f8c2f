"""GPTQ, AWQ and SparseGPT by llm-compressor's ``oneshot``, in the incumbents environment (``make incumbents``).

Run as ``python llmcompressor_oneshot.py REQUEST.json`` by :mod:`paretolab.plugin_api.external`; imports nothing of
paretolab. The request names ``method`` (gptq, awq, sparsegpt), ``model`` (the handed-over fp32 Hugging Face
directory), ``calibration`` (the token ids paretolab drew) and ``params``. It:

1. builds the library's recipe from the params (GPTQModifier; AWQModifier + QuantizationModifier; SparseGPTModifier),
   every Linear but the LM head, and runs ``oneshot`` on the calibration ids, in the order paretolab drew them;
2. saves the model with llm-compressor's ``save_pretrained(save_compressed=True)``: a compressed-tensors checkpoint,
   ``out/checkpoint`` (the artefact);
3. loads that checkpoint back with transformers' compressed-tensors loader (``dequantize=True``: compressed-tensors
   decompresses it) and writes those dense weights, by the handed-over model's names, to ``weights.safetensors``;
4. reports each tensor's bytes as the checkpoint's safetensors hold them: a quantized ``X.weight`` counts
   ``X.weight_packed``, ``X.weight_scale``, ``X.weight_zero_point``, ``X.weight_g_idx`` and ``X.weight_shape``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _toolkit import calibration, fail, handed_over_parameters, read_request, safetensors_bytes, save_weights, write_report  # noqa: E402

QUANT_SUFFIXES = ("weight_packed", "weight_scale", "weight_zero_point", "weight_g_idx", "weight_shape", "weight_global_scale")


def weight_args(params: dict, *, symmetric: bool) -> dict:
    bits, group = int(params["bits"]), int(params["group_size"])
    return {"num_bits": bits, "type": "int", "symmetric": symmetric, "dynamic": False,
            **({"strategy": "group", "group_size": group} if group > 0 else {"strategy": "channel"})}


def recipe(method: str, params: dict) -> list:
    if method == "gptq":
        from llmcompressor.modifiers.quantization import GPTQModifier

        actorder = params.get("actorder", "static")
        scheme = {"targets": ["Linear"], "weights": weight_args(params, symmetric=bool(params.get("symmetric", True)))}
        return [GPTQModifier(config_groups={"group_0": scheme}, ignore=["lm_head"], dampening_frac=float(params["dampening_frac"]),
                             actorder=None if actorder in (None, "none") else actorder, block_size=int(params.get("block_size", 128)))]
    if method == "awq":
        from llmcompressor.modifiers.quantization import QuantizationModifier
        from llmcompressor.modifiers.transform.awq import AWQModifier

        scheme = {"targets": ["Linear"], "weights": weight_args(params, symmetric=bool(params.get("symmetric", False)))}
        duo = params.get("duo_scaling", True)
        return [AWQModifier(duo_scaling=duo if duo == "both" else bool(duo), n_grid=int(params.get("n_grid", 20))),
                QuantizationModifier(config_groups={"group_0": scheme}, ignore=["lm_head"])]
    if method == "sparsegpt":
        from llmcompressor.modifiers.pruning import SparseGPTModifier

        pattern = str(params.get("pattern", "unstructured"))
        structure = "0:0" if pattern == "unstructured" else pattern
        return [SparseGPTModifier(sparsity=float(params["sparsity"]), mask_structure=structure, ignore=["re:.*lm_head"],
                                  dampening_frac=float(params.get("dampening_frac", 0.01)), block_size=int(params.get("block_size", 128)))]
    fail(f"llmcompressor_oneshot: unknown method {method!r} (gptq, awq, sparsegpt)")
    return []


def checkpoint_bytes(checkpoint: Path) -> dict[str, int]:
    """Every tensor of the checkpoint's safetensors files with its bytes."""
    held: dict[str, int] = {}
    for path in sorted(checkpoint.glob("*.safetensors")):
        held.update(safetensors_bytes(path))
    return held


def stored_bytes(held: dict[str, int], names: dict[str, list[int]]) -> tuple[dict[str, int], list[str]]:
    """Each handed-over tensor's bytes in the checkpoint: its own entry, or the compressed entries of ``X.weight``."""
    out, used = {}, set()
    for name in names:
        if name in held:
            out[name] = held[name]
            used.add(name)
            continue
        prefix = name[: -len("weight")] if name.endswith(".weight") else None
        parts = [f"{prefix}{suffix}" for suffix in QUANT_SUFFIXES if prefix is not None and f"{prefix}{suffix}" in held]
        if parts:
            out[name] = sum(held[p] for p in parts)
            used.update(parts)
    notes = []
    tied = [n for n in names if n not in out]
    if tied:
        notes.append(f"not in the checkpoint (tied to another tensor, or left out): {', '.join(tied[:5])}")
    extra = sorted(set(held) - used)
    if extra:
        notes.append(f"checkpoint tensors no handed-over tensor owns: {', '.join(extra[:5])}")
    return out, notes


def cpu_shims(method: str) -> list[str]:
    """Where llm-compressor assumes an accelerator on a CPU-only machine: AWQ pins its cached activations for faster
    host-to-device copies (``IntermediatesCache.pin_memory``), which raises without one; pinning changes no value,
    so on CPU it is skipped."""
    import torch

    if method != "awq" or torch.cuda.is_available():
        return []
    from llmcompressor.pipelines.cache import IntermediatesCache

    IntermediatesCache.pin_memory = lambda self, *args, **kwargs: None
    return ["no accelerator: AWQ's pinning of cached activations (IntermediatesCache.pin_memory) skipped; it changes no value"]


def main() -> None:
    request = read_request()
    method, params = str(request["method"]), dict(request["params"])
    out, model_dir = Path(request["out"]), Path(request["model"])
    ids = calibration(request)
    start = time.monotonic()

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, CompressedTensorsConfig

    from llmcompressor import oneshot

    torch.manual_seed(int(request.get("seed", 0)))
    notes = cpu_shims(method)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    data = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(row) for row in ids]})
    try:
        oneshot(model=model, recipe=recipe(method, params), dataset=data, num_calibration_samples=len(ids),
                max_seq_length=max(len(row) for row in ids), shuffle_calibration_samples=False, tokenizer=tokenizer)
    except ValueError as exc:  # the library refusing the setting (group sizes that do not divide a layer's columns)
        fail(f"llm-compressor refused {method} with {params}: {' '.join(str(exc).split())[:600]}")
    seconds = time.monotonic() - start

    checkpoint = out / "checkpoint"
    model.save_pretrained(checkpoint, save_compressed=True)
    tokenizer.save_pretrained(checkpoint)

    names = handed_over_parameters(model_dir)
    held = checkpoint_bytes(checkpoint)
    stored, more = stored_bytes(held, names)
    notes += more
    import json

    config = json.loads((checkpoint / "config.json").read_text()).get("quantization_config") or {}
    extra = {"quantization_config": CompressedTensorsConfig(dequantize=True)} if config else {}  # a sparse-only checkpoint is plain dense
    dense = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32, **extra)
    state = dict(dense.named_parameters())
    weights = {name: state[name] for name in names if name in state and list(state[name].shape) == names[name]}
    missing = [n for n in names if n not in weights and n in stored]
    if missing:
        fail(f"the decompressed checkpoint lacks {', '.join(missing[:5])}")
    save_weights(out, weights)

    layout = {}
    if method in ("gptq", "awq"):
        group = int(params["group_size"])
        layout = {name: {"value_bits": int(params["bits"]), **({"group_size": group} if group > 0 else {})}
                  for name in stored if f"{name[:-len('weight')]}weight_scale" in held}
    if method == "sparsegpt":
        notes.append("compressed-tensors no longer writes sparse formats (sparse-bitmask and sparse-24-bitmask are legacy): "
                     "the checkpoint keeps the pruned weights dense, zeros included")
    write_report(out, library="llmcompressor", stored_bytes=stored, artifact="checkpoint",
                 fmt=f"compressed-tensors {config.get('format', 'dense')}", notes=notes,
                 extra={"layout": layout, "library_seconds": seconds, "compressed_tensors": _version("compressed-tensors")})


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


if __name__ == "__main__":
    main()

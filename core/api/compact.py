"""Compact formats of an exported model (``DIR/compact/``) and their loader.

An export always writes dense weights that ``transformers`` loads; where the trial's storage records
say a tensor is pruned or quantized, ``compact/`` also holds it the way the trial's ``size_bytes``
counts it. ``compact/layout.json`` names each tensor's format; ``compact/weights.safetensors`` holds
the buffers, every other tensor dense in its dtype:

- ``macko`` (pruned): ``<name>.values`` (fp16/bf16 kept values and padding zeros), ``<name>.deltas``
  (uint8, two 4-bit column steps per byte), ``<name>.row_ptr`` (int32): the MACKO format of
  :mod:`paretolab.kernels.macko_format`; a ``macko`` trial's own buffers, else the dense weight encoded (fp16).
- ``int<b>`` (quantized, symmetric, one scale per group): ``<name>.codes`` (uint8, the ``b``-bit codes
  ``q + 2^(b-1)`` packed little-endian, row-major over the padded groups), ``<name>.scales`` (fp16,
  one per group); ``w = (code - 2^(b-1)) * scale``. Written only when the trial's values sit exactly on
  such a grid (checked per tensor); ``b`` is the stored bit width rounded up (ternary: 2).

Quantized weights alone are written as a compressed-tensors checkpoint instead where that package is
installed (:mod:`paretolab.data.compressed`: ``compact/`` is then a model directory vLLM and transformers load).

``load_compact(DIR)`` rebuilds the model from ``DIR/config.json`` and these buffers, decoded to dense
weights (no sparse or integer kernel runs: the format is for storage and transfer). fp16 scales and
values round the trial's fp32 numbers: the export records how far the loaded model's logits move.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from paretolab.kernels.macko_format import MackoMatrix, macko_decode, macko_encode
from paretolab.plugin_api.storage import unique_parameters
from paretolab.plugin_api.subject import Subject

LAYOUT = "layout.json"
WEIGHTS = "weights.safetensors"


def dense_twin(subject: Subject) -> torch.nn.Module:
    """A copy of the model with every format module replaced by the dense module it computes (``dense_module()``).

    Raises ``TypeError`` naming the first module that transformers would not rebuild from the config.
    """
    model = copy.deepcopy(subject.model)
    for name, module in list(model.named_modules()):
        if name and hasattr(module, "dense_module"):
            parent, _, leaf = name.rpartition(".")
            try:
                dense = module.dense_module()
            except Exception as exc:
                raise TypeError(f"module {name!r} ({type(module).__name__}) has no dense form: {exc}") from None
            setattr(model.get_submodule(parent) if parent else model, leaf, dense)
    _check_rebuildable(model)
    return model


def _check_rebuildable(model: torch.nn.Module) -> None:
    from paretolab.training.checkpoints import rebuild_mismatch

    if getattr(model, "config", None) is None or not hasattr(model, "save_pretrained"):
        raise TypeError(f"the model is {type(model).__name__}, not a Hugging Face model")
    problem = rebuild_mismatch(model)
    if problem:
        raise TypeError(problem)
    hooked = next((name for name, m in model.named_modules() if m._forward_hooks or m._forward_pre_hooks), None)
    if hooked is not None:
        raise TypeError(f"module {hooked!r} carries forward hooks, which a saved model does not keep")


def write(subject: Subject, plain: torch.nn.Module, folder: Path, why: list[str] | None = None) -> dict[str, str]:
    """Write the compact form of every pruned or quantized tensor (nothing when there is none); tensor -> format.

    Quantized weights alone (no MACKO tensor, groups along rows) go to compressed-tensors where it is installed
    and reproduces the model (:mod:`paretolab.data.compressed`); everything else to the layout described above.
    """
    from safetensors.torch import save_file

    from paretolab.data import compressed

    tensors: dict[str, torch.Tensor] = {}
    layout: dict[str, dict[str, Any]] = {}
    for name, module in subject.model.named_modules():  # a macko trial's own buffers
        fmt = getattr(module, "fmt", None)
        if isinstance(fmt, MackoMatrix):
            _put_macko(tensors, layout, f"{name}.weight", fmt)
    records = subject.current_storage()
    for name, tensor in unique_parameters(plain):
        if name in layout:
            continue
        record = records.get(name)
        if record is not None and record.value_bits is not None and record.group_size and tensor.dim() == 2:
            packed = _quantized(tensor, record.value_bits, record.group_size, record.flat_groups)
            if packed is not None:
                codes, scales, bits = packed
                tensors[f"{name}.codes"], tensors[f"{name}.scales"] = codes, scales
                layout[name] = {"format": f"int{bits}", "bits": bits, "group_size": record.group_size,
                                "flat_groups": record.flat_groups, "shape": list(tensor.shape), "dtype": str(tensor.dtype)}
                continue
        if record is not None and record.sparse and tensor.dim() == 2:
            _put_macko(tensors, layout, name, macko_encode(tensor, value_dtype=torch.float16), dtype=str(tensor.dtype))
            continue
        tensors[name] = tensor.detach().contiguous().cpu()
        layout[name] = {"format": "dense", "dtype": str(tensor.dtype)}
    compacted = {k: v["format"] for k, v in layout.items() if v["format"] != "dense"}
    if not compacted:
        return {}
    # groups over the flattened tensor are groups along rows when they divide a row
    ints = {k: (v["bits"], v["group_size"]) for k, v in layout.items()
            if v["format"].startswith("int") and (not v["flat_groups"] or v["shape"][1] % v["group_size"] == 0)}
    why = why if why is not None else []
    if len(ints) == len(compacted) and compressed.available() and compressed.write(plain, ints, folder, subject.tokenizer, why):
        return {k: f"{v} ({compressed.FORMAT})" for k, v in compacted.items()}
    if len(ints) == len(compacted) and not compressed.available():
        why.append("compressed-tensors is not installed (pip install compressed-tensors)")
    elif all(v.startswith("int") for v in compacted.values()) and len(ints) < len(compacted):
        why.append("some integer groups run across rows (they do not divide a row), which compressed-tensors cannot hold")
    folder.mkdir(parents=True)
    save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, str(folder / WEIGHTS))
    (folder / LAYOUT).write_text(json.dumps({"tied": _tied(plain), "tensors": layout}, indent=1))
    return compacted


def _put_macko(tensors: dict[str, torch.Tensor], layout: dict[str, Any], name: str, fmt: MackoMatrix, dtype: str = "torch.float32") -> None:
    tensors.update({f"{name}.values": fmt.values, f"{name}.deltas": fmt.deltas, f"{name}.row_ptr": fmt.row_ptr})
    layout[name] = {"format": "macko", "shape": list(fmt.shape), "dtype": dtype}


def _tied(model: torch.nn.Module) -> dict[str, str]:
    """Parameter names that share a kept tensor: name -> the kept name (tied embeddings)."""
    kept = {t.data_ptr(): n for n, t in unique_parameters(model)}
    return {n: kept[t.data_ptr()] for n, t in model.state_dict(keep_vars=True).items()
            if isinstance(t, torch.nn.Parameter) and kept.get(t.data_ptr(), n) != n}


def _groups(tensor: torch.Tensor, group_size: int, flat: bool) -> torch.Tensor:
    """(n_groups, group_size) zero-padded groups: along each row, or over the flattened tensor."""
    rows = tensor.reshape(1, -1) if flat else tensor
    pad = (-rows.shape[-1]) % group_size
    return torch.nn.functional.pad(rows, (0, pad)).reshape(-1, group_size)


def _quantized(tensor: torch.Tensor, value_bits: float, group_size: int, flat: bool) -> tuple[torch.Tensor, torch.Tensor, int] | None:
    """(packed codes, fp16 scales, bits) when every group sits on a symmetric grid of 2^bits levels; else None."""
    bits = max(2, math.ceil(value_bits))
    qmax = 2 ** (bits - 1) - 1
    groups = _groups(tensor.detach().float().cpu(), group_size, flat)
    absmax = groups.abs().amax(dim=1, keepdim=True)
    scale = absmax / qmax
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(groups / safe)
    if q.min() < -qmax - 1 or q.max() > qmax or not torch.allclose(q * safe, groups, rtol=1e-5, atol=1e-7):
        return None  # not a symmetric absmax grid: no honest integer form
    codes = (q + 2 ** (bits - 1)).to(torch.uint8).numpy().reshape(-1)
    bitplanes = ((codes[:, None] >> np.arange(bits, dtype=np.uint8)) & 1).astype(np.uint8)
    packed = np.packbits(bitplanes.reshape(-1), bitorder="little")
    return torch.from_numpy(packed), scale.squeeze(1).to(torch.float16), bits


def _dequantized(codes: torch.Tensor, scales: torch.Tensor, entry: dict[str, Any]) -> torch.Tensor:
    bits, group = int(entry["bits"]), int(entry["group_size"])
    shape = tuple(entry["shape"])
    rows = 1 if entry["flat_groups"] else shape[0]
    cols = math.prod(shape) if entry["flat_groups"] else shape[1]
    padded = rows * (cols + (-cols) % group)
    plane = np.unpackbits(codes.numpy(), count=padded * bits, bitorder="little").reshape(padded, bits)
    values = (plane.astype(np.int64) << np.arange(bits)).sum(axis=1) - 2 ** (bits - 1)
    groups = torch.from_numpy(values).float().reshape(-1, group) * scales.float().unsqueeze(1)
    return groups.reshape(rows, -1)[:, :cols].reshape(shape)


def load_compact(path: str | Path, *, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The model of an export directory rebuilt from ``compact/`` (dense weights in ``dtype``, see the module's docstring)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from paretolab.data.fidelity import reload

    path = Path(path)
    if (path / "compact" / "config.json").is_file():  # a compressed-tensors checkpoint
        return reload(path / "compact", dtype)
    layout = json.loads((path / "compact" / LAYOUT).read_text())
    stored = load_file(str(path / "compact" / WEIGHTS))
    state: dict[str, torch.Tensor] = {}
    for name, entry in layout["tensors"].items():
        kind = entry["format"]
        if kind == "dense":
            state[name] = stored[name]
        elif kind == "macko":
            fmt = MackoMatrix(stored[f"{name}.values"], stored[f"{name}.deltas"], stored[f"{name}.row_ptr"], tuple(entry["shape"]))
            state[name] = macko_decode(fmt)
        else:
            state[name] = _dequantized(stored[f"{name}.codes"], stored[f"{name}.scales"], entry)
    for name, kept in layout.get("tied", {}).items():
        state[name] = state[kept]
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path)).to(dtype)
    missing = sorted(set(model.state_dict()) - set(state))
    if missing:
        raise ValueError(f"{path}/compact: no tensor for {missing[0]} ({len(missing)} missing); the layout does not match config.json")
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()})
    return model.eval()

"""How a tensor is (or would be) stored: the single source of ``size_bytes``."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class TensorStorage:
    """Storage of one parameter tensor, composed by the methods that touched it.

    The default is dense storage in the tensor's dtype. A pruning method sets ``sparse``
    (a bitmap of kept entries plus only the kept values), a quantizer sets ``value_bits``
    and ``group_size`` (one ``scale_bits`` scale per group); a method with a real format
    sets ``stored_bytes`` to the exact size of the buffers it keeps, which wins.
    """

    value_bits: float | None = None  # None: the tensor's own dtype
    group_size: int | None = None  # one scale per `group_size` values; None: no scales
    scale_bits: int = 16
    sparse: bool = False
    stored_bytes: int | None = None
    flat_groups: bool = False  # groups run over the flattened tensor, across rows (e.g. CAT-Q)

    def with_(self, **changes: object) -> TensorStorage:
        return replace(self, **changes)  # type: ignore[arg-type]

    def nbytes(self, tensor: torch.Tensor) -> int:
        """Bytes this tensor takes in this storage."""
        if self.stored_bytes is not None:
            return self.stored_bytes
        numel = tensor.numel()
        bits_per_value = self.value_bits if self.value_bits is not None else tensor.element_size() * 8
        if self.sparse:
            kept = int(torch.count_nonzero(tensor).item())
            bits = numel + kept * bits_per_value  # 1-bit mask + kept values
        else:
            kept = numel
            bits = numel * bits_per_value
        if self.group_size and self.flat_groups:
            bits += math.ceil(numel / self.group_size) * self.scale_bits
        elif self.group_size:  # groups run along the last (input) dimension; a short last group still has a scale
            cols = tensor.shape[-1] if tensor.dim() else 1
            bits += (numel // max(cols, 1)) * math.ceil(cols / self.group_size) * self.scale_bits
        return math.ceil(bits / 8)


DENSE = TensorStorage()


def unique_parameters(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) for each distinct parameter or buffer-free weight (tied weights counted once)."""
    seen: set[int] = set()
    out = []
    for name, tensor in model.state_dict(keep_vars=True).items():
        if not isinstance(tensor, torch.nn.Parameter) and not getattr(tensor, "_paretolab_weight", False):
            continue
        key = tensor.data_ptr()
        if key in seen:
            continue
        seen.add(key)
        out.append((name, tensor.detach()))
    return out

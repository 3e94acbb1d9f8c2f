"""FLOPs of one training step, counted by torch's FlopCounterMode once per distinct step shape.

FlopCounterMode counts matmuls (mm, bmm, addmm, convolutions) and the fused attention kernels it
knows. It does not know ``aten._scaled_dot_product_flash_attention_for_cpu`` (and its backward),
the kernel SDPA dispatches to on CPU, so attention would count as zero there. We give the counter
formulas for them through its ``custom_mapping`` (torch's ``register_flop_formula`` mechanism, per
counter, so torch's global registry is left as it is):

- forward: torch's own ``sdpa_flop_count`` (what it uses for the CUDA kernels): the ``Q·Kᵀ`` and
  ``P·V`` matmuls in full, ``4·b·h·s_q·s_k·d`` — no discount for the causal mask;
- backward, every SDPA kernel (CPU, flash, efficient, cuDNN): twice the forward (``dQ, dK, dP, dV``):
  model FLOPs, as in the usual 6·N·D accounting. The kernels' recomputation of ``Q·Kᵀ`` is not
  counted (torch's own CUDA formula counts it: 2.5× the forward), so CPU and GPU runs count alike.

Element-wise work (norms, activations, softmax, the loss, the optimizer) is not counted, as usual.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

_aten = torch.ops.aten


def _forward(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _backward(grad_out_shape: Any, query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return 2 * sdpa_flop_count(query_shape, key_shape, value_shape)


def _mapping() -> dict[Any, Any]:
    """Our attention formulas, for the kernels this torch has (every SDPA backward takes grad_out, query, key, value first)."""
    forward = ("_scaled_dot_product_flash_attention_for_cpu",)
    backward = ("_scaled_dot_product_flash_attention_for_cpu_backward", "_scaled_dot_product_flash_attention_backward",
                "_scaled_dot_product_efficient_attention_backward", "_scaled_dot_product_cudnn_attention_backward")
    mapping = {getattr(_aten, name): _forward for name in forward if hasattr(_aten, name)}
    mapping.update({getattr(_aten, name): _backward for name in backward if hasattr(_aten, name)})
    return mapping


ATTENTION_FORMULAS = _mapping()


class StepFlops:
    """FLOPs per training step, measured on the first step of each distinct ``key`` (batch shape, hooks' signatures) and cached."""

    def __init__(self) -> None:
        self._known: dict[Any, float] = {}

    def get(self, key: Any) -> float | None:
        return self._known.get(key)

    @contextmanager
    def counting(self, key: Any) -> Iterator[None]:
        """Run the block (one forward + backward) under the counter unless ``key`` was counted already."""
        if key in self._known:
            yield
            return
        with FlopCounterMode(display=False, custom_mapping=ATTENTION_FORMULAS) as counter:
            yield
        self._known[key] = float(counter.get_total_flops())

    def __len__(self) -> int:
        return len(self._known)

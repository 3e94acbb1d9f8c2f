"""FLOPs of one training step, counted by torch's FlopCounterMode once per distinct step shape.

FlopCounterMode counts matmuls (mm, bmm, addmm, convolutions) and the fused attention kernels it
knows. It does not know ``aten._scaled_dot_product_flash_attention_for_cpu`` (and its backward),
the kernel SDPA dispatches to on CPU, so attention would count as zero there. We register formulas
for both with ``torch.utils.flop_counter.register_flop_formula``:

- forward: torch's own ``sdpa_flop_count`` (what it uses for the CUDA kernels): the ``Q·Kᵀ`` and
  ``P·V`` matmuls in full, ``4·b·h·s_q·s_k·d`` — no discount for the causal mask;
- backward: twice the forward (``dQ, dK, dP, dV``: model FLOPs, as in the usual 6·N·D accounting).
  The flash kernel's recomputation of ``Q·Kᵀ`` is not counted, so this is 0.8× what torch's
  CUDA formula (``sdpa_backward_flop_count``, 2.5× the forward) reports for the same shapes.

Element-wise work (norms, activations, softmax, the loss, the optimizer) is not counted, as usual.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode, flop_registry, register_flop_formula, sdpa_flop_count

_aten = torch.ops.aten


def _register_cpu_attention() -> None:
    """Teach FlopCounterMode the CPU SDPA kernels (idempotent; a torch that knows them keeps its own)."""
    forward = getattr(_aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    backward = getattr(_aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if forward is not None and forward not in flop_registry:

        @register_flop_formula(forward)
        def _cpu_sdpa(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
            return sdpa_flop_count(query_shape, key_shape, value_shape)

    if backward is not None and backward not in flop_registry:

        @register_flop_formula(backward)
        def _cpu_sdpa_backward(grad_out_shape: Any, query_shape: Any, key_shape: Any, value_shape: Any, *args: Any,
                               out_shape: Any = None, **kwargs: Any) -> int:
            return 2 * sdpa_flop_count(query_shape, key_shape, value_shape)


_register_cpu_attention()


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
        with FlopCounterMode(display=False) as counter:
            yield
        self._known[key] = float(counter.get_total_flops())

    def __len__(self) -> int:
        return len(self._known)

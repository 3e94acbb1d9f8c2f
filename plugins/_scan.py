"""Inclusive scans along time for linear-attention states: one blocked associative scan shared by ``gla`` and ``kalman_attention``.

An operator is a pair of pure functions on tuples of tensors: ``combine(earlier, later)`` composes
two elements (associative), ``identity(like)`` gives the neutral element shaped like ``like``.
Two operators are used: :data:`AFFINE` (x ↦ a·x + b, elementwise: GLA's state and the Kalman
information vector) and :data:`MOBIUS` (λ ↦ (Aλ + B)/(Cλ + D), the information-form Kalman precision
recursion; its 2×2 maps are composed as matrix products normalised by their trace, as in the
official KLA code, which leaves the map unchanged and keeps the entries O(1)).

:func:`blocked_scan` is the two-level (chunked) scan: every chunk of ``chunk`` steps is scanned for
all chunks at once (vectorised over chunks), the chunk totals are scanned across chunks, and each
chunk's prefixes are then composed with the carry-in of its chunk in one parallel step. It needs
``chunk + T/chunk`` sequential combines instead of ``T`` and is exactly the operator's algebra, so it
equals the step-by-step recurrence up to float rounding (tested).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

Leaves = tuple[torch.Tensor, ...]
EPS = 1e-12


@dataclass(frozen=True)
class ScanOp:
    """An associative operator on tuples of tensors (elementwise, broadcasting)."""

    combine: Callable[[Leaves, Leaves], Leaves]
    identity: Callable[[Leaves], Leaves]


def _affine_combine(earlier: Leaves, later: Leaves) -> Leaves:
    a1, b1 = earlier
    a2, b2 = later
    return a2 * a1, a2 * b1 + b2


def _mobius_combine(earlier: Leaves, later: Leaves) -> Leaves:
    a1, b1, c1, d1 = earlier
    a2, b2, c2, d2 = later
    a, b = a2 * a1 + b2 * c1, a2 * b1 + b2 * d1
    c, d = c2 * a1 + d2 * c1, c2 * b1 + d2 * d1
    inv = 1.0 / (a + d).clamp_min(EPS)  # entries stay positive, so the trace never vanishes; the map is scale-invariant
    return a * inv, b * inv, c * inv, d * inv


AFFINE = ScanOp(_affine_combine, lambda like: (torch.ones_like(like[0]), torch.zeros_like(like[1])))
MOBIUS = ScanOp(_mobius_combine, lambda like: (torch.ones_like(like[0]), torch.zeros_like(like[1]),
                                               torch.zeros_like(like[2]), torch.ones_like(like[3])))


def blocked_scan(op: ScanOp, leaves: Leaves, chunk: int) -> Leaves:
    """Inclusive prefixes of ``leaves`` (each ``[B, H, T, ...]``, trailing dims may broadcast) along dim 2, in chunks of ``chunk``."""
    length = leaves[0].shape[2]
    n = -(-length // chunk)
    pad = n * chunk - length
    if pad:  # identity elements at the end change no prefix
        neutral = op.identity(tuple(x[:, :, :1] for x in leaves))
        leaves = tuple(torch.cat([x, e.expand(*x.shape[:2], pad, *x.shape[3:])], dim=2) for x, e in zip(leaves, neutral))
    blocks = tuple(x.reshape(*x.shape[:2], n, chunk, *x.shape[3:]) for x in leaves)
    acc = tuple(x[:, :, :, 0] for x in blocks)
    steps = [acc]
    for c in range(1, chunk):  # within every chunk at once
        acc = op.combine(acc, tuple(x[:, :, :, c] for x in blocks))
        steps.append(acc)
    local = tuple(torch.stack([s[i] for s in steps], dim=3) for i in range(len(leaves)))
    if n > 1:  # carry-in of each chunk: exclusive scan of the chunk totals, then one parallel fix-up
        carry = op.identity(tuple(x[:, :, 0] for x in steps[-1]))
        carries = [carry]
        for j in range(1, n):
            carry = op.combine(carry, tuple(x[:, :, j - 1] for x in steps[-1]))
            carries.append(carry)
        carry_in = tuple(torch.stack([c[i] for c in carries], dim=2).unsqueeze(3) for i in range(len(leaves)))
        local = op.combine(carry_in, local)
    return tuple(x.reshape(*x.shape[:2], n * chunk, *x.shape[4:])[:, :, :length] for x in local)

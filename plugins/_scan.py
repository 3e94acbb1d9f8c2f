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


def gated_chunk_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_gate: torch.Tensor, state: torch.Tensor,
                          chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """o_t = q_t·S_t for S_t = diag(exp(log_gate_t))·S_{t−1} + k_tᵀv_t, chunkwise (GLA's form), without a state per token.

    q, k, log_gate: [B, H, T, dk]; v: [B, H, T, dv]; state: S_0 [B, H, dk, dv]. Returns (o [B, H, T, dv], S_T).
    Inside a chunk the outputs are a decay-weighted causal attention (decays exp(b_t − b_s) ≤ what the
    gates allow, formed from differences of cumulative log-gates, never from their ratios); across
    chunks the state is carried by the recurrence, one step per chunk. This is the affine scan of
    :data:`AFFINE` with a per-key-row gate, reorganised so that only one state per chunk is formed.
    """
    b, h, length, dk = q.shape
    n = -(-length // chunk)
    pad = n * chunk - length
    if pad:  # zero keys and zero log-gates are identity steps
        q, k, v, log_gate = (torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in (q, k, v, log_gate))
    q, k, v, log_gate = (x.reshape(b, h, n, chunk, x.shape[-1]) for x in (q, k, v, log_gate))
    cum = log_gate.cumsum(dim=3)  # b_t: log of the gates' product from the chunk start to t (inclusive)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    diff = (cum.unsqueeze(4) - cum.unsqueeze(3)).masked_fill(~causal[:, :, None], float("-inf"))  # [.., t, s, dk]
    scores = torch.einsum("bhnti,bhntsi,bhnsi->bhnts", q, diff.exp(), k)
    out = scores @ v
    total = cum[:, :, :, -1]  # [B, H, n, dk]
    writes = torch.einsum("bhnsi,bhnsj->bhnij", k * (total.unsqueeze(3) - cum).exp(), v)  # each chunk's own contribution
    starts = []
    for j in range(n):  # the state entering each chunk
        starts.append(state)
        state = total[:, :, j].exp().unsqueeze(-1) * state + writes[:, :, j]
    out = out + torch.einsum("bhnti,bhnij->bhntj", q * cum.exp(), torch.stack(starts, dim=2))
    return out.reshape(b, h, n * chunk, -1)[:, :, :length], state

"""Triton kernels for Token Sparse Attention's scoring step, beside ``token_sparse.window_scores_ref``.

Two passes, so that the (W, L) probability matrix is never stored:

1. ``_row_stats_kernel``: one program per (sequence x head, block of window queries) scans all
   keys in blocks and keeps an online softmax's running max ``m`` and normaliser ``l`` per
   window query (causal: key j is seen by query i only if j <= i).
2. ``_prefix_scores_kernel``: one program per (sequence x head, block of prefix keys) scans the
   window queries in blocks, recomputes their logits against its keys, turns them into
   probabilities with the stored (m, l), and sums over the queries; the sum / W is the score.

Grouped-query attention is handled by indexing: query head ``h`` reads key head
``h // (H // Hkv)``, so keys are never repeated in memory. The head dimension is padded to a
power of two (at least 16, as ``tl.dot`` needs) with masked loads. The official repository
(dongwonjo/Token-Sparse-Attention) uses the same two-pass idea; this code is ours. No attention
mask: the method uses the PyTorch reference when transformers passes one (padded batches).

Tests run it on CPU tensors with ``TRITON_INTERPRET=1``; timings are only claimed from a GPU run.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from paretolab.kernels.token_sparse import check_shapes


@triton.jit
def _load_queries(q_ptr, b, h, pos, ok, d, d_ok, sqb, sqh, sql, sqd):
    """Rows ``pos`` of query head ``h`` as (BQ, BD) fp32, zero where masked."""
    return tl.load(q_ptr + b * sqb + h * sqh + pos[:, None] * sql + d[None, :] * sqd,
                   mask=ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)


@triton.jit
def _load_keys_t(k_ptr, b, kh, pos, ok, d, d_ok, skb, skh, skl, skd):
    """Keys ``pos`` of key head ``kh``, transposed to (BD, BK) fp32 for ``tl.dot``, zero where masked."""
    return tl.load(k_ptr + b * skb + kh * skh + pos[None, :] * skl + d[:, None] * skd,
                   mask=ok[None, :] & d_ok[:, None], other=0.0).to(tl.float32)


@triton.jit
def _row_stats_kernel(
    q_ptr, k_ptr, m_ptr, l_ptr,
    H, GROUP, L, W, D, scale,
    sqb, sqh, sql, sqd,
    skb, skh, skl, skd,
    BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr,
):
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    kh = h // GROUP
    qi = tl.program_id(1) * BQ + tl.arange(0, BQ)  # (BQ,) window query ordinals
    q_ok = qi < W
    q_pos = L - W + qi  # absolute positions
    d = tl.arange(0, BD)
    d_ok = d < D
    q = _load_queries(q_ptr, b, h, q_pos, q_ok, d, d_ok, sqb, sqh, sql, sqd)  # (BQ, BD)
    m = tl.full([BQ], float("-inf"), tl.float32)
    s = tl.zeros([BQ], tl.float32)
    for k0 in range(0, L, BK):
        kj = k0 + tl.arange(0, BK)  # (BK,)
        k = _load_keys_t(k_ptr, b, kh, kj, kj < L, d, d_ok, skb, skh, skl, skd)  # (BD, BK)
        logits = tl.dot(q, k, input_precision="ieee") * scale  # (BQ, BK); ieee: fp32 like the reference (the default tf32 rounds to 10 bits)
        visible = (kj[None, :] <= q_pos[:, None]) & (kj[None, :] < L)
        logits = tl.where(visible, logits, float("-inf"))
        m_new = tl.maximum(m, tl.max(logits, axis=1))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(logits - m_new[:, None]), axis=1)
        m = m_new
    tl.store(m_ptr + bh * W + qi, m, mask=q_ok)
    tl.store(l_ptr + bh * W + qi, s, mask=q_ok)


@triton.jit
def _prefix_scores_kernel(
    q_ptr, k_ptr, m_ptr, l_ptr, out_ptr,
    H, GROUP, L, W, D, scale,
    sqb, sqh, sql, sqd,
    skb, skh, skl, skd,
    BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr,
):
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    kh = h // GROUP
    prefix = L - W
    kj = tl.program_id(1) * BK + tl.arange(0, BK)  # (BK,) prefix key positions
    k_ok = kj < prefix
    d = tl.arange(0, BD)
    d_ok = d < D
    k = _load_keys_t(k_ptr, b, kh, kj, k_ok, d, d_ok, skb, skh, skl, skd)  # (BD, BK)
    acc = tl.zeros([BK], tl.float32)
    for q0 in range(0, W, BQ):
        qi = q0 + tl.arange(0, BQ)
        q_ok = qi < W
        q = _load_queries(q_ptr, b, h, prefix + qi, q_ok, d, d_ok, sqb, sqh, sql, sqd)  # (BQ, BD)
        m = tl.load(m_ptr + bh * W + qi, mask=q_ok, other=0.0)
        s = tl.load(l_ptr + bh * W + qi, mask=q_ok, other=1.0)
        logits = tl.dot(q, k, input_precision="ieee") * scale  # (BQ, BK); ieee: fp32 like the reference (the default tf32 rounds to 10 bits); prefix keys precede every window query
        probs = tl.exp(logits - m[:, None]) / s[:, None]
        acc += tl.sum(tl.where(q_ok[:, None], probs, 0.0), axis=0)
    tl.store(out_ptr + bh * prefix + kj, acc / W, mask=k_ok)


def window_scores_triton(
    query: torch.Tensor, key: torch.Tensor, window: int, *, scale: float | None = None, block_q: int = 16, block_k: int = 64
) -> torch.Tensor:
    """Same result as ``window_scores_ref`` without a mask: (B, H, L - window) fp32."""
    b, h, hkv, length, d = check_shapes(query, key, window)
    if query.device != key.device:
        raise ValueError(f"query is on {query.device}, key on {key.device}")
    scale = d**-0.5 if scale is None else scale
    block_d = max(16, triton.next_power_of_2(d))
    m = torch.empty(b * h, window, dtype=torch.float32, device=query.device)
    l_sum = torch.empty_like(m)
    out = torch.empty(b, h, length - window, dtype=torch.float32, device=query.device)
    args = (h, h // hkv, length, window, d, float(scale), *query.stride(), *key.stride())
    blocks = {"BQ": block_q, "BK": block_k, "BD": block_d}
    _row_stats_kernel[(b * h, triton.cdiv(window, block_q))](query, key, m, l_sum, *args, **blocks)
    _prefix_scores_kernel[(b * h, triton.cdiv(length - window, block_k))](query, key, m, l_sum, out, *args, **blocks)
    return out

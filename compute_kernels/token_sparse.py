"""Token Sparse Attention's scoring step, in PyTorch: how much attention the last W queries pay each earlier key.

For one sequence of length L, the last ``window`` (W) queries of every head attend over all L
keys (causal: a window query does not see later window keys); each query's softmax row is
turned into probabilities and the W rows are averaged. The score of prefix key j < L - W is

    score[b, h, j] = (1 / W) * sum_{i in last W} softmax_j(q_i . k_j * scale)

(B, H, L - W). This is the reference the Triton kernel ``token_sparse_triton.window_scores_triton``
is tested against; it materialises the (W, L) probabilities, which is cheap next to full
attention (W << L). Keys may have fewer heads than queries (grouped-query attention): query head
``h`` reads key head ``h // (H // Hkv)``.
"""

from __future__ import annotations

import torch


def check_shapes(query: torch.Tensor, key: torch.Tensor, window: int) -> tuple[int, int, int, int, int]:
    """(B, H, Hkv, L, D) after checking ``query`` (B, H, L, D), ``key`` (B, Hkv, L, D) and ``window``."""
    if query.dim() != 4 or key.dim() != 4:
        raise ValueError(f"query and key must be (B, heads, L, head_dim); got {tuple(query.shape)} and {tuple(key.shape)}")
    b, h, length, d = query.shape
    if key.shape[0] != b or key.shape[2] != length or key.shape[3] != d or h % key.shape[1]:
        raise ValueError(f"key {tuple(key.shape)} does not match query {tuple(query.shape)} (heads must divide)")
    if not 0 < window < length:
        raise ValueError(f"window must be between 1 and L - 1 = {length - 1}, got {window}")
    return b, h, key.shape[1], length, d


def window_scores_ref(
    query: torch.Tensor, key: torch.Tensor, window: int, *, scale: float | None = None, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Mean softmax probability the last ``window`` queries give each prefix key: (B, H, L - window), fp32.

    ``mask`` (optional) is an attention mask for the window rows, broadcastable to (B, H, W, L):
    boolean (True = may attend) or additive float, as transformers passes to SDPA; it replaces
    the causal rule when given.
    """
    b, h, hkv, length, d = check_shapes(query, key, window)
    scale = d**-0.5 if scale is None else scale
    group = h // hkv
    q = query[:, :, length - window :].float().reshape(b, hkv, group * window, d)  # heads grouped by key head
    logits = torch.matmul(q, key.float().transpose(-1, -2)) * scale  # (B, Hkv, G * W, L)
    logits = logits.reshape(b, h, window, length)
    if mask is None:  # causal: only the window's own keys can lie in a window query's future
        future = torch.ones(window, window, dtype=torch.bool, device=query.device).triu(1)
        logits[..., length - window :].masked_fill_(future, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
    else:
        if mask.dtype == torch.bool:
            logits = logits.masked_fill(~mask, float("-inf"))
        else:
            logits = logits + mask.float()
        probs = torch.softmax(logits, dim=-1).nan_to_num(0.0)  # a fully masked (padding) row contributes nothing
    return probs[..., : length - window].mean(dim=2)

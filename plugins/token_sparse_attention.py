"""Token Sparse Attention: per-head token selection at prefill in the later layers, outputs scattered back.

Jo, Kang, Song, Kim, "Token Sparse Attention: Efficient Long-Context Inference with Interleaved
Token Selection", arXiv 2602.03216 (code: github.com/dongwonjo/Token-Sparse-Attention; read, not copied).

The paper's (and its official code's):
- prefill only, in the layers from ``first_sparse_layer`` on (the official default without a
  profile is the second half of the layers);
- the last ``window`` (W, 128) queries score every earlier key per head: each window query's
  softmax probabilities over all keys (causal inside the window), averaged over the W queries
  (``paretolab.kernels.token_sparse``; a Triton kernel on CUDA);
- the scores are smoothed along the sequence (average pooling, ``kernel_size`` 7), normalised
  per head, and averaged over heads into one global distribution; sorted ascending, the
  ``n`` lowest tokens whose cumulative mass stays below ``tau`` (coverage, official default 0.005),
  plus one (the token that crosses it), set how many to drop; nothing is dropped when ``n`` is 0;
- every head keeps the same number ``max(min_tokens, (L - W) - dropped)`` of prefix tokens
  (``min_tokens`` 1024), chosen per head by its own smoothed score, plus the last W tokens;
- Q, K and V of the kept tokens (in order) are gathered per head, dense causal attention runs on
  them (causality among kept tokens is the original order), and the outputs are scattered back
  to their positions; a token dropped in a head gets a zero attention output in that head, so
  where every head drops it the layer leaves its residual stream unchanged;
- the KV cache is written before selection and stays complete, so decoding sees every token.

Ours: the layer's attention function is swapped through transformers' ``AttentionInterface``
(each chosen layer gets its own config whose ``_attn_implementation`` names our function, which
hands decode steps, chunked prefill and short prompts back to the layer's original
implementation, SDPA by default); sequences of a batch are selected one by one (the official
code assumes batch 1); a padding mask from transformers is gathered with the tokens and the
scores use it (PyTorch path); ``kernel_size`` must be odd. ``attn_kept_frac`` reports the share
of tokens that entered attention in the sparse layers, averaged over the prefill calls of the
trial. ``cost_is`` is real: attention really runs on fewer tokens (``prefill_ms`` of the
``kv_retrieval`` task measures it).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from optuna.distributions import (
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from paretolab import Method, Metric, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.kernels.token_sparse import window_scores_ref
from paretolab.plugin_api.subject import Subject
from paretolab.plugins._layerwise import decoder_layers

ATTENTION_NAME = "paretolab_token_sparse"
PAPER = Paper(
    "Token Sparse Attention: Efficient Long-Context Inference with Interleaved Token Selection",
    "arXiv 2026",
    "https://arxiv.org/abs/2602.03216",
)


@dataclass(frozen=True)
class SparseSettings:
    """What one sparse layer does at prefill (``base`` is the implementation it falls back to)."""

    tau: float
    window: int
    min_tokens: int
    kernel_size: int
    base: str


def select_tokens(scores: torch.Tensor, settings: SparseSettings, length: int) -> torch.Tensor | None:
    """Sorted kept positions per head, (H, n), for one sequence's scores (H, L - W); None keeps all."""
    prefix = length - settings.window
    k = settings.kernel_size
    smooth = F.avg_pool1d(scores[None], kernel_size=k, stride=1, padding=k // 2)[0]  # (H, P)
    per_head = smooth / (smooth.sum(-1, keepdim=True) + 1e-8)
    mixed = per_head.mean(0)
    mixed = mixed / (mixed.sum() + 1e-8)
    below = int((torch.cumsum(torch.sort(mixed).values, 0) < settings.tau).sum())
    if below == 0:
        return None
    keep = max(settings.min_tokens, prefix - (below + 1))
    if keep >= prefix:
        return None
    kept = torch.topk(per_head, keep, dim=-1).indices  # (H, keep)
    tail = torch.arange(prefix, length, device=scores.device).expand(kept.shape[0], -1)
    return torch.cat([kept, tail], dim=-1).sort(dim=-1).values


def window_scores(query: torch.Tensor, key: torch.Tensor, window: int, scale: float, mask: torch.Tensor | None) -> torch.Tensor:
    """The scoring step: the Triton kernel on CUDA without a mask, else the PyTorch reference."""
    if query.is_cuda and mask is None:
        from paretolab.kernels.token_sparse_triton import window_scores_triton

        return window_scores_triton(query, key, window, scale=scale)
    window_mask = None if mask is None else mask[..., -window:, :]
    return window_scores_ref(query, key, window, scale=scale, mask=window_mask)


def gathered_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kept: torch.Tensor, scale: float, mask: torch.Tensor | None
) -> torch.Tensor:
    """Dense causal attention over each head's kept tokens, scattered back: (1, L, H, D), zeros elsewhere."""
    _, h, length, d = query.shape
    heads = torch.arange(h, device=query.device)[:, None]  # (H, 1)
    kv_heads = heads // (h // key.shape[1])  # grouped-query attention: no repeated copy of K and V
    q_kept = query[0][heads, kept][None]  # (1, H, n, D)
    k_kept = key[0][kv_heads, kept][None]
    v_kept = value[0][kv_heads, kept][None]
    if mask is None:
        out = F.scaled_dot_product_attention(q_kept, k_kept, v_kept, is_causal=True, scale=scale)
    else:
        full = mask[0].expand(h, length, length)
        sub = full[heads[:, :, None], kept[:, :, None], kept[:, None, :]][None]  # (1, H, n, n)
        out = F.scaled_dot_product_attention(q_kept, k_kept, v_kept, attn_mask=sub, scale=scale)
    scattered = query.new_zeros(length, h, d)
    scattered[kept, heads] = out[0]  # row kept[h, i] of head h
    return scattered[None]


def base_attention(name: str) -> Callable[..., tuple[torch.Tensor, Any]]:
    """The attention function registered under ``name`` (eager when transformers has none by that name)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.llama.modeling_llama import eager_attention_forward

    return ALL_ATTENTION_FUNCTIONS.get_interface(name, eager_attention_forward)


def token_sparse_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, Any]:
    """An ``AttentionInterface`` function: token-sparse at prefill, the layer's own attention otherwise."""
    settings: SparseSettings = module.token_sparse  # type: ignore[assignment]
    base = base_attention(settings.base)
    length = query.shape[2]
    is_prefill = length > 1 and key.shape[2] == length and not module.training
    if not is_prefill or length <= settings.min_tokens + settings.window or settings.tau <= 0:
        if is_prefill:
            _count(module, length * query.shape[0], length * query.shape[0])
        return base(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    rows = []
    for b in range(query.shape[0]):
        q, k, v = query[b : b + 1], key[b : b + 1], value[b : b + 1]
        mask = None if attention_mask is None else attention_mask[b : b + 1]
        kept = select_tokens(window_scores(q, k, settings.window, scale, mask)[0], settings, length)
        module.token_sparse_last = kept  # type: ignore[assignment]  # for inspection and tests
        if kept is None:
            rows.append(base(module, q, k, v, mask, scaling=scaling, dropout=dropout, **kwargs)[0])
            _count(module, length, length)
        else:
            rows.append(gathered_attention(q, k, v, kept, scale, mask))
            _count(module, kept.shape[1], length)
    return torch.cat(rows, dim=0), None


def _count(module: torch.nn.Module, kept: int, total: int) -> None:
    counts = getattr(module, "token_sparse_counts", None)
    if counts is None:
        counts = [0, 0]
        module.token_sparse_counts = counts  # type: ignore[assignment]
    counts[0] += kept
    counts[1] += total


def register_attention() -> None:
    """Make our function known to transformers (idempotent). Done by install(), and at import in a process that
    already has transformers loaded: a driver that only lists plugins never imports transformers for it (~6 s)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, token_sparse_attention_forward)


def install(model: torch.nn.Module, settings: SparseSettings, first_layer: int) -> list[int]:
    """Swap the attention function of decoder layers ``first_layer``.. to the token-sparse one; return them."""
    register_attention()
    chosen = []
    for index, layer in enumerate(decoder_layers(model)):
        if index < first_layer:
            continue
        attn = layer.self_attn
        previous = getattr(attn, "token_sparse", None)
        base = previous.base if previous is not None else (attn.config._attn_implementation or "sdpa")
        attn.config = copy.copy(attn.config)  # this layer's own config: only it dispatches to us
        attn.config._attn_implementation = ATTENTION_NAME
        attn.token_sparse = SparseSettings(settings.tau, settings.window, settings.min_tokens, settings.kernel_size, base)
        attn.token_sparse_counts = [0, 0]
        chosen.append(index)
    return chosen


class TokenSparseAttention(Method):
    """Drop the lowest-attention tokens (up to ``tau`` of the mass) from prefill attention in later layers."""

    name = "token_sparse_attention"
    metrics = ("attn_kept_frac",)
    causal = False  # the prefill keeps the tokens the prompt's last `window` queries score: earlier positions see that choice
    kind = "decoding"
    paper = PAPER
    cost_is = "real"

    def search_space(self) -> dict[str, Any]:
        return {
            "tau": FloatDistribution(0.0, 0.5),
            "window": CategoricalDistribution([32, 64, 128]),
            "first_sparse_layer": IntDistribution(0, 29),
        }

    def defaults(self) -> dict[str, Any]:
        return {"tau": 0.005, "window": 128, "min_tokens": 1024, "kernel_size": 7}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        n_layers = len(decoder_layers(subject.model))
        first = int(p.get("first_sparse_layer", n_layers // 2))
        tau, window, min_tokens, kernel = float(p["tau"]), int(p["window"]), int(p["min_tokens"]), int(p["kernel_size"])
        if not 0.0 <= tau < 1.0:
            raise ConfigError(f"token_sparse_attention.tau must be in [0, 1) (share of attention mass to drop), got {tau}")
        if window < 1:
            raise ConfigError(f"token_sparse_attention.window must be >= 1 (scoring queries), got {window}")
        if min_tokens < 0:
            raise ConfigError(f"token_sparse_attention.min_tokens must be >= 0, got {min_tokens}")
        if kernel < 1 or kernel % 2 == 0:
            raise ConfigError(f"token_sparse_attention.kernel_size must be an odd number >= 1 (smoothing width), got {kernel}")
        if not 0 <= first < n_layers:
            raise ConfigError(
                f"token_sparse_attention.first_sparse_layer must be between 0 and {n_layers - 1} "
                f"(the model has {n_layers} layers), got {first}"
            )
        settings = SparseSettings(tau, window, min_tokens, kernel, base="")
        layers = install(subject.model, settings, first)
        subject.info["token_sparse_attention"] = {"layers": layers, "tau": tau, "window": window, "min_tokens": min_tokens}
        return subject

    def evaluate(self, subject: Subject, ctx: TrialContext) -> dict[str, float]:
        kept = total = 0
        for layer in decoder_layers(subject.model):
            counts = getattr(layer.self_attn, "token_sparse_counts", None)
            if counts and getattr(layer.self_attn, "token_sparse", None) is not None:
                kept, total = kept + counts[0], total + counts[1]
        return {"attn_kept_frac": kept / total} if total else {}


if "transformers.modeling_utils" in sys.modules:  # a process with models (a Ray worker): known at once; install() registers anyway
    register_attention()


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(TokenSparseAttention())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    register(
        Metric("attn_kept_frac", "fraction", "minimize", "token sparse attention: share of tokens entering attention in its sparse layers at prefill")
    )

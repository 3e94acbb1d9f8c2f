"""The batched, KV-cached decode loop under every generator: rows of different lengths in one batch.

A :class:`BatchDecoder` holds one KV cache for a batch of rows. Prompts of different lengths are
left-padded; the attention mask hides the padding and each row's position ids count only its
real tokens, so a row decodes exactly as it would alone (up to float rounding of the batched
matmuls). Rows can be dropped (finished or pruned branches stop costing compute), repeated (one
prefill shared by N sampled branches), and the cache can be rolled back to an earlier length
(probe a branch for an answer, then continue it as if the probe never happened).

:class:`TokenChooser` picks the next token per row: greedy, or seeded temperature / top-p
sampling with one random stream per row, so a branch's tokens do not depend on which other
rows share its batch.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from paretolab.errors import ConfigError
from paretolab.generation.lean import LeanCache, lean_enabled, lean_forward, lean_supported
from paretolab.plugin_api.subject import synchronize


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen. ``temperature == 0`` is greedy (argmax)."""

    temperature: float = 0.0
    top_p: float = 1.0  # nucleus: sample from the smallest set of tokens holding this much probability
    seed: int = 0  # row i draws from its own stream seeded with (seed, i)

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ConfigError(f"sampling temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"sampling top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class TokenChooser:
    """Next-token choice for rows identified by a stable row id (their index in the first batch)."""

    def __init__(self, sampling: Sampling, rows: int) -> None:
        self.sampling = sampling
        self._streams = [] if sampling.greedy else [
            torch.Generator(device="cpu").manual_seed(sampling.seed * 1_000_003 + i) for i in range(rows)
        ]  # CPU streams: a row draws the same numbers whatever device the model is on

    def choose(self, logits: torch.Tensor, row_ids: Sequence[int]) -> torch.Tensor:
        """(B,) next ids from last-position logits (B, V); ``row_ids[b]`` names row b's stream."""
        if self.sampling.greedy:
            return logits.argmax(-1)
        probs = torch.softmax(logits.double() / self.sampling.temperature, dim=-1)
        sorted_p, order = probs.sort(dim=-1, descending=True)
        cum = sorted_p.cumsum(-1)
        # keep a token while the mass before it is < top_p (the top token is always kept)
        sorted_p = torch.where(cum - sorted_p < self.sampling.top_p, sorted_p, torch.zeros_like(sorted_p))
        cum = sorted_p.cumsum(-1)
        u = torch.cat([torch.rand(1, generator=self._streams[r], dtype=torch.float64, device="cpu") for r in row_ids]).to(cum.device)
        pick = torch.searchsorted(cum, (u * cum[:, -1]).unsqueeze(-1)).clamp_max(cum.shape[-1] - 1)
        return order.gather(-1, pick).squeeze(-1)


@lru_cache(maxsize=32)
def _cache_argument(forward: Any) -> str:
    # transformers 5.2x renamed `past_key_values` to `cache`; accept both releases.
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


@lru_cache(maxsize=32)
def _keeps_logits(forward: Any) -> str | None:
    # `logits_to_keep` (transformers >= 4.50), `num_logits_to_keep` before it; None: the model computes all
    params = inspect.signature(forward).parameters
    return next((name for name in ("logits_to_keep", "num_logits_to_keep") if name in params), None)


def forward_with_cache(model: torch.nn.Module, input_ids: torch.Tensor, cache: Any = None, *, last_only: bool = False,
                       lean: bool = True, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """One cached forward step: (logits, new cache). ``last_only``: logits of the last position only (B, 1, V).

    A prefill that needs one next token should not pay the LM head (and its (B, T, V) output) for
    every prompt position: at 2.7k tokens of SmolLM2 that is ~530 MB of fp32 logits.

    One unpadded sequence of a model :func:`~paretolab.generation.lean.lean_supported` accepts
    takes :func:`~paretolab.generation.lean.lean_forward` (the same arithmetic with less Python per
    layer; its cache is a :class:`~paretolab.generation.lean.LeanCache`, which a later call continues).
    ``lean=False`` keeps transformers' forward and cache (a caller that inspects the cache's layers).
    """
    if isinstance(cache, LeanCache) or (
            lean and cache is None and not kwargs and input_ids.shape[0] == 1 and lean_enabled() and lean_supported(model)):
        return lean_forward(model, input_ids, cache, last_only=last_only)
    name = _cache_argument(type(model).forward)
    if cache is not None:
        kwargs[name] = cache
    keep = _keeps_logits(type(model).forward) if last_only else None
    if keep:
        kwargs[keep] = 1
    out = model(input_ids=input_ids, use_cache=True, **kwargs)
    new_cache = out.get("cache") if "cache" in out else out.get("past_key_values")
    return out.logits, new_cache


class BatchDecoder:
    """One KV cache over a batch of left-padded rows; tokens go in, last-position logits come out."""

    def __init__(self, model: torch.nn.Module, *, pad_id: int = 0, single: bool = False) -> None:
        self.model = model
        self.pad_id = pad_id
        self.single = single  # one row, never repeated: no padding, so no mask to pass (and the lean forward where the model allows)
        self.device = next(model.parameters()).device
        self.cache: Any = None
        self.mask = torch.zeros((0, 0), dtype=torch.long, device=self.device)  # (B, L) 1 = real token
        self.prefill_s = 0.0
        self.decode_s = 0.0

    @property
    def rows(self) -> int:
        return self.mask.shape[0]

    @property
    def length(self) -> int:
        """Cache length in positions (padding included)."""
        return self.mask.shape[1]

    @torch.no_grad()
    def prefill(self, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
        """Start a batch from ``prompts`` (left-padded); returns last-position logits (B, V)."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ConfigError("every prompt needs at least one token")
        if self.single and len(prompts) != 1:
            raise ConfigError(f"BatchDecoder(single=True) decodes one prompt, got {len(prompts)}; make it without single for a batch")
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long, device=self.device)
        self.mask = torch.zeros_like(ids)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt):] = torch.tensor(list(prompt), dtype=torch.long, device=self.device)
            self.mask[row, width - len(prompt):] = 1
        self.cache = None
        start = time.perf_counter()
        logits = self._forward(ids)
        synchronize(self.device)  # timers hold the GPU's time, not the launch's
        self.prefill_s += time.perf_counter() - start
        return logits

    @torch.no_grad()
    def extend(self, ids: torch.Tensor) -> torch.Tensor:
        """Feed (B, k) tokens to every row; returns the logits after the last of them (B, V)."""
        if ids.dim() == 1:
            ids = ids.unsqueeze(1)
        self.mask = torch.cat([self.mask, torch.ones_like(ids)], dim=1)
        start = time.perf_counter()
        logits = self._forward(ids)
        synchronize(self.device)
        self.decode_s += time.perf_counter() - start
        return logits

    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.single:
            logits, self.cache = forward_with_cache(self.model, ids, self.cache, last_only=True)
            return logits[:, -1].float()
        k = ids.shape[1]
        positions = (self.mask.cumsum(-1) - 1).clamp_min(0)[:, -k:]  # real tokens before each new one
        logits, self.cache = forward_with_cache(
            self.model, ids, self.cache, attention_mask=self.mask, position_ids=positions, last_only=True
        )
        return logits[:, -1].float()

    def select(self, rows: Sequence[int]) -> None:
        """Keep only ``rows`` (in this order); dropped rows cost nothing from now on."""
        index = torch.tensor(list(rows), dtype=torch.long, device=self.device)
        self.mask = self.mask.index_select(0, index)
        if self.cache is not None:
            self.cache.batch_select_indices(index)
        # drop columns that are padding in every remaining row (long-finished neighbours' prompts)
        real = self.mask.any(0).nonzero()
        first = int(real[0]) if real.numel() else 0
        if first > 0:
            self.mask = self.mask[:, first:]
            _crop_front(self.cache, first)

    def repeat(self, times: int) -> None:
        """Repeat every row ``times`` times in place (row r becomes rows r*times .. r*times+times-1)."""
        if self.single:
            raise ConfigError("BatchDecoder(single=True) decodes one row; repeat() needs a decoder made without single")
        self.mask = self.mask.repeat_interleave(times, dim=0)
        if self.cache is not None:
            self.cache.batch_repeat_interleave(times)

    def rollback(self, length: int) -> None:
        """Forget every position after the first ``length`` (the cache as it was at that length)."""
        if length < self.length:
            # a negative crop removes that many positions in transformers 4.x and 5.x alike
            self.cache.crop(length - self.length)
            self.mask = self.mask[:, :length]


def _crop_front(cache: Any, n: int) -> None:
    """Drop the first ``n`` positions of every layer of a DynamicCache (they are padding everywhere)."""
    for layer in getattr(cache, "layers", []):
        if hasattr(layer, "crop_front"):  # a layer that keeps no keys per position (a recurrent state) crops itself
            layer.crop_front(n)
            continue
        if getattr(layer, "keys", None) is not None and layer.keys.numel():
            layer.keys = layer.keys[..., n:, :]
            layer.values = layer.values[..., n:, :]

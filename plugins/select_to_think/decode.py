"""The Select-to-Think step loop over two loaded models that share a tokenizer, one prompt at a time.

The small model decodes greedily. At each step a trigger scores the step; when it fires, the large
model is asked: under ``guide="select"`` (S2T) it picks the best of the small model's top-``k``
candidates by its own logits; under ``guide="takeover"`` (the paper's controlled baseline) it picks
its own argmax over the whole vocabulary. ``large_only`` decodes with the large model alone.

The paper's (Ye et al., ICML 2026; YeRona/Select-to-Think ``scripts/evaluate_s2t.py``): both
triggers are computed on the small model's top-``support`` tokens (64 there) with its probabilities
renormalised on them: ``entropy`` of that distribution, or ``kl`` = KL(small || large) with the large
model's probabilities read on the same ids and renormalised; a trigger fires when its score exceeds a
threshold calibrated as a quantile (0.95 there) of the scores seen while the small model decodes a
calibration split greedily; no trigger in the first ``warmup`` steps (3 there); candidates are the
top-``k`` (16 there) or, with ``k=0`` there, those with p >= 0.1 * max (not implemented here).

Ours: the large model is called lazily — it keeps its own KV cache and, when asked, takes every token
it has not seen yet (the prompt on its first call) in one forward pass, so ``large_calls`` counts its
forward passes and ``large_tokens`` the tokens they processed. The KL trigger needs the large model's
distribution at every step after the warm-up, so under ``kl`` the large model runs at every step
(as in the paper's code, where the teacher steps in lockstep): it saves no large calls, and we count
them. ``always`` (fires every step) and ``none`` (never) are ours, for tests and the small-greedy
baseline. Ties in argmax go to the lower index (torch's rule), so ``k=1`` selection is small greedy.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from paretolab.errors import ConfigError
from paretolab.generation.decoding import forward_with_cache
from paretolab.plugin_api.subject import synchronize

TRIGGERS = ("entropy", "kl", "always", "none")
GUIDES = ("select", "takeover")


@dataclass(frozen=True)
class S2TSettings:
    """How one S2T decode runs (``threshold`` is the calibrated trigger level; ``inf`` never fires)."""

    trigger: str = "entropy"
    threshold: float = math.inf
    guide: str = "select"
    k: int = 8  # candidates the large model chooses among (the small model's top-k)
    support: int = 64  # top tokens the trigger scores are computed on (the paper's student_top_k)
    warmup: int = 0  # first steps in which the trigger never fires

    def __post_init__(self) -> None:
        if self.trigger not in TRIGGERS:
            raise ConfigError(f"select_to_think.trigger must be one of {', '.join(TRIGGERS)}; got {self.trigger!r}")
        if self.guide not in GUIDES:
            raise ConfigError(f"select_to_think.guide must be one of {', '.join(GUIDES)}; got {self.guide!r}")
        if self.k < 1 or self.support < 1 or self.warmup < 0:
            raise ConfigError(f"select_to_think needs k >= 1, support >= 1, warmup >= 0; got k={self.k}, support={self.support}, warmup={self.warmup}")

    @property
    def scores_need_large(self) -> bool:
        return self.trigger == "kl"


@dataclass
class Decoded:
    """One prompt's continuation and what it cost each model."""

    tokens: list[int]
    small_calls: int = 0  # forward passes of the small model
    small_tokens: int = 0  # tokens those passes processed (prompt included)
    large_calls: int = 0
    large_tokens: int = 0
    large_s: float = 0.0  # seconds in the large model's forward passes (part of prefill_s + decode_s)
    fired: int = 0  # steps at which the trigger fired
    flipped: int = 0  # fired steps whose token differs from the small model's greedy one
    scores: list[float] = field(default_factory=list)  # trigger score per step after warm-up (for calibration)
    prefill_s: float = 0.0
    decode_s: float = 0.0


class LazyModel:
    """A model that sees a token stream but runs only when asked, taking all unseen tokens in one pass."""

    def __init__(self, model: torch.nn.Module, prompt: Sequence[int]) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.pending: list[int] = list(prompt)
        self.cache: object = None
        self.logits: torch.Tensor | None = None  # (V,) after the last token fed
        self.calls = 0
        self.tokens = 0
        self.seconds = 0.0

    def push(self, token: int) -> None:
        self.pending.append(token)
        self.logits = None

    @torch.no_grad()
    def next_logits(self) -> torch.Tensor:
        """Next-token logits (V,) after every token pushed so far (one forward pass when any is unseen)."""
        if self.logits is None:
            start = time.perf_counter()
            ids = torch.tensor([self.pending], dtype=torch.long, device=self.device)
            out, self.cache = forward_with_cache(self.model, ids, self.cache, last_only=True)
            self.logits = out[0, -1].float()
            synchronize(self.device)
            self.seconds += time.perf_counter() - start
            self.calls += 1
            self.tokens += len(self.pending)
            self.pending = []
        return self.logits


def trigger_score(trigger: str, small_logits: torch.Tensor, support_ids: torch.Tensor, large_logits: torch.Tensor | None) -> float:
    """The paper's score on the small model's top-``support`` ids: entropy of its renormalised probs, or KL(small || large)."""
    p = torch.softmax(small_logits[support_ids].double(), dim=-1)  # renormalised on the support
    if trigger == "entropy":
        return float(-(p * p.clamp_min(1e-12).log()).sum())
    if trigger == "kl":
        assert large_logits is not None
        q = torch.softmax(large_logits.double(), dim=-1)[support_ids]
        keep = q > 1e-12
        if not bool(keep.any()):
            return 0.0
        p, q = p[keep] / p[keep].sum(), q[keep] / q[keep].sum()
        return float((p * (p.clamp_min(1e-12) / q.clamp_min(1e-12)).log()).sum())
    return math.inf if trigger == "always" else -math.inf


@torch.no_grad()
def s2t_decode(small: torch.nn.Module, large: torch.nn.Module | None, prompt: Sequence[int], settings: S2TSettings, *,
               max_new_tokens: int, stop_ids: Sequence[int] = ()) -> Decoded:
    """Decode ``prompt`` with the small model, asking the large one at the steps the trigger picks."""
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    uses_large = settings.trigger != "none"
    if uses_large and large is None:
        raise ConfigError(f"select_to_think.trigger={settings.trigger!r} needs a large model")
    stop = set(stop_ids)
    start = time.perf_counter()
    device = next(small.parameters()).device
    logits, cache = forward_with_cache(small, torch.tensor([list(prompt)], dtype=torch.long, device=device), last_only=True)
    out = Decoded([], small_calls=1, small_tokens=len(prompt))
    lazy = LazyModel(large, prompt) if uses_large and large is not None else None
    support = min(settings.support, logits.shape[-1])
    first_token_at: float | None = None
    for step in range(max_new_tokens):
        small_logits = logits[0, -1].float()
        top_ids = small_logits.topk(support).indices  # descending; top_ids[0] is small greedy
        token = int(top_ids[0])
        if lazy is not None and step >= settings.warmup:
            large_logits = lazy.next_logits() if settings.scores_need_large else None
            score = trigger_score(settings.trigger, small_logits, top_ids, large_logits)
            out.scores.append(score)
            if settings.trigger == "always" or score > settings.threshold:
                large_logits = lazy.next_logits()
                if settings.guide == "select":
                    candidates = top_ids[: settings.k]
                    token = int(candidates[int(large_logits[candidates].argmax())])
                else:
                    token = int(large_logits.argmax())
                out.fired += 1
                out.flipped += int(token != int(top_ids[0]))
        out.tokens.append(token)
        if first_token_at is None:
            first_token_at = time.perf_counter()
        if token in stop or len(out.tokens) >= max_new_tokens:
            break
        if lazy is not None:
            lazy.push(token)
        logits, cache = forward_with_cache(small, torch.tensor([[token]], dtype=torch.long, device=device), cache, last_only=True)
        out.small_calls += 1
        out.small_tokens += 1
    if lazy is not None:
        out.large_calls, out.large_tokens, out.large_s = lazy.calls, lazy.tokens, lazy.seconds
    out.prefill_s = (first_token_at or start) - start
    out.decode_s = time.perf_counter() - (first_token_at or start)
    return out


@torch.no_grad()
def large_only_decode(large: torch.nn.Module, prompt: Sequence[int], *, max_new_tokens: int, stop_ids: Sequence[int] = ()) -> Decoded:
    """Greedy decoding with the large model alone (the ``large only`` baseline), counted like S2T's large calls."""
    decoded = s2t_decode(large, None, prompt, S2TSettings(trigger="none"), max_new_tokens=max_new_tokens, stop_ids=stop_ids)
    decoded.large_calls, decoded.large_tokens = decoded.small_calls, decoded.small_tokens
    decoded.large_s = decoded.prefill_s + decoded.decode_s
    decoded.small_calls = decoded.small_tokens = 0
    return decoded


def calibrate_threshold(scores: Sequence[float], quantile: float) -> float:
    """The paper's threshold: the ``quantile`` of the trigger scores seen on the calibration split."""
    if not 0.0 <= quantile <= 1.0:
        raise ConfigError(f"select_to_think.quantile must be in [0, 1], got {quantile}")
    finite = [s for s in scores if math.isfinite(s)]
    if not finite:
        raise ConfigError("select_to_think: the calibration split gave no trigger scores (every decode ended within the warm-up?)")
    return float(torch.quantile(torch.tensor(finite, dtype=torch.float64, device="cpu"), quantile))

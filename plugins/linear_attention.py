"""Attention surgery to linear attention with a matrix state: Kalman linear attention (``kalman_attention``) and GLA (``gla``).

``kalman_attention`` — "Kalman Linear Attention: Parallel Bayesian Filtering For Efficient Language
Modelling and State Tracking" (Shaj, Barker, Scannell, Szecsenyi, Crowley, Storkey;
https://arxiv.org/abs/2602.10743; official code github.com/vaisakh-shaj/kalman-linear-attention,
``src/kla/ops/kla_ops.py`` and ``src/kla/layers/kla_layer.py``, read, not copied). The paper's, as
their code does it: every (state s, channel m) pair carries a scalar Kalman filter in information
form, precision λ and information η = λ·mean. Per token, the observation precision Λᵛ = 1/σ²ᵥ
(σ²ᵥ = softplus(·) + 1e-4, projected from the input), φ = Λᵛ_m·k_s², r = Λᵛ_m·v_m·k_s; predict
λ⁻ = λ/(a² + pλ), η⁻ = a·η/(a² + pλ); update λ = λ⁻ + φ, η = η⁻ + r; read out
y_m = Σ_s q_s·η_{s,m}/λ_{s,m}. The precision recursion is a Möbius map, composed by an associative
scan (trace-normalised 2×2 products), and η is then an affine scan whose gain a/(a² + pλ_{t−1})
comes from the precisions: the Kalman gain replaces GLA's learned forget gate. a and p are static
per (s, m): a = exp(Δ·a_c), a_c = −exp(λ_log) (init −1), Δ = softplus(·) (init log-uniform in
[1e-3, 0.1]), p discretised as an Ornstein–Uhlenbeck process (p_c init 0.01); prior λ₀ = 1,
η₀ = 0; q and k are L2-normalised; the output is gated by silu(x·W_g) and gets a learned scalar
skip (init −1) of the values — all the official defaults.

Ours (adaptation to a Llama attention slot, and guesses): the paper's layer is a Mamba-style block
(one head: d_inner channels, d_state 16, a short causal conv, in/out projections); here it takes
the place of each self-attention with its heads: per head the state is head_dim × head_dim (keys ×
values), q/k/v/o are the attention's own projections, and the conv is left out. Λᵛ comes from a
rank-``rank`` bottleneck of the input (the official ``var_rank="dt"`` option; its default is full
rank). ``tied`` (default true, ours, for CPU cost) shares each key row's filter across the value
channels (a, p per key; one Λᵛ per head and token), so the precisions are [B, H, T, d] and η runs
through GLA's chunkwise form with the Kalman gain as its gate; ``tied: false`` is the paper's
per-(key, value) filter (an elementwise scan with a state per token, ~15× slower here). The
parallel scans are ours in PyTorch (:mod:`paretolab.plugins._scan`: a blocked associative scan
for the Möbius precisions, the chunkwise gated form for η), not their Triton/CUDA kernels;
decoding runs the textbook predict/update recurrence on a cached state
(:mod:`paretolab.plugins._recurrent_cache`). Left padding leaves the state unchanged (an
identity step), so batched rows decode as they would alone.

``gla`` — Gated Linear Attention (Yang, Wang, Shen, Panda, Kim, "Gated Linear Attention
Transformers with Hardware-Efficient Training", ICML 2024, https://arxiv.org/abs/2312.06635):
S_t = diag(α_t)·S_{t−1} + k_tᵀv_t, o_t = q_t·S_t/√d_k, α_t = sigmoid(x·W₁W₂ + b)^{1/16} (low rank),
per-head RMSNorm of o, output gate silu(x·W_g). It runs on the same attention slot, the same scan
code and cache as ``kalman_attention``; its gate rank is solved so that both have the same number
of parameters (within one rank step; ``rank: 0``). Softmax attention is method ``none`` (it has
no gates, so fewer parameters: say so beside any comparison).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from optuna.distributions import CategoricalDistribution

from paretolab import Method, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.plugin_api.subject import Subject
from paretolab.plugins._layerwise import decoder_layers
from paretolab.plugins._recurrent_cache import recurrent_layer
from paretolab.plugins._scan import (
    AFFINE,
    EPS,
    MOBIUS,
    blocked_scan,
    gated_chunk_attention,
)
from paretolab.plugins.kv_sharing import _attentions

KLA_PAPER = Paper("Kalman Linear Attention: Parallel Bayesian Filtering For Efficient Language Modelling and State Tracking", "arXiv 2026",
                  "https://arxiv.org/abs/2602.10743")
GLA_PAPER = Paper("Gated Linear Attention Transformers with Hardware-Efficient Training", "ICML 2024", "https://arxiv.org/abs/2312.06635")
State = tuple[torch.Tensor, ...]


def _mask(valid: torch.Tensor | None, like: torch.Tensor, value: float, keep: torch.Tensor) -> torch.Tensor:
    """``keep`` where the token is real, ``value`` (the identity step) where it is padding; ``valid`` is (B, T) or None."""
    if valid is None:
        return keep
    m = valid.view(valid.shape[0], 1, valid.shape[1], *([1] * (like.dim() - 3)))
    return torch.where(m, keep, torch.as_tensor(value, dtype=keep.dtype, device=keep.device))


class GLACell(torch.nn.Module):
    """GLA's gate, state update and read-out for heads of q/k/v ``[B, H, T, d]``."""

    TAU = 16.0  # the paper's gate temperature: α = sigmoid(·)^(1/τ)

    def __init__(self, hidden: int, heads: int, head_dim: int, rank: int, *, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.gate_down = torch.nn.Linear(hidden, rank, bias=False, device=device, dtype=dtype)
        self.gate_up = torch.nn.Linear(rank, heads * head_dim, bias=True, device=device, dtype=dtype)
        self.norm_weight = torch.nn.Parameter(torch.ones(head_dim, device=device, dtype=dtype))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.norm_weight.fill_(1.0)

    def initial(self, batch: int, like: torch.Tensor) -> State:
        return (torch.zeros(batch, self.heads, self.head_dim, self.head_dim, device=like.device, dtype=like.dtype),)

    def _inputs(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, valid: torch.Tensor | None) -> State:
        """(scaled q, k with padding zeroed, log α with padding 0): padding is an identity step."""
        b, h, t, d = q.shape
        log_a = F.logsigmoid(self.gate_up(self.gate_down(x))).view(b, t, h, d).transpose(1, 2) / self.TAU
        return q * d ** -0.5, _mask(valid, k, 0.0, k), _mask(valid, k, 0.0, log_a)

    def _norm(self, o: torch.Tensor) -> torch.Tensor:
        return o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5) * self.norm_weight

    def scan(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor | None,
             state: State | None, chunk: int) -> tuple[torch.Tensor, State]:
        q, k, log_a = self._inputs(x, q, k, valid)
        (s0,) = state if state is not None else self.initial(q.shape[0], q)
        o, s = gated_chunk_attention(q, k, v, log_a, s0, chunk)
        return self._norm(o), (s,)

    def step(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor | None,
             state: State) -> tuple[torch.Tensor, State]:
        """One token (T = 1): S ← diag(α)·S + kᵀv, o = q·S."""
        q, k, log_a = (t[:, :, 0] for t in self._inputs(x, q, k, valid))
        (s0,) = state
        s = log_a.exp().unsqueeze(-1) * s0 + k.unsqueeze(-1) * v[:, :, 0].unsqueeze(-2)
        return self._norm(torch.einsum("bhi,bhij->bhj", q, s)).unsqueeze(2), (s,)


class KalmanCell(torch.nn.Module):
    """KLA's Kalman filter in information form for heads of q/k/v ``[B, H, T, d]`` (see the module docstring).

    ``tied=False`` is the paper's filter: one per (key s, value m) with its own a, p and a per-value-channel
    observation precision. ``tied=True`` (ours, for CPU cost) shares the filter across the value channels
    of a key row: a, p per (head, s) and one observation precision per head and token, so λ is
    [B, H, T, d] instead of [B, H, T, d, d] and η runs through GLA's chunkwise form with the Kalman gain
    as its gate, without a state per token.
    """

    DT_MIN, DT_MAX, DT_FLOOR = 1e-3, 0.1, 1e-4  # the official Δ initialisation range
    PROCESS_NOISE = 0.01  # the official initial continuous process noise
    OBS_VAR_MIN = 1e-4  # floor of the observation variance σ²ᵥ
    SKIP_INIT = -1.0

    def __init__(self, hidden: int, heads: int, head_dim: int, rank: int, *, tied: bool, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.heads, self.head_dim, self.tied = heads, head_dim, tied
        self.noise_down = torch.nn.Linear(hidden, rank, bias=False, device=device, dtype=dtype)
        self.noise_up = torch.nn.Linear(rank, heads if tied else heads * head_dim, bias=True, device=device, dtype=dtype)
        shape = (heads, head_dim, 1) if tied else (heads, head_dim, head_dim)  # [H, key/state s, value/channel m]
        self.dt = torch.nn.Parameter(torch.empty(shape, device=device, dtype=dtype))  # softplus⁻¹ of Δ
        self.lambda_log = torch.nn.Parameter(torch.empty(shape, device=device, dtype=dtype))  # a_c = −exp(λ_log)
        self.process_noise = torch.nn.Parameter(torch.empty(shape, device=device, dtype=dtype))
        self.skip = torch.nn.Parameter(torch.empty((), device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            u = torch.rand(self.dt.shape, device=self.dt.device, dtype=self.dt.dtype)
            dt = torch.exp(u * (math.log(self.DT_MAX) - math.log(self.DT_MIN)) + math.log(self.DT_MIN)).clamp_min(self.DT_FLOOR)
            self.dt.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus(this) = dt
            self.lambda_log.zero_()
            self.process_noise.fill_(self.PROCESS_NOISE)
            self.skip.fill_(self.SKIP_INIT)

    def dynamics(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Discrete decay a and process noise p, [1, H, 1, d, d or 1] (Ornstein–Uhlenbeck discretisation, the official default)."""
        rate = torch.exp(self.lambda_log).clamp_min(1e-8)  # −a_c
        dt = F.softplus(self.dt) + 1e-7
        a = torch.exp(-dt * rate)
        p = self.process_noise.clamp_min(1e-7) / (2.0 * rate) * (-torch.expm1(-2.0 * rate * dt))
        return a[None, :, None], p[None, :, None]

    def initial(self, batch: int, like: torch.Tensor) -> State:
        d = self.head_dim
        shape = (batch, self.heads, d, 1 if self.tied else d)
        return (torch.ones(shape, device=like.device, dtype=like.dtype),
                torch.zeros(batch, self.heads, d, d, device=like.device, dtype=like.dtype))

    def _leaves(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor | None) -> State:
        """(q, φ, k, Λᵛ·v): φ = Λᵛ·k² is [B, H, T, d, d or 1]; padding gets φ = 0 and k = 0 (an identity step)."""
        b, h, t, d = q.shape
        var = F.softplus(self.noise_up(self.noise_down(x))).view(b, t, h, -1).transpose(1, 2) + self.OBS_VAR_MIN
        precision = 1.0 / var  # Λᵛ, [B, H, T, d or 1]
        k = _mask(valid, k, 0.0, F.normalize(k, dim=-1))
        phi = (k * k).unsqueeze(-1) * precision.unsqueeze(-2)
        return F.normalize(q, dim=-1), phi, k, v * precision

    def _precisions(self, phi: torch.Tensor, lam0: torch.Tensor, valid: torch.Tensor | None, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(λ_t, λ_{t−1}) for every t by the Möbius scan: λ_t = (A·λ + B)/(C·λ + D), A = (1 + pφ)/a², B = φ, C = p/a², D = 1
        (predict then update as one map; padding is the identity map)."""
        a, p = self.dynamics()
        a2 = (a * a).clamp_min(EPS)
        leaves = (_mask(valid, phi, 1.0, (1.0 + p * phi) / a2), phi, _mask(valid, phi, 0.0, (p / a2).expand_as(phi)), torch.ones_like(phi))
        pa, pb, pc, pd = blocked_scan(MOBIUS, leaves, chunk)
        l0 = lam0.unsqueeze(2)
        lam = (pa * l0 + pb) / (pc * l0 + pd).clamp_min(EPS)
        return lam, torch.cat([l0, lam[:, :, :-1]], dim=2)

    def scan(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor | None,
             state: State | None, chunk: int) -> tuple[torch.Tensor, State]:
        q, phi, k, pv = self._leaves(x, q, k, v, valid)
        lam0, eta0 = state if state is not None else self.initial(q.shape[0], q)
        a, p = self.dynamics()
        lam, lam_prev = self._precisions(phi, lam0, valid, chunk)
        log_gain = torch.log(a) - torch.log((a * a).clamp_min(EPS) + p * lam_prev)  # η's multiplier a/(a² + pλ_{t−1}), a real step
        if self.tied:  # one gain per key row: GLA's chunkwise form with the gain as gate, read out with q/λ
            log_gain = _mask(valid, k, 0.0, log_gain.squeeze(-1))
            y, eta = gated_chunk_attention(q / lam.squeeze(-1), k, pv, log_gain, eta0, chunk)
        else:  # the paper's per-(key, value) filter: an elementwise affine scan of η, one state per token
            gain = _mask(valid, phi, 1.0, log_gain.exp())
            pg, pr = blocked_scan(AFFINE, (gain, k.unsqueeze(-1) * pv.unsqueeze(-2)), chunk)
            etas = pg * eta0.unsqueeze(2) + pr
            y, eta = torch.einsum("bhti,bhtij->bhtj", q, etas / lam), etas[:, :, -1]
        return y + self.skip * v, (lam[:, :, -1], eta)

    def step(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor | None,
             state: State) -> tuple[torch.Tensor, State]:
        """One token (T = 1): Kalman predict (λ⁻ = λ/(a² + pλ), η⁻ = aη/(a² + pλ)), then update (λ = λ⁻ + φ, η = η⁻ + k·Λᵛv)."""
        q, phi, k, pv = (t[:, :, 0] for t in self._leaves(x, q, k, v, valid))
        a, p = (t[:, :, 0] for t in self.dynamics())
        lam0, eta0 = state
        denom = (a * a).clamp_min(EPS) + p * lam0
        lam = lam0 / denom + phi
        eta = a * eta0 / denom + k.unsqueeze(-1) * pv.unsqueeze(-2)
        if valid is not None:  # padding: the state stays as it was
            keep = valid[:, 0].view(-1, 1, 1, 1)
            lam, eta = torch.where(keep, lam, lam0), torch.where(keep, eta, eta0)
        y = torch.einsum("bhi,bhij->bhj", q, eta / lam) + self.skip * v[:, :, 0]
        return y.unsqueeze(2), (lam, eta)


def valid_tokens(attention_mask: Any, length: int) -> torch.Tensor | None:
    """(B, T) bool: which of the T new tokens are real, read from the 4-D mask's last query row (None: all are)."""
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 4:
        raise ConfigError(f"linear attention: cannot read padding from a {type(attention_mask).__name__} mask; use attn_implementation sdpa or eager")
    row = attention_mask[:, 0, -1, -length:]  # the last query is a real token (left padding) and sees every real key
    valid = row if row.dtype == torch.bool else row == 0
    return None if bool(valid.all()) else valid


class LinearAttention(torch.nn.Module):
    """A Llama attention slot computed as linear attention with a matrix state: scan over a sequence, recurrence for one cached token."""

    def __init__(self, attention: torch.nn.Module, cell: torch.nn.Module, chunk: int) -> None:
        super().__init__()
        self.config = attention.config
        self.layer_idx = attention.layer_idx
        self.head_dim = attention.head_dim
        self.kv_groups = attention.num_key_value_groups
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj
        weight = attention.q_proj.weight
        self.g_proj = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype)  # output gate
        self.cell = cell
        self.chunk = chunk

    def forward(self, hidden_states: torch.Tensor, attention_mask: Any = None, past_key_values: Any = None, cache: Any = None,
                **kwargs: Any) -> tuple[torch.Tensor, None]:
        b, t, _ = hidden_states.shape

        def heads(x: torch.Tensor) -> torch.Tensor:
            return x.view(b, t, -1, self.head_dim).transpose(1, 2)

        q = heads(self.q_proj(hidden_states))
        k = heads(self.k_proj(hidden_states)).repeat_interleave(self.kv_groups, dim=1)
        v = heads(self.v_proj(hidden_states)).repeat_interleave(self.kv_groups, dim=1)
        valid = valid_tokens(attention_mask, t)
        store = cache if cache is not None else past_key_values
        layer = recurrent_layer(store, self.layer_idx) if store is not None else None
        state = layer.state if layer is not None else None
        if state is not None and t == 1:
            y, new = self.cell.step(hidden_states, q, k, v, valid, state)
        else:
            y, new = self.cell.scan(hidden_states, q, k, v, valid, state, self.chunk)
        if layer is not None:
            layer.advance(tuple(s.detach() for s in new), t)
        y = y.transpose(1, 2).reshape(b, t, -1) * F.silu(self.g_proj(hidden_states))
        return self.o_proj(y), None


def kalman_extra_params(hidden: int, heads: int, head_dim: int, rank: int, tied: bool) -> int:
    """Parameters a KalmanCell adds per layer: the Λᵛ bottleneck, three static [H, d, d or 1] tensors and the skip scalar."""
    width = 1 if tied else head_dim
    return hidden * rank + (rank + 1) * heads * width + 3 * heads * head_dim * width + 1


def gla_rank_matching(hidden: int, heads: int, head_dim: int, kalman_rank: int, tied: bool) -> int:
    """GLA's gate rank whose parameters come closest to a KalmanCell's (gate: hidden·r + r·H·d + H·d; norm: d)."""
    target = kalman_extra_params(hidden, heads, head_dim, kalman_rank, tied) - heads * head_dim - head_dim
    return max(1, round(target / (hidden + heads * head_dim)))


def replace_attention(subject: Subject, method: str, make_cell: Callable[..., torch.nn.Module], chunk: int, ctx: TrialContext) -> Subject:
    """Every decoder layer's self-attention becomes a :class:`LinearAttention` around ``make_cell(hidden, heads, head_dim, device=, dtype=)``.

    The new weights are drawn from the trial's seed (a ``train`` stage re-draws them from its own seed)."""
    if chunk < 1:
        raise ConfigError(f"{method}.chunk must be >= 1 (steps per scan block), got {chunk}")
    model = subject.model
    attentions = _attentions(model, method)
    devices = sorted({a.q_proj.weight.device for a in attentions if a.q_proj.weight.device.type == "cuda"}, key=str)
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=ctx.generator(), device="cpu"))
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for layer, attention in zip(decoder_layers(model), attentions):
            if isinstance(attention, LinearAttention):
                raise ConfigError(f"method {method!r}: layer {attention.layer_idx} is already linear attention; apply one of gla/kalman_attention")
            weight = attention.q_proj.weight
            heads = weight.shape[0] // attention.head_dim
            cell = make_cell(weight.shape[1], heads, attention.head_dim, device=weight.device, dtype=weight.dtype)
            layer.self_attn = LinearAttention(attention, cell, chunk)
    subject.info["attention"] = method
    return subject


def _int_param(params: dict[str, Any], key: str, method: str, low: int) -> int:
    value = params[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{method}.{key} must be an integer >= {low}, got {value!r}")
    return value


def _bool_param(params: dict[str, Any], key: str, method: str) -> bool:
    value = params[key]
    if not isinstance(value, bool):
        raise ConfigError(f"{method}.{key} must be true or false, got {value!r}")
    return value


class KalmanAttention(Method):
    """Replace every self-attention with Kalman linear attention (KLA): parallel scan in training/prefill, recurrence in decoding."""

    name = "kalman_attention"
    kind = "architecture"
    paper = KLA_PAPER
    cost_is = "real"  # the layer that runs is the one measured

    def search_space(self) -> dict[str, Any]:
        return {"rank": CategoricalDistribution([8, 16, 32])}

    def defaults(self) -> dict[str, Any]:
        # rank: the Λᵛ bottleneck (official "dt" rank = ceil(hidden/8): 16 at hidden 128); tied: see KalmanCell
        return {"rank": 16, "chunk": 16, "tied": True}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        rank, chunk, tied = _int_param(p, "rank", self.name, 1), _int_param(p, "chunk", self.name, 1), _bool_param(p, "tied", self.name)
        return replace_attention(subject, self.name, lambda hidden, heads, d, **kw: KalmanCell(hidden, heads, d, rank, tied=tied, **kw), chunk, ctx)


class GatedLinearAttention(Method):
    """Replace every self-attention with gated linear attention (GLA), at the parameter count of ``kalman_attention``."""

    name = "gla"
    kind = "architecture"
    paper = GLA_PAPER
    cost_is = "real"

    def defaults(self) -> dict[str, Any]:
        # rank 0: the gate rank giving kalman_attention(rank=match_rank, tied=match_tied)'s parameter count
        return {"rank": 0, "match_rank": 16, "match_tied": True, "chunk": 16}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        rank, match, chunk = (_int_param(p, "rank", self.name, 0), _int_param(p, "match_rank", self.name, 1),
                              _int_param(p, "chunk", self.name, 1))
        tied = _bool_param(p, "match_tied", self.name)

        def make(hidden: int, heads: int, d: int, **kw: Any) -> GLACell:
            return GLACell(hidden, heads, d, rank or gla_rank_matching(hidden, heads, d, match, tied), **kw)

        return replace_attention(subject, self.name, make, chunk, ctx)


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(KalmanAttention())
    register(GatedLinearAttention())

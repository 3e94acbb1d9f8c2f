"""Normalisation surgery on Pre-LN decoders: BHyT and DyT in place of RMSNorm, and a per-layer hidden-variance measure.

BHyT — "Bounded Hyperbolic Tanh" (MLAI-Yonsei, official code github.com/MLAI-Yonsei/BHyT,
``models/hf_src/llama/modeling_llama.py``, norm_type ``bhyt``). The paper's, as their code does it:
each block computes the statistic of its input once, var_x = mean(x²) over the hidden dimension
(fp32), rstd₁ = κ⁻¹·rsqrt(var_x + 1e-6) with κ = 10, and the input norm is γ·tanh(λ·rstd₁·x),
λ a learnable scalar (init 2), γ a learnable per-channel gain (init 1). The second (post-attention)
norm does not measure its input: it predicts its variance as var_x + c_attn·λ_in²·κ⁻² (λ_in the
input norm's λ, detached), with c_attn = ‖W_V W_O‖²_F / (T·d) (W_V expanded over GQA groups,
T the sequence length, d the hidden size), and applies γ·tanh(λ_post·rstd₂·h) with λ_post init 1.
c_attn is computed once from the weights and then kept fixed: before the first step of a ``train``
stage, with T = its seq_len (the official precompute with T = the training cutoff length), else at
the first forward pass with T = that pass's length (the official lazy path). The final norm stays
RMSNorm (their released configs use last_layer_lam = 0). Ours: the input norm hands its statistic
to the post-attention norm of the same layer through a reference (no decoder-layer subclass), so
any Pre-LN decoder with ``input_layernorm``/``post_attention_layernorm`` works; c_attn is a Python
float (no buffer), recomputed after ``reset_parameters()``; their CUDA-stream and fused decode paths
(speed only) are not implemented.

DyT — "Transformers without Normalization" (Zhu, Chen, He, LeCun, Liu, CVPR 2025,
https://arxiv.org/abs/2503.10622): every norm (both per layer and the final one) becomes
γ·tanh(α·x) + β, α a learnable scalar (init ``alpha``, the paper's default 0.5; its LLaMA runs tune a
separate α₀ per width and add a scalar after the embedding, not done here), γ ones, β zeros.

The ``hidden_var`` measure (ours) is how the BHyT paper's depth claim is checked: the variance over
the hidden dimension of the residual stream after each decoder layer, averaged over held-out tokens.
It is a measure, not a method's ``evaluate``, so that the RMSNorm baseline (method ``none``), which
runs no code of ours, reports it too.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from optuna.distributions import FloatDistribution

from paretolab import Method, Metric, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.measure.measures import Measure
from paretolab.plugin_api.options import option, parse_options
from paretolab.plugin_api.subject import Subject
from paretolab.plugins._layerwise import decoder_layers
from paretolab.training.hooks import TrainingHook, training_of

BHYT_PAPER = Paper("Bounded Hyperbolic Tanh: A Drop-in Replacement for Pre-LN (BHyT)", "", "https://github.com/MLAI-Yonsei/BHyT")
DYT_PAPER = Paper("Transformers without Normalization", "CVPR 2025", "https://arxiv.org/abs/2503.10622")
EPS = 1e-6  # the official code's epsilon inside rsqrt


class BHyTNorm(torch.nn.Module):
    """γ·tanh(λ·κ⁻¹·x·rsqrt(mean x²)): BHyT's input norm; keeps mean x² for the layer's second norm."""

    def __init__(self, hidden_size: int, *, lam: float, kappa: float, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.lam_init, self.inv_kappa = float(lam), 1.0 / float(kappa)
        self.lam = torch.nn.Parameter(torch.empty(1, device=device))
        self.weight = torch.nn.Parameter(torch.empty(hidden_size, device=device))
        self.var_x: torch.Tensor | None = None  # this forward's mean x², read (and cleared) by the BHyTPostNorm
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.lam.fill_(self.lam_init)
            self.weight.fill_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var_x = x.pow(2).mean(-1, keepdim=True, dtype=torch.float32)
        self.var_x = var_x
        rstd = (torch.rsqrt(var_x + EPS) * self.inv_kappa).to(x.dtype)
        return self.weight * torch.tanh(self.lam * rstd * x)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, lam_init={self.lam_init}, kappa={1 / self.inv_kappa:g}"


class BHyTPostNorm(BHyTNorm):
    """BHyT's post-attention norm: the same bounded tanh, its input variance predicted as var_x + c_attn·λ_in²·κ⁻²."""

    def __init__(self, hidden_size: int, *, lam: float, kappa: float, source: BHyTNorm, attention: torch.nn.Module,
                 device: torch.device | str | None = None) -> None:
        super().__init__(hidden_size, lam=lam, kappa=kappa, device=device)
        # plain attributes in a tuple, not submodules: the layer owns them; deepcopy keeps the links within one copy
        self._links = (source, attention)
        self.c_attn: float | None = None

    def reset_parameters(self) -> None:
        super().reset_parameters()
        self.c_attn = None  # the attention weights may have been re-initialised too: measure again at the next forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        source, attention = self._links
        if source.var_x is None:
            raise RuntimeError("BHyTPostNorm ran before its layer's input norm: the decoder layer is not Pre-LN")
        if self.c_attn is None:
            self.c_attn = attention_gain(attention, seq_len=x.shape[-2])
        var_next = source.var_x + self.c_attn * source.lam.detach().float().square() * source.inv_kappa**2
        source.var_x = None  # do not keep the graph alive between forwards
        rstd = (torch.rsqrt(var_next + EPS) * self.inv_kappa).to(x.dtype)
        return self.weight * torch.tanh(self.lam * rstd * x)


@torch.no_grad()
def attention_gain(attention: torch.nn.Module, *, seq_len: int) -> float:
    """c_attn = ‖W_V W_O‖²_F / (T·d), the value projection expanded over the query heads that share it (GQA)."""
    value = attention.v_proj if hasattr(attention, "v_proj") else attention.kv_proj  # kv_proj: values tied to keys (kv_sharing)
    w_v = value.weight.float()  # (kv_heads·head_dim, d)
    w_o = attention.o_proj.weight.float()  # (d, heads·head_dim)
    groups = w_o.shape[1] // w_v.shape[0]
    if groups > 1:
        w_v = w_v.reshape(-1, attention.head_dim, w_v.shape[1]).repeat_interleave(groups, dim=0).reshape(-1, w_v.shape[1])
    hidden = w_v.shape[1]
    return float((w_v.T @ w_o.T).pow(2).sum()) / (seq_len * hidden)


class BHyTGain(TrainingHook):
    """Before training (after re-initialisation) fix each unset c_attn with T = the train stage's seq_len."""

    def convert_model(self, model: torch.nn.Module, state: Any) -> None:
        seq_len = int(state.params.seq_len)
        for module in model.modules():  # no stored references: the hook is copied apart from the model
            if isinstance(module, BHyTPostNorm) and module.c_attn is None:
                module.c_attn = attention_gain(module._links[1], seq_len=seq_len)


class DyT(torch.nn.Module):
    """Dynamic Tanh: γ·tanh(α·x) + β with a learnable scalar α."""

    def __init__(self, hidden_size: int, *, alpha: float, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.alpha_init = float(alpha)
        self.alpha = torch.nn.Parameter(torch.empty(1, device=device))
        self.weight = torch.nn.Parameter(torch.empty(hidden_size, device=device))
        self.bias = torch.nn.Parameter(torch.empty(hidden_size, device=device))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.alpha.fill_(self.alpha_init)
            self.weight.fill_(1.0)
            self.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * torch.tanh(self.alpha * x) + self.bias

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, alpha_init={self.alpha_init}"


def pre_ln_layers(model: torch.nn.Module, method: str) -> list[torch.nn.Module]:
    """The decoder layers, refusing a model whose layers lack the two Pre-LN norms these methods replace."""
    layers = list(decoder_layers(model))
    for layer in layers:
        if not all(hasattr(layer, n) for n in ("input_layernorm", "post_attention_layernorm", "self_attn")):
            raise ConfigError(
                f"method {method!r}: {type(layer).__name__} has no input_layernorm/post_attention_layernorm; "
                "it needs a Pre-LN decoder such as transformers' LlamaForCausalLM"
            )
    return layers


def _like(module: torch.nn.Module, new: torch.nn.Module) -> torch.nn.Module:
    """``new`` in the dtype of the module it replaces."""
    return new.to(dtype=module.weight.dtype)


class BHyT(Method):
    """Replace each decoder layer's two RMSNorms with BHyT (the final norm stays RMSNorm, as in the paper's configs)."""

    name = "bhyt"
    kind = "architecture"
    paper = BHYT_PAPER
    cost_is = "real"  # the norm that runs is the one reported: no simulated saving

    def search_space(self) -> dict[str, Any]:
        return {"input_lam": FloatDistribution(1.0, 5.0), "post_lam": FloatDistribution(1.0, 5.0)}

    def defaults(self) -> dict[str, Any]:
        return {"input_lam": 2.0, "post_lam": 1.0, "kappa": 10.0}  # the official released configs and κ

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        kappa = float(p["kappa"])
        if not kappa > 0:
            raise ConfigError(f"bhyt.kappa must be > 0 (the paper's 10), got {kappa}")
        for layer in pre_ln_layers(subject.model, self.name):
            hidden = layer.input_layernorm.weight.shape[0]
            first = BHyTNorm(hidden, lam=float(p["input_lam"]), kappa=kappa, device=ctx.device)
            second = BHyTPostNorm(hidden, lam=float(p["post_lam"]), kappa=kappa, source=first, attention=layer.self_attn, device=ctx.device)
            layer.input_layernorm = _like(layer.input_layernorm, first)
            layer.post_attention_layernorm = _like(layer.post_attention_layernorm, second)
        training_of(subject).attach(BHyTGain(), method=self.name)
        subject.info["norm"] = "bhyt"
        return subject


class DyTMethod(Method):
    """Replace every RMSNorm (both per layer and the final one) with Dynamic Tanh."""

    name = "dyt"
    kind = "architecture"
    paper = DYT_PAPER
    cost_is = "real"

    def search_space(self) -> dict[str, Any]:
        return {"alpha": FloatDistribution(0.05, 2.0, log=True)}

    def defaults(self) -> dict[str, Any]:
        return {"alpha": 0.5}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        alpha = float({**self.defaults(), **params}["alpha"])
        if not alpha > 0:
            raise ConfigError(f"dyt.alpha must be > 0 (the paper's 0.5), got {alpha}")
        for layer in pre_ln_layers(subject.model, self.name):
            for name in ("input_layernorm", "post_attention_layernorm"):
                norm = getattr(layer, name)
                setattr(layer, name, _like(norm, DyT(norm.weight.shape[0], alpha=alpha, device=ctx.device)))
        inner = subject.model.model
        if hasattr(inner, "norm"):
            inner.norm = _like(inner.norm, DyT(inner.norm.weight.shape[0], alpha=alpha, device=ctx.device))
        subject.info["norm"] = "dyt"
        return subject


@dataclass(frozen=True)
class HiddenVarOptions:
    corpus: str = option("pydoc", data="corpus")  # held-out text: pydoc (built in), pystdlib-val, a path
    max_tokens: int = option(2048, low=2)
    seq_len: int = option(256, low=2, at_most="max_tokens")


def hidden_variance(model: torch.nn.Module, windows: torch.Tensor) -> list[float]:
    """Mean over tokens of the variance over the hidden dimension: [embeddings, after layer 1, ..., after layer L]."""
    layers = decoder_layers(model)
    sums = torch.zeros(len(layers) + 1, dtype=torch.float64, device="cpu")  # host accumulators
    count = 0

    def record(index: int) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            hidden = output[0] if isinstance(output, tuple) else output
            sums[index] += float(hidden.double().var(dim=-1, unbiased=False).sum())

        return hook

    handles = [model.get_input_embeddings().register_forward_hook(record(0))]
    handles += [layer.register_forward_hook(record(i + 1)) for i, layer in enumerate(layers)]
    try:
        with torch.no_grad():
            for window in windows.split(4):
                model(input_ids=window, use_cache=False)
                count += window.numel()
    finally:
        for handle in handles:
            handle.remove()
    return (sums / max(count, 1)).tolist()


class HiddenVar(Measure):
    """Residual-stream variance per layer on held-out text: last layer's value and its growth over the first layer's."""

    name = "hidden_var"
    metrics = ("hidden_var_last", "hidden_var_growth")
    options = HiddenVarOptions
    default = False

    def measure(self, subject: Subject, options: Any, ctx: TrialContext) -> dict[str, float]:
        from paretolab.tasks import corpus_ids

        if not isinstance(options, HiddenVarOptions):
            options = parse_options(HiddenVarOptions, options, where="hidden_var")
        ids = corpus_ids(subject.tokenizer, options.corpus, options.max_tokens)
        n = ids.numel() // options.seq_len
        if n < 1:
            raise ConfigError(f"hidden_var: corpus {options.corpus!r} gave {ids.numel()} tokens, fewer than seq_len={options.seq_len}")
        windows = ids[: n * options.seq_len].reshape(n, options.seq_len).to(subject.device)
        per_layer = hidden_variance(subject.model, windows)
        ctx.add_artifact("hidden_var.json", json.dumps({"var": per_layer, "index": "0 = embeddings, l = after decoder layer l",
                                                        "options": dataclasses.asdict(options)}, indent=1))
        first, last = per_layer[1], per_layer[-1]
        return {"hidden_var_last": last, "hidden_var_growth": last / first if first > 0 else math.inf}


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(BHyT())
    register(DyTMethod())


@hookimpl
def register_measures(register: Callable[[Measure], None]) -> None:
    register(HiddenVar())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    register(Metric("hidden_var_last", "", "minimize", "hidden_var measure: variance over the hidden dimension of the residual stream after the last decoder layer, mean over held-out tokens"))
    register(Metric("hidden_var_growth", "x", "minimize", "hidden_var measure: residual-stream variance after the last decoder layer / after the first (growth with depth)"))

"""KV-cache surgery on Llama attention: values tied to keys (Q–K=V sharing), GQA/MQA head regrouping, and a measured cache size.

``qk_v_sharing`` — Q–K=V projection sharing (the seed paper's abstract: three projection-sharing
constraints evaluated, "Q-K=V projection sharing achieves 50% KV cache reduction with only 3.1%
perplexity degradation" on 300M/1.2B models trained on 10B tokens, and it combines with GQA/MQA;
no official code found). The paper's idea: one projection feeds both the keys and the values, RoPE is applied on the
query/key path only, so the values are the *un-rotated* shared projection and the KV cache needs
one tensor per layer instead of two: its bytes halve, and the value projection's parameters go.
Ours: the surgery keeps the old ``k_proj`` as the shared ``kv_proj`` and drops ``v_proj`` (on a
trained model this loses the values; the method is meant to be trained from scratch, ``train``
re-initialises it). The HF cache stores the un-rotated projection as its keys and a zero-width
tensor as its values (0 bytes), and the keys are rotated at every forward for all cached positions.
Positions are the cache indices 0..n−1 for keys and queries alike (the caller's ``position_ids`` are
not used): RoPE scores depend only on the difference of positions, so this equals the standard
rotation for unpadded text and stays consistent for left-padded rows. Full (non-sliding) caches only.

``kv_heads`` — the GQA/MQA baseline (Ainslie et al., "GQA: Training Generalized Multi-Query
Transformer Models from Multi-Head Checkpoints", EMNLP 2023, https://arxiv.org/abs/2305.13245):
rebuild ``k_proj``/``v_proj`` for ``kv_heads`` key/value heads by mean-pooling the heads of each
group (the paper's conversion); going up (e.g. GQA back to MHA) repeats heads, which keeps the
model's function exactly. With ``kv_heads`` = heads/2 it matches ``qk_v_sharing``'s cache bytes on MHA.

``kv_cache`` measure (ours): ``kv_bytes_per_token``, the bytes the model's own HF cache holds after a
short prefill, divided by the tokens — measured on the cache tensors, for every model (for a
linear-attention layer, its recurrent state: constant in the tokens, so the ratio falls with them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from optuna.distributions import CategoricalDistribution

from paretolab import Method, Metric, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.measure.measures import Measure
from paretolab.plugin_api.options import option, parse_options
from paretolab.plugin_api.subject import Subject
from paretolab.plugins._layerwise import decoder_layers

GQA_PAPER = Paper("GQA: Training Generalized Multi-Query Transformer Models from Multi-Head Checkpoints", "EMNLP 2023", "https://arxiv.org/abs/2305.13245")
QKV_PAPER = Paper("Q–K=V projection sharing: shared key-value projection, 50% KV cache at 3.1% perplexity (seed abstract; no code found)", "", "")


class SharedKVAttention(torch.nn.Module):
    """Llama attention whose values are the un-rotated key projection: one projection, one cached tensor per layer."""

    def __init__(self, attention: torch.nn.Module, rotary: torch.nn.Module) -> None:
        super().__init__()
        self.config = attention.config
        self.layer_idx = attention.layer_idx
        self.head_dim = attention.head_dim
        self.num_key_value_groups = attention.num_key_value_groups
        self.scaling = attention.scaling
        self.attention_dropout = attention.attention_dropout
        self.is_causal = True
        self.q_proj, self.kv_proj, self.o_proj = attention.q_proj, attention.k_proj, attention.o_proj
        self._rotary = (rotary,)  # the model's rotary embedding, not a submodule of this layer

    def forward(self, hidden_states: torch.Tensor, position_embeddings: Any = None, attention_mask: torch.Tensor | None = None,
                cache: Any = None, past_key_values: Any = None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        from transformers.models.llama.modeling_llama import (
            eager_attention_forward,
            rotate_half,
        )

        cache = cache if cache is not None else past_key_values
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        shared = self.kv_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # un-rotated: the values, and what the cache keeps
        if cache is not None:
            shared, _ = cache.update(shared, shared[..., :0], self.layer_idx, kwargs=kwargs)  # zero-width values: 0 bytes
        positions = torch.arange(shared.shape[-2], device=shared.device).unsqueeze(0)
        cos, sin = self._rotary[0](shared, positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        key = shared * cos + rotate_half(shared) * sin
        q_cos, q_sin = cos[:, :, -query.shape[-2]:], sin[:, :, -query.shape[-2]:]  # the queries are the newest positions
        query = query * q_cos + rotate_half(query) * q_sin
        interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        out, weights = interface(self, query, key, shared, attention_mask, dropout=0.0 if not self.training else self.attention_dropout,
                                 scaling=self.scaling, **kwargs)
        return self.o_proj(out.reshape(*input_shape, -1).contiguous()), weights


def _attentions(model: torch.nn.Module, method: str) -> list[torch.nn.Module]:
    """Each decoder layer's ``self_attn``, refusing models whose attention is not Llama-style (q/k/v/o projections)."""
    layers = decoder_layers(model)
    attentions = [layer.self_attn for layer in layers]
    for attention in attentions:
        if not (hasattr(attention, "q_proj") and hasattr(attention, "o_proj") and hasattr(attention, "head_dim")):
            raise ConfigError(f"method {method!r}: {type(attention).__name__} is not a Llama-style attention (q_proj/k_proj/v_proj/o_proj)")
    return attentions


class QKVSharing(Method):
    """Tie the values to the keys: one k/v projection, RoPE on queries and keys only, one cached tensor per layer."""

    name = "qk_v_sharing"
    kind = "architecture"
    paper = QKV_PAPER
    cost_is = "real"  # the cache and the parameters really shrink

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        model = subject.model
        rotary = getattr(model.model, "rotary_emb", None)
        if rotary is None:
            raise ConfigError(f"method {self.name!r}: {type(model).__name__} has no model.rotary_emb; it needs a RoPE decoder such as LlamaForCausalLM")
        for layer, attention in zip(decoder_layers(model), _attentions(model, self.name)):
            if isinstance(attention, SharedKVAttention):
                continue
            if getattr(attention, "v_proj", None) is None or getattr(attention, "k_proj", None) is None:
                raise ConfigError(f"method {self.name!r}: {type(attention).__name__} has no k_proj/v_proj to tie")
            layer.self_attn = SharedKVAttention(attention, rotary)
        subject.info["kv"] = "shared"
        return subject


def regroup_heads(linear: torch.nn.Linear, old: int, new: int, head_dim: int) -> torch.nn.Linear:
    """A projection of ``old`` heads as ``new``: mean over each group of heads (fewer) or each head repeated (more)."""
    weight = linear.weight.detach().reshape(old, head_dim, -1)
    bias = linear.bias.detach().reshape(old, head_dim) if linear.bias is not None else None

    def regrouped(t: torch.Tensor) -> torch.Tensor:
        if new < old:
            return t.reshape(new, old // new, *t.shape[1:]).mean(dim=1)
        return t.repeat_interleave(new // old, dim=0)

    out = torch.nn.Linear(linear.in_features, new * head_dim, bias=bias is not None, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        out.weight.copy_(regrouped(weight).reshape(new * head_dim, -1))
        if bias is not None:
            out.bias.copy_(regrouped(bias).reshape(-1))
    return out


class KVHeads(Method):
    """Set the number of key/value heads (GQA; 1 = MQA; = heads is MHA), regrouping k/v projections by mean-pooling."""

    name = "kv_heads"
    kind = "architecture"
    paper = GQA_PAPER
    cost_is = "real"

    def search_space(self) -> dict[str, Any]:
        return {"kv_heads": CategoricalDistribution([1, 2, 4, 8])}

    def defaults(self) -> dict[str, Any]:
        return {"kv_heads": 1}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        new = int({**self.defaults(), **params}["kv_heads"])
        config = subject.model.config
        heads, old = config.num_attention_heads, config.num_key_value_heads
        if new < 1 or heads % new or (old % new and new % old):
            raise ConfigError(
                f"kv_heads.kv_heads must divide the {heads} attention heads and divide or be a multiple of the model's {old} "
                f"key/value heads; got {new}"
            )
        for attention in _attentions(subject.model, self.name):
            for name in ("k_proj", "v_proj", "kv_proj"):
                if getattr(attention, name, None) is not None:
                    setattr(attention, name, regroup_heads(getattr(attention, name), old, new, attention.head_dim))
            attention.num_key_value_groups = heads // new
        config.num_key_value_heads = new
        subject.info["kv_heads"] = new
        return subject


@dataclass(frozen=True)
class KVCacheOptions:
    tokens: int = option(16, low=1)  # prefill length whose cache is weighed


def cache_bytes_per_token(model: torch.nn.Module, tokens: int = 16) -> float:
    """Bytes of every tensor in the model's HF cache after a ``tokens``-long prefill, per token."""
    from paretolab.generation.decoding import forward_with_cache

    device = next(model.parameters()).device
    ids = torch.ones((1, tokens), dtype=torch.long, device=device)  # the content does not change the cache's size
    with torch.no_grad():
        _, cache = forward_with_cache(model, ids, last_only=True, lean=False)  # transformers' cache: its layers are weighed
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise ConfigError(f"kv_cache: {type(model).__name__} returned a {type(cache).__name__}, not a transformers Cache with .layers")
    # a recurrent (linear-attention) layer holds a state instead of keys/values: that state is what it keeps
    held = [t for layer in layers for t in (getattr(layer, "state", None) or (layer.keys, layer.values)) if t is not None]
    total = sum(t.numel() * t.element_size() for t in held)
    return total / tokens


class KVCache(Measure):
    """KV-cache bytes per token of context, weighed on the model's own cache."""

    name = "kv_cache"
    metrics = ("kv_bytes_per_token",)
    options = KVCacheOptions
    default = False

    def measure(self, subject: Subject, options: Any, ctx: TrialContext) -> dict[str, float]:
        if not isinstance(options, KVCacheOptions):
            options = parse_options(KVCacheOptions, options, where="kv_cache")
        return {"kv_bytes_per_token": cache_bytes_per_token(subject.model, options.tokens)}


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(QKVSharing())
    register(KVHeads())


@hookimpl
def register_measures(register: Callable[[Measure], None]) -> None:
    register(KVCache())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    register(Metric("kv_bytes_per_token", "bytes", "minimize", "kv_cache measure: bytes the model's KV cache holds per token of context (all layers), weighed after a prefill"))

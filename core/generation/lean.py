"""A lean batch-1 cached forward for Llama-family models: the same arithmetic as transformers, less Python around it.

At batch 1 a small model's decoding step is not all weight reads: SmolLM2-135M's one-token step
through transformers spends a third of its time in the library's own per-layer Python (cache
objects, mask building, attention dispatch, output records). :func:`lean_forward` runs the same
model — its own embedding, norms, projections, rotary tables, MLPs and head modules, so a method
that swaps a linear (MACKO, the dense CPU kernel) or an MLP (L1 sparsity) is honoured — but does
the attention block itself: rotary embedding, a preallocated KV cache written in place, and one
``scaled_dot_product_attention`` call (no mask for one query row; a causal offset mask for a
k+1-token verify; ``is_causal`` for a fresh prefill).

On a CPU with AVX-512, where the C extension ``paretolab.kernels._lean_cpu`` is built, a block of
up to 16 fp32 tokens (decoding, a verify) goes further: RMSNorm, rotary, attention over the cache
and the MLP's ``silu(gate) * up`` are one C call each (:mod:`paretolab.kernels.lean_cpu`) instead
of ~40 torch operations a layer; norms and MLPs a method replaced or hooked still run as modules.

Only models it can reproduce take it (:func:`lean_supported`): a ``LlamaForCausalLM`` whose decoder
layers and attention modules are transformers' own classes, unpatched, with sdpa or eager
attention and no hooks other than forward hooks on decoder layers (those are called, so
``TargetFeatures`` still records EAGLE's hidden states). Anything else — padded batches, methods
that replace attention, other architectures — keeps the transformers forward. The results agree
with it to float rounding (tests compare logits and greedy tokens); ``PARETOLAB_LEAN_DECODE=0`` or
:func:`lean_decoding(False) <lean_decoding>` switches it off (benchmarks time both).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

from paretolab.kernels.lean_cpu import MAX_TOKENS as LEAN_CPU_MAX_TOKENS
from paretolab.kernels.lean_cpu import lean_ops

_enabled = [os.environ.get("PARETOLAB_LEAN_DECODE", "1") != "0"]


@contextmanager
def lean_decoding(enabled: bool) -> Iterator[None]:
    """While active, :func:`forward_with_cache <paretolab.generation.decoding.forward_with_cache>` takes the lean path
    (where the model supports it) or not; benchmarks use it to time both in one process."""
    _enabled.append(enabled)
    try:
        yield
    finally:
        _enabled.pop()


def lean_enabled() -> bool:
    return _enabled[-1]


_c_operations = [True]


@contextmanager
def lean_c_operations(enabled: bool) -> Iterator[None]:
    """While active, the lean forward takes the C operations of :mod:`paretolab.kernels.lean_cpu` where they run (True,
    the default) or torch's (False); benchmarks time both. ``PARETOLAB_CPU_KERNELS=0`` switches them off with the rest."""
    _c_operations.append(enabled)
    try:
        yield
    finally:
        _c_operations.pop()


class LeanCache:
    """Keys and values of every layer in preallocated buffers (1, kv_heads, capacity, head_dim), grown by doubling.

    It answers the two questions callers ask of a transformers cache: ``get_seq_length()`` and
    ``crop(n)`` (n >= 0 keeps the first n positions, n < 0 drops the last -n), so the speculative
    loop rolls it back exactly as it rolls back a ``DynamicCache``.
    """

    def __init__(self, layers: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * layers
        self.values: list[torch.Tensor | None] = [None] * layers
        self.length = 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def crop(self, max_length: int) -> None:
        keep = self.length + max_length if max_length < 0 else max_length
        self.length = max(0, min(self.length, keep))

    def append(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write (1, kv_heads, T, head_dim) at the current length; the layer's keys and values up to length + T."""
        start, end = self.length, self.length + key.shape[2]
        buffer_k, buffer_v = self.reserve(layer, end, key, value)
        buffer_k[:, :, start:end] = key
        buffer_v[:, :, start:end] = value
        return buffer_k[:, :, :end], buffer_v[:, :, :end]

    def reserve(self, layer: int, end: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's whole buffers, grown (by doubling, the first ``length`` positions kept) to hold ``end`` positions;
        ``key``/``value`` (1, kv_heads, *, head_dim) give their shape, dtype and device."""
        buffer_k, buffer_v = self.keys[layer], self.values[layer]
        if buffer_k is None or buffer_v is None or buffer_k.shape[2] < end:
            start = self.length
            capacity = max(64, end, 2 * (0 if buffer_k is None else buffer_k.shape[2]))
            grown_k = key.new_empty((key.shape[0], key.shape[1], capacity, key.shape[3]))
            grown_v = value.new_empty((value.shape[0], value.shape[1], capacity, value.shape[3]))
            if buffer_k is not None and buffer_v is not None:
                grown_k[:, :, :start] = buffer_k[:, :, :start]
                grown_v[:, :, :start] = buffer_v[:, :, :start]
            self.keys[layer], self.values[layer] = buffer_k, buffer_v = grown_k, grown_v
        return buffer_k, buffer_v

    def keep(self, start: int, offsets: list[int]) -> None:
        """Keep, of the positions from ``start`` on, those at ``start + offsets`` (increasing), moved to ``start, start+1, ...``.

        A tree verify writes every node of the tree after the accepted prefix; the accepted path's
        nodes (a subsequence of them) become the next positions, the rest are dropped.
        """
        if any(b <= a for a, b in zip(offsets, offsets[1:])) or (offsets and (offsets[0] < 0 or start + offsets[-1] >= self.length)):
            raise ValueError(f"LeanCache.keep: offsets must increase within the {self.length - start} positions after {start}, got {offsets}")
        if offsets != list(range(len(offsets))):
            index = torch.tensor(offsets, device=self.keys[0].device if self.keys[0] is not None else None) + start
            for buffers in (self.keys, self.values):
                for buffer in buffers:
                    if buffer is not None:
                        buffer[:, :, start : start + len(offsets)] = buffer[:, :, index]
        self.length = start + len(offsets)


def lean_supported(model: torch.nn.Module) -> bool:
    """Whether :func:`lean_forward` reproduces this model's transformers forward (see the module docstring)."""
    try:
        from transformers.models.llama.modeling_llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM
    except ImportError:  # pragma: no cover - transformers is a dependency
        return False
    if type(model) is not LlamaForCausalLM or model.training or "forward" in model.__dict__:
        return False
    if getattr(model.config, "_attn_implementation", "eager") not in ("sdpa", "eager"):
        return False
    if torch.nn.modules.module._global_forward_hooks or torch.nn.modules.module._global_forward_pre_hooks:
        return False
    inner = model.model
    if "forward" in inner.__dict__ or inner._forward_hooks or inner._forward_pre_hooks or model._forward_hooks or model._forward_pre_hooks:
        return False
    for layer in inner.layers:
        attn = getattr(layer, "self_attn", None)
        if type(layer) is not LlamaDecoderLayer or type(attn) is not LlamaAttention:
            return False
        if "forward" in layer.__dict__ or "forward" in attn.__dict__ or layer._forward_pre_hooks or attn._forward_hooks or attn._forward_pre_hooks:
            return False
        if any(layer._forward_hooks_with_kwargs.get(key) for key in layer._forward_hooks):
            return False
    return True


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _attention(attn: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: LeanCache, index: int,
               mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
    """transformers' LlamaAttention.forward for batch 1 with a LeanCache (same projections, rotary and sdpa arithmetic)."""
    tokens, head_dim = x.shape[1], attn.head_dim
    q = attn.q_proj(x).view(1, tokens, -1, head_dim).transpose(1, 2)
    k = attn.k_proj(x).view(1, tokens, -1, head_dim).transpose(1, 2)
    v = attn.v_proj(x).view(1, tokens, -1, head_dim).transpose(1, 2)
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    keys, values = cache.append(index, k, v)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=causal,
                                         scale=attn.scaling, enable_gqa=q.shape[1] != keys.shape[1])
    return attn.o_proj(out.transpose(1, 2).reshape(1, tokens, -1))


def _plain(module: torch.nn.Module, cls: type) -> bool:
    """``module`` is exactly ``cls`` with no forward hooks and its own forward: the C path may replace its arithmetic."""
    return type(module) is cls and not (module._forward_hooks or module._forward_pre_hooks) and "forward" not in module.__dict__


def _call(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` without ``nn.Module.__call__``'s machinery where no hook is on the module (the lean forward runs
    only where no global hook is set): ~2 us less for each of a step's ~200 linear calls."""
    if module._forward_hooks or module._forward_pre_hooks:
        return module(x)
    return module.forward(x)


def _norm(norm: torch.nn.Module, x: torch.Tensor, ops: Any) -> torch.Tensor:
    if ops is not None and _plain(norm, _llama().LlamaRMSNorm) and norm.weight.dtype == torch.float32 and x.is_contiguous():
        return ops.rms_norm(x, norm.weight, norm.variance_epsilon)
    return norm(x)


def _mlp(mlp: torch.nn.Module, x: torch.Tensor, ops: Any) -> torch.Tensor:
    if ops is not None and _plain(mlp, _llama().LlamaMLP) and type(mlp.act_fn) in _silu_types():
        return _call(mlp.down_proj, ops.silu_mul(_call(mlp.gate_proj, x).contiguous(), _call(mlp.up_proj, x).contiguous()))
    return mlp(x)


def _attention_c(attn: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: LeanCache, index: int,
                 block_mask: torch.Tensor | None, ops: Any) -> torch.Tensor:
    """``_attention`` in one C call (rotary, the cache write, attention): the projections' (1, T, heads * D) layout throughout."""
    tokens, head_dim = x.shape[1], attn.head_dim
    q = _call(attn.q_proj, x).contiguous()
    k = _call(attn.k_proj, x).contiguous()
    v = _call(attn.v_proj, x).contiguous()
    like = k.view(1, tokens, -1, head_dim).transpose(1, 2)  # (1, kv_heads, T, D): the buffers' shape, dtype and device
    keys, values = cache.reserve(index, cache.length + tokens, like, like)
    out = ops.attention(q, keys, values, cache.length, attn.scaling, block_mask=block_mask, new=(k, v), rotary=(cos, sin))
    return _call(attn.o_proj, out)


@functools.cache
def _llama() -> Any:
    from transformers.models.llama import modeling_llama

    return modeling_llama


@functools.cache
def _silu_types() -> tuple[type, ...]:
    from transformers.activations import SiLUActivation

    return (SiLUActivation, torch.nn.SiLU)


def _call_hooks(layer: torch.nn.Module, inputs: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    for hook in list(layer._forward_hooks.values()):
        replaced = hook(layer, (inputs,), output)
        if replaced is not None:
            output = replaced
    return output


@torch.no_grad()
def lean_forward(model: torch.nn.Module, input_ids: torch.Tensor, cache: LeanCache | None = None, *,
                 last_only: bool = False, positions: torch.Tensor | None = None,
                 block_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, LeanCache]:
    """One cached forward of ``input_ids`` (1, T) after the cache's positions: (logits (1, T or 1, V), cache).

    A token tree (speculative verification of several candidate continuations at once) gives
    ``positions`` (T,): each token's position (the cache length plus its depth in the tree), and
    ``block_mask`` (T, T) bool: which of the block's tokens each one sees (its ancestors and
    itself); every token sees the whole past. Without them the block is one causal sequence.
    """
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"lean_forward decodes one sequence: input_ids must be (1, T), got {tuple(input_ids.shape)}")
    tokens = input_ids.shape[1]
    if (positions is None) != (block_mask is None) or (
            block_mask is not None and (block_mask.shape != (tokens, tokens) or positions is None or positions.shape != (tokens,))):
        raise ValueError(f"lean_forward: a tree needs positions ({tokens},) and block_mask ({tokens}, {tokens}) together, "
                         f"got {None if positions is None else tuple(positions.shape)} and {None if block_mask is None else tuple(block_mask.shape)}")
    inner = model.model
    layers = inner.layers
    if cache is None:
        cache = LeanCache(len(layers))
    hidden = inner.embed_tokens(input_ids)
    if positions is None:
        positions = torch.arange(cache.length, cache.length + tokens, device=input_ids.device)
    cos, sin = inner.rotary_emb(hidden, positions.unsqueeze(0))
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    ops = (lean_ops() if _c_operations[-1] and tokens <= LEAN_CPU_MAX_TOKENS and hidden.dtype == torch.float32
           and hidden.device.type == "cpu" else None)
    past, mask = cache.length, None
    if ops is not None:  # the C attention takes the tree mask itself (or none: causal)
        cos_rows, sin_rows = cos[0, 0].contiguous(), sin[0, 0].contiguous()  # (T, D), the C rotary's tables
        tree = None if block_mask is None else block_mask.to(torch.bool).contiguous()
    elif block_mask is not None:  # a tree: row i sees the past and the block rows block_mask[i] names (one mask for every layer)
        mask = torch.cat([block_mask.new_ones((tokens, past)), block_mask], dim=1)
    elif tokens > 1 and past > 0:  # a verify block: row i sees the past and block rows 0..i
        mask = torch.ones((tokens, past + tokens), dtype=torch.bool, device=input_ids.device).tril(past)
    causal = tokens > 1 and past == 0 and mask is None  # a fresh prefill
    for index, layer in enumerate(layers):
        layer_in = hidden
        if ops is not None:
            hidden = hidden + _attention_c(layer.self_attn, _norm(layer.input_layernorm, hidden, ops), cos_rows, sin_rows, cache, index, tree, ops)
        else:
            hidden = hidden + _attention(layer.self_attn, layer.input_layernorm(hidden), cos, sin, cache, index, mask, causal)
        hidden = hidden + _mlp(layer.mlp, _norm(layer.post_attention_layernorm, hidden, ops), ops)
        if layer._forward_hooks:
            hidden = _call_hooks(layer, layer_in, hidden)
    cache.length += tokens
    hidden = inner.norm(hidden[:, -1:] if last_only else hidden)
    return model.lm_head(hidden), cache

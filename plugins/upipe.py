"""UPipe's head-level chunking of self-attention, on one device: attention activations held one head chunk at a time.

The paper's (seed 002, "UPipe": context parallelism with fine-grained chunking at the attention-head level;
−82.5 % peak activation memory on 70B Transformers at the training speed of earlier context parallelism, 5M-token
contexts for 8B models on one 8×H100 node). In DeepSpeed-Ulysses each device, after an all-to-all, holds every token
for H/P heads; UPipe runs those heads U at a time, so the query/key/value buffers and the attention's own
intermediates exist for U heads only, and are freed before the next chunk.

Ours: the single-device half, as a training-time method. ``upipe`` replaces each Llama attention's forward (the
module, its parameters and its state dict are unchanged) by one that, for each chunk of ``kv_heads_per_chunk``
key/value heads (with the query heads that share them: a chunk never splits a GQA group), projects Q/K/V for those heads only, applies RoPE and the model's attention
function, and adds the chunk's share of the output projection (``o_proj`` over the chunk's columns). With
``recompute`` (default) each chunk runs under activation checkpointing: the backward pass recomputes it, so between
forward and backward only the layer input is kept, not the chunk's Q/K/V and scores. The arithmetic is plain
attention's, summed in another order: outputs and gradients equal plain attention's up to float rounding (tested).
A forward with a KV cache (decoding) runs the model's own attention. Not ours to reproduce on one CPU: the
all-to-all and its overlap with compute; :mod:`paretolab.plugins.upipe_memory` models that half.

The train stage itself reports ``peak_act_mb`` (the activations saved for backward, by saved-tensor hooks: under
``recompute`` a chunk saves nothing of its own) and counts the recomputed FLOPs in ``train_flops``. The
``act_memory`` measure runs one training step (forward + backward at ``seq_len`` tokens) with the trial's
attention and, on the same model with the chunking switched off, with plain attention: the peak bytes of the
tensors each step holds at once, counted exactly on any device by :class:`paretolab.measure.live_memory.LiveTensorBytes`
(parameter gradients exist before it counts, so the peak is activations and workspace), and the step time in
rounds that alternate the two (order flipped each round; :func:`paretolab.measure.timing.time_paired` under the
node's timing lock), timed without the counting.
"""

from __future__ import annotations

import math
import statistics
import types
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from optuna.distributions import CategoricalDistribution, IntDistribution

from paretolab import Method, Metric, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.measure.measures import Measure
from paretolab.measure.timing import node_lock, time_paired
from paretolab.plugin_api.options import option, parse_options
from paretolab.plugin_api.subject import Subject
from paretolab.plugins._layerwise import decoder_layers

PAPER = Paper("UPipe: context parallelism with fine-grained head-level chunking of self-attention (seed 002 abstract)", "ICML 2026", "")
SETTING = "_upipe"  # an attention module's (query heads per chunk, recompute), set by the transform

METRICS = (
    Metric("step_peak_mb", "MiB", "minimize", "act_memory: the most bytes the tensors of one training step (forward + backward) hold at once, gradients excluded"),
    Metric("step_peak_mb_plain", "MiB", "minimize", "act_memory: the same step's peak with the model's plain attention (the chunking switched off)"),
    Metric("step_peak_ratio", "ratio", "minimize", "act_memory: step_peak_mb / step_peak_mb_plain on the same model and batch"),
    Metric("step_ms", "ms", "minimize", "act_memory: median time of one forward + backward at seq_len tokens"),
    Metric("step_time_ratio", "ratio", "minimize", "act_memory: median of the per-round step time over plain attention's, paired rounds"),
)


def chunked_attention_forward(self: torch.nn.Module, hidden_states: torch.Tensor, position_embeddings: Any = None,
                              attention_mask: torch.Tensor | None = None, cache: Any = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """A Llama attention forward that runs a chunk of query heads at a time (bound to the module by ``upipe``)."""
    cache = cache if cache is not None else kwargs.pop("past_key_values", None)
    setting = getattr(self, SETTING, None)
    if setting is None or cache is not None:  # switched off, or decoding with a cache: the model's own attention
        return type(self).forward(self, hidden_states, position_embeddings, attention_mask, cache, **kwargs)
    per_chunk, recompute = setting
    heads = self.q_proj.out_features // self.head_dim
    cos, sin = position_embeddings
    out = None
    for h0 in range(0, heads, per_chunk):
        h1 = min(heads, h0 + per_chunk)
        args = (hidden_states, cos, sin, attention_mask, h0, h1, kwargs)
        if recompute and torch.is_grad_enabled() and hidden_states.requires_grad:
            part = torch.utils.checkpoint.checkpoint(_chunk, self, *args, use_reentrant=False)
        else:
            part = _chunk(self, *args)
        out = part if out is None else out + part
    if self.o_proj.bias is not None:
        out = out + self.o_proj.bias
    return out, None


def _rows(linear: torch.nn.Linear, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    bias = linear.bias[start:stop] if linear.bias is not None else None
    return linear.weight[start:stop], bias


def _chunk(module: torch.nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
           h0: int, h1: int, kwargs: dict[str, Any]) -> torch.Tensor:
    """Query heads h0..h1 (and their key/value heads): projections, RoPE, attention, their columns of o_proj."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, eager_attention_forward

    d, groups = module.head_dim, module.num_key_value_groups
    shape = (*x.shape[:-1], -1, d)
    q = F.linear(x, *_rows(module.q_proj, h0 * d, h1 * d)).view(shape).transpose(1, 2)
    k = F.linear(x, *_rows(module.k_proj, h0 // groups * d, h1 // groups * d)).view(shape).transpose(1, 2)
    v = F.linear(x, *_rows(module.v_proj, h0 // groups * d, h1 // groups * d)).view(shape).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    attend = ALL_ATTENTION_FUNCTIONS.get_interface(module.config._attn_implementation, eager_attention_forward)
    heads, _ = attend(module, q, k, v, mask, dropout=0.0 if not module.training else module.attention_dropout,
                      scaling=module.scaling, **kwargs)
    return F.linear(heads.reshape(*x.shape[:-1], -1), module.o_proj.weight[:, h0 * d:h1 * d])


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Each decoder layer's ``self_attn``, refused unless it is a Llama-style attention (q/k/v/o projections, head_dim)."""
    found = []
    for index, layer in enumerate(decoder_layers(model)):
        att = getattr(layer, "self_attn", None)
        if att is None or not all(hasattr(att, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "num_key_value_groups")):
            raise ConfigError(f"upipe: layer {index}'s attention ({type(att).__name__}) is not a Llama-style attention with "
                              "q/k/v/o projections; upipe supports those only")
        found.append(att)
    return found


def chunk_heads(model: torch.nn.Module, kv_heads_per_chunk: int, recompute: bool = True) -> None:
    """Make every attention of ``model`` run ``kv_heads_per_chunk`` key/value heads (with their query heads) at a time."""
    if kv_heads_per_chunk < 1:
        raise ConfigError(f"upipe.kv_heads_per_chunk: expected at least 1 key/value head per chunk, got {kv_heads_per_chunk}")
    for att in attention_modules(model):
        heads = att.q_proj.out_features // att.head_dim
        setattr(att, SETTING, (min(heads, kv_heads_per_chunk * att.num_key_value_groups), bool(recompute)))
        att.forward = types.MethodType(chunked_attention_forward, att)


@contextmanager
def chunking_off(model: torch.nn.Module):
    """Plain attention for the block (the chunked modules fall back to the model's own forward), restored after."""
    atts = [a for a in attention_modules(model) if getattr(a, SETTING, None) is not None]
    saved = [getattr(a, SETTING) for a in atts]
    for att in atts:
        setattr(att, SETTING, None)
    try:
        yield
    finally:
        for att, setting in zip(atts, saved, strict=True):
            setattr(att, SETTING, setting)


class UPipe(Method):
    """Run each attention a chunk of heads at a time, recomputing each chunk in the backward pass (UPipe, one device)."""

    name = "upipe"
    kind = "training"
    paper = PAPER
    cost_is = "real"  # the act_memory measure reads the step's own peak memory and time
    preserves_output = True  # the same function, computed a chunk of heads at a time

    def search_space(self) -> dict[str, Any]:
        return {"kv_heads_per_chunk": IntDistribution(1, 32), "recompute": CategoricalDistribution([True, False])}

    def defaults(self) -> dict[str, Any]:
        return {"kv_heads_per_chunk": 1, "recompute": True}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        chunk_heads(subject.model, int(p["kv_heads_per_chunk"]), bool(p["recompute"]))
        subject.info["upipe"] = {"kv_heads_per_chunk": int(p["kv_heads_per_chunk"]), "recompute": bool(p["recompute"])}
        if p["recompute"]:  # the report's equal-FLOPs lines say what the budget holds
            subject.info["train_flops_counts"] = "the attention chunks recomputed in the backward pass (counted as training FLOPs)"
        return subject


@dataclass(frozen=True)
class Shape:
    """What the memory model needs of a decoder: layers, hidden size, query and key/value heads, head size."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int


PAPER_SHAPES = {"llama3-8b": Shape(32, 4096, 32, 8, 128), "llama3-70b": Shape(80, 8192, 64, 8, 128)}


def attention_buffer_bytes(shape: Shape, tokens: int, devices: int, heads_per_chunk: int | None = None, element_bytes: int = 2) -> int:
    """A model, not a measurement: the attention buffers one device holds at once while one layer's attention runs
    (or is recomputed) in DeepSpeed-Ulysses context parallelism over ``devices``, every layer's input checkpointed.

    Ulysses: the device holds Q, K, V and the output of its ``heads/devices`` query heads (key/value heads replicated
    when fewer than the devices) for every token, on both sides of the all-to-alls (one side on one device). UPipe:
    the same for ``heads_per_chunk`` query heads, the chunk the device runs at a time; its ratio to Ulysses is
    ``heads_per_chunk`` / (heads/devices), whatever the tokens. The layers' checkpointed inputs, the MLP and the
    logits are the same for both and left out, so the saving on a device's whole peak is smaller than this ratio says.
    """
    heads = max(shape.heads // devices, 1)
    kv_per_query = max(shape.kv_heads // devices, 1) / heads
    held = heads if heads_per_chunk is None else min(heads_per_chunk, heads)
    sides = 2 if devices > 1 else 1
    return int(sides * tokens * held * shape.head_dim * (2 + 2 * kv_per_query) * element_bytes)  # q + out, k + v


@dataclass(frozen=True)
class ActMemoryOptions:
    seq_len: int = option(2048, low=2)  # tokens per sequence of the measured step
    batch: int = option(1, low=1)
    rounds: int = option(3, low=1, high=50)  # paired rounds (method, plain; order flipped each round)


def step_peak_mb(step: Callable[[], None]) -> float:
    """Peak MB of the tensors ``step`` creates and holds at once (forward, saved activations, backward; any device)."""
    from paretolab.measure.live_memory import LiveTensorBytes

    with LiveTensorBytes() as live:
        step()
    return live.peak / 2**20


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class ActMemory(Measure):
    """Peak activation memory and time of one training step, the trial's attention against plain attention, paired."""

    name = "act_memory"
    metrics = tuple(m.name for m in METRICS)
    options = ActMemoryOptions
    default = False

    def measure(self, subject: Subject, options: Any, ctx: TrialContext) -> dict[str, float]:
        if not isinstance(options, ActMemoryOptions):
            options = parse_options(ActMemoryOptions, options, where="measures.act_memory")
        model, device = subject.model, subject.device
        gen = torch.Generator(device="cpu").manual_seed(ctx.seed)
        vocab = model.get_input_embeddings().num_embeddings
        ids = torch.randint(0, vocab, (options.batch, options.seq_len), generator=gen, device="cpu").to(device)
        was_training = model.training
        model.train()

        def step() -> None:
            model(input_ids=ids, labels=ids, use_cache=False).loss.backward()

        try:
            step()  # allocates every parameter's .grad: the peaks below are activations and workspace only
            peak = step_peak_mb(step)  # counted once per arm (a step's tensors are the same every time), untimed
            with chunking_off(model):
                plain = step_peak_mb(step)

            def plain_step() -> None:
                with chunking_off(model):
                    step()

            with node_lock():  # one timing at a time on this node, as every timing measure
                times = time_paired(step, plain_step, min_rounds=options.rounds, max_rounds=options.rounds, max_s=math.inf, target=0.0,
                                    sync=lambda: sync(device))
        finally:
            model.zero_grad(set_to_none=True)
            model.train(was_training)
        return {"step_peak_mb": peak, "step_peak_mb_plain": plain, "step_peak_ratio": peak / plain if plain > 0 else float("nan"),
                "step_ms": 1e3 * statistics.median(times.method),
                "step_time_ratio": statistics.median(1 / r for r in times.ratios)}  # per round, method time / plain time


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(UPipe())


@hookimpl
def register_measures(register: Callable[[Measure], None]) -> None:
    register(ActMemory())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    for metric in METRICS:
        register(metric)

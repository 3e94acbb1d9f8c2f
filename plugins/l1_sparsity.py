"""L1-induced FFN activation sparsity with a ReLU gate, and a sparse FFN that skips zero units when decoding.

Cetin et al., "Sparser, Faster, Lighter Transformer Language Models", ICML 2026,
https://arxiv.org/abs/2603.23198 (official code: SakanaAI/sparser-faster-llms, read, not copied).

The paper's: the gated FFN's SiLU gate becomes a ReLU, so the hidden activation
h = ReLU(x W_gate) ⊙ (x W_up) is exactly zero wherever the gate is; an L1 term on |h| (summed over
the hidden units, averaged over tokens, averaged over layers: their ``SparsityTracker``) is added
to the loss with a small coefficient λ, which drives most units to zero (> 90 %, up to 99 % at
their scale); then CUDA kernels (their TwELL / hybrid formats) skip the zero units.

Ours: the same gate (``act: relu``; ``relu2`` squares it, h = ReLU(x W_gate)² ⊙ (x W_up), a choice
the paper does not make) and the same L1 term, added through the train stage's loss hook (it owns
the loss: ``CE + λ · L1``); no λ schedule (the paper warms λ up; we use it from the first step).
The sparse path is ours and for decoding on a CPU, not the paper's GPU kernels: for a single
token, ``gate`` is computed densely, the nonzero units are found, and only those rows of
``up_proj`` and those columns of ``down_proj`` are multiplied (a C kernel on the CPU in fp32,
``paretolab.kernels.sparse_ffn_cpu``; ``index_select`` elsewhere or where it is not built) — FFN work
H·I + 2·H·k instead of 3·H·I for k active of I units. Whether that beats the dense path here is
measured (the ``ffn_sparsity`` measure and benchmarks/sparse_ffn.py), never assumed. Prefill and
training run the dense path (several tokens activate a union of units).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from optuna.distributions import CategoricalDistribution, FloatDistribution

from paretolab import Method, Metric, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.kernels.sparse_ffn_cpu import fits, sparse_ffn_cpu, sparse_ffn_kernel
from paretolab.measure.measures import Measure
from paretolab.plugin_api.options import option, parse_options
from paretolab.plugin_api.subject import Subject
from paretolab.plugins._layerwise import decoder_layers
from paretolab.training.hooks import TrainingHook, training_of

PAPER = Paper("Sparser, Faster, Lighter Transformer Language Models", "ICML 2026", "https://arxiv.org/abs/2603.23198")
ACTS = ("relu", "relu2")
HF_ACT = {"relu": "relu", "relu2": "relu2"}  # transformers' ACT2FN names: a saved checkpoint reloads with the same gate (dense)

METRICS = (
    Metric("ffn_zero_frac", "fraction", "maximize", "share of FFN hidden activations (the input of down_proj) that are exactly zero on held-out text, all layers"),
    Metric("sparse_decode_tok_s", "tokens/s", "maximize", "greedy decode at batch 1 with the sparse FFN path (zero units skipped)"),
    Metric("dense_decode_tok_s", "tokens/s", "maximize", "greedy decode at batch 1 of the same weights with the dense FFN path, timed beside the sparse one"),
    Metric("sparse_decode_speedup", "ratio", "maximize", "median paired ratio dense decode time / sparse decode time, same weights"),
)


def gate(x: torch.Tensor, act: str) -> torch.Tensor:
    """The ReLU-type gate: exact zeros for x <= 0."""
    r = torch.relu(x)
    return r * r if act == "relu2" else r


def sparse_token_ffn(x: torch.Tensor, gate_w: torch.Tensor, up_w: torch.Tensor, down_t: torch.Tensor, act: str) -> torch.Tensor:
    """FFN output for one token x (..., H): dense gate, then only the active units' rows of up (I, H) and of down_t (I, H),
    down_proj's weight transposed (contiguous rows per unit: a strided column gather of (H, I) was 1.3-1.8× slower here at 90 % zeros).
    The C kernel (``paretolab.kernels.sparse_ffn_cpu``) where it is built and the tensors are fp32 on the CPU; else ``index_select``."""
    if sparse_ffn_kernel() is not None and fits(x, gate_w, up_w, down_t):
        return sparse_ffn_cpu(x, gate_w, up_w, down_t, act)
    flat = x.reshape(-1)
    a = gate(torch.mv(gate_w, flat), act)
    active = torch.nonzero(a).squeeze(1)
    h = a.index_select(0, active) * torch.mv(up_w.index_select(0, active), flat)
    out = torch.mv(down_t.index_select(0, active).t(), h) if active.numel() else torch.zeros_like(flat)
    return out.reshape(x.shape)


class ReluGLU(torch.nn.Module):
    """Llama's gated FFN with a ReLU-type gate; one token without grad takes the sparse path."""

    def __init__(self, gate_proj: torch.nn.Linear, up_proj: torch.nn.Linear, down_proj: torch.nn.Linear, act: str) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj  # the same names as LlamaMLP: state dicts match
        self.act = act
        self.sparse_decode = True
        self._down_t: torch.Tensor | None = None  # see down_transposed()
        self._down_key: tuple[Any, ...] = ()
        self.recorded: list[torch.Tensor] | None = None  # the hidden activations of each forward, while the L1 hook collects them

    def down_transposed(self) -> torch.Tensor:
        """down_proj's weight as (I, H), contiguous; rebuilt when the weight changes (optimizer steps bump its version).
        A decode-time copy of I·H values per layer, kept out of the state dict and of size_bytes (the stored model)."""
        w = self.down_proj.weight
        key = (w.data_ptr(), w._version, w.device)
        if self._down_t is None or self._down_key != key:
            self._down_t, self._down_key = w.detach().t().contiguous(), key
        return self._down_t

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        """h = gate(x W_gate) ⊙ (x W_up), the input of down_proj."""
        return gate(self.gate_proj(x), self.act) * self.up_proj(x)

    def uses_sparse_path(self, x: torch.Tensor) -> bool:
        biased = any(p.bias is not None for p in (self.gate_proj, self.up_proj, self.down_proj))
        return self.sparse_decode and not biased and not torch.is_grad_enabled() and x.shape[:-1].numel() == 1 and x.device.type != "meta"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.uses_sparse_path(x):
            return sparse_token_ffn(x, self.gate_proj.weight, self.up_proj.weight, self.down_transposed(), self.act)
        h = self.hidden(x)
        if self.recorded is not None:
            self.recorded.append(h)
        return self.down_proj(h)


def relu_glus(model: torch.nn.Module) -> list[ReluGLU]:
    return [m for m in model.modules() if isinstance(m, ReluGLU)]


def l1_term(hidden: list[torch.Tensor]) -> torch.Tensor:
    """The paper's L1: per layer Σ_units |h| averaged over tokens, then averaged over layers."""
    return torch.stack([h.abs().sum(dim=-1).mean() for h in hidden]).mean()


@contextmanager
def recording(model: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """While active, every ReluGLU forward appends its hidden activations to the yielded list."""
    out: list[torch.Tensor] = []
    modules = relu_glus(model)
    for m in modules:
        m.recorded = out
    try:
        yield out
    finally:
        for m in modules:
            m.recorded = None


class L1Hook(TrainingHook):
    """Owns the loss: next-token cross-entropy + λ · L1 of the FFN hidden activations."""

    replaces = ("loss",)

    def __init__(self, lam: float) -> None:
        self.lam = lam

    def loss(self, model: torch.nn.Module, batch: torch.Tensor, state: Any) -> torch.Tensor:
        from paretolab.training.loop import _default_loss

        with recording(model) as hidden:
            ce = _default_loss(model, batch, state)
        if not hidden:
            raise ConfigError(f"method {self.method!r}: the model has no ReLU-gated FFN to penalise (was it replaced after l1_sparsity?)")
        penalty = l1_term(hidden)
        state.extra["l1"] = float(penalty.detach())
        return ce + self.lam * penalty


class L1Sparsity(Method):
    """Swap every FFN's SiLU gate for a ReLU-type one (sparse decode path) and attach the L1 loss hook."""

    name = "l1_sparsity"
    kind = "training"
    paper = PAPER
    cost_is = "real"  # the sparse path really runs in every batch-1 decode (latency and ffn_sparsity measures)

    def search_space(self) -> dict[str, Any]:
        return {"lam": FloatDistribution(0.0, 0.1), "act": CategoricalDistribution(list(ACTS))}

    def defaults(self) -> dict[str, Any]:
        return {"lam": 3.0e-3, "act": "relu"}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        lam, act = float(p["lam"]), str(p["act"])
        if lam < 0:
            raise ConfigError(f"l1_sparsity.lam must be >= 0 (the L1 coefficient; 0 is the same gate without the penalty), got {lam}")
        if act not in ACTS:
            raise ConfigError(f"l1_sparsity.act must be one of {', '.join(ACTS)}, got {act!r}")
        for layer in decoder_layers(subject.model):
            mlp = layer.mlp
            if not all(isinstance(getattr(mlp, n, None), torch.nn.Linear) for n in ("gate_proj", "up_proj", "down_proj")):
                raise ConfigError(f"l1_sparsity: {type(mlp).__name__} is not a gated FFN with gate_proj/up_proj/down_proj; Llama-style models only")
            layer.mlp = ReluGLU(mlp.gate_proj, mlp.up_proj, mlp.down_proj, act)
        subject.model.config.hidden_act = HF_ACT[act]
        if lam > 0:
            training_of(subject).attach(L1Hook(lam), method=self.name)
        subject.info["l1_sparsity"] = {"lam": lam, "act": act}
        return subject


@dataclass(frozen=True)
class FFNSparsityOptions:
    corpus: str = option("pydoc", data="corpus")  # held-out text for the zero fraction: pystdlib-val for the scratch models
    max_tokens: int = option(4096, low=2)
    seq_len: int = option(128, low=2, at_most="max_tokens")
    prompt_tokens: int = option(16, low=1)  # the decode prompt (from the corpus)
    new_tokens: int = option(32, low=1)  # tokens per timed decode
    repeats: int = option(5, low=1)  # paired rounds at least
    max_repeats: int = option(20, low=1)
    max_s: float = option(20.0, low=0.0)  # time cap of the paired timing; past it three rounds suffice
    target_spread: float = option(0.05, low=0.0)


def zero_fraction(model: torch.nn.Module, ids: torch.Tensor, seq_len: int) -> float:
    """Exact zeros among the inputs of every layer's down_proj, over windows of ``ids`` (any Llama FFN)."""
    zeros, total = [0], [0]

    def count(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        zeros[0] += int((inputs[0] == 0).sum())
        total[0] += inputs[0].numel()

    handles = [layer.mlp.down_proj.register_forward_pre_hook(count) for layer in decoder_layers(model)]
    windows = ids[: ids.numel() // seq_len * seq_len].reshape(-1, seq_len)
    try:
        with torch.no_grad():
            for window in windows.split(4):
                model(input_ids=window, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return zeros[0] / max(total[0], 1)


@contextmanager
def sparse_path(model: torch.nn.Module, on: bool) -> Iterator[None]:
    modules = relu_glus(model)
    before = [m.sparse_decode for m in modules]
    for m in modules:
        m.sparse_decode = on
    try:
        yield
    finally:
        for m, b in zip(modules, before, strict=True):
            m.sparse_decode = b


class FFNSparsity(Measure):
    """Zero fraction of FFN activations on held-out text; with ReLU-gated FFNs, sparse vs dense decode of the same weights."""

    name = "ffn_sparsity"
    metrics = tuple(m.name for m in METRICS)
    options = FFNSparsityOptions
    default = False

    def measure(self, subject: Subject, options: Any, ctx: TrialContext) -> dict[str, float]:
        from paretolab.generation import greedy_decode
        from paretolab.measure.timing import node_lock, time_paired, torch_threads
        from paretolab.tasks import corpus_ids

        if not isinstance(options, FFNSparsityOptions):
            options = parse_options(FFNSparsityOptions, options, where="measures.ffn_sparsity")
        model = subject.model
        ids = corpus_ids(subject.tokenizer, options.corpus, options.max_tokens).to(subject.device)
        if ids.numel() < options.seq_len:
            raise ConfigError(f"measures.ffn_sparsity: corpus {options.corpus!r} has {ids.numel()} tokens, fewer than seq_len={options.seq_len}")
        out = {"ffn_zero_frac": zero_fraction(model, ids, options.seq_len)}
        if not relu_glus(model):
            return out  # a SwiGLU model has no sparse path: only its zero fraction
        prompt = ids[: options.prompt_tokens].reshape(1, -1)
        n = options.new_tokens

        def run(on: bool) -> Callable[[], None]:
            def decode() -> None:
                with sparse_path(model, on):
                    greedy_decode(model, prompt, n)
            return decode

        sync = torch.cuda.synchronize if prompt.is_cuda else (lambda: None)
        with node_lock(), torch_threads(int(ctx.cpus)), torch.no_grad():
            run(True)(), run(False)()  # warm-up of both paths
            paired = time_paired(run(True), run(False), min_rounds=options.repeats, max_rounds=options.max_repeats,
                                 max_s=options.max_s, target=options.target_spread, sync=sync)
        out.update({
            "sparse_decode_tok_s": statistics.median(n / t for t in paired.method),
            "dense_decode_tok_s": statistics.median(n / t for t in paired.base),
            "sparse_decode_speedup": statistics.median(paired.ratios),
        })
        return out


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(L1Sparsity())


@hookimpl
def register_measures(register: Callable[[Measure], None]) -> None:
    register(FFNSparsity())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    for metric in METRICS:
        register(metric)

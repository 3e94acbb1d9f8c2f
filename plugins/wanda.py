"""Wanda: prune by weight magnitude times input activation norm, per output row.

Sun, Liu, Bair, Kolter, "A Simple and Effective Pruning Approach for Large Language Models",
ICLR 2024, https://arxiv.org/abs/2306.11695 (official code: github.com/locuslab/wanda).

The paper's: the score S_ij = |W_ij| · ‖X_j‖₂, where ‖X_j‖₂ is the L2 norm of input feature j
over every calibration token; the comparison group is each output row (the s·cols lowest
scores of every row are zeroed); no weight update; every Linear inside the transformer blocks
is pruned, the embeddings and the LM head are not; the optional N:M patterns (2:4, 4:8)
prune the N lowest scores of each group of M consecutive inputs (``sparsity`` is then N/M and
the ``sparsity`` param is ignored).

Our choices: calibration text defaults to the built-in ``pydoc`` corpus (the paper uses 128
sequences of 2048 tokens from C4; here corpus, sample count and length are params, default
16 x 256 = 4096 tokens, as many as the default perplexity budget, so that calibrating costs a
CPU trial no more than evaluating it); all activation norms come from ONE forward pass
of the unpruned model, whereas the official code prunes block by block and feeds each block
the outputs of the already pruned blocks before it. Pruning is simulated (zeros in dense
weights; ``size_bytes`` counts a bitmap plus the kept values); the ``macko`` method turns the
same masks into a real stored format.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from optuna.distributions import FloatDistribution

from paretolab import Method, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.plugin_api.subject import Subject
from paretolab.plugins._layerwise import calib_seed
from paretolab.plugins.baselines import linear_weights

PATTERNS = ("unstructured", "2:4", "4:8")
PAPER = Paper(
    "A Simple and Effective Pruning Approach for Large Language Models", "ICLR 2024", "https://arxiv.org/abs/2306.11695"
)


class Wanda(Method):
    """Unstructured (or N:M) pruning by |W|·‖X‖₂ over calibration activations, per output row."""

    name = "wanda"
    works_on = ("linear",)
    lossless_setting = {"sparsity": 0.0}  # nothing pruned
    kind = "weights"
    paper = PAPER
    cost_is = "simulated"

    def search_space(self) -> dict[str, Any]:
        return {"sparsity": FloatDistribution(0.0, 0.9)}

    def defaults(self) -> dict[str, Any]:
        return {"sparsity": 0.5, "pattern": "unstructured", "calib_corpus": "pydoc", "calib_samples": 16, "calib_seq_len": 256, "calib_seed": -1}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        sparsity, pattern = float(p["sparsity"]), str(p["pattern"])
        check_sparsity(self.name, sparsity, pattern)
        norms = activation_norms(subject, ctx, corpus=p["calib_corpus"], n_samples=int(p["calib_samples"]), seq_len=int(p["calib_seq_len"]),
                                 seed=calib_seed(ctx, p))
        for name, layer in linear_weights(subject.model):
            with torch.no_grad():
                layer.weight.mul_(wanda_mask(layer.weight, norms[name], sparsity, pattern=pattern))
            subject.set_storage(f"{name}.weight", sparse=True)
        return subject


def check_sparsity(method: str, sparsity: float, pattern: str) -> None:
    """Refuse a sparsity or pattern the pruning cannot honour, naming the parameter."""
    if pattern not in PATTERNS:
        raise ConfigError(f"{method}.pattern must be one of {', '.join(PATTERNS)}; got {pattern!r}")
    if not 0.0 <= sparsity < 1.0:
        raise ConfigError(f"{method}.sparsity must be in [0, 1), got {sparsity}")


def activation_norms(subject: Subject, ctx: TrialContext, *, corpus: str, n_samples: int, seq_len: int, seed: int,
                     batch_size: int = 4) -> dict[str, torch.Tensor]:
    """‖X_j‖₂ over all calibration tokens (the draw ``seed``) for the input of every Linear ``linear_weights`` yields: name -> (in_features,)."""
    if n_samples < 1 or seq_len < 2:
        raise ConfigError(f"calibration needs calib_samples >= 1 and calib_seq_len >= 2, got {n_samples} and {seq_len}")
    ids = ctx.calibration_draw(subject.tokenizer, corpus=corpus, n_samples=n_samples, seq_len=seq_len, seed=seed)  # (N, L)
    layers = dict(linear_weights(subject.model))
    sq_sums = {name: torch.zeros(layer.in_features, dtype=torch.float64, device=layer.weight.device) for name, layer in layers.items()}
    with _input_hooks(layers, sq_sums), torch.no_grad():
        for batch in ids.to(subject.device).split(batch_size):
            _forward_without_logits(subject.model, batch)
    return {name: sq.sqrt().to(torch.float32) for name, sq in sq_sums.items()}


def _forward_without_logits(model: torch.nn.Module, ids: torch.Tensor) -> None:
    """Run the model for its hooks; skip most of the LM head where the model allows it (HF ``logits_to_keep``)."""
    accepted = inspect.signature(model.forward).parameters
    extra = {k: v for k, v in (("use_cache", False), ("logits_to_keep", 1)) if k in accepted}
    model(input_ids=ids, **extra)


@contextmanager
def _input_hooks(layers: dict[str, torch.nn.Linear], sq_sums: dict[str, torch.Tensor]) -> Iterator[None]:
    """Accumulate the per-feature sum of squares of each layer's input while active."""

    def hook(name: str) -> Callable[..., None]:
        def accumulate(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1])  # (tokens, in_features)
            sq_sums[name] += x.float().pow(2).sum(dim=0).to(torch.float64)

        return accumulate

    handles = [layer.register_forward_pre_hook(hook(name)) for name, layer in layers.items()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def wanda_scores(weight: torch.Tensor, input_norm: torch.Tensor) -> torch.Tensor:
    """S_ij = |W_ij| · ‖X_j‖₂ (weight: (out, in), input_norm: (in,))."""
    return weight.detach().abs().to(torch.float32) * input_norm.to(weight.device, torch.float32)[None, :]


def wanda_mask(weight: torch.Tensor, input_norm: torch.Tensor, sparsity: float, *, pattern: str = "unstructured") -> torch.Tensor:
    """A 0/1 mask (weight's dtype) that zeros the lowest-scoring entries of each output row."""
    return mask_lowest(wanda_scores(weight, input_norm), sparsity, pattern=pattern).to(weight.dtype)


def mask_lowest(scores: torch.Tensor, sparsity: float, *, pattern: str = "unstructured") -> torch.Tensor:
    """Bool mask keeping all but the ``int(cols * sparsity)`` lowest scores per row (or N of every M for N:M)."""
    rows, cols = scores.shape
    keep = torch.ones_like(scores, dtype=torch.bool)
    if pattern == "unstructured":
        n_prune = int(cols * sparsity)
        if n_prune:
            keep.scatter_(1, torch.topk(scores, n_prune, dim=1, largest=False).indices, False)
        return keep
    n, m = (int(v) for v in pattern.split(":"))
    if cols % m:
        raise ConfigError(f"pattern {pattern} needs in_features divisible by {m}, got {cols}")
    groups = scores.reshape(rows, cols // m, m)
    idx = torch.topk(groups, n, dim=2, largest=False).indices
    return keep.reshape(rows, cols // m, m).scatter_(2, idx, False).reshape(rows, cols)


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(Wanda())

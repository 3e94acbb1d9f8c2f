"""Layer dropping by greedy block influence (our reading of few-layer dominance), with random and ShortGPT baselines.

Qiu, Tong, Sun, Ma, Shen, "The Few Govern the Many: Unveiling Few-Layer Dominance for Time Series
Models", arXiv 2511.07237 (no code found; a time-series paper, applied here to a language model).
Baselines: random layers; ShortGPT's block influence (Men et al., "ShortGPT: Layers in Large
Language Models are More Redundant Than You Expect", arXiv 2403.03853).

The paper's claim: keeping ~21–30% of the layers, chosen by its score, keeps most quality. Its
score as our method catalog summarises it (not checked against the paper's text): how much a
layer changes the representation, 1 − cos(h_{l−1}, h_l), keeping the dominant (high-shift) layers.
ShortGPT's block influence is the
same quantity, BI_l = 1 − E_tokens cos(h_{l−1}, h_l), computed once on the full model, dropping
the k lowest (``block_influence``). On a pre-norm residual stream the two scores coincide, so to
keep the comparison meaningful our ``greedy_bi`` is *iterative* block influence (ours): drop the
lowest-BI layer, re-measure BI on the pruned model, repeat k times — the later layers' scores
change once a layer is gone. It was called ``shift`` before (issue 20 renamed it for what it is);
``shift`` is still accepted as an alias so the stored studies that used it resume and read.
Only the paper's abstract could be read here (its body and code were not found): it names no
formula, so the paper's own score (and its head-diversity signal and re-alignment fine-tune) is
not implemented; whether it differs from block influence is unknown.

``random`` draws the k layers from the trial seed (the study seed plus the trial number) plus
``seed``; ``seed`` is mostly a grid label, so a study can hold several draws of each arm at one k
(the calibration sample comes from the trial seed too).

The layers are really removed from ``model.model.layers`` (``cost_is`` real: fewer layers run);
each remaining attention's ``layer_idx`` is renumbered so the KV cache still works, the config's
``num_hidden_layers`` (and ``layer_types`` where present) follow, and per-parameter storage
records are renamed to the new layer indices.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from optuna.distributions import CategoricalDistribution, IntDistribution

from paretolab import Method, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.plugin_api.subject import Subject
from paretolab.plugins._layerwise import (
    CALIB_DEFAULTS,
    calibration_ids,
    decoder_layers,
    run_model,
)

SCORES = ("greedy_bi", "random", "block_influence")
ALIASES = {"shift": "greedy_bi"}  # the old name of greedy_bi, kept so stored studies resume
PAPER = Paper("The Few Govern the Many: Unveiling Few-Layer Dominance for Time Series Models", "arXiv 2025", "https://arxiv.org/abs/2511.07237")


def representation_shift(model: torch.nn.Module, ids: torch.Tensor, *, batch_size: int = 4) -> torch.Tensor:
    """Per decoder layer, the mean over calibration tokens of 1 − cos(layer input, layer output): (n_layers,)."""
    layers = decoder_layers(model)
    sums = torch.zeros(len(layers), dtype=torch.float64, device="cpu")  # host accumulators of Python floats
    counts = torch.zeros(len(layers), dtype=torch.float64, device="cpu")

    def hook(index: int) -> Callable[..., None]:
        def record(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            h_in = args[0] if args else kwargs["hidden_states"]
            h_out = output[0] if isinstance(output, tuple) else output
            cos = torch.nn.functional.cosine_similarity(h_in.double(), h_out.double(), dim=-1)
            sums[index] += float((1 - cos).sum())
            counts[index] += cos.numel()

        return record

    handles = [layer.register_forward_hook(hook(i), with_kwargs=True) for i, layer in enumerate(layers)]
    try:
        run_model(model, ids, batch_size=batch_size)
    finally:
        for handle in handles:
            handle.remove()
    return (sums / counts.clamp_min(1)).float()


def layers_to_drop(model: torch.nn.Module, ids: torch.Tensor, k: int, score: str, generator: torch.Generator) -> list[int]:
    """Original indices of the ``k`` layers to remove under ``score`` (sorted)."""
    n = len(decoder_layers(model))
    if score == "random":
        return sorted(torch.randperm(n, generator=generator, device="cpu")[:k].tolist())
    if score == "block_influence":
        return sorted(torch.argsort(representation_shift(model, ids))[:k].tolist())
    # greedy_bi: block influence re-measured on a pruned copy after each removal
    work = copy.deepcopy(model)
    alive = list(range(n))
    dropped: list[int] = []
    for _ in range(k):
        position = int(torch.argmin(representation_shift(work, ids)))
        dropped.append(alive.pop(position))
        remove_layers(work, [position])
    return sorted(dropped)


def remove_layers(model: torch.nn.Module, drop: list[int]) -> list[int]:
    """Remove decoder layers at ``drop`` in place and renumber the rest; return the kept original indices."""
    layers = decoder_layers(model)
    kept = [i for i in range(len(layers)) if i not in set(drop)]
    model.model.layers = torch.nn.ModuleList([layers[i] for i in kept])
    for new_index, layer in enumerate(model.model.layers):
        for module in layer.modules():
            if hasattr(module, "layer_idx"):
                module.layer_idx = new_index
    config = model.config
    config.num_hidden_layers = len(kept)
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[i] for i in kept]
    return kept


@contextmanager
def layers_removed(model: torch.nn.Module, drop: Sequence[int]) -> Iterator[list[int]]:
    """While active, ``model`` runs as :func:`remove_layers` leaves it; on exit every layer, index and config field is back."""
    layers = decoder_layers(model)
    indices = [(module, module.layer_idx) for module in layers.modules() if hasattr(module, "layer_idx")]
    config = model.config
    saved = {key: getattr(config, key) for key in ("num_hidden_layers", "layer_types") if hasattr(config, key)}
    try:
        yield remove_layers(model, list(drop))
    finally:
        model.model.layers = layers
        for module, index in indices:
            module.layer_idx = index
        for key, value in saved.items():
            setattr(config, key, value)


def _rename_storage(subject: Subject, kept: list[int]) -> None:
    """Move storage records of model.layers.<old>. to model.layers.<new>.; drop those of removed layers."""
    new_of = {old: new for new, old in enumerate(kept)}
    pattern = re.compile(r"^(.*?\blayers\.)(\d+)(\..*)$")

    def renamed(records: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for name, record in records.items():
            match = pattern.match(name)
            if not match:
                out[name] = record
            elif int(match.group(2)) in new_of:
                out[f"{match.group(1)}{new_of[int(match.group(2))]}{match.group(3)}"] = record
        return out

    subject.storage = renamed(subject.storage)
    subject.storage_owner = renamed(subject.storage_owner)


class LayerDrop(Method):
    """Remove ``k`` whole decoder layers chosen by greedy block influence, one-shot block influence, or at random."""

    name = "layerdrop"
    kind = "weights"
    paper = PAPER
    cost_is = "real"

    def search_space(self) -> dict[str, Any]:
        return {"k": IntDistribution(0, 29), "score": CategoricalDistribution([*SCORES, *ALIASES])}  # up to keeping one of SmolLM2's 30 layers

    def defaults(self) -> dict[str, Any]:
        return {"k": 4, "score": "greedy_bi", "seed": 0, **CALIB_DEFAULTS}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        k, score = int(p["k"]), ALIASES.get(str(p["score"]), str(p["score"]))
        if score not in SCORES:
            raise ConfigError(f"layerdrop.score must be one of {', '.join(SCORES)}; got {score!r}")
        n = len(decoder_layers(subject.model))
        if not 0 <= k < n:
            raise ConfigError(f"layerdrop.k must be between 0 and {n - 1} (the model has {n} layers), got {k}")
        if k == 0:
            return subject
        ids = calibration_ids(subject, ctx, p, method=self.name) if score != "random" else None
        drop = layers_to_drop(subject.model, ids, k, score, ctx.generator(offset=53 + 7919 * int(p["seed"])))  # type: ignore[arg-type]
        kept = remove_layers(subject.model, drop)
        _rename_storage(subject, kept)
        subject.info["layerdrop"] = {"score": score, "dropped": drop, "kept": kept}
        return subject


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(LayerDrop())

"""Curriculum-guided layer scaling: the model grows in depth during training while its data moves from easy to hard.

Singh, Band & Adeli, "Curriculum-Guided Layer Scaling for Language Model Pretraining", 2025,
https://arxiv.org/abs/2506.11389 (no official code found).

The paper's: training runs in stages; each stage stacks new decoder layers on the model trained so
far (progressive layer stacking) and moves to harder data (synthetic short stories → web text at
100M; a DistilBERT difficulty classifier over DCLM at 1.2B); the stage's new layers are first
trained alone on a small balanced split with the old ones frozen, then everything is unfrozen.

Ours (a reduced, deterministic version for the ``train`` stage):

- Depth: the model starts at ``start_layers`` of its decoder layers (the rest are removed by the
  transform) and grows linearly to its full depth over ``stages`` equal shares of the train stage's
  steps (scratch-5m, start 1, 3 stages: 1 → 3 → 5 layers at 0, 1/3, 2/3 of the steps). New layers go
  on top, copies of the current top layers (``new_layers: copy_top``; the function changes: each
  copy adds its residual update again), or the same copies with their attention output and
  down projections zeroed (``identity``: each new layer is an identity on the residual stream at
  first, so the function is kept exactly; those projections get gradients at once and the rest
  of the layer from the step after). No freeze phase (the paper's): ours trains every layer at once.
  The optimizer is rebuilt at each growth (the loop's ``state.rebuild_optimizer``): old parameters
  keep their AdamW moments, new ones start without. ``step_signature`` is the depth, so the FLOP
  counter counts each depth's step once: ``train_flops`` is exact.
- Curriculum: the training corpus is cut into non-overlapping windows of seq_len + 1 tokens, each
  scored by its mean unigram surprisal under the corpus's own token frequencies (−log p(token),
  p = count / total over the whole training corpus): deterministic, one pass of ``bincount``. In
  stage k of K, batches are drawn uniformly (from the stage's seed) from the easiest (k+1)/K of the
  windows, so the last stage draws from all of them (a "baby steps" curriculum: easy first, hard
  added). On pystdlib-train (2.94 M tokens, 22,812 windows of 129; mean surprisal 5.2-9.7 nats,
  terciles at 6.4 and 6.7) the easiest windows are tables of common tokens (hex literals and
  commas), the middle ones mapping tables and ordinary code, the hardest long string literals of
  rare (non-ASCII) characters: a cheap proxy, not a judgement of how hard code is. A later train stage of the
  same trial neither grows the model again nor orders the data (uniform over all windows).
- Schedule: stages are shares of the stage's step count (``state.max_steps``), which the loop
  sets from the token budget, or under a FLOP budget from the first step's cost; with growth the
  first (shallow) step would overstate what a FLOP budget buys, so growth needs ``train.tokens``
  (``train.flops`` may be given too, as a cap: a pipeline gives every arm the same ``flops`` and
  the growing arms a token budget that spends no more).
- Baselines (``variant``, or the same as methods of their own, for a pipeline's choice and claim):
  ``stacking`` / ``cgls_stacking`` (growth, shuffled windows), ``curriculum`` / ``cgls_curriculum``
  (full depth from the start, easy → hard windows), and ``none`` (full depth, shuffled) at the same FLOPs.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from optuna.distributions import CategoricalDistribution, IntDistribution

from paretolab import Method, Metric, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.plugin_api.subject import Subject
from paretolab.plugins._layerwise import decoder_layers
from paretolab.plugins.layerdrop import remove_layers
from paretolab.training.hooks import TrainingHook, training_of

PAPER = Paper("Curriculum-Guided Layer Scaling for Language Model Pretraining", "arXiv 2025", "https://arxiv.org/abs/2506.11389")
NEW_LAYERS = ("copy_top", "identity")
VARIANTS = ("cgls", "stacking", "curriculum")
METRICS = (
    Metric("cgls_final_layers", "layers", "maximize", "cgls: decoder layers at the end of the train stage (below the model's depth: a budget or time cap stopped growth)"),
)


def depth_schedule(start: int, full: int, stages: int) -> list[int]:
    """Depth of each stage: linear from ``start`` to ``full`` over ``stages``."""
    return [math.floor(start + (full - start) * k / (stages - 1) + 0.5) for k in range(stages)]  # halves round up


def stage_of(step: int, max_steps: int, stages: int) -> int:
    """The stage (0-based) of ``step``: stage k covers steps [k/K, (k+1)/K) of ``max_steps`` (stage 0 until the loop knows it)."""
    if max_steps <= 0:
        return 0
    return min(stages - 1, step * stages // max_steps)


def window_difficulty(ids: torch.Tensor, window: int) -> torch.Tensor:
    """Mean unigram surprisal (nats) of each non-overlapping ``window``-token slice of ``ids`` under ``ids``' own token frequencies."""
    counts = torch.bincount(ids, minlength=int(ids.max()) + 1).double()
    surprisal = -(counts / counts.sum()).log()
    n = ids.numel() // window
    return surprisal[ids[: n * window]].reshape(n, window).mean(dim=1)


def easy_to_hard(ids: torch.Tensor, window: int) -> torch.Tensor:
    """Window indices sorted from the easiest (lowest surprisal) to the hardest; ties by position (a stable sort)."""
    return torch.sort(window_difficulty(ids, window), stable=True).indices


def curriculum_batches(ids: torch.Tensor, order: torch.Tensor, *, batch: int, seq_len: int, stage: Callable[[], int], stages: int,
                       generator: torch.Generator, device: torch.device) -> Iterator[torch.Tensor]:
    """Endless (batch, seq_len + 1) windows; in stage k, drawn uniformly from the easiest (k+1)/K of ``order``."""
    window = seq_len + 1
    offsets = torch.arange(window, device="cpu")
    while True:
        pool = max(1, math.ceil(order.numel() * (stage() + 1) / stages))
        picks = order[torch.randint(0, pool, (batch,), generator=generator, device="cpu")]
        yield ids[(picks * window)[:, None] + offsets].to(device)


def grow(model: torch.nn.Module, depth: int, new_layers: str) -> list[int]:
    """Append copies of the top layers until ``model`` has ``depth`` layers; return the source index of each new layer."""
    layers = decoder_layers(model)
    have = len(layers)
    sources = list(range(max(0, 2 * have - depth), have))[: depth - have]  # the top (depth - have) layers, bottom first
    while len(sources) < depth - have:  # more than doubling: copy the top layers again
        sources += sources[: depth - have - len(sources)]
    config = model.config
    types = list(getattr(config, "layer_types", None) or [])
    for index, source in enumerate(sources, start=have):
        layer = copy.deepcopy(layers[source])
        for module in layer.modules():
            if hasattr(module, "layer_idx"):
                module.layer_idx = index
        if new_layers == "identity":
            with torch.no_grad():
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
        layers.append(layer)
        if types:
            types.append(types[source])
    config.num_hidden_layers = len(layers)
    if types:
        config.layer_types = types
    return sources


class CGLSHook(TrainingHook):
    """Grows the model at the stage boundaries and (with the curriculum) owns the data: easy windows first."""

    def __init__(self, depths: list[int], curriculum: bool, new_layers: str) -> None:
        self.depths, self.curriculum, self.new_layers = depths, curriculum, new_layers
        self.replaces = ("data",) if curriculum else ()
        self.history: list[tuple[int, int]] = []  # (step, depth) at each growth
        self.done = False  # grows in the first train stage only; later stages train the grown model

    def convert_model(self, model: torch.nn.Module, state: Any) -> None:
        if not self.done and self.depths[0] < self.depths[-1] and state.params.tokens is None:
            raise ConfigError(f"method {self.method!r} grows the model by shares of the train stage's steps: give train.tokens "
                              "(a FLOP budget alone is read at the first, shallowest step's cost and would overstate the steps)")

    def stage(self, state: Any) -> int:
        return stage_of(int(state.step), int(state.max_steps), len(self.depths))

    def before_step(self, state: Any) -> None:
        if self.done:
            return
        target = self.depths[self.stage(state)]
        if len(decoder_layers(state.model)) < target:
            grow(state.model, target, self.new_layers)
            state.rebuild_optimizer = True
            self.history.append((int(state.step), target))

    def step_signature(self, state: Any) -> tuple[Any, ...]:
        return ("depth", len(decoder_layers(state.model)))

    def data(self, state: Any) -> Iterator[torch.Tensor]:
        from paretolab.training.batches import corpus_token_ids

        opts = state.params
        ids = corpus_token_ids(state.subject.tokenizer, opts.corpus)
        order = easy_to_hard(ids, opts.seq_len + 1)
        generator = torch.Generator(device="cpu").manual_seed(opts.seed + 1_000_003 * state.training.stages_run)
        stages = len(self.depths) if not self.done else 1
        return curriculum_batches(ids, order, batch=opts.batch, seq_len=opts.seq_len, stage=lambda: self.stage(state) if not self.done else 0,
                                  stages=stages, generator=generator, device=state.device)

    def end_of_training(self, state: Any) -> None:
        self.done = True
        info = state.subject.info.setdefault("cgls", {})
        info["grown_at"] = [list(h) for h in self.history]
        info["final_depth"] = len(decoder_layers(state.model))


class CGLS(Method):
    """Remove the top layers now; the attached hook stacks them back (copies) over the train stage and orders the data easy → hard."""

    name = "cgls"
    kind = "training"
    paper = PAPER
    cost_is = "real"  # shallow early stages really run fewer layers: fewer training FLOPs per step
    fixed_variant: str | None = None  # the ablation methods below fix it (their own labels in a pipeline's choice and claim)
    metrics = tuple(m.name for m in METRICS)

    def measure(self, subject: Subject, ctx: TrialContext) -> dict[str, float]:
        return {"cgls_final_layers": float(len(decoder_layers(subject.model)))}

    def search_space(self) -> dict[str, Any]:
        # start_layers is not searched: its range is the model's depth, which the space cannot know
        space = {"stages": IntDistribution(2, 6), "new_layers": CategoricalDistribution(list(NEW_LAYERS))}
        return space if self.fixed_variant else {"variant": CategoricalDistribution(list(VARIANTS)), **space}

    def defaults(self) -> dict[str, Any]:
        out = {"variant": "cgls", "start_layers": 1, "stages": 3, "new_layers": "copy_top"}
        if self.fixed_variant:
            del out["variant"]
        return out

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        if self.fixed_variant:
            if "variant" in params:
                raise ConfigError(f"{self.name}.variant: this method is cgls with variant {self.fixed_variant!r}; drop the parameter")
            p["variant"] = self.fixed_variant
        variant, start, stages, new_layers = str(p["variant"]), int(p["start_layers"]), int(p["stages"]), str(p["new_layers"])
        full = len(decoder_layers(subject.model))
        if variant not in VARIANTS:
            raise ConfigError(f"cgls.variant must be one of {', '.join(VARIANTS)} (cgls: growth + curriculum; the others are its ablations), got {variant!r}")
        if not 1 <= start <= full:
            raise ConfigError(f"cgls.start_layers must be in [1, {full}] (the model's depth), got {start}")
        if stages < 2:
            raise ConfigError(f"cgls.stages must be >= 2 (growth and curriculum stages over the train stage), got {stages}")
        if new_layers not in NEW_LAYERS:
            raise ConfigError(f"cgls.new_layers must be one of {', '.join(NEW_LAYERS)}, got {new_layers!r}")
        grows = variant in ("cgls", "stacking")
        depths = depth_schedule(start if grows else full, full, stages)
        if depths[0] < full:
            remove_layers(subject.model, list(range(depths[0], full)))
        training_of(subject).attach(CGLSHook(depths, variant in ("cgls", "curriculum"), new_layers), method=self.name)
        subject.info["cgls"] = {"variant": variant, "depths": depths, "new_layers": new_layers}
        return subject


class CGLSStacking(CGLS):
    """The stacking ablation of cgls: growth on shuffled windows (no curriculum)."""

    name = "cgls_stacking"
    fixed_variant = "stacking"


class CGLSCurriculum(CGLS):
    """The curriculum ablation of cgls: full depth from the start, windows easy → hard (no growth)."""

    name = "cgls_curriculum"
    fixed_variant = "curriculum"


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(CGLS())
    register(CGLSStacking())
    register(CGLSCurriculum())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    for metric in METRICS:
        register(metric)

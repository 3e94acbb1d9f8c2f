"""Layer dropout during training (stochastic depth rising with depth and time), evaluated by early exit and self-speculation.

Elhoushi et al., "LayerSkip: Enabling Early Exit Inference and Self-Speculative Decoding", ACL 2024,
https://arxiv.org/abs/2404.16710 (no official training code found; the closest published recipe).

The paper's: during training each decoder layer l is skipped with a probability that is low for
early layers and high for late ones, and that grows over training (a curriculum), so the early
layers learn to stand alone; at inference the model exits early (the first k layers, then the
shared final norm and LM head) or drafts with its first k layers and verifies with the whole
model (self-speculative decoding).

Ours: the rate rises *linearly* with depth and time, p_l(t) = p_max · l/(L−1) · min(1, t/T_ramp)
with T_ramp = ``ramp`` × the stage's steps (the paper scales depth exponentially and has its own
curriculum); layer 0 is never skipped. The skipped set of a step is drawn from the train stage's
``seed`` and the step number alone, so a rerun (or a resumed trial) skips the same layers. A skipped
layer really does not run (its ``forward`` returns its input), which the FLOP counter sees through
``step_signature``; after each step and at the end of training every layer is whole again, so
the loop's evaluations and later stages see the full model. Not implemented: the paper's early-exit
loss (every layer's output through the shared head), its dropout-per-sample (we drop a layer
for the whole batch, which is what saves compute on a CPU), and its KV-cache reuse between draft
and verification (the self draft here keeps its own cache, see ``speculative/self_draft.py``).

The ``early_exit`` measure evaluates any trained model (so the ``none`` baseline too): perplexity
through the first 25 / 50 / 75 % of the layers (+ final norm + head, the layerdrop plugin's
``layers_removed``) and the mean accepted length of self-speculative decoding whose draft is the
first half of the layers (the speculative plugin's generator and layer-skipping drafter).
"""

from __future__ import annotations

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

PAPER = Paper("LayerSkip: Enabling Early Exit Inference and Self-Speculative Decoding", "ACL 2024", "https://arxiv.org/abs/2404.16710")
EXITS = (25, 50, 75)  # early exits, in percent of the depth

METRICS = (
    *(Metric(f"early_exit_ppl_{pct}", "ppl", "minimize", f"perplexity through the first {pct}% of the decoder layers, then the final norm and LM head") for pct in EXITS),
    Metric("selfspec_accepted_len", "tokens", "maximize", "self-speculative decoding whose draft is the model's first half of layers: tokens per verification forward"),
)


def drop_rates(n_layers: int, step: int, ramp_steps: float, p_max: float) -> list[float]:
    """p_l(t) = p_max · l/(L−1) · min(1, t/T_ramp) for l = 0..L−1 (layer 0 always runs)."""
    time = 1.0 if ramp_steps <= 0 else min(1.0, step / ramp_steps)
    return [p_max * (l / (n_layers - 1) if n_layers > 1 else 0.0) * time for l in range(n_layers)]


def skipped_layers(rates: list[float], seed: int, step: int) -> tuple[int, ...]:
    """The layers to skip at ``step``: one Bernoulli draw per layer from a generator seeded by (seed, step) only."""
    generator = torch.Generator(device="cpu").manual_seed(seed * 1_000_003 + step)
    draws = torch.rand(len(rates), generator=generator, device="cpu").tolist()
    return tuple(i for i, (u, p) in enumerate(zip(draws, rates, strict=True)) if u < p)


def _pass_through(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The forward of a skipped decoder layer: its input, untouched (nothing of the layer runs)."""
    return hidden_states


def set_skipped(model: torch.nn.Module, skip: tuple[int, ...]) -> None:
    """Make exactly the layers in ``skip`` pass their input through; every other layer runs its own forward."""
    for index, layer in enumerate(decoder_layers(model)):
        if index in skip:
            layer.forward = _pass_through  # an instance attribute shadows the class's forward
        elif "forward" in layer.__dict__:
            del layer.forward


class LayerDropoutHook(TrainingHook):
    """Skips layers per step by the rising schedule; restores them after each step and at the end of training."""

    def __init__(self, p_max: float, ramp: float) -> None:
        self.p_max, self.ramp = p_max, ramp
        self.skipped: tuple[int, ...] = ()

    def choose(self, state: Any) -> tuple[int, ...]:
        """This step's skipped layers, from the stage's seed and step (no state of our own)."""
        n = len(decoder_layers(state.model))
        max_steps = getattr(state, "max_steps", 0) or 0  # the loop knows it after the first step: before, t = 0
        ramp_steps = 0.0 if self.ramp == 0 else self.ramp * max_steps if max_steps > 0 else math.inf
        rates = drop_rates(n, int(state.step), ramp_steps, self.p_max)
        return skipped_layers(rates, int(getattr(state.params, "seed", 0)), int(state.step))

    def before_step(self, state: Any) -> None:
        self.skipped = self.choose(state)
        set_skipped(state.model, self.skipped)

    def step_signature(self, state: Any) -> tuple[Any, ...]:
        return ("skip", self.choose(state))

    def after_step(self, state: Any) -> None:
        set_skipped(state.model, ())  # evaluations between steps see the whole model

    def end_of_training(self, state: Any) -> None:
        self.skipped = ()
        set_skipped(state.model, ())


class LayerDropout(Method):
    """Attach a training hook that skips decoder layers with a rate rising with depth and over training."""

    name = "layer_dropout"
    kind = "training"
    paper = PAPER
    cost_is = "real"  # skipped layers do not run: fewer training FLOPs

    def search_space(self) -> dict[str, Any]:
        return {"p_max": FloatDistribution(0.0, 0.8), "ramp": FloatDistribution(0.0, 1.0)}

    def defaults(self) -> dict[str, Any]:
        return {"p_max": 0.3, "ramp": 0.5}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        p_max, ramp = float(p["p_max"]), float(p["ramp"])
        if not 0.0 <= p_max < 1.0:
            raise ConfigError(f"layer_dropout.p_max must be in [0, 1) (the deepest layer's skip rate), got {p_max}")
        if not 0.0 <= ramp <= 1.0:
            raise ConfigError(f"layer_dropout.ramp must be in [0, 1] (fraction of the train stage's steps over which rates rise), got {ramp}")
        decoder_layers(subject.model)  # refuse a model without a Llama-style layer list now, not at the first step
        training_of(subject).attach(LayerDropoutHook(p_max, ramp), method=self.name)
        subject.info["layer_dropout"] = {"p_max": p_max, "ramp": ramp}
        return subject


@dataclass(frozen=True)
class EarlyExitOptions:
    corpus: str = option("pydoc", data="corpus")  # held-out text: pystdlib-val for the scratch models
    max_tokens: int = option(4096, low=2)  # tokens scored at each exit
    seq_len: int = option(128, low=2, at_most="max_tokens")  # window length
    draft_k: int = option(4, low=1, high=16)  # draft tokens per verification (self-speculative)
    prompts: int = option(4, low=1)  # held-out prompts decoded self-speculatively
    prompt_tokens: int = option(32, low=1)
    new_tokens: int = option(32, low=2)


def exit_depth(n_layers: int, pct: int) -> int:
    """Layers kept by an exit at ``pct`` percent of the depth (at least one)."""
    return min(n_layers, max(1, round(n_layers * pct / 100)))


def exit_cross_entropy(model: torch.nn.Module, ids: torch.Tensor, keep: int, seq_len: int) -> float:
    """Mean next-token CE (nats) of ``model`` run through its first ``keep`` layers on windows of ``ids``."""
    from paretolab.plugins.layerdrop import layers_removed

    n = len(decoder_layers(model))
    windows = ids[: ids.numel() // seq_len * seq_len].reshape(-1, seq_len)
    total, count = 0.0, 0
    with torch.no_grad(), layers_removed(model, list(range(keep, n))):
        for window in windows.split(4):
            logits = model(input_ids=window, use_cache=False).logits[:, :-1].float()
            targets = window[:, 1:]
            total += float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum"))
            count += targets.numel()
    return total / max(count, 1)


class EarlyExit(Measure):
    """Early-exit perplexity at 25/50/75 % depth and the accepted length of a first-half-layers self draft."""

    name = "early_exit"
    metrics = tuple(m.name for m in METRICS)
    options = EarlyExitOptions
    default = False

    def measure(self, subject: Subject, options: Any, ctx: TrialContext) -> dict[str, float]:
        from paretolab.plugins.speculative.corpus import heldout_prompts
        from paretolab.plugins.speculative.generator import SpeculativeGenerator
        from paretolab.plugins.speculative.self_draft import LayerSkipDrafter
        from paretolab.tasks import corpus_ids

        if not isinstance(options, EarlyExitOptions):
            options = parse_options(EarlyExitOptions, options, where="measures.early_exit")
        model = subject.model
        n = len(decoder_layers(model))
        ids = corpus_ids(subject.tokenizer, options.corpus, options.max_tokens).to(subject.device)
        if ids.numel() < options.seq_len:
            raise ConfigError(f"measures.early_exit: corpus {options.corpus!r} has {ids.numel()} tokens, fewer than seq_len={options.seq_len}")
        out = {f"early_exit_ppl_{pct}": math.exp(exit_cross_entropy(model, ids, exit_depth(n, pct), options.seq_len)) for pct in EXITS}
        draft = LayerSkipDrafter(range(exit_depth(n, 50), n))  # the draft: the first half of the layers
        prompts = heldout_prompts(subject.tokenizer, corpus=options.corpus, n=options.prompts, length=options.prompt_tokens)
        run = SpeculativeGenerator(draft, options.draft_k).generate(subject, prompts, max_new_tokens=options.new_tokens)
        out["selfspec_accepted_len"] = float(run.stats["mean_accepted_len"])
        return out


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(LayerDropout())


@hookimpl
def register_measures(register: Callable[[Measure], None]) -> None:
    register(EarlyExit())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    for metric in METRICS:
        register(metric)

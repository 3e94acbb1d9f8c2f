"""OmniSIFT's text analog: a small learned selector keeps a quarter of the context tokens that enter prefill.

OmniSIFT (ICML 2026; no official code) compresses the audio and video tokens an omni-modal LLM
(Qwen2.5-Omni-7B) reads with a learned compressor of 4.85M parameters, trained end to end through
the LLM with a differentiable straight-through estimator; with 25 % of the token context it beats
training-free compressors such as OmniZip.

This is an analog, said plainly. The paper's: a learned token selector trained end to end with a
straight-through estimator through a frozen LLM, a fixed share of the context kept, training-free
selectors as baselines. Ours: trained end to end through the frozen LM too, but by default through a
relaxed mask (soft mask values forward and backward, the hard top-k at inference), because the
straight-through gradient measured here carries no signal for the dropped tokens (``estimator:
straight_through`` keeps the paper's; :mod:`.train` gives the numbers); text, one modality, on
SmolLM2-135M, no spatio-temporal module; the selector is our own small network over the LM's input
embeddings (:mod:`.network`: a projection, position and repetition features, a bidirectional GRU;
~0.09M parameters, about the paper's share of its LLM), so selecting needs no LM forward; the kept
tokens form an ordinary shorter prompt with renumbered (contiguous) positions, as LLMLingua's
compressed prompts are; the loss is the NLL of LAMBADA's final word (:mod:`paretolab.tasks.lambada`,
trained on its train split, scored on the disjoint eval split); the mask acts inside every attention
layer (:mod:`.masking`), so the masked training forward equals the forward of the compressed prompt
(tested).

``transform`` installs a :class:`.generator.CompressingGenerator` (training the learned selector
first, or loading it from the cache); generation tasks then decode compressed prompts. Selectors
(``selector``), their scores and scoring FLOPs: :mod:`.selection`. Reported: ``context_kept_frac``,
``prefill_flops_ratio`` (scoring + compressed prefill ÷ full prefill, means over the prompts; the
lambada task also stores them per example), ``selector_params``, for ``learned`` the training's
``selector_train_s``, ``selector_train_flops`` (``paretolab.training.flops``), steps and loss, and
``prefill_speedup`` (``measure``: :mod:`.timing`, paired against the unmodified model).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from paretolab import Method, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.plugin_api.metrics import Metric
from paretolab.plugin_api.subject import Subject
from paretolab.plugins._layerwise import decoder_layers
from paretolab.plugins.omnisift_text.generator import CompressingGenerator
from paretolab.plugins.omnisift_text.selection import SELECTORS, Selection
from paretolab.plugins.omnisift_text.timing import measure_prefill
from paretolab.plugins.omnisift_text.train import ESTIMATORS, TrainSettings, model_fingerprint, train_selector
from paretolab.tasks.lambada import PREFILL_STATS, SOURCES

PAPER = Paper("OmniSIFT: learned token compression for omni-modal LLMs (text analog)", "ICML 2026", "")
TRAIN_SOURCES = ("task", *SOURCES)

METRICS = (
    Metric("selector_params", "params", "minimize", "omnisift_text: parameters of the token selector (0 for the training-free ones)"),
    Metric("selector_train_s", "s", "minimize", "omnisift_text: seconds the learned selector trained (the stored time when it came from the cache)"),
    Metric("selector_train_flops", "FLOPs", "minimize", "omnisift_text: FLOPs of the learned selector's training (forward + backward through the frozen LM)"),
    Metric("selector_train_steps", "steps", "maximize", "omnisift_text: optimizer steps the learned selector took (fewer than asked when max_train_s stopped it)"),
    Metric("selector_train_loss", "nats/token", "minimize", "omnisift_text: NLL of the target word at the end of the selector's training, under the training mask (soft values for estimator=relaxed; mean of the last 5 steps)"),
)


class OmniSiftText(Method):
    """Compress each prompt to ``keep`` of its tokens with a selector (learned or training-free), then decode it greedily."""

    name = "omnisift_text"
    # the first two are registered by the lambada task, prefill_speedup by the latency measure (the same meaning: base ÷ method)
    metrics = (*PREFILL_STATS, "prefill_speedup", *(m.name for m in METRICS))
    kind = "decoding"
    paper = PAPER
    cost_is = "real"  # fewer tokens really enter prefill

    def search_space(self) -> dict[str, Any]:
        return {
            "selector": CategoricalDistribution(list(SELECTORS)),
            "keep": FloatDistribution(0.05, 1.0),
            "protect_last": IntDistribution(1, 32),
            "window": IntDistribution(1, 64),
            "seed": IntDistribution(0, 1000),  # random's stream and learned's init and data order; trials pair on it
        }

    def defaults(self) -> dict[str, Any]:
        # the learned selector's training (steps, batch, lr, hidden, tau, train_context, max_train_s, estimator) is set, not searched
        return {"selector": "learned", "keep": 0.25, "protect_last": 4, "window": 8, "steps": 80, "batch": 4, "lr": 0.02,
                "hidden": 64, "tau": 0.5, "train_context": 96, "max_train_s": 420.0, "train_source": "task", "estimator": "relaxed",
                "timing_rounds": 5}  # paired prefill timings against the unmodified model in `measure` (0: none)

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {"seed": None, **self.defaults(), **params}
        selector = _checked(p)
        decoder_layers(subject.model)  # a Llama-style decoder, or a ConfigError naming the model
        seed = ctx.seed if p["seed"] is None else int(p["seed"])
        selection = Selection(selector, float(p["keep"]), int(p["protect_last"]), int(p["window"]))
        info: dict[str, Any] = {"selector": selector, "keep": selection.keep, "protect_last": selection.protect_last, "selector_params": 0}
        if selector == "random":
            selection.rng = torch.Generator(device="cpu").manual_seed(seed * 1_000_003 + 17)
        if selector == "learned":
            settings = TrainSettings(selection.keep, selection.protect_last, int(p["steps"]), int(p["batch"]), float(p["lr"]),
                                     int(p["hidden"]), float(p["tau"]), int(p["train_context"]), float(p["max_train_s"]),
                                     _train_source(str(p["train_source"]), ctx), seed, str(p["estimator"]))
            trained = train_selector(subject.model, subject.tokenizer, settings, model_key=model_fingerprint(subject.model, subject.model_name))
            selection.net = trained.net
            info.update(selector_params=trained.net.n_params(), train_source=settings.source,
                        **{f"train_{k}": v for k, v in trained.meta.items() if k != "losses"})
        subject.generator = CompressingGenerator(selection)
        info.update(timing_rounds=int(p["timing_rounds"]), timing_source=_train_source("task", ctx))
        subject.info["omnisift_text"] = info
        if "train_cached" in info:
            subject.info["omnisift_text_selector_cached"] = bool(info["train_cached"])  # a scalar: kept with the trial's info
        return subject

    def evaluate(self, subject: Subject, ctx: TrialContext) -> dict[str, float]:
        generator, info = subject.generator, subject.info.get("omnisift_text", {})
        if not isinstance(generator, CompressingGenerator):
            return {}
        out: dict[str, float] = {"selector_params": float(info.get("selector_params", 0))}
        if generator.records:
            out["context_kept_frac"] = statistics.fmean(f for f, _ in generator.records)
            out["prefill_flops_ratio"] = statistics.fmean(r for _, r in generator.records)
        if "train_train_s" in info:
            out.update(selector_train_s=float(info["train_train_s"]), selector_train_flops=float(info["train_train_flops"]),
                       selector_train_steps=float(info["train_steps"]), selector_train_loss=float(info["train_last_loss"]))
        return out

    def measure(self, subject: Subject, ctx: TrialContext) -> dict[str, float]:
        """``prefill_speedup``: time to the first token of one fixed LAMBADA prompt, unmodified ÷ compressed (paired)."""
        info = subject.info.get("omnisift_text", {})
        return measure_prefill(subject, ctx, int(info.get("timing_rounds", 0)), str(info.get("timing_source", "builtin")))


def _checked(p: dict[str, Any]) -> str:
    """The selector name, after every parameter was checked (a ConfigError names the field, the value and the fix)."""
    selector = str(p["selector"])
    if selector not in SELECTORS:
        raise ConfigError(f"omnisift_text.selector: {selector!r} is not known; use one of {', '.join(SELECTORS)}")
    if not 0.0 < float(p["keep"]) <= 1.0:
        raise ConfigError(f"omnisift_text.keep: {p['keep']!r} is out of range; give the share of prompt tokens kept, in (0, 1]")
    if int(p["protect_last"]) < 1:
        raise ConfigError(f"omnisift_text.protect_last: {p['protect_last']!r} is out of range; give >= 1 (the last token "
                          "predicts the next one and always enters prefill)")
    if int(p["timing_rounds"]) < 0:
        raise ConfigError(f"omnisift_text.timing_rounds: {p['timing_rounds']!r} is out of range; give >= 0 (0 times nothing)")
    for key in ("window", "steps", "batch", "hidden", "train_context"):
        if int(p[key]) < 1:
            raise ConfigError(f"omnisift_text.{key}: {p[key]!r} is out of range; give an integer >= 1")
    for key in ("lr", "tau", "max_train_s"):
        if not float(p[key]) > 0:
            raise ConfigError(f"omnisift_text.{key}: {p[key]!r} is out of range; give a number > 0")
    if p["estimator"] not in ESTIMATORS:
        raise ConfigError(f"omnisift_text.estimator: {p['estimator']!r} is not known; use one of {', '.join(ESTIMATORS)} "
                          "(relaxed: soft mask values in training, the default; straight_through: hard forward, soft gradient)")
    if p["train_source"] not in TRAIN_SOURCES:
        raise ConfigError(f"omnisift_text.train_source: {p['train_source']!r} is not known; use one of {', '.join(TRAIN_SOURCES)} "
                          "(task: the lambada task's own source, builtin under any other task)")
    return selector


def _train_source(name: str, ctx: TrialContext) -> str:
    """``task``: the source of the trial's lambada task (its train split), ``builtin`` under any other task."""
    if name != "task":
        return name
    return str(ctx.task.get("source", "lambada")) if ctx.task.get("name") == "lambada" else "builtin"


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(OmniSiftText())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    for metric in METRICS:
        register(metric)

"""Select to Think (S2T): the small model decodes; at uncertain steps the large one picks among its top-k.

Ye, Zhang, An, Carle, Ma, "Select to Think: Unlocking SLM Potential with Local Sufficiency" (ICML 2026,
code: YeRona/Select-to-Think). The paper's claim: at divergence points the large model's preferred token
is usually in the small model's top-K, so letting the large model *select* among those candidates
recovers most of what letting it *generate* (takeover at the same trigger points) recovers. Its S2T-Local
(the selection distilled into the small model) is not implemented here.

The subject of a trial is the *small* model (e.g. SmolLM2-135M after a ``layerdrop`` stage, which keeps
the tokenizer); ``large`` names the large model: a role of the pipeline's ``models:`` (loaded once per
worker by the platform and shared read-only by its trials), else a model name loaded once per process
(runs without ``models:``, such as the contract suite). Pairs whose tokenizers differ are refused. Each
model's calls, tokens and seconds also go to the trial's cost ledger (``ctx.costs``, roles ``small`` and
``large``; ``model_calls`` / ``model_tokens`` / ``model_s``), marked replayed when a decode was. The step loop, triggers, counting and calibration are in
:mod:`paretolab.plugins.select_to_think.decode` (what is the paper's and what is ours is said there).

Calibration (the paper's rule, our split): the trigger threshold is the ``quantile`` of the trigger
scores seen while the small model decodes ``calib_examples`` problems greedily; the problems are the
task's own generator with ``seed + 1000`` (tasks without a ``seed`` option need an explicit
``threshold``). Labels are never read, so overlap with evaluated problems leaks no answers. Its cost
(``calib_large_calls``) is reported apart, once per trial, not in the per-example counts.

Methods: ``select_to_think`` (``guide: select`` is S2T, ``guide: takeover`` the paper's takeover
baseline at the same trigger points; ``trigger: none`` is small greedy), and ``large_only`` (the
large model decodes alone, small model unused). The small self-consistency baseline is the existing
``self_consistency`` method on the same small subject. Costs are counted, not simulated: every forward
pass of a model is a call; ``*_tokens`` are the tokens those passes processed, prompts included.

Replay (ours, in-process only): every decode here is deterministic, so a decode identical to an earlier
one in the same worker (same small weights, large model, settings, threshold, prompt, budget and stops)
is replayed with its counted calls and its measured times; ``decodes_replayed`` says for how many
examples of the trial. Calibration scores are cached the same way (the quantile is applied after).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
from optuna.distributions import (
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from paretolab import Method, Metric, Paper, hookimpl
from paretolab.errors import ConfigError
from paretolab.generation import Generation
from paretolab.plugins.select_to_think.decode import (
    GUIDES,
    TRIGGERS,
    Decoded,
    S2TSettings,
    calibrate_threshold,
    large_only_decode,
    s2t_decode,
)

if TYPE_CHECKING:
    from paretolab.plugin_api.context import TrialContext
    from paretolab.plugin_api.subject import Subject

PAPER = Paper("Select to Think: Unlocking SLM Potential with Local Sufficiency", "ICML 2026", "https://github.com/YeRona/Select-to-Think")
CALIB_SEED_OFFSET = 1000  # calibration problems: the task's generator at seed + this
_LARGE: dict[tuple[str, str], Subject] = {}  # (model name, device) -> loaded once per process, shared read-only
_CALIBRATION: dict[str, tuple[list[float], int]] = {}  # calibration key -> (trigger scores, large calls they cost)
_DECODED: dict[str, Decoded] = {}  # decode key -> its result: every decode here is deterministic, so a repeat is replayed


def large_subject(name: str, device: torch.device, ctx: TrialContext | None = None) -> Subject:
    """The large model: the pipeline's role ``name`` (``models:``, loaded once by the worker), else the model ``name``
    loaded on first use and kept for every later trial of this process (runs without ``models:``, e.g. the contract)."""
    if ctx is not None and name in ctx.models:
        return ctx.models[name]
    key = (name, str(device))
    if key not in _LARGE:
        from paretolab.models import load_subject

        with torch.device("cpu"):  # build real weights whatever default device the caller runs under
            subject = load_subject(name)
        subject.model.requires_grad_(False)
        _LARGE[key] = subject.to(device)
    return _LARGE[key]


def check_shared_tokenizer(small: Subject, large: Subject) -> None:
    """Refuse a pair whose tokenizers map text to different ids (selection compares token ids)."""
    from paretolab.training.batches import tokenizer_fingerprint

    if tokenizer_fingerprint(small.tokenizer) != tokenizer_fingerprint(large.tokenizer):
        raise ConfigError(
            f"select_to_think.large: {large.model_name!r} does not share {small.model_name!r}'s tokenizer, so its logits do not "
            "index the small model's candidates; pair models with one tokenizer (e.g. a layer-dropped SmolLM2 and smollm2-135m)"
        )


@dataclass
class S2TGenerator:
    """Decodes each prompt with :func:`s2t_decode` (or the large model alone); reports both models' calls."""

    settings: S2TSettings
    large: str
    quantile: float = 0.95
    calib_examples: int = 8
    calibrate: bool = True  # False: settings.threshold is used as given
    large_only: bool = False

    def generate(self, subject: Subject, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                 stop_ids: Sequence[int] = (), ctx: TrialContext | None = None) -> Generation:
        needs_large = self.large_only or self.settings.trigger != "none"
        large = large_subject(self.large, subject.device, ctx) if needs_large else None
        if large is not None:
            check_shared_tokenizer(subject, large)
        fingerprint = _fingerprint(subject.model) if not self.large_only else ""
        large_id = f"{large.model_name}@{id(large.model)}" if large is not None else ""  # the process's one copy of that model
        settings, calib_calls = self.settings, 0
        if self.calibrate and settings.trigger in ("entropy", "kl") and not self.large_only:
            threshold, calib_calls = self._threshold(subject, large, fingerprint, large_id, max_new_tokens, stop_ids, ctx)
            settings = replace(settings, threshold=threshold)
        decoded, replayed = [], 0
        for p in prompts:
            key = _key([fingerprint, large_id, self.large_only, repr(_decisive(settings)), list(p), max_new_tokens, sorted(stop_ids)])
            if key in _DECODED:
                replayed += 1
            elif self.large_only and large is not None:
                _DECODED[key] = large_only_decode(large.model, p, max_new_tokens=max_new_tokens, stop_ids=stop_ids)
            else:
                _DECODED[key] = s2t_decode(subject.model, large.model if large is not None else None, p, settings,
                                           max_new_tokens=max_new_tokens, stop_ids=stop_ids)
            decoded.append(_DECODED[key])
        generation = _as_generation(decoded, settings.threshold, calib_calls)
        generation.stats["decodes_replayed"] = replayed / max(len(prompts), 1)
        if ctx is not None:
            _book(ctx, decoded, replayed=replayed > 0)
        return generation

    def _threshold(self, subject: Subject, large: Subject | None, fingerprint: str, large_id: str, max_new_tokens: int,
                   stop_ids: Sequence[int], ctx: TrialContext | None) -> tuple[float, int]:
        """The calibrated threshold and the large calls calibration costs (its scores cached per process; the quantile is not in the key)."""
        prompts = calibration_prompts(subject.tokenizer, ctx, self.calib_examples)
        probe = S2TSettings(trigger=self.settings.trigger, support=self.settings.support, warmup=self.settings.warmup)  # never fires
        key = _key([fingerprint, large_id if probe.scores_need_large else "", repr(probe), prompts, sorted(stop_ids), max_new_tokens])
        if key not in _CALIBRATION:
            runs = [s2t_decode(subject.model, large.model if large is not None else None, p, probe,
                               max_new_tokens=max_new_tokens, stop_ids=stop_ids) for p in prompts]
            _CALIBRATION[key] = ([s for r in runs for s in r.scores], sum(r.large_calls for r in runs))
        scores, calls = _CALIBRATION[key]
        return calibrate_threshold(scores, self.quantile), calls


def _decisive(settings: S2TSettings) -> S2TSettings:
    """The settings with those that cannot change the decode blanked: none never asks the large model; takeover ignores k."""
    if settings.trigger == "none":
        return S2TSettings(trigger="none")
    return replace(settings, k=1) if settings.guide == "takeover" else settings


def _fingerprint(model: torch.nn.Module) -> str:
    """A hash of the model's config and weights (any change shows; ~1 s for SmolLM2)."""
    from paretolab.plugins.parallel_probe.traces import model_fingerprint

    return model_fingerprint(model)


def _key(material: list[Any]) -> str:
    return hashlib.sha256(json.dumps(material, default=str).encode()).hexdigest()


def calibration_prompts(tokenizer: Any, ctx: TrialContext | None, n: int) -> list[list[int]]:
    """Prompts of ``n`` problems the trial does not evaluate: the task's generator at ``seed + 1000``."""
    from paretolab.plugin_api.manager import registries
    from paretolab.plugin_api.options import parse_options
    from paretolab.tasks.generation import GenerationTask, prompt_ids, resolve_style

    cfg = dict(ctx.task) if ctx is not None else {}
    name = cfg.pop("name", None)
    tasks = registries().tasks
    task = tasks.get(name) if name in tasks else None
    fields = getattr(getattr(task, "options", None), "__dataclass_fields__", {})
    if not isinstance(task, GenerationTask) or "seed" not in fields:
        raise ConfigError(f"select_to_think: task {name!r} has no `seed` option to draw a calibration split from; "
                          "set select_to_think.threshold to a trigger level instead")
    cfg["seed"] = int(cfg.get("seed", fields["seed"].default)) + CALIB_SEED_OFFSET
    cfg["limit"] = n
    options = parse_options(task.options, cfg, where="task")
    shots, examples = task.examples(options)
    style = resolve_style(tokenizer, options.prompt)
    return [prompt_ids(tokenizer, ex, shots, style) for ex in examples]


def _book(ctx: TrialContext, decoded: list[Decoded], *, replayed: bool) -> None:
    """Record each model's calls, tokens and seconds in the trial's cost ledger (roles ``small`` and ``large``)."""
    small = [d for d in decoded if d.small_calls]
    large = [d for d in decoded if d.large_calls]
    if small:
        ctx.costs.add("small", calls=sum(d.small_calls for d in small), tokens=sum(d.small_tokens for d in small), replayed=replayed,
                      seconds=sum(d.prefill_s + d.decode_s - d.large_s for d in small))
    if large:
        ctx.costs.add("large", calls=sum(d.large_calls for d in large), tokens=sum(d.large_tokens for d in large), replayed=replayed,
                      seconds=sum(d.large_s for d in large))


def _as_generation(decoded: list[Decoded], threshold: float, calib_calls: int) -> Generation:
    n = max(len(decoded), 1)
    new_tokens = max(sum(len(d.tokens) for d in decoded), 1)
    steps = sum(len(d.tokens) for d in decoded)
    stats = {
        "large_calls": sum(d.large_calls for d in decoded) / n,
        "large_tokens": sum(d.large_tokens for d in decoded) / n,
        "small_calls": sum(d.small_calls for d in decoded) / n,
        "small_tokens": sum(d.small_tokens for d in decoded) / n,
        "large_calls_per_token": sum(d.large_calls for d in decoded) / new_tokens,
        "trigger_rate": sum(d.fired for d in decoded) / max(steps, 1),
        "flip_rate": sum(d.flipped for d in decoded) / max(steps, 1),
        "calib_large_calls": float(calib_calls),
    }
    if math.isfinite(threshold):
        stats["s2t_threshold"] = threshold
    total = sum(len(d.tokens) for d in decoded)
    return Generation([d.tokens for d in decoded], total, total, sum(d.prefill_s for d in decoded), sum(d.decode_s for d in decoded), stats)


_STATS = ("decodes_replayed", "large_calls", "large_tokens", "small_calls", "small_tokens", "large_calls_per_token", "trigger_rate", "flip_rate", "calib_large_calls")


class SelectToThink(Method):
    """Small model decodes; where the trigger fires the large model selects among its top-k (or takes over)."""

    name = "select_to_think"
    kind = "decoding"
    paper = PAPER
    cost_is = "real"
    metrics = (*_STATS, "s2t_threshold")

    def search_space(self) -> dict[str, Any]:
        return {
            "trigger": CategoricalDistribution(list(TRIGGERS)),
            "guide": CategoricalDistribution(list(GUIDES)),
            "k": IntDistribution(1, 64),
            "quantile": FloatDistribution(0.5, 1.0),
            "warmup": IntDistribution(0, 8),
        }

    def defaults(self) -> dict[str, Any]:
        return {"large": "smollm2-135m", "trigger": "entropy", "guide": "select", "k": 8, "quantile": 0.95,
                "support": 64, "warmup": 0, "calib_examples": 8, "threshold": None}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        threshold = p["threshold"]
        settings = S2TSettings(trigger=str(p["trigger"]), guide=str(p["guide"]), k=int(p["k"]), support=int(p["support"]),
                               warmup=int(p["warmup"]), threshold=math.inf if threshold is None else float(threshold))
        if int(p["calib_examples"]) < 1:
            raise ConfigError(f"select_to_think.calib_examples must be >= 1, got {p['calib_examples']}")
        subject.generator = S2TGenerator(settings, str(p["large"]), float(p["quantile"]), int(p["calib_examples"]),
                                         calibrate=threshold is None)
        return subject


class LargeOnly(Method):
    """The large model decodes alone, greedily (the S2T baseline whose gain S2T should recover); the subject is unused."""

    name = "large_only"
    kind = "decoding"
    paper = PAPER
    cost_is = "real"
    metrics = _STATS

    def defaults(self) -> dict[str, Any]:
        return {"large": "smollm2-135m"}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        subject.generator = S2TGenerator(S2TSettings(trigger="none"), str(p["large"]), calibrate=False, large_only=True)
        return subject


@dataclass
class SmallVote:
    """Self-consistency of the small model (parallel_probe's recorder, no probes) with the large model's calls reported as 0."""

    settings: Any  # paretolab.plugins.parallel_probe.traces.RecordSettings

    def generate(self, subject: Subject, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                 stop_ids: Sequence[int] = (), ctx: TrialContext | None = None) -> Generation:
        from paretolab.plugins.parallel_probe import BranchVoteGenerator

        out = BranchVoteGenerator(self.settings).generate(subject, prompts, max_new_tokens=max_new_tokens, stop_ids=stop_ids, ctx=ctx)
        n = max(len(prompts), 1)
        out.stats = {"traces_cached": out.stats.get("traces_cached", 0.0), "large_calls": 0.0, "large_tokens": 0.0, "large_calls_per_token": 0.0,
                     "small_tokens": (out.tokens_total + sum(map(len, prompts))) / n}  # one prefill per question, shared by its branches
        return out


class SmallSelfConsistency(Method):
    """The S2T paper's small-model baseline: majority vote over N sampled decodes of the small model, no large model."""

    name = "s2t_self_consistency"
    kind = "decoding"
    paper = PAPER
    cost_is = "real"
    metrics = ("traces_cached", "large_calls", "large_tokens", "large_calls_per_token", "small_tokens")

    def search_space(self) -> dict[str, Any]:
        return {"n_branches": CategoricalDistribution([4, 8, 16])}

    def defaults(self) -> dict[str, Any]:
        return {"n_branches": 8, "temperature": 0.7, "top_p": 0.8, "seed": 0}  # the paper's SLM sampling (it adds top_k 20)

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        from paretolab.plugins.parallel_probe.traces import RecordSettings

        p = {**self.defaults(), **params}
        # probes every 10^6 tokens: never, so the recording is plain sampled decoding
        settings = RecordSettings(n_branches=int(p["n_branches"]), temperature=float(p["temperature"]), top_p=float(p["top_p"]),
                                  seed=int(p["seed"]), probe_grid=1_000_000)
        subject.generator = SmallVote(settings)
        return subject


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(SelectToThink())
    register(LargeOnly())
    register(SmallSelfConsistency())


@hookimpl
def register_models(register: Callable[[Any], None]) -> None:
    """``smollm2-135m-drop2``: S2T's small model, SmolLM2-135M minus its 2 lowest block-influence layers (same tokenizer)."""
    from paretolab.plugins.routing.models import LayerDroppedSmolLM2

    register(LayerDroppedSmolLM2(2))


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    register(Metric("large_calls", "calls", "minimize", "routing: forward passes of the large model per example (a catch-up over several tokens is one)"))
    register(Metric("large_tokens", "tokens", "minimize", "routing: tokens the large model processed per example, prompt included"))
    register(Metric("small_calls", "calls", "minimize", "routing: forward passes of the small model per example"))
    register(Metric("small_tokens", "tokens", "minimize", "routing: tokens the small model processed per example, prompt included"))
    register(Metric("large_calls_per_token", "ratio", "minimize", "routing: large-model forward passes per generated token (large only: 1)"))
    register(Metric("trigger_rate", "fraction", "minimize", "select_to_think: decode steps at which the trigger fired"))
    register(Metric("flip_rate", "fraction", "minimize", "select_to_think: decode steps whose token the large model changed"))
    register(Metric("calib_large_calls", "calls", "minimize", "select_to_think: large-model calls the threshold calibration costs (per trial; reported also when this process reused it)"))
    register(Metric("decodes_replayed", "fraction", "maximize", "select_to_think/large_only: examples whose decode (tokens, counts, times) was replayed from an identical earlier one in this worker"))
    register(Metric("s2t_threshold", "score", "minimize", "select_to_think: the calibrated trigger threshold"))

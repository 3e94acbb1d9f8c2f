"""A contract test suite that every method's tests reuse by overriding one fixture.

Usage in a plugin's tests (``from paretolab.testing import MethodContract``)::

    class TestMyMethod(MethodContract):
        @pytest.fixture
        def method(self):
            return MyMethod()

It runs each check on a tiny random Llama (override ``subject`` for another model, ``params`` to pin parameters).
"""

from __future__ import annotations

import difflib
import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch

from paretolab.errors import ConfigError
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.cost_claims import (  # noqa: F401  (held_bytes, needed_bits, size_shortfalls, observable_state: for plugins' tests)
    LOSSLESS_TOLERANCE, PARAMETER_KINDS, check_artifact_sizes, held_bytes, needed_bits, observable_state, output_change, parameter_effects, size_shortfalls, weights_of)
from paretolab.plugin_api.devices import tensors_default_to
from paretolab.plugin_api.method import KINDS, Method
from paretolab.plugin_api.subject import Subject
from paretolab.records import StagePlan, TrialSettings
from paretolab.study.metric_owners import ownership_problem


def sample_params(method: Method, seed: int = 0) -> dict[str, Any]:
    """Defaults overlaid with one seeded random draw from the method's search space."""
    space = method.search_space()
    params = dict(method.defaults())
    if space:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
        params.update(study.ask(space).params)
    return params


CAUSAL_TOLERANCE = 1e-3  # relative: a longer batch may sum in another order; a non-causal model differs by its logits' scale


def logits_of(subject: Subject, text: str = "The quick brown fox jumps over the lazy dog. " * 4) -> torch.Tensor:
    from paretolab.data import encode

    ids = torch.tensor([encode(subject.tokenizer, text)[:64]], device=subject.device)
    with torch.no_grad():
        return subject.model(input_ids=ids).logits.float()


def reported_bytes(subject: Subject, ctx: TrialContext) -> int:
    """``size_bytes`` as the size measure reports it."""
    from paretolab.measure.measures import NoOptions, Size

    return int(Size().measure(subject, NoOptions(), ctx)["size_bytes"])


def contract_settings(method: Method, measures: dict[str, dict[str, Any]] | None = None) -> list[Any]:
    """The trial settings the contract runs a method under: perplexity, and a generation task for decoding methods."""
    from paretolab.records import TrialSettings

    if method.kind in LEARNER_CONTRACT_TASKS:  # no language model: only the kind's own task runs (it fits the learner)
        return [TrialSettings("contract", method.kind, LEARNER_CONTRACT_TASKS[method.kind], measures, seed=0)]
    settings = [TrialSettings("contract", "perplexity", {"max_tokens": 256, "context": 64, "stride": 64}, measures, seed=0)]
    if method.kind == "decoding":  # a decoding method also runs under a generation task, whose stats it may feed
        settings.append(TrialSettings("contract", "arithmetic", {"limit": 2, "max_new_tokens": 8}, measures, seed=0))
    if method.kind == "routing":  # a routing method also routes a generated question set among contract_roles' models
        settings.append(TrialSettings("contract", "mc_routing", ROUTING_TASK, measures, seed=0))
    if method.kind == "coding":  # a coding method's coder runs under the compression task
        settings.append(TrialSettings("contract", "compression", CODING_CONTRACT_TASK, measures, seed=0))
    return settings


ROUTING_TASK = {"datasets": "builtin", "limit": 24}


def contract_roles(method: Method, subject: Subject) -> dict[str, Subject]:
    """The role models a routing method is checked among: the subject as ``small`` and two other tiny random Llamas."""
    if method.kind != "routing":
        return {}
    from paretolab.models import TinyLlama

    return {"small": subject, "medium": TinyLlama(seed=1, layers=2).load().to(subject.device),
            "large": TinyLlama(seed=2, layers=3).load().to(subject.device)}


CODING_CONTRACT_TASK = {"n_texts": 1, "text_chars": 48}
# Methods that put a learner on a subject with no language model: kind -> the contract's task options (the task is named as the kind).
LEARNER_CONTRACT_TASKS = {"tabular": {"dataset": "synth-class", "rows": 400},
                          "sequence": {"dataset": "regimes", "sequences": 120, "length": 12},
                          "paired_retrieval": {"train": 300, "test": 100}}


@contextmanager
def _env(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def check_tensor_devices(method: Method, subject: Subject, params: dict[str, Any]) -> None:
    """transform, the task, evaluate and measure make every tensor on the model's device (see tensors_default_to)."""
    from paretolab.study.trial import run_trial

    roles = contract_roles(method, subject)
    for number, settings in enumerate(contract_settings(method, {})):
        with tensors_default_to("meta"), _env(PARETOLAB_RECORD_ANEW="1"):  # cached decodes would hide the code
            result = run_trial(subject, [StagePlan("stage0", method.name, dict(params))], settings, number=number, roles=roles)
        assert not result.failed, (
            f"{method.name} under task {settings.task!r}: a tensor was made without device=: "
            f"{result.error}\n{result.traceback}"
        )


class MethodContract:
    """Checks every method must pass. Override the ``method`` fixture.

    What a method is, it declares on itself, and the checks read it there: ``preserves_output`` (the identity, or the
    same function on another schedule), ``lossless`` and ``lossless_setting``, ``inert_params``, ``causal``,
    ``layerwise``, ``works_on``. A subclass only chooses the method, the subject and (for speed) the parameters.
    """

    @pytest.fixture
    def method(self) -> Method:
        raise NotImplementedError("override the `method` fixture with an instance of your Method")

    @pytest.fixture
    def subject(self) -> Subject:
        from paretolab.models import TinyLlama

        return TinyLlama(layers=2, hidden=64).load()

    @pytest.fixture
    def params(self, method: Method) -> dict[str, Any]:
        return sample_params(method, seed=0)

    @pytest.fixture
    def ctx(self, tmp_path: Path) -> TrialContext:
        return TrialContext(seed=0, workdir=tmp_path / "trial", study="contract", task={"name": "perplexity"})

    def test_describes_itself(self, method: Method) -> None:
        info = method.describe()
        assert info["name"] and isinstance(info["name"], str)
        assert info["kind"] in KINDS
        assert info["cost_is"] in ("real", "simulated")
        json.dumps(info)  # plain data for the CLI and the dashboard

    def test_search_space_is_valid(self, method: Method) -> None:
        space = method.search_space()
        for key, dist in space.items():
            assert isinstance(dist, optuna.distributions.BaseDistribution), key
        for key, value in method.defaults().items():
            if key in space:
                assert space[key]._contains(space[key].to_internal_repr(value)), f"default {key}={value!r} is outside the search space"

    def test_transform_leaves_a_runnable_model(self, method: Method, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> None:
        before = logits_of(subject)
        out = method.transform(subject.copy(), dict(params), ctx)
        assert isinstance(out, Subject), "transform() must return the Subject"
        after = logits_of(out)
        assert after.shape[-1] == before.shape[-1]
        assert torch.isfinite(after).all(), "the transformed model produces non-finite logits"

    def test_reported_metrics_are_registered_and_finite(self, method: Method, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> None:
        from paretolab.plugin_api.manager import registries

        out = method.transform(subject.copy(), dict(params), ctx)
        metrics = {**method.evaluate(out, ctx), **method.measure(out, ctx)}
        registered = registries().metrics
        for name, value in metrics.items():
            assert name in registered, f"metric {name!r} is not registered (use the register_metrics hook)"
            assert name in method.metrics, f"metric {name!r} is reported but not declared: add it to {type(method).__name__}.metrics"
            assert math.isfinite(float(value)), f"metric {name!r} = {value}"
        problem = ownership_problem(method, metrics)
        assert problem is None, problem

    def test_runs_as_a_trial(self, method: Method, subject: Subject, params: dict[str, Any]) -> None:
        from paretolab.study.trial import run_trial

        settings = TrialSettings("contract", "perplexity", {"max_tokens": 256, "context": 64, "stride": 64}, {"size": {}, "params": {}}, seed=0)
        result = run_trial(subject, [StagePlan("stage0", method.name, dict(params))], settings, number=0)
        assert not result.failed, result.traceback
        assert math.isfinite(result.metrics["ppl"]) and result.metrics["size_bytes"] > 0
        if method.kind == "decoding":  # a decoding method also runs under a generation task, whose stats it may feed
            settings = TrialSettings("contract", "arithmetic", {"limit": 2, "max_new_tokens": 8}, {"params": {}}, seed=0)
            result = run_trial(subject, [StagePlan("stage0", method.name, dict(params))], settings, number=1)
            assert not result.failed, result.traceback
            assert 0.0 <= result.metrics["acc"] <= 1.0 and result.metrics["tokens_total"] > 0
        if method.kind == "routing":  # a routing method routes questions among several models and accounts for each
            settings = TrialSettings("contract", "mc_routing", ROUTING_TASK, {"params": {}}, seed=0)
            result = run_trial(subject, [StagePlan("stage0", method.name, dict(params))], settings, number=2, roles=contract_roles(method, subject))
            assert not result.failed, result.traceback
            assert 0.0 <= result.metrics["acc"] <= 1.0 and result.metrics["model_calls"] > 0
            assert all(result.info[f"cost.{role}.s_is"] == "replayed" for role in ("small", "medium", "large"))
        if method.kind == "coding":  # its coder compresses and decodes back exactly (the params' own mismatch aside)
            settings = TrialSettings("contract", "compression", CODING_CONTRACT_TASK, {"params": {}}, seed=0)
            result = run_trial(subject, [StagePlan("stage0", method.name, {**dict(params), **({"mismatch": "none"} if "mismatch" in params else {})})], settings, number=2)
            assert not result.failed, result.traceback
            assert result.metrics["decode_ok"] == 1.0 and result.metrics["bpb"] > 0

    def test_makes_tensors_on_the_model_device(self, method: Method, subject: Subject, params: dict[str, Any]) -> None:
        check_tensor_devices(method, subject, params)

    def test_same_seed_same_model(self, method: Method, subject: Subject, params: dict[str, Any], tmp_path: Path) -> None:
        outputs = []
        for run in range(2):
            ctx = TrialContext(seed=7, workdir=tmp_path / f"run{run}")
            torch.manual_seed(7)
            outputs.append(logits_of(method.transform(subject.copy(), dict(params), ctx)))
        assert torch.equal(outputs[0], outputs[1]), "the same seed and params must give the same model"

    def test_ignores_the_global_rng(self, method: Method, subject: Subject, params: dict[str, Any], tmp_path: Path) -> None:
        outputs = []
        for global_seed in (1, 2):
            ctx = TrialContext(seed=7, workdir=tmp_path / f"global{global_seed}")
            torch.manual_seed(global_seed)
            outputs.append(logits_of(method.transform(subject.copy(), dict(params), ctx)))
        assert torch.equal(outputs[0], outputs[1]), "the model depends on torch's global RNG state: draw randomness from ctx.generator() instead"

    def test_reports_what_it_stores(self, method: Method, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> None:
        if method.cost_is != "real":
            pytest.skip("size_bytes of a simulated method is the size it would have, not what it keeps")
        if method.sized_by_artifact:
            return check_artifact_sizes(method, method.transform(subject.copy(), dict(params), ctx))
        unreported_before, out = held_bytes(subject.model) - reported_bytes(subject, ctx), method.transform(subject.copy(), dict(params), ctx)
        unreported_after = held_bytes(out.model) - reported_bytes(out, ctx)
        assert unreported_after <= unreported_before, (
            f"the model keeps {unreported_after - unreported_before} bytes more than size_bytes reports: "
            "keep weights as Parameters (counted dense) or report formats with subject.set_storage(..., stored_bytes=N)"
        )

    def test_defaults_belong_to_the_space(self, method: Method) -> None:
        space = method.search_space()
        undefaulted = [key for key in space if key not in method.defaults()]
        for key in method.defaults():
            if key not in space:
                close = difflib.get_close_matches(key, undefaulted, n=1, cutoff=0.6)
                assert not close, f"defaults() key {key!r} is not in search_space(); did you mean {close[0]!r}?"

    def test_is_causal(self, method: Method, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> None:
        from paretolab.generation.causality import causal_gap

        if method.kind in LEARNER_CONTRACT_TASKS or not method.causal:
            pytest.skip("no language model: nothing computes over positions" if method.causal else
                        f"{type(method).__name__}.causal is False: its output at a position reads later tokens by design")
        out = method.transform(subject.copy(), dict(params), ctx)
        ids = torch.randint(0, int(getattr(out.model.config, "vocab_size", 256)), (1, 48), generator=torch.Generator().manual_seed(0)).to(out.device)
        gap = causal_gap(out.model, ids, 24)
        assert gap <= CAUSAL_TOLERANCE, f"logits at a prefix change by {gap:.3g} (relative) when tokens are appended: position t must not read tokens after t"

    def test_a_saving_changes_what_it_saves(self, method: Method, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> None:
        if method.kind in LEARNER_CONTRACT_TASKS:
            pytest.skip("no language model: its saving is the learner's")
        before, size = logits_of(subject), reported_bytes(subject, ctx)
        out = method.transform(subject.copy(), dict(params), ctx)
        after, saved = logits_of(out), reported_bytes(out, ctx) < size
        if method.lossless:
            assert torch.equal(after, before), "declared lossless, but its output differs from the base model's"
        elif saved:
            assert not torch.equal(after, before), (f"reports a saving (size_bytes {reported_bytes(out, ctx)} < {size}) while computing exactly the "
                                                    "base model's output: change what it claims to save, or declare lossless = True")

    def test_a_layerwise_method_keeps_to_its_scope(self, method: Method, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> None:
        """``layerwise = True`` promises a transform that changes only ``subject.scope``'s modules (a per-layer stage's group)."""
        if not method.layerwise:  # then a per-layer stage of it is refused, never run on the whole model per group
            from paretolab.study.layered import apply_by_layer
            with pytest.raises(ConfigError, match="is not layerwise"):
                apply_by_layer(method, subject.copy(), StagePlan("stage0", method.name, dict(params), {"0-1": {}}), ctx)
            return
        own, first = subject.copy(), method.layer_modules(subject)[0]
        before, own.scope = {k: v.detach().clone() for k, v in own.model.state_dict().items()}, frozenset({first})
        out = method.transform(own, dict(params), ctx)
        outside = [k for k, v in out.model.state_dict().items() if not k.startswith(f"{first}.") and not torch.equal(v, before.get(k, v + 1))]
        outside += [k for k in out.storage if not k.startswith(f"{first}.")]
        assert not outside, (f"with subject.scope = {{{first!r}}} it changed or set storage of {', '.join(sorted(outside)[:3])}: change only the "
                             "scope's modules (iterate linear_weights(subject.model, scope=subject.scope)) or drop layerwise")

    def test_changes_the_subject(self, method: Method, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> None:
        assert "changes_subject" not in dir(self), (
            f"{type(self).__name__}.changes_subject: declare it on the method instead ({type(method).__name__}.preserves_output = True)")
        own = subject.copy()
        before_state, before_logits, before_size = observable_state(own), logits_of(own), reported_bytes(own, ctx)
        out = method.transform(own, dict(params), ctx)
        changed = (
            observable_state(out) != before_state
            or not torch.equal(logits_of(out), before_logits)
            or reported_bytes(out, ctx) != before_size
        )
        assert changed != method.preserves_output, (
            f"{type(method).__name__}.preserves_output is True, but transform() with {params} changed the subject"
            if method.preserves_output
            else f"transform() with {params} changed neither the model's output, its modules, config or size, nor the generator or tokenizer"
        )

    def test_every_parameter_changes_the_result(self, method: Method, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> None:
        """A parameter the space declares changes the weights or the outputs between values far apart in its distribution,
        and each result reports at least the bytes its values need (``cost_claims.parameter_effects``). A value the model
        refuses (ConfigError: more key/value heads than it has) is passed over; ``inert_params`` are exempt."""
        if method.kind not in PARAMETER_KINDS:
            pytest.skip(f"a {method.kind} method's parameters act as it runs (training, decoding, fitting), not in transform")
        failures = parameter_effects(method, subject, params, ctx, lambda out: (weights_of(out), logits_of(out), reported_bytes(out, ctx)))
        assert not failures, "\n".join(failures)

    def test_lossless_setting_keeps_the_output(self, method: Method, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> None:
        """At its declared ``lossless_setting`` the method's logits are the base model's, within LOSSLESS_TOLERANCE."""
        if not method.lossless_setting:
            pytest.skip(f"{type(method).__name__} declares no lossless_setting")
        setting = dict(method.lossless_setting)
        change = output_change(logits_of(subject), logits_of(method.transform(subject.copy(), {**params, **setting}, ctx)))
        assert change <= LOSSLESS_TOLERANCE, (
            f"at its lossless setting {setting} the outputs changed by {change:.3g} (relative; at most {LOSSLESS_TOLERANCE:g} allowed)")

    def test_size_covers_the_weights_information(self, method: Method, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> None:
        """``size_bytes`` is at least what the weights' distinct values per group need, for simulated methods too."""
        if method.kind in LEARNER_CONTRACT_TASKS:
            pytest.skip("no language model: no weights to count")
        out = method.transform(subject.copy(), dict(params), ctx)
        short, reported, needed = size_shortfalls(out)
        assert not short, f"reports {reported} bytes but its weights need at least {needed} (distinct values per group):\n" + "\n".join(short[:5])


LEARNER_ENTRIES = {"paired_retrieval": "fit_pairs"}  # the learner's method its kind's task calls (default fit_predict)


def _timed(metric: str) -> bool:
    """A wall-clock timing or a ratio of timings: its unit is seconds or milliseconds, or it is a speedup."""
    from paretolab.plugin_api.manager import registries

    known = registries().metrics
    unit = known.get(metric).unit if metric in known else ""
    return unit in ("s", "ms") or metric.endswith("_speedup") or "_speedup_" in metric


class LearnerMethodContract(MethodContract):
    """The contract for methods that put a learner on a subject with no language model (kinds ``tabular``,
    ``sequence``): the subject is the kind's empty slot and the checks that read a language model's logits
    read the task's metrics instead (the task trains the learner for real).

    Override ``method`` (and ``params`` to keep budgets small). Timings (metrics in s or ms, speedups) are left out where
    two runs are compared; the learner's entry point is its kind's (``LEARNER_ENTRIES``).
    """

    @pytest.fixture
    def subject(self, method: Method) -> Subject:
        from paretolab.models.lookup import resolve_model

        return resolve_model(method.kind).load()

    def _metrics(self, method: Method, subject: Subject, params: dict[str, Any], seed: int = 0) -> dict[str, float]:
        from paretolab.study.trial import run_trial

        settings = TrialSettings("contract", method.kind, LEARNER_CONTRACT_TASKS[method.kind], {}, seed=seed)
        result = run_trial(subject, [StagePlan("stage0", method.name, dict(params))], settings, number=0)
        assert not result.failed, result.traceback
        return {k: v for k, v in result.metrics.items() if not k.endswith("_s") and k not in ("peak_rss_mb", "energy_j") and not _timed(k)}

    def test_transform_leaves_a_runnable_model(self, method: Method, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> None:
        out = method.transform(subject.copy(), dict(params), ctx)
        entry = LEARNER_ENTRIES.get(method.kind, "fit_predict")
        assert isinstance(out, Subject) and hasattr(out.info.get("learner"), entry), f"the subject's learner has no {entry}()"

    def test_runs_as_a_trial(self, method: Method, subject: Subject, params: dict[str, Any]) -> None:
        metrics = self._metrics(method, subject, params)
        if method.kind == "paired_retrieval":  # retrieval scores instead of acc / log_loss
            assert all(0.0 <= metrics[k] <= 1.0 for k in ("ir_at_1", "tr_at_1", "r_at_1")) and metrics["pairs_kept"] >= 1
            return
        assert 0.0 <= metrics["acc"] <= 1.0 and math.isfinite(metrics["log_loss"]) and metrics["models_trained"] >= 1

    def test_same_seed_same_model(self, method: Method, subject: Subject, params: dict[str, Any], tmp_path: Path) -> None:
        assert self._metrics(method, subject, params, seed=7) == self._metrics(method, subject, params, seed=7)

    def test_ignores_the_global_rng(self, method: Method, subject: Subject, params: dict[str, Any], tmp_path: Path) -> None:
        results = []
        for global_seed in (1, 2):
            torch.manual_seed(global_seed)
            results.append(self._metrics(method, subject, params, seed=7))
        assert results[0] == results[1], "the fit depends on torch's global RNG state: seed from the trial's seed instead"

    def test_changes_the_subject(self, method: Method, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> None:
        own = subject.copy()
        before = observable_state(own)
        assert observable_state(method.transform(own, dict(params), ctx)) != before

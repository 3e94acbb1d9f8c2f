"""select_to_think / large_only: the contract, the step loop's equalities with greedy decoding, honest call counts, calibration."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from paretolab.errors import ConfigError
from paretolab.generation import greedy_decode
from paretolab.models import TinyLlama, byte_tokenizer
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.subject import Subject
from paretolab.plugins.select_to_think import (
    LargeOnly,
    SelectToThink,
    SmallSelfConsistency,
    check_shared_tokenizer,
    large_subject,
)
from paretolab.plugins.select_to_think.decode import (
    S2TSettings,
    calibrate_threshold,
    large_only_decode,
    s2t_decode,
)
from paretolab.records import StagePlan, TrialSettings
from paretolab.study.trial import run_trial
from paretolab.testing import MethodContract

CHEAP = {"large": "tiny-llama", "calib_examples": 2, "quantile": 0.5}
PROMPT = [5, 17, 99, 3, 42, 7, 64, 11]
NEW = 12


class TestSelectToThinkContract(MethodContract):
    @pytest.fixture
    def method(self):
        return SelectToThink()

    @pytest.fixture
    def params(self) -> dict[str, Any]:
        return dict(CHEAP)


class TestLargeOnlyContract(MethodContract):
    @pytest.fixture
    def method(self):
        return LargeOnly()

    @pytest.fixture
    def params(self) -> dict[str, Any]:
        return {"large": "tiny-llama"}


def _peaked(seed: int, layers: int) -> torch.nn.Module:
    """A tiny random Llama with weights redrawn at std 0.3: the default init just repeats the last token, in both models alike."""
    model = TinyLlama(seed=seed, layers=layers).load().model
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model


class TestSmallSelfConsistencyContract(MethodContract):
    @pytest.fixture
    def method(self):
        return SmallSelfConsistency()

    @pytest.fixture
    def params(self) -> dict[str, Any]:
        return {"n_branches": 2}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARETOLAB_CACHE", str(tmp_path / "cache"))  # self-consistency's recorded branches


@pytest.fixture(scope="module")
def small() -> torch.nn.Module:
    return _peaked(0, 2)


@pytest.fixture(scope="module")
def large() -> torch.nn.Module:
    return _peaked(1, 3)  # same byte vocabulary, other weights


def _greedy(model: torch.nn.Module, n: int = NEW) -> list[int]:
    return greedy_decode(model, torch.tensor([PROMPT]), n)[0].tolist()


def test_never_firing_is_small_greedy_and_never_calls_the_large_model(small, large) -> None:
    for settings in (S2TSettings(trigger="none"), S2TSettings(trigger="entropy", threshold=math.inf)):
        out = s2t_decode(small, large, PROMPT, settings, max_new_tokens=NEW)
        assert out.tokens == _greedy(small)
        assert (out.large_calls, out.large_tokens, out.fired) == (0, 0, 0)
        assert (out.small_calls, out.small_tokens) == (NEW, len(PROMPT) + NEW - 1)  # one prefill, then one pass per further token


def test_always_firing_with_k1_is_small_greedy_and_calls_the_large_model_every_step(small, large) -> None:
    out = s2t_decode(small, large, PROMPT, S2TSettings(trigger="always", guide="select", k=1), max_new_tokens=NEW)
    assert out.tokens == _greedy(small)  # the large model may only choose among the small model's candidates
    assert out.fired == NEW and out.flipped == 0
    assert out.large_calls == NEW and out.large_tokens == len(PROMPT) + NEW - 1


def test_always_takeover_is_large_greedy(small, large) -> None:
    out = s2t_decode(small, large, PROMPT, S2TSettings(trigger="always", guide="takeover"), max_new_tokens=NEW)
    alone = large_only_decode(large, PROMPT, max_new_tokens=NEW)
    assert out.tokens == alone.tokens == _greedy(large)
    assert out.tokens != _greedy(small), "the two tiny models should disagree, else this test shows nothing"
    assert (alone.large_calls, alone.large_tokens, alone.small_calls) == (NEW, len(PROMPT) + NEW - 1, 0)


def test_selection_stays_within_the_small_models_top_k_and_follows_the_large_model(small, large) -> None:
    k = 4
    out = s2t_decode(small, large, PROMPT, S2TSettings(trigger="always", guide="select", k=k), max_new_tokens=NEW)
    ids = torch.tensor([PROMPT + out.tokens])
    with torch.no_grad():
        small_logits = small(input_ids=ids).logits[0, len(PROMPT) - 1 : -1]
        large_logits = large(input_ids=ids).logits[0, len(PROMPT) - 1 : -1]
    for step, token in enumerate(out.tokens):
        candidates = small_logits[step].topk(k).indices
        assert token in candidates.tolist()
        assert token == int(candidates[large_logits[step][candidates].argmax()])
    assert out.flipped > 0, "selection never changed a token: the test shows nothing"


def test_lazy_large_model_is_called_only_where_the_entropy_trigger_fires(small, large) -> None:
    probe = s2t_decode(small, large, PROMPT, S2TSettings(trigger="entropy"), max_new_tokens=NEW)
    threshold = calibrate_threshold(probe.scores, 0.75)
    out = s2t_decode(small, large, PROMPT, S2TSettings(trigger="entropy", threshold=threshold, k=4), max_new_tokens=NEW)
    assert 0 < out.fired < len(out.tokens)
    assert out.large_calls == out.fired  # each call catches up on every unseen token in one pass
    assert out.large_tokens <= len(PROMPT) + len(out.tokens) - 1


def test_kl_trigger_runs_the_large_model_at_every_step_after_warmup(small, large) -> None:
    out = s2t_decode(small, large, PROMPT, S2TSettings(trigger="kl", threshold=math.inf, warmup=3), max_new_tokens=NEW)
    assert out.tokens == _greedy(small)
    assert out.large_calls == NEW - 3 and len(out.scores) == NEW - 3
    assert all(s >= -1e-9 for s in out.scores)  # a KL divergence


def test_calibrated_threshold_is_the_quantile_and_refuses_no_scores() -> None:
    assert calibrate_threshold([1.0, 2.0, 3.0, 4.0, 5.0], 0.5) == 3.0
    with pytest.raises(ConfigError, match="calibration"):
        calibrate_threshold([], 0.9)
    with pytest.raises(ConfigError, match="quantile"):
        calibrate_threshold([1.0], 1.5)


def test_a_pair_without_a_shared_tokenizer_is_refused() -> None:
    small_subject = TinyLlama().load()
    other = byte_tokenizer()
    other.add_tokens(["<extra>"])
    with pytest.raises(ConfigError, match="tokenizer"):
        check_shared_tokenizer(small_subject, Subject(model=small_subject.model, tokenizer=other, model_name="other"))


def test_the_large_model_is_loaded_once_per_process() -> None:
    first = large_subject("tiny-llama", torch.device("cpu"))
    assert large_subject("tiny-llama", torch.device("cpu")) is first


def test_trials_report_both_models_calls_and_large_only_calls_once_per_token(tiny) -> None:
    settings = TrialSettings("s2t", "arithmetic", {"limit": 3, "max_new_tokens": 6, "shots": 1}, {}, seed=0)
    runs = {
        "s2t": StagePlan("stage0", "select_to_think", {**CHEAP, "k": 2}),
        "small": StagePlan("stage0", "select_to_think", {**CHEAP, "trigger": "none"}),
        "large": StagePlan("stage0", "large_only", {"large": "tiny-llama"}),
        "s2t again": StagePlan("stage0", "select_to_think", {**CHEAP, "k": 2}),
        "s2t k3": StagePlan("stage0", "select_to_think", {**CHEAP, "k": 3}),
        "vote": StagePlan("stage0", "s2t_self_consistency", {"n_branches": 3}),
        "small again": StagePlan("stage0", "select_to_think", {**CHEAP, "trigger": "none", "guide": "takeover", "k": 5}),
    }
    metrics = {}
    for number, (name, plan) in enumerate(runs.items()):
        result = run_trial(tiny, [plan], settings, number=number)
        assert not result.failed, result.traceback
        metrics[name] = result.metrics
    assert metrics["small"]["large_calls"] == 0 and metrics["small"]["small_calls"] > 0
    assert metrics["large"]["small_calls"] == 0 and metrics["large"]["large_calls_per_token"] == 1.0
    s2t = metrics["s2t"]
    assert 0 < s2t["trigger_rate"] < 1 and s2t["large_calls"] > 0 and s2t["calib_large_calls"] == 0  # entropy calibration needs no large call
    assert math.isfinite(s2t["s2t_threshold"])
    # an identical decode in the same worker is replayed with its counts; a changed setting decodes anew
    assert s2t["decodes_replayed"] == 0 and metrics["s2t again"]["decodes_replayed"] == 1
    counted = ("acc", "tokens_total", "large_calls", "large_tokens", "small_calls", "small_tokens", "trigger_rate", "flip_rate", "s2t_threshold")
    assert [metrics["s2t again"][k] for k in counted] == [s2t[k] for k in counted]
    assert metrics["s2t k3"]["decodes_replayed"] == 0
    assert metrics["small again"]["decodes_replayed"] == 1  # guide and k cannot change a decode that never asks the large model
    assert metrics["vote"]["large_calls"] == 0 and metrics["vote"]["tokens_total"] > metrics["small"]["tokens_total"]  # three sampled decodes


def test_the_pipelines_large_role_is_used_shared_and_costed_per_model(tiny) -> None:
    large = TinyLlama(seed=2, layers=3).load()
    settings = TrialSettings("s2t", "arithmetic", {"limit": 2, "max_new_tokens": 6, "shots": 1}, {}, seed=0)
    plan = [StagePlan("stage0", "select_to_think", {**CHEAP, "large": "large", "trigger": "always", "guide": "takeover"})]
    results = [run_trial(tiny, plan, settings, number=n, roles={"large": large}) for n in range(2)]
    for result in results:
        assert not result.failed, result.traceback
        assert result.info["cost.large.calls"] == 2 * result.metrics["large_calls"] > 0  # two examples
        assert result.info["cost.small.calls"] == 2 * result.metrics["small_calls"]
        assert result.metrics["model_calls"] == result.info["cost.large.calls"] + result.info["cost.small.calls"]
    assert results[0].info["cost.large.s_is"] == "measured" and results[1].info["cost.large.s_is"] == "replayed"
    # the role is the worker's object itself: nothing is copied or reloaded per trial
    assert large_subject("large", torch.device("cpu"), ctx=TrialContext(seed=0, workdir=Path("."), models={"large": large})) is large


def test_calibration_draws_other_problems_and_needs_a_seeded_task(tiny) -> None:
    from paretolab.plugin_api.options import parse_options
    from paretolab.plugins.select_to_think import calibration_prompts
    from paretolab.tasks.generation import Arithmetic, prompt_ids

    ctx = TrialContext(seed=0, workdir=Path("."), task={"name": "arithmetic", "level": 3, "limit": 4, "shots": 1})
    task = Arithmetic()
    shots, examples = task.examples(parse_options(task.options, {"level": 3, "limit": 4, "shots": 1}, where="task"))
    evaluated = [prompt_ids(tiny.tokenizer, ex, shots, "fewshot") for ex in examples]
    calibration = calibration_prompts(tiny.tokenizer, ctx, 4)
    assert len(calibration) == 4 and calibration != evaluated
    with pytest.raises(ConfigError, match="threshold"):
        calibration_prompts(tiny.tokenizer, TrialContext(seed=0, workdir=Path("."), task={"name": "gsm8k"}), 4)

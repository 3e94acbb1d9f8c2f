"""The train stage: determinism, budgets, init, curve and metrics across stages, refused configurations."""

from __future__ import annotations

import json
import math

import pytest
import torch

from paretolab.errors import ConfigError
from paretolab.plugin_api.manager import registries
from paretolab.training import training_of
from paretolab.training.loop import lr_factor
from tests.training.conftest import make_ctx


def train(subject, params, tmp_path, stage="s1", **task):
    return registries().methods.get("train").transform(subject, dict(params), make_ctx(tmp_path, stage, **task))


def test_same_seed_same_losses_to_the_last_bit_and_another_seed_differs(tiny, small, tmp_path):
    runs = []
    for seed, global_seed in ((0, 1), (0, 2), (1, 1)):
        torch.manual_seed(global_seed)  # neither the trial's nor torch's global RNG may matter
        subject = train(tiny.copy(), {**small, "seed": seed}, tmp_path / f"{seed}-{global_seed}")
        runs.append(([r["train_loss"] for r in subject.training.curve], subject.training.metrics["val_loss"],
                     [p.detach().clone() for p in subject.model.parameters()]))
    (a_curve, a_val, a_w), (b_curve, b_val, b_w), (c_curve, c_val, _) = runs
    assert a_curve == b_curve and a_val == b_val and all(torch.equal(x, y) for x, y in zip(a_w, b_w))
    assert a_curve != c_curve and a_val != c_val


def test_metrics_curve_artifact_and_two_stages_accumulate(tiny, small, tmp_path):
    ctx_dir = tmp_path / "a"
    subject = train(tiny, small, ctx_dir, stage="s1")
    first = dict(subject.training.metrics)
    assert set(first) == set(registries().methods.get("train").metrics)
    assert first["train_tokens"] == 4096 and first["train_steps"] == 16 and first["train_flops"] > 0
    assert math.isclose(first["val_bpb"], first["val_loss"] / math.log(2), rel_tol=1e-9)  # a byte tokenizer: one token per byte
    assert first["train_mem_mb"] > first["peak_act_mb"] > 0
    curve = json.loads((ctx_dir / "trial" / "learning_curve.json").read_text())
    assert curve["seed"] == 0 and [r["step"] for r in curve["rows"]] == [4, 8, 12, 16]
    assert set(curve["rows"][0]) == {"stage", "step", "tokens", "flops", "train_loss", "val_loss", "lr", "s"}

    subject = train(subject, small, tmp_path / "b", stage="s3")
    rows = subject.training.curve
    assert [r["stage"] for r in rows] == ["s1"] * 4 + ["s3"] * 4
    assert [r["tokens"] for r in rows] == [1024 * i for i in range(1, 9)]  # cumulative: the curve continues
    assert subject.training.metrics["train_flops"] == 2 * first["train_flops"]
    assert subject.training.metrics["val_loss"] < first["val_loss"]  # the second stage went on from the first's weights


def test_optimizer_state_is_kept_by_parameter_name(tiny, small, tmp_path):
    subject = train(tiny, small, tmp_path)
    state = subject.training.optimizer_state
    names = {n for n, _ in subject.model.named_parameters()}
    assert set(state) == names
    assert state["model.layers.0.self_attn.q_proj.weight"]["exp_avg"].shape == subject.model.model.layers[0].self_attn.q_proj.weight.shape
    assert float(state["model.norm.weight"]["step"]) == 16
    subject = train(subject, {**small, "tokens": 512}, tmp_path / "again", stage="s3")  # the next stage goes on from these moments
    assert float(subject.training.optimizer_state["model.norm.weight"]["step"]) == 16 + 2


def test_flop_budget_stops_first_and_init_auto_reinitialises_from_the_seed(tiny, small, tmp_path):
    one_step = train(tiny.copy(), {**small, "tokens": 256}, tmp_path / "one").training.metrics["train_flops"]
    subject = train(tiny.copy(), {**small, "flops": 3.5 * one_step}, tmp_path / "flops")
    assert subject.training.metrics["train_steps"] == 3 and subject.info["train_stopped_by"] == "flops"
    other_init = tiny.copy()
    with torch.no_grad():
        for p in other_init.model.parameters():
            p.add_(1.0)  # different starting weights; init auto draws them again from the stage's seed
    again = train(other_init, {**small, "flops": 3.5 * one_step}, tmp_path / "again")
    assert again.training.metrics["val_loss"] == subject.training.metrics["val_loss"]
    kept = tiny.copy()
    kept.info["weights"] = "fp32"  # a trained model is kept as it is
    before = kept.model.model.embed_tokens.weight.detach().clone()
    kept = train(kept, {**small, "tokens": 256, "lr": 0.0}, tmp_path / "kept")
    assert torch.equal(kept.model.model.embed_tokens.weight, before)


def test_schedule_warms_up_then_decays_to_the_floor():
    factors = [lr_factor(s, 100, 0.1, 0.1) for s in range(100)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert factors[-1] == pytest.approx(0.1, abs=1e-3) and all(a >= b for a, b in zip(factors[10:], factors[11:]))


def test_training_on_the_evaluation_corpus_is_refused_by_name(tiny, small, tmp_path):
    with pytest.raises(ConfigError, match=r"stages\.s1\.train\.params\.corpus: 'pydoc' is the corpus task\.corpus evaluates on"):
        train(tiny, {**small, "corpus": "pydoc"}, tmp_path)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("seq_len", 1, r"stages\.s1\.train\.params\.seq_len: 1 is out of range"),
    ("init", "zeros", r"stages\.s1\.train\.params\.init: 'zeros' is not one of 'auto', 'keep', 'reinit'"),
    ("tokens", 10, r"train\.tokens: 10 is less than one step of batch × seq_len = 256 tokens"),
])
def test_bad_params_name_the_field_the_value_and_the_fix(tiny, small, tmp_path, field, value, message):
    with pytest.raises(ConfigError, match=message):
        train(tiny, {**small, field: value}, tmp_path)


def test_a_trial_reports_the_curve_as_metric_history(tiny, small):
    from paretolab.records import StagePlan, TrialSettings
    from paretolab.study.trial import run_trial

    settings = TrialSettings("t", "perplexity", {"corpus": "pydoc", "max_tokens": 256, "context": 64, "stride": 64}, {"params": {}}, seed=0,
                             cpus=1, timeout_s=600)
    result = run_trial(tiny, [StagePlan("s1", "train", dict(small))], settings, number=0)
    assert not result.failed, result.traceback
    assert [step for step, _ in result.history["curve.val_loss"]] == [1024, 2048, 3072, 4096]
    assert result.metrics["val_loss"] == result.history["curve.val_loss"][-1][1]
    assert "learning_curve.json" in result.artifacts and result.metrics["train_tokens"] == 4096


def _pipeline(train_params: dict) -> dict:
    return {"name": "t", "model": "tiny-llama", "task": {"name": "perplexity", "corpus": "pydoc"},
            "stages": [{"method": "train", "params": train_params}], "objectives": [{"metric": "val_loss"}, {"metric": "train_flops"}]}


@pytest.mark.parametrize(("params", "message"), [
    ({"corpus": ["pydoc"]}, r"stages\.stage0\.train\.params\.corpus: 'pydoc' is the corpus task\.corpus evaluates on"),
    ({"warmup": [0.1, 1.5]}, r"stages\.stage0\.train\.params\.warmup: 1\.5 is out of range; give a value from 0\.0 to 1\.0"),
    ({"flops": "1e12"}, r"stages\.stage0\.train\.params\.flops: '1e12' is text, not a number .*write it as 1\.0e12"),
])
def test_a_pipeline_is_refused_before_any_trial(train_text, params, message):
    from paretolab.study.spec import parse_spec

    with pytest.raises(ConfigError, match=message):
        parse_spec(_pipeline({"corpus": train_text, **params}))
    assert parse_spec(_pipeline({"corpus": train_text, "seed": [0, 1, 2]})).stages[0].options[0].method == "train"


def test_training_uses_the_trials_cpus_and_stops_before_the_trial_deadline(tiny, small, tmp_path):
    import time

    from paretolab.training import TrainingHook

    class Threads(TrainingHook):
        seen: set = set()

        def before_step(self, state):
            self.seen.add(torch.get_num_threads())

    hook = training_of(tiny).attach(Threads(), method="probe")
    ctx = make_ctx(tmp_path)
    ctx.cpus = 2
    ctx.deadline = time.time() + 0.5  # leaves no time for 10 M tokens
    before = torch.get_num_threads()
    registries().methods.get("train").transform(tiny, {**small, "tokens": 10_000_000}, ctx)
    assert hook.seen == {2} and torch.get_num_threads() == before
    assert tiny.info["train_stopped_by"] == "trial_timeout" and tiny.training.metrics["train_tokens"] < 10_000_000


def test_tokenized_corpus_is_cached_on_disk_by_corpus_and_tokenizer(tiny, train_text, tmp_path, monkeypatch):
    from paretolab.training import batches

    monkeypatch.setenv("PARETOLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(batches, "_IDS", {})
    ids = batches.corpus_token_ids(tiny.tokenizer, train_text)
    files = list((tmp_path / "cache" / "tokens").glob("*.pt"))
    assert len(files) == 1 and not list((tmp_path / "cache" / "tokens").glob("*.part"))
    monkeypatch.setattr(batches, "_IDS", {})
    monkeypatch.setattr(batches, "_encode_chunks", lambda *a: pytest.fail("tokenized again despite the cache"))
    assert torch.equal(batches.corpus_token_ids(tiny.tokenizer, train_text), ids)

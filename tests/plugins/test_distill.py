"""distill_kd / distill_sft and the stage_energy measure: the KD loss, the teacher cache, per-stage energy adding up."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from paretolab.errors import ConfigError
from paretolab.models import TinyLlama
from paretolab.plugin_api.manager import registries
from paretolab.plugin_api.subject import Subject
from paretolab.plugins import distill
from paretolab.plugins.distill import DistillKD, DistillSFT, KDHook, kd_loss
from paretolab.records import StagePlan, TrialSettings
from paretolab.study.trial import run_trial
from paretolab.testing import MethodContract
from paretolab.training.hooks import training_of

CORPUS = str(Path(__file__).parents[2] / "README.md")
KD = {"teacher": "tiny-llama", "tokens": 96, "seq_len": 16, "batch": 2, "top_k": 4, "tau": 2.0, "corpus": CORPUS}
SFT = {"teacher": "tiny-llama", "tokens": 96, "seq_len": 16, "batch": 12, "prompt_tokens": 4, "new_tokens": 4, "corpus": CORPUS}
# 2 passes over KD's 6 cached windows of 16 tokens
TRAIN = {"tokens": 192, "seq_len": 16, "batch": 2, "eval_every": 100, "eval_tokens": 64, "corpus": CORPUS}
SETTINGS = TrialSettings("t", "perplexity", {"max_tokens": 128, "context": 32, "stride": 32}, {"stage_energy": {}}, seed=0)


@pytest.fixture
def tiny() -> Subject:
    subject = TinyLlama().load()
    subject.info["weights"] = "random init"
    return subject


def test_kd_loss_on_a_hand_example() -> None:
    # student uniform over 3 tokens; teacher top-2 logits (ln 3, 0) on ids (0, 1); target 0
    logits = torch.zeros(1, 1, 3)
    values, indices = torch.tensor([[[math.log(3.0), 0.0]]]), torch.tensor([[[0, 1]]])
    targets = torch.tensor([[0]])
    # τ = 1: p_T = (3/4, 1/4), q_S = 1/3 each: CE = ln 3, KL = 3/4 ln(9/4) + 1/4 ln(3/4)
    expected = math.log(3) + 0.75 * math.log(2.25) + 0.25 * math.log(0.75)
    assert float(kd_loss(logits, targets, values, indices, tau=1.0, alpha=1.0)) == pytest.approx(expected, rel=1e-6)
    # τ = 2: p_T = softmax(ln3 / 2, 0) = (√3, 1) / (1 + √3); the student stays uniform; the KL is scaled by τ² = 4, then α = 0.5
    p = (math.sqrt(3) / (1 + math.sqrt(3)), 1 / (1 + math.sqrt(3)))
    kl = sum(pi * math.log(pi * 3) for pi in p)
    assert float(kd_loss(logits, targets, values, indices, tau=2.0, alpha=0.5)) == pytest.approx(math.log(3) + 0.5 * 4 * kl, rel=1e-6)
    # a student that puts the teacher's renormalised top-k distribution there pays the CE alone
    matched = torch.tensor([[[math.log(3.0), 0.0, -1e4]]])
    assert float(kd_loss(matched, targets, values, indices, tau=1.0, alpha=1.0)) == pytest.approx(-math.log(0.75), rel=1e-5)


def test_stage_energy_and_time_add_up_to_the_trials(tiny: Subject) -> None:
    # 10x KD's and TRAIN's tokens: a ~2 s trial. At ~0.25 s the 2-15 ms of bookkeeping between the windows (and the
    # CPU clock's granularity across threads) came to 0.4-5.9 % of the estimated energy; at ~2 s, 0.1-0.6 %
    kd, train = {**KD, "tokens": 960}, {**TRAIN, "tokens": 1920}
    result = run_trial(tiny, [StagePlan("teacher", "distill_kd", kd), StagePlan("train", "train", train)], SETTINGS, number=0)
    assert not result.failed, result.traceback
    m, joules = result.metrics, result.stage_energy_j
    assert set(joules) == {"copy", "transform:teacher", "transform:train", "evaluate", "measure"}
    # the stage windows tile the trial: none counted twice (sums never exceed the totals), and what falls between
    # them is bookkeeping (temporary folder, memory sampler, result assembly): 2 % of the trial, or half a second of wall
    # time on a loaded machine
    for total, parts in ((m["energy_j"], joules), (m["trial_s"], result.stage_s)):
        assert 0 <= total - sum(parts.values()) <= max(0.02 * total, 0.5 if parts is result.stage_s else 0.0)
    # the measure's per-stage numbers are the meter's windows, and its totals their sums
    assert m["teacher_energy_j"] == joules["transform:teacher"] > 0 and m["student_energy_j"] == joules["transform:train"] > 0
    assert m["eval_energy_j"] == joules["evaluate"]
    assert m["pipeline_energy_j"] == pytest.approx(m["teacher_energy_j"] + m["student_energy_j"] + m["eval_energy_j"], rel=1e-12)
    assert m["student_side_energy_j"] == pytest.approx(m["student_energy_j"] + m["eval_energy_j"], rel=1e-12)
    assert m["teacher_s"] == result.stage_s["transform:teacher"] and m["student_s"] == result.stage_s["transform:train"]
    assert m["teacher_energy_share"] == pytest.approx(m["teacher_energy_j"] / m["pipeline_energy_j"])
    assert m["teacher_tokens"] == 60 * 16 and m["teacher_flops"] > 0
    assert m["teacher_j_per_token"] == pytest.approx(m["teacher_energy_j"] / 960)
    assert m["student_j_per_token"] == pytest.approx(m["student_energy_j"] / m["train_tokens"])


def test_no_teacher_trial_has_no_teacher_bill(tiny: Subject) -> None:
    result = run_trial(tiny, [StagePlan("teacher", "none", {}), StagePlan("train", "train", dict(TRAIN))], SETTINGS, number=0)
    assert not result.failed, result.traceback
    m = result.metrics
    assert m["teacher_tokens"] == 0 and m["teacher_flops"] == 0
    assert m["pipeline_energy_j"] == pytest.approx(m["student_side_energy_j"] + m["teacher_energy_j"])
    assert m["teacher_energy_share"] < 0.05  # the identity stage costs next to nothing


def test_teacher_cache_is_reused_not_recomputed(tiny: Subject, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"cache": 0, "teacher_forward": 0}
    real_cache, real_load = distill.cache_topk, distill.load_teacher

    def counted_cache(*args: Any, **kwargs: Any) -> Any:
        calls["cache"] += 1
        return real_cache(*args, **kwargs)

    def counted_load(*args: Any, **kwargs: Any) -> Subject:
        teacher = real_load(*args, **kwargs)
        teacher.model.register_forward_hook(lambda *_: calls.__setitem__("teacher_forward", calls["teacher_forward"] + 1))
        return teacher

    monkeypatch.setattr(distill, "cache_topk", counted_cache)
    monkeypatch.setattr(distill, "load_teacher", counted_load)
    plan = [StagePlan("teacher", "distill_kd", dict(KD)), StagePlan("train", "train", dict(TRAIN)), StagePlan("train2", "train", dict(TRAIN))]
    settings = TrialSettings("t", "perplexity", {"max_tokens": 128, "context": 32, "stride": 32}, {"stage_energy": {"train": "train,train2"}}, seed=0)
    result = run_trial(tiny, plan, settings, number=0)
    assert not result.failed, result.traceback
    # one teacher pass over 6 windows in batches of 2, then two train stages of 2 passes each over the cache
    assert calls == {"cache": 1, "teacher_forward": 3}
    assert result.info["teacher_data_passes"] == pytest.approx(4.0)
    both = result.stage_energy_j["transform:train"] + result.stage_energy_j["transform:train2"]
    assert result.metrics["student_energy_j"] == pytest.approx(both, rel=1e-12)  # both train stages are the student's


def test_kd_hook_holds_the_cache_not_the_teacher(tiny: Subject, tmp_path: Path) -> None:
    from paretolab.plugin_api.context import TrialContext

    out = DistillKD().transform(tiny.copy(), dict(KD), TrialContext(seed=0, workdir=tmp_path, stage="teacher"))
    hook = training_of(out).owner("loss")
    assert isinstance(hook, KDHook) and not any(isinstance(v, torch.nn.Module) for v in vars(hook).values())
    assert hook.values.shape == hook.indices.shape == (6, 16, 4)
    assert torch.all(hook.values[..., :-1] >= hook.values[..., 1:])  # the top-k, largest first
    assert out.info["teacher_windows"] == 6


def test_sft_trains_on_the_teachers_text(tiny: Subject, tmp_path: Path) -> None:
    from paretolab.plugin_api.context import TrialContext

    out = DistillSFT().transform(tiny.copy(), dict(SFT), TrialContext(seed=0, workdir=tmp_path, stage="teacher"))
    hook = training_of(out).owner("data")
    assert hook is not None and training_of(out).owner("loss") is None  # plain CE on the teacher's text
    assert out.info["teacher_tokens"] == 12 * (4 + 4)  # 12 prompts of 4 corpus tokens, 4 written by the teacher
    assert tuple(hook.windows.windows.shape) == (96 // 17, 17)
    assert out.info["teacher_flops"] > 0


def test_mismatched_stages_are_refused(tiny: Subject) -> None:
    result = run_trial(tiny, [StagePlan("teacher", "distill_kd", dict(KD)), StagePlan("train", "train", {**TRAIN, "seq_len": 8})], SETTINGS, number=0)
    assert result.failed and "train.seq_len: 8 differs from distill_kd.seq_len 16" in result.error


def test_teacher_with_another_tokenizer_is_refused(tmp_path: Path) -> None:
    import copy

    from paretolab.plugin_api.context import TrialContext

    student = TinyLlama().load()
    student.tokenizer = copy.deepcopy(student.tokenizer)
    student.tokenizer.add_tokens(["<not the teacher's>"])  # one more id: the teacher's logits no longer index the same vocabulary
    with pytest.raises(ConfigError, match="another tokenizer"):
        DistillKD().transform(student, dict(KD), TrialContext(seed=0, workdir=tmp_path))


def test_measure_is_registered_with_estimate_labels() -> None:
    regs = registries()
    assert "stage_energy" in regs.measures
    for name in ("teacher_energy_j", "student_energy_j", "pipeline_energy_j", "teacher_j_per_token"):
        assert "ESTIMATE" in regs.metrics.get(name).description


class TestDistillKDContract(MethodContract):
    @pytest.fixture
    def method(self) -> DistillKD:
        return DistillKD()

    @pytest.fixture
    def params(self) -> dict[str, Any]:
        return dict(KD)


class TestDistillSFTContract(MethodContract):
    @pytest.fixture
    def method(self) -> DistillSFT:
        return DistillSFT()

    @pytest.fixture
    def params(self) -> dict[str, Any]:
        return dict(SFT)

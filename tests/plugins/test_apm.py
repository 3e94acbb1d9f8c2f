"""APM's analog: the closed form is the least-squares solution, the teacher's cached matrices are the data's, distillation
matches the teacher and beats random pairs, retrieval is scored right, the data are seeded, the methods keep the contract."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch

from paretolab.errors import ConfigError
from paretolab.plugins.apm import APMMethod, FullDataMethod, MTTMethod, RandomPairsMethod
from paretolab.plugins.apm.distill import APM, RandomPairs, matching_loss, teacher_projectors
from paretolab.tasks.paired_retrieval import PairedOptions, generate, load_paired, projectors, retrieval_scores
from paretolab.testing import LearnerMethodContract

SMALL = PairedOptions(train=600, test=200)
CPU = torch.device("cpu")


def _test_views(data) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.as_tensor(data.a["test"]).double(), torch.as_tensor(data.b["test"]).double()


def test_the_closed_form_is_the_ridge_least_squares_solution():
    """(XᵀX/n + λI)⁻¹ XᵀY/n minimises |XW - Y|²/n + λ|W|²: the stacked least-squares problem [X/√n; √λ I] W = [Y/√n; 0]."""
    g = torch.Generator().manual_seed(0)
    x, y, lam = torch.randn(50, 7, generator=g, dtype=torch.float64), torch.randn(50, 4, generator=g, dtype=torch.float64), 0.3
    w_ab, w_ba = projectors(x, y, lam)
    n = len(x)
    stacked = torch.cat([x / n**0.5, lam**0.5 * torch.eye(7, dtype=torch.float64)])
    target = torch.cat([y / n**0.5, torch.zeros(7, 4, dtype=torch.float64)])
    assert torch.allclose(w_ab, torch.linalg.lstsq(stacked, target).solution, atol=1e-10)
    stacked_b = torch.cat([y / n**0.5, lam**0.5 * torch.eye(4, dtype=torch.float64)])
    assert torch.allclose(w_ba, torch.linalg.lstsq(stacked_b, torch.cat([x / n**0.5, torch.zeros(4, 7, dtype=torch.float64)])).solution, atol=1e-10)


def test_the_teacher_from_its_cached_matrices_equals_fitting_on_the_raw_pairs():
    data = load_paired(SMALL)
    a, b = (torch.as_tensor(v["train"]).double() for v in (data.a, data.b))
    (t_ab, t_ba), kept = teacher_projectors(a, b, data.ridge)
    w_ab, w_ba = projectors(a, b, data.ridge)
    assert torch.allclose(t_ab, w_ab, atol=1e-10) and torch.allclose(t_ba, w_ba, atol=1e-10)
    assert kept == SMALL.dim_a**2 + SMALL.dim_b**2 + SMALL.dim_a * SMALL.dim_b


def test_distillation_matches_the_teacher_and_retrieves_better_than_the_random_pairs_it_starts_from():
    data = load_paired(SMALL)
    a, b = (torch.as_tensor(v["train"]).double() for v in (data.a, data.b))
    teacher, _ = teacher_projectors(a, b, data.ridge)
    rand = RandomPairs(pairs=40).fit_pairs(data, seed=3, device=CPU)
    apm = APM(pairs=40, steps=150).fit_pairs(data, seed=3, device=CPU)
    idx = RandomPairs(pairs=40).pairs_for(len(a), 3)
    assert torch.equal(rand.a, torch.as_tensor(data.a["train"])[idx]) and len(set(idx.tolist())) == 40  # seeded, distinct
    assert torch.equal(APM(pairs=40, steps=150).fit_pairs(data, seed=3, device=CPU).a, apm.a)  # same seed, same pairs
    assert apm.extra["match_loss_init"] == pytest.approx(float(matching_loss(rand.a.double(), rand.b.double(), teacher, data.ridge)))
    assert apm.extra["match_loss"] < 0.2 * apm.extra["match_loss_init"], apm.extra
    test_a, test_b = _test_views(data)
    r_apm = float(retrieval_scores(*projectors(apm.a.double(), apm.b.double(), data.ridge), test_a, test_b)["r_at_1"].mean())
    r_rand = float(retrieval_scores(*projectors(rand.a.double(), rand.b.double(), data.ridge), test_a, test_b)["r_at_1"].mean())
    assert r_apm > r_rand + 0.02, (r_apm, r_rand)


def test_retrieval_of_identity_views_is_perfect_and_of_shuffled_views_is_not():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(30, 5, generator=g, dtype=torch.float64)
    eye = torch.eye(5, dtype=torch.float64)
    scores = retrieval_scores(eye, eye, a, a.clone())
    assert all(float(v.mean()) == 1.0 for v in scores.values())
    swapped = a.clone()
    swapped[[0, 1]] = swapped[[1, 0]]  # queries 0 and 1 now find each other's partner
    hits = retrieval_scores(eye, eye, a, swapped)
    assert hits["tr_at_1"][:2].tolist() == [0.0, 0.0] and float(hits["tr_at_1"][2:].mean()) == 1.0
    assert float(hits["r_at_1"].mean()) == pytest.approx(28 / 30)


def test_the_generated_pairs_are_seeded_and_split_the_same_way():
    a1, b1, c1 = generate(SMALL)
    a2, b2, c2 = generate(SMALL)
    assert np.array_equal(a1, a2) and np.array_equal(b1, b2) and np.array_equal(c1, c2)
    assert a1.shape == (800, 64) and b1.shape == (800, 48) and len(set(c1.tolist())) == SMALL.classes
    data = load_paired(SMALL)
    assert data.a["train"].shape == (600, 64) and data.b["test"].shape == (200, 48)
    assert abs(float(data.a["train"].mean())) < 1e-4
    assert np.array_equal(load_paired(SMALL).b["test"], data.b["test"])


def test_a_pair_count_below_one_is_refused_with_the_field():
    with pytest.raises(ConfigError, match="apm.pairs"):
        APMMethod().transform(None, {"pairs": 0}, None)  # type: ignore[arg-type]


def test_the_task_without_a_learner_says_which_stage_to_add():
    from paretolab.records import TrialSettings
    from paretolab.study.trial import run_trial
    from paretolab.tasks.paired_retrieval import PairedSource

    result = run_trial(PairedSource().load(), [], TrialSettings("t", "paired_retrieval", {"train": 50, "test": 20}, {}, seed=0), number=0)
    assert result.failed and "add a paired_retrieval stage (method apm, mtt, random_pairs or full_data)" in result.error


def test_the_hits_stored_per_query_give_back_the_reported_metrics():
    from paretolab.plugin_api.subject import Subject
    from paretolab.stats import samples
    from paretolab.tasks.paired_retrieval import PairedRetrievalTask, PairedSource

    class Ctx:
        seed = 0
        stored: dict[str, str] = {}

        def add_artifact(self, name: str, text: str) -> None:
            self.stored[name] = text

    subject: Subject = PairedSource().load()
    subject.info["learner"] = RandomPairs(pairs=50)
    ctx = Ctx()
    metrics = PairedRetrievalTask().evaluate(subject, SMALL, ctx)  # type: ignore[arg-type]
    payload = json.loads(next(iter(ctx.stored.values())))
    for name in ("ir_at_1", "tr_at_1", "r_at_1"):
        assert samples(payload, name).value() == pytest.approx(metrics[name]), name


class _Contract(LearnerMethodContract):  # the kind's entry (fit_pairs) and retrieval scores are the suite's own
    pass


class TestAPMContract(_Contract):
    @pytest.fixture
    def method(self) -> APMMethod:
        return APMMethod()

    @pytest.fixture
    def params(self) -> dict[str, Any]:
        return {"pairs": 20, "steps": 5}


def test_the_trajectory_baseline_follows_gradient_descent_and_keeps_every_checkpoint():
    from paretolab.plugins.apm.mtt import MTT, expert_trajectories

    data = load_paired(SMALL)
    a, b = (torch.as_tensor(v["train"]).double() for v in (data.a, data.b))
    path, _ = expert_trajectories(a, b, data.ridge, 400)
    (t_ab, t_ba), _ = teacher_projectors(a, b, data.ridge)
    da, db = a.shape[1], b.shape[1]
    assert torch.allclose(path[-1][: da * db].reshape(da, db), t_ab, atol=1e-3)  # descent converges to the closed form
    assert torch.allclose(path[-1][da * db :].reshape(db, da), t_ba, atol=1e-3)
    got = MTT(pairs=40, steps=40, expert_epochs=20).fit_pairs(data, seed=3, device=CPU)
    start = RandomPairs(pairs=40).fit_pairs(data, seed=3, device=CPU)
    assert got.extra["distill_storage_floats"] == 21 * 2 * da * db
    assert got.extra["match_loss"] < start.extra["match_loss"], (got.extra, start.extra)
    with pytest.raises(ConfigError, match="mtt.span"):
        MTTMethod().learner({**MTTMethod().defaults(), "span": 60})


class TestMTTContract(_Contract):
    @pytest.fixture
    def method(self) -> MTTMethod:
        return MTTMethod()

    @pytest.fixture
    def params(self) -> dict[str, Any]:
        return {"pairs": 20, "steps": 3, "expert_epochs": 4, "unroll": 2}


class TestRandomPairsContract(_Contract):
    @pytest.fixture
    def method(self) -> RandomPairsMethod:
        return RandomPairsMethod()

    @pytest.fixture
    def params(self) -> dict[str, Any]:
        return {"pairs": 20}


class TestFullDataContract(_Contract):
    @pytest.fixture
    def method(self) -> FullDataMethod:
        return FullDataMethod()

    @pytest.fixture
    def params(self) -> dict[str, Any]:
        return {}

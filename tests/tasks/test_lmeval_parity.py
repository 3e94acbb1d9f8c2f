"""Parity with lm-evaluation-harness itself: same rows, same model, lm-eval's own prompts."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from paretolab.tasks import MultipleChoiceOptions, score_rows

from ..conftest import ROOT, needs_data


def lmeval_mc():
    """benchmarks/lmeval_mc.py, which writes lm-eval task files over our rows and runs lm-eval."""
    spec = importlib.util.spec_from_file_location("lmeval_mc", ROOT / "benchmarks" / "lmeval_mc.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["lmeval_mc"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # importing lm-eval and building its datasets takes ~30 s on two cores
@pytest.mark.parametrize("dataset", ["arc_easy", "piqa"])
def test_log_likelihoods_and_accuracies_match_lm_eval(tiny, dataset, monkeypatch, tmp_path):
    needs_data(f"mc/{dataset}.jsonl")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # lm-eval's dataset cache stays out of the user's
    ours = score_rows(tiny, MultipleChoiceOptions(dataset=dataset, limit=12))
    theirs = lmeval_mc().lmeval_scores(tiny, dataset, 12)
    assert len(ours) == len(theirs) == 12
    for mine, lm in zip(ours, theirs):
        assert mine.loglikelihoods == pytest.approx(lm["loglikelihoods"], abs=1e-3)
        assert (mine.hit, mine.hit_norm) == (lm["acc"], lm["acc_norm"])

"""The lambada task: token-exact scoring, fixed disjoint splits, deterministic builtin rows, a clear error without the file."""

from __future__ import annotations

import json

import pytest

from paretolab.data import data_dirs
from paretolab.errors import ConfigError
from paretolab.tasks import lambada


def test_lambada_is_scored_token_exact(tiny):
    tok = tiny.tokenizer
    target = lambada.target_ids(tok, "hello")
    assert lambada.is_correct(target, target)
    assert not lambada.is_correct(lambada.target_ids(tok, "he"), target)  # a near miss is wrong
    assert not lambada.is_correct(target + lambada.target_ids(tok, "x"), target)  # and so is a longer answer


def test_lambada_splits_are_disjoint_and_builtin_rows_deterministic():
    rows = lambada.builtin_rows()
    lambada.builtin_rows.cache_clear()
    assert lambada.builtin_rows() == rows and len(rows) > 400
    for row in rows[:50]:
        assert len(row["continuation"]) >= 4 and row["continuation"].isalpha()
        assert row["continuation"] in row["context"] and 59 <= len(row["context"].split()) <= 99
    for source in lambada.SOURCES:
        if source == "lambada" and not any((d / lambada.FILE).is_file() for d in data_dirs()):
            continue
        evaluated, trained = lambada.split_rows(source, "eval"), lambada.split_rows(source, "train")
        keys = {(r["context"], r["continuation"]) for r in evaluated}
        assert evaluated and trained and not keys & {(r["context"], r["continuation"]) for r in trained}


def test_a_missing_lambada_file_names_the_file_and_the_fix(tmp_path, monkeypatch):
    from paretolab.data import files

    monkeypatch.setattr(files, "data_dirs", lambda: [tmp_path])  # find_data_file's search
    monkeypatch.setattr(lambada, "data_dirs", lambda: [tmp_path])  # the message's list
    with pytest.raises(ConfigError, match=r"mc/lambada_openai.jsonl.*PARETOLAB_DATA_DIR.*source: builtin"):
        lambada.split_rows("lambada", "eval")


def test_the_unmodified_model_prefills_the_whole_prompt(tiny):
    from paretolab.records import StagePlan, TrialSettings
    from paretolab.study.trial import run_trial

    settings = TrialSettings("t", "lambada", {"source": "builtin", "limit": 2}, {}, seed=0)
    result = run_trial(tiny, [StagePlan("s0", "none", {})], settings, number=0)
    assert not result.failed, result.traceback
    assert result.metrics["n_examples"] == 2 and result.metrics["context_kept_frac"] == result.metrics["prefill_flops_ratio"] == 1.0
    payload = json.loads(result.artifacts["per_example.json"])
    assert set(payload["scores"]) == {"acc", "context_kept_frac", "prefill_flops_ratio"} and len(payload["scores"]["acc"]) == 2

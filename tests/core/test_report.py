"""The Markdown report of a study: which columns a reader gets."""

from __future__ import annotations

import optuna

from paretolab import report
from paretolab.stores import Stores


def _study(tmp_path, objectives):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="decode", storage=storage, directions=["maximize"] * len(objectives))
    study.set_user_attr("objectives", [[m, "maximize"] for m in objectives])
    study.set_user_attr("model", "tiny-llama")
    study.set_user_attr("pipeline", {"task": {"name": "arithmetic"}, "stages": [{"method": "speculative", "params": {"k": 2}}]})
    return Stores(storage, f"sqlite:///{tmp_path / 'mlflow.db'}", None)


def test_the_studys_objectives_are_columns_whatever_metrics_were_asked_for(tmp_path, monkeypatch):
    stores = _study(tmp_path, ["speedup_vs_greedy", "mean_accepted_len"])
    row = {"trial": 0, "method": "speculative", "params": {"speculative.k": 2}, "run_params": {}, "simulated_by": "",
           "speedup_vs_greedy": 0.69, "mean_accepted_len": 1.4, "acc": 1.0, "decode_tok_s": 5.9}
    monkeypatch.setattr(report, "trial_table", lambda name, s: ([("speedup_vs_greedy", "maximize"), ("mean_accepted_len", "maximize")], [row]))
    text = report.study_section("decode", stores, ["acc", "decode_tok_s", "ppl"], frontier=False)
    header = next(line for line in text.splitlines() if line.startswith("| method"))
    # objectives first, then the asked-for metrics that some trial reported (no ppl column)
    assert header == "| method | params | speedup_vs_greedy | mean_accepted_len | acc | decode_tok_s | cost | trial |"

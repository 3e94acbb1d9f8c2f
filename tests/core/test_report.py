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


def test_report_gives_provenance_size_against_stored_and_fp16_and_marks_noise_and_estimates(tmp_path, monkeypatch):
    stores = _study(tmp_path, ["ppl", "prefill_speedup"])
    base = {"info.weights": "gguf:Q4_1 dequantized", "info.base_stored_bytes": "96576768.0",
            "info.base_fp16_bytes": "269030016.0", "info.energy_source": "estimate"}
    rows = [
        {"trial": 0, "method": "none", "params": {}, "run_params": base, "simulated_by": "", "ppl": 10.0,
         "prefill_speedup": 1.0, "prefill_speedup_iqr": 0.02, "size_bytes": 538060032.0, "energy_j": 40.0},
        {"trial": 1, "method": "macko", "params": {}, "run_params": base, "simulated_by": "", "ppl": 10.5,
         "prefill_speedup": 1.3, "prefill_speedup_iqr": 0.5, "size_bytes": 169030016.0, "energy_j": 30.0},
    ]
    monkeypatch.setattr(report, "trial_table", lambda name, s: ([("ppl", "minimize"), ("prefill_speedup", "maximize")], rows))
    text = report.study_section("decode", stores, ["size_bytes", "energy_j"], frontier=False)
    assert "Base weights: **gguf:Q4_1 dequantized**; stored 96.6 MB, 269.0 MB in fp16" in text
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| method"))
    assert "| size_bytes | size ÷ stored base | size ÷ fp16 base | energy_j |" in header
    macko = next(line for line in lines if line.startswith("| macko"))
    assert "| 1.75 | 0.6283 |" in macko  # 169 MB against the 96.6 MB GGUF and the 269 MB fp16 model; never vs fp32
    assert "1.3 †" in macko and "≈30" in macko  # IQR 0.5 on 1.3 is too wide to rank; energy is an estimate
    none = next(line for line in lines if line.startswith("| none"))
    assert "†" not in none
    assert "† spread too large to rank" in text and "≈ energy estimated" in text

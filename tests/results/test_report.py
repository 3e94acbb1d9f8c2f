"""The Markdown report of a study: which columns a reader gets."""

from __future__ import annotations

import optuna

from paretolab.results import read, section
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
    monkeypatch.setattr(section, "trial_table", lambda name, s: ([("speedup_vs_greedy", "maximize"), ("mean_accepted_len", "maximize")], [row]))
    text = section.study_section("decode", stores, ["acc", "decode_tok_s", "ppl"], frontier=False)
    header = next(line for line in text.splitlines() if line.startswith("| method"))
    # objectives first, then the asked-for metrics that some trial reported (no ppl column)
    assert header == "| method | params | speedup_vs_greedy | mean_accepted_len | acc | decode_tok_s | cost | trial |"


def test_report_gives_provenance_size_against_stored_and_fp16_and_marks_noise_and_estimates(tmp_path, monkeypatch):
    stores = _study(tmp_path, ["ppl", "prefill_speedup"])
    base = {"info.weights": "gguf:Q4_1 dequantized", "info.base_stored_bytes": "96576768.0",
            "info.base_fp16_bytes": "269030016.0", "info.energy_source": "estimate"}
    rows = [
        {"trial": 0, "method": "none", "params": {}, "run_params": base, "simulated_by": "", "ppl": 10.0,
         "prefill_speedup": 1.0, "prefill_speedup_iqr": 0.02, "size_bytes": 538060032.0, "energy_j": 40.0, "base_prefill_ms": 1000.0},
        {"trial": 1, "method": "macko", "params": {}, "run_params": base, "simulated_by": "", "ppl": 10.5,
         "prefill_speedup": 1.3, "prefill_speedup_iqr": 0.5, "size_bytes": 169030016.0, "energy_j": 30.0, "base_prefill_ms": 2500.0},
    ]
    monkeypatch.setattr(section, "trial_table", lambda name, s: ([("ppl", "minimize"), ("prefill_speedup", "maximize")], rows))
    text = section.study_section("decode", stores, ["size_bytes", "energy_j"], frontier=False)
    assert "Base weights: **gguf:Q4_1 dequantized**; stored 96.58 MB, 269 MB in fp16" in text
    lines = text.splitlines()  # the last table: every measurement, folded under the decision table of the objectives
    header = [line for line in lines if line.startswith("| method")][-1]
    assert "| size_bytes | size ÷ stored base | size ÷ fp16 base | energy_j |" in header
    macko = [line for line in lines if line.startswith("| macko")][-1]
    assert "| ×1.75 | ×0.6283 |" in macko  # ratios carry ×: 169 MB against the 96.6 MB GGUF and the 269 MB fp16 model; never vs fp32
    assert "1.3 †" in macko and "≈30" in macko  # IQR 0.5 on 1.3 is too wide to rank; energy is an estimate
    none = [line for line in lines if line.startswith("| none")][-1]
    assert "†" not in none
    assert "† spread too large to rank" in text and "≈ energy estimated" in text
    # the dense model's own time moved 2.5x between the two trials: the reader is told, and why ratios lead
    assert "timed beside each of 2 trials (prefill, `base_prefill_ms`): median 1750, range 1000–2500 (max ÷ min ×2.5)" in text


def _stored_study(tmp_path, trials):
    """A study with real Optuna trials and MLflow runs carrying per-example artifacts: (stores, name)."""
    from paretolab.records import TrialResult
    from paretolab.stats import per_example_json
    from paretolab.stores.tracking import Tracker

    stores = Stores(f"sqlite:///{tmp_path / 'optuna.db'}", f"sqlite:///{tmp_path / 'mlflow.db'}", str(tmp_path / "artifacts"))
    study = optuna.create_study(study_name="q", storage=stores.optuna_url, directions=["maximize", "minimize"])
    study.set_user_attr("objectives", [["acc", "maximize"], ["size_bytes", "minimize"]])
    tracker = Tracker(stores, "q")
    parent = tracker.study_run({}, {})
    for method, hits, size in trials:
        trial = study.ask()
        from paretolab.stats import mean_with_stderr

        metrics = {**mean_with_stderr("acc", hits), "n_examples": float(len(hits)), "size_bytes": size}
        result = TrialResult(metrics=metrics, artifacts={"per_example.json": per_example_json("example", {"acc": hits}).encode()})
        trial.set_user_attr("mlflow_run_id", tracker.log_trial(parent, trial.number, {"s0.method": method}, result, {}))
        study.tell(trial, [metrics["acc"], size])
    return stores, "q"


def _hits(seed: int = 0) -> list[float]:
    import numpy as np

    return list((np.random.default_rng(seed).random(400) < 0.5).astype(float))


def _fix(hits: list[float], k: int) -> list[float]:
    """``hits`` with the first ``k`` misses turned into hits."""
    out, misses = list(hits), [i for i, h in enumerate(hits) if h == 0]
    for i in misses[:k]:
        out[i] = 1.0
    return out


def test_frontier_marks_neighbours_within_noise(tmp_path, capsys):
    base = _hits()
    # trial 0: +16 examples, big; trial 1: +15, smaller (within noise of 0); trial 2: base, smallest (beyond noise of 1)
    stores, name = _stored_study(tmp_path, [("none", _fix(base, 16), 100.0), ("rtn", _fix(base, 15), 50.0), ("wanda", base, 20.0)])
    rows = read.frontier_rows(name, stores)
    assert [(r["trial"], r["noise"]) for r in rows] == [(2, ""), (1, "acc ≈ trial 0"), (0, "acc ≈ trial 1")]
    read.print_frontier(name, rows)
    assert "within noise of" in capsys.readouterr().out


def test_quality_differences_come_with_a_paired_interval_and_a_noise_verdict(tmp_path):
    import numpy as np

    base = list((np.random.default_rng(0).random(400) < 0.5).astype(float))
    fixed = list(base)
    for i in [i for i, h in enumerate(base) if h == 0][:16]:  # 16 of 400 examples fixed, none broken: +4 points
        fixed[i] = 1.0
    swapped = list(base)  # 2 fixed, 2 broken: the same accuracy, a different set of right answers
    ones, zeros = [i for i, h in enumerate(base) if h], [i for i, h in enumerate(base) if not h]
    for i in ones[:2]:
        swapped[i] = 0.0
    for i in zeros[:2]:
        swapped[i] = 1.0
    stores, name = _stored_study(tmp_path, [("none", base, 100.0), ("rtn", fixed, 50.0), ("wanda", swapped, 60.0)])
    text = section.study_section(name, stores, ["acc"], frontier=False)
    table = [line for line in text.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    assert header[header.index("acc") + 1] == "Δacc vs none" and "n" in header
    cells = {row.split("|")[1].strip(): dict(zip(header, (c.strip() for c in row.strip("|").split("|")))) for row in table[1:]}
    assert cells["rtn"]["Δacc vs none"].startswith("+0.04 [") and "beyond noise (paired, 400 examples)" in cells["rtn"]["Δacc vs none"]
    assert cells["wanda"]["Δacc vs none"].startswith("+0 [") and "within noise (paired, 400 examples)" in cells["wanda"]["Δacc vs none"]
    assert cells["none"]["acc"] == f"{np.mean(base):.4g} ± {np.std(base, ddof=1) / 20:.2g}"
    assert cells["none"]["n"] == "400 examples"
    assert "*within noise* when that interval contains 0" in text  # the legend says what the verdict means


def test_a_training_study_labels_its_untreated_trials_none_so_they_are_the_baseline():
    rows = [{"method": "bhyt+train"}, {"method": "train"}, {"method": "dyt+train"}]
    assert [r["method"] for r in read._without_common_training(rows)] == ["bhyt", "none", "dyt"]
    mixed = [{"method": "wanda+train"}, {"method": "wanda"}]  # not every trial trained: labels stay as they are
    assert [r["method"] for r in read._without_common_training(mixed)] == ["wanda+train", "wanda"]


def test_report_prints_the_pipelines_frontiers_and_marks_stage_energies_estimated(tmp_path, monkeypatch):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="distill", storage=storage, directions=["minimize", "minimize"])
    study.set_user_attr("objectives", [["val_bpb", "minimize"], ["pipeline_energy_j", "minimize"]])
    study.set_user_attr("model", "scratch-smol")
    study.set_user_attr("pipeline", {"task": {"name": "perplexity"}, "frontiers": [["val_bpb", "student_side_energy_j"], ["val_bpb", "pipeline_energy_j"]],
                                     "stages": [{"id": "teacher", "choice": [{"method": "distill_kd"}, {"method": "none"}]}, {"method": "train"}]})
    stores = Stores(storage, f"sqlite:///{tmp_path / 'mlflow.db'}", None)
    estimate = {"info.energy_source": "estimate"}
    rows = [
        {"trial": 0, "method": "distill_kd", "params": {"teacher.method": "distill_kd"}, "run_params": {**estimate, "teacher.method": "distill_kd"},
         "simulated_by": "", "val_bpb": 3.0, "student_side_energy_j": 100.0, "pipeline_energy_j": 900.0, "teacher_j_per_token": 0.5},
        {"trial": 1, "method": "none", "params": {"teacher.method": "none"}, "run_params": {**estimate, "teacher.method": "none"},
         "simulated_by": "", "val_bpb": 3.2, "student_side_energy_j": 100.0, "pipeline_energy_j": 100.0, "teacher_j_per_token": 0.0},
    ]
    monkeypatch.setattr(section, "trial_table", lambda name, s: ([("val_bpb", "minimize"), ("pipeline_energy_j", "minimize")], rows))
    text = section.study_section("distill", stores, ["student_side_energy_j", "teacher_j_per_token"], frontier=False)
    assert "- `val_bpb` vs `student_side_energy_j` (2 trials): distill_kd (trial 0)" in text
    assert "- `val_bpb` vs `pipeline_energy_j` (2 trials): distill_kd (trial 0); none (trial 1)" in text
    assert "**Frontier outcome:** the methods on the frontier differ: {distill_kd} → {distill_kd, none}." in text
    kd = next(line for line in text.splitlines() if line.startswith("| distill_kd"))
    assert "≈900" in kd and "≈100" in kd and "≈0.5" in kd  # every joule column of an estimated trial is marked


def test_a_section_opens_with_the_papers_claim_and_a_trained_base_with_its_training_record(tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("PARETOLAB_CACHE", str(tmp_path / "cache"))
    from paretolab.training.checkpoints import RECORD, trained_dir

    (trained_dir() / "base-fp32").mkdir(parents=True)
    (trained_dir() / "base-fp32" / RECORD).write_text(json.dumps(
        {"base": "scratch-5m", "weights": "fp32 (trained here)", "tokens": 206848, "corpus": "pystdlib-train",
         "val_corpus": "pystdlib-val", "val_loss": 5.4816, "seed": 0, "saved_at": "2026-11-30T19:30:10Z"}))
    stores = _study(tmp_path, ["ppl"])
    optuna.load_study(study_name="decode", storage=stores.optuna_url).set_user_attr("model", "base-fp32")
    optuna.load_study(study_name="decode", storage=stores.optuna_url).set_user_attr(
        "pipeline", {"task": {"name": "perplexity"}, "description": "X claims  8-bit psums\n cost nothing.", "stages": []})
    monkeypatch.setattr(section, "trial_table", lambda name, s: ([("ppl", "minimize")], []))
    text = section.study_section("decode", stores, [], frontier=False)
    assert "**The paper:** X claims 8-bit psums cost nothing." in text
    assert ("Base `base-fp32`: fp32 (trained here), from `scratch-5m` on 206848 tokens of pystdlib-train (seed 0), "
            "val_loss 5.482 nats/token on pystdlib-val; saved 2026-11-30T19:30:10Z.") in text


def test_a_run_ends_with_its_claims_verdicts_in_plain_lines(tmp_path):
    """What `paretolab run` prints after the frontier (the demo's first run ends with a verdict)."""
    base = _hits()
    stores, name = _stored_study(tmp_path, [("none", base, 100.0), ("rtn", _fix(base, 40), 50.0)])
    pipeline = {"name": "q", "task": {"name": "mc"}, "stages": [{"id": "s0", "choice": [{"method": "none"}, {"method": "rtn", "params": {"bits": [4]}}]}],
                "claim": {"text": "rtn raises acc", "metric": "acc", "method": "rtn", "baseline": "none", "expect": "higher", "replicates": "none"}}
    optuna.load_study(study_name=name, storage=stores.optuna_url).set_user_attr("pipeline", pipeline)
    lines = section.verdict_summary(name, stores)
    assert lines[0] == "Claim: rtn raises acc"
    assert lines[1].startswith("Verdict: held — acc rtn − none = +0.1")
    assert all("**" not in line for line in lines)


def test_a_difference_that_is_the_same_on_every_example_says_no_variation_observed():
    """Two trials that score 0 on all 256 problems differ by +0 [+0, +0]: no noise was seen, so no noise verdict."""
    from paretolab.results.noise import describe
    from paretolab.stats import PairedDifference

    assert describe(PairedDifference(0.0, 0.0, 0.0, 256, "example")) == "+0 [+0, +0] no variation observed (paired, 256 examples)"
    assert describe(PairedDifference(0.01, -0.002, 0.02, 256, "example")).endswith("within noise (paired, 256 examples)")
    assert describe(PairedDifference(0.05, 0.03, 0.07, 256, "example")).endswith("beyond noise (paired, 256 examples)")
    assert describe(PairedDifference(0.05, 0.03, 0.07, 1000, "query")).endswith("(paired, 1000 queries)")  # not "querys"


def test_a_section_says_which_trials_training_the_clock_cut_short():
    """A trial whose train stage stopped on max_minutes trained less than asked: the section names it, not only a number."""
    from types import SimpleNamespace

    def run(stopped_by: str) -> SimpleNamespace:
        return SimpleNamespace(data=SimpleNamespace(params={"info.train_stopped_by": stopped_by}))

    lines = section._time_capped({0: run("max_minutes"), 1: run("tokens"), 2: run("trial_timeout"), 3: run("flops")})
    assert lines[0].startswith("> **Stopped by the clock:** trial(s) 0, 2 of 4 ended their training on `max_minutes`")
    assert section._time_capped({1: run("tokens"), 3: run("flops")}) == []

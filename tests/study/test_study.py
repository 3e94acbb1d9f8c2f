"""End-to-end studies through the real CLI on a real local Ray head: the mechanics users rely on."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
from collections import Counter
from pathlib import Path

import optuna
import pytest
import yaml

from tests.conftest import BIN, cli_here, run_cli, wait_for

pytestmark = pytest.mark.ray


def write_pipeline(folder: Path, **overrides) -> Path:
    spec = {
        "name": "t",
        "model": "tiny-llama",
        "task": {"name": "perplexity", "corpus": "pydoc", "max_tokens": 512, "context": 128, "stride": 128},
        "stages": [{"method": "magnitude", "params": {"sparsity": {"low": 0.1, "high": 0.9}}}],
        "objectives": [{"metric": "ppl"}, {"metric": "size_bytes"}],
        "search": {"sampler": "random", "trials": 4, "seed": 0, "trial_timeout_s": 120},
        "resources": {"cpus": 1},
        "measures": ["size", "params"],
    }
    spec.update(overrides)
    path = folder / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def optuna_trials(folder: Path, name: str) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{folder / '.paretolab' / 'optuna.db'}")
    return study.get_trials(deepcopy=False)


def mlflow_trial_runs(folder: Path, name: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{folder / '.paretolab' / 'mlflow.db'}")
    exp = client.get_experiment_by_name(name)
    return list(client.search_runs([exp.experiment_id], "tags.`paretolab.role` = 'trial'", max_results=1000))


def test_smoke_study_records_every_trial_in_both_stores(tmp_path, ray_head):
    run_cli("run", str(Path(__file__).parents[2] / "pipelines" / "smoke.yaml"), "--address", ray_head, "--trials", "6", "--no-progress", cwd=tmp_path)
    trials = optuna_trials(tmp_path, "smoke")
    assert len(trials) == 6 and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    runs = mlflow_trial_runs(tmp_path, "smoke")
    assert sorted(int(r.data.tags["paretolab.trial_number"]) for r in runs) == [t.number for t in trials]
    run = runs[0]
    assert {"ppl", "size_bytes", "prefill_ms", "decode_tok_s", "peak_rss_mb", "overhead_s", "stage_s.evaluate"} <= set(run.data.metrics)
    assert run.data.tags["paretolab.methods"] == "magnitude,none,rtn"
    assert run.data.tags["paretolab.pipeline_hash"] and run.data.tags["paretolab.code_version"]
    assert run.data.tags["mlflow.parentRunId"]
    # magnitude's bitmap storage is a simulated saving, and says so
    assert "magnitude" in run.data.tags["paretolab.simulated_by"]
    # energy per stage and its source, the base's provenance, and the speedup against the unmodified model
    assert {"energy_j", "stage_energy_j.evaluate", "stage_energy_j.copy", "prefill_speedup", "prefill_ms_iqr"} <= set(run.data.metrics)
    assert run.data.tags["paretolab.energy_source"] == "estimate" and run.data.tags["paretolab.weights"] == "random init"

    frontier = json.loads(cli_here("frontier", "smoke", "--json", cwd=tmp_path).stdout)
    assert frontier and all({"trial", "ppl", "size_bytes", "params"} <= set(row) for row in frontier)
    sizes = [row["size_bytes"] for row in frontier]
    ppls = [row["ppl"] for row in frontier]
    assert ppls == sorted(ppls) and sizes == sorted(sizes, reverse=True)  # a frontier trades one for the other

    table = cli_here("report", "smoke", "--metrics", "ppl,size_bytes,sqnr_db", cwd=tmp_path).stdout.splitlines()
    header = next(i for i, line in enumerate(table) if line.startswith("| method"))
    # no trial reported sqnr_db; sizes against the base as stored and in fp16, never only against fp32; n: windows behind ppl
    assert table[header] == "| method | params | ppl | size_bytes | size ÷ stored base | size ÷ fp16 base | n | cost | trial |"
    labels = {line.split("|")[1].strip() for line in table[header + 2:] if line.startswith("|")}
    assert labels and labels <= {"magnitude", "magnitude+rtn"}
    # a whole document with every complete trial, saying which command made it
    run_cli("report", "smoke", "--trials", "all", "--output", "RESULTS.md", cwd=tmp_path)
    doc = (tmp_path / "RESULTS.md").read_text()
    assert "`paretolab report smoke --trials all --output RESULTS.md`" in doc and "6 complete trial(s), 0 failed" in doc
    decision, _, every = doc.partition("<details>")  # the short decision table, then every measurement, collapsed
    for part in (decision, every):
        rows = [line for line in part.splitlines() if line.startswith("| magnitude")]
        assert len(rows) == 6 and all("simulated (magnitude" in row for row in rows)


def test_failing_methods_fail_their_trials_and_the_study_completes(tmp_path, ray_head, with_testplugin):
    pipeline = write_pipeline(
        tmp_path,
        name="faults",
        stages=[{"choice": [{"method": "none"}, {"method": "explode"}, {"method": "nan_weights"}, {"method": "hang"}, {"method": "noise", "params": {"std": 0.01}}]}],
        search={"sampler": "grid", "trials": 5, "seed": 0, "trial_timeout_s": 10},  # hang holds a worker this long
    )
    hook_log = tmp_path / "hooks.jsonl"
    out = run_cli("run", str(pipeline), "--address", ray_head, "--no-progress", cwd=tmp_path, env={"PARETOLAB_TEST_HOOK_LOG": str(hook_log)})
    assert "2 trial(s) completed, 3 failed" in out.stdout
    reasons = out.stdout.split("failed trials of 'faults' by reason:\n")[1].splitlines()[:3]
    assert sorted(line.split(" x ")[0].strip() for line in reasons) == ["1", "1", "1"]
    assert any("RuntimeError: deliberate failure for the tests" in line for line in reasons)
    assert any("timed out after 10 s" in line for line in reasons)
    calls = [json.loads(line) for line in hook_log.read_text().splitlines()]
    assert sorted(c["number"] for c in calls if c["hook"] == "started") == list(range(5))
    finished = {c["number"]: c["error"] for c in calls if c["hook"] == "finished"}
    assert len(finished) == 5 and sum(e is not None for e in finished.values()) == 3
    by_method = {t.params["stage0.method"]: t for t in optuna_trials(tmp_path, "faults")}
    assert by_method["none"].state == by_method["noise"].state == optuna.trial.TrialState.COMPLETE
    assert "deliberate failure" in by_method["explode"].user_attrs["fail_reason"]
    assert "ppl" in by_method["nan_weights"].user_attrs["fail_reason"] and "NaN" in by_method["nan_weights"].user_attrs["fail_reason"]
    assert "timed out after 10 s" in by_method["hang"].user_attrs["fail_reason"]
    runs = {r.data.tags["paretolab.trial_number"]: r for r in mlflow_trial_runs(tmp_path, "faults")}
    assert len(runs) == 5
    failed = runs[str(by_method["explode"].number)]
    assert failed.info.status == "FAILED" and "deliberate failure" in failed.data.tags["paretolab.failure"]
    assert "testplugin=paretolab-testplugin 0.3.1" in failed.data.tags["paretolab.plugin_versions"]


def test_third_party_plugin_is_listed_and_autoload_can_turn_it_off(tmp_path, with_testplugin):
    listed = run_cli("plugins", cwd=tmp_path).stdout
    assert "noise  [weights, cost simulated]  from testplugin (paretolab-testplugin 0.3.1)" in listed
    assert "magnitude  [weights, cost simulated, per-layer]  from paretolab.plugins.baselines\n" in listed
    off = run_cli("plugins", cwd=tmp_path, env={"PARETOLAB_DISABLE_PLUGIN_AUTOLOAD": "1"}).stdout
    assert "  noise  [" not in off and "  magnitude  [" in off
    pipeline = write_pipeline(tmp_path, name="third", stages=[{"method": "noise"}])
    refused = run_cli("run", str(pipeline), cwd=tmp_path, env={"PARETOLAB_DISABLE_PLUGIN_AUTOLOAD": "1"}, check=False)
    assert refused.returncode == 2 and "unknown method 'noise'" in refused.stderr


def test_driver_killed_mid_study_resumes_with_every_trial_recorded_once(tmp_path, ray_head, with_testplugin):
    pipeline = write_pipeline(tmp_path, name="crash", stages=[{"method": "sleep", "params": {"seconds": {"low": 2.0, "high": 3.0}}}],
                              search={"sampler": "random", "trials": 8, "seed": 1, "trial_timeout_s": 120})
    env = {**os.environ, "PYTHONPATH": os.environ["PYTHONPATH"]}
    driver = subprocess.Popen([str(BIN / "paretolab"), "run", str(pipeline), "--address", ray_head, "--no-progress"],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    db = tmp_path / ".paretolab" / "optuna.db"

    def some_done():  # read-only polling: never race the driver creating the schema
        if not db.exists():
            return False
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                states = dict(conn.execute("SELECT state, count(*) FROM trials GROUP BY state").fetchall())
        except sqlite3.Error:
            return False
        return states.get("COMPLETE", 0) >= 2 and states.get("RUNNING", 0) >= 1

    try:
        wait_for(some_done, timeout=300)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    before = Counter(t.state for t in optuna_trials(tmp_path, "crash"))
    assert before[optuna.trial.TrialState.RUNNING] >= 1 and sum(before.values()) < 8 + 2

    refused = run_cli("run", str(pipeline), "--address", ray_head, cwd=tmp_path, check=False)
    assert refused.returncode == 2 and "--resume" in refused.stderr
    run_cli("run", str(pipeline), "--address", ray_head, "--resume", "--no-progress", cwd=tmp_path)

    trials = optuna_trials(tmp_path, "crash")
    assert len(trials) == 8 and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    numbers = Counter(int(r.data.tags["paretolab.trial_number"]) for r in mlflow_trial_runs(tmp_path, "crash"))
    assert sorted(numbers) == list(range(8)) and set(numbers.values()) == {1}

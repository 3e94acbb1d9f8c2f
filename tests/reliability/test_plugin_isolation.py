"""A plugin cannot take the study down (issue 69): a non-finite metric fails its trial naming the metric; a raising
``trial_started``/``trial_finished`` hook fails that trial naming plugin and hook, and the study goes on; the child
processes a trial started are stopped with it, and the trial says so; no trial folder is left in the temp folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import optuna
import psutil
import pytest
import yaml

from paretolab import Method
from paretolab.records import StagePlan, TrialSettings
from paretolab.study.trial import STOPPED, TRIAL_FOLDER, run_trial
from tests.conftest import run_cli

SETTINGS = TrialSettings("iso", "perplexity", {"max_tokens": 128, "context": 64, "stride": 64}, {"params": {}}, seed=0)

# A third-party plugin as a careless author would write it; shipped to the Ray workers through PYTHONPATH.
PLUGIN = '''
import os, subprocess

from paretolab import Method, Metric, hookimpl


class Value(Method):
    name = "iso_value"
    kind = "weights"
    metrics = ("iso_score",)

    def search_space(self):
        import optuna
        return {"value": optuna.distributions.CategoricalDistribution(["inf", "-inf", "nan", "1"])}

    def defaults(self):
        return {"value": "1"}

    def transform(self, subject, params, ctx):
        self.value = float(params["value"])
        return subject

    def evaluate(self, subject, ctx):
        return {"iso_score": self.value}


class Spawn(Method):
    name = "iso_spawn"
    kind = "weights"

    def transform(self, subject, params, ctx):
        mark = os.environ["PARETOLAB_ISO_MARK"]
        subprocess.Popen(["sleep", f"1000.{mark}1"], start_new_session=True)  # a detached child
        subprocess.run(["sh", "-c", f"sleep 1000.{mark}2 >/dev/null 2>&1 &"], check=True)  # a daemon: double-forked away
        return subject


class Nothing(Method):
    kind = "weights"

    def transform(self, subject, params, ctx):
        return subject


class HookStart(Nothing):
    name = "iso_hook_start"


class HookFinish(Nothing):
    name = "iso_hook_finish"


@hookimpl
def register_methods(register):
    for method in (Value(), Spawn(), HookStart(), HookFinish()):
        register(method)


@hookimpl
def register_metrics(register):
    register(Metric("iso_score", "", "minimize", "a number the isolation test's method reports"))


@hookimpl
def trial_started(trial):
    if any(s.method == "iso_hook_start" for s in trial.plan):
        raise RuntimeError("started hook broke")


@hookimpl
def trial_finished(trial, result):
    if any(s.method == "iso_hook_finish" for s in trial.plan):
        raise ValueError("finished hook broke")
'''


def mark_alive(mark: str) -> list[str]:
    """The processes anywhere on the machine whose command line carries ``mark``."""
    out = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if f"1000.{mark}" in cmd and proc.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(f"{proc.pid} {cmd}")
    return out


def install_plugin(folder: Path) -> Path:
    """The plugin above as an installed distribution (a module and its dist-info with the entry point) under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "isoplug.py").write_text(PLUGIN)
    info = folder / "isoplug-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: isoplug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[paretolab.plugins]\nisoplug = isoplug\n")
    return folder


@pytest.fixture(scope="module")
def study(tmp_path_factory, ray_head):
    """One study of every badly behaved plugin above beside an ordinary method, run to its end by the real driver."""
    folder = tmp_path_factory.mktemp("isolation")
    site = install_plugin(folder / "site")
    mark = str(uuid.uuid4().int % 10**8)
    spec = {"name": "iso", "model": "tiny-llama",
            "task": {"name": "perplexity", "corpus": "pydoc", "max_tokens": 256, "context": 128, "stride": 128},
            "stages": [{"choice": [{"method": "none"}, {"method": "iso_value", "params": {"value": ["inf", "-inf", "nan"]}},
                                   {"method": "iso_spawn"}, {"method": "iso_hook_start"}, {"method": "iso_hook_finish"}]}],
            "objectives": [{"metric": "ppl"}, {"metric": "size_bytes"}],
            "search": {"sampler": "grid", "trials": 7, "seed": 0, "trial_timeout_s": 300},
            "resources": {"cpus": 1}, "measures": ["size", "params"]}
    (folder / "iso.yaml").write_text(yaml.safe_dump(spec))
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])), "PARETOLAB_ISO_MARK": mark}
    proc = run_cli("run", "iso.yaml", "--address", ray_head, "--no-progress", cwd=folder, env=env, check=False)
    trials = optuna.load_study(study_name="iso", storage=f"sqlite:///{folder / '.paretolab' / 'optuna.db'}").get_trials(deepcopy=False)
    value = {t.number: next((v for k, v in t.params.items() if k.endswith(".value")), None) for t in trials}
    return proc, {(t.params["stage0.method"], value[t.number]): t for t in trials}, mark


def test_the_study_runs_to_its_end_past_every_badly_behaved_plugin(study):
    proc, trials, _ = study
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(trials) == 7 and "2 trial(s) completed, 5 failed" in proc.stdout, proc.stdout[-2000:]
    assert trials[("none", None)].state == optuna.trial.TrialState.COMPLETE


@pytest.mark.parametrize("value, shown", [("inf", "+inf"), ("-inf", "-inf"), ("nan", "NaN")])
def test_a_non_finite_metric_fails_its_trial_naming_the_metric(study, value, shown):
    trial = study[1][("iso_value", value)]
    reason = trial.user_attrs["fail_reason"]
    assert trial.state == optuna.trial.TrialState.FAIL, reason
    assert f"iso_score is {shown} (from method 'iso_value')" in reason and "finite" in reason


def test_a_raising_trial_started_hook_fails_that_trial_naming_plugin_and_hook(study):
    trial = study[1][("iso_hook_start", None)]
    assert trial.state == optuna.trial.TrialState.FAIL
    assert trial.user_attrs["fail_reason"] == "plugin 'isoplug''s trial_started hook raised RuntimeError: started hook broke"


def test_a_raising_trial_finished_hook_fails_that_trial_naming_plugin_and_hook(study):
    trial = study[1][("iso_hook_finish", None)]
    assert trial.state == optuna.trial.TrialState.FAIL
    assert trial.user_attrs["fail_reason"] == "plugin 'isoplug''s trial_finished hook raised ValueError: finished hook broke"


def test_the_child_processes_a_trial_started_are_stopped_with_it_and_the_trial_says_so(study):
    proc, trials, mark = study
    trial = trials[("iso_spawn", None)]
    assert trial.state == optuna.trial.TrialState.COMPLETE
    said = trial.user_attrs[STOPPED]
    assert said.startswith("stopped 2 child process(es) the trial left: ") and f"sleep 1000.{mark}1" in said and f"sleep 1000.{mark}2" in said
    assert f"trial {trial.number}: stopped 2 child process(es)" in proc.stdout
    assert not mark_alive(mark)


# --- the same, one trial at a time in this process (fast; each seen failing with its fix undone) ---

def reporting(value: float):
    class Reports(Method):
        name = "iso_reports"
        kind = "weights"
        metrics = ("iso_score",)

        def transform(self, subject, params, ctx):
            return subject

        def evaluate(self, subject, ctx):
            return {"iso_score": value}

    return Reports()


@pytest.fixture
def score_metric():
    from paretolab.plugin_api.manager import registries
    from paretolab.plugin_api.metrics import Metric

    registries().metrics.register(Metric("iso_score", "", "minimize", "a test's number"), owner="test")


@pytest.mark.parametrize("value, shown", [(float("inf"), "+inf"), (float("-inf"), "-inf"), (float("nan"), "NaN")])
def test_run_trial_fails_a_non_finite_metric_and_keeps_it_out_of_the_record(value, shown, register, score_metric, tiny):
    result = run_trial(tiny, [StagePlan("stage0", register(reporting(value)).name, {})], SETTINGS, number=0)
    assert result.failed and f"iso_score is {shown} (from method 'iso_reports')" in result.error
    assert "iso_score" not in result.metrics and "ppl" in result.metrics


def test_run_trial_keeps_a_finite_metric(register, score_metric, tiny):
    result = run_trial(tiny, [StagePlan("stage0", register(reporting(1.5)).name, {})], SETTINGS, number=0)
    assert not result.failed and result.metrics["iso_score"] == 1.5 and STOPPED not in result.info


def spawning(mark: str, then_raise: bool = False):
    class Spawns(Method):
        name = "iso_spawns"
        kind = "weights"

        def transform(self, subject, params, ctx):
            subprocess.Popen(["sleep", f"1000.{mark}1"], start_new_session=True, cwd=ctx.workdir)
            subprocess.run(["sh", "-c", f"sleep 1000.{mark}2 >/dev/null 2>&1 &"], check=True)
            if then_raise:
                raise RuntimeError("spawned, then failed")
            return subject

    return Spawns()


@pytest.mark.parametrize("then_raise", [False, True])
def test_run_trial_stops_the_children_it_left_double_forked_too(then_raise, register, tiny):
    mark = str(uuid.uuid4().int % 10**8)
    try:
        result = run_trial(tiny, [StagePlan("stage0", register(spawning(mark, then_raise)).name, {})], SETTINGS, number=0)
        assert result.failed == then_raise
        said = result.info[STOPPED]
        assert said.startswith("stopped 2 child process(es) the trial left: ")
        assert f"sleep 1000.{mark}1" in said and f"sleep 1000.{mark}2" in said
        assert not mark_alive(mark)
    finally:
        for line in mark_alive(mark):
            os.kill(int(line.split()[0]), 9)


def test_a_hook_that_raises_is_named_with_its_plugin_and_the_others_still_run():
    import pluggy

    from paretolab.plugin_api import hookspec
    from paretolab.records import TrialInfo
    from paretolab.study.recording import call_hook

    seen = []

    class Good:
        @hookspec.hookimpl
        def trial_started(self, trial):
            seen.append(trial.number)

    class Bad:
        @hookspec.hookimpl
        def trial_started(self, trial):
            raise SystemExit(3)

    pm = pluggy.PluginManager("paretolab")
    pm.add_hookspecs(hookspec)
    pm.register(Good(), name="good")
    pm.register(Bad(), name="bad")
    said = call_hook(pm.hook, "trial_started", trial=TrialInfo("s", 4, [], {}))
    assert said.startswith("plugin 'bad''s trial_started hook raised SystemExit") and seen == [4]
    assert call_hook(pm.hook, "trial_finished", trial=TrialInfo("s", 4, [], {}), result=None) == ""


def test_no_trial_folder_is_left_in_the_temp_folder_after_a_trial_fails(register, tiny, tmp_path, monkeypatch):
    import tempfile

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))

    class Fails(Method):
        name = "iso_fails"
        kind = "weights"

        def transform(self, subject, params, ctx):
            (ctx.workdir / "scratch").mkdir()
            (ctx.workdir / "scratch" / "f").write_text("x")
            raise RuntimeError("failed with files in its folder")

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    stale, alive = temp / f"{TRIAL_FOLDER}3-p{gone}-x1", temp / f"{TRIAL_FOLDER}3-p{os.getppid()}-x2"
    stale.mkdir(), alive.mkdir()
    result = run_trial(tiny, [StagePlan("stage0", register(Fails()).name, {})], SETTINGS, number=0)
    assert result.failed and "failed with files in its folder" in result.error
    # the trial's own folder is gone, and the folder a killed worker left (its process is gone); a live worker's stays
    assert sorted(p.name for p in temp.iterdir()) == [alive.name]


def test_stopping_a_trials_children_changes_nothing_for_the_process_after_it():
    """No process-wide setting: after a trial, an orphan of this process (a server's child whose parent died) is not
    adopted by it as a zombie; a child subreaper made the engine server tests see their stopped servers still alive."""
    from paretolab.study.trial import TrialChildren

    TrialChildren().stop()
    shell = subprocess.Popen(["sh", "-c", "sleep 30 & echo $!"], stdout=subprocess.PIPE, text=True)
    orphan = int(shell.stdout.readline())
    shell.wait()
    try:
        assert psutil.Process(orphan).ppid() != os.getpid()  # re-parented to init (or the system's reaper), not to us
    finally:
        os.kill(orphan, signal.SIGKILL)

"""A study has one driver: a second one is refused naming the owner; the lock dies with its holder."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import optuna
import pytest

from paretolab.stores.ownership import StudyOwnedError, creating_stores, own_study
from tests.conftest import BIN, wait_for
from tests.study.test_study import write_pipeline

HOLD = "from paretolab.stores.ownership import own_study; import sys, time; l = own_study(sys.argv[1], 's'); print('held', flush=True); time.sleep(120)"


@pytest.fixture(scope="module")
def pg():
    """A PostgreSQL server on loopback (the one the cluster tests use), with databases optuna and mlflow."""
    from paretolab.cluster.localcluster import Postgres

    server = Postgres().start()
    yield server
    server.stop()


def _holder(url: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, url], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _refused_then_free(url: str) -> None:
    holder = _holder(url)
    try:
        with pytest.raises(StudyOwnedError, match=rf"study 's' is being run by another driver \(host .+, pid {holder.pid}, since .+\)"):
            own_study(url, "s")
    finally:
        holder.kill()  # SIGKILL: no cleanup runs, the OS / the server drops the lock
        holder.wait()
    import time

    deadline = time.monotonic() + 10  # PostgreSQL notices the closed connection almost at once
    while True:
        try:
            own_study(url, "s").release()
            return
        except StudyOwnedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_the_sqlite_lock_names_its_owner_and_dies_with_it(tmp_path):
    _refused_then_free(f"sqlite:///{tmp_path / 'optuna.db'}")


def test_the_postgres_lock_names_its_owner_and_dies_with_it(pg):
    _refused_then_free(pg.url("optuna"))


def test_store_creation_waits_for_the_process_creating_it(tmp_path):
    url = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with creating_stores(url):
        waiter = subprocess.Popen([sys.executable, "-c", "from paretolab.stores.ownership import creating_stores; import sys; "
                                   "creating_stores(sys.argv[1]); print('got it')", url], stdout=subprocess.PIPE, text=True)
        with pytest.raises(subprocess.TimeoutExpired):
            waiter.wait(timeout=3)
    assert waiter.communicate(timeout=60)[0].strip() == "got it"


def test_two_processes_open_empty_stores_at_once(tmp_path):
    """Both create the Optuna schema and migrate MLflow's on the same empty home: neither crashes."""
    code = ("import sys, pathlib, time\n"
            "from paretolab.stores import resolve_stores\nfrom paretolab.stores.open import optuna_storage\n"
            "from paretolab.stores.tracking import Tracker\n"
            "go = pathlib.Path(sys.argv[2])\n"
            "pathlib.Path(sys.argv[2] + '.' + sys.argv[3]).write_text('')\n"  # imported: ready
            "while not go.exists(): time.sleep(0.01)\n"  # start together, after the slow imports
            "stores = resolve_stores(home=sys.argv[1])\noptuna_storage(stores, create=True)\nTracker(stores, sys.argv[3])\nprint('ok')\n")
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "home"), str(go), f"s{i}"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    wait_for(lambda: all((tmp_path / f"go.s{i}").exists() or p.poll() is not None for i, p in enumerate(procs)), timeout=300, interval=0.05)
    go.write_text("")
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in results]


SLEEPY = [{"method": "sleep", "params": {"seconds": {"low": 1.0, "high": 2.0}}}]


def _driver(pipeline: Path, cwd: Path, address: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / "paretolab"), "run", str(pipeline), "--address", address, "--no-progress", *extra],
                            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_two_drivers_on_one_study_one_runs_it_the_other_is_refused(backend, tmp_path, ray_head, with_testplugin, request):
    flags: list[str] = []
    optuna_url, tracking_uri = f"sqlite:///{tmp_path / '.paretolab' / 'optuna.db'}", f"sqlite:///{tmp_path / '.paretolab' / 'mlflow.db'}"
    if backend == "postgresql":
        server = request.getfixturevalue("pg")
        optuna_url, tracking_uri = server.url("optuna"), server.url("mlflow")
        flags = ["--storage", optuna_url, "--tracking-uri", tracking_uri]
    pipeline = write_pipeline(tmp_path, name=f"two_{backend}", stages=SLEEPY,
                              search={"sampler": "random", "trials": 4, "seed": 0, "trial_timeout_s": 120})
    # both at once, on empty stores; the second asks to --resume, as a resubmitted job's driver does
    drivers = [_driver(pipeline, tmp_path, ray_head, *flags), _driver(pipeline, tmp_path, ray_head, "--resume", *flags)]
    outputs = [d.communicate(timeout=900) for d in drivers]
    codes = [d.returncode for d in drivers]
    assert sorted(codes) == [0, 2], outputs
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    refusal = outputs[loser][1].strip().splitlines()[-1]
    assert "is being run by another driver (host " in refusal and f"pid {drivers[winner].pid}, since " in refusal
    assert backend == "sqlite" or server.password not in outputs[loser][1]

    def recorded_once(n: int) -> list[optuna.trial.FrozenTrial]:
        trials = optuna.load_study(study_name=pipeline.stem, storage=optuna_url).get_trials(deepcopy=False)
        assert [t.number for t in trials] == list(range(n)) and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=tracking_uri)
        exp = client.get_experiment_by_name(pipeline.stem)
        runs = client.search_runs([exp.experiment_id], "tags.`paretolab.role` = 'trial'", max_results=1000)
        assert Counter(int(r.data.tags["paretolab.trial_number"]) for r in runs) == Counter(range(n))
        return trials

    recorded_once(4)
    if backend == "sqlite":
        # `--trials N` alone extends the finished study (README), and the new trials do not replay the first ones
        extend = _driver(pipeline, tmp_path, ray_head, "--trials", "6")
        out, err = extend.communicate(timeout=900)
        assert extend.returncode == 0, err
        trials = recorded_once(6)
        assert len({t.params["sleep.seconds"] for t in trials}) == 6

"""Fixture stores in the layout `paretolab run` writes, made directly (seconds, no model, no Ray).

Study ``demo``: two objectives (ppl, size_bytes), methods magnitude | none then rtn | none,
ten complete trials (one of the unmodified model), two failed (one with a traceback artifact),
one still running. Study ``single``: one complete trial. Study ``training``: bhyt | dyt | none
then a train stage on seeds 0-2, with learning curves (see ``add_training_study``). Optuna
trials are added with ``create_trial``; MLflow runs are logged with paretolab's own ``Tracker``,
as the driver does.
"""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from paretolab.stores import Stores, resolve_stores

PIPELINE = {
    "name": "demo",
    "model": "tiny-llama",
    "task": {"name": "perplexity", "corpus": "pydoc", "max_tokens": 4096},
    "stages": [
        {"choice": [{"method": "magnitude", "params": {"sparsity": {"low": 0.1, "high": 0.9}, "scope": "row"}}, {"method": "none"}]},
        {"choice": [{"method": "rtn", "params": {"bits": [2, 4, 8], "group_size": 32}}, {"method": "none"}]},
    ],
    "objectives": [{"metric": "ppl", "direction": "minimize"}, {"metric": "size_bytes", "direction": "minimize"}],
    "search": {"sampler": "nsga2", "trials": 16, "seed": 0, "trial_timeout_s": 600},
    "resources": {"cpus": 1, "gpus": 0},
}
SPARSITY = FloatDistribution(0.1, 0.9)
BITS = CategoricalDistribution([2, 4, 8])
STAGE0 = CategoricalDistribution(["magnitude", "none"])
STAGE1 = CategoricalDistribution(["rtn", "none"])

# (stage0, sparsity, stage1, bits, ppl, size_bytes) per complete trial; trial 0 is the unmodified model.
COMPLETE = [
    ("none", None, "none", None, 20.0, 400_000.0),
    ("magnitude", 0.2, "none", None, 21.0, 390_000.0),
    ("magnitude", 0.5, "none", None, 26.0, 380_000.0),
    ("none", None, "rtn", 8, 20.2, 110_000.0),
    ("none", None, "rtn", 4, 22.0, 60_000.0),
    ("none", None, "rtn", 2, 95.0, 35_000.0),
    ("magnitude", 0.3, "rtn", 8, 23.0, 108_000.0),
    ("magnitude", 0.6, "rtn", 4, 40.0, 59_000.0),
    ("magnitude", 0.8, "rtn", 2, 400.0, 34_000.0),
    ("magnitude", 0.4, "rtn", 4, 25.0, 61_000.0),
]
PROVENANCE = {"weights": "random init", "base_stored_bytes": 400_000.0, "base_fp16_bytes": 200_000.0, "energy_source": "estimate"}
TRACEBACK = 'Traceback (most recent call last):\n  File "trial.py", line 1, in run\nRuntimeError: boom: weights went NaN\n'


def _params(stage0: str, sparsity: float | None, stage1: str, bits: int | None) -> tuple[dict, dict]:
    params: dict = {"stage0.method": stage0, "stage1.method": stage1}
    dists: dict = {"stage0.method": STAGE0, "stage1.method": STAGE1}
    if sparsity is not None:
        params["magnitude.sparsity"], dists["magnitude.sparsity"] = sparsity, SPARSITY
    if bits is not None:
        params["rtn.bits"], dists["rtn.bits"] = bits, BITS
    return params, dists


def _mlflow_params(stage0: str, sparsity: float | None, stage1: str, bits: int | None) -> dict:
    out: dict = {"stage0.method": stage0, "stage1.method": stage1, "trial.attempt": 1}
    if sparsity is not None:
        out.update({"stage0.magnitude.sparsity": sparsity, "stage0.magnitude.scope": "row"})
    if bits is not None:
        out.update({"stage1.rtn.bits": bits, "stage1.rtn.group_size": 32})
    return out


def build_stores(home: Path) -> Stores:
    """Write the fixture studies under ``home`` and return their stores."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    stores = resolve_stores(home=str(home))
    for name, rows, failed, running in (("demo", COMPLETE, 2, 1), ("single", COMPLETE[3:4], 0, 0)):
        add_study(stores, name, rows, failed, running)
    add_training_study(stores)
    return stores


def add_study(stores: Stores, name: str, rows: list[tuple], failed: int = 0, running: int = 0) -> None:
    """A study of the demo's pipeline: ``rows`` as complete trials (MLflow runs as the driver logs them), then failed and running ones."""
    from paretolab.records import TrialResult
    from paretolab.stores.tracking import Tracker

    pipeline = {**PIPELINE, "name": name}
    study = optuna.create_study(study_name=name, storage=stores.optuna_url, directions=["minimize", "minimize"])
    study.set_user_attr("pipeline_hash", "f00d")
    study.set_user_attr("objectives", [["ppl", "minimize"], ["size_bytes", "minimize"]])
    study.set_user_attr("model", "tiny-llama")
    study.set_user_attr("methods", ["magnitude", "none", "rtn"])
    study.set_user_attr("pipeline", pipeline)
    tracker = Tracker(stores, name)
    parent = tracker.study_run({"paretolab.pipeline_hash": "f00d"}, {"pipeline": pipeline})
    tags = {"paretolab.pipeline_hash": "f00d", "paretolab.methods": "magnitude,none,rtn", "paretolab.code_version": "test",
            "paretolab.plugin_versions": "builtin only", "paretolab.study.worker": "test:1"}
    number = 0
    for stage0, sparsity, stage1, bits, ppl, size in rows:
        params, dists = _params(stage0, sparsity, stage1, bits)
        metrics = {"ppl": ppl, "size_bytes": size, "prefill_ms": 10.0 + number, "decode_tok_s": 200.0 - number, "trial_s": 0.5,
                   "ppl_ci_low": 0.95 * ppl, "ppl_ci_high": 1.05 * ppl, "n_windows": 8.0}  # a ±5 % interval
        simulated = [m for m in (stage0, stage1) if m != "none"]
        metrics.update({"energy_j": 3.5, "prefill_speedup": 1.0 + number / 10})
        result = TrialResult(metrics=metrics, stage_s={"transform:stage0": 0.01, "evaluate": 0.2, "measure": 0.3}, simulated_by=simulated,
                             stage_energy_j={"transform:stage0": 0.1, "evaluate": 1.4, "measure": 2.0}, info=PROVENANCE)
        run_id = tracker.log_trial(parent, number, _mlflow_params(stage0, sparsity, stage1, bits), result, tags)
        study.add_trial(create_trial(params=params, distributions=dists, values=[ppl, size], user_attrs={"mlflow_run_id": run_id}))
        number += 1
    for i in range(failed):
        params, dists = _params("magnitude", 0.85, "rtn", 2)
        result = TrialResult(error=f"objective metric 'ppl' is nan (trial {number})", traceback=TRACEBACK if i == 0 else None)
        run_id = tracker.log_trial(parent, number, _mlflow_params("magnitude", 0.85, "rtn", 2), result, tags)
        study.add_trial(create_trial(params=params, distributions=dists, state=TrialState.FAIL,
                                     user_attrs={"mlflow_run_id": run_id, "fail_reason": result.error}))
        number += 1
    for _ in range(running):
        params, dists = _params("none", None, "rtn", 8)
        study.add_trial(create_trial(params=params, distributions=dists, state=TrialState.RUNNING))
        number += 1


# Study ``wide`` (its own store): the demo's trade-off with ppl from 15 (the unmodified model, trial 0) to 2e7, as a
# 2-bit quantised, 80 % pruned model scores. On a linear axis the trials below ppl 100 share one pixel column.
WIDE = [
    ("none", None, "none", None, 15.0, 400_000.0),
    ("magnitude", 0.2, "none", None, 15.5, 390_000.0),
    ("none", None, "rtn", 8, 15.2, 110_000.0),
    ("none", None, "rtn", 4, 17.0, 60_000.0),
    ("magnitude", 0.4, "rtn", 4, 25.0, 58_500.0),
    ("magnitude", 0.6, "rtn", 4, 40.0, 59_000.0),
    ("none", None, "rtn", 2, 3.0e3, 35_000.0),
    ("magnitude", 0.9, "none", None, 5.0e5, 45_000.0),
    ("magnitude", 0.8, "rtn", 2, 2.0e7, 30_000.0),
]
WIDE_FRONTIER = [0, 2, 3, 4, 6, 8]


def build_wide_stores(home: Path) -> Stores:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    stores = resolve_stores(home=str(home))
    add_study(stores, "wide", WIDE)
    return stores


@pytest.fixture(scope="session")
def wide_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("wide_store")
    build_wide_stores(home)
    return home


@pytest.fixture
def wide_env(wide_home, monkeypatch) -> Path:
    """The app reads study ``wide``."""
    return _reading(wide_home, monkeypatch)


TRAINING_PIPELINE = {
    "name": "training", "model": "scratch-1m", "task": {"name": "perplexity", "corpus": "pystdlib-val"},
    "stages": [{"choice": [{"method": "bhyt"}, {"method": "dyt"}, {"method": "none"}]},
               {"method": "train", "params": {"tokens": 4096, "seq_len": 64, "batch": 4, "seed": [0, 1, 2]}}],
    "objectives": [{"metric": "val_loss", "direction": "minimize"}, {"metric": "train_flops", "direction": "minimize"}],
    "search": {"sampler": "grid", "trials": 7, "seed": 0},
}
NORMS = CategoricalDistribution(["bhyt", "dyt", "none"])
SEEDS = CategoricalDistribution([0, 1, 2])
CURVE_POINTS = 4  # eval points: tokens 1024 * i for i = 1..4


def curve_loss(method: str, seed: int, i: int) -> float:
    """The fixture's val_loss at eval point ``i``: none 4 - 0.5 i + 0.1 seed; bhyt 0.2 lower; dyt 0.1 lower."""
    return 4.0 - 0.5 * i + 0.1 * seed - {"none": 0.0, "bhyt": 0.2, "dyt": 0.1}[method]


def curve_flops(method: str, i: int) -> float:
    return (2.2e6 if method == "bhyt" else 2.0e6) * i


def add_training_study(stores: Stores) -> None:
    """Trials 0-5: bhyt and none on seeds 0-2 with a ``learning_curve.json`` artifact (the train stage's format);
    trial 6: dyt on seed 0 with the curve only as ``curve.*`` metric history (step = tokens)."""

    from paretolab.records import TrialResult
    from paretolab.stores.tracking import Tracker

    study = optuna.create_study(study_name="training", storage=stores.optuna_url, directions=["minimize", "minimize"])
    study.set_user_attr("objectives", [["val_loss", "minimize"], ["train_flops", "minimize"]])
    study.set_user_attr("model", "scratch-1m")
    study.set_user_attr("methods", ["bhyt", "dyt", "none", "train"])
    study.set_user_attr("pipeline", TRAINING_PIPELINE)
    tracker = Tracker(stores, "training")
    parent = tracker.study_run({}, {"pipeline": TRAINING_PIPELINE})
    trials = [(m, s) for m in ("bhyt", "none") for s in range(3)] + [("dyt", 0)]
    for number, (method, seed) in enumerate(trials):
        rows = [{"stage": "stage1", "step": 8 * i, "tokens": 1024 * i, "flops": curve_flops(method, i), "train_loss": curve_loss(method, seed, i) + 0.05,
                 "val_loss": curve_loss(method, seed, i), "lr": 3e-3, "s": 0.5 * i} for i in range(1, CURVE_POINTS + 1)]
        final = rows[-1]
        artifacts = {} if method == "dyt" else {"learning_curve.json": json.dumps({"rows": rows, "seed": seed}).encode()}
        history = {f"curve.{k}": [(r["tokens"], r[k]) for r in rows] for k in ("val_loss", "train_loss")}  # the train stage logs both
        result = TrialResult(metrics={"val_loss": final["val_loss"], "train_flops": final["flops"], "train_tokens": final["tokens"]},
                             artifacts=artifacts, history=history)
        run_id = tracker.log_trial(parent, number, {"stage0.method": method, "stage1.method": "train", "stage1.train.seed": seed}, result, {})
        study.add_trial(create_trial(params={"stage0.method": method, "train.seed": seed}, distributions={"stage0.method": NORMS, "train.seed": SEEDS},
                                     values=[final["val_loss"], final["flops"]], user_attrs={"mlflow_run_id": run_id}))


@pytest.fixture(scope="session")
def fixture_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("dashboard_store")
    build_stores(home)
    return home


@pytest.fixture
def store_env(fixture_home, monkeypatch) -> Path:
    """The app reads the fixture stores (the way `paretolab dashboard --home` passes them)."""
    return _reading(fixture_home, monkeypatch)


def _reading(home: Path, monkeypatch) -> Path:
    """Point the app at the stores in ``home``."""
    stores = resolve_stores(home=str(home))
    monkeypatch.setenv("PARETOLAB_OPTUNA_STORAGE", stores.optuna_url)
    monkeypatch.setenv("PARETOLAB_TRACKING_URI", stores.tracking_uri)
    monkeypatch.delenv("PARETOLAB_RAY_ADDRESS", raising=False)
    return home


@pytest.fixture
def empty_env(tmp_path, monkeypatch) -> Path:
    """Stores that were never written: the SQLite files do not exist."""
    monkeypatch.setenv("PARETOLAB_OPTUNA_STORAGE", f"sqlite:///{tmp_path / 'optuna.db'}")
    monkeypatch.setenv("PARETOLAB_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.delenv("PARETOLAB_RAY_ADDRESS", raising=False)
    return tmp_path


# ---- issue 32: a constrained study (an infeasible trial dominates every other) and a pruned training trial -----------

# (stage0, sparsity, stage1, bits, ppl, size_bytes, decode_tok_s); bounds: decode_tok_s >= 150, ppl <= 1.5 x none (= 30).
# Trial 3 beats every trial on both objectives but is too slow: the frontier without the bounds is trial 3 alone;
# the feasible frontier is trials 0, 1, 2. Trial 4 breaks the ppl bound (on rtn's own frontier without the bounds).
CONSTRAINED = [
    ("none", None, "none", None, 20.0, 400_000.0, 200.0),
    ("none", None, "rtn", 8, 20.2, 110_000.0, 190.0),
    ("none", None, "rtn", 4, 22.0, 60_000.0, 180.0),
    ("magnitude", 0.5, "rtn", 2, 19.0, 30_000.0, 100.0),
    ("none", None, "rtn", 2, 95.0, 35_000.0, 170.0),
    ("magnitude", 0.3, "rtn", 8, 23.0, 115_000.0, 160.0),
]
INFEASIBLE_DOMINATING = 3
PRUNED_TRIAL, PRUNED_STEP = 4, 16  # study "pruned": dyt on seed 0, stopped after its second eval point (step 16, 2048 tokens)


def build_constrained_stores(home: Path) -> Stores:
    """Studies ``constrained`` and ``pruned``, recorded as the driver's contract for constraints and pruning says."""
    from paretolab.records import TrialResult
    from paretolab.stores.tracking import Tracker
    from paretolab.study.constraints import Constraint, verdict_attrs

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    stores = resolve_stores(home=str(home))
    bounds = (Constraint("decode_tok_s", 150.0, False), Constraint("ppl", 1.5, True, "none", (("stage0.method", "none"), ("stage1.method", "none"))))
    pipeline = {**PIPELINE, "name": "constrained", "constraints": [{"metric": "decode_tok_s", "min": 150}, {"metric": "ppl", "max_ratio_to": "none", "max": 1.5}]}
    study = optuna.create_study(study_name="constrained", storage=stores.optuna_url, directions=["minimize", "minimize"])
    for key, value in (("objectives", [["ppl", "minimize"], ["size_bytes", "minimize"]]), ("model", "smollm2-135m"),
                       ("methods", ["magnitude", "none", "rtn"]), ("pipeline", pipeline), ("constraints", [c.describe() for c in bounds])):
        study.set_user_attr(key, value)
    tracker = Tracker(stores, "constrained")
    parent = tracker.study_run({}, {"pipeline": pipeline})
    for number, (stage0, sparsity, stage1, bits, ppl, size, decode) in enumerate(CONSTRAINED):
        metrics = {"ppl": ppl, "size_bytes": size, "decode_tok_s": decode, "ppl_ci_low": 0.99 * ppl, "ppl_ci_high": 1.01 * ppl}
        verdict, _ = verdict_attrs(bounds, metrics, {1: CONSTRAINED[0][4]})
        tags = {"paretolab.feasible": str(verdict["feasible"]).lower(), "paretolab.infeasible_because": verdict["infeasible_because"]}
        run_id = tracker.log_trial(parent, number, _mlflow_params(stage0, sparsity, stage1, bits), TrialResult(metrics=metrics), tags)
        params, dists = _params(stage0, sparsity, stage1, bits)
        study.add_trial(create_trial(params=params, distributions=dists, values=[ppl, size], user_attrs={"mlflow_run_id": run_id, **verdict}))

    pruned = optuna.create_study(study_name="pruned", storage=stores.optuna_url, directions=["minimize", "minimize"])
    for key, value in (("objectives", [["val_loss", "minimize"], ["train_flops", "minimize"]]), ("model", "scratch-1m"),
                       ("methods", ["bhyt", "dyt", "none", "train"]), ("pipeline", {**TRAINING_PIPELINE, "name": "pruned"})):
        pruned.set_user_attr(key, value)
    tracker = Tracker(stores, "pruned")
    parent = tracker.study_run({}, {})
    for number, (method, seed) in enumerate([("bhyt", 0), ("bhyt", 1), ("none", 0), ("none", 1), ("dyt", 0)]):
        stop = 2 if number == PRUNED_TRIAL else CURVE_POINTS
        rows = [{"stage": "stage1", "step": 8 * i, "tokens": 1024 * i, "flops": curve_flops(method, i), "train_loss": curve_loss(method, seed, i) + 0.05,
                 "val_loss": curve_loss(method, seed, i), "lr": 3e-3, "s": 0.5 * i} for i in range(1, stop + 1)]
        final = rows[-1]
        history = {f"curve.{k}": [(r["tokens"], r[k]) for r in rows] for k in ("val_loss", "train_loss")}
        result = TrialResult(metrics={"val_loss": final["val_loss"], "train_flops": final["flops"], "train_tokens": final["tokens"]},
                             artifacts={"learning_curve.json": json.dumps({"rows": rows, "seed": seed}).encode()}, history=history)
        tags = {"paretolab.trial_state": "PRUNED", "paretolab.pruned_at_step": str(PRUNED_STEP)} if number == PRUNED_TRIAL else {}
        run_id = tracker.log_trial(parent, number, {"stage0.method": method, "stage1.method": "train", "stage1.train.seed": seed}, result, tags)
        common = {"params": {"stage0.method": method, "train.seed": seed}, "distributions": {"stage0.method": NORMS, "train.seed": SEEDS}}
        if number == PRUNED_TRIAL:  # Optuna: PRUNED with its reports; MLflow: KILLED, with the curve it logged up to there
            tracker.client.set_terminated(run_id, "KILLED")
            pruned.add_trial(create_trial(state=TrialState.PRUNED, intermediate_values={r["step"]: r["val_loss"] for r in rows},
                                          user_attrs={"mlflow_run_id": run_id, "pruned_at_step": PRUNED_STEP}, **common))
        else:
            pruned.add_trial(create_trial(values=[final["val_loss"], final["flops"]], user_attrs={"mlflow_run_id": run_id}, **common))
    return stores


@pytest.fixture
def constrained_env(constrained_home, monkeypatch) -> Path:
    """The app reads studies ``constrained`` and ``pruned`` (``constrained_home``: tests/conftest.py)."""
    return _reading(constrained_home, monkeypatch)

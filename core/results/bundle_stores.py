"""Study bundles to and from the stores: ``export_bundle`` reads a study whole (Optuna's trials, MLflow's runs with
their histories and artifacts), ``import_bundle`` writes a bundle into any stores without running anything. The format
itself is :mod:`paretolab.results.bundle`."""

from __future__ import annotations

import datetime as dt
import os
import tempfile
from pathlib import Path
from typing import Any

from paretolab.errors import ConfigError
from paretolab.results.bundle import (
    RunRecord,
    StudyRecord,
    check_output,
    frozen_trials,
    provenance,
    read_bundle,
    write_bundle,
)
from paretolab.stores.locations import Stores


def export_bundle(names: list[str], stores: Stores, out: Path) -> dict[str, int]:
    """Write the studies ``names`` from ``stores`` to ``out`` (atomically: a temporary file renamed at the end).

    Returns {study: trials written}. The path is checked before any store is read."""
    out = check_output(out)
    records = [_study_from_stores(name, stores) for name in names]
    write_bundle(records, out)
    return {r.name: len(r.trials) for r in records}


def _study_from_stores(name: str, stores: Stores) -> StudyRecord:
    """Everything the stores hold of study ``name``: Optuna's trials and MLflow's runs (read only)."""
    import optuna

    from paretolab.results.source import StoreSource

    study = StoreSource(stores).study(name)
    runs = _mlflow_runs(name, stores)
    trials = []
    for t in study.get_trials(deepcopy=False):
        run = runs["trials"].get(t.number)
        trials.append({
            "number": t.number, "state": t.state.name,
            "values": list(t.values) if t.values is not None else None,
            "params": dict(t.params),
            "distributions": {k: optuna.distributions.distribution_to_json(d) for k, d in t.distributions.items()},
            "user_attrs": dict(t.user_attrs), "system_attrs": dict(t.system_attrs),
            "intermediate_values": {str(k): v for k, v in t.intermediate_values.items()},
            "datetime_start": _date(t.datetime_start), "datetime_complete": _date(t.datetime_complete),
            "run": run,
        })
    record = StudyRecord(name, [d.name for d in study.directions], dict(study.user_attrs), trials, runs["study"], {})
    record.provenance = provenance(record)
    from paretolab.results.source import trained_base_record

    base = trained_base_record(str(record.user_attrs.get("model", "")))
    if base is not None:  # how a base trained here was made: the report says it, from the bundle on any machine
        record.provenance["trained_base"] = list(base)
    return record


def _date(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _mlflow_runs(name: str, stores: Stores) -> dict[str, Any]:
    """{"study": the parent run or None, "trials": {number: run}} from MLflow (the newest run of a trial number wins)."""
    from paretolab.stores.open import exists, guarded
    from paretolab.stores.tracking import ROLE, TRIAL

    out: dict[str, Any] = {"study": None, "trials": {}}
    if not exists(stores.tracking_uri):
        return out
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from mlflow.tracking import MlflowClient

    client = guarded("MLflow", stores.tracking_uri, lambda: MlflowClient(tracking_uri=stores.tracking_uri))
    experiment = guarded("MLflow", stores.tracking_uri, lambda: client.get_experiment_by_name(name))
    if experiment is None:
        return out
    runs = client.search_runs([experiment.experiment_id], "", max_results=50_000, order_by=["attributes.start_time ASC"])
    for run in runs:
        role = run.data.tags.get(ROLE)
        if role == "study":
            out["study"] = _run_record(client, run)
        elif role == "trial" and run.data.tags.get(TRIAL, "").isdecimal():
            out["trials"][int(run.data.tags[TRIAL])] = _run_record(client, run)
    return out


def _run_record(client: Any, run: Any) -> RunRecord:
    history = {key: [[m.step, m.value] for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: (m.step, m.timestamp))]
               for key in sorted(run.data.metrics) if key.startswith("curve.")}
    return RunRecord(run.info.run_id, run.info.status, dict(run.data.tags), dict(run.data.params), dict(run.data.metrics), history,
                     _artifacts(client, run.info.run_id))


def _artifacts(client: Any, run_id: str) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            if not client.list_artifacts(run_id):
                return out
            root = Path(client.download_artifacts(run_id, "", tmp))
        except Exception:  # an artifact store that is gone: the run's other data still counts  # noqa: BLE001
            return out
        for path in sorted(root.rglob("*")):
            if path.is_file():
                out[path.relative_to(root).as_posix()] = path.read_bytes()
    return out



def import_bundle(path: Path, stores: Stores, *, rename: str | None = None) -> dict[str, int]:
    """Load every study of the bundle into ``stores`` without running anything; {study: trials}.

    A study of the same name already in the Optuna store is refused (nothing is written); a failure while writing
    removes what this import wrote. MLflow runs get new ids; each trial's ``mlflow_run_id`` points at its new run.
    """
    import optuna

    from paretolab.stores.open import guarded, optuna_storage

    records = read_bundle(path)
    if rename is not None:
        if len(records) != 1:
            raise ConfigError(f"--as {rename}: the bundle holds {len(records)} studies; --as renames a bundle of one study")
        records[0].name = rename
    storage = optuna_storage(stores, create=True)
    present = {s.study_name for s in guarded("Optuna", stores.optuna_url, lambda: optuna.get_all_study_summaries(storage))}
    clash = [r.name for r in records if r.name in present]
    if clash:
        raise ConfigError(f"study {clash[0]!r} is already in {stores.redacted().optuna_url}; import into other stores, "
                          f"remove it first (`paretolab rm {clash[0]}`) or give it another name with --as")
    done: dict[str, int] = {}
    for record in records:
        _import_study(record, stores, storage)
        done[record.name] = len(record.trials)
    return done


def _import_study(record: StudyRecord, stores: Stores, storage: Any) -> None:
    import optuna

    from paretolab.stores.tracking import STUDY, Tracker

    tracker = Tracker(stores, record.name)
    created: list[str] = []
    try:
        parent = ""
        if record.study_run is not None:
            parent = _log_run(tracker, record.study_run, {STUDY: record.name}, created)
        new_ids = {}
        for trial in record.trials:
            run = trial.get("run")
            if run is not None:
                new_ids[trial["number"]] = _log_run(tracker, run, {STUDY: record.name, **({"mlflow.parentRunId": parent} if parent else {})},
                                                    created)
        study = optuna.create_study(study_name=record.name, storage=storage,
                                    directions=[optuna.study.StudyDirection[d] for d in record.directions])
        try:
            for key, value in record.user_attrs.items():
                study.set_user_attr(key, value)
            for frozen in frozen_trials(record):
                if frozen.number in new_ids:
                    frozen.user_attrs = {**frozen.user_attrs, "mlflow_run_id": new_ids[frozen.number]}
                study.add_trial(frozen)
        except BaseException:
            optuna.delete_study(study_name=record.name, storage=storage)
            raise
    except BaseException:
        for run_id in created:
            tracker.client.delete_run(run_id)
        raise


def _log_run(tracker: Any, run: RunRecord, tags: dict[str, str], created: list[str]) -> str:
    from mlflow.entities import Metric, Param, RunTag

    kept = {k: v for k, v in run.tags.items() if not k.startswith("mlflow.")}
    new = tracker.client.create_run(tracker.experiment_id, run_name=run.tags.get("mlflow.runName"), tags={**kept, **tags})
    run_id = new.info.run_id
    created.append(run_id)
    metrics = [Metric(k, float(v), 0, 0) for k, v in run.metrics.items() if k not in run.history]
    metrics += [Metric(k, float(v), 0, int(step)) for k, points in run.history.items() for step, v in points]
    params = [Param(k, v) for k, v in run.params.items()]
    for i in range(0, len(params), 100):  # log_batch takes at most 100 params and 1000 metrics a call
        tracker.client.log_batch(run_id, params=params[i : i + 100])
    for i in range(0, len(metrics), 1000):
        tracker.client.log_batch(run_id, metrics=metrics[i : i + 1000])
    if run.artifacts:
        with tempfile.TemporaryDirectory() as tmp:
            for name, payload in run.artifacts.items():
                target = Path(tmp) / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(payload)
            tracker.client.log_artifacts(run_id, tmp)
    tracker.client.set_terminated(run_id, run.status)
    return run_id

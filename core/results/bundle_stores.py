"""Study bundles to and from the stores: ``export_bundle`` reads a study whole (Optuna's trials, MLflow's runs with
their histories and artifacts), ``import_bundle`` writes a bundle into any stores without running anything. The format
itself is :mod:`paretolab.results.bundle`."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from paretolab.data.names import check_name, normal_name, printable
from paretolab.errors import ConfigError
from paretolab.results.bundle import (
    IMPORT,
    RunRecord,
    StudyRecord,
    check_output,
    frozen_trials,
    import_state,
    provenance,
    read_bundle,
    write_bundle,
)
from paretolab.stores.locations import Stores
from paretolab.study.session import SESSION


def export_bundle(names: list[str], stores: Stores, out: Path, *, warn: Callable[[str], None] | None = None) -> dict[str, int]:
    """Write the studies ``names`` from ``stores`` to ``out`` (atomically: a temporary file renamed at the end).

    Returns {study: trials written}. The path is checked before any store is read. A study named twice (after Unicode
    normalisation) is written once, and a study with trials still running is written as it stands; each is said in
    one line through ``warn`` (default: stderr)."""
    say = warn or (lambda line: print(f"paretolab: warning: {line}", file=sys.stderr))
    out = check_output(out)
    unique: dict[str, str] = {}
    for name in names:
        if normal_name(name) in unique:
            say(f"study {printable(repr(name))} is named twice: written once")
        else:
            unique[normal_name(name)] = name
    records = [_study_from_stores(name, stores) for name in unique.values()]
    for record in records:
        running = sum(t["state"] == "RUNNING" for t in record.trials)
        if running:
            say(f"study {printable(repr(record.name))} is still running: {running} of its {len(record.trials)} trial(s) are "
                "exported unfinished (state RUNNING); export it again when it has finished")
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
    record = StudyRecord(name, [d.name for d in study.directions], _relative_paths(dict(study.user_attrs)), trials, runs["study"], {})
    record.provenance = provenance(record)
    from paretolab.results.source import trained_base_record

    base = trained_base_record(str(record.user_attrs.get("model", "")))
    if base is not None:  # how a base trained here was made: the report says it, from the bundle on any machine
        record.provenance["trained_base"] = list(base)
    return record


def _relative_paths(user_attrs: dict[str, Any]) -> dict[str, Any]:
    """The study's attributes with the paths this machine recorded (the session's pipeline) made relative to the
    checkout that holds them: a bundle carries no machine's folder layout."""
    session = user_attrs.get(SESSION)
    if isinstance(session, dict) and isinstance(session.get("pipeline"), str):
        user_attrs[SESSION] = {**session, "pipeline": checkout_relative(session["pipeline"])}
    return user_attrs


def checkout_relative(text: str) -> str:
    """An absolute path as a path relative to its checkout (the nearest folder above it holding ``.git`` or
    ``pyproject.toml``), else to the working folder, else its file name; anything else as it is."""
    path = Path(text)
    if not path.is_absolute():
        return text
    for folder in path.parents:
        if folder.parent != folder and ((folder / ".git").exists() or (folder / "pyproject.toml").is_file()):
            return path.relative_to(folder).as_posix()
    try:
        return path.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return path.name


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



def import_bundle(path: Path, stores: Stores | Callable[[], Stores], *, rename: str | None = None, resume: bool = False) -> dict[str, int]:
    """Load every study of the bundle into ``stores`` without running anything; {study: trials}.

    All or nothing: the bundle is read and checked whole (:func:`~paretolab.results.bundle.read_bundle`) before any
    store is touched; each study is created first, marked as a partial import (``paretolab.import``), and marked
    complete once its trials and runs are written. A failure, Ctrl-C or a full disk removes what this import wrote;
    a process killed outright leaves a study marked partial, which the readers refuse and ``resume=True`` (``--resume``)
    removes and imports again. A study of the same name already there is refused (names compared after Unicode
    normalisation). MLflow runs get new ids; each trial's ``mlflow_run_id`` points at its new run. ``stores`` may be a
    function that makes them (the CLI's, which creates the home folder): called only once the bundle has passed.
    """
    import optuna

    from paretolab.results.bundle import bundle_sha256
    from paretolab.stores.open import guarded, optuna_storage
    from paretolab.stores.remove import remove_study

    if rename is not None:
        rename = check_name(rename, "--as")
    records = read_bundle(path)
    if rename is not None:
        if len(records) != 1:
            raise ConfigError(f"--as {rename}: the bundle holds {len(records)} studies; --as renames a bundle of one study")
        records[0].name = rename
    sha = bundle_sha256(path)
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # its "A new study created" line is no news here
    if callable(stores):
        stores = stores()
    storage = optuna_storage(stores, create=True)
    present = {normal_name(s.study_name): s for s in guarded("Optuna", stores.optuna_url, lambda: optuna.get_all_study_summaries(storage))}
    where = stores.redacted().optuna_url
    for record in records:
        there = present.get(record.name)
        if there is None:
            continue
        shown = printable(there.study_name)
        if import_state(there.user_attrs) == "partial":
            if resume:
                remove_study(stores, there.study_name)
                continue
            raise ConfigError(f"study {shown!r} in {where} is a partial import (an earlier import of it was interrupted): rerun "
                              f"with `paretolab bundle import {printable(str(path))} --resume` to import it again, or delete it "
                              f"with `paretolab studies delete {shown} --yes`")
        raise ConfigError(f"study {shown!r} is already in {where}; import into other stores, remove it first "
                          f"(`paretolab studies delete {shown} --yes`) or give it another name with --as")
    done: dict[str, int] = {}
    with _deferred_signals() as check:  # Ctrl-C and SIGTERM stop the import between two writes, never inside one
        try:
            for record in records:
                _import_study(record, stores, storage, sha, Path(path).name, check)
                done[record.name] = len(record.trials)
        except BaseException as exc:
            removed = _remove_all([r.name for r in records[: len(done) + 1]], stores)
            if isinstance(exc, (KeyboardInterrupt, Exception)) and not isinstance(exc, ConfigError):
                why = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"stopped: {_reason(exc)}"
                left = ("nothing of it was left in the stores" if removed else
                        "the study left behind is marked partial: `paretolab bundle import FILE --resume` imports it again")
                raise ConfigError(f"bundle import of {printable(str(path))} {why}; {left}") from None
            raise
    return done


@contextlib.contextmanager
def _deferred_signals() -> Iterator[Callable[[], None]]:
    """A check that raises KeyboardInterrupt once SIGINT or SIGTERM has come (held back meanwhile; main thread only)."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    previous = {sig: signal.signal(sig, lambda signum, frame: got.append(signum)) for sig in (signal.SIGINT, signal.SIGTERM)}

    def check() -> None:
        if got:
            raise KeyboardInterrupt

    try:
        yield check
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror} ({exc.filename})" if exc.filename else exc.strerror
    text = str(getattr(exc, "orig", None) or exc) or type(exc).__name__
    return printable(text.splitlines()[0] if text.strip() else type(exc).__name__)[:300]


def _remove_all(names: list[str], stores: Stores) -> bool:
    """Remove what this import created of ``names``; whether every one went (a full disk may refuse even that)."""
    from paretolab.stores.remove import remove_study

    ok = True
    for name in names:
        try:
            remove_study(stores, name)
        except ConfigError as exc:
            if "no study" not in str(exc):
                ok = False
        except Exception:  # noqa: BLE001 - best effort: what stays is marked partial
            ok = False
    return ok


def _import_study(record: StudyRecord, stores: Stores, storage: Any, sha: str, file: str, check: Callable[[], None]) -> None:
    import optuna

    from paretolab.stores.tracking import STUDY, Tracker

    study = optuna.create_study(study_name=record.name, storage=storage,
                                directions=[optuna.study.StudyDirection[d] for d in record.directions])
    mark = {"bundle": file, "bundle_sha256": sha}
    study.set_user_attr(IMPORT, {"state": "partial", **mark})  # before anything else: a killed import reads as partial
    tracker = Tracker(stores, record.name)
    parent = ""
    if record.study_run is not None:
        parent = _log_run(tracker, record.study_run, {STUDY: record.name})
    new_ids = {}
    for trial in record.trials:
        check()
        run = trial.get("run")
        if run is not None:
            new_ids[trial["number"]] = _log_run(tracker, run, {STUDY: record.name, **({"mlflow.parentRunId": parent} if parent else {})})
    for key, value in record.user_attrs.items():
        if key != IMPORT:
            study.set_user_attr(key, value)
    for frozen in frozen_trials(record):
        check()
        if frozen.number in new_ids:
            frozen.user_attrs = {**frozen.user_attrs, "mlflow_run_id": new_ids[frozen.number]}
        study.add_trial(frozen)
    check()
    study.set_user_attr(IMPORT, {"state": "complete", **mark})


def artifact_target(root: Path, name: str) -> Path:
    """Where artifact ``name`` is written under ``root``: a confined relative path (else a ConfigError), inside ``root``
    once resolved (no symlink on the way out)."""
    from paretolab.results.bundle_read import _Bad, check_artifact_name

    try:
        check_artifact_name(name)
    except _Bad as exc:
        raise ConfigError(f"{exc.args[0]}: {exc.args[1]}; refused") from None
    root = root.resolve()
    target = root.joinpath(*name.split("/"))
    if not target.parent.resolve().is_relative_to(root) or target.is_symlink():
        raise ConfigError(f"artifact name {printable(repr(name))} leads outside the run's folder; refused")
    return target


def _log_run(tracker: Any, run: RunRecord, tags: dict[str, str]) -> str:
    from mlflow.entities import Metric, Param, RunTag

    kept = {k: v for k, v in run.tags.items() if not k.startswith("mlflow.")}
    new = tracker.client.create_run(tracker.experiment_id, run_name=run.tags.get("mlflow.runName"), tags={**kept, **tags})
    run_id = new.info.run_id
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
                target = artifact_target(Path(tmp), name)
                target.parent.mkdir(parents=True, exist_ok=True)
                artifact_target(Path(tmp), name)  # the folders just made: still inside
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
                with os.fdopen(fd, "wb") as f:
                    f.write(payload)
            tracker.client.log_artifacts(run_id, tmp)
    tracker.client.set_terminated(run_id, run.status)
    return run_id

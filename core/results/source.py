"""Where the readers find a study: the stores (Optuna + MLflow) or study bundles, behind one interface.

Every reader of results (``frontier``, ``report``, ``load_study``, the verdicts) asks a :class:`Source` for a study as
Optuna holds it, its trials' MLflow runs, a run's per-example scores and its learning curve. ``source_of`` turns the
``Stores`` the CLI resolves into a :class:`StoreSource`; :class:`BundleSource` answers the same from bundle files, so a
document rendered from a bundle is the document rendered from the stores it was exported from.
"""

from __future__ import annotations

import difflib
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Union

from paretolab.data.names import printable
from paretolab.errors import ConfigError
from paretolab.stores.locations import Stores

Fetch = Callable[[str], "dict[str, Any] | None"]


def trained_base_record(model: str) -> tuple[str, Any] | None:
    """(model, its ``paretolab.json``) for a base trained on this machine (``train.save_as``), else None."""
    from paretolab.training.checkpoints import RECORD, trained_dir

    try:
        record = json.loads((trained_dir() / model / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return (model, record) if isinstance(record, dict) else None


class _Readers:
    """What every source derives from its ``artifact`` and ``history``: per-example scores and learning curves."""

    _fetch: Fetch | None = None

    def artifact(self, run_id: str, name: str) -> bytes | None:
        raise NotImplementedError

    def history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        raise NotImplementedError

    def per_example(self) -> Fetch:
        """run id -> its per-example scores; one cache for every reader of this source."""
        if self._fetch is None:
            self._fetch = _per_example(self)
        return self._fetch

    def curves(self) -> Callable[[str], Any]:
        return _curves(self)

    def study(self, name: str) -> Any:
        raise NotImplementedError

    def stored_study(self, name: str) -> Any:
        """The study's attributes, directions and complete trials (``stores.optuna_sqlite.StoredStudy``'s shape)."""
        import optuna

        from paretolab.stores.optuna_sqlite import StoredStudy

        study = self.study(name)
        trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        return StoredStudy(name, dict(study.user_attrs), [d.name.lower() for d in study.directions], trials)


class StoreSource(_Readers):
    """The stores a study ran with (read only: a missing store is an error, never created)."""

    def trained_base(self, model: str) -> tuple[str, Any] | None:
        return trained_base_record(model)

    def __init__(self, stores: Stores) -> None:
        self.stores = stores
        self._client: Any = None
        self._stored: dict[str, Any] = {}

    def stored_study(self, name: str) -> Any:
        """From a SQLite store, read with the standard library (no Optuna import: `frontier`'s fast path); else Optuna."""
        if name not in self._stored:
            from paretolab.stores.open import check_readable
            from paretolab.stores.optuna_sqlite import read_study

            check_readable(self.stores)  # a damaged, empty or partial store is refused in one line, on this path as on Optuna's
            stored = read_study(self.stores.optuna_url, name)
            if stored is not None:
                _refuse_partial(name, stored.user_attrs)
            self._stored[name] = stored or super().stored_study(name)
        return self._stored[name]

    def study(self, name: str) -> Any:
        import optuna

        from paretolab.stores.open import exists, guarded, optuna_storage, sqlite_file

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        if not exists(self.stores.optuna_url):
            raise ConfigError(f"no study {name!r}: nothing has run with these stores yet (no {sqlite_file(self.stores.optuna_url)}); "
                              "check --home / --storage, or run its pipeline first")
        storage = optuna_storage(self.stores, create=False)
        try:
            study = guarded("Optuna", self.stores.optuna_url, lambda: optuna.load_study(study_name=name, storage=storage))
        except KeyError:
            names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
            from paretolab.data.names import twin_of

            twin = twin_of(name, names)  # `ｄｅｍｏ` asked, `demo` stored: one name under Unicode normalisation, one study
            if twin is None:
                raise ConfigError(_no_study(name, self.stores.redacted().optuna_url, names)) from None
            study = guarded("Optuna", self.stores.optuna_url, lambda: optuna.load_study(study_name=twin, storage=storage))
        _refuse_partial(name, study.user_attrs)
        return study

    def client(self) -> Any:
        if self._client is None:
            os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a bar per trial would drown the report
            from mlflow.tracking import MlflowClient

            from paretolab.stores.open import guarded

            self._client = guarded("MLflow", self.stores.tracking_uri, lambda: MlflowClient(tracking_uri=self.stores.tracking_uri))
        return self._client

    def trial_runs(self, name: str) -> dict[int, Any]:
        """Trial number -> its MLflow run (role ``trial``); {} without an MLflow store or experiment."""
        from paretolab.stores.open import exists, guarded

        if not exists(self.stores.tracking_uri):
            return {}
        client = self.client()
        experiment = guarded("MLflow", self.stores.tracking_uri, lambda: client.get_experiment_by_name(name))
        if experiment is None:
            return {}
        runs = client.search_runs([experiment.experiment_id], "tags.`paretolab.role` = 'trial'", max_results=50_000)
        return {int(run.data.tags["paretolab.trial_number"]): run for run in runs}

    def run_metrics(self, run_id: str) -> dict[str, float]:
        from paretolab.stores import mlflow_sqlite

        read = mlflow_sqlite.run_metrics(self.stores.tracking_uri, run_id) if run_id else None  # SQLite: no MLflow import
        if read is not None:
            return read
        try:
            return dict(self.client().get_run(run_id).data.metrics) if run_id else {}
        except Exception:  # noqa: BLE001 - a run that is gone: no logged intervals
            return {}

    def artifact(self, run_id: str, name: str) -> bytes | None:
        if not run_id:
            return None
        from paretolab.stores import mlflow_sqlite

        folder = mlflow_sqlite.artifact_dir(self.stores.tracking_uri, run_id)  # a local artifact root: read from disk
        if folder is not None:
            target = folder / name
            return target.read_bytes() if target.is_file() else None
        try:
            with tempfile.TemporaryDirectory() as tmp:
                return Path(self.client().download_artifacts(run_id, name, tmp)).read_bytes()
        except Exception:  # noqa: BLE001 - no such artifact (an older run, or a task without it)
            return None

    def history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        return [(m.step, m.value) for m in self.client().get_metric_history(run_id, key)]


class BundleSource(_Readers):
    """Studies read from bundle files (see :mod:`paretolab.results.bundle`), nothing else opened."""

    def __init__(self, paths: Iterable[str | Path]) -> None:
        from paretolab.results.bundle import bundle_files, read_bundle

        self.paths = bundle_files(paths)
        self.records: dict[str, Any] = {}
        for path in self.paths:
            for record in read_bundle(path):
                if record.name in self.records:  # names are normal (NFKC) once read
                    raise ConfigError(f"study {record.name!r} is in two bundles ({printable(str(path))} and another); "
                                      "give each study one bundle")
                self.records[record.name] = record
        self.runs = {run.run_id: run for record in self.records.values() for run in record.runs().values()}
        self._studies: dict[str, Any] = {}

    def names(self) -> list[str]:
        return list(self.records)

    def trained_base(self, model: str) -> tuple[str, Any] | None:
        """The trained base's record as the exporting machine had it (kept in the bundle), never this machine's."""
        for record in self.records.values():
            found = record.provenance.get("trained_base")
            if isinstance(found, list) and len(found) == 2 and found[0] == model:
                return found[0], found[1]
        return None

    def record(self, name: str) -> Any:
        from paretolab.data.names import normal_name

        name = normal_name(name) if normal_name(name) in self.records else name
        if name not in self.records:
            raise ConfigError(_no_study(name, ", ".join(str(p) for p in self.paths) or "no bundle", list(self.records)))
        return self.records[name]

    def study(self, name: str) -> Any:
        from paretolab.results.bundle import in_memory_study

        if name not in self._studies:
            self._studies[name] = in_memory_study(self.record(name))
        return self._studies[name]

    def trial_runs(self, name: str) -> dict[int, Any]:
        return self.record(name).runs()

    def run_metrics(self, run_id: str) -> dict[str, float]:
        run = self.runs.get(run_id)
        return dict(run.metrics) if run is not None else {}

    def artifact(self, run_id: str, name: str) -> bytes | None:
        run = self.runs.get(run_id)
        return run.artifacts.get(name) if run is not None else None

    def history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        run = self.runs.get(run_id)
        return [(int(step), float(value)) for step, value in (run.history.get(key, []) if run is not None else [])]


Source = Union[StoreSource, BundleSource]


def source_of(where: Stores | Source) -> Source:
    """The source a reader reads: stores as given, or a bundle source passed through."""
    return StoreSource(where) if isinstance(where, Stores) else where


def _per_example(source: Source) -> Fetch:
    """run id -> its ``per_example.json`` payload (None when the run has none), read once per run."""
    from paretolab.stats import ARTIFACT

    cache: dict[str, dict[str, Any] | None] = {}

    def fetch(run_id: str) -> dict[str, Any] | None:
        if run_id not in cache:
            payload = source.artifact(run_id, ARTIFACT)
            try:
                cache[run_id] = json.loads(payload) if payload else None
            except ValueError:
                cache[run_id] = None
        return cache[run_id]

    return fetch


def _curves(source: Source) -> Callable[[str], Any]:
    """run id -> its learning curve (:mod:`paretolab.training.curves`), each run read once."""
    from paretolab.training.curves import ARTIFACT, HISTORIES, read_curve

    cache: dict[str, Any] = {}

    def artifact(run_id: str) -> bytes:
        payload = source.artifact(run_id, ARTIFACT)
        if payload is None:
            raise FileNotFoundError(ARTIFACT)
        return payload

    def read(run_id: str) -> Any:
        if run_id not in cache:
            cache[run_id] = read_curve(lambda: artifact(run_id), lambda: {k: source.history(run_id, k) for k in HISTORIES}) if run_id else None
        return cache[run_id]

    return read


def _refuse_partial(name: str, user_attrs: dict[str, Any]) -> None:
    """A study whose `bundle import` has not finished is no study to read: one line saying how to complete it."""
    from paretolab.results.bundle import import_state, partial_import_line

    if import_state(user_attrs) == "partial":
        raise ConfigError(partial_import_line(name))


def _no_study(name: str, where: str, names: list[str]) -> str:
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"no study {name!r} in {where}{hint} (studies: {printable(', '.join(names)) or 'none'})"

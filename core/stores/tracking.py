"""MLflow logging: one parent run per study, one run per trial. Only the driver calls this."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from paretolab.records import TrialResult
from paretolab.stores import Stores

ROLE = "paretolab.role"
STUDY = "paretolab.study"
TRIAL = "paretolab.trial_number"
TRIAL_STATE = "paretolab.trial_state"  # PRUNED on a pruned trial's run (its MLflow status is KILLED)


class Tracker:
    """Thin wrapper over MlflowClient so the rest of paretolab never touches MLflow's churn."""

    def __init__(self, stores: Stores, study: str) -> None:
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # a link per trial drowns the job log
        from mlflow.tracking import MlflowClient

        for name in ("alembic", "mlflow"):
            logging.getLogger(name).setLevel(logging.WARNING)
        # MLflow logs a database error with its whole traceback (45 lines on a full disk) before raising it; the
        # error it raises reaches the driver, which says it in one line (stores.open.store_problem): not twice.
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)

        from paretolab.stores.mlflow_schema import seed_sqlite_store
        from paretolab.stores.open import guarded, sqlite_file
        from paretolab.stores.ownership import creating_stores

        self.study = study
        self.uri = stores.tracking_uri
        with guarded("MLflow", stores.tracking_uri, lambda: creating_stores(stores.tracking_uri)):  # MLflow migrates an empty database on first use: one process at a time
            path = sqlite_file(stores.tracking_uri)
            if path is not None:
                seed_sqlite_store(path)  # a new SQLite store: the cached empty schema, not MLflow's migrations again
            self.client = guarded("MLflow", stores.tracking_uri, lambda: MlflowClient(tracking_uri=stores.tracking_uri))
            experiment = guarded("MLflow", stores.tracking_uri, lambda: self.client.get_experiment_by_name(study))
            if experiment is None:
                self.experiment_id = self.client.create_experiment(study, artifact_location=_artifact_location(stores, study))
            else:
                self.experiment_id = experiment.experiment_id

    def study_run(self, tags: dict[str, str], params: dict[str, Any]) -> str:
        """The study's parent run, created once and reused on resume."""
        runs = self.client.search_runs([self.experiment_id], f"tags.`{ROLE}` = 'study'", max_results=1)
        if runs:
            return runs[0].info.run_id
        run = self.client.create_run(self.experiment_id, run_name=self.study, tags={ROLE: "study", STUDY: self.study, **tags})
        self._log(run.info.run_id, {}, params, {})
        return run.info.run_id

    def finished_trial(self, number: int) -> tuple[str, dict[str, float]] | None:
        """(run id, metrics) of trial ``number`` if it was fully logged already (driver died before Optuna heard)."""
        for run in self._trial_runs(number):
            if run.info.status == "FINISHED":
                return run.info.run_id, dict(run.data.metrics)
            if run.info.status != "FAILED" and run.data.tags.get(TRIAL_STATE) != "PRUNED":
                self.client.delete_run(run.info.run_id)  # half-written: drop it, the trial runs again
        return None

    def pruned_trial(self, number: int) -> tuple[str, int] | None:
        """(run id, the step it was pruned at) of trial ``number``, if its run was logged as pruned."""
        for run in self._trial_runs(number):
            if run.info.status == "KILLED" and run.data.tags.get(TRIAL_STATE) == "PRUNED":
                return run.info.run_id, int(run.data.tags.get("paretolab.pruned_at_step", 0))
        return None

    def failed_trial(self, number: int) -> str | None:
        for run in self._trial_runs(number):
            if run.info.status == "FAILED":
                return run.data.tags.get("paretolab.failure", "failed")
        return None

    def _trial_runs(self, number: int) -> list[Any]:
        query = f"tags.`{ROLE}` = 'trial' and tags.`{TRIAL}` = '{number}'"
        return list(self.client.search_runs([self.experiment_id], query, max_results=10))

    def log_trial(self, parent: str, number: int, params: dict[str, Any], result: TrialResult, tags: dict[str, str]) -> str:
        """One complete run for one trial: params, metrics, stage timings, tags, artifacts, status."""
        run_tags = {
            ROLE: "trial",
            STUDY: self.study,
            TRIAL: str(number),
            "mlflow.parentRunId": parent,
            "paretolab.simulated_by": ",".join(result.simulated_by),
            "paretolab.energy_source": str(result.info.get("energy_source", "")),
            "paretolab.weights": str(result.info.get("weights", "")),
            **tags,
        }
        if result.failed:
            run_tags["paretolab.failure"] = (result.error or "")[:4000]
        elif result.pruned:
            run_tags.update({TRIAL_STATE: "PRUNED", "paretolab.pruned_at_step": str(result.pruned_at)})
        run = self.client.create_run(self.experiment_id, run_name=f"trial-{number}", tags=run_tags)
        run_id = run.info.run_id
        metrics = {k: v for k, v in result.metrics.items() if v == v}  # NaN can't be logged
        metrics.update({f"stage_s.{k.replace(':', '.')}": v for k, v in result.stage_s.items()})
        metrics.update({f"stage_energy_j.{k.replace(':', '.')}": v for k, v in result.stage_energy_j.items()})
        info = {f"info.{k}": v for k, v in result.info.items()}
        self._log(run_id, metrics, {**params, **info}, {})
        self._log_history(run_id, result.history)
        artifacts = dict(result.artifacts)
        if result.traceback:
            artifacts["traceback.txt"] = result.traceback.encode()
        if artifacts:
            with tempfile.TemporaryDirectory() as tmp:
                for name, payload in artifacts.items():
                    (Path(tmp) / name).write_bytes(payload)
                self.client.log_artifacts(run_id, tmp)
        self.client.set_terminated(run_id, "FAILED" if result.failed else "KILLED" if result.pruned else "FINISHED")
        return run_id

    def _log_history(self, run_id: str, history: dict[str, list[tuple[int, float]]]) -> None:
        """Metric histories (e.g. ``curve.val_loss`` by cumulative training tokens), in batches MLflow accepts."""
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        points = [Metric(k, float(v), now, int(step)) for k, series in history.items() for step, v in series if v == v]
        for i in range(0, len(points), 1000):  # log_batch takes at most 1000 metrics per call
            self.client.log_batch(run_id, metrics=points[i : i + 1000])

    def copy_trial(self, run_id: str, parent: str, number: int, tags: dict[str, str]) -> tuple[str, dict[str, float]]:
        """Copy another study's trial run (params, metrics and curves, tags, artifacts, status) as trial ``number`` here.

        Returns (the new run's id, its metrics); ("", {}) when the source run is gone.
        """
        try:
            source = self.client.get_run(run_id) if run_id else None
        except Exception:
            source = None
        if source is None:
            return "", {}
        kept = {k: v for k, v in source.data.tags.items() if not k.startswith("mlflow.") and k not in (STUDY, TRIAL)}
        run = self.client.create_run(self.experiment_id, run_name=f"trial-{number}", tags={
            **kept, STUDY: self.study, TRIAL: str(number), "mlflow.parentRunId": parent, **tags})
        new = run.info.run_id
        metrics = dict(source.data.metrics)
        self._log(new, {k: v for k, v in metrics.items() if not k.startswith("curve.")}, dict(source.data.params), {})
        curves = {k: [(m.step, m.value) for m in self.client.get_metric_history(run_id, k)] for k in metrics if k.startswith("curve.")}
        self._log_history(new, curves)
        with tempfile.TemporaryDirectory() as tmp:
            if self.client.list_artifacts(run_id):
                self.client.log_artifacts(new, self.client.download_artifacts(run_id, "", tmp))
        self.client.set_terminated(new, source.info.status)
        return new, metrics

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        if run_id and tags:
            self._log(run_id, {}, {}, tags)

    def finish_study(self, parent: str, summary: dict[str, float]) -> None:
        self._log(parent, summary, {}, {})
        self.client.set_terminated(parent, "FINISHED")

    def _log(self, run_id: str, metrics: dict[str, float], params: dict[str, Any], tags: dict[str, str]) -> None:
        import time

        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000)
        self.client.log_batch(
            run_id,
            metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()],
            params=[Param(k, _param_text(v)) for k, v in params.items()],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )


def _param_text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text[:6000]


def _artifact_location(stores: Stores, study: str) -> str | None:
    if stores.artifact_root is None:
        return None
    return f"{stores.artifact_root.rstrip('/')}/{study}"

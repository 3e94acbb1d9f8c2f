"""Removing a study from both stores: its Optuna study and its MLflow experiment, refused while a driver owns it.

The MLflow experiment is renamed (``NAME.removed-<UTC time>``) and then deleted, with its runs: MLflow keeps a
deleted experiment's name taken, so without the rename a new run under the same name could not start fresh.
`mlflow gc` frees the disk space of deleted runs for good.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from paretolab.errors import ConfigError
from paretolab.stores.locations import Stores
from paretolab.stores.open import exists, guarded, optuna_storage
from paretolab.stores.ownership import own_study


@dataclass(frozen=True)
class Removed:
    """What ``remove_study`` removed."""

    study: str
    optuna_trials: int | None  # None: no such study in Optuna
    mlflow_runs: int | None  # None: no such experiment in MLflow
    mlflow_renamed: str = ""  # the deleted experiment's new name


def remove_study(stores: Stores, name: str) -> Removed:
    """Delete study ``name`` from Optuna and its experiment (runs included) from MLflow.

    Refused (StudyOwnedError naming the driver) while a driver runs it, and with a ConfigError when neither
    store has it. The study's lock is held throughout, so no driver can start it meanwhile.
    """
    with guarded("Optuna", stores.optuna_url, lambda: own_study(stores.optuna_url, name)):
        trials = _remove_optuna(stores, name)
        runs, renamed = _remove_mlflow(stores, name)
    if trials is None and runs is None:
        raise ConfigError(f"no study {name!r} in the stores (Optuna {stores.redacted().optuna_url}); `paretolab studies` lists them")
    return Removed(name, trials, runs, renamed)


def _remove_optuna(stores: Stores, name: str) -> int | None:
    import optuna

    if not exists(stores.optuna_url):
        return None
    storage = optuna_storage(stores, create=False)
    try:
        study = guarded("Optuna", stores.optuna_url, lambda: optuna.load_study(study_name=name, storage=storage))
    except KeyError:
        return None
    count = len(study.get_trials(deepcopy=False))
    guarded("Optuna", stores.optuna_url, lambda: optuna.delete_study(study_name=name, storage=storage))
    return count


def _remove_mlflow(stores: Stores, name: str) -> tuple[int | None, str]:
    if not exists(stores.tracking_uri):
        return None, ""
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    uri = stores.tracking_uri
    client = guarded("MLflow", uri, lambda: MlflowClient(tracking_uri=uri))
    experiment = guarded("MLflow", uri, lambda: client.get_experiment_by_name(name))
    if experiment is None:
        return None, ""
    eid = experiment.experiment_id
    runs = 0
    token = None
    while True:
        page = client.search_runs([eid], run_view_type=ViewType.ALL, max_results=1000, page_token=token)
        for run in page:
            if run.info.lifecycle_stage != "deleted":
                client.delete_run(run.info.run_id)
            runs += 1
        token = page.token
        if not token:
            break
    renamed = f"{name}.removed-{dt.datetime.now(dt.timezone.utc).strftime('%Y%m%dT%H%M%S')}"
    if experiment.lifecycle_stage == "deleted":  # deleted by hand (the MLflow UI): its name is still taken
        client.restore_experiment(eid)
    client.rename_experiment(eid, renamed)
    client.delete_experiment(eid)
    return runs, renamed

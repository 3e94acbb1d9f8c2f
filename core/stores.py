"""Where studies live: the Optuna storage URL and the MLflow tracking URI, from flags or environment."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

STORE_DIR_ENV = "PARETOLAB_HOME"
OPTUNA_ENV = "PARETOLAB_OPTUNA_STORAGE"
TRACKING_ENV = "PARETOLAB_TRACKING_URI"


@dataclass(frozen=True)
class Stores:
    """The two stores of a study: search state in Optuna, results in MLflow."""

    optuna_url: str
    tracking_uri: str
    artifact_root: str | None

    def redacted(self) -> Stores:
        """The same URLs with any password replaced, for printing and logging."""
        return Stores(redact(self.optuna_url), redact(self.tracking_uri), self.artifact_root)


def resolve_stores(*, home: str | None = None, optuna_url: str | None = None, tracking_uri: str | None = None) -> Stores:
    """Flags win over environment, which wins over the default SQLite files under ``.paretolab/``."""
    root = Path(home or os.environ.get(STORE_DIR_ENV) or ".paretolab").expanduser().resolve()
    optuna_url = optuna_url or os.environ.get(OPTUNA_ENV)
    tracking_uri = tracking_uri or os.environ.get(TRACKING_ENV) or os.environ.get("MLFLOW_TRACKING_URI")
    artifact_root = None
    if not optuna_url or not tracking_uri:
        root.mkdir(parents=True, exist_ok=True)
    if not optuna_url:
        optuna_url = f"sqlite:///{root / 'optuna.db'}"
    if not tracking_uri:
        tracking_uri = f"sqlite:///{root / 'mlflow.db'}"
        artifact_root = (root / "artifacts").as_uri()
    return Stores(optuna_url=optuna_url, tracking_uri=tracking_uri, artifact_root=artifact_root)


def redact(url: str) -> str:
    """``postgresql://user:secret@host/db`` -> ``postgresql://user:***@host/db``."""
    return re.sub(r"(//[^:/@]+:)[^@]+@", r"\1***@", url)

"""A bundle's records as the readers and the importer hold them, and the mark an import leaves on a study.

The format itself is described in :mod:`paretolab.results.bundle`; :mod:`paretolab.results.bundle_read` reads it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paretolab.data.names import printable

FORMAT = "paretolab-bundle"
VERSION = 1
SUFFIX = ".jsonl.gz"


# ---------------------------------------------------------------------------------------------------- records


@dataclass
class RunRecord:
    """One MLflow run as the readers see it (``.info.run_id``, ``.info.status``, ``.data.metrics`` / ``params`` / ``tags``)."""

    run_id: str
    status: str
    tags: dict[str, str]
    params: dict[str, str]
    metrics: dict[str, float]
    history: dict[str, list[list[float]]] = field(default_factory=dict)  # key -> [[step, value], ...]
    artifacts: dict[str, bytes] = field(default_factory=dict)

    @property
    def info(self) -> RunRecord:
        return self

    @property
    def data(self) -> RunRecord:
        return self


@dataclass
class StudyRecord:
    name: str
    directions: list[str]
    user_attrs: dict[str, Any]
    trials: list[dict[str, Any]]  # the trial records (run inside, under "run")
    study_run: RunRecord | None
    provenance: dict[str, Any]

    def runs(self) -> dict[int, RunRecord]:
        """Trial number -> its MLflow run, for the trials that have one."""
        return {t["number"]: t["run"] for t in self.trials if t.get("run") is not None}


IMPORT = "paretolab.import"  # a study's user attr while (and once) it is imported: {"state": "partial" | "complete", ...}


def import_state(user_attrs: dict[str, Any]) -> str | None:
    """"partial" for a study whose import has not finished (interrupted, or under way), "complete", or None."""
    mark = user_attrs.get(IMPORT)
    return mark.get("state") if isinstance(mark, dict) else None


def partial_import_line(name: str) -> str:
    """What a reader of a partially imported study is told."""
    return (f"study {printable(repr(name))} is a partial import (its `paretolab bundle import` was interrupted): rerun the "
            f"import with `paretolab bundle import FILE --resume`, or delete it with `paretolab studies delete {printable(name)} --yes`")


def bundle_sha256(path: Path) -> str:
    """The sha256 of the bundle file's bytes (what an import records as its source)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()

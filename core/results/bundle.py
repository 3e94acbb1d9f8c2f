"""Study bundles: a study's complete record in one file, read without the stores that made it.

A bundle is gzip-compressed JSON Lines (``.jsonl.gz``), written deterministically (same study, same bytes):

- line 1, the header: ``{"format": "paretolab-bundle", "version": 1, "studies": [names], "written_by": paretolab version}``;
- per study, a ``study`` record: its name, directions, Optuna user attributes (the pipeline, its hash, the objectives,
  the constraints), the MLflow parent run, and its provenance (when the trials ran, the code versions that ran them,
  the machines, the model checksums);
- per trial, a ``trial`` record: number, state, params with their distributions, values, intermediate values, user
  and system attributes (feasibility, failure and pruning reasons), dates, and its MLflow run: tags, params, metrics,
  metric histories (curves) and every artifact (per-example scores, learning curves, reports), bytes in base64;
- last, an ``end`` record with the record count and the sha256 of every line before it.

A bundle of another format version is refused with one line, never misread; a truncated or corrupted file (gzip's CRC,
the end record's count and checksum) is refused with one line. :class:`~paretolab.results.source.BundleSource` reads a
bundle as the report, ``frontier`` and ``load_study`` read stores; :mod:`paretolab.results.bundle_stores` exports a study
from the stores and imports a bundle into any store (SQLite files or servers) without running anything.
"""

from __future__ import annotations

import base64
import datetime as dt
import gzip
import hashlib
import json
import os
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paretolab.errors import ConfigError

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


# ---------------------------------------------------------------------------------------------------- writing


def check_output(out: Path) -> Path:
    """``out`` ends in .jsonl.gz and can be written (paretolab.data.outputs' check, as every output path); made absolute."""
    from paretolab.data.outputs import check_file_output

    if Path(out).expanduser().is_dir():
        raise ConfigError(f"--out {out}: is a folder; name a file in it ending in {SUFFIX}")
    if not Path(out).name.endswith(SUFFIX):
        raise ConfigError(f"--out {out}: a bundle's name ends in {SUFFIX} (e.g. {Path(out).name.split('.')[0] or 'study'}{SUFFIX})")
    return check_file_output(out, "--out")


def write_bundle(records: list[StudyRecord], out: Path) -> None:
    """The records as a bundle file at ``out``: written to a temporary file beside it, then renamed (no partial file)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = [_dumps({"format": FORMAT, "version": VERSION, "studies": [r.name for r in records], "written_by": _written_by()})]
    for record in records:
        lines.append(_dumps({"kind": "study", "name": record.name, "directions": record.directions, "user_attrs": record.user_attrs,
                             "study_run": _run_json(record.study_run), "provenance": record.provenance}))
        for trial in record.trials:
            lines.append(_dumps({"kind": "trial", "study": record.name, **{k: v for k, v in trial.items() if k != "run"},
                                 "run": _run_json(trial.get("run"))}))
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    lines.append(_dumps({"kind": "end", "records": len(lines), "sha256": digest}))
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".part", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0, filename="") as gz:
            gz.write(("\n".join(lines) + "\n").encode())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as a plain file would be (mkstemp makes it private)
        os.replace(tmp, out)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise ConfigError(f"cannot write bundle {out}: {exc.strerror or exc}; nothing was written") from None
        raise


def _written_by() -> str:
    from paretolab.version import __version__

    return f"paretolab {__version__}"


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=True)  # in the stores' own order: the report reads it


def _run_json(run: RunRecord | None) -> dict[str, Any] | None:
    if run is None:
        return None
    return {"run_id": run.run_id, "status": run.status, "tags": run.tags, "params": run.params, "metrics": run.metrics,
            "history": run.history, "artifacts": {k: base64.b64encode(v).decode() for k, v in sorted(run.artifacts.items())}}


def provenance(record: StudyRecord) -> dict[str, Any]:
    """When the trials ran, the code that ran them, the machines and the model checksums, as the trials recorded them."""
    dates = [d for t in record.trials for d in (t.get("datetime_start"), t.get("datetime_complete")) if d]
    return run_provenance(dates, [t["run"] for t in record.trials if t.get("run") is not None], record.user_attrs.get("model"))


def run_provenance(dates: list[str], runs: list[Any], model: Any) -> dict[str, Any]:
    """The provenance of trials from their dates (ISO) and MLflow runs (``.data.tags`` / ``.data.params``): stores or bundles."""
    params = [r.data.params for r in runs]
    machines = sorted({" · ".join(f"{k} {p[f'info.{k}']}" for k in ("cpu", "cores", "gpu") if f"info.{k}" in p) for p in params} - {""})
    loads = sorted(float(p["info.load_1m"]) for p in params if p.get("info.load_1m"))
    dates = sorted(dates)
    return {
        "trials_from": dates[0] if dates else None,
        "trials_to": dates[-1] if dates else None,
        "code_versions": sorted({r.data.tags["paretolab.code_version"] for r in runs if r.data.tags.get("paretolab.code_version")}),
        "machines": machines,
        "load_1m": {"median": loads[len(loads) // 2], "max": loads[-1], "trials": len(loads)} if loads else None,
        "model": model,
        "model_checksums": sorted({p[k] for p in params for k in p if k.startswith("info.") and k.endswith("sha256")}),
        "weights": sorted({p["info.weights"] for p in params if p.get("info.weights")}),
    }


# ---------------------------------------------------------------------------------------------------- reading


def read_bundle(path: Path) -> list[StudyRecord]:
    """The studies in a bundle file; a missing, truncated, corrupted or foreign file is one ConfigError line."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"bundle {path}: no such file" + (" (it is a folder)" if path.is_dir() else ""))
    try:
        with gzip.open(path, "rb") as gz:
            text = gz.read().decode()
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as exc:  # BadGzipFile is an OSError
        raise ConfigError(f"bundle {path} is corrupt or truncated ({_why(exc)}); export it again") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    records = [_loads(path, i, line) for i, line in enumerate(lines, 1)]
    header = records[0] if records else {}
    if header.get("format") != FORMAT:
        raise ConfigError(f"{path} is not a paretolab bundle (no '{FORMAT}' header)")
    if header.get("version") != VERSION:
        raise ConfigError(f"bundle {path} has format version {header.get('version')!r}; this paretolab reads version {VERSION} "
                          "(use the paretolab that wrote it, or export the study again)")
    end = records[-1]
    if end.get("kind") != "end" or end.get("records") != len(records) - 1:
        raise ConfigError(f"bundle {path} is truncated (its end record is missing or counts other records); export it again")
    if hashlib.sha256("\n".join(lines[:-1]).encode()).hexdigest() != end.get("sha256"):
        raise ConfigError(f"bundle {path} is corrupt (its checksum does not match its records); export it again")
    studies: dict[str, StudyRecord] = {}
    for rec in records[1:-1]:
        if rec.get("kind") == "study":
            studies[rec["name"]] = StudyRecord(rec["name"], rec["directions"], rec["user_attrs"], [], _run(rec.get("study_run")),
                                               rec.get("provenance") or {})
        elif rec.get("kind") == "trial":
            trial = {k: v for k, v in rec.items() if k not in ("kind", "study")}
            trial["run"] = _run(rec.get("run"))
            studies[rec["study"]].trials.append(trial)
    return list(studies.values())


def _loads(path: Path, number: int, line: str) -> dict[str, Any]:
    try:
        rec = json.loads(line)
    except ValueError as exc:
        raise ConfigError(f"bundle {path} is corrupt: line {number} is not JSON ({exc.msg}); export it again") from None
    if not isinstance(rec, dict):
        raise ConfigError(f"bundle {path} is corrupt: line {number} is not a record; export it again")
    return rec


def _why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _run(data: dict[str, Any] | None) -> RunRecord | None:
    if data is None:
        return None
    return RunRecord(data["run_id"], data["status"], data["tags"], data["params"], data["metrics"], data.get("history") or {},
                     {k: base64.b64decode(v) for k, v in (data.get("artifacts") or {}).items()})


def frozen_trials(record: StudyRecord) -> Iterator[Any]:
    """The record's trials as Optuna FrozenTrials, in number order."""
    import optuna

    for t in sorted(record.trials, key=lambda t: t["number"]):
        state = optuna.trial.TrialState[t["state"]]
        values = t.get("values")
        yield optuna.trial.FrozenTrial(
            number=t["number"], state=state, value=None, values=values,
            datetime_start=_parse_date(t.get("datetime_start")), datetime_complete=_parse_date(t.get("datetime_complete")),
            params=t["params"], distributions={k: optuna.distributions.json_to_distribution(v) for k, v in t["distributions"].items()},
            user_attrs=t["user_attrs"], system_attrs=t["system_attrs"],
            intermediate_values={int(k): v for k, v in t["intermediate_values"].items()}, trial_id=t["number"],
        )


def _parse_date(text: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(text) if text else None


def in_memory_study(record: StudyRecord) -> Any:
    """The record as an Optuna study in memory (what ``load_study`` returns for a store)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage(), study_name=record.name,
                                directions=[optuna.study.StudyDirection[d] for d in record.directions])
    for key, value in record.user_attrs.items():
        study.set_user_attr(key, value)
    for trial in frozen_trials(record):
        study.add_trial(trial)
    return study


def bundle_files(paths: Iterable[str | Path]) -> list[Path]:
    """Files named, and every bundle inside a folder named (sorted), in the order given."""
    out: list[Path] = []
    for item in paths:
        path = Path(item).expanduser()
        out.extend(sorted(path.glob(f"*{SUFFIX}")) if path.is_dir() else [path])
    return out

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
the end record's count and checksum) is refused with one line. A bundle is untrusted input: it is read under caps
and every record checked against the format before anything is written (:mod:`paretolab.results.bundle_read`). :class:`~paretolab.results.source.BundleSource` reads a
bundle as the report, ``frontier`` and ``load_study`` read stores; :mod:`paretolab.results.bundle_stores` exports a study
from the stores and imports a bundle into any store (SQLite files or servers) without running anything.
"""

from __future__ import annotations

import base64
import datetime as dt
import gzip
import hashlib
import io
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from paretolab.errors import ConfigError
from paretolab.results.bundle_read import (  # noqa: F401 - the reader, re-exported: `bundle.read_bundle` is the API
    MAX_BYTES,
    MAX_DEPTH,
    MAX_LINE,
    check_artifact_name,
    read_bundle,
)
from paretolab.results.bundle_records import (  # noqa: F401 - re-exported
    FORMAT,
    IMPORT,
    SUFFIX,
    VERSION,
    RunRecord,
    StudyRecord,
    bundle_sha256,
    import_state,
    partial_import_line,
)

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
    from paretolab.data.outputs import write_atomic

    lines = [_dumps({"format": FORMAT, "version": VERSION, "studies": [r.name for r in records], "written_by": _written_by()})]
    for record in records:
        lines.append(_dumps({"kind": "study", "name": record.name, "directions": record.directions, "user_attrs": record.user_attrs,
                             "study_run": _run_json(record.study_run), "provenance": record.provenance}))
        for trial in record.trials:
            lines.append(_dumps({"kind": "trial", "study": record.name, **{k: v for k, v in trial.items() if k != "run"},
                                 "run": _run_json(trial.get("run"))}))
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    lines.append(_dumps({"kind": "end", "records": len(lines), "sha256": digest}))
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=9, mtime=0, filename="") as gz:
        gz.write(("\n".join(lines) + "\n").encode())
    try:
        write_atomic(out, buffer.getvalue())  # the one all-or-nothing write, with the user's umask
    except OSError as exc:
        raise ConfigError(f"cannot write bundle {out}: {exc.strerror or exc}; nothing was written") from None


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

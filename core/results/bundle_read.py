"""Reading a bundle as untrusted input: streamed under caps, every record checked against the format.

A bundle is a file someone else wrote (a colleague's results, a paper's supplement). :func:`read_bundle` decompresses
it as a stream with a cap on its total size, on one line's length and on a record's nesting, each refused in one line
as soon as it is passed (a gzip bomb is never held in memory); computes the checksum on the way; and checks every
record against the format (names as a pipeline's ``name``, states, finite numbers, trial numbers 0..n-1, artifact
names confined to their run's folder) before any caller writes anything, the error naming the record's line.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import gzip
import hashlib
import json
import math
import os
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from paretolab.data.names import check_name, normal_name, printable
from paretolab.errors import ConfigError
from paretolab.results.bundle_records import FORMAT, VERSION, RunRecord, StudyRecord

# The reader's caps: a bundle is input someone else wrote (a colleague's results, a paper's supplement), so it is read
# as untrusted. Generous for any real bundle (the largest committed one decompresses to a few MB, its longest line to
# under 1 MB); overridable (tests, or a huge study) through the environment.
MAX_BYTES = 1 << 30  # decompressed, in all: PARETOLAB_BUNDLE_MAX_BYTES
MAX_LINE = 64 << 20  # one record: PARETOLAB_BUNDLE_MAX_LINE
MAX_DEPTH = 64  # JSON nesting of one record
MAX_NAME = 1000  # an artifact's path, in characters (each component at most 255)
TRIAL_STATES = ("RUNNING", "COMPLETE", "PRUNED", "FAIL", "WAITING")  # optuna.trial.TrialState's names
RUN_STATES = ("RUNNING", "SCHEDULED", "FINISHED", "FAILED", "KILLED")  # mlflow.entities.RunStatus's names
_KEY_RE = re.compile(r"[\w.\- /:]{1,250}")  # an MLflow tag, param or metric key (MLflow's own rule, bounded)


def _cap(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name) or default)
    except ValueError:
        raise ConfigError(f"{name}={os.environ.get(name)!r}: expected a number of bytes") from None


def read_bundle(path: Path) -> list[StudyRecord]:
    """The studies in a bundle file; a missing, truncated, corrupted, foreign or malformed file is one ConfigError line.

    Two passes over the decompressed stream: the first holds one line at a time, checks the caps (total size
    :data:`MAX_BYTES`, line length :data:`MAX_LINE`), the header, the end record and the checksum, so a gzip bomb is
    refused without being held in memory; the second parses each record (nesting at most :data:`MAX_DEPTH`) and checks
    it against the format (:func:`_records`), before any caller writes anything."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"bundle {_p(path)}: no such file" + (" (it is a folder)" if path.is_dir() else ""))
    first, last, count, digest = b"", b"", 0, hashlib.sha256()
    for number, line in _lines(path):
        if number == 1:
            first = line
            header = _loads(path, 1, line)
            if header.get("format") != FORMAT:
                raise ConfigError(f"{_p(path)} is not a paretolab bundle (no '{FORMAT}' header)")
            if header.get("version") != VERSION:
                raise ConfigError(f"bundle {_p(path)} has format version {printable(repr(header.get('version')))[:40]}; this "
                                  f"paretolab reads version {VERSION} (use the paretolab that wrote it, or export the study again)")
        else:
            digest.update((b"\n" if number > 2 else b"") + last)  # every line but the last, joined by newlines
        last, count = line, number
    if not first:
        raise ConfigError(f"{_p(path)} is not a paretolab bundle (no '{FORMAT}' header)")
    end = _loads(path, count, last)
    if count < 2 or end.get("kind") != "end" or end.get("records") != count - 1:
        raise ConfigError(f"bundle {_p(path)} is truncated (its end record is missing or counts other records); export it again")
    if digest.hexdigest() != end.get("sha256"):
        raise ConfigError(f"bundle {_p(path)} is corrupt (its checksum does not match its records); export it again")
    return _records(path, [_loads(path, number, line) for number, line in _lines(path)])


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(number, line without its newline), streamed from the gzip file under the caps; each breach one ConfigError."""
    max_bytes, max_line = _cap("PARETOLAB_BUNDLE_MAX_BYTES", MAX_BYTES), _cap("PARETOLAB_BUNDLE_MAX_LINE", MAX_LINE)
    total = number = 0
    try:
        with gzip.open(path, "rb") as gz:
            while raw := gz.readline(max_line + 2):
                number += 1
                total += len(raw)
                if total > max_bytes:
                    raise ConfigError(f"bundle {_p(path)} decompresses to more than {_size(max_bytes)} (at line {number}): "
                                      "refused as a possible gzip bomb (PARETOLAB_BUNDLE_MAX_BYTES raises the cap)")
                line = raw[:-1] if raw.endswith(b"\n") else raw
                if len(line) > max_line:
                    raise ConfigError(f"bundle {_p(path)}: line {number} is longer than {_size(max_line)}: refused "
                                      "(PARETOLAB_BUNDLE_MAX_LINE raises the cap)")
                if raw.endswith(b"\n") or line:
                    yield number, line
    except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
        raise ConfigError(f"bundle {_p(path)} is corrupt or truncated ({printable(_why(exc))}); export it again") from None


def _size(n: int) -> str:
    from paretolab.plugin_api.numbers import number as number_text  # `number` is a line number here

    return number_text(n, "bytes")  # 67.11 MB: decimal, as every surface writes bytes


def _p(path: Path) -> str:
    return printable(str(path))


def _loads(path: Path, number: int, line: bytes) -> dict[str, Any]:
    try:
        rec = json.loads(line.decode())
    except UnicodeDecodeError:
        raise ConfigError(f"bundle {_p(path)} is corrupt: line {number} is not UTF-8 text; export it again") from None
    except ValueError as exc:
        raise ConfigError(f"bundle {_p(path)} is corrupt: line {number} is not JSON ({exc.msg}); export it again") from None
    except RecursionError:
        raise ConfigError(f"bundle {_p(path)}: line {number} nests deeper than {MAX_DEPTH} levels: refused") from None
    if not isinstance(rec, dict):
        raise ConfigError(f"bundle {_p(path)} is corrupt: line {number} is not a record; export it again")
    if _depth(rec) > MAX_DEPTH:
        raise ConfigError(f"bundle {_p(path)}: line {number} nests deeper than {MAX_DEPTH} levels: refused")
    return rec


def _depth(obj: Any) -> int:
    """How deep lists and dicts nest in ``obj``, without recursion."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, level)
            if level > MAX_DEPTH:
                return level
            stack.extend((child, level + 1) for child in item if isinstance(child, (dict, list)))
    return deepest


def _why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


# ---------------------------------------------------------------------------------------------------- the format's schema


class _Bad(Exception):
    """A field that breaks the format: (field, what is wrong)."""


def _records(path: Path, records: list[dict[str, Any]]) -> list[StudyRecord]:
    """The checked records as studies; the first record that breaks the format is one ConfigError naming its line."""
    number = 1
    try:
        names = _header(records[0])
        studies: dict[str, StudyRecord] = {}
        for number, rec in enumerate(records[1:-1], 2):
            kind = rec.get("kind")
            if kind == "study":
                record = _study(rec, names, studies)
                studies[record.name] = record
            elif kind == "trial":
                study = _text(rec.get("study"), "study")
                owner = studies.get(normal_name(study))
                if owner is None:
                    raise _Bad("study", f"{printable(repr(study))[:120]} is no study declared on an earlier line")
                owner.trials.append(_trial(rec, owner))
            else:
                raise _Bad("kind", f"{printable(repr(kind))[:60]} is not 'study' or 'trial'")
        number = len(records)
        missing = [n for n in names if n not in studies]
        if missing:
            raise _Bad("studies", f"the header names {missing[0]!r} but no study record follows")
        for record in studies.values():
            _numbers(record)
    except _Bad as exc:
        field, what = exc.args
        raise ConfigError(f"bundle {_p(path)}: line {number}: {field}: {what}; refused (a bundle written by `paretolab bundle "
                          "export` never holds this)") from None
    except ConfigError as exc:
        raise ConfigError(f"bundle {_p(path)}: line {number}: {exc}") from None
    return list(studies.values())


def _header(rec: dict[str, Any]) -> list[str]:
    names = rec.get("studies")
    if not isinstance(names, list):
        raise _Bad("studies", "expected the list of the bundle's study names")
    out: list[str] = []
    for name in names:
        normal = check_name(name, "study name")
        if normal in out:
            raise _Bad("studies", f"study {normal!r} is named twice")
        out.append(normal)
    return out


def _study(rec: dict[str, Any], names: list[str], studies: dict[str, StudyRecord]) -> StudyRecord:
    name = check_name(rec.get("name"), "study name")
    if name not in names:
        raise _Bad("name", f"study {name!r} is not in the header's studies")
    if name in studies:
        raise _Bad("name", f"study {name!r} has a second study record")
    directions = rec.get("directions")
    if not (isinstance(directions, list) and directions and all(d in ("MINIMIZE", "MAXIMIZE") for d in directions)):
        raise _Bad("directions", f"{printable(repr(directions))[:80]} is not a list of 'MINIMIZE' / 'MAXIMIZE'")
    user_attrs = _shaped(_dict(rec.get("user_attrs"), "user_attrs"), "user_attrs", _STUDY_ATTRS)
    objectives = user_attrs.get("objectives")
    if objectives is not None and not (isinstance(objectives, list) and all(
            isinstance(o, list) and len(o) == 2 and isinstance(o[0], str) and o[1] in ("minimize", "maximize") for o in objectives)):
        raise _Bad("user_attrs.objectives", "expected a list of [metric, 'minimize' | 'maximize'] pairs")
    provenance = _shaped(_dict(rec.get("provenance") if rec.get("provenance") is not None else {}, "provenance"), "provenance",
                         _PROVENANCE)
    load = provenance.get("load_1m")
    if isinstance(load, dict):
        for key in ("median", "max"):
            _finite(load.get(key), f"provenance.load_1m.{key}")
    return StudyRecord(name, directions, user_attrs, [], _run_checked(rec.get("study_run"), "study_run"), provenance)


def _trial(rec: dict[str, Any], study: StudyRecord) -> dict[str, Any]:
    import optuna

    number = rec.get("number")
    if not isinstance(number, int) or isinstance(number, bool) or number < 0:
        raise _Bad("number", f"{printable(repr(number))[:40]} is not a trial number (an integer from 0)")
    state = rec.get("state")
    if state not in TRIAL_STATES:
        raise _Bad("state", f"{printable(repr(state))[:40]} is not a trial state ({', '.join(TRIAL_STATES)})")
    values = rec.get("values")
    if values is not None:
        if not isinstance(values, list) or len(values) != len(study.directions):
            raise _Bad("values", f"expected {len(study.directions)} number(s), one per objective, or null")
        for value in values:
            _finite(value, "values")
    params = _dict(rec.get("params"), "params")
    for key, value in params.items():
        if isinstance(value, float):
            _finite(value, f"params.{printable(key)[:60]}")
    distributions = {}
    for key, text in _dict(rec.get("distributions"), "distributions").items():
        try:
            distributions[key] = optuna.distributions.json_to_distribution(_text(text, f"distributions.{key}"))
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            raise _Bad(f"distributions.{printable(key)[:60]}", "is not an Optuna distribution") from None
    intermediate = {}
    for key, value in _dict(rec.get("intermediate_values"), "intermediate_values").items():
        if not (key.isdecimal() or (key[:1] == "-" and key[1:].isdecimal())) or len(key) > 18:
            raise _Bad("intermediate_values", f"step {printable(repr(key))[:40]} is not an integer")
        intermediate[int(key)] = _finite(value, f"intermediate_values.{key}")
    dates = {key: _date(rec.get(key), key) for key in ("datetime_start", "datetime_complete")}
    trial = {"number": number, "state": state, "values": values, "params": params,
             "distributions": {k: v for k, v in rec["distributions"].items()},
             "user_attrs": _shaped(_dict(rec.get("user_attrs"), "user_attrs"), "user_attrs", _TRIAL_ATTRS),
             "system_attrs": _dict(rec.get("system_attrs"), "system_attrs"), "intermediate_values": rec["intermediate_values"],
             "datetime_start": rec.get("datetime_start"), "datetime_complete": rec.get("datetime_complete"),
             "run": _run_checked(rec.get("run"), "run")}
    frozen = optuna.trial.FrozenTrial(number=number, state=optuna.trial.TrialState[state], value=None, values=values,
                                      datetime_start=dates["datetime_start"], datetime_complete=dates["datetime_complete"],
                                      params=params, distributions=distributions, user_attrs=trial["user_attrs"],
                                      system_attrs=trial["system_attrs"], intermediate_values=intermediate, trial_id=number)
    try:
        frozen._validate()  # what Optuna's add_trial would refuse, refused here, before anything is written
    except (ValueError, TypeError) as exc:
        raise _Bad("trial", printable(str(exc))[:200]) from None
    return trial


def _numbers(record: StudyRecord) -> None:
    """A study's trial numbers are 0..n-1, each once (Optuna numbers an added trial itself: a gap would renumber them)."""
    numbers = sorted(t["number"] for t in record.trials)
    seen: set[int] = set()
    repeats = sorted({n for n in numbers if n in seen or seen.add(n)})
    if repeats:
        raise _Bad("number", f"study {record.name!r} has trial number(s) {_few(repeats)} more than once")
    gaps = sorted(set(range(len(numbers))) - set(numbers))
    if gaps:
        raise _Bad("number", f"study {record.name!r} has {len(numbers)} trials but no trial number(s) {_few(gaps)} "
                             f"(they must be 0 to {len(numbers) - 1}; an import would renumber them)")


# What the readers take from a study's or a trial's attributes, and the type each must have when present.
_STUDY_ATTRS = {"pipeline": dict, "pipeline_hash": str, "model": str, "code_version": str, "objectives": list,
                "constraints": list, "methods": list, "paretolab.session": dict}
_TRIAL_ATTRS = {"mlflow_run_id": str, "fail_reason": str, "code_version": str}
_PROVENANCE = {"trials_from": str, "trials_to": str, "code_versions": list, "machines": list, "load_1m": dict,
               "model_checksums": list, "weights": list, "trained_base": list}


def _shaped(attrs: dict[str, Any], field: str, types: dict[str, type]) -> dict[str, Any]:
    for key, kind in types.items():
        if attrs.get(key) is not None and not isinstance(attrs[key], kind):
            raise _Bad(f"{field}.{key}", f"expected {'a mapping' if kind is dict else 'a list' if kind is list else 'text'}, "
                                         f"got {type(attrs[key]).__name__}")
    return attrs


def _few(numbers: list[int]) -> str:
    return ", ".join(map(str, numbers[:5])) + (f" and {len(numbers) - 5} more" if len(numbers) > 5 else "")


def _dict(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Bad(field, f"expected a mapping, got {type(value).__name__}")
    return value


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise _Bad(field, f"expected text, got {type(value).__name__}")
    return value


def _finite(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _Bad(field, f"{printable(repr(value))[:40]} is not a finite number")
    return value


def _date(value: Any, field: str) -> dt.datetime | None:
    if value is None:
        return None
    try:
        return dt.datetime.fromisoformat(_text(value, field))
    except ValueError:
        raise _Bad(field, f"{printable(repr(value))[:60]} is not an ISO date") from None


def _keys(value: Any, field: str, *, numbers: bool = False) -> dict[str, Any]:
    """An MLflow tags/params (text values) or metrics (finite numbers) mapping, keys as MLflow allows them."""
    for key, item in _dict(value, field).items():
        if not _KEY_RE.fullmatch(key) or ".." in key.split("/") or key.startswith("/"):
            raise _Bad(field, f"key {printable(repr(key))[:120]} is not an MLflow key (letters, digits, _ - . / : and spaces)")
        if numbers:
            _finite(item, f"{field}.{key}")
        elif not isinstance(item, str):
            raise _Bad(f"{field}.{key}", f"expected text, got {type(item).__name__}")
    return value


def check_artifact_name(name: Any, field: str = "artifacts") -> str:
    """An artifact's name as a run may hold it: a relative POSIX path inside the run's folder, nothing else."""
    if not isinstance(name, str) or not name:
        raise _Bad(field, "an artifact has no name")
    shown = printable(repr(name))[:120]
    if len(name) > MAX_NAME or any(len(part) > 255 for part in name.split("/")):
        raise _Bad(field, f"artifact name {shown} is too long (at most {MAX_NAME} characters, 255 a component)")
    if printable(name) != name or "\\" in name:
        raise _Bad(field, f"artifact name {shown} holds a control character or a backslash")
    if name.startswith("/") or any(part in ("", ".", "..") for part in name.split("/")):
        raise _Bad(field, f"artifact name {shown} is not a relative path inside the run's folder (no '/' first, no '..', "
                          "'.' or empty part)")
    return name


def _run_checked(data: Any, field: str) -> RunRecord | None:
    if data is None:
        return None
    data = _dict(data, field)
    run_id = _text(data.get("run_id"), f"{field}.run_id")
    status = data.get("status")
    if status not in RUN_STATES:
        raise _Bad(f"{field}.status", f"{printable(repr(status))[:40]} is not an MLflow run status ({', '.join(RUN_STATES)})")
    history: dict[str, list[list[float]]] = {}
    for key, points in _dict(data.get("history") or {}, f"{field}.history").items():
        _keys({key: ""}, f"{field}.history")
        if not isinstance(points, list) or not all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], int)
                                                   and not isinstance(p[0], bool) for p in points):
            raise _Bad(f"{field}.history.{key}", "expected a list of [step, value] pairs")
        for _, value in points:
            _finite(value, f"{field}.history.{key}")
        history[key] = points
    artifacts: dict[str, bytes] = {}
    names = set()
    for name, text in _dict(data.get("artifacts") or {}, f"{field}.artifacts").items():
        check_artifact_name(name, f"{field}.artifacts")
        try:
            artifacts[name] = base64.b64decode(_text(text, f"{field}.artifacts"), validate=True)
        except (ValueError, binascii.Error):
            raise _Bad(f"{field}.artifacts", f"{printable(repr(name))[:120]} is not base64") from None
        names.add(name)
    for name in names:  # 'a' and 'a/b' cannot both be files
        parts = name.split("/")
        if any("/".join(parts[:i]) in names for i in range(1, len(parts))):
            raise _Bad(f"{field}.artifacts", f"artifact {printable(repr(name))[:120]} lies inside another artifact's name")
    return RunRecord(run_id, status, _keys(data.get("tags") or {}, f"{field}.tags"), _keys(data.get("params") or {}, f"{field}.params"),
                     _keys(data.get("metrics") or {}, f"{field}.metrics", numbers=True), history, artifacts)


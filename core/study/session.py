"""What the last driver session of a study did, kept in the Optuna study, and the status `paretolab studies` shows.

The driver writes ``paretolab.session`` when it starts trials ({"state": "running"}) and when it stops
({"state": "finished"} or {"state": "interrupted", "by": "SIGINT"}), with the pipeline path it was run
from and the trials it planned. A study whose session still says running while no driver owns it was
left by a driver that died (killed, machine gone).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

SESSION = "paretolab.session"


def session_started(study: Any, pipeline: str | None, planned: int) -> None:
    study.set_user_attr(SESSION, {"state": "running", "pipeline": pipeline or "", "planned": planned, "at": _now()})


def session_ended(study: Any, interrupted_by: str | None, planned: int, error: str | None = None) -> None:
    """``interrupted_by``: the signal that stopped the session ("SIGINT", "SIGTERM"), None when it ran to its end;
    ``error``: the first line of the error that ended it, if one did."""
    record = dict(study.user_attrs.get(SESSION) or {})
    state = "interrupted" if interrupted_by else "failed" if error else "finished"
    record.update({"state": state, "by": interrupted_by or (error or "")[:200], "planned": planned, "at": _now()})
    study.set_user_attr(SESSION, record)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def study_status(user_attrs: dict[str, Any], counts: dict[str, int], owned: bool) -> tuple[str, str, bool]:
    """(a short status, how to resume or "", whether the study is interrupted) from its user attrs, trial counts
    and whether a driver owns it now.

    Interrupted: its last session ended by a signal, on an error or with its driver dead, or (a study from before
    sessions were recorded) it has failed or unfinished trials and fewer complete than its pipeline planned.
    """
    if owned:
        return "running", "", False
    session = user_attrs.get(SESSION) or {}
    planned = int(session.get("planned") or _planned(user_attrs) or 0)
    complete = counts.get("complete", 0)
    state = session.get("state")
    if state == "interrupted":
        short, why = f"interrupted ({session.get('by') or 'signal'})", f"stopped by {session.get('by') or 'a signal'}"
    elif state == "running":
        short, why = "interrupted (driver died)", "its driver died"
    elif state == "failed":
        short, why = "interrupted (error)", f"its driver stopped on an error: {session.get('by') or '?'}"
    elif state is None and (counts.get("failed", 0) or counts.get("running", 0)) and complete < planned:
        short, why = "interrupted", "unfinished"
    else:
        return "finished", "", False
    pipeline = session.get("pipeline") or "PIPELINE"
    return short, f"{why}, {complete} of {planned} planned trial(s) complete: resume with `paretolab run {pipeline} --resume`", True


def _planned(user_attrs: dict[str, Any]) -> int | None:
    search = (user_attrs.get("pipeline") or {}).get("search") or {}
    trials = search.get("trials") if isinstance(search, dict) else None
    return trials if isinstance(trials, int) else None

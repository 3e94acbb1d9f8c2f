"""How a driver stops on a signal: Ctrl-C drains, a second Ctrl-C (or SIGTERM) cancels; the reason each trial records.

- The first SIGINT (Ctrl-C) stops proposing trials and lets the running ones finish; the driver says so once.
- A second SIGINT cancels the running trials: they are recorded as failed, with the reason below, in both stores.
- SIGTERM (what `ray job stop` and `paretolab jobs stop` send) cancels at once, as a second Ctrl-C does.
- A SIGINT before any trial runs (Ray starting, workers loading the model) raises KeyboardInterrupt: nothing runs yet.
- A third SIGINT raises KeyboardInterrupt too: the driver leaves at once, and `--resume` runs what was left RUNNING again.

The handlers are installed explicitly, so a driver started from a script where SIGINT is ignored (a background
job of a non-interactive shell) still stops on `kill -INT`.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray's job supervisor for a submitted job's driver


def in_ray_job() -> bool:
    """Whether this driver runs as a Ray job (`paretolab submit`), where `jobs stop` is what sends it signals."""
    return RAY_JOB_ENV in os.environ


def stop_reason(signame: str) -> str:
    """The fail reason a trial cancelled by ``signame`` records: the local cause for a terminal, the job's for a Ray job."""
    if in_ray_job():
        return f"stopped: the driver got {signame} (`paretolab jobs stop` or `ray job stop`)"
    if signame == "SIGINT":
        return "interrupted: Ctrl-C (SIGINT) in the terminal running `paretolab run`"
    return f"stopped: the driver got {signame}"


class StopSignal:
    """SIGINT and SIGTERM for the driver loop: ``draining`` (no new trials), then ``cancel`` (end running ones)."""

    def __init__(self) -> None:
        self.requested = ""  # the first signal's name, once one came
        self.cancel = False  # end the running trials now
        self.cancelled_by = ""  # the signal that cancelled them
        self.announced = False  # the driver printed what the first Ctrl-C does
        self.running = False  # trials may be in flight: a Ctrl-C drains instead of raising
        self._interrupts = 0
        self._previous: dict[int, Any] = {}
        self.install()

    def install(self) -> None:
        """Take SIGINT and SIGTERM (again: `ray.init` sets a SIGTERM handler of its own that exits at once, leaving the
        running trials RUNNING). ``restore`` gives back what was there before the first install."""
        if threading.current_thread() is threading.main_thread():
            for sig, handler in ((signal.SIGINT, self._sigint), (signal.SIGTERM, self._sigterm)):
                previous = signal.signal(sig, handler)
                self._previous.setdefault(sig, previous)

    @property
    def draining(self) -> bool:
        return bool(self.requested) and not self.cancel

    def _sigint(self, signum: int, frame: Any) -> None:
        self._interrupts += 1
        if not self.running or self._interrupts > 2:
            self.requested = self.requested or "SIGINT"
            raise KeyboardInterrupt
        self.requested = self.requested or "SIGINT"
        if self._interrupts == 2:
            self.cancel, self.cancelled_by = True, self.cancelled_by or "SIGINT"

    def _sigterm(self, signum: int, frame: Any) -> None:
        self.requested = self.requested or "SIGTERM"
        self.cancel, self.cancelled_by = True, self.cancelled_by or "SIGTERM"
        if not self.running:
            raise KeyboardInterrupt

    def reason(self) -> str:
        """What a cancelled trial records: the signal that cancelled it (a second Ctrl-C is still Ctrl-C)."""
        return stop_reason(self.cancelled_by or self.requested or "SIGINT")

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}


INTERRUPTED = "interrupted_by"  # user attr of a trial cancelled by a signal: the signal's name
REQUEUE_OF = "requeue_of"  # user attr of the trial that runs a cancelled trial's parameters again: that trial's number


def requeue_interrupted(study: Any) -> tuple[int, int]:
    """(trials cancelled by a signal, of which queued again now): a cancelled trial is no result, so on ``--resume``
    its parameters run again as a new trial, and it does not count against the target. Each is queued once."""
    import optuna

    from paretolab.study.proposer import held_params, params_key

    trials = study.get_trials(deepcopy=False)
    cancelled = [t for t in trials if t.state == optuna.trial.TrialState.FAIL and t.user_attrs.get(INTERRUPTED)]
    done = {params_key(held_params(t)) for t in trials if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.WAITING)}
    again = {t.user_attrs.get(REQUEUE_OF) for t in trials}
    queued = 0
    for frozen in cancelled:
        if frozen.number in again or not frozen.params or params_key(frozen.params) in done:
            continue
        study.enqueue_trial(dict(frozen.params), user_attrs={REQUEUE_OF: frozen.number})
        done.add(params_key(frozen.params))
        queued += 1
    return len(cancelled), queued

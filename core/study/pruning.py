"""Early stopping of bad trials: ``search.pruner``, Optuna's pruners behind one Ray actor.

A trial reports intermediate values while it runs (the ``train`` stage reports ``val_loss`` and
``train_loss`` at every evaluation point, step = optimizer steps over its train stages) through
``ctx.report``. The worker hands each report to the study's :class:`PruneBoard`, a Ray actor that
holds the pruner and an in-memory single-objective study of the reported metric (Optuna's
pruners judge one value per step; our studies have several objectives). Its answer comes back
within the same call, so a pruned trial stops at the evaluation point that condemned it,
frees its worker at once, and the driver records it as PRUNED in both stores with its curve.

``asha`` is Optuna's ``SuccessiveHalvingPruner`` (asynchronous successive halving) and not Ray
Tune's ASHA scheduler: the driver owns the search and the stores, and Tune's scheduler only
runs inside Tune's own trial runner. ``hyperband`` runs several ASHA brackets (Optuna's
``HyperbandPruner``); ``median`` stops a trial whose value is worse than the median of the
finished trials' at the same step.
"""

from __future__ import annotations

import difflib
import inspect
import math
from dataclasses import dataclass, field
from typing import Any

import optuna

from paretolab.errors import ConfigError
from paretolab.study.fields import lookup

PRUNERS = {
    "median": optuna.pruners.MedianPruner,
    "asha": optuna.pruners.SuccessiveHalvingPruner,
    "hyperband": optuna.pruners.HyperbandPruner,
}
REPORTING_METHODS = ("train",)  # stages that call ctx.report at their evaluation points
PRUNER_ATTRS = "pruner_attrs"  # system attr of a real trial: its pruner bookkeeping (ASHA's rungs), kept for --resume
PRUNER_VALUE = "pruner_value"  # user attr: the pruned-on metric's final value (or last report)


@dataclass(frozen=True)
class PrunerSpec:
    name: str
    metric: str = "val_loss"
    direction: str = "minimize"
    args: dict[str, Any] = field(default_factory=dict)

    def make(self) -> optuna.pruners.BasePruner:
        return PRUNERS[self.name](**self.args)


def parse_pruner(raw: Any, stages: tuple[Any, ...], regs: Any) -> PrunerSpec | None:
    """``search.pruner: {name: median|asha|hyperband, metric: val_loss, <the pruner's own arguments>}``."""
    if raw is None:
        return None
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, dict) or "name" not in raw:
        raise ConfigError(f"search.pruner: expected {{name: median|asha|hyperband, ...}}, got {raw!r}")
    name = raw["name"]
    if name not in PRUNERS:
        close = difflib.get_close_matches(str(name), PRUNERS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"search.pruner.name: unknown pruner {name!r}{hint} (known: {', '.join(PRUNERS)})")
    cls = PRUNERS[name]
    metric = lookup(regs.metrics, raw.get("metric", "val_loss"), "search.pruner.metric")
    reporters = sorted({o.method for s in stages for o in s.options if o.method in REPORTING_METHODS})
    if not reporters:
        raise ConfigError("search.pruner: no stage of this pipeline reports intermediate values (a `train` stage does, "
                          "at every eval_every steps); drop search.pruner or add a train stage")
    known = [p for p in inspect.signature(cls).parameters if p != "self"]
    args = {k: v for k, v in raw.items() if k not in ("name", "metric")}
    for key in args:
        if key not in known:
            raise ConfigError(f"search.pruner.{key}: not an argument of {cls.__name__} ({name}); it takes {', '.join(known)}")
    if name in ("asha", "hyperband") and "min_resource" not in args:
        # Optuna's "auto" takes 1/100 of the first complete trial's last step: a first report at step 50 then
        # passes several rungs at once and nearly every trial is pruned. A rung per evaluation point instead.
        args["min_resource"] = _eval_every(stages)
    try:
        cls(**args)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"search.pruner: {cls.__name__}({', '.join(f'{k}={v!r}' for k, v in args.items())}) refused: {exc}") from None
    return PrunerSpec(name, metric.name, metric.direction, args)


def _eval_every(stages: tuple[Any, ...]) -> int:
    """The smallest fixed ``eval_every`` of the reporting stages (the train method's default where none is given)."""
    from paretolab.training.method import TrainOptions

    found = []
    for stage in stages:
        for option in stage.options:
            if option.method in REPORTING_METHODS:
                given = option.params.get("eval_every")
                value = getattr(given, "value", given)
                found.append(value if isinstance(value, int) else TrainOptions.eval_every)
    return max(1, min(found, default=TrainOptions.eval_every))


class PruneBoard:
    """The pruner and the reports of one study's running trials (run as a Ray actor; plain class in tests).

    ``history``: the finished trials of an earlier session, ``{"state", "value", "intermediate", "attrs"}``,
    so a resumed study prunes against them as before.
    """

    def __init__(self, spec: PrunerSpec, history: list[dict[str, Any]] | None = None) -> None:
        self.spec = spec
        previous = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "A new study created in memory" line in the driver's log
        self.mirror = optuna.create_study(direction=spec.direction, pruner=spec.make(), sampler=optuna.samplers.RandomSampler(seed=0))
        optuna.logging.set_verbosity(previous)
        self.running: dict[int, optuna.Trial] = {}
        self.pruned: dict[int, int] = {}  # trial number -> step it was pruned at
        for past in history or []:
            self.mirror.add_trial(optuna.trial.create_trial(
                state=optuna.trial.TrialState[past["state"]],
                value=past.get("value") if past["state"] == "COMPLETE" else None,
                intermediate_values={int(k): float(v) for k, v in past.get("intermediate", {}).items()},
                system_attrs=dict(past.get("attrs") or {}),
            ))

    def report(self, number: int, step: int, values: dict[str, float]) -> bool:
        """Record trial ``number``'s values at ``step``; True when the pruner stops it (it should stop now)."""
        if number in self.pruned:
            return True
        value = values.get(self.spec.metric)
        if value is None:
            return False
        trial = self.running.get(number)
        if trial is None:
            trial = self.running[number] = self.mirror.ask()
        if step in self.mirror._storage.get_trial(trial._trial_id).intermediate_values:
            return False
        trial.report(float(value), int(step))
        if trial.should_prune():
            self.pruned[number] = int(step)
            return True
        return False

    def finish(self, number: int, state: str, value: float | None = None) -> dict[str, Any]:
        """Trial ``number`` ended (COMPLETE, PRUNED or FAIL): tell the mirror; returns what the driver stores."""
        trial = self.running.pop(number, None)
        if trial is None:
            return {"intermediate": {}, "attrs": {}, "value": None}
        frozen = self.mirror._storage.get_trial(trial._trial_id)
        intermediate = dict(frozen.intermediate_values)
        if value is None or not math.isfinite(value):
            value = intermediate[max(intermediate)] if intermediate else None
        self.pruned.pop(number, None)
        if state == "COMPLETE" and value is not None and math.isfinite(value):
            self.mirror.tell(trial, value)
        elif state == "PRUNED":
            self.mirror.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            self.mirror.tell(trial, state=optuna.trial.TrialState.FAIL)
        attrs = {k: v for k, v in self.mirror._storage.get_trial(trial._trial_id).system_attrs.items() if k != "fixed_params"}
        return {"intermediate": intermediate, "attrs": attrs, "value": value}

    def pruned_at(self, number: int) -> int | None:
        return self.pruned.get(number)


def history_of(study: optuna.Study) -> list[dict[str, Any]]:
    """The finished trials of ``study`` as a PruneBoard's history (their stored reports and bookkeeping)."""
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)
    out = []
    for t in study.get_trials(deepcopy=False, states=states):
        if not t.intermediate_values:
            continue
        value = t.user_attrs.get(PRUNER_VALUE)
        state = t.state.name if t.state != optuna.trial.TrialState.COMPLETE or value is not None else "FAIL"
        out.append({"state": state, "value": value, "intermediate": dict(t.intermediate_values),
                    "attrs": t.system_attrs.get(PRUNER_ATTRS) or {}})
    return out


def start_board(spec: PrunerSpec | None, study: optuna.Study) -> Any:
    """The study's PruneBoard as a Ray actor (no CPU of its own), primed with the finished trials; None without a pruner."""
    if spec is None:
        return None
    import ray

    return ray.remote(num_cpus=0, max_restarts=0)(PruneBoard).remote(spec, history_of(study))


def keep_reports(board: Any, study: optuna.Study, trial: optuna.Trial, result: Any, metric: str) -> None:
    """Tell the board how trial ``trial`` ended and store its reports (its curve) and the pruner's bookkeeping in Optuna."""
    import ray

    state = "FAIL" if result.failed else "PRUNED" if result.pruned else "COMPLETE"
    kept = ray.get(board.finish.remote(trial.number, state, result.metrics.get(metric)))
    for step, value in sorted(kept["intermediate"].items()):  # Study.tell refuses trial.report on a multi-objective study
        study._storage.set_trial_intermediate_value(trial._trial_id, int(step), float(value))
    if kept["attrs"]:
        study._storage.set_trial_system_attr(trial._trial_id, PRUNER_ATTRS, kept["attrs"])
    if kept["value"] is not None and math.isfinite(kept["value"]):
        trial.set_user_attr(PRUNER_VALUE, float(kept["value"]))

"""One trial, as the worker runs it: copy the base subject, apply the stages, evaluate, measure."""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from paretolab.errors import TrialError, TrialPruned
from paretolab.measure.energy import EnergyMeter
from paretolab.measure.memory import PeakMemory
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.examples import ExampleSplit
from paretolab.plugin_api.options import parse_options
from paretolab.plugin_api.subject import Subject, synchronize, tokenizer_state
from paretolab.records import StagePlan, TrialResult, TrialSettings
from paretolab.study.reasons import readable_reason
from paretolab.training.method import curve_history

MAX_ARTIFACT_BYTES = 8 * 1024 * 1024
TRIAL_FOLDER = "paretolab-trial"  # each trial's workdir: TRIAL_FOLDER<number>-p<pid>-<random> in the temp folder
STOPPED = "stopped_processes"  # result.info (and the Optuna user attr): the child processes a trial left, stopped at its end
KEEP_CHILDREN = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")  # Python's own helpers of this process
TRIAL_TOKEN = "PARETOLAB_TRIAL"  # in the environment of every process a trial starts: how its leftovers are found


def run_trial(base: Subject, plan: list[StagePlan], settings: TrialSettings, number: int,
              roles: dict[str, Subject] | None = None, keep: Callable[[Subject], None] | None = None,
              report: Callable[[int, dict[str, float]], bool] | None = None) -> TrialResult:
    """Run one trial to a result; every exception becomes a failed result with its traceback.

    ``roles``: the pipeline's ``models:`` by role, loaded once by the worker and shared read-only (``ctx.models``).
    ``keep``: called with the transformed subject once it was evaluated and measured (``paretolab export``
    re-runs a trial this way to keep the very model the trial measured).
    ``report``: the study's pruner (``ctx.report`` calls it); a trial it stops comes back with
    ``pruned_at``, its curve and what it spent so far, and no objective values.
    """
    from paretolab.plugin_api.costs import CostLedger
    from paretolab.plugin_api.manager import registries

    regs = registries()
    result = TrialResult()
    sampler = PeakMemory()
    if torch.cuda.is_available():  # peak_gpu_mb is this trial's peak, not the worker's lifetime peak
        torch.cuda.reset_peak_memory_stats()
    meter = EnergyMeter.for_this_process()
    start = time.perf_counter()
    meter.begin("trial")
    sweep_trial_folders()
    children = TrialChildren()
    with tempfile.TemporaryDirectory(prefix=f"{TRIAL_FOLDER}{number}-p{os.getpid()}-", ignore_cleanup_errors=True) as tmp:
        ctx = TrialContext(
            seed=settings.seed + number,
            workdir=Path(tmp),
            study=settings.study,
            trial_number=number,
            task={"name": settings.task, **settings.task_options},
            cpus=settings.cpus,
            base=base,
            device=base.device,
            deadline=time.time() + settings.timeout_s if settings.timeout_s > 0 else None,
            models=dict(roles or {}),
            costs=CostLedger(dict(settings.prices)),
            reporter=report,
            split=ExampleSplit(**settings.split) if settings.split else None,
        )
        ctx.stage_s, ctx.stage_energy_j = result.stage_s, meter.joules  # live: measures read the stages finished before them
        try:
            with sampler, torch.random.fork_rng(devices=[]):
                torch.manual_seed(ctx.seed)
                t0 = time.perf_counter()
                meter.begin("copy")
                subject = base.copy()
                ctx.device = subject.device  # where methods put new tensors (the worker's GPU, when it has one)
                shared_tokenizer = tokenizer_state(base.tokenizer)
                result.stage_s["copy"] = time.perf_counter() - t0
                meter.end("copy")
                subject, methods = apply_plan(subject, plan, ctx, result.stage_s, meter, base=base, shared_tokenizer=shared_tokenizer)
                subject.model.eval()

                t0 = time.perf_counter()
                meter.begin("evaluate")
                task = regs.tasks.get(settings.task)
                metrics = dict(task.evaluate(subject, parse_options(task.options, settings.task_options, where="task"), ctx))
                owners = {k: f"the task {settings.task!r}" for k in metrics}
                for method in methods:
                    _take(metrics, owners, method, method.evaluate(subject, ctx), regs, "evaluate")
                synchronize(subject.device)  # queued GPU work belongs to this stage
                result.stage_s["evaluate"] = time.perf_counter() - t0
                meter.end("evaluate")

                t0 = time.perf_counter()
                meter.begin("measure")
                task_metrics_now = set(metrics)
                for name, options in _measures(settings.measures, regs).items():
                    measure = regs.measures.get(name)
                    measured = measure.measure(subject, parse_options(measure.options, options, where=f"measures.{name}"), ctx)
                    # a task that times its own generation (prefill_ms, decode_tok_s) keeps its numbers
                    mine = {k: v for k, v in measured.items() if k.removesuffix("_iqr") not in task_metrics_now}  # and its spread
                    metrics.update(mine)
                    owners.update({k: f"the measure {name!r}" for k in mine})
                for method in methods:
                    _take(metrics, owners, method, method.measure(subject, ctx), regs, "measure")
                synchronize(subject.device)
                result.stage_s["measure"] = time.perf_counter() - t0
                _guard_tokenizer(base, shared_tokenizer, f"the task {settings.task!r}, a measure or evaluate/measure of {', '.join(repr(s.method) for s in plan)}")
                meter.end("measure")
                if keep is not None:
                    keep(subject)
            metrics.update(ctx.costs.metrics())
            result.metrics = {k: float(v) for k, v in metrics.items()}
            result.info = {k: v for k, v in subject.info.items() if isinstance(v, (str, int, float, bool))}
            result.info.update(ctx.costs.info())
            result.info["energy_source"] = meter.source
            if ctx.calibration_draws:
                result.info["calibration_draws"] = "; ".join(ctx.calibration_draws)
            if ctx.examples_used:
                result.info["examples"] = ctx.examples_used
            result.simulated_by = list(subject.simulated_by)
            result.history = curve_history(subject)
            unknown = sorted(k for k in result.metrics if k not in regs.metrics)
            if unknown:
                raise ValueError(f"unregistered metric(s) {unknown}: register them with the register_metrics hook")
            bad = sorted(k for k, v in result.metrics.items() if not math.isfinite(v))
            if bad:  # +inf would be stored as 1.8e308 and rank as a number: every metric must be finite
                said = "; ".join(f"{k} is {_shown(result.metrics[k])} (from {owners.get(k, 'the trial')})" for k in bad)
                result.error = f"metric(s) not finite: {said}; every metric must be a finite number (NaN, inf and -inf fail the trial)"
                result.metrics = {k: v for k, v in result.metrics.items() if k not in bad}
        except TrialPruned as stop:
            result.pruned_at = stop.step
            result.metrics = spent_so_far(stop.subject, ctx)
            result.history = curve_history(stop.subject) if stop.subject is not None else {}
        except BaseException as exc:  # noqa: BLE001 - a broken trial must not take the study down, KeyboardInterrupt from a plugin included
            result.error = readable_reason(exc)
            result.traceback = traceback.format_exc()
        result.artifacts = _collect(ctx.artifacts)
        stopped = children.stop()  # before the folder goes: a child may still be writing in it
        if stopped:
            result.info[STOPPED] = stopped
    shutil.rmtree(tmp, ignore_errors=True)  # what TemporaryDirectory could not remove (a file made read-only, a late writer)
    energy_j = meter.end("trial")
    meter.close()
    result.stage_energy_j = {k: v for k, v in meter.joules.items() if k != "trial"}
    transform_s = sum(v for k, v in result.stage_s.items() if k.startswith("transform:"))
    result.metrics.update(
        {
            "transform_s": transform_s,
            "evaluate_s": result.stage_s.get("evaluate", 0.0),
            "measure_s": result.stage_s.get("measure", 0.0),
            "trial_s": time.perf_counter() - start,
            "peak_rss_mb": sampler.peak_mb,
            "energy_j": energy_j,
        }
    )
    if torch.cuda.is_available():
        result.metrics["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return result


def apply_plan(subject: Subject, plan: list[StagePlan], ctx: TrialContext, stage_s: dict[str, float], meter: Any = None, *,
               base: Subject | None = None, shared_tokenizer: tuple[str, ...] | None = None) -> tuple[Subject, list[Any]]:
    """Apply each stage's ``transform`` in order; returns the subject and the methods that ran.

    The one path every transformed model takes: a study's trial, ``paretolab.apply`` and
    ``paretolab export`` (so an exported model is the model the trial measured). ``stage_s`` gets
    each stage's seconds as ``transform:<stage>``; ``meter`` (an EnergyMeter) its joules. With
    ``base``, a method that changed the tokenizer shared with ``base`` in place fails the stage.
    """
    from paretolab.plugin_api.artifacts import after_stage
    from paretolab.plugin_api.manager import registries

    regs = registries()
    methods = []
    for stage in plan:
        method = regs.methods.get(stage.method)
        methods.append(method)
        ctx.stage = stage.stage
        t0 = time.perf_counter()
        if meter is not None:
            meter.begin(f"transform:{stage.stage}")
        if stage.layers:
            from paretolab.study.layered import apply_by_layer

            subject = apply_by_layer(method, subject, stage, ctx)
        else:
            subject = method.transform(subject, dict(stage.params), ctx)
        if not isinstance(subject, Subject):
            raise TypeError(f"method {stage.method!r}: transform() must return the Subject, got {type(subject).__name__}")
        after_stage(subject, stage.stage, method)  # an earlier stage's artefact no longer stores this model
        if base is not None and shared_tokenizer is not None:
            _guard_tokenizer(base, shared_tokenizer, f"method {stage.method!r}")
        stage_s[f"transform:{stage.stage}"] = time.perf_counter() - t0
        if meter is not None:
            meter.end(f"transform:{stage.stage}")
        cost = method.cost_of(dict(stage.params), subject)  # per trial: a saving may be real in one setting, simulated in another
        if cost not in ("real", "simulated"):
            raise TypeError(f"method {stage.method!r}: cost_of() must return 'real' or 'simulated', got {cost!r}")
        if cost == "simulated" and method.name not in subject.simulated_by:
            subject.simulated_by.append(method.name)
        if ctx.pruned_at is not None:  # the method returned early because the pruner said stop
            raise TrialPruned(ctx.pruned_at, subject)
    return subject, methods


def _take(metrics: dict[str, Any], owners: dict[str, str], method: Any, reported: Any, regs: Any, phase: str) -> None:
    """Add what a method's evaluate/measure returned, once ``check_method_metrics`` agreed it is the method's to report."""
    from paretolab.study.metric_owners import check_method_metrics

    reported = dict(reported or {})
    check_method_metrics(method, reported, owners, owner=regs.methods.owner(method.name) if method.name in regs.methods else "?",
                         phase=phase)
    metrics.update(reported)
    owners.update({k: f"method {method.name!r}" for k in reported})


def spent_so_far(subject: Subject | None, ctx: TrialContext) -> dict[str, float]:
    """What a pruned trial spent before it stopped: its training's counters (steps, tokens, FLOPs, last losses) and priced costs."""
    spent = dict(subject.training.metrics) if subject is not None and subject.training is not None else {}
    spent.update(ctx.costs.metrics())
    return {k: float(v) for k, v in spent.items() if isinstance(v, (int, float))}


def _guard_tokenizer(base: Subject, before: tuple[str, ...], culprit: str) -> None:
    """Fail the trial when the tokenizer every trial shares changed in place, after putting it back for the next trial."""
    if tokenizer_state(base.tokenizer) != before:
        base.restore_tokenizer()
        raise TrialError(
            f"{culprit} changed the shared tokenizer in place (e.g. add_tokens, pad_token); it was restored for the next trial. "
            "Change a copy instead: subject.tokenizer = copy.deepcopy(subject.tokenizer)"
        )


def _measures(configured: dict[str, dict[str, Any]] | None, regs: Any) -> dict[str, dict[str, Any]]:
    if configured is not None:
        return configured
    return {m.name: {} for m in regs.measures if getattr(m, "default", False)}


def _collect(paths: list[Path]) -> dict[str, bytes]:
    out = {}
    for path in paths:
        if path.is_file() and path.stat().st_size <= MAX_ARTIFACT_BYTES:
            out[path.name] = path.read_bytes()
    return out


def _shown(value: float) -> str:
    return "NaN" if math.isnan(value) else "+inf" if value > 0 else "-inf"


class TrialChildren:
    """The processes a trial starts, found and stopped at its end: the worker outlives its trials, their children must not.

    A trial's processes carry a token in their environment (``PARETOLAB_TRIAL``, set in this process for the trial and
    inherited by whatever it starts), so a daemon that double-forks away from the plugin that started it, re-parented
    to init, is found by the token (the way CI servers find a build's leftovers). Children the process had before the
    trial (and Python's own multiprocessing helpers) are left alone. No process-wide setting changes: a child
    subreaper would make every orphan of this process a zombie until reaped (a Ray worker's, a test runner's).
    """

    def __init__(self) -> None:
        import uuid

        import psutil

        self.me = psutil.Process()
        self.before = {_key(p) for p in self._children()}
        self.token = uuid.uuid4().hex
        self.previous = os.environ.get(TRIAL_TOKEN)
        os.environ[TRIAL_TOKEN] = self.token

    def _children(self) -> list[Any]:
        import psutil

        try:
            return self.me.children(recursive=True)
        except psutil.Error:
            return []

    def _marked(self) -> list[Any]:
        """This user's processes whose environment carries the trial's token (double-forked daemons included)."""
        import psutil

        found = []
        for proc in psutil.process_iter(["uids"]):
            try:
                if proc.pid == self.me.pid or proc.info["uids"] is None or proc.info["uids"].real != os.getuid():
                    continue
                if proc.environ().get(TRIAL_TOKEN) == self.token:
                    found.append(proc)
            except psutil.Error:
                continue
        return found

    def stop(self, grace: float = 3.0) -> str:
        """Stop (SIGTERM, then SIGKILL after ``grace`` s) every process the trial left; what was stopped, as one line ("" for none)."""
        import psutil

        if self.previous is None:
            os.environ.pop(TRIAL_TOKEN, None)
        else:
            os.environ[TRIAL_TOKEN] = self.previous
        left, said, seen = [], [], set()
        for proc in [*self._children(), *self._marked()]:
            if _key(proc) in self.before or proc.pid in seen:
                continue
            seen.add(proc.pid)
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:  # ended, not waited for: reaped below, not "left running"
                    _reap(proc)
                    continue
                cmd = _command(proc)
            except psutil.Error:
                continue
            if any(helper in cmd for helper in KEEP_CHILDREN):
                continue
            left.append(proc)
            said.append(f"{proc.pid} {cmd[:120]}")
        if not left:
            return ""
        for proc in left:
            _signal(proc, signal.SIGTERM)
        _, alive = psutil.wait_procs(left, timeout=grace)
        for proc in alive:
            _signal(proc, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=grace)
        for proc in left:
            _reap(proc)
        return f"stopped {len(left)} child process(es) the trial left: " + "; ".join(said)[:2000]


def _command(proc: Any) -> str:
    """The child's command line; a child caught inside its exec shows none for a moment, so it is read again briefly."""
    for _ in range(20):
        cmd = " ".join(proc.cmdline())
        if cmd:
            return cmd
        time.sleep(0.025)
    return proc.name()


def _key(proc: Any) -> tuple[int, float]:
    try:
        return proc.pid, proc.create_time()
    except Exception:  # noqa: BLE001 - gone already
        return proc.pid, 0.0


def _signal(proc: Any, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except Exception:  # noqa: BLE001 - it ended meanwhile
        pass


def _reap(proc: Any) -> None:
    """Collect an ended child's exit status (a zombie of ours otherwise stays in the process table)."""
    try:
        os.waitpid(proc.pid, os.WNOHANG)
    except OSError:  # not our child (psutil reaped it, or a grandchild re-parented elsewhere)
        pass


def sweep_trial_folders() -> None:
    """Remove the trial folders left in the temp folder by workers that were killed (a timed-out trial, SIGKILL)."""
    import psutil

    pattern = re.compile(rf"^{TRIAL_FOLDER}\d+-p(\d+)-")
    root = Path(tempfile.gettempdir())
    try:
        entries = list(root.iterdir())
    except OSError:
        return
    for entry in entries:
        found = pattern.match(entry.name)
        if found and int(found.group(1)) != os.getpid() and not psutil.pid_exists(int(found.group(1))):
            try:
                if entry.is_dir() and not entry.is_symlink() and entry.stat().st_uid == os.getuid():
                    shutil.rmtree(entry, ignore_errors=True)
            except OSError:
                pass

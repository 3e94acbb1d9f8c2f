"""The ``stage_energy`` measure: a staged pipeline's energy, time, tokens and FLOPs per stage, teacher stages included.

A trial's energy meter (:mod:`paretolab.energy`) already closes one window per stage: ``copy``,
``transform:<stage id>`` for every stage, ``evaluate`` and ``measure``, and these windows tile
the trial. This measure reads the finished ones back (``TrialContext.stage_energy_j`` /
``stage_s``) and names them by role: the teacher stage(s) (``teacher``, e.g. ``distill_kd``'s
logit caching or ``distill_sft``'s generation; absent or ``none`` in a no-teacher trial: 0), the
student's ``train`` stage(s) and the evaluation (the task's ``evaluate`` window). It adds the
teacher's tokens and FLOPs (recorded by the teacher stage), joules per token and the teacher's
share, and the two totals a frontier needs: energy with the teacher stages and without them.
On a CPU without RAPL every joule here is an *estimate* (CPU seconds × watts per core; the
trial's ``energy_source`` says which), and the metric descriptions say so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from paretolab import Metric, TrialContext, hookimpl
from paretolab.measure.measures import Measure
from paretolab.plugin_api.options import parse_options
from paretolab.plugin_api.subject import Subject

_EST = "(J: NVML, RAPL, or on a CPU without them an ESTIMATE from CPU seconds x watts per core; energy_source says which)"

METRICS = (
    Metric("teacher_energy_j", "J", "minimize", f"stage_energy: energy of the teacher stage(s): teacher load + logit caching or text generation {_EST}"),
    Metric("teacher_s", "s", "minimize", "stage_energy: wall time of the teacher stage(s)"),
    Metric("teacher_tokens", "tokens", "minimize", "stage_energy: tokens the teacher processed (KD: positions scored; SFT: prompt + generated)"),
    Metric("teacher_flops", "FLOPs", "minimize", "stage_energy: teacher FLOPs (FlopCounterMode over its forwards, attention counted)"),
    Metric("teacher_j_per_token", "J/token", "minimize", f"stage_energy: teacher_energy_j / teacher_tokens {_EST}"),
    Metric("student_energy_j", "J", "minimize", f"stage_energy: energy of the student's train stage(s), its evaluation points included {_EST}"),
    Metric("student_s", "s", "minimize", "stage_energy: wall time of the train stage(s)"),
    Metric("student_j_per_token", "J/token", "minimize", f"stage_energy: student_energy_j / train_tokens {_EST}"),
    Metric("eval_energy_j", "J", "minimize", f"stage_energy: energy of the evaluation stage (the task's evaluate window) {_EST}"),
    Metric("eval_s", "s", "minimize", "stage_energy: wall time of the evaluation stage"),
    Metric("pipeline_energy_j", "J", "minimize", f"stage_energy: teacher + student + evaluation energy: the pipeline's bill with the teacher {_EST}"),
    Metric("pipeline_s", "s", "minimize", "stage_energy: teacher + student + evaluation wall time"),
    Metric("student_side_energy_j", "J", "minimize", f"stage_energy: student + evaluation energy: the bill as studies usually report it, teacher left out {_EST}"),
    Metric("teacher_energy_share", "fraction", "minimize", f"stage_energy: teacher_energy_j / pipeline_energy_j {_EST}"),
)


@dataclass(frozen=True)
class StageEnergyOptions:
    teacher: str = "teacher"  # the stage id(s) whose energy is the teacher's, comma-separated
    train: str = "train"  # the stage id(s) of the student's training, comma-separated


def stage_sums(windows: dict[str, float], ids: str) -> float:
    """The sum of the ``transform:<id>`` windows for the comma-separated stage ``ids`` (0 for a stage that did not run)."""
    return sum(windows.get(f"transform:{i.strip()}", 0.0) for i in ids.split(",") if i.strip())


class StageEnergy(Measure):
    """Per-stage energy, time, tokens, FLOPs and J/token of a teacher → train → evaluate pipeline, read from the trial's meter."""

    name = "stage_energy"
    metrics = tuple(m.name for m in METRICS)
    options = StageEnergyOptions
    default = False

    def measure(self, subject: Subject, options: Any, ctx: TrialContext) -> dict[str, float]:
        if not isinstance(options, StageEnergyOptions):
            options = parse_options(StageEnergyOptions, options, where="measures.stage_energy")
        joules, seconds = ctx.stage_energy_j, ctx.stage_s
        teacher_j, student_j, eval_j = stage_sums(joules, options.teacher), stage_sums(joules, options.train), joules.get("evaluate", 0.0)
        teacher_tokens = float(subject.info.get("teacher_tokens", 0))
        train_tokens = float(subject.training.metrics.get("train_tokens", 0.0)) if subject.training is not None else 0.0
        pipeline_j = teacher_j + student_j + eval_j
        return {
            "teacher_energy_j": teacher_j,
            "teacher_s": stage_sums(seconds, options.teacher),
            "teacher_tokens": teacher_tokens,
            "teacher_flops": float(subject.info.get("teacher_flops", 0.0)),
            "teacher_j_per_token": teacher_j / teacher_tokens if teacher_tokens else 0.0,
            "student_energy_j": student_j,
            "student_s": stage_sums(seconds, options.train),
            "student_j_per_token": student_j / train_tokens if train_tokens else 0.0,
            "eval_energy_j": eval_j,
            "eval_s": seconds.get("evaluate", 0.0),
            "pipeline_energy_j": pipeline_j,
            "pipeline_s": stage_sums(seconds, options.teacher) + stage_sums(seconds, options.train) + seconds.get("evaluate", 0.0),
            "student_side_energy_j": student_j + eval_j,
            "teacher_energy_share": teacher_j / pipeline_j if pipeline_j > 0 else 0.0,
        }


@hookimpl
def register_measures(register: Callable[[Measure], None]) -> None:
    register(StageEnergy())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    for metric in METRICS:
        register(metric)

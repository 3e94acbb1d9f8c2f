"""Who owns a trial's numbers: the task its quality metrics, the platform size, params, energy and the trial's own
costs, a measure what it measured; a method only the metrics it declares (``Method.metrics``) that nobody else reported.

A method that reports ``ppl: 1.0`` or ``size_bytes: 1.0`` would otherwise overwrite the task's or the platform's
number and sit alone on the frontier; ``check_method_metrics`` fails the trial instead, naming plugin and metric.
The contract suite (``paretolab.testing``) holds a method to the same rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from paretolab.errors import PluginError
from paretolab.plugin_api.metrics import TRIAL_METRICS

# The quality numbers a task owns: a method that declares one of them still may not replace the task's value.
TASK_QUALITY: frozenset[str] = frozenset(f"{m}{suffix}" for m in ("ppl", "nll", "acc", "acc_norm", "exact_acc", "bpb", "val_loss", "val_bpb",
                                                                  "rmse", "log_loss", "sq_err")
                                         for suffix in ("", "_stderr", "_ci_low", "_ci_high"))

# The platform's own costs: measured the same way for every method, never a method's to report.
PLATFORM_METRICS: frozenset[str] = frozenset({"size_bytes", "param_count", "nonzero_params", "energy_j", "peak_gpu_mb", *TRIAL_METRICS})


def check_method_metrics(method: Any, reported: Mapping[str, Any], owners: Mapping[str, str], *, owner: str = "?",
                         phase: str = "measure") -> None:
    """Refuse what ``method``'s ``evaluate``/``measure`` (``phase``) returned where it is not the method's to report.

    ``owners``: metric -> who already reported it in this trial ("the task 'perplexity'", "the measure 'size'", ...).
    """
    declared = set(getattr(method, "metrics", ()) or ())
    where = f"method {method.name!r} (plugin {owner!r}), {phase}()"
    for name in reported:
        if name not in declared:
            raise PluginError(f"{where} reported metric {name!r}, which it does not declare; a method may report only "
                              f"its own metrics: add {name!r} to {type(method).__name__}.metrics (if it is the method's own number) or drop it")
        if name in PLATFORM_METRICS:
            raise PluginError(f"{where} reported metric {name!r}, which the platform measures for every trial; "
                              "a method may not replace it: report a metric of its own instead")
        if owners.get(name) == f"method {method.name!r}":
            continue  # the same method in two stages: its second report replaces its first
        if name in owners and owners[name].startswith("the task") and name not in TASK_QUALITY:
            continue  # a number the task read off this method's own generator (mean_accepted_len): the method's to refine
        if name in owners:
            who = owners[name]
            raise PluginError(f"{where} reported metric {name!r}, which {who} already reported in this trial; "
                              "a method may not replace it: report a metric of its own instead")


def ownership_problem(method: Any, reported: Mapping[str, Any], task: str = "perplexity") -> str | None:
    """The contract suite's form of the rule: why ``reported`` is not ``method``'s to report beside ``task``, or None."""
    from paretolab.plugin_api.manager import registries

    owners = {m: f"the task {task!r}" for m in registries().tasks.get(task).metrics}
    try:
        check_method_metrics(method, reported, owners, owner="under test")
    except PluginError as exc:
        return str(exc)
    return None

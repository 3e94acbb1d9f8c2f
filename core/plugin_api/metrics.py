"""Metric definitions: every number a trial reports is registered once, with unit and direction."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from paretolab.plugin_api.hookspec import hookimpl

Direction = Literal["minimize", "maximize"]


@dataclass(frozen=True)
class Metric:
    """One reported quantity.

    ``estimated`` is True when the number is computed from a model of the cost (e.g. bytes a
    format *would* take) rather than measured on a run; methods add to this per trial through
    their ``cost_is`` (see ``Method``).

    ``exact`` is True for a count or size the configuration fixes (bytes held, floats stored): the same on every
    replicate and free of example noise. A claim on it whose replicates agree reads as an exact effect
    ("held: −40.16 MiB on each of 3 seeds, deterministic") rather than "no variation observed".
    """

    name: str
    unit: str
    direction: Direction
    description: str
    estimated: bool = False
    exact: bool = False

    @property
    def bounds(self) -> tuple[float, float] | None:
        """The values the metric can take, when bounded: a fraction or an accuracy lies in [0, 1]."""
        return (0.0, 1.0) if self.unit in BOUNDED_UNITS else None

    def __post_init__(self) -> None:
        if self.direction not in ("minimize", "maximize"):
            raise ValueError(
                f"metric {self.name!r}: direction must be 'minimize' or 'maximize', got {self.direction!r}"
            )


BOUNDED_UNITS = ("fraction", "accuracy")  # units whose values lie in [0, 1]

# What run_trial and the driver report for every trial, whatever its methods (peak_gpu_mb only on a GPU).
TRIAL_METRICS: tuple[str, ...] = ("transform_s", "evaluate_s", "measure_s", "trial_s", "peak_rss_mb", "overhead_s", "energy_j")

# The core's own metrics. Plugins register theirs through the `register_metrics` hook.
BUILTIN_METRICS: tuple[Metric, ...] = (
    Metric("ppl", "", "minimize", "perplexity on the task's corpus (exp of mean token NLL)"),
    Metric("nll", "nats/token", "minimize", "mean negative log-likelihood per token"),
    Metric("acc", "fraction", "maximize", "accuracy (multiple choice: raw log-likelihood; generation: exact answer)"),
    Metric("acc_norm", "fraction", "maximize", "multiple-choice accuracy, length-normalised log-likelihood"),
    Metric("acc_stderr", "fraction", "minimize", "standard error of acc over the examples (lm-eval's formula: sample std / sqrt(n))"),
    Metric("acc_norm_stderr", "fraction", "minimize", "standard error of acc_norm over the examples (sample std / sqrt(n))"),
    Metric("n_examples", "examples", "maximize", "examples behind acc (and acc_norm): the sample size of the quality number"),
    Metric("ppl_ci_low", "", "minimize", "lower end of the 95% bootstrap interval of ppl over its windows"),
    Metric("ppl_ci_high", "", "minimize", "upper end of the 95% bootstrap interval of ppl over its windows"),
    Metric("n_windows", "windows", "maximize", "context windows behind ppl: the units its interval resamples"),
    Metric("param_count", "parameters", "minimize", "number of distinct parameters (tied weights once)"),
    Metric("nonzero_params", "parameters", "minimize", "parameters that are not exactly zero"),
    Metric("size_bytes", "bytes", "minimize", "bytes of the weights as stored by the methods' formats"),
    Metric("prefill_ms", "ms", "minimize", "latency measure: median forward pass over a fixed prompt; generation tasks: prefill wall time per example"),
    Metric("decode_tok_s", "tokens/s", "maximize", "latency measure: greedy decode at batch 1; generation tasks: generated tokens per second of decoding"),
    Metric("prefill_ms_iqr", "ms", "minimize", "latency measure: interquartile range of the repeated prefill times"),
    Metric("decode_tok_s_iqr", "tokens/s", "minimize", "latency measure: interquartile range of the repeated decode rates"),
    Metric("prefill_speedup", "x", "maximize", "latency measure: unmodified model's prefill time / the method's, median over rounds timed alternately in the same worker"),
    Metric("prefill_speedup_iqr", "x", "minimize", "latency measure: interquartile range of the per-round prefill speedups"),
    Metric("decode_speedup", "x", "maximize", "latency measure: unmodified model's decode time / the method's, median over rounds timed alternately in the same worker"),
    Metric("decode_speedup_iqr", "x", "minimize", "latency measure: interquartile range of the per-round decode speedups"),
    Metric("prefill_cpu_speedup", "x", "maximize", "latency measure (CPU): unmodified model's process CPU seconds / the method's over the same prefill rounds; blind to time spent waiting for a core"),
    Metric("decode_cpu_speedup", "x", "maximize", "latency measure (CPU): unmodified model's process CPU seconds / the method's over the same decode rounds"),
    Metric("base_prefill_ms", "ms", "minimize", "latency measure: median prefill time of the unmodified model, timed beside the method"),
    Metric("base_decode_tok_s", "tokens/s", "maximize", "latency measure: median decode rate of the unmodified model, timed beside the method"),
    Metric("timing_wait_s", "s", "minimize", "latency measure: seconds waited for the node's timing lock (other trials were timing)"),
    Metric("tokens_total", "tokens", "minimize", "tokens generated per example, every branch counted (generation tasks)"),
    Metric("tokens_sequential", "tokens", "minimize", "decode steps per example taken one after another: the latency proxy (generation tasks)"),
    Metric("peak_rss_mb", "MiB", "minimize", "peak resident memory of the worker during the trial"),
    Metric("energy_j", "J", "minimize", "energy of the trial inside the worker, copy to measure: NVML (its GPUs), RAPL (the CPU packages) or estimated from CPU seconds x watts per core; the trial's energy_source says which"),
    Metric("peak_gpu_mb", "MiB", "minimize", "peak GPU memory allocated during the trial"),
    Metric("transform_s", "s", "minimize", "wall time of all transform stages"),
    Metric("evaluate_s", "s", "minimize", "wall time of quality evaluation"),
    Metric("measure_s", "s", "minimize", "wall time of cost measurement"),
    Metric("trial_s", "s", "minimize", "wall time of the trial inside the worker, copy included"),
    Metric("overhead_s", "s", "minimize", "driver-seen trial wall time minus transform, evaluate and measure"),
)


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    """The core's own metric definitions (a built-in plugin like any other)."""
    for metric in BUILTIN_METRICS:
        register(metric)

"""One study as a Markdown section of a results document (``paretolab report``): what ran, its claim's verdict, its
frontiers, and the method-vs-baseline table with intervals, size ratios and honest marks (simulated, noisy, estimated).
Under the pipeline's ``constraints:`` the frontiers are over the feasible trials; the section states the bounds and
names the infeasible trials it leaves off, with why."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from typing import Any

import optuna

from paretolab.data.names import markdown_text, printable
from paretolab.measure.energy import DEFAULT_WATTS_PER_CORE, is_energy_metric
from paretolab.plugin_api.manager import registries
from paretolab.plugin_api.numbers import RATIO, metric_value, number, param_value
from paretolab.results.claims import claims_lines, trial_label
from paretolab.results.layout import best_first, decision_tables, marked_verdicts, unmarked
from paretolab.results.metric_facts import chance_levels, metric_bounds, metric_exact
from paretolab.results.engines import engine_lines
from paretolab.results.frontier import CONSTRAINTS, frontier_lines
from paretolab.results.noise import QUALITY, quality_cells
from paretolab.results.replicates import baseline_finder, named_params, report_replicates
from paretolab.results.read import (
    load_study,
    per_method,
    study_quality_note,
    trial_table,
)
from paretolab.results.source import Source, source_of
from paretolab.stores.locations import Stores
from paretolab.study.constraints import REASON, reason_text
from paretolab.study.report_spec import claims_from


def study_section(name: str, stores: Stores | Source, metrics: list[str], *, frontier: bool = True, figure: str = "") -> str:
    """One study as Markdown: what ran (model, task, trial counts) and the method-vs-baseline table.

    Metric columns that no trial reported are left out. When the study has an unmodified-model
    trial (method ``none``), each row's first objective is also given relative to it.
    """
    stores = source_of(stores)  # one source for every read below (its per-example scores are fetched once)
    study = load_study(name, stores)
    objectives, rows = trial_table(name, stores)
    states = [t.state for t in study.get_trials(deepcopy=False)]
    pipeline = study.user_attrs.get("pipeline") or {}
    task = pipeline.get("task", "")
    if isinstance(task, dict):
        task = f"{task.get('name', '')} ({', '.join(f'{k}={v}' for k, v in task.items() if k != 'name')})"
    failed = sum(s == optuna.trial.TrialState.FAIL for s in states)
    pruned = sum(s == optuna.trial.TrialState.PRUNED for s in states)
    constraints = [reason_text(c) for c in study.user_attrs.get(CONSTRAINTS) or []]
    feasible = [r for r in rows if r.get("feasible", True)]
    lines = [
        f"## {markdown_text(name)}",  # a name from a store or a bundle: one heading, whatever it holds
        "",
        *_papers_claim(pipeline),
        *_claim(pipeline, rows, stores),
        *constraint_lines(constraints, objectives, rows, frontier=frontier),
        *_frontiers(pipeline, feasible),
        *([figure, ""] if figure else []),  # the study's frontier drawn (a results document's picture)
        f"Model `{study.user_attrs.get('model', '?')}`, task {task}; objectives "
        + ", ".join(f"{m} ({d})" for m, d in objectives)
        + f"; {len(rows)} complete trial(s), {failed} failed" + _why_failed(study) + (f", {pruned} pruned (stopped early by the study's pruner)" if pruned else "") + ".",
        "",
        *_ran(name, stores, study),
        *_time_capped(stores.trial_runs(name)),
        *_provenance(rows),
        *_trained_base(stores.trained_base(str(study.user_attrs.get("model", "")))),
    ]
    note = study_quality_note(name, stores)
    if note:
        lines += [f"> **{note}.**", ""]
    if not rows:
        return printable("\n".join([*lines, "No complete trials yet.", ""]), lines=True)
    shown = best_first(per_method(objectives, rows, frontier=frontier, replicates=report_replicates(pipeline)), objectives)
    wanted = dict.fromkeys([*(m for m, _ in objectives), *metrics])  # the study's objectives always, first
    columns = ["method", "params", *[m for m in wanted if any(m in r for r in shown)]]
    first = objectives[0][0]
    replicates = report_replicates(pipeline)
    baseline_of = baseline_finder(rows, replicates)
    if any(r["method"] == "none" for r in rows) and first != "size_bytes":  # sizes get their own ratios, against the stored and the fp16 base
        ratio = f"{first} ÷ none"
        for r in shown:  # against the none trial of the row's own replicate
            base = baseline_of(r)
            if isinstance(base, dict) and isinstance(base.get(first), (int, float)) and base[first]:
                r[ratio] = r[first] / base[first]
        columns.insert(columns.index(first) + 1 if first in columns else len(columns), ratio)
    engines = engine_lines(rows, baseline_of, markdown_table)  # before the cells below turn numbers into text
    named = _pipeline_params(pipeline)
    for r in shown:
        # what the pipeline set, fixed or searched (Optuna knows only the searched ones)
        given = {f"{m}.{k}": v for key, v in r["run_params"].items() if key.count(".") == 2
                 for _, m, k in [key.split(".")] if k in named.get(m, ()) or "/" in k}  # k/GROUP: a per-layer group's value
        r["params"] = given or r["params"]
        r["cost"] = f"simulated ({r['simulated_by']})" if r.get("simulated_by") else "real"
    columns = _size_ratios(shown, columns)
    notes = _marks(shown, columns)
    columns, legend = _with_uncertainty(shown, columns, stores, replicates, baseline_of)
    if any(not r.get("feasible", True) for r in shown):  # every trial shown (--trials all): the infeasible ones marked
        for r in shown:
            r[INFEASIBLE] = "" if r.get("feasible", True) else f"✗ {r.get(REASON) or 'no reason recorded'}"
        columns.append(INFEASIBLE)
    # a study that served its trials by engines leads with them (their ratios against none); every trial's row follows
    lines += [*engines, *(["### Every trial", ""] if engines else []), *decision_tables(shown, [*columns, "cost", "trial"], objectives, markdown_table, ("cost", "trial", INFEASIBLE)), *notes, *legend,
              *_base_timings(rows)]
    return printable("\n".join(lines), lines=True)  # whatever a store or a bundle held: no terminal escape in the document


INFEASIBLE = "infeasible because"


def constraint_lines(constraints: list[str], objectives: list[tuple[str, str]], rows: list[dict[str, Any]], *, frontier: bool) -> list[str]:
    """The pipeline's bounds, that frontiers are drawn over the trials meeting them, and the infeasible trials the
    table leaves off (those on their method's frontier without the constraints) with why; nothing without constraints."""
    if not constraints:
        return []
    bad = [r for r in rows if not r.get("feasible", True)]
    text = (f"**Constraints:** {'; '.join(f'`{c}`' for c in constraints)}. Frontiers are drawn over the feasible trials only; "
            f"{len(bad)} of {len(rows)} complete trial(s) break a bound.")
    if frontier and bad:
        would = {r["trial"] for r in per_method(objectives, [{**r, "feasible": True} for r in rows], frontier=True)}  # per trial: a bound breaks draws
        left = [r for r in bad if r["trial"] in would]
        if left:
            text += " Left off as infeasible (on their method's frontier without the constraints): " + "; ".join(
                f"✗ trial {r['trial']} ({markdown_text(r['method'])}): {markdown_text(r.get(REASON) or 'no reason recorded')}" for r in left) + "."
    elif bad:
        text += f" The `{INFEASIBLE}` column marks them (✗)."
    return [text, ""]


def _ran(name: str, source: Source, study: optuna.Study) -> list[str]:
    """When the trials ran, with which paretolab and on which machine, as the trials recorded it."""
    from paretolab.results.bundle import run_provenance

    dates = [d.isoformat() for t in study.get_trials(deepcopy=False) for d in (t.datetime_start, t.datetime_complete) if d is not None]
    prov = run_provenance(dates, list(source.trial_runs(name).values()), study.user_attrs.get("model"))
    if not prov["trials_from"]:
        return []
    code = ", ".join(prov["code_versions"]) or "a paretolab that did not record its version"
    machine = "; ".join(prov["machines"]) or "a machine the trials did not record"
    load = prov["load_1m"]
    busy = f" (1-min load average median {load['median']:.1f}, max {load['max']:.1f})" if load else ""
    return [f"Ran {prov['trials_from'][:16].replace('T', ' ')} – {prov['trials_to'][:16].replace('T', ' ')} UTC with paretolab {code} on {machine}{busy}.", ""]


def _time_capped(runs: dict[int, Any]) -> list[str]:
    """Trials whose training stopped on the wall clock (``max_minutes``, the trial timeout) before its token or FLOP budget.

    Their training is as long as the machine was fast, so a comparison with them rests on the machine and its load.
    """
    capped = sorted(n for n, run in runs.items() if run.data.params.get("info.train_stopped_by") in ("max_minutes", "trial_timeout"))
    if not capped:
        return []
    return [f"> **Stopped by the clock:** trial(s) {', '.join(map(str, capped))} of {len(runs)} ended their training on "
            "`max_minutes` or the trial timeout before their token budget (see `train_tokens`): they trained less than "
            "asked, by as much as the machine was slow or busy, and comparisons with them rest on it. Rerun on an idle "
            "machine or raise `max_minutes`.", ""]


def _why_failed(study: optuna.Study) -> str:
    """The failed trials' reasons as the driver recorded them, e.g. `` (1 interrupted: Ctrl-C ...)``; empty when none failed."""
    from paretolab.results.read import failure_reasons

    reasons = failure_reasons(study.get_trials(deepcopy=False))
    return f" ({'; '.join(f'{count}× {markdown_text(reason)}' for reason, count in reasons)})" if reasons else ""


def _papers_claim(pipeline: dict[str, Any]) -> list[str]:
    """The pipeline's ``description`` (what the paper claims and against which baselines), when it has one."""
    text = " ".join(str(pipeline.get("description") or "").split())
    return [f"**The paper:** {text}", ""] if text else []


def _trained_base(found: tuple[str, Any] | None) -> list[str]:
    """For a base trained here (``train.save_as``): how, from its ``paretolab.json`` (the source's: the bundle's copy)."""
    if found is None:
        return []
    model, record = found
    if not isinstance(record, dict):
        return []
    loss = record.get("val_loss")
    loss_text = f", val_loss {number(loss)} nats/token on {record.get('val_corpus', '?')}" if isinstance(loss, (int, float)) else ""
    return [f"Base `{model}`: {record.get('weights', '?')}, from `{record.get('base', '?')}` on {number(int(record.get('tokens') or 0))} tokens of "
            f"{record.get('corpus', '?')} (seed {record.get('seed', '?')}){loss_text}; saved {record.get('saved_at', '?')}.", ""]


def _claim(pipeline: dict[str, Any], rows: list[dict[str, Any]], source: Source) -> list[str]:
    """The pipeline's claims with their verdicts from the stored trials (nothing when it has none)."""
    metrics = registries().metrics
    claims = claims_from(pipeline, {m.name: m.direction for m in metrics})
    if not claims:
        return []
    return marked_verdicts(claims_lines(claims, claim_trials(pipeline, rows), source.curves(), source.per_example(), metric_bounds,
                                        chance_levels(pipeline, source), metric_exact))


def verdict_summary(name: str, stores: Stores | Source) -> list[str]:
    """The study's claims and their verdicts as plain lines (what `run` prints after the frontier); [] without claims."""
    source = source_of(stores)
    pipeline = load_study(name, source).user_attrs.get("pipeline") or {}
    _, rows = trial_table(name, source)
    out = []
    for line in map(unmarked, _claim(pipeline, rows, source)):
        if line.startswith(("**Claim:**", "**Verdict", "**Holm")):
            out.append(line.replace("**", ""))
    return out


def claim_trials(pipeline: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trial rows as claims read them: each with its arm's label and its parameters by name."""
    return [{**r, "label": _choice_label(pipeline, r), "params": named_params(r)} for r in rows]


def _frontiers(pipeline: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """The pipeline's ``frontiers:``: which methods sit on each metric pair's frontier, all trials pooled (nothing when it has none)."""
    pairs = pipeline.get("frontiers") or []
    metrics = registries().metrics
    directions = {m: metrics.get(m).direction for pair in pairs for m in pair if m in metrics}
    usable = [pair for pair in pairs if all(m in directions for m in pair)]
    return frontier_lines(usable, [{**r, "label": _choice_label(pipeline, r)} for r in rows], directions, report_replicates(pipeline))


def _choice_label(pipeline: dict[str, Any], row: dict[str, Any]) -> str:
    """What the trial's ``choice`` stages picked (``bhyt``, ``none``, ``magnitude+rtn``); fixed stages left out."""
    picked = {}
    for index, stage in enumerate(pipeline.get("stages") or []):
        if isinstance(stage, dict) and "choice" in stage:
            key = f"{stage.get('id', f'stage{index}')}.method"
            picked[key] = str(row["run_params"].get(key) or row["params"].get(key) or "none")
    return trial_label(picked)


# A timing whose interquartile range exceeds this fraction of its median is too noisy to rank
# trials by: two such timings may swap order on a rerun.
NOISY_SPREAD = 0.2


TIMINGS = {"prefill_speedup": "prefill_speedup_iqr", "decode_speedup": "decode_speedup_iqr",
           "prefill_ms": "prefill_ms_iqr", "decode_tok_s": "decode_tok_s_iqr"}


ENERGY_SOURCE = "info.energy_source"


def _provenance(rows: list[dict[str, Any]]) -> list[str]:
    """The base model's weights and sizes, and where energy figures come from, as read from the trials' runs."""
    params = next((r["run_params"] for r in rows if r.get("run_params", {}).get("info.weights")), None)
    lines = []
    if params:
        stored, fp16 = _float(params.get("info.base_stored_bytes")), _float(params.get("info.base_fp16_bytes"))
        sizes = f"; stored {number(stored, 'bytes')}, {number(fp16, 'bytes')} in fp16" if stored and fp16 else ""
        lines.append(f"Base weights: **{params['info.weights']}**{sizes}. Sizes are given against both "
                     "(`size ÷ stored base`, `size ÷ fp16 base`), never against the fp32 they are computed in.")
    sources = sorted({r.get("run_params", {}).get(ENERGY_SOURCE, "") for r in rows} - {""})
    if sources:
        how = {"nvml": "NVML (the trial's GPUs)", "rapl": "RAPL (the CPU packages)",
               "estimate": f"an estimate: CPU seconds × watts per core (default {DEFAULT_WATTS_PER_CORE} W), marked ≈"}
        lines.append("Energy: " + "; ".join(how.get(src, src) for src in sources) + ".")
    return [*lines, ""] if lines else []


BASE_TIMINGS = {"base_prefill_ms": "prefill", "base_decode_tok_s": "decode"}


def _base_timings(rows: list[dict[str, Any]]) -> list[str]:
    """How much the unmodified model's own timings, taken beside every trial, moved across the study.

    The speedup columns divide by these, so this is the noise a raw time would have carried: a
    reader sees why the table leads with ratios rather than milliseconds.
    """
    lines = []
    for metric, label in BASE_TIMINGS.items():
        values = sorted(v for r in rows if isinstance(v := r.get(metric), float))
        if len(values) < 2:
            continue
        median = statistics.median(values)
        lines.append(
            f"The unmodified model, timed beside each of {len(values)} trials ({label}, `{metric}`): median {_cell(median, metric)}, "
            f"range {_cell(values[0], metric)}–{_cell(values[-1], metric)} (max ÷ min {number(values[-1] / values[0], RATIO)}); "
            "the speedup columns divide each trial's time by the one taken beside it."
        )
    return [*lines, ""] if lines else []


def _size_ratios(rows: list[dict[str, Any]], columns: list[str]) -> list[str]:
    """Add ``size ÷ stored base`` and ``size ÷ fp16 base`` after ``size_bytes`` where the trials know their base."""
    if "size_bytes" not in columns:
        return columns
    added = []
    for r in rows:
        for label, key in (("size ÷ stored base", "info.base_stored_bytes"), ("size ÷ fp16 base", "info.base_fp16_bytes")):
            base = _float(r.get("run_params", {}).get(key))
            if base and isinstance(r.get("size_bytes"), float):
                r[label] = r["size_bytes"] / base
                added.append(label)
    at = columns.index("size_bytes") + 1
    return columns[:at] + [c for c in ("size ÷ stored base", "size ÷ fp16 base") if c in added] + columns[at:]


def _marks(rows: list[dict[str, Any]], columns: list[str]) -> list[str]:
    """Mark timings too noisy to rank (†) and estimated energies (≈) in place; the notes that explain them."""
    noisy = estimated = False
    for r in rows:
        for column, iqr in TIMINGS.items():
            value, spread = r.get(column), r.get(iqr)
            if column in columns and isinstance(value, float) and isinstance(spread, float) and value and spread / abs(value) > NOISY_SPREAD:
                r[column] = f"{_cell(value, column)} †"
                noisy = True
        if r.get("run_params", {}).get(ENERGY_SOURCE) == "estimate":
            for column in columns:
                if is_energy_metric(column) and isinstance(r.get(column), float):
                    r[column] = f"≈{_cell(r[column], column)}"
                    estimated = True
    notes = []
    if noisy:
        notes.append(f"† spread too large to rank: the timing's interquartile range is over {NOISY_SPREAD:.0%} of its median.")
    if estimated:
        notes.append("≈ energy estimated from CPU time (no NVML or RAPL reading on that machine).")
    return [*notes, ""] if notes else []


def _float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _with_uncertainty(shown: list[dict[str, Any]], columns: list[str], source: Source, replicates: tuple[str, ...],
                      baseline_of: Callable[[dict[str, Any]], Any]) -> tuple[list[str], list[str]]:
    """Quality cells with their interval, a paired difference to the unmodified model and the sample size."""
    quality = [c for c in columns if c in QUALITY]
    if not quality:
        return columns, []
    added = quality_cells(shown, baseline_of, quality, source.per_example())
    out = list(columns)
    for column in added:  # each difference right after its metric
        metric = column[1:].split(" ", 1)[0]
        out.insert(out.index(metric) + 1, column)
    if any(r.get("n") for r in shown):
        out.append("n")
    legend = [
        "Quality: value ± 1 standard error (lm-eval's formula), or a 95 % bootstrap interval over the windows for ppl. "
        f"Δ … vs none: difference to the unmodified model's trial of the same replicate ({', '.join(replicates)}) with its 95 % "
        "interval, paired over the same examples or windows (*unpaired* where no such trial exists); *within noise* when "
        "that interval contains 0. n: the examples or windows behind the quality numbers.",
        "",
    ]
    return out, legend


def _pipeline_params(pipeline: dict[str, Any]) -> dict[str, set[str]]:
    """{method: parameter names the pipeline's stages give it}."""
    named: dict[str, set[str]] = {}
    for stage in pipeline.get("stages", []):
        for option in stage.get("choice", [stage]) if isinstance(stage, dict) else []:
            if isinstance(option, dict) and "method" in option:
                named.setdefault(option["method"], set()).update((option.get("params") or {}).keys())
    return named


def markdown_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A GitHub-flavoured Markdown table; numbers to 4 significant digits; each cell one line and one column, whatever
    text it holds (``paretolab.data.names.markdown_text``)."""
    lines = ["| " + " | ".join(markdown_text(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(markdown_text(_cell(row.get(c), c)) for c in columns) + " |")
    return "\n".join(lines)


def _cell(value: Any, column: str = "") -> str:
    """A table cell: a float as the metric ``column`` is written everywhere (``plugin_api.numbers``), params as k=v."""
    if isinstance(value, float):
        return metric_value(column, value)
    if isinstance(value, dict):
        return ", ".join(f"{k.split('.', 1)[-1]}={param_value(v)}" for k, v in value.items() if not k.endswith(".method"))
    return "" if value is None else str(value)

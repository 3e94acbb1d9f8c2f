"""Reading studies back: frontiers and summaries (used by the CLI; the dashboard has its own cache)."""

from __future__ import annotations

import datetime as dt
import json
import statistics
from collections import Counter
from collections.abc import Iterable
from typing import Any

import optuna

from paretolab.energy import is_energy_metric
from paretolab.errors import ConfigError
from paretolab.frontier import pareto_indices
from paretolab.stores import Stores


def load_study(name: str, stores: Stores) -> optuna.Study:
    """Study ``name``, read only: a missing store is an error, never created."""
    from paretolab.store_open import guarded, optuna_storage

    from paretolab.store_open import exists, sqlite_file

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if not exists(stores.optuna_url):
        raise ConfigError(f"no study {name!r}: nothing has run with these stores yet (no {sqlite_file(stores.optuna_url)}); "
                          "check --home / --storage, or run its pipeline first")
    storage = optuna_storage(stores, create=False)
    try:
        return guarded("Optuna", stores.optuna_url, lambda: optuna.load_study(study_name=name, storage=storage))
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
        import difflib

        close = difflib.get_close_matches(name, names, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"no study {name!r} in {stores.redacted().optuna_url}{hint} (studies: {', '.join(names) or 'none'})") from None


def frontier_rows(name: str, stores: Stores) -> list[dict[str, Any]]:
    """The non-dominated complete trials with their objective values and parameters."""
    study = load_study(name, stores)
    objectives = study.user_attrs.get("objectives") or [[f"objective{i}", d.name.lower()] for i, d in enumerate(study.directions)]
    trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    front = pareto_indices([t.values for t in trials], [d for _, d in objectives])
    rows = []
    for i in sorted(front, key=lambda i: trials[i].values[0]):
        t = trials[i]
        row: dict[str, Any] = {"trial": t.number}
        row.update({metric: value for (metric, _), value in zip(objectives, t.values)})
        row["params"] = dict(t.params)
        row["mlflow_run_id"] = t.user_attrs.get("mlflow_run_id", "")
        rows.append(row)
    _mark_noise(rows, [m for m, _ in objectives], stores)
    return rows


def study_quality_note(name: str, stores: Stores) -> str:
    """The warning for a study whose model makes its quality numbers meaningless (tiny-llama), or ""."""
    from paretolab.models import quality_note

    attrs = load_study(name, stores).user_attrs
    return quality_note(str(attrs.get("model", "")), attrs.get("pipeline") or {})


def _mark_noise(rows: list[dict[str, Any]], objectives: list[str], stores: Stores) -> None:
    """``row["noise"]``: frontier neighbours whose quality objective is within noise of this row's."""
    from paretolab.noise import QUALITY, artifact_reader, mark_indistinguishable

    quality = [m for m in objectives if m in QUALITY]
    if not quality or len(rows) < 2:
        return
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=stores.tracking_uri)
    views = []
    for row in rows:
        try:  # the logged intervals, for trials without per-example scores
            logged = dict(client.get_run(row["mlflow_run_id"]).data.metrics) if row["mlflow_run_id"] else {}
        except Exception:
            logged = {}
        views.append({**logged, **{k: v for k, v in row.items() if k != "params"}, "run_id": row["mlflow_run_id"]})
    mark_indistinguishable(views, quality, artifact_reader(stores.tracking_uri))
    for row, view in zip(rows, views):
        row["noise"] = view["noise"]


def print_frontier(name: str, rows: list[dict[str, Any]]) -> None:
    if not rows:
        print(f"study {name!r} has no completed trials yet")
        return
    metrics = [k for k in rows[0] if k not in ("trial", "params", "mlflow_run_id", "noise")]
    print(f"Pareto set of study {name!r} ({len(rows)} trial(s)):")
    noise = ["within noise of"] if any(r.get("noise") for r in rows) else []
    header = ["trial", *metrics, *noise, "params"]
    lines = [[str(r["trial"]), *(_num(r[m]) for m in metrics), *([r.get("noise", "")] if noise else []), _params(r["params"])] for r in rows]
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for line in lines:
        print("  ".join(v.ljust(w) for v, w in zip(line, widths)))


def study_summaries(stores: Stores) -> list[dict[str, Any]]:
    from paretolab.store_open import exists, guarded, optuna_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if not exists(stores.optuna_url):
        return []  # nothing has run with these stores: nothing to list, and nothing is created
    storage = optuna_storage(stores, create=False)
    out = []
    for summary in guarded("Optuna", stores.optuna_url, lambda: optuna.get_all_study_summaries(storage, include_best_trial=False)):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        trials = study.get_trials(deepcopy=False)
        count = {s: sum(1 for t in trials if t.state == s) for s in optuna.trial.TrialState}
        last = max((t.datetime_complete or t.datetime_start for t in trials if t.datetime_start), default=None)
        out.append({
            "study": summary.study_name,
            "complete": count[optuna.trial.TrialState.COMPLETE],
            "failed": count[optuna.trial.TrialState.FAIL],
            "running": count[optuna.trial.TrialState.RUNNING],
            "objectives": ",".join(m for m, _ in study.user_attrs.get("objectives", [])),
            "last_update": last.isoformat(timespec="seconds") if isinstance(last, dt.datetime) else "",
            "failures": failure_reasons(trials),
        })
    return out


def failure_reasons(trials: Iterable[optuna.trial.FrozenTrial]) -> list[tuple[str, int]]:
    """(reason, count) over the failed trials, most frequent first; a reason is the first line the driver recorded."""
    reasons = Counter(
        ((t.user_attrs.get("fail_reason") or "").strip().splitlines() or ["no reason recorded"])[0][:200]
        for t in trials
        if t.state == optuna.trial.TrialState.FAIL
    )
    return reasons.most_common()


def print_failures(name: str, reasons: list[tuple[str, int]]) -> None:
    """One line per reason, with how many failed trials gave it."""
    if reasons:
        print(f"failed trials of {name!r} by reason:")
        for reason, count in reasons:
            print(f"  {count:>4} x {reason}")


def _num(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.5g}"
    return str(value)


def _params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={_num(v)}" for k, v in params.items())


def trial_table(name: str, stores: Stores) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
    """(objectives, rows): every complete trial with its method label and all MLflow metrics."""
    from mlflow.tracking import MlflowClient

    study = load_study(name, stores)
    objectives = [tuple(o) for o in study.user_attrs.get("objectives", [])]
    from paretolab.store_open import exists, guarded

    experiment = None
    if exists(stores.tracking_uri):
        client = guarded("MLflow", stores.tracking_uri, lambda: MlflowClient(tracking_uri=stores.tracking_uri))
        experiment = guarded("MLflow", stores.tracking_uri, lambda: client.get_experiment_by_name(name))
    runs = {}
    if experiment is not None:
        for run in client.search_runs([experiment.experiment_id], "tags.`paretolab.role` = 'trial'", max_results=50_000):
            runs[int(run.data.tags["paretolab.trial_number"])] = run
    rows = []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        run = runs.get(trial.number)
        metrics = dict(run.data.metrics) if run else {}
        metrics.update({m: v for (m, _), v in zip(objectives, trial.values)})
        rows.append({"trial": trial.number, "run_id": run.info.run_id if run else "", "method": method_label(run.data.params if run else {}), "params": dict(trial.params),
                     "run_params": dict(run.data.params) if run else {}, **metrics,
                     "simulated_by": run.data.tags.get("paretolab.simulated_by", "") if run else ""})
    return objectives, _without_common_training(rows)


def _without_common_training(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop ``train`` from the labels when every trial trained: the baseline is then the model trained
    with no method, labelled ``none`` like the unmodified model of a compression study."""
    if rows and all("train" in r["method"].split("+") for r in rows):
        for r in rows:
            r["method"] = "+".join(m for m in r["method"].split("+") if m != "train") or "none"
    return rows


def method_label(params: dict[str, str]) -> str:
    """'wanda+rtn' for a trial that ran wanda then rtn; 'none' for the unmodified model."""
    methods = [v for k, v in sorted(params.items()) if k.endswith(".method") and k.count(".") == 1 and v != "none"]
    return "+".join(methods) or "none"


def method_frontiers(name: str, stores: Stores) -> list[dict[str, Any]]:
    """Each method's own Pareto set on the study's objectives: the cross-method comparison."""
    return _per_method(*trial_table(name, stores), frontier=True)


def _per_method(objectives: list[tuple[str, str]], rows: list[dict[str, Any]], *, frontier: bool) -> list[dict[str, Any]]:
    """Rows grouped by method (sorted by the last objective); only each method's Pareto set when ``frontier``."""
    directions = [d for _, d in objectives]
    out = []
    for label in sorted({r["method"] for r in rows}):
        mine = [r for r in rows if r["method"] == label]
        keep = pareto_indices([[r[m] for m, _ in objectives] for r in mine], directions) if frontier else range(len(mine))
        out.extend(sorted((mine[i] for i in keep), key=lambda r: (r[objectives[-1][0]], r[objectives[0][0]])))
    return out


def study_section(name: str, stores: Stores, metrics: list[str], *, frontier: bool = True) -> str:
    """One study as Markdown: what ran (model, task, trial counts) and the method-vs-baseline table.

    Metric columns that no trial reported are left out. When the study has an unmodified-model
    trial (method ``none``), each row's first objective is also given relative to it.
    """
    study = load_study(name, stores)
    objectives, rows = trial_table(name, stores)
    states = [t.state for t in study.get_trials(deepcopy=False)]
    pipeline = study.user_attrs.get("pipeline") or {}
    task = pipeline.get("task", "")
    if isinstance(task, dict):
        task = f"{task.get('name', '')} ({', '.join(f'{k}={v}' for k, v in task.items() if k != 'name')})"
    failed = sum(s == optuna.trial.TrialState.FAIL for s in states)
    lines = [
        f"## {name}",
        "",
        *_papers_claim(pipeline),
        *_claim(pipeline, rows, stores),
        *_frontiers(pipeline, rows),
        f"Model `{study.user_attrs.get('model', '?')}`, task {task}; objectives "
        + ", ".join(f"{m} ({d})" for m, d in objectives)
        + f"; {len(rows)} complete trial(s), {failed} failed.",
        "",
        *_provenance(rows),
        *_trained_base(str(study.user_attrs.get("model", ""))),
    ]
    note = study_quality_note(name, stores)
    if note:
        lines += [f"> **{note}.**", ""]
    if not rows:
        return "\n".join([*lines, "No complete trials yet.", ""])
    shown = _per_method(objectives, rows, frontier=frontier)
    wanted = dict.fromkeys([*(m for m, _ in objectives), *metrics])  # the study's objectives always, first
    columns = ["method", "params", *[m for m in wanted if any(m in r for r in shown)]]
    first = objectives[0][0]
    dense = [r[first] for r in rows if r["method"] == "none"]
    if dense and dense[0] and first != "size_bytes":  # sizes get their own ratios, against the stored and the fp16 base
        ratio = f"{first} ÷ none"
        for r in shown:
            r[ratio] = r[first] / dense[0]
        columns.insert(columns.index(first) + 1 if first in columns else len(columns), ratio)
    named = _pipeline_params(pipeline)
    for r in shown:
        # what the pipeline set, fixed or searched (Optuna knows only the searched ones)
        given = {f"{m}.{k}": v for key, v in r["run_params"].items() if key.count(".") == 2
                 for _, m, k in [key.split(".")] if k in named.get(m, ())}
        r["params"] = given or r["params"]
        r["cost"] = f"simulated ({r['simulated_by']})" if r.get("simulated_by") else "real"
    columns = _size_ratios(shown, columns)
    notes = _marks(shown, columns)
    columns, legend = _with_uncertainty(shown, rows, columns, stores)
    lines += [markdown_table(shown, [*columns, "cost", "trial"]), "", *notes, *legend, *_base_timings(rows)]
    return "\n".join(lines)


def _papers_claim(pipeline: dict[str, Any]) -> list[str]:
    """The pipeline's ``description`` (what the paper claims and against which baselines), when it has one."""
    text = " ".join(str(pipeline.get("description") or "").split())
    return [f"**The paper:** {text}", ""] if text else []


def _trained_base(model: str) -> list[str]:
    """For a base trained here (``train.save_as``): how, from its ``paretolab.json`` on this machine."""
    from paretolab.training.checkpoints import RECORD, trained_dir

    try:
        record = json.loads((trained_dir() / model / RECORD).read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(record, dict):
        return []
    loss = record.get("val_loss")
    loss_text = f", val_loss {loss:.3f} nats/token on {record.get('val_corpus', '?')}" if isinstance(loss, (int, float)) else ""
    return [f"Base `{model}`: {record.get('weights', '?')}, from `{record.get('base', '?')}` on {int(record.get('tokens') or 0):,} tokens of "
            f"{record.get('corpus', '?')} (seed {record.get('seed', '?')}){loss_text}; saved {record.get('saved_at', '?')}.", ""]


def _claim(pipeline: dict[str, Any], rows: list[dict[str, Any]], stores: Stores) -> list[str]:
    """The pipeline's claim with its verdict from the stored trials (nothing when it has none)."""
    from paretolab.claims import claim_from, claim_lines
    from paretolab.noise import artifact_reader
    from paretolab.training.curves import mlflow_reader

    claim = claim_from(pipeline.get("claim"))
    if claim is None:
        return []
    trials = [{**r, "label": _choice_label(pipeline, r), "params": _named_params(r)} for r in rows]
    return claim_lines(claim, trials, mlflow_reader(stores.tracking_uri), artifact_reader(stores.tracking_uri))


def _frontiers(pipeline: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """The pipeline's ``frontiers:``: which methods sit on each metric pair's frontier, all trials pooled (nothing when it has none)."""
    from paretolab.frontier import frontier_lines
    from paretolab.plugin_manager import registries

    pairs = pipeline.get("frontiers") or []
    metrics = registries().metrics
    directions = {m: metrics.get(m).direction for pair in pairs for m in pair if m in metrics}
    usable = [pair for pair in pairs if all(m in directions for m in pair)]
    return frontier_lines(usable, [{**r, "label": _choice_label(pipeline, r)} for r in rows], directions)


def _choice_label(pipeline: dict[str, Any], row: dict[str, Any]) -> str:
    """What the trial's ``choice`` stages picked (``bhyt``, ``none``, ``magnitude+rtn``); fixed stages left out."""
    from paretolab.claims import trial_label

    picked = {}
    for index, stage in enumerate(pipeline.get("stages") or []):
        if isinstance(stage, dict) and "choice" in stage:
            key = f"{stage.get('id', f'stage{index}')}.method"
            picked[key] = str(row["run_params"].get(key) or row["params"].get(key) or "none")
    return trial_label(picked)


def _named_params(row: dict[str, Any]) -> dict[str, Any]:
    """Every parameter the trial ran with, ``stage.method.param`` -> value (fixed ones too, from the MLflow run); Optuna's searched ones without a run."""
    logged = {key: _parsed(value) for key, value in row["run_params"].items()
              if key.count(".") == 2 and not key.startswith(("info.", "trial."))}
    return logged or {k: v for k, v in row["params"].items() if not k.endswith(".method")}


def _parsed(text: Any) -> Any:
    """A logged MLflow param (text) back to the value the trial had, so it matches Optuna's."""
    import json

    try:
        return json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return text


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
        sizes = f"; stored {stored / 1e6:,.1f} MB, {fp16 / 1e6:,.1f} MB in fp16" if stored and fp16 else ""
        lines.append(f"Base weights: **{params['info.weights']}**{sizes}. Sizes are given against both "
                     "(`size ÷ stored base`, `size ÷ fp16 base`), never against the fp32 they are computed in.")
    sources = sorted({r.get("run_params", {}).get(ENERGY_SOURCE, "") for r in rows} - {""})
    if sources:
        from paretolab.energy import DEFAULT_WATTS_PER_CORE

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
            f"The unmodified model, timed beside each of {len(values)} trials ({label}, `{metric}`): median {_cell(median)}, "
            f"range {_cell(values[0])}–{_cell(values[-1])} (max ÷ min {values[-1] / values[0]:.2f}); "
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
                r[column] = f"{_cell(value)} †"
                noisy = True
        if r.get("run_params", {}).get(ENERGY_SOURCE) == "estimate":
            for column in columns:
                if is_energy_metric(column) and isinstance(r.get(column), float):
                    r[column] = f"≈{_cell(r[column])}"
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


def _with_uncertainty(shown: list[dict[str, Any]], rows: list[dict[str, Any]], columns: list[str], stores: Stores) -> tuple[list[str], list[str]]:
    """Quality cells with their interval, a paired difference to the unmodified model and the sample size."""
    from paretolab.noise import QUALITY, artifact_reader, quality_cells

    quality = [c for c in columns if c in QUALITY]
    if not quality:
        return columns, []
    baseline = next((r for r in rows if r["method"] == "none"), None)
    added = quality_cells(shown, baseline, quality, artifact_reader(stores.tracking_uri))
    out = list(columns)
    for column in added:  # each difference right after its metric
        metric = column[1:].split(" ", 1)[0]
        out.insert(out.index(metric) + 1, column)
    if any(r.get("n") for r in shown):
        out.append("n")
    legend = [
        "Quality: value ± 1 standard error (lm-eval's formula), or a 95 % bootstrap interval over the windows for ppl. "
        "Δ … vs none: difference to the unmodified model with its 95 % interval, paired over the same examples or "
        "windows; *within noise* when that interval contains 0. n: the examples or windows behind the quality numbers.",
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
    """A GitHub-flavoured Markdown table; numbers to 4 significant digits."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c)) for c in columns) + " |")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k.split('.', 1)[-1]}={_num(v)}" for k, v in value.items() if not k.endswith(".method"))
    return "" if value is None else str(value)

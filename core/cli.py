"""The `paretolab` command line."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from paretolab.errors import ParetolabError

EPILOG = """examples:
  paretolab run pipelines/smoke.yaml              run a study on a local Ray
  paretolab run pipelines/demo.yaml --trials 20   run (or extend) with 20 trials in all
  paretolab run pipelines/demo.yaml --resume      continue an interrupted study
  paretolab frontier demo                         the Pareto set of study 'demo'
  paretolab plugins                               every method, task, measure and model
  paretolab models pull smollm2-135m              convert the default model once
  paretolab draft train --budget-min 15           train the EAGLE draft for speculative decoding
  paretolab dashboard                             browse studies and frontiers on http://127.0.0.1:8501
  paretolab submit pipelines/demo.yaml --address http://HEAD:8265   run the study as a job on a Ray cluster
  paretolab jobs status JOB_ID --address http://HEAD:8265           follow it (list, status, logs, stop)
"""


def _store_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("stores (default: SQLite files under ./.paretolab)")
    g.add_argument("--home", help="folder for the default SQLite stores (env PARETOLAB_HOME; default .paretolab)")
    g.add_argument("--storage", help="Optuna storage, any SQLAlchemy URL (env PARETOLAB_OPTUNA_STORAGE)")
    g.add_argument("--tracking-uri", help="MLflow tracking URI (env PARETOLAB_TRACKING_URI or MLFLOW_TRACKING_URI)")


# the speedups against the unmodified model (timed beside each trial) lead; absolute times follow
REPORT_METRICS = "ppl,acc,size_bytes,bits_per_weight,sqnr_db,psum_sqnr_db,depth_alpha,depth_fit_r2,depth_ce_inf,prefill_speedup,decode_speedup,prefill_ms,decode_tok_s,energy_j"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="paretolab",
        description="Map the quality/cost Pareto frontier of ML efficiency methods.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    run = sub.add_parser("run", help="run a study from a pipeline YAML", description=(
        "Run the study a pipeline file describes: Optuna proposes parameters, Ray workers apply the "
        "methods to the model, evaluate quality and measure cost; every trial is recorded in Optuna and MLflow."
    ))
    run.add_argument("pipeline", help="path to a pipeline YAML (see pipelines/README or the README's reference)")
    run.add_argument("--trials", type=int, help="total trials the study should hold (overrides search.trials)")
    run.add_argument("--address", help="Ray cluster address (e.g. ray://head:10001 or auto); default: a local Ray")
    run.add_argument("--resume", action="store_true", help="continue a study that already has trials")
    run.add_argument("--retry-failed", action="store_true", help="with --resume: run the parameters of failed trials again (e.g. after a crash killed them)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--json", action="store_true", help="print the frontier as JSON at the end")
    _store_flags(run)
    run.set_defaults(func=cmd_run)

    submit = sub.add_parser("submit", help="run a study as a job on a Ray cluster (Ray's job submission API)", description=(
        "Validate the pipeline here, then submit its study to a Ray cluster as a job that carries the pipeline and "
        "paretolab's code; prints the job id. The job runs `paretolab run PIPELINE --resume` on the cluster, so "
        "submitting the same pipeline again finishes a study whose driver died. Stores: --storage/--tracking-uri "
        "(without a password: Ray keeps a job's settings in clear), else the cluster nodes' own PARETOLAB_* settings. "
        "A cluster with token authentication needs its token here: RAY_AUTH_TOKEN or ~/.ray/auth_token."
    ))
    submit.add_argument("pipeline", help="path to a pipeline YAML")
    submit.add_argument("--address", help="the Ray head's dashboard URL, e.g. http://HEAD:8265 (env RAY_ADDRESS)")
    submit.add_argument("--trials", type=int, help="total trials the study should hold (overrides search.trials)")
    submit.add_argument("--storage", help="Optuna storage URL for the job (no password in it; see --help)")
    submit.add_argument("--tracking-uri", help="MLflow tracking URI for the job (an MLflow server reachable from the cluster)")
    submit.add_argument("--no-code", action="store_true", help="use the paretolab and plugins installed on the cluster instead of shipping this machine's")
    submit.set_defaults(func=cmd_submit)

    jobs = sub.add_parser("jobs", help="list, inspect, read the logs of, or stop Ray jobs")
    jsub = jobs.add_subparsers(dest="jobs_command", metavar="ACTION")
    jsub.required = True
    for action, text in (("list", "every job on the cluster, newest first"), ("status", "one job's status"),
                         ("logs", "one job's driver output"), ("stop", "stop a job: its running trials are recorded as failed")):
        jp = jsub.add_parser(action, help=text)
        if action != "list":
            jp.add_argument("job_id", help="the id `paretolab submit` printed")
        jp.add_argument("--address", help="the Ray head's dashboard URL, e.g. http://HEAD:8265 (env RAY_ADDRESS)")
        if action in ("list", "status"):
            jp.add_argument("--json", action="store_true", help="machine-readable output")
        if action == "stop":
            jp.add_argument("--wait", type=float, default=30.0, help="seconds to wait for the job to end (default 30; 0: do not wait)")
        jp.set_defaults(func=cmd_jobs)

    plugins = sub.add_parser("plugins", help="list methods, tasks, measures, metrics and models", description=(
        "Everything the installed plugins registered. Methods show kind, paper, search space and whether their "
        "cost saving is real (a stored format or kernel) or simulated."
    ))
    plugins.add_argument("--json", action="store_true", help="machine-readable output")
    plugins.set_defaults(func=cmd_plugins)

    models = sub.add_parser("models", help="list or pull models")
    msub = models.add_subparsers(dest="models_command", metavar="ACTION")
    msub.required = True
    mlist = msub.add_parser("list", help="registered models and whether they are cached")
    mlist.set_defaults(func=cmd_models_list)
    mpull = msub.add_parser("pull", help="fetch/convert a model once so later loads are fast and offline")
    mpull.add_argument("name", nargs="?", default="smollm2-135m", help="model name (default smollm2-135m)")
    mpull.set_defaults(func=cmd_models_pull)

    draft = sub.add_parser("draft", help="train the EAGLE draft that speculative decoding uses")
    dsub = draft.add_subparsers(dest="draft_command", metavar="ACTION")
    dsub.required = True
    dtrain = dsub.add_parser("train", help="cache the target's hidden states once, then train (or continue) the draft", description=(
        "Run the target once over the training part of a corpus and cache its low/middle/high hidden states and greedy "
        "tokens, then train the one-layer EAGLE draft on them for a wall-clock budget (CPU is fine). The draft is saved "
        "under the cache dir (drafts/MODEL/eagle.pt) every minute and at the end; a second run continues it."
    ))
    dtrain.add_argument("--model", default="smollm2-135m", help="target model (default smollm2-135m)")
    dtrain.add_argument("--budget-min", type=float, default=15.0, help="minutes of training in this run (default 15; features not included)")
    dtrain.add_argument("--corpus", default="pydoc", help="training corpus; its last 10%% is held out for prompts (default pydoc)")
    dtrain.add_argument("--tokens", type=int, default=16384, help="target tokens whose hidden states are cached (default 16384)")
    dtrain.add_argument("--seq-len", type=int, default=256, help="training window in tokens (default 256)")
    dtrain.add_argument("--vocab", type=int, default=4096, help="draft vocabulary: the target's most frequent tokens (default 4096)")
    dtrain.add_argument("--ttt-steps", type=int, default=3, help="training-time-test rollout steps (default 3)")
    dtrain.add_argument("--fresh", action="store_true", help="start over instead of continuing an existing draft")
    dtrain.add_argument("--no-progress", action="store_true", help="no progress bars")
    dtrain.set_defaults(func=cmd_draft_train)

    frontier = sub.add_parser("frontier", help="the non-dominated trials of a study, as a table", description=(
        "Read a study from the stores and print its Pareto set on the pipeline's objectives."
    ))
    frontier.add_argument("study", help="study name (the pipeline's `name`)")
    frontier.add_argument("--json", action="store_true", help="machine-readable output")
    _store_flags(frontier)
    frontier.set_defaults(func=cmd_frontier)

    report = sub.add_parser("report", help="method-vs-baseline tables of studies, as Markdown", description=(
        "For each study, group complete trials by method (the stages that ran, e.g. 'wanda+rtn') and print "
        "each method's own non-dominated trials (or every trial with --trials all) with the chosen metrics; "
        "with an unmodified-model trial ('none') the first objective is also shown relative to it. "
        "Metric columns no trial reported are left out. --output writes a whole Markdown document, "
        "e.g. `paretolab report wanda_vs_magnitude macko --trials all --output pipelines/README.md`."
    ))
    report.add_argument("studies", nargs="+", help="study names")
    report.add_argument("--metrics", default=REPORT_METRICS, help=f"comma-separated metric columns after the study's objectives, which are always shown (default {REPORT_METRICS})")
    report.add_argument("--trials", choices=("frontier", "all"), default="frontier", help="each method's Pareto set (default) or every complete trial")
    report.add_argument("--output", metavar="FILE", help="write a Markdown document to FILE instead of printing the tables")
    _store_flags(report)
    report.set_defaults(func=cmd_report)

    studies = sub.add_parser("studies", help="list the studies in the stores with trial counts")
    _store_flags(studies)
    studies.set_defaults(func=cmd_studies)

    dashboard = sub.add_parser("dashboard", help="browse studies, frontiers and trials in a web app (Streamlit)", description=(
        "Start the Streamlit dashboard on the stores: studies, Pareto frontiers, trials, comparisons, methods and the "
        "Ray cluster. It only reads the stores. Bound to 127.0.0.1 unless --host says otherwise."
    ))
    dashboard.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 exposes it to the network)")
    dashboard.add_argument("--port", type=int, default=8501, help="port (default 8501)")
    dashboard.add_argument("--address", help="Ray cluster address for the Cluster page (env PARETOLAB_RAY_ADDRESS); default: local")
    _store_flags(dashboard)
    dashboard.set_defaults(func=cmd_dashboard)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ParetolabError as exc:
        print(f"paretolab: error: {exc}", file=sys.stderr)
        return 2


def _stores(args: argparse.Namespace, *, create: bool = False) -> Any:
    """The stores the flags name; only `run` (create=True) may create them."""
    from paretolab.stores import resolve_stores

    return resolve_stores(home=args.home, optuna_url=args.storage, tracking_uri=args.tracking_uri, create=create)


def cmd_run(args: argparse.Namespace) -> int:
    from paretolab.models import quality_note
    from paretolab.report import failure_reasons, frontier_rows, load_study, print_failures, print_frontier
    from paretolab.spec import load_spec
    from paretolab.study import run_study

    spec = load_spec(args.pipeline)
    if not (args.address or "").startswith("ray://"):  # a Ray client's workers load the model elsewhere
        from paretolab.models import check_model

        for name in dict.fromkeys([spec.model, *spec.models.values()]):
            check_model(name)
    stores = _stores(args, create=True)
    outcome = run_study(spec, stores=stores, address=args.address, resume=args.resume, trials=args.trials, retry_failed=args.retry_failed, progress=not args.no_progress)
    rows = frontier_rows(spec.name, stores)
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    else:
        print(f"\n{outcome.completed} trial(s) completed, {outcome.failed} failed, {outcome.retried} retried in {outcome.wall_s:.1f} s")
        print_failures(spec.name, failure_reasons(load_study(spec.name, stores).get_trials(deepcopy=False)))
        print_frontier(spec.name, rows)
        note = quality_note(spec.model, spec.raw)
        if note:
            print(f"warning: {note}")
    return 130 if outcome.interrupted else 0


def cmd_submit(args: argparse.Namespace) -> int:
    from paretolab.jobs import jobs_address, submit

    done = submit(args.pipeline, address=args.address, trials=args.trials, storage=args.storage, tracking_uri=args.tracking_uri,
                  ship_code=not args.no_code)
    address = jobs_address(args.address)
    print(done.job_id)
    print(f"submitted study {done.study!r} to {address}; stores: {done.stores}", file=sys.stderr)
    print(f"follow it: paretolab jobs status {done.job_id} --address {address}  (logs, stop)", file=sys.stderr)
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    import time

    from paretolab import jobs

    if args.jobs_command == "list":
        rows = jobs.list_jobs(args.address)
        if args.json:
            print(json.dumps(rows, indent=2))
        elif rows:
            _table(rows, ["job_id", "status", "study", "message"])
        else:
            print("no jobs on this cluster yet: `paretolab submit PIPELINE --address ...` starts one")
    elif args.jobs_command == "status":
        row = jobs.job_status(args.address, args.job_id)
        print(json.dumps(row, indent=2) if args.json else f"{row['job_id']}  {row['status']}  {row['study']}  {row['message']}")
    elif args.jobs_command == "logs":
        print(jobs.job_logs(args.address, args.job_id), end="")
    else:
        stopped = jobs.stop_job(args.address, args.job_id)
        status = jobs.job_status(args.address, args.job_id)["status"]
        deadline = time.monotonic() + args.wait
        while stopped and status not in jobs.TERMINAL and time.monotonic() < deadline:
            time.sleep(0.5)
            status = jobs.job_status(args.address, args.job_id)["status"]
        print(f"{args.job_id}  {status}" + ("" if stopped else "  (it had already ended)"))
    return 0


def cmd_draft_train(args: argparse.Namespace) -> int:
    from paretolab.errors import ConfigError
    from paretolab.models import load_subject
    from paretolab.plugins.speculative.train import TrainOptions, train_draft

    if args.budget_min <= 0:
        raise ConfigError(f"--budget-min must be > 0 minutes, got {args.budget_min}")
    for flag, value, low in (("--tokens", args.tokens, 1), ("--seq-len", args.seq_len, 8), ("--vocab", args.vocab, 2), ("--ttt-steps", args.ttt_steps, 1)):
        if value < low:
            raise ConfigError(f"{flag} must be >= {low}, got {value}")
    options = TrainOptions(budget_min=args.budget_min, corpus=args.corpus, max_tokens=args.tokens, seq_len=args.seq_len,
                           vocab=args.vocab, ttt_steps=args.ttt_steps, fresh=args.fresh)
    train_draft(load_subject(args.model), options, show_progress=not args.no_progress)
    return 0


def cmd_frontier(args: argparse.Namespace) -> int:
    from paretolab.report import frontier_rows, print_frontier, study_quality_note

    stores = _stores(args)
    rows = frontier_rows(args.study, stores)
    note = study_quality_note(args.study, stores)
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        if note:
            print(f"paretolab: warning: {note}", file=sys.stderr)
    else:
        print_frontier(args.study, rows)
        if note:
            print(f"warning: {note}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    import shlex
    from pathlib import Path

    from paretolab.errors import ConfigError
    from paretolab.report import study_section

    stores = _stores(args)
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    sections = []
    for name in args.studies:
        try:
            sections.append(study_section(name, stores, metrics, frontier=args.trials == "frontier"))
        except ConfigError as exc:
            if len(args.studies) == 1:
                raise
            print(f"paretolab: warning: {exc}", file=sys.stderr)
            sections.append(f"## {name}\n\nNot in the stores yet: run its pipeline (`paretolab run pipelines/{name}.yaml`).\n")
    if not args.output:
        print("\n".join(sections))
        return 0
    command = "paretolab " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    head = [
        "# Results of the pipelines",
        "",
        f"Generated from the stored studies by `{command}`; not edited by hand. Rerun that command",
        "after the studies change. `cost` says whether a saving is real (a stored format or a kernel",
        "that runs) or simulated (fake quantization, masks); latency columns are measured on the machine",
        "that ran the study, so compare them within a table, not across machines. A study whose pipeline",
        "carries a `claim:` opens with it and its verdict on the stored trials (paired with the baseline",
        "on the same seed and settings; 95 % t interval over the pairs).",
        "",
    ]
    Path(args.output).write_text("\n".join(head + sections), encoding="utf-8")
    print(f"wrote {args.output} ({len(sections)} studies)")
    return 0


def cmd_studies(args: argparse.Namespace) -> int:
    from paretolab.report import print_failures, study_summaries

    rows = study_summaries(_stores(args))
    if not rows:
        print("no studies yet: run one with `paretolab run pipelines/smoke.yaml`")
        return 0
    _table(rows, ["study", "complete", "failed", "running", "objectives", "last_update"])
    for row in rows:
        print_failures(row["study"], row["failures"])
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    import os
    import subprocess
    from pathlib import Path

    from paretolab.errors import ConfigError

    try:
        import paretolab.dashboard
        import streamlit  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"the dashboard needs streamlit and plotly ({exc}); pip install streamlit plotly") from None
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port: expected 1..65535, got {args.port}")
    stores = _stores(args)
    app = Path(paretolab.dashboard.__file__).with_name("app.py")
    # Stores travel as environment variables, not arguments, so a password in a URL stays out of `ps`.
    env = {**os.environ, "PARETOLAB_OPTUNA_STORAGE": stores.optuna_url, "PARETOLAB_TRACKING_URI": stores.tracking_uri,
           "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false"}
    if args.address:
        env["PARETOLAB_RAY_ADDRESS"] = args.address
    cmd = [
        sys.executable, "-m", "streamlit", "run", str(app),
        "--server.address", args.host, "--server.port", str(args.port), "--server.headless", "true",
        "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none", "--server.runOnSave", "false",
        "--global.developmentMode", "false", "--client.toolbarMode", "viewer",
    ]
    redacted = stores.redacted()
    print(f"paretolab dashboard on http://{args.host}:{args.port} (Optuna {redacted.optuna_url}, MLflow {redacted.tracking_uri}); Ctrl-C stops it", flush=True)
    if os.name == "posix":
        # Become Streamlit (exec), so Ctrl-C and a service manager's SIGTERM reach the server and no child is left behind.
        sys.stdout.flush()
        os.execve(sys.executable, cmd, env)
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 130


def cmd_plugins(args: argparse.Namespace) -> int:
    from paretolab.plugin_manager import registries

    regs = registries()
    methods = [m.describe() | {"plugin": regs.methods.owner(m.name), "distribution": _distribution(regs, regs.methods.owner(m.name))} for m in regs.methods]
    if args.json:
        payload = {
            "methods": methods,
            "tasks": [{"name": t.name, "metrics": list(t.metrics)} for t in regs.tasks],
            "measures": [{"name": m.name, "metrics": list(m.metrics), "default": m.default} for m in regs.measures],
            "metrics": [vars(m) for m in regs.metrics],
            "models": [{"name": m.name, "weights": m.weights, "description": m.description} for m in regs.models],
        }
        print(json.dumps(payload, indent=2))
        return 0
    print("methods:")
    for m in methods:
        dist = f" ({m['distribution']})" if m["distribution"] else ""
        print(f"  {m['name']}  [{m['kind']}, cost {m['cost_is']}]  from {m['plugin']}{dist}")
        if m["paper"]:
            print(f"      paper: {m['paper']}")
        for key, text in m["search_space"].items():
            print(f"      {key}: {text}")
        if m.get("metrics"):
            print(f"      reports: {', '.join(m['metrics'])}")
    print("tasks:")
    for t in regs.tasks:
        print(f"  {t.name}  -> {', '.join(t.metrics)}")
    print("measures:")
    for ms in regs.measures:
        print(f"  {ms.name}{' (default)' if ms.default else ''}  -> {', '.join(ms.metrics)}")
    print("metrics:")
    for metric in regs.metrics:
        unit = f" [{metric.unit}]" if metric.unit else ""
        print(f"  {metric.name}{unit}  {metric.direction}{', estimated' if metric.estimated else ''}: {metric.description}")
    print("models:")
    for model in regs.models:
        print(f"  {model.name} [weights: {model.weights}]: {model.description}")
    return 0


def _distribution(regs: Any, owner: str) -> str:
    """A third-party plugin's "distribution version" ("" for paretolab's own)."""
    return "" if owner.startswith("paretolab.") else regs.plugin_versions.get(owner, "unknown")


def cmd_models_list(args: argparse.Namespace) -> int:
    from paretolab.plugin_manager import registries

    for model in registries().models:
        state = "cached" if model.is_cached() else "not cached (paretolab models pull " + model.name + ")"
        print(f"{model.name:16s} {state}\n    weights: {model.weights}\n    {model.description}")
    print("Any local model directory or Hugging Face id (org/name) also works as `model:`.")
    return 0


def cmd_models_pull(args: argparse.Namespace) -> int:
    import time

    from paretolab.models import resolve_model

    source = resolve_model(args.name)
    start = time.perf_counter()
    where = source.pull()
    print(f"{args.name}: ready at {where} ({time.perf_counter() - start:.1f} s)")
    return 0


def _table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).ljust(widths[c]) for c in columns))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


if __name__ == "__main__":
    raise SystemExit(main())

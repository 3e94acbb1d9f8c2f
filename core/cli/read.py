"""Commands that read the stores: `frontier`, `report`, and `dashboard` (which only reads them); `studies` is in manage."""

from __future__ import annotations

import argparse
import json
import sys

from paretolab.cli.common import print_table, source_from_flags, stores_from_flags


def cmd_frontier(args: argparse.Namespace) -> int:
    from paretolab.data.names import printable
    from paretolab.results.read import frontier_rows, print_frontier, study_quality_note
    from paretolab.results.source import source_of

    stores = source_of(source_from_flags(args))  # one source: the study is read once for its rows and its note
    rows = frontier_rows(args.study, stores)
    note = study_quality_note(args.study, stores)
    if args.json:
        _label_costs(args.study, stores, rows)
        print(json.dumps(rows, indent=2, default=str))
        if rows.constraints:  # the rows say feasible true/false; which bounds, on stderr as the note below: stdout stays the list
            print(f"paretolab: feasible frontier under: {printable('; '.join(rows.constraints))}", file=sys.stderr)
        if note:
            print(f"paretolab: warning: {printable(note)}", file=sys.stderr)
    else:
        print_frontier(args.study, rows)
        if note:
            print(f"warning: {printable(note)}")
    return 0


def _label_costs(study: str, stores: object, rows: list[dict]) -> None:
    """Each row's ``cost``, as the report and dashboard say it: ``real``, or ``simulated (METHODS)`` for this trial."""
    from paretolab.results.read import load_study
    from paretolab.study.recording import SIMULATED_BY

    trials = {t.number: t for t in load_study(study, stores).get_trials(deepcopy=False)}
    for row in rows:
        attrs = trials[row["trial"]].user_attrs if row.get("trial") in trials else {}
        label = attrs.get(SIMULATED_BY) if SIMULATED_BY in attrs else _mlflow_label(stores, row.get("mlflow_run_id", ""))
        row["cost"] = f"simulated ({label})" if label else "real"


def _mlflow_label(stores: object, run_id: str) -> str:
    """A trial recorded before the label was kept in Optuna: its MLflow run's ``paretolab.simulated_by`` tag (stores or bundle)."""
    if not run_id:
        return ""
    from paretolab.results.source import BundleSource, source_of

    source = source_of(stores)  # type: ignore[arg-type]
    if isinstance(source, BundleSource):
        run = source.runs.get(run_id)
        return run.tags.get("paretolab.simulated_by", "") if run is not None else ""
    try:
        return source.client().get_run(run_id).data.tags.get("paretolab.simulated_by", "")
    except Exception:  # noqa: BLE001 - a run the store lost: no label rather than no frontier
        return ""


def cmd_report(args: argparse.Namespace) -> int:
    import shlex

    from paretolab.errors import ConfigError
    from paretolab.data.names import markdown_text, printable
    from paretolab.results.section import study_section

    from paretolab.data.outputs import check_file_output, write_text

    output = check_file_output(args.output, "--output") if args.output else None  # before the stores are read, not after
    stores = source_from_flags(args)
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    sections = []
    for name in args.studies:
        try:
            sections.append(study_section(name, stores, metrics, frontier=args.trials == "frontier"))
        except ConfigError as exc:
            if len(args.studies) == 1:
                raise
            print(f"paretolab: warning: {printable(exc)}", file=sys.stderr)
            sections.append(f"## {markdown_text(name)}\n\nNot in the stores yet: run its pipeline (`paretolab run pipelines/{printable(name)}.yaml`).\n")
    if not args.output:
        print("\n".join(sections))
        return 0
    command = printable("paretolab " + " ".join(shlex.quote(a) for a in sys.argv[1:]))  # the names it was given, escaped as in the sections
    head = [
        "# Results of the pipelines",
        "",
        f"Generated from the stored studies by `{command}`; not edited by hand. Rerun that command",
        "after the studies change. `cost` says whether a saving is real (a stored format or a kernel",
        "that runs) or simulated (fake quantization, masks); latency columns are measured on the machine",
        "that ran the study, so compare them within a table, not across machines. A study whose pipeline",
        "carries claims opens with each and its verdict on the stored trials: paired with the baseline on",
        "the same replicate (seed, calibration draw, split) and settings, one verdict per setting that varies,",
        "a 95 % interval carrying both the replicate-to-replicate and the example-to-example noise (docs:",
        "tutorials/verdicts.md).",
        "",
    ]
    write_text(output, "\n".join(head + sections), "--output")
    print(f"wrote {args.output} ({len(sections)} studies)")
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    import os
    import subprocess
    from pathlib import Path

    from paretolab.errors import ConfigError

    try:
        import streamlit  # noqa: F401

        import paretolab.dashboard
    except ImportError as exc:
        raise ConfigError(f"the dashboard needs streamlit and plotly ({exc}); pip install streamlit plotly") from None
    stores = stores_from_flags(args)
    from paretolab.stores.open import check_readable

    check_readable(stores)  # a store `studies` refuses is refused here too, not shown as a raw error on the page
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"paretolab: warning: --host {args.host}: the dashboard has no login; anyone who can reach this address on port "
              f"{args.port} reads every study in these stores", file=sys.stderr)
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

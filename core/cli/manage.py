"""Commands that look after studies without running one: `check` (a pipeline, dry) and `studies` (list, --prune, delete)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from paretolab.cli.common import print_table, stores_from_flags


def cmd_check(args: argparse.Namespace) -> int:
    """Validate a pipeline exactly as `run` does and print what a run would do; start nothing, write nothing."""
    from paretolab.study.preflight import plan_lines, validated_spec

    spec = validated_spec(args.pipeline, trials=args.trials)  # `run` calls the same function before any work
    for line in plan_lines(spec, args.pipeline, stores_from_flags(args), trials=args.trials):
        print(line)
    return 0


def cmd_studies(args: argparse.Namespace) -> int:
    from paretolab.data.names import printable
    from paretolab.results.read import print_failures, study_summaries

    stores = stores_from_flags(args)
    if getattr(args, "studies_command", None) == "delete":
        return _remove(stores, [args.study], args.yes, f"remove study {args.study!r}")
    rows = study_summaries(stores)
    if not rows:
        print("no studies yet: run one with `paretolab run pipelines/smoke.yaml`")
        return 0
    _add_status(rows, stores)
    if args.prune:
        doomed = [r["study"] for r in rows if r["interrupted"] and not r["complete"]]
        if not doomed:
            print("nothing to prune: no interrupted study without a complete trial")
            return 0
        return _remove(stores, doomed, args.yes, f"remove {len(doomed)} interrupted study(ies) without a complete trial: {', '.join(map(repr, doomed))}")
    print_table(rows, ["study", "status", "complete", "failed", "pruned", "running", "objectives", "last_update"])
    for row in rows:
        if row["hint"]:
            print(f"study {row['study']!r}: {printable(row['hint'])}")
    for row in rows:
        print_failures(row["study"], row["failures"])
    return 0


def _add_status(rows: list[dict[str, Any]], stores: Any) -> None:
    """Each row's status (running, finished, interrupted), from the study's recorded session and its driver's lock."""
    import optuna

    from paretolab.results.bundle import import_state, partial_import_line
    from paretolab.stores.open import guarded, optuna_storage
    from paretolab.stores.ownership import study_owner
    from paretolab.study.session import study_status

    storage = optuna_storage(stores, create=False)
    attrs = {s.study_name: s.user_attrs for s in guarded("Optuna", stores.optuna_url, lambda: optuna.get_all_study_summaries(storage, include_best_trial=False))}
    for row in rows:
        owned = study_owner(stores.optuna_url, row["study"]) is not None
        row["status"], row["hint"], row["interrupted"] = study_status(attrs.get(row["study"], {}), row, owned)
        if import_state(attrs.get(row["study"], {})) == "partial" and not owned:  # a `bundle import` killed midway
            row["status"], row["hint"], row["interrupted"] = "partial import", partial_import_line(row["study"]), False


def _remove(stores: Any, names: list[str], yes: bool, what: str) -> int:
    """Remove each study from both stores, after a yes on a terminal (or --yes); say what went."""
    from paretolab.errors import ConfigError
    from paretolab.stores.remove import remove_study

    shown = stores.redacted()
    if not yes:
        if not sys.stdin.isatty():
            raise ConfigError(f"{what}: not asked, since this is no terminal; pass --yes to remove without asking")
        answer = input(f"{what} from Optuna {shown.optuna_url} and MLflow {shown.tracking_uri}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return 1
    for name in names:
        gone = remove_study(stores, name)
        optuna_part = f"Optuna study with {gone.optuna_trials} trial(s)" if gone.optuna_trials is not None else "no Optuna study"
        mlflow_part = (f"MLflow experiment with {gone.mlflow_runs} run(s) (deleted as {gone.mlflow_renamed!r})"
                       if gone.mlflow_runs is not None else "no MLflow experiment")
        print(f"removed study {name!r}: {optuna_part}; {mlflow_part}")
    return 0

"""Commands that run studies: `run` (a driver here), `submit` and `jobs` (a Ray cluster), `draft train`."""

from __future__ import annotations

import argparse
import json
import sys

from paretolab.cli.common import print_table, stores_from_flags


def cmd_run(args: argparse.Namespace) -> int:
    from paretolab.models import quality_note
    from paretolab.results.read import (
        failure_reasons,
        frontier_rows,
        load_study,
        print_failures,
        print_frontier,
    )
    from paretolab.results.section import verdict_summary
    from paretolab.study.driver import run_study
    from paretolab.study.preflight import validated_spec

    spec = validated_spec(args.pipeline, address=args.address, trials=args.trials, log=lambda *_: None)  # the same checks as `check`
    stores = stores_from_flags(args, create=True)
    from paretolab.stores.open import require_server

    for what, url in (("Optuna", stores.optuna_url), ("MLflow", stores.tracking_uri)):
        require_server(what, url)  # both stores answer before either is written: no empty study left by an MLflow that does not
    outcome = run_study(spec, stores=stores, address=args.address, resume=args.resume, trials=args.trials, retry_failed=args.retry_failed,
                        from_study=args.from_study, progress=not args.no_progress, pipeline=args.pipeline)
    rows = frontier_rows(spec.name, stores)
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    else:
        pruned = f", {outcome.pruned} pruned" if outcome.pruned else ""
        print(f"\n{outcome.completed} trial(s) completed{pruned}, {outcome.failed} failed, {outcome.retried} retried in {outcome.wall_s:.1f} s")
        print_failures(spec.name, failure_reasons(load_study(spec.name, stores).get_trials(deepcopy=False)))
        print_frontier(spec.name, rows)
        verdicts = verdict_summary(spec.name, stores)
        if verdicts:
            print("\nclaims (`paretolab report " + spec.name + "` gives the intervals' details):")
            print("\n".join(f"  {line}" for line in verdicts))
        note = quality_note(spec.model, spec.raw)
        if note:
            print(f"warning: {note}")
    if outcome.interrupted:
        import shlex

        from paretolab.stores import redact

        flags = [(f, v) for f, v in (("--address", args.address), ("--home", args.home), ("--storage", args.storage), ("--tracking-uri", args.tracking_uri)) if v]
        again = " ".join(["paretolab", "run", shlex.quote(args.pipeline), "--resume", *(f"{f} {shlex.quote(redact(v))}" for f, v in flags)])
        print(f"study {spec.name!r} stopped by {outcome.stopped_by} before its end; continue it with: {again}", file=sys.stderr)
        return 130
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from paretolab.cluster.jobs import jobs_address, submit
    from paretolab.study.spec import load_spec

    done = submit(load_spec(args.pipeline), args.pipeline, address=args.address, trials=args.trials, storage=args.storage, tracking_uri=args.tracking_uri,
                  ship_code=not args.no_code)
    address = jobs_address(args.address)
    print(done.job_id)
    print(f"submitted study {done.study!r} to {address}; stores: {done.stores}", file=sys.stderr)
    print(f"follow it: paretolab jobs status {done.job_id} --address {address}  (logs, stop)", file=sys.stderr)
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    import time

    from paretolab.cluster import jobs

    if args.jobs_command == "list":
        rows = jobs.list_jobs(args.address)
        if args.json:
            print(json.dumps(rows, indent=2))
        elif rows:
            print_table(rows, ["job_id", "status", "study", "message"])
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
    from paretolab.plugins.speculative.train import TrainOptions, draft_finished, draft_path, train_draft

    if args.if_missing and not args.fresh and draft_finished(args.model):
        print(f"model {args.model!r} already has a draft ({draft_path(args.model)}): nothing to do (--if-missing)")
        return 0
    if args.budget_min <= 0:
        raise ConfigError(f"--budget-min must be > 0 minutes, got {args.budget_min}")
    for flag, value, low in (("--tokens", args.tokens, 1), ("--seq-len", args.seq_len, 8), ("--vocab", args.vocab, 2), ("--ttt-steps", args.ttt_steps, 1),
                             ("--prompts", args.prompts, 1), ("--new-tokens", args.new_tokens, 1)):
        if value < low:
            raise ConfigError(f"{flag} must be >= {low}, got {value}")
    sets = tuple(name.strip() for name in args.prompt_sets.split(",") if name.strip())
    options = TrainOptions(budget_min=args.budget_min, data=args.data, prompt_sets=sets, prompts=args.prompts, new_tokens=args.new_tokens,
                           corpus=args.corpus, max_tokens=args.tokens, seq_len=args.seq_len, vocab=args.vocab, ttt_steps=args.ttt_steps,
                           fresh=args.fresh)
    train_draft(load_subject(args.model), options, show_progress=not args.no_progress)
    return 0

"""`paretolab bundle` (a study's record in one file) and `paretolab results` (the results documents from bundles)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any
from pathlib import Path

from paretolab.cli.common import stores_from_flags


def cmd_bundle(args: argparse.Namespace) -> int:
    from paretolab.data.names import printable

    if args.bundle_command == "export":
        from paretolab.results.bundle import check_output
        from paretolab.results.bundle_stores import export_bundle

        out = check_output(Path(args.out))  # before any store is read
        written = export_bundle(args.studies, stores_from_flags(args), out)
        print(f"wrote {printable(out)}: " + ", ".join(f"{printable(name)} ({n} trials)" for name, n in written.items()))
        return 0
    from paretolab.results.bundle_stores import import_bundle

    done = import_bundle(Path(args.file), lambda: stores_from_flags(args, create=True), rename=args.as_name, resume=args.resume)
    print(f"imported {printable(args.file)}: " + ", ".join(f"{name} ({n} trials)" for name, n in done.items()))
    return 0


def cmd_results(args: argparse.Namespace) -> int:
    from paretolab.results.documents import documents_for, read_manifest

    root = Path(args.root).resolve()
    docs = documents_for(read_manifest(root), args.families)
    if args.results_command == "status":
        return _status(root, docs)
    if args.results_command == "render":
        return _render(root, docs, check=args.check)
    return _run(root, docs, args)


def _status(root: Path, docs: list) -> int:
    from paretolab.results.documents import expected_minutes, run_state

    for doc in docs:
        print(f"{doc.path} ({doc.family}):")
        for study in doc.studies:
            state, why = run_state(root, study, timed=study in doc.timed)
            if state == "busy":
                why += " (`results run` times it again)"
            minutes = expected_minutes(root, study)
            took = f", took {minutes:.0f} min" if minutes is not None else ""
            timed = " [timed: run alone]" if study in doc.timed else ""
            print(f"  {state:8s} {study}{timed}{took}" + (f" — {why}" if why else ""))
    return 0


def _render(root: Path, docs: list, *, check: bool) -> int:
    from paretolab.results.documents import LEGACY_BANNER, bundle_path, render_document
    from paretolab.results.source import BundleSource

    stale = []
    for doc in docs:
        source = BundleSource([p for p in (bundle_path(root, s) for s in doc.studies) if p.is_file()])
        target = root / doc.path
        if not source.names():  # not one study rerun yet: the old document stays, saying it is stale
            old = target.read_text(encoding="utf-8") if target.is_file() else ""
            if old.startswith(LEGACY_BANNER):
                if not check:
                    print(f"left {doc.path} as it is: none of its studies has a bundle yet (it says so at its top)")
            elif check:
                stale.append(f"{doc.path} (no bundle yet, and it does not open with the stale-document banner)")
            else:
                _write_document(target, doc.path, f"{LEGACY_BANNER}\n\n{old}")
                print(f"marked {doc.path} stale: none of its studies has a bundle yet")
            continue
        text = render_document(doc, source, root)
        if check:
            if not target.is_file() or target.read_text(encoding="utf-8") != text:
                stale.append(doc.path)
            continue
        _write_document(target, doc.path, text)
        print(f"wrote {doc.path} ({len(source.names())} of {len(doc.studies)} studies from bundles)")
    stale += _figures(root, docs, check=check)
    if stale:
        print("paretolab: stale results document(s), not what their bundles render: " + ", ".join(stale)
              + "; run `make results-docs` and commit the result", file=sys.stderr)
        return 1
    if check:
        print(f"{len(docs)} results document(s) are what their bundles render")
    return 0


def _write_document(target: Path, name: str, text: str) -> None:
    """One document, whole or not at all: a full disk or a file-size limit leaves the previous one as it was, in one line."""
    from paretolab.data.outputs import write_atomic
    from paretolab.errors import ConfigError

    try:
        write_atomic(target, text)
    except OSError as exc:
        raise ConfigError(f"results render: writing {name} failed ({exc.strerror or exc}); it was left as it was: "
                          "free some space (or lift the file-size limit) and render again") from None


def _figures(root: Path, docs: list, *, check: bool) -> list[str]:
    """Draw the manifest's figures of the families rendered (the cross-paper frontier); with ``check``, the stale ones."""
    from paretolab.results.crossplot import cross_points, write_cross_plot
    from paretolab.results.documents import bundle_path, read_figures
    from paretolab.results.source import BundleSource

    stale = []
    for figure in read_figures(root):
        doc = next((d for d in docs if d.family == figure.family), None)
        if doc is None:
            continue
        source = BundleSource([p for p in (bundle_path(root, s) for s in doc.studies) if p.is_file()])
        points = cross_points(source, list(doc.studies), figure.model)
        base = root / figure.out
        if check:
            data = base.with_suffix(".json")
            want = {"model": figure.model, "x": "size_mb", "y": "ppl", "points": points}
            if not data.is_file() or json.loads(data.read_text(encoding="utf-8")) != want:
                stale.append(f"{figure.out}.json")
            continue
        try:
            written = write_cross_plot(points, base, figure.model)
        except OSError as exc:
            from paretolab.errors import ConfigError

            raise ConfigError(f"results render: writing {figure.out} failed ({exc.strerror or exc}); the files written before are "
                              "left as they were: free some space and render again") from None
        print(f"wrote {', '.join(str(p.relative_to(root)) for p in written)} ({len(points)} trials)")
    return stale + _study_figures(root, docs, check=check)


def _study_figures(root: Path, docs: list, *, check: bool) -> list[str]:
    """Each study's frontier picture (results/figures/STUDY.png, .svg, its points in .json); with ``check``, the stale ones."""
    from paretolab.errors import ConfigError
    from paretolab.results.documents import bundle_path
    from paretolab.results.figures import document_figures
    from paretolab.results.source import BundleSource

    stale = []
    for doc in docs:
        source = BundleSource([p for p in (bundle_path(root, s) for s in doc.studies) if p.is_file()])
        try:
            found, written = document_figures(root, list(doc.studies), source, check=check)
        except OSError as exc:
            raise ConfigError(f"results render: writing the figures of {doc.path} failed ({exc.strerror or exc}); the files "
                              "written before are left as they were: free some space and render again") from None
        stale += found
        if written:
            print(f"wrote {len(written) // 3} picture(s) of {doc.path} under results/figures/")
    return stale


def _run(root: Path, docs: list, args: argparse.Namespace) -> int:
    """Run each study whose bundle is missing or stale, one at a time, and write its bundle as soon as it finishes."""
    from paretolab.errors import ConfigError
    from paretolab.results.bundle_stores import export_bundle
    from paretolab.results.documents import bundle_path, expected_minutes, run_state, worst_case_minutes
    from paretolab.results.load import MAX_LOAD
    from paretolab.stores import resolve_stores

    if args.max_load is None:
        args.max_load = MAX_LOAD
    home = Path(args.home or root / "results" / ".store")
    stores = resolve_stores(home=str(home))
    def state(doc: Any, study: str) -> tuple[str, str]:
        return run_state(root, study, timed=study in doc.timed, max_load=args.max_load, busy_ok=args.busy_ok)

    todo = [(doc, s) for doc in docs for s in doc.studies if state(doc, s)[0] != "current"]
    if args.untimed:
        skipped = [s for doc, s in todo if s in doc.timed]
        todo = [(doc, s) for doc, s in todo if s not in doc.timed]
        if skipped:
            print(f"--untimed: leaving {len(skipped)} timed stud{'y' if len(skipped) == 1 else 'ies'} for an idle machine: {', '.join(skipped)}")
    if args.timed:
        left = [s for doc, s in todo if s not in doc.timed]
        todo = [(doc, s) for doc, s in todo if s in doc.timed]
        if left:
            print(f"--timed: leaving {len(left)} untimed stud{'y' if len(left) == 1 else 'ies'} for later (--untimed beside other work): {', '.join(left)}")
    if not todo:
        print("every bundle is current: nothing to run (`paretolab results render` writes the documents)")
        return 0
    for doc, study in todo:  # before any study runs: a misspelling in the manifest, not a study that fails an hour in
        now, why = state(doc, study)
        if now == "unknown":
            raise ConfigError(f"results/documents.yaml, document {doc.family}: {why}")
    print(f"{len(todo)} stud{'y' if len(todo) == 1 else 'ies'} to run into {home}: " + ", ".join(s for _, s in todo))
    known = {s: m for _, s in todo if (m := expected_minutes(root, s)) is not None}
    bound = {s: m for _, s in todo if s not in known and (m := worst_case_minutes(root, s)) is not None}
    parts = [f"~{sum(known.values()):.0f} min for the {len(known)} with an earlier bundle (as long as it took then)"] if known else []
    parts += [f"at most {sum(bound.values()):.0f} min for the {len(bound)} without one (trials x trial_timeout_s)"] if bound else []
    print("expected duration: " + ("; ".join(parts) if parts else "unknown") + "; each study prints its progress as it runs")
    if any(s in doc.timed for doc, s in todo):
        print("timed studies among them: run this on an otherwise idle machine (their timings rank trials or feed claims)")
    if args.dry_run:
        return 0
    prepared: set[str] = set()
    bin_dir = Path(sys.executable).parent
    for doc, study in todo:
        for command in doc.prepare:
            if command not in prepared:
                print(f"prepare: {command}", flush=True)
                prepared.add(command)
                _call([str(bin_dir / command.split()[0]), *command.split()[1:]], root)
        now, why = state(doc, study)
        if now == "stale":
            _forget(root, stores, study, why)
        elif now == "busy":
            _forget_finished(stores, study, why)
        if study in doc.timed and not args.busy_ok:
            wait_for_quiet(study, args.max_load, args.wait_min)
        start = time.monotonic()
        print(f"run {study} ({'timed' if study in doc.timed else 'untimed'})", flush=True)
        code = _call([str(bin_dir / "paretolab"), "run", str(root / "pipelines" / f"{study}.yaml"), "--resume", "--home", str(home),
                      *(["--no-progress"] if args.no_progress else [])], root)
        if code != 0:
            raise ConfigError(f"study {study} stopped with exit code {code}; `paretolab results run {doc.family}` resumes it")
        _require_a_completed_trial(stores, study, doc.family)
        out = bundle_path(root, study)
        written = export_bundle([study], stores, out)
        print(f"wrote {out.relative_to(root)} ({written[study]} trials, {(time.monotonic() - start) / 60:.1f} min); commit it", flush=True)
    return 0


def _require_a_completed_trial(stores: object, study: str, family: str) -> None:
    """A study that completed no trial (every trial failed: an engine not installed, say) leaves no bundle: committed, it
    would replace real results with none."""
    from paretolab.errors import ConfigError
    from paretolab.results.read import load_study

    trials = load_study(study, stores).trials  # type: ignore[arg-type]
    if not any(t.state.name == "COMPLETE" for t in trials):
        raise ConfigError(f"study {study} completed none of its {len(trials)} trial(s), so no bundle was written; "
                          f"`paretolab report {study}` lists why they failed; fix that, then `paretolab results run {family}`")


def wait_for_quiet(study: str, max_load: float, wait_min: float, poll_s: float = 15.0) -> None:
    """A timed study starts alone: wait while the 1-min load average exceeds ``max_load``; a ConfigError after ``wait_min``."""
    from paretolab.errors import ConfigError
    from paretolab.measure.timing import machine_load

    deadline = time.monotonic() + wait_min * 60
    load = machine_load()
    if load > max_load:
        print(f"{study} times something: waiting up to {wait_min:g} min for the machine to quiet down "
              f"(1-min load average {load:.1f} > --max-load {max_load:g})", flush=True)
    while load > max_load:
        if time.monotonic() >= deadline:
            raise ConfigError(f"{study}: the machine stayed busy for {wait_min:g} min (1-min load average {load:.1f} > --max-load "
                              f"{max_load:g}); stop the other work, raise --wait-min, or pass --busy-ok to time it anyway "
                              "(its document then prints the load)")
        time.sleep(poll_s)
        load = machine_load()


def _forget(root: Path, stores: object, study: str, why: str) -> None:
    """A study in the results store from another pipeline: removed, so that the rerun starts it afresh."""
    from paretolab.errors import ConfigError
    from paretolab.results.read import load_study
    from paretolab.stores.remove import remove_study
    from paretolab.study.spec import load_spec

    try:
        stored = load_study(study, stores).user_attrs.get("pipeline_hash")  # type: ignore[arg-type]
    except ConfigError:
        return  # not in the store: the run creates it
    if not load_spec(root / "pipelines" / f"{study}.yaml").matches_hash(stored):
        print(f"{study}: the results store holds it from another pipeline ({why}); starting it afresh")
        remove_study(stores, study)  # type: ignore[arg-type]


def _forget_finished(stores: object, study: str, why: str) -> None:
    """A busy bundle's study finished in the results store: removed, so it is timed again rather than re-exported (an
    unfinished one resumes: that is a retiming under way)."""
    from paretolab.errors import ConfigError
    from paretolab.results.read import load_study
    from paretolab.stores.remove import remove_study

    try:
        stored = load_study(study, stores)  # type: ignore[arg-type]
    except ConfigError:
        return
    wanted = ((stored.user_attrs.get("pipeline") or {}).get("search") or {}).get("trials")
    done = sum(t.state.is_finished() for t in stored.get_trials(deepcopy=False))
    if isinstance(wanted, int) and done >= wanted:
        print(f"{study}: its bundle was {why}; the results store's run is finished, so it is timed again afresh")
        remove_study(stores, study)  # type: ignore[arg-type]


def _call(argv: list[str], cwd: Path) -> int:
    return subprocess.run(argv, check=False, cwd=cwd).returncode

"""Trials per minute on the smoke study with 1, 2 and 4 concurrent workers, in one run.

    python benchmarks/cluster.py [--trials 12] [--workers 1,2,4] [--cpus 4]

Starts a throwaway Ray head on 127.0.0.1 (token auth on, ``--cpus`` logical CPUs) and runs
pipelines/smoke.yaml (tiny-llama; magnitude pruning then RTN or nothing; perplexity on 4,096
tokens) once per worker count, each as its own study (``smoke-wN``, ``resources.workers: N``)
with the same seed and trial count, stores in a temporary folder (SQLite; the driver is their
only writer). Two rates per row: over the trial loop alone (workers already holding the model)
and end to end (including starting the workers). Ratios are against the first row. On a
machine with fewer cores than workers the trials share cores, and the table shows it.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=12, help="trials per study (default 12)")
    parser.add_argument("--workers", default="1,2,4", help="worker counts, comma-separated (default 1,2,4)")
    parser.add_argument("--cpus", type=int, default=4, help="logical CPUs the Ray head offers (default 4)")
    args = parser.parse_args()
    counts = [int(w) for w in args.workers.split(",")]

    from paretolab.cluster.localcluster import RayCluster

    cluster = RayCluster(head_cpus=max(args.cpus, max(counts))).start()
    os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": cluster.token})  # before Ray is imported
    try:
        rows = [run(n, args.trials, cluster.address) for n in counts]
    finally:
        import ray

        ray.shutdown()
        cluster.stop()
    print(f"\nsmoke study, {args.trials} trials each, {os.cpu_count()} CPU core(s), Ray head with {max(args.cpus, max(counts))} logical CPUs\n")
    print(f"{'workers':>7}  {'completed':>9}  {'loop_s':>7}  {'trials/min':>10}  {'x vs 1st':>8}  {'total_s':>7}  {'trials/min e2e':>14}  {'x vs 1st':>8}")
    base = rows[0]
    for r in rows:
        print(f"{r['workers']:>7}  {r['completed']:>9}  {r['loop_s']:>7.1f}  {r['tpm']:>10.1f}  {r['tpm'] / base['tpm']:>8.2f}  "
              f"{r['total_s']:>7.1f}  {r['tpm_e2e']:>14.1f}  {r['tpm_e2e'] / base['tpm_e2e']:>8.2f}")


def run(workers: int, trials: int, address: str) -> dict:
    """One study with ``workers`` concurrent trials; its rates."""
    from paretolab.stores import resolve_stores
    from paretolab.study.driver import run_study
    from paretolab.study.spec import parse_spec

    raw = yaml.safe_load((ROOT / "pipelines" / "smoke.yaml").read_text())
    raw["name"] = f"smoke-w{workers}"
    raw["resources"] = {"cpus": 1, "workers": workers}
    spec = parse_spec(raw)
    with tempfile.TemporaryDirectory(prefix="paretolab-bench-") as home:
        start = time.perf_counter()
        outcome = run_study(spec, stores=resolve_stores(home=home), address=address, trials=trials, progress=False, log=lambda *_: None)
        total = time.perf_counter() - start
    if outcome.completed != trials:
        raise SystemExit(f"{spec.name}: {outcome.completed}/{trials} trials completed ({outcome.failed} failed)")
    return {"workers": workers, "completed": outcome.completed, "loop_s": outcome.wall_s, "tpm": 60 * outcome.completed / outcome.wall_s,
            "total_s": total, "tpm_e2e": 60 * outcome.completed / total}


if __name__ == "__main__":
    main()

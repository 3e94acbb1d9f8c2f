"""The dashboard's frontier data path on a 100,000-trial two-objective study, against Optuna's best_trials.

    python benchmarks/dashboard.py [--trials 100000] [--repeat 5] [--store DIR]

Fills a SQLite store with synthetic trials (``study.add_trials`` + ``create_trial``: one commit
per trial, about 20 minutes for 100,000 on two cores; ``--store DIR`` keeps the store and reuses
it on the next run), then times in one process:
  (a) cold: our data path from an empty cache, everything the first paint of the Frontier page
      computes: the store read (what is known of the store included), frontier, plot data, figure,
  (b) warm: a repaint from the cache (the store's change check + cache hit + memoised plot data),
  (c) ``optuna.load_study(...).best_trials`` on the same store,
and prints the times and the ratio (c)/(a). Each number is the median of ``--repeat`` runs, with
the range and the CPU time of this process beside it (the wall time on a shared machine varies
with the neighbours' load; the CPU time much less). (a) clears our cache before each run. The
registry (plugin import) is left out: it is loaded once per server process, not per repaint.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import create_trial

from paretolab.dashboard import data
from paretolab.dashboard.plots import frontier_figure, frontier_points

OBJECTIVES = [("ppl", "minimize"), ("size_bytes", "minimize")]
PIPELINE = {
    "name": "bench",
    "stages": [
        {"method": "magnitude", "params": {"sparsity": {"low": 0.0, "high": 0.95}}},
        {"choice": [{"method": "rtn", "params": {"bits": [2, 3, 4, 8]}}, {"method": "none"}]},
    ],
    "search": {"trials": 10_000},
}
COST = {"magnitude": "simulated", "rtn": "simulated", "none": "real"}


def fill(url: str, n: int, seed: int = 0) -> None:
    """A study of ``n`` complete trials whose ppl/size trade-off has a realistic frontier.

    ``add_trials`` commits once per trial; with SQLite's default fsync that is ~30 ms a trial
    on two cores (5 minutes for 10k), so the fill turns synchronous writes off (~7 ms a trial).
    """
    import sqlalchemy as sa

    rng = np.random.default_rng(seed)
    storage = optuna.storages.RDBStorage(url)

    @sa.event.listens_for(storage.engine, "connect")
    def _fast_sqlite(dbapi_connection, _record):  # a throwaway benchmark store: durability does not matter
        dbapi_connection.execute("PRAGMA synchronous=OFF")
        dbapi_connection.execute("PRAGMA journal_mode=MEMORY")

    storage.engine.dispose()
    study = optuna.create_study(study_name="bench", storage=storage, directions=["minimize", "minimize"])
    study.set_user_attr("objectives", [list(o) for o in OBJECTIVES])
    study.set_user_attr("pipeline", PIPELINE)
    study.set_user_attr("methods", ["magnitude", "none", "rtn"])
    sparsity_d, bits_d, stage_d = FloatDistribution(0.0, 0.95), CategoricalDistribution([2, 3, 4, 8]), CategoricalDistribution(["rtn", "none"])
    trials = []
    for _ in range(n):
        sparsity = float(rng.uniform(0.0, 0.95))
        quant = bool(rng.random() < 0.8)
        bits = int(rng.choice([2, 3, 4, 8])) if quant else 16
        size = 1e6 * (1 - sparsity) * bits / 16 * float(rng.uniform(0.98, 1.02))
        ppl = 20.0 * np.exp(3 * sparsity**3 + 4.0 / bits**1.5) * float(rng.uniform(1.0, 1.3))
        params = {"magnitude.sparsity": sparsity, "stage1.method": "rtn" if quant else "none"}
        dists = {"magnitude.sparsity": sparsity_d, "stage1.method": stage_d}
        if quant:
            params["rtn.bits"], dists["rtn.bits"] = bits, bits_d
        trials.append(create_trial(params=params, distributions=dists, values=[float(ppl), float(size)]))
    study.add_trials(trials)


def our_path(url: str) -> int:
    """What the Frontier page's server side does for the default view: read, frontier, plot data, figure.

    Plot data and figure are memoised on the cached table exactly as the page does it.
    """
    table = data.load_trials(url, "bench", methods_cost=COST)
    metrics, dirs = [m for m, _ in OBJECTIVES], [d for _, d in OBJECTIVES]
    front = table.frontier(metrics, dirs)
    points = table.memo(("bench", "points"), lambda: frontier_points(
        table.complete(), front, x=metrics[0], y=metrics[1], directions=(dirs[0], dirs[1]), param_columns=table.param_columns))
    table.memo(("bench", "figure"), lambda: frontier_figure(points))
    return len(front)


def page_times(url: str, repeat: int) -> tuple[float, float]:
    """The real Frontier page in Streamlit's AppTest (widgets, figure serialisation included): cold and warm."""
    import os

    from streamlit.testing.v1 import AppTest

    os.environ["PARETOLAB_OPTUNA_STORAGE"] = url
    os.environ["PARETOLAB_TRACKING_URI"] = url.replace("optuna.db", "mlflow.db")
    app = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")
    at = AppTest.from_file(app, default_timeout=120)
    at.query_params.update(page="Frontier", study="bench")
    at.run()  # warm-up: plugin registry (torch import) and Streamlit itself load once per server process
    assert not at.exception, [e.value for e in at.exception]

    def rerun() -> None:
        at.run()
        assert not at.exception, [e.value for e in at.exception]

    cold, _ = timed(rerun, repeat, before=data.clear_cache, label="page cold")
    warm, _ = timed(rerun, repeat, label="page warm")
    return cold, warm


TIMES: dict[str, tuple[list[float], list[float]]] = {}  # what timed() measured last, by label: wall and CPU seconds per run


def timed(fn, repeat: int, before=None, label: str = "") -> tuple[float, object]:
    """The median wall time of ``repeat`` runs of ``fn`` (and its result); every run's wall and CPU time kept in ``TIMES``."""
    times, cpu, out = [], [], None
    for _ in range(repeat):
        if before:
            before()
        start, start_cpu = time.perf_counter(), time.process_time()
        out = fn()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    TIMES[label] = (times, cpu)
    return statistics.median(times), out


def spread(label: str) -> str:
    """'range 0.9-1.3 s, CPU 0.8 s' for the runs of ``label``."""
    wall, cpu = TIMES[label]
    return f"range {min(wall) * 1000:.1f}-{max(wall) * 1000:.1f} ms, CPU median {statistics.median(cpu) * 1000:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--store", help="folder for the store, kept and reused on the next run (default: a temporary folder)")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.store or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{folder / 'optuna.db'}"
        if not data.list_studies(url):
            start = time.perf_counter()
            fill(url, args.trials)
            print(f"filled {args.trials} trials in {time.perf_counter() - start:.1f} s ({url})")
        our_path(url)  # warm-up: imports, SQLAlchemy engine, distribution parsing are per process, not per repaint
        cold, n_front = timed(lambda: our_path(url), args.repeat, before=data.clear_cache, label="cold")
        warm, _ = timed(lambda: our_path(url), args.repeat, label="warm")
        read_only, _ = timed(lambda: data.load_trials(url, "bench", methods_cost=COST).frontier(["ppl", "size_bytes"], ["minimize", "minimize"]),
                             args.repeat, before=data.clear_cache, label="read")
        optuna_s, best = timed(lambda: optuna.load_study(study_name="bench", storage=url).best_trials, args.repeat, label="optuna")
        page_cold, page_warm = page_times(url, args.repeat)
        assert sorted(t.number for t in best) == sorted(int(n) for n in data.load_trials(url, "bench").frontier(["ppl", "size_bytes"], ["minimize", "minimize"])), "frontiers differ"
    print(f"frontier: {n_front} of {args.trials} trials (same set as Optuna's best_trials)")
    print(f"medians of {args.repeat} runs (wall), with their range and CPU time:")
    print(f"(a) ours, cold   (store read + frontier + plot data + figure): {cold * 1000:8.1f} ms   {spread('cold')}")
    print(f"    ours, cold   (store read + frontier only):                {read_only * 1000:8.1f} ms   {spread('read')}")
    print(f"(b) ours, warm   (repaint from cache):                        {warm * 1000:8.1f} ms   {spread('warm')}")
    print(f"(c) optuna.load_study(...).best_trials:                       {optuna_s * 1000:8.1f} ms   {spread('optuna')}")
    print(f"Frontier page in AppTest, cold / warm rerun (all server-side work): {page_cold * 1000:.1f} / {page_warm * 1000:.1f} ms"
          f"   ({spread('page cold')}; {spread('page warm')})")
    print(f"ratio (c)/(a): {optuna_s / cold:.1f}x   (c)/(read+frontier): {optuna_s / read_only:.1f}x   (a)/(b): {cold / warm:.1f}x")


if __name__ == "__main__":
    main()

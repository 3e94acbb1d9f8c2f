"""Hypervolume after N trials: nsga2 and tpe at N vs random at N and 2N, on the smoke and demo spaces.

    python benchmarks/search_hypervolume.py [--seeds 5]

The objective is analytic, not measured: a made-up but monotone model of what the methods do
(pruning raises perplexity with the square of sparsity and saves the pruned weights minus a
1-bit mask; n-bit round-to-nearest with groups of g costs n + 16/g bits per weight and raises
perplexity as 2^-n, worse for larger groups). It is cheap, so the comparison covers many seeds
in seconds; it ranks samplers on these search spaces, it says nothing about the methods. The
trials go through paretolab's Proposer (what the driver does), so repeats are counted too:
`repeats (plain)` is the same sampler used directly, as the driver did before.
Hypervolume is of (log ppl, size) normalised to [0, 1] against the worst value of each, higher
is better.
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

import optuna

from paretolab.study.proposer import Proposer, params_key
from paretolab.study.search import plan_trial
from paretolab.study.spec import StudySpec, load_spec

ROOT = Path(__file__).resolve().parents[1]
BASE_PPL, PARAMS = 20.0, 135e6


def objective(plan) -> tuple[float, float]:
    """(log ppl, bytes) of a plan under the analytic model above."""
    log_ppl, bits, kept = math.log(BASE_PPL), 16.0, 1.0
    for stage in plan:
        p = stage.params
        if stage.method == "magnitude":
            kept = 1.0 - p["sparsity"]
            log_ppl += 3.0 * p["sparsity"] ** 2
        elif stage.method == "rtn":
            bits = p["bits"] + 16.0 / p.get("group_size", 128)
            log_ppl += 6.0 * 2.0 ** -p["bits"] * (1 + p.get("group_size", 128) / 256)
    mask = 1.0 if kept < 1.0 else 0.0
    return log_ppl, PARAMS * (kept * bits + mask) / 8


def run(spec: StudySpec, sampler: str, trials: int, seed: int, plain: bool = False) -> tuple[list[tuple[float, float]], int]:
    """(objective values, repeated parameter sets) of ``trials`` trials."""
    from dataclasses import replace

    from paretolab.study.search import make_sampler

    spec = replace(spec, search=replace(spec.search, sampler=sampler, trials=trials, seed=seed))
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=make_sampler(spec) if plain else None)
    proposer = None if plain else Proposer(spec, study)
    for _ in range(trials):
        trial = proposer.ask() if proposer is not None else study.ask()
        if trial is None:
            break
        study.tell(trial, list(objective(plan_trial(trial, spec))))
    keys = [params_key(t.params) for t in study.trials]
    return [tuple(t.values) for t in study.trials], len(keys) - len(set(keys))


def hypervolume(points: list[tuple[float, float]], ref: tuple[float, float], ideal: tuple[float, float]) -> float:
    """2-D hypervolume (both minimised), normalised so the box from ideal to ref has volume 1."""
    norm = sorted(((x - ideal[0]) / (ref[0] - ideal[0]), (y - ideal[1]) / (ref[1] - ideal[1])) for x, y in points)
    volume, best_y = 0.0, 1.0
    for x, y in norm:
        if y < best_y and x < 1.0:
            volume += (1.0 - x) * (best_y - y)
            best_y = y
    return volume


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    for name in ("smoke", "demo"):
        spec = load_spec(ROOT / "pipelines" / f"{name}.yaml")
        n = spec.search.trials
        sample = run(spec, "random", 2000, 123, plain=True)[0]  # the bounds of the space under this objective
        ref = (max(p[0] for p in sample) * 1.01, max(p[1] for p in sample) * 1.01)
        ideal = (min(p[0] for p in sample), min(p[1] for p in sample))
        print(f"\n{name}: N = {n} trials, {args.seeds} seeds (mean hypervolume; ratio vs random at 2N)")
        print(f"{'sampler':12s} {'trials':>6s} {'hypervolume':>11s} {'vs random@2N':>12s} {'repeats':>8s} {'repeats (plain)':>15s}")
        rows = [("random", 2 * n), ("random", n), ("tpe", n), ("nsga2", n)]
        base = None
        for sampler, trials in rows:
            hv, reps, plain_reps = [], [], []
            for seed in range(args.seeds):
                values, repeats = run(spec, sampler, trials, seed)
                hv.append(hypervolume(values, ref, ideal))
                reps.append(repeats)
                plain_reps.append(run(spec, sampler, trials, seed, plain=True)[1])
            mean = statistics.mean(hv)
            base = base or mean
            print(f"{sampler:12s} {trials:6d} {mean:11.4f} {mean / base:12.3f} {statistics.mean(reps):8.1f} {statistics.mean(plain_reps):15.1f}")


if __name__ == "__main__":
    main()

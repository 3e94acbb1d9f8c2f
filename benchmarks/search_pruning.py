"""Does pruning make a search's compute go further? Hypervolume at equal trial-steps, with and without pruners.

    python benchmarks/search_pruning.py [--seeds 5] [--budget 20] [--json out.json]

ANALYTIC LEARNING-CURVE MODEL, NOT MEASURED TRAINING. Every number comes from a made-up but
plausible model of a `train` stage, so the run takes seconds and covers many seeds; it ranks
ways of spending a search budget on this model, it says nothing about any real training run.

The study is a pipeline with one `train` stage (scratch-1m, batch 16 x seq_len 128 = 2,048
tokens a step, eval_every 25) searching `lr` log-uniform over [1e-4, 0.3] and `tokens` over six
budgets of 100..800 steps; objectives (val_loss, train_flops), both minimised. A trial of peak
lr eta and T steps follows paretolab's own schedule eta(s) = eta * lr_factor(s, T) (5% linear
warm-up, cosine to 0.1 eta) and its loss at step s is

    L(s) = E0 + K * max(0, ln(eta / ETA_S))^2          (a too-large lr plateaus higher)
              + A * (1 + sum_{u<=s} eta(u) / P0)^-ALPHA  (progress grows with the lr's area: a small lr is slow)
              + C * eta(s)                               (the lr's noise floor, which the cosine anneals away)
              + delta + eps_s                            (trial luck delta ~ N(0, 0.02), held-out noise eps ~ N(0, 0.01))

with E0 3.0, K 0.1, ETA_S 3e-3, A 4.0, P0 0.01, ALPHA 0.5, C 15. Once eta(s) passes the trial's
divergence threshold 0.05 * exp(N(0, 0.3)) the loss sits at L0 = 7.0 (diverged). The best lr is
about 1e-2 for 100 steps and 5e-3 for 800. train_flops = 6 * 1e6 parameters * tokens trained.
Noise is drawn from an RNG seeded by (seed, trial number).

Arms, all at the same compute: a budget of trial-steps (--budget full trials of the mean length,
400 steps; a pruned trial spends only the steps it ran; the last trial may overshoot by one
trial). Trials run one at a time. Proposals go through paretolab's Proposer on a StudySpec parsed
from the pipeline dict (what the driver does); pruning goes through paretolab's PruneBoard, the
object the driver asks: each evaluation point the stage goes on after (every 25 steps but the
last, as the train loop reports) calls report(number, step, {"val_loss": v}); True stops the
trial there, then finish(number, "PRUNED"), else finish(number, "COMPLETE", final val_loss). The median pruner
is `pruner: median` (Optuna's defaults). ASHA is `pruner: {name: asha, min_resource: 50,
reduction_factor: 3}`: with Optuna's default min_resource "auto" (the first complete trial's
last step // 100, 1 step here) it stopped ~94% of trials at their first evaluation point and
reached 0.93x tpe's hypervolume (3 seeds), so the rows show the setting a user would pick.

A pruned trial is told to the study as PRUNED with no intermediate values: what the sampler sees
through the Proposer, which hides a pruned trial's reports in a study of several objectives.
Why: Optuna 5.1's multi-objective TPE sorts pruned trials by their last report through
`study.direction`, which raises in a two-objective study; without reports TPE puts pruned trials
in its "bad" set (unless fewer than 10% of the trials completed). Telling it the last reported
values as COMPLETE would instead put half-trained points on the frontier at FLOPs they never reached.

Reading: hypervolume of the complete trials' (val_loss, train_flops), normalised to [0, 1]
between the ideal (3.0 nats = E0, 0 FLOPs) and fixed worst values (4.5 nats, 1.1 x the largest
budget's FLOPs), higher is better; pruned trials produce no final model and add nothing. Compare
each pruned arm with the unpruned arm of the same sampler: above 1.0 the pruner bought
hypervolume with the compute it saved. The reading also gives the share of trials pruned by
schedule length: the pruners compare values at equal steps.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from search_hypervolume import hypervolume

from paretolab.study.proposer import Proposer
from paretolab.study.pruning import PruneBoard
from paretolab.study.search import plan_trial
from paretolab.study.spec import StudySpec, parse_spec
from paretolab.training.loop import lr_factor

HEADER = "analytic learning-curve model, not measured training"
BATCH, SEQ_LEN, EVAL_EVERY = 16, 128, 25
STEP_TOKENS = BATCH * SEQ_LEN
STEPS = (100, 200, 300, 400, 600, 800)  # the searched `tokens`, in steps
N_PARAMS = 1.0e6
E0, K, ETA_S, A, P0, ALPHA, C, L0 = 3.0, 0.1, 3e-3, 4.0, 0.01, 0.5, 15.0, 7.0
ETA_DIV, DIV_SPREAD, TRIAL_SD, EVAL_SD = 0.05, 0.3, 0.02, 0.01
IDEAL = (E0, 0.0)
WORST = (4.5, 1.1 * 6 * N_PARAMS * max(STEPS) * STEP_TOKENS)
FULL_TRIAL = statistics.mean(STEPS)  # steps of one "full trial" in --budget

ASHA = {"name": "asha", "min_resource": 2 * EVAL_EVERY, "reduction_factor": 3}  # rungs at 50, 150, 450 steps; see the docstring
# label, sampler, search.pruner (None: no pruning); each pruned arm names the unpruned arm it is read against
ARMS: tuple[tuple[str, str, Any], ...] = (
    ("random", "random", None),
    ("tpe", "tpe", None),
    ("tpe + median", "tpe", "median"),
    ("random + asha", "random", ASHA),
    ("tpe + asha", "tpe", ASHA),
)


def pipeline(sampler: str, pruner: Any, seed: int) -> dict[str, Any]:
    """The pipeline (as a user would write it) of one arm."""
    search: dict[str, Any] = {"sampler": sampler, "trials": 1000, "seed": seed}  # the budget ends an arm, not this count
    if pruner is not None:
        search["pruner"] = pruner
    return {
        "name": "search_pruning",
        "model": "scratch-1m",
        "task": {"name": "perplexity", "corpus": "pystdlib-val"},
        "stages": [{"id": "train", "method": "train", "params": {
            "lr": {"low": 1e-4, "high": 0.3, "log": True},
            "tokens": [s * STEP_TOKENS for s in STEPS],
            "batch": BATCH, "seq_len": SEQ_LEN, "eval_every": EVAL_EVERY,
        }}],
        "objectives": [{"metric": "val_loss", "direction": "minimize"}, {"metric": "train_flops", "direction": "minimize"}],
        "search": search,
    }


@lru_cache(maxsize=None)
def schedule(steps: int) -> np.ndarray:
    """paretolab's lr multiplier at each of ``steps`` steps (warm-up 0.05, cosine to 0.1: the train stage's defaults)."""
    return np.array([lr_factor(s, steps, 0.05, 0.1) for s in range(steps)])


def curve(lr: float, steps: int, rng: np.random.Generator) -> np.ndarray:
    """Noiseless-but-for-trial-luck val_loss after each of ``steps`` steps at peak lr ``lr`` (the model above)."""
    eta = lr * schedule(steps)
    loss = E0 + K * max(0.0, math.log(lr / ETA_S)) ** 2 + A * (1.0 + np.cumsum(eta) / P0) ** -ALPHA + C * eta
    threshold = ETA_DIV * math.exp(rng.normal(0.0, DIV_SPREAD))
    diverged = np.maximum.accumulate(eta > threshold)
    return np.where(diverged, L0, loss + rng.normal(0.0, TRIAL_SD))


def report_points(steps: int) -> list[int]:
    """The steps the train loop reports at: every eval_every steps, but not the last (the stage stops there anyway)."""
    return list(range(EVAL_EVERY, steps, EVAL_EVERY))


@dataclass(frozen=True)
class TrialOutcome:
    steps: int  # optimizer steps it ran
    pruned_at: int | None  # the step the pruner stopped it at
    val_loss: float  # its last evaluated val_loss (the final one when it was not pruned)
    planned: int  # the steps its tokens budget asked for


def run_trial(lr: float, steps: int, number: int, seed: int, board: PruneBoard | None) -> TrialOutcome:
    """One trial under the model, reporting each evaluation point to ``board`` and stopping when it says so."""
    rng = np.random.default_rng((seed, number))
    losses = curve(lr, steps, rng)
    for step in report_points(steps):
        value = float(losses[step - 1] + rng.normal(0.0, EVAL_SD))
        if board is not None and board.report(number, step, {"val_loss": value}):
            board.finish(number, "PRUNED")
            return TrialOutcome(step, step, value, steps)
    value = float(losses[steps - 1] + rng.normal(0.0, EVAL_SD))
    if board is not None:
        board.finish(number, "COMPLETE", value)
    return TrialOutcome(steps, None, value, steps)


@dataclass
class ArmRun:
    points: list[tuple[float, float]]  # (val_loss, train_flops) of the complete trials
    started: int = 0
    pruned: int = 0
    steps: int = 0
    by_length: dict[int, list[int]] = field(default_factory=lambda: {s: [0, 0] for s in STEPS})  # planned steps -> [started, pruned]


def run_arm(spec: StudySpec, seed: int, budget_steps: int) -> ArmRun:
    """Trials of ``spec``, one at a time, until ``budget_steps`` trial-steps are spent."""
    study = optuna.create_study(directions=[o.direction for o in spec.objectives], sampler=optuna.samplers.RandomSampler())
    proposer = Proposer(spec, study)
    board = PruneBoard(spec.search.pruner) if spec.search.pruner is not None else None
    run = ArmRun(points=[])
    while run.steps < budget_steps:
        trial = proposer.ask()
        if trial is None:
            break
        params = plan_trial(trial, spec)[0].params
        outcome = run_trial(float(params["lr"]), int(params["tokens"]) // STEP_TOKENS, trial.number, seed, board)
        run.started += 1
        run.steps += outcome.steps
        run.by_length[outcome.planned][0] += 1
        if outcome.pruned_at is not None:
            run.pruned += 1
            run.by_length[outcome.planned][1] += 1
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            flops = 6 * N_PARAMS * outcome.steps * STEP_TOKENS
            run.points.append((outcome.val_loss, flops))
            study.tell(trial, [outcome.val_loss, flops])
    return run


def summarise(label: str, runs: list[ArmRun], seeds: list[int]) -> dict[str, Any]:
    """Mean and sd over seeds of what the table shows, and the per-seed numbers."""
    hv = [hypervolume(r.points, WORST, IDEAL) for r in runs]
    best = [min((p[0] for p in r.points), default=math.nan) for r in runs]
    per_k = [h / (r.steps / 1000) for h, r in zip(hv, runs)]
    return {
        "arm": label, "seeds": seeds, "hypervolume": hv, "best_val_loss": best,
        "hv_mean": statistics.mean(hv), "hv_sd": sd(hv), "hv_per_1k_steps": statistics.mean(per_k),
        "best_mean": statistics.mean(best), "best_sd": sd(best),
        "started": statistics.mean(r.started for r in runs), "pruned": statistics.mean(r.pruned for r in runs),
        "steps": statistics.mean(r.steps for r in runs),
        "per_seed": {"started": [r.started for r in runs], "pruned": [r.pruned for r in runs], "steps": [r.steps for r in runs]},
        "pruned_share_by_length": {s: sum(r.by_length[s][1] for r in runs) / max(1, sum(r.by_length[s][0] for r in runs)) for s in STEPS},
    }


def sd(values: list[float]) -> float:
    """Sample standard deviation; 0 for a single value."""
    return statistics.stdev(values) if len(values) > 1 else 0.0


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table, one row per arm."""
    lines = ["| arm | hypervolume | HV per 1k steps | trials started | pruned | trial-steps | best val_loss |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['arm']} | {r['hv_mean']:.4f} ± {r['hv_sd']:.4f} | {r['hv_per_1k_steps']:.4f} | {r['started']:.1f} | "
                     f"{r['pruned']:.1f} | {r['steps']:.0f} | {r['best_mean']:.3f} ± {r['best_sd']:.3f} |")
    return "\n".join(lines)


def reading(rows: list[dict[str, Any]]) -> str:
    """The table in words: each pruned arm against the unpruned arm of its sampler, at equal compute."""
    by = {r["arm"]: r for r in rows}
    out = []
    for label, sampler, pruner in ARMS:
        if pruner is None or sampler not in by or label not in by:
            continue
        r, base = by[label], by[sampler]
        ratio = r["hv_mean"] / base["hv_mean"] if base["hv_mean"] > 0 else math.nan
        gap = r["hv_mean"] - base["hv_mean"]
        noise = math.hypot(r["hv_sd"], base["hv_sd"])
        verdict = "within the seed spread" if abs(gap) <= noise else ("better" if gap > 0 else "worse")
        out.append(f"- {label} reaches {ratio:.3f}x {sampler}'s hypervolume at equal compute ({gap:+.4f}, {verdict}; sd "
                   f"{noise:.4f}), starting {r['started']:.1f} trials against {base['started']:.1f} and pruning {r['pruned']:.1f}; "
                   f"best val_loss {r['best_mean']:.3f} against {base['best_mean']:.3f}.")
    for r in rows:
        if r["pruned"] > 0:
            shares = ", ".join(f"{r['pruned_share_by_length'][s]:.2f}" for s in STEPS)
            out.append(f"- {r['arm']} prunes this share of the trials planned for {', '.join(map(str, STEPS))} steps: {shares} "
                       "(a longer schedule meets more evaluation points, and at equal steps its lr has not annealed yet).")
    top = max(rows, key=lambda r: r["hv_mean"])
    out.append(f"- Highest hypervolume: {top['arm']} ({top['hv_mean']:.4f}). On {HEADER}; one trial at a time.")
    return "\n".join(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """--seeds --budget --json --arms, with the docstring (the model and how to read the table) as help."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 per arm (default 5)")
    parser.add_argument("--budget", type=float, default=20.0,
                        help=f"compute per arm, in full trials of {FULL_TRIAL:.0f} steps (default 20)")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    parser.add_argument("--arms", nargs="+", choices=[a[0] for a in ARMS], metavar="ARM",
                        help=f"run only these arms (default all: {', '.join(repr(a[0]) for a in ARMS)})")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run every arm on every seed, print the table and its reading; returns what --json writes."""
    args = parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    start = time.perf_counter()
    budget_steps = int(round(args.budget * FULL_TRIAL))
    seeds = list(range(args.seeds))
    arms = [a for a in ARMS if args.arms is None or a[0] in args.arms]
    rows = []
    for label, sampler, pruner in arms:
        runs = []
        for seed in seeds:
            spec = parse_spec(pipeline(sampler, pruner, seed), source="search_pruning")
            runs.append(run_arm(spec, seed, budget_steps))
            optuna.logging.set_verbosity(optuna.logging.ERROR)  # PruneBoard sets WARNING
        rows.append(summarise(label, runs, seeds))
    elapsed = time.perf_counter() - start
    print(f"search_pruning: {HEADER}.")
    print(f"budget {budget_steps} trial-steps per arm ({args.budget:g} full trials of {FULL_TRIAL:.0f} steps), {len(seeds)} seed(s), "
          f"hypervolume of (val_loss, train_flops) in [0, 1], higher is better\n")
    print(table(rows))
    print("\n" + reading(rows))
    print(f"\n({elapsed:.1f} s)")
    result = {"model": HEADER, "budget_steps": budget_steps, "budget_full_trials": args.budget, "full_trial_steps": FULL_TRIAL,
              "seeds": seeds, "ideal": IDEAL, "worst": WORST, "arms": rows, "elapsed_s": elapsed}
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()

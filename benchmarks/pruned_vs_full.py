"""What the pruner saved in a real study: search_pruning against search_pruning_off, read from the stores.

    make results-search          # runs the three pipelines, then this
    python benchmarks/pruned_vs_full.py [--home DIR] [--json out.json]

Both studies draw the same 12 learning rates (random sampler, seed 0; a trial's draw depends on
its number only), so the pruned study's trial-steps (``train_steps`` summed over every trial,
pruned ones included: what their training actually ran) against the full study's is the pruner's
saving, and the two best val_loss values are compared against the train-seed spread of the best
learning rate (search_pruning_seeds: seeds 1..3, plus the search's seed 0).
Measured training of scratch-1m on this machine, not a model.
"""

from __future__ import annotations

import argparse
import json
import statistics

import optuna

from paretolab.results.read import load_study
from paretolab.stores.locations import resolve_stores

PRUNED, FULL, SEEDS = "search_pruning", "search_pruning_off", "search_pruning_seeds"


def steps_and_best(name: str, stores) -> dict:
    """Trials, pruned trials, trial-steps spent and the best complete val_loss of one study."""
    from mlflow.tracking import MlflowClient

    study = load_study(name, stores)
    client = MlflowClient(tracking_uri=stores.tracking_uri)
    experiment = client.get_experiment_by_name(name)
    runs = client.search_runs([experiment.experiment_id], "tags.`paretolab.role` = 'trial'", max_results=10_000)
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    best = min(complete, key=lambda t: t.values[0])
    return {
        "trials": len(runs),
        "pruned": sum(1 for r in runs if r.data.tags.get("paretolab.trial_state") == "PRUNED"),
        "trial_steps": int(sum(r.data.metrics.get("train_steps", 0.0) for r in runs)),
        "best_val_loss": best.values[0],
        "best_lr": best.params.get("train.lr"),
        "wall_s": sum(r.data.metrics.get("trial_s", 0.0) for r in runs),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", help="the stores' folder (default: ./.paretolab, as `paretolab run` uses)")
    parser.add_argument("--json", help="also write the numbers here")
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    stores = resolve_stores(home=args.home, create=False)
    pruned, full = steps_and_best(PRUNED, stores), steps_and_best(FULL, stores)
    seeds = [t.values[0] for t in load_study(SEEDS, stores).get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    replicates = [full["best_val_loss"], *seeds] if abs(full["best_lr"] - 0.005095) < 1e-5 else seeds
    sd = statistics.stdev(replicates) if len(replicates) > 1 else float("nan")
    ratio = pruned["trial_steps"] / full["trial_steps"]
    gap = pruned["best_val_loss"] - full["best_val_loss"]
    print("| study | trials | pruned | trial-steps | trial seconds | best val_loss | at lr |")
    print("|---|---|---|---|---|---|---|")
    for name, row in ((PRUNED, pruned), (FULL, full)):
        print(f"| {name} | {row['trials']} | {row['pruned']} | {row['trial_steps']:,} | {row['wall_s']:.0f} | {row['best_val_loss']:.4f} | {row['best_lr']:.4g} |")
    print(f"\ntrial-steps: pruned / full = {ratio:.3f}; best val_loss gap (pruned - full) = {gap:+.4f} nats; "
          f"train-seed sd of val_loss at the best lr = {sd:.4f} nats over {len(replicates)} seeds "
          f"({'within' if abs(gap) <= 2 * sd else 'NOT within'} 2 sd)")
    out = {"pruned": pruned, "full": full, "seed_replicates": replicates, "seed_sd": sd, "steps_ratio": ratio, "best_gap": gap}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()

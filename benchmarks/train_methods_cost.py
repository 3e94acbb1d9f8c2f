"""What prac and tetrajet cost a train step, side by side with plain training of the same model, in one run.

    python benchmarks/train_methods_cost.py [--model scratch-1m] [--steps 10] [--threads 1] [--seq-len 128] [--batch 16]

Each arm runs the train stage for ``--steps`` steps from the same seed (evaluation points left out)
and reports its ``train_tok_s`` and ``peak_act_mb``, with ratios against ``none``. The arms
alternate over two rounds so that load on a shared machine hits them alike. tetrajet's cost is that
of the fp32 simulation of NVFP4 (no FP4 hardware here): a slowdown, not an FP4 speed.
"""

from __future__ import annotations

from typing import Any

import torch
from _train_stage import arguments, train_metrics

ARMS: dict[str, tuple[str, dict[str, Any]] | None] = {
    "none": None,
    "prac (keep 0.25)": ("prac", {"mode": "prac", "keep": 0.25}),
    "tetrajet naive": ("tetrajet", {"recipe": "naive"}),
    "tetrajet": ("tetrajet", {"recipe": "tetrajet"}),
}


def main() -> None:
    args = arguments(__doc__, steps=10)
    from paretolab.models import load_subject

    torch.set_num_threads(args.threads)
    base = load_subject(args.model)
    train_metrics(base.copy(), None, 1, args.batch, args.seq_len, args.threads)  # tokenize the corpus once (cached on disk), outside the timing
    results: dict[str, list[dict[str, float]]] = {name: [] for name in ARMS}
    for _ in range(2):
        for name, arm in ARMS.items():
            results[name].append(train_metrics(base.copy(), arm, args.steps, args.batch, args.seq_len, args.threads))
    speed = {name: sum(r["train_tok_s"] for r in rows) / len(rows) for name, rows in results.items()}
    memory = {name: rows[0]["peak_act_mb"] for name, rows in results.items()}
    print(f"{args.model}, {args.steps} steps of {args.batch}x{args.seq_len} tokens, {args.threads} thread(s), mean of 2 rounds")
    print(f"{'arm':<20} {'tokens/s':>10} {'÷ none':>7} {'peak_act_mb':>12} {'÷ none':>7}")
    for name in ARMS:
        print(f"{name:<20} {speed[name]:>10.0f} {speed[name] / speed['none']:>7.2f} {memory[name]:>12.2f} {memory[name] / memory['none']:>7.2f}")


if __name__ == "__main__":
    main()

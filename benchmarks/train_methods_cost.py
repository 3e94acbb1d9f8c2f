"""What prac and tetrajet cost a train step, side by side with plain training of the same model, in one run.

    python benchmarks/train_methods_cost.py [--model scratch-1m] [--steps 10] [--threads 1] [--seq-len 128] [--batch 16]

Each arm runs the train stage for ``--steps`` steps from the same seed (evaluation points left out)
and reports its ``train_tok_s`` and ``peak_act_mb``, with ratios against ``none``. The arms
alternate over two rounds so that load on a shared machine hits them alike. tetrajet's cost is that
of the fp32 simulation of NVFP4 (no FP4 hardware here): a slowdown, not an FP4 speed.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import torch

ARMS: dict[str, tuple[str, dict[str, Any]] | None] = {
    "none": None,
    "prac (keep 0.25)": ("prac", {"mode": "prac", "keep": 0.25}),
    "tetrajet naive": ("tetrajet", {"recipe": "naive"}),
    "tetrajet": ("tetrajet", {"recipe": "tetrajet"}),
}


def run(subject: Any, arm: tuple[str, dict[str, Any]] | None, steps: int, batch: int, seq_len: int, threads: int) -> dict[str, float]:
    from paretolab.context import TrialContext
    from paretolab.plugin_manager import registries

    with TemporaryDirectory() as tmp:
        ctx = TrialContext(seed=0, workdir=Path(tmp), task={"name": "perplexity", "corpus": "pystdlib-val"}, cpus=threads, stage="s")
        if arm is not None:
            subject = registries().methods.get(arm[0]).transform(subject, dict(arm[1]), ctx)
        params = {"tokens": steps * batch * seq_len, "seq_len": seq_len, "batch": batch, "eval_every": steps + 1, "eval_tokens": seq_len,
                  "corpus": "pystdlib-train"}
        out = registries().methods.get("train").transform(subject, params, ctx)
    return out.training.metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="scratch-1m")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    from paretolab.models import load_subject

    torch.set_num_threads(args.threads)
    base = load_subject(args.model)
    run(base.copy(), None, 1, args.batch, args.seq_len, args.threads)  # tokenize the corpus once (cached on disk), outside the timing
    results: dict[str, list[dict[str, float]]] = {name: [] for name in ARMS}
    for _ in range(2):
        for name, arm in ARMS.items():
            results[name].append(run(base.copy(), arm, args.steps, args.batch, args.seq_len, args.threads))
    speed = {name: sum(r["train_tok_s"] for r in rows) / len(rows) for name, rows in results.items()}
    memory = {name: rows[0]["peak_act_mb"] for name, rows in results.items()}
    print(f"{args.model}, {args.steps} steps of {args.batch}x{args.seq_len} tokens, {args.threads} thread(s), mean of 2 rounds")
    print(f"{'arm':<20} {'tokens/s':>10} {'÷ none':>7} {'peak_act_mb':>12} {'÷ none':>7}")
    for name in ARMS:
        print(f"{name:<20} {speed[name]:>10.0f} {speed[name] / speed['none']:>7.2f} {memory[name]:>12.2f} {memory[name] / memory['none']:>7.2f}")


if __name__ == "__main__":
    main()

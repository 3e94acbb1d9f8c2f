"""Layer dropping vs the dense model, timed by the latency measure, on an idle and on a loaded machine.

    python benchmarks/latency_under_load.py [--model smollm2-135m] [--drops 4,8,12] [--load-procs 1] [--json OUT]

For each condition (``idle``: nothing of ours beside it; ``loaded``: ``--load-procs`` CPU-bound
processes spinning beside it, each bounded by ``--load-max-s``) the latency measure times every
dropped-layer model against the dense one, alternating in the same process, exactly as a trial
does (node lock, ``--cpus`` torch threads, repeats until the spread is small or ``--max-s``).
It also times the dense model against itself ``--dense-repeats`` times, giving the spread of the
dense model's repeated timings: what an absolute ``prefill_ms`` ranking has to beat.
A row per model: prefill_speedup (the ratio, with its IQR), prefill_ms of the method and of the
dense model timed beside it, decode_speedup, and the same two ratios in process CPU time.
The claim checked: prefill_speedup > 1 for every
dropped-layer setting in both conditions.
"""

from __future__ import annotations

import argparse
import copy
import json
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from paretolab.measure.measures import Latency, LatencyOptions
from paretolab.measure.timing import spread
from paretolab.models import load_subject
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.subject import Subject
from paretolab.plugins.layerdrop import remove_layers


def spin(deadline: float) -> None:
    """CPU-bound load: busy arithmetic until ``deadline`` (time.time()) or until the benchmark is gone."""
    parent = os.getppid()
    x = 0
    while time.time() < deadline and os.getppid() == parent:
        for i in range(100_000):
            x += i * i
    return None


def dropped(dense: Subject, k: int) -> Subject:
    """The dense subject with ``k`` decoder layers removed, spread evenly over the middle of the stack."""
    subject = dense.copy()
    n = subject.model.config.num_hidden_layers
    drop = sorted({round(2 + i * (n - 4) / max(k, 1)) for i in range(k)})[:k]
    remove_layers(subject.model, drop)
    return subject


def run_condition(name: str, dense: Subject, variants: dict[str, Subject], options: LatencyOptions, cpus: int, dense_repeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        ctx = TrialContext(seed=0, workdir=Path(tmp), cpus=cpus, base=dense)
        rows = []
        for label, subject in variants.items():
            start = time.perf_counter()
            out = Latency().measure(subject, options, ctx)
            rows.append({"condition": name, "model": label, "seconds": time.perf_counter() - start, **out})
            print(f"  {name:6s} {label:9s} prefill_speedup {out['prefill_speedup']:.3f} (IQR {out['prefill_speedup_iqr']:.3f})  "
                  f"prefill_ms {out['prefill_ms']:.1f} (IQR {out['prefill_ms_iqr']:.1f}) vs dense {out['base_prefill_ms']:.1f}  "
                  f"decode_speedup {out['decode_speedup']:.3f}  cpu speedups {out['prefill_cpu_speedup']:.3f} / {out['decode_cpu_speedup']:.3f}", flush=True)
        dense_ms = []
        for _ in range(dense_repeats):
            out = Latency().measure(dense.copy(), options, ctx)
            dense_ms += [out["prefill_ms"], out["base_prefill_ms"]]
    return {"rows": rows, "dense_prefill_ms": dense_ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--drops", default="4,8,12", help="layers removed per variant")
    parser.add_argument("--cpus", type=int, default=1, help="torch threads (the trial's resources.cpus)")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--max-s", type=float, default=10.0, help="time cap per phase of each measure")
    parser.add_argument("--dense-repeats", type=int, default=3, help="dense-vs-dense measures per condition")
    parser.add_argument("--load-procs", type=int, default=1)
    parser.add_argument("--load-max-s", type=float, default=900.0, help="the load generator stops by itself after this")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    dense = load_subject(args.model)
    variants = {"dense": dense.copy(), **{f"drop{k}": dropped(dense, k) for k in map(int, args.drops.split(","))}}
    options = LatencyOptions(prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens, max_s=args.max_s)
    print(f"{args.model}: {dense.model.config.num_hidden_layers} layers; {options}", flush=True)
    results = {"idle": run_condition("idle", dense, variants, options, args.cpus, args.dense_repeats)}
    spawn = multiprocessing.get_context("spawn")
    load = [spawn.Process(target=spin, args=(time.time() + args.load_max_s,), daemon=True) for _ in range(args.load_procs)]
    for p in load:
        p.start()
    try:
        results["loaded"] = run_condition("loaded", dense, variants, options, args.cpus, args.dense_repeats)
    finally:
        for p in load:
            p.terminate()
            p.join()

    print("\ncondition  model      prefill_speedup (IQR)  decode_speedup (IQR)  prefill_ms  dense beside it  prefill_cpu_speedup  decode_cpu_speedup")
    for condition, result in results.items():
        for r in result["rows"]:
            print(f"{condition:9s}  {r['model']:9s}  {r['prefill_speedup']:6.3f} ({r['prefill_speedup_iqr']:.3f})       "
                  f"{r['decode_speedup']:6.3f} ({r['decode_speedup_iqr']:.3f})       {r['prefill_ms']:8.1f}    {r['base_prefill_ms']:8.1f}       {r['prefill_cpu_speedup']:6.3f}               {r['decode_cpu_speedup']:6.3f}")
        ms = result["dense_prefill_ms"]
        result["dense_spread"] = {"n": len(ms), "median_ms": statistics.median(ms), "iqr_ms": spread(ms), "min_ms": min(ms), "max_ms": max(ms)}
        print(f"{condition:9s}  dense prefill_ms over {len(ms)} timings: median {statistics.median(ms):.1f}, IQR {spread(ms):.1f}, "
              f"range {min(ms):.1f}–{max(ms):.1f} (max/min {max(ms) / min(ms):.2f})")
    faster = all(r["prefill_speedup"] > 1 for res in results.values() for r in res["rows"] if r["model"] != "dense")
    print(f"\nprefill_speedup > 1 for every dropped-layer setting in both conditions: {faster}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

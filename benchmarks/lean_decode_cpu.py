"""The lean batch-1 forward vs transformers' forward, SmolLM2-135M greedy decoding on the CPU, in one run.

    python benchmarks/lean_decode_cpu.py [--rounds 7] [--new-tokens 32] [--out lean_decode_cpu.json]

Three weight set-ups, each decoded three ways (``paretolab.generation.lean``): transformers' forward
(``hf``), the lean forward with torch's operations around the linears (``lean_torch``) and with
its C operations where they run (``lean``: RMSNorm, rotary, attention, silu * up, one C call each;
``paretolab.kernels.lean_cpu``, AVX-512 CPUs); fp32 weights through torch, fp32 through the dense
CPU kernel, bf16 weights through it (activations fp32). Each round
times, for every contender in a rotating order, a run of ``--new-tokens`` greedy tokens after a
16-token prompt and a run of one token; their difference over ``new_tokens - 1`` is one decoding
step. ``lean_over_hf`` is the median of per-round step-time ratios (> 1: lean is faster),
``c_ops_over_torch_ops`` the same for the C operations against torch's in the lean forward;
``tokens_equal`` says whether all three produced the same tokens. Timing repeats (rounds), not replicates: a speed figure for this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch

from benchmarks.macko_cpu import bf16_weights, interleaved
from paretolab.generation import greedy_decode
from paretolab.generation.lean import lean_c_operations, lean_decoding
from paretolab.kernels.dense_cpu import dense_cpu_kernel, fast_linears
from paretolab.kernels.lean_cpu import lean_ops
from paretolab.measure.timing import cpu_name, node_lock, torch_threads
from paretolab.models import load_subject


MODES = {"hf": (False, False), "lean_torch": (True, False), "lean": (True, True)}  # mode -> (lean forward, C operations)


def decode(model: torch.nn.Module, prompt: torch.Tensor, n: int, *, lean: bool, kernel: bool, c_ops: bool = True) -> torch.Tensor:
    with lean_decoding(lean), lean_c_operations(c_ops):
        if not kernel:
            return greedy_decode(model, prompt, n)
        with fast_linears(model):
            return greedy_decode(model, prompt, n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=0, help="torch threads, also the kernel's (0: torch's default)")
    parser.add_argument("--out", default="lean_decode_cpu.json")
    args = parser.parse_args()
    load_before = os.getloadavg()
    prompt = torch.randint(3, 40000, (1, 16), generator=torch.Generator().manual_seed(0))
    setups = {"torch_fp32": (load_subject(args.model).model.eval(), False)}
    if dense_cpu_kernel():
        setups["kernel_fp32"] = (setups["torch_fp32"][0], True)
        setups["kernel_bf16"] = (bf16_weights(load_subject(args.model).model).eval(), True)
    with node_lock(), torch_threads(args.threads), torch.no_grad():
        calls, tokens = {}, {}
        for name, (model, kernel) in setups.items():
            for mode, (lean, c_ops) in MODES.items():
                key = f"{name}_{mode}"
                tokens[key] = decode(model, prompt, args.new_tokens, lean=lean, kernel=kernel, c_ops=c_ops)
                calls[key] = lambda m=model, k=kernel, le=lean, c=c_ops: decode(m, prompt, args.new_tokens, lean=le, kernel=k, c_ops=c)
                calls[f"{key}:1"] = lambda m=model, k=kernel, le=lean, c=c_ops: decode(m, prompt, 1, lean=le, kernel=k, c_ops=c)
        times = interleaved(calls, args.rounds, 1)
        threads = torch.get_num_threads()
    step = {k: [(t - t1) / (args.new_tokens - 1) for t, t1 in zip(times[k], times[f"{k}:1"], strict=True)] for k in tokens}
    rows = []
    for name in setups:
        hf, plain, lean = step[f"{name}_hf"], step[f"{name}_lean_torch"], step[f"{name}_lean"]
        rows.append({
            "setup": name, "hf_step_ms": 1e3 * statistics.median(hf), "lean_torch_step_ms": 1e3 * statistics.median(plain),
            "lean_step_ms": 1e3 * statistics.median(lean),
            "hf_tok_s": 1 / statistics.median(hf), "lean_torch_tok_s": 1 / statistics.median(plain), "lean_tok_s": 1 / statistics.median(lean),
            "lean_over_hf": statistics.median(h / le for h, le in zip(hf, lean, strict=True)),
            "c_ops_over_torch_ops": statistics.median(p / le for p, le in zip(plain, lean, strict=True)),
            "tokens_equal": all(torch.equal(tokens[f"{name}_hf"], tokens[f"{name}_{mode}"]) for mode in MODES),
        })
        print(f"{name:>12}: transformers {rows[-1]['hf_step_ms']:.2f} ms/step, lean (torch ops) {rows[-1]['lean_torch_step_ms']:.2f}, "
              f"lean {rows[-1]['lean_step_ms']:.2f} (x{rows[-1]['lean_over_hf']:.2f} transformers, x{rows[-1]['c_ops_over_torch_ops']:.2f} "
              f"torch ops), same tokens: {rows[-1]['tokens_equal']}", flush=True)
    report = {"benchmark": "lean_decode_cpu", "cpu": cpu_name(), "model": args.model, "threads": threads, "cpus": os.cpu_count(),
              "kernel": dense_cpu_kernel(), "lean_c_operations": lean_ops() is not None, "prompt_tokens": 16, "new_tokens": args.new_tokens, "rounds": args.rounds,
              "load_average_before": load_before, "load_average_after": os.getloadavg(), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

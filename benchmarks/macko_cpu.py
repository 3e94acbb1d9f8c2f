"""MACKO SpMV on the CPU (the C kernel) vs dense fp32 and bf16 torch matmul, and SmolLM2-135M decoding, in one run.

    python benchmarks/macko_cpu.py                          # all shapes, 50/70/90 %, torch's threads, + decode
    python benchmarks/macko_cpu.py --threads 1 --no-decode --out macko_cpu_t1.json

SpMV: shapes are SmolLM2-135M's (576x576 attention, 1536x576 gate/up, 576x1536 down) and a
4096x4096; each row of a random matrix keeps exactly ``cols * (1 - sparsity)`` entries (per-row
pruning), fp16 values. Batch 1 (one token). Three contenders, each ``F.linear`` of one token:
MACKO (``macko_spmv_cpu``), dense fp32, dense bf16 (torch), and where it is built the dense CPU
kernel with fp32 and with bf16 weights (``kernel_fp32``, ``kernel_bf16``); ``faster_dense_over_macko``
is against the fastest dense contender. Two working sets per cell:
``hot``: one matrix, called again and again (it stays in the caches; for the small shapes this
is L2/L3 bandwidth, not memory); ``cold``: enough distinct copies cycled that the matrices of
every contender exceed ``--cold-mb`` (default 128 MB, 4x the 32 MB L3 here), as in decoding, where
every layer's weights come from memory once per token. Calls are interleaved (each round times
every contender, the order rotating), medians over rounds; a ratio is the median of the
per-round ratios ``dense time / MACKO time`` (> 1: MACKO is faster).

Decode: SmolLM2-135M greedy decoding at batch 1 after a 16-token prompt: dense fp32, dense bf16
(``model.to(bfloat16)``) and ``macko`` at each ``--decode-sparsities`` (default 50/70/90 %; magnitude scores, fp16 values; the LM head
stays dense fp32: the method leaves it alone); where the dense CPU kernel is built
(``paretolab.kernels.dense_cpu``) also ``dense_fp32_kernel`` (the dense model's linears through it:
each weight read once at memory speed, the strongest dense baseline here) and
``dense_bf16_kernel`` (every linear's weight in bf16, activations fp32, through it: dense bf16 at
half fp32's bytes), ``macko_kernel_head`` (macko with its dense fp32 LM head through it) and
``macko_bf16_head`` (macko with its LM head in bf16 through it: the like-for-like partner of
``dense_bf16_kernel``, whose LM head is bf16 too; the method itself leaves the head in fp32). ``faster_dense`` is the fastest
dense contender, ``faster_macko_over_faster_dense`` the best macko against it. Each round times a run of ``--new-tokens`` and a
run of 1 token (prompt and first token); their difference over ``new_tokens - 1`` is the time
of one decoding step (``*_decode_tok_s``; end to end, prompt included, beside it). Rounds
interleaved, medians; ``macko_over_*`` are medians of per-round step-time ratios (> 1: macko
is faster). ``macko_tokens_equal_fp32`` may be false: macko's weights are pruned.

Every number is from whatever machine runs it: on a shared machine the spread is large and the
JSON says how loaded it was (load average before and after).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from paretolab.kernels.macko import MackoMatrix, dense_bytes, macko_encode
from paretolab.kernels.dense_cpu import dense_cpu_kernel, fast_linears, linear_cpu
from paretolab.kernels.macko_cpu import macko_cpu_kernel, macko_spmv_cpu
from paretolab.measure.timing import cpu_name, node_lock, torch_threads

SHAPES = ((576, 576), (1536, 576), (576, 1536), (4096, 4096))
SPARSITIES = (0.5, 0.7, 0.9)


def pruned(rows: int, cols: int, sparsity: float, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=gen)
    n_zero = int(cols * sparsity)
    if n_zero:
        w.scatter_(1, torch.rand(rows, cols, generator=gen).argsort(dim=1)[:, :n_zero], 0.0)
    return w.half().float()


def interleaved(fns: dict[str, Callable[[], object]], rounds: int, inner: int) -> dict[str, list[float]]:
    """Seconds per call of each callable, ``inner`` calls per timing, every round all of them in a rotating order."""
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    for fn in fns.values():
        fn()
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            start = time.perf_counter()
            for _ in range(inner):
                fns[name]()
            times[name].append((time.perf_counter() - start) / inner)
    return times


def ratio(times: dict[str, list[float]], base: str, other: str = "macko") -> float:
    return statistics.median(b / m for b, m in zip(times[base], times[other], strict=True))


def spmv_cells(shapes: list[tuple[int, int]], sparsities: list[float], rounds: int, cold_mb: float) -> list[dict[str, object]]:
    cells = []
    for rows, cols in shapes:
        for sparsity in sparsities:
            w = pruned(rows, cols, sparsity, seed=rows + cols)
            copies = max(1, int(cold_mb * 2**20 / (rows * cols * 2)))  # bf16 dense (the smallest dense) past cold_mb
            for regime, n in (("hot", 1), ("cold", copies)):
                fmt = macko_encode(w)
                fmts = [MackoMatrix(fmt.values.clone(), fmt.deltas.clone(), fmt.row_ptr.clone(), fmt.shape) for _ in range(n)]
                w32 = [w.clone() for _ in range(n)]
                w16 = [w.bfloat16() for _ in range(n)]
                x = torch.randn(1, cols)
                x16 = x.bfloat16()
                at = {"macko": 0, "dense_fp32": 0, "dense_bf16": 0, "kernel_fp32": 0, "kernel_bf16": 0}

                def cycle(name: str, call: Callable[[int], object]) -> Callable[[], object]:
                    def run() -> object:
                        at[name] = (at[name] + 1) % n
                        return call(at[name])
                    return run

                torch.testing.assert_close(macko_spmv_cpu(fmts[0], x), x @ w.T, rtol=1e-4, atol=1e-3)  # time only a right answer
                inner = max(1, min(50, 20_000_000 // (rows * cols)))  # calls per timing: ~1 ms or more each
                times = interleaved({
                    "macko": cycle("macko", lambda i: macko_spmv_cpu(fmts[i], x)),
                    "dense_fp32": cycle("dense_fp32", lambda i: F.linear(x, w32[i])),
                    "dense_bf16": cycle("dense_bf16", lambda i: F.linear(x16, w16[i])),
                    **({"kernel_fp32": cycle("kernel_fp32", lambda i: linear_cpu(x, w32[i])),
                        "kernel_bf16": cycle("kernel_bf16", lambda i: linear_cpu(x, w16[i]))} if dense_cpu_kernel() else {}),
                }, rounds, inner)
                med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
                cell = {
                    "shape": f"{rows}x{cols}", "sparsity": sparsity, "regime": regime, "copies": n,
                    "macko_us": med["macko"], "dense_fp32_us": med["dense_fp32"], "dense_bf16_us": med["dense_bf16"],
                    "fp32_over_macko": ratio(times, "dense_fp32"), "bf16_over_macko": ratio(times, "dense_bf16"),
                    "macko_bytes_over_fp32": fmts[0].nbytes / dense_bytes((rows, cols), 32),
                    "macko_bytes_over_bf16": fmts[0].nbytes / dense_bytes((rows, cols), 16),
                }
                if "kernel_fp32" in times:  # dense through the dense CPU kernel (paretolab.kernels.dense_cpu): reads each weight once at memory speed
                    cell.update({"kernel_fp32_us": med["kernel_fp32"], "kernel_bf16_us": med["kernel_bf16"],
                                 "kernel_fp32_over_macko": ratio(times, "kernel_fp32"), "kernel_bf16_over_macko": ratio(times, "kernel_bf16")})
                cell["faster_dense_over_macko"] = min(v for k, v in cell.items() if k.endswith("_over_macko"))
                cells.append(cell)
                print(f"{cell['shape']:>10} {sparsity:>4.0%} {regime:>4} x{n:<4} macko {med['macko']:9.1f} us  fp32 {med['dense_fp32']:9.1f}  "
                      f"bf16 {med['dense_bf16']:9.1f}  | fp32/macko {cell['fp32_over_macko']:5.2f}  bf16/macko {cell['bf16_over_macko']:5.2f}  "
                      f"faster dense/macko {cell['faster_dense_over_macko']:5.2f}",
                      flush=True)
                del fmts, w32, w16
    return cells


def bf16_weights(model: torch.nn.Module) -> torch.nn.Module:
    """Every nn.Linear's weight in bf16, activations left fp32: dense bf16 as the dense kernel reads it (half fp32's bytes).

    A tied LM head gets its own bf16 copy; the embedding stays fp32. Only the dense kernel takes
    bf16 weights with fp32 inputs, so this model runs under ``fast_linears`` with at most 16 tokens a forward.
    """
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.weight = torch.nn.Parameter(module.weight.detach().to(torch.bfloat16).clone(), requires_grad=False)
    return model


def decode_cells(model_name: str, sparsity: float, new_tokens: int, rounds: int) -> dict[str, object]:
    from paretolab.generation import greedy_decode
    from paretolab.models import load_subject
    from paretolab.plugin_api.context import TrialContext
    from paretolab.plugins.macko import Macko

    dense = load_subject(model_name)
    half = load_subject(model_name)
    half.model.to(torch.bfloat16)
    sparse = load_subject(model_name)
    Macko().transform(sparse, {"sparsity": sparsity, "score": "magnitude"}, TrialContext(seed=0, workdir=Path(tempfile.mkdtemp())))
    prompt = torch.randint(3, 40000, (1, 16), generator=torch.Generator().manual_seed(0))
    models = {"dense_fp32": dense.model.eval(), "dense_bf16": half.model.eval(), "macko": sparse.model.eval()}
    outs = {}
    with torch.no_grad():
        for name, m in models.items():
            outs[name] = greedy_decode(m, prompt, new_tokens)
        kernels = {}
        if dense_cpu_kernel():  # the same weights, linears through the dense CPU kernel (macko: its dense fp32 LM head)
            head16 = load_subject(model_name)
            Macko().transform(head16, {"sparsity": sparsity, "score": "magnitude"}, TrialContext(seed=0, workdir=Path(tempfile.mkdtemp())))
            kernels = {"dense_fp32_kernel": models["dense_fp32"], "dense_bf16_kernel": bf16_weights(load_subject(model_name).model).eval(),
                       "macko_kernel_head": models["macko"], "macko_bf16_head": bf16_weights(head16.model).eval()}
            for name, m in kernels.items():
                with fast_linears(m):
                    outs[name] = greedy_decode(m, prompt, new_tokens)

        def decode(m: torch.nn.Module, n: int, kernel: bool) -> object:
            if not kernel:
                return greedy_decode(m, prompt, n)
            with fast_linears(m):
                return greedy_decode(m, prompt, n)

        calls = {}
        for name, m in [*models.items(), *kernels.items()]:  # the prompt's forward and one token, then the whole run: the difference is decoding only
            calls[f"{name}:1"] = lambda m=m, k=name in kernels: decode(m, 1, k)
            calls[name] = lambda m=m, k=name in kernels: decode(m, new_tokens, k)
        times = interleaved(calls, rounds, 1)
        models = {**models, **kernels}
    step = {name: [(t - t1) / (new_tokens - 1) for t, t1 in zip(times[name], times[f"{name}:1"], strict=True)] for name in models}
    tok_s = {k: 1 / statistics.median(v) for k, v in step.items()}
    end_to_end = {k: new_tokens / statistics.median(times[k]) for k in models}
    faster = max([k for k in tok_s if k.startswith("dense_")], key=lambda k: tok_s[k])
    fastest_macko = max([k for k in tok_s if k.startswith("macko")], key=lambda k: tok_s[k])
    result = {
        "model": model_name, "sparsity": sparsity, "prompt_tokens": 16, "new_tokens": new_tokens, "rounds": rounds,
        **{f"{k}_decode_tok_s": v for k, v in tok_s.items()},
        **{f"{k}_end_to_end_tok_s": v for k, v in end_to_end.items()},
        "macko_over_fp32": ratio(step, "dense_fp32"), "macko_over_bf16": ratio(step, "dense_bf16"),
        "faster_dense": faster, "macko_over_faster_dense": ratio(step, faster),
        "faster_macko": fastest_macko, "faster_macko_over_faster_dense": ratio(step, faster, fastest_macko),
        "macko_tokens_equal_fp32": bool(torch.equal(outs["macko"], outs["dense_fp32"])),
        **({"dense_kernel_tokens_equal_fp32": bool(torch.equal(outs["dense_fp32_kernel"], outs["dense_fp32"])),
            "dense_bf16_kernel_tokens_equal_fp32": bool(torch.equal(outs["dense_bf16_kernel"], outs["dense_fp32"])),
            "macko_bf16_head_tokens_equal_macko": bool(torch.equal(outs["macko_bf16_head"], outs["macko"]))} if kernels else {}),
    }
    print(json.dumps(result, indent=1), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="*", default=[f"{r}x{c}" for r, c in SHAPES])
    parser.add_argument("--sparsities", nargs="*", type=float, default=list(SPARSITIES))
    parser.add_argument("--threads", type=int, default=0, help="torch threads, also the kernel's (0: torch's default)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--cold-mb", type=float, default=128.0)
    parser.add_argument("--no-decode", action="store_true")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--decode-rounds", type=int, default=5)
    parser.add_argument("--decode-sparsities", nargs="*", type=float, default=list(SPARSITIES), help="sparsities of the decode cells")
    parser.add_argument("--out", default="macko_cpu.json")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with node_lock(), torch_threads(args.threads):
        threads = torch.get_num_threads()
        print(f"kernel path: {macko_cpu_kernel()}, threads {threads}, load average {load_before[0]:.1f}", flush=True)
        shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes]
        cells = spmv_cells(shapes, args.sparsities, args.rounds, args.cold_mb)  # type: ignore[arg-type]
        decode = [] if args.no_decode else [decode_cells(args.model, s, args.new_tokens, args.decode_rounds) for s in args.decode_sparsities]
    report = {"benchmark": "macko_cpu", "cpu": cpu_name(), "kernel": macko_cpu_kernel(), "threads": threads, "cpus": os.cpu_count(),
              "load_average_before": load_before, "load_average_after": os.getloadavg(), "spmv": cells, "decode": decode}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

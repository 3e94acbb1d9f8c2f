"""Sparse vs dense FFN decoding with the same weights (l1_sparsity's one-token path), side by side, at several sparsities.

    python benchmarks/sparse_ffn.py                         # scratch-5m and scratch-15m, 0/50/90/95/99 % zeros
    python benchmarks/sparse_ffn.py --models scratch-5m --sparsities 0.9 0.99 --threads 1

Each model is a random-init scratch preset after the ``l1_sparsity`` transform (ReLU gate). A
sparsity s is set exactly by zeroing the gate rows of a fraction s of each layer's units (those
units are 0 for every token; the sparse path's cost depends on how many units are active, not
which). Two timings per row, both with ``paretolab.timing.time_paired`` (sparse and dense
alternating, order flipped each round, under the node's timing lock, fixed threads):

- ``ffn``: one FFN call on one token (the module's sparse path vs its dense path);
- ``decode``: greedy decoding of ``--new-tokens`` tokens at batch 1 with the whole model (every
  layer's FFN sparse vs dense; attention, norms and the head are the same in both).

The ratio is dense time / sparse time (> 1: the sparse path is faster), the median over paired
rounds. CPU only here; on a GPU the one-token gather path is not what the paper's kernels do.

Measured here (2 cores shared with other jobs, load average ~18; 1 thread, 15 rounds, 16 tokens):
one FFN call, dense / sparse time — scratch-5m (256 × 704): 0.69 at 0 % zeros, 1.03 at 90 %, 0.92
at 99 %; scratch-15m (384 × 960): 0.73, 1.20, 1.33. Whole-model decode ratios were 0.85-1.19 at
every sparsity, 0 % included: at these widths the FFN is a small share of a decode step and the
load's noise is larger than the gain. No speed-up claim follows from these numbers.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from paretolab.generation import greedy_decode
from paretolab.measure.timing import node_lock, time_paired, torch_threads
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.manager import registries
from paretolab.plugins.l1_sparsity import L1Sparsity, sparse_path


def sparse_model(name: str, sparsity: float) -> torch.nn.Module:
    """The preset with ReLU-gated FFNs whose gate rows are zero for ``sparsity`` of the units (seeded)."""
    subject = registries().models.get(name).load()
    import tempfile
    from pathlib import Path

    L1Sparsity().transform(subject, {"lam": 0.0}, TrialContext(seed=0, workdir=Path(tempfile.mkdtemp())))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in subject.model.model.layers:
            w = layer.mlp.gate_proj.weight
            w[torch.randperm(w.shape[0], generator=gen)[: int(round(w.shape[0] * sparsity))]] = 0.0
    return subject.model.eval()


def paired_ratio(sparse: object, dense: object, rounds: int) -> tuple[float, float, float]:
    """(median sparse s, median dense s, median paired dense/sparse) of two callables."""
    out = time_paired(sparse, dense, min_rounds=rounds, max_rounds=rounds, max_s=60.0, target=0.0)  # type: ignore[arg-type]
    return statistics.median(out.method), statistics.median(out.base), statistics.median(out.ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["scratch-5m", "scratch-15m"])
    parser.add_argument("--sparsities", nargs="+", type=float, default=[0.0, 0.5, 0.9, 0.95, 0.99])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--ffn-calls", type=int, default=200, help="FFN calls per timed ffn run")
    args = parser.parse_args()

    print(f"threads {args.threads}, {args.rounds} paired rounds per cell; ratio = dense time / sparse time (> 1: sparse faster)")
    print(f"{'model':<12} {'zeros':>6} {'ffn dense us':>13} {'ffn sparse us':>14} {'ffn ratio':>10} {'dense tok/s':>12} {'sparse tok/s':>13} {'decode ratio':>13}")
    with node_lock(), torch_threads(args.threads), torch.no_grad():
        for name in args.models:
            for s in args.sparsities:
                model = sparse_model(name, s)
                mlp = model.model.layers[0].mlp
                x = torch.randn(1, 1, model.config.hidden_size, generator=torch.Generator().manual_seed(1))

                def ffn(on: bool) -> object:
                    def run() -> None:
                        with sparse_path(model, on):
                            for _ in range(args.ffn_calls):
                                mlp(x)
                    return run

                prompt = torch.randint(3, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(2))

                def decode(on: bool) -> object:
                    def run() -> None:
                        with sparse_path(model, on):
                            greedy_decode(model, prompt, args.new_tokens)
                    return run

                for fn in (ffn(True), ffn(False), decode(True), decode(False)):  # warm-up
                    fn()
                fs, fd, fr = paired_ratio(ffn(True), ffn(False), args.rounds)
                ds, dd, dr = paired_ratio(decode(True), decode(False), args.rounds)
                n = args.new_tokens
                print(f"{name:<12} {s:>6.2f} {fd / args.ffn_calls * 1e6:>13.1f} {fs / args.ffn_calls * 1e6:>14.1f} {fr:>10.2f} "
                      f"{n / dd:>12.1f} {n / ds:>13.1f} {dr:>13.2f}", flush=True)


if __name__ == "__main__":
    main()

"""Token Sparse Attention vs dense attention at prefill on SmolLM2-135M, side by side in one run.

    python benchmarks/sparse_attention.py                         # 2k, 4k, 8k tokens of WikiText-2
    python benchmarks/sparse_attention.py --lengths 2048 --tau 0.2 --reps 5

For each length the model reads the first L tokens of a real text once with dense attention;
the query, key and value of every sparse layer (``--first-layer`` on) are recorded. Then, on
those same tensors, it times the layers' attention — dense (transformers' SDPA function, what
the model runs) against token-sparse (scoring, selection, gather, dense attention on the kept
tokens, scatter) — and the whole model's prefill with each. Every timing is a median over
``--reps``, dense and sparse called alternately after one warm-up each (so a change in
the machine's load hits both), synchronized on a GPU. The device is printed first: on a CPU the
scoring step runs its PyTorch reference (the Triton kernel needs CUDA), and the numbers are CPU
numbers, not the paper's GPU setting. ``kept`` is the share of tokens that entered attention.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import AttentionInterface

from paretolab.models import resolve_model
from paretolab.plugins._layerwise import decoder_layers
from paretolab.plugins.token_sparse_attention import (
    SparseSettings,
    base_attention,
    install,
    token_sparse_attention_forward,
)
from paretolab.tasks import corpus_ids

CAPTURE = "paretolab_capture_qkv"


def paired_medians(dense: Callable[[], object], sparse: Callable[[], object], device: torch.device, reps: int,
                   inner: int = 1) -> tuple[float, float]:
    """Median wall times per call of ``dense`` and ``sparse``, called alternately (so load changes hit both), after a warm-up.

    Each sample times ``inner`` back-to-back calls between two synchronisations and divides: a kernel of tens of
    microseconds is otherwise timed together with its launch and the synchronisation (``inner=1`` is right for
    calls of milliseconds and more).
    """
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    dense(), sparse()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(reps):
        for fn, out in ((dense, times[0]), (sparse, times[1])):
            sync()
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            sync()
            out.append((time.perf_counter() - start) / inner)
    return statistics.median(times[0]), statistics.median(times[1])


def record_qkv(model: torch.nn.Module, ids: torch.Tensor, first: int) -> list[tuple[torch.nn.Module, tuple[torch.Tensor, ...], float]]:
    """(attention module, (q, k, v), scaling) of layers ``first``.. from one dense forward."""
    records: list[tuple[torch.nn.Module, tuple[torch.Tensor, ...], float]] = []
    base = base_attention(model.config._attn_implementation or "sdpa")

    def capture(module: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, scaling: float | None = None, **kw: Any) -> Any:
        records.append((module, (q, k, v), scaling if scaling is not None else q.shape[-1] ** -0.5))
        return base(module, q, k, v, mask, scaling=scaling, **kw)

    AttentionInterface.register(CAPTURE, capture)
    work = copy.deepcopy(model)
    for layer in decoder_layers(work)[first:]:
        layer.self_attn.config = copy.copy(layer.self_attn.config)
        layer.self_attn.config._attn_implementation = CAPTURE
    with torch.no_grad():
        work(input_ids=ids)
    return records


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", nargs="*", type=int, default=[2048, 4096, 8192])
    parser.add_argument("--tau", type=float, default=0.05, help="share of attention mass to drop")
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--min-tokens", type=int, default=1024)
    parser.add_argument("--first-layer", type=int, default=15)
    parser.add_argument("--corpus", default="wikitext2", help="pydoc | wikitext2 | a text file")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--skip-model", action="store_true", help="time the attention only, not the whole prefill")
    args = parser.parse_args(argv)

    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    what = torch.cuda.get_device_name(0) if gpu else f"CPU ({torch.get_num_threads()} threads) - no GPU here; the scoring runs its PyTorch reference"
    print(f"device: {what}")
    subject = resolve_model("smollm2-135m").load()
    model = subject.model.to(device)
    n_layers = len(decoder_layers(model))
    settings = SparseSettings(args.tau, args.window, args.min_tokens, 7, base="")
    sparse_model = copy.deepcopy(model)
    install(sparse_model, settings, args.first_layer)
    print(f"SmolLM2-135M, {n_layers} layers, sparse from layer {args.first_layer}: tau={args.tau} W={args.window} "
          f"min_tokens={args.min_tokens}; median of {args.reps}, alternating, after a warm-up\n")
    head = f"{'tokens':>7} {'kept':>6} {'attn dense ms':>14} {'attn sparse ms':>15} {'attn speedup':>13}"
    if not args.skip_model:
        head += f" {'prefill dense ms':>17} {'prefill sparse ms':>18} {'prefill speedup':>16}"
    print(head)
    ids_all = corpus_ids(subject.tokenizer, args.corpus, max(args.lengths))
    for length in args.lengths:
        if ids_all.numel() < length:
            raise SystemExit(f"--corpus {args.corpus!r} has {ids_all.numel()} tokens, fewer than {length}")
        ids = ids_all[:length][None].to(device)
        records = record_qkv(model, ids, args.first_layer)
        sdpa = base_attention("sdpa")
        for module, _, _ in records:
            module.token_sparse = SparseSettings(args.tau, args.window, args.min_tokens, 7, "sdpa")
            module.token_sparse_counts = [0, 0]

        def dense_attention() -> None:
            for module, (q, k, v), scale in records:
                sdpa(module, q, k, v, None, scaling=scale)

        def sparse_attention() -> None:
            for module, (q, k, v), scale in records:
                token_sparse_attention_forward(module, q, k, v, None, scaling=scale)

        with torch.no_grad():
            t_dense, t_sparse = paired_medians(dense_attention, sparse_attention, device, args.reps)
        kept = sum(m.token_sparse_counts[0] for m, _, _ in records) / sum(m.token_sparse_counts[1] for m, _, _ in records)
        line = f"{length:>7} {kept:>6.2f} {t_dense * 1e3:>14.1f} {t_sparse * 1e3:>15.1f} {t_dense / t_sparse:>12.2f}x"
        if not args.skip_model:
            with torch.no_grad():
                p_dense, p_sparse = paired_medians(lambda: model(input_ids=ids), lambda: sparse_model(input_ids=ids), device, args.reps)
            line += f" {p_dense * 1e3:>17.1f} {p_sparse * 1e3:>18.1f} {p_dense / p_sparse:>15.2f}x"
        print(line, flush=True)
        del records


if __name__ == "__main__":
    main()

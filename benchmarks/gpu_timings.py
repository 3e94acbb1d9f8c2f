"""The timings of benchmarks/gpu_check.sh, side by side in one run, written to one JSON file.

    python benchmarks/gpu_timings.py --out gpu_check.json [--tests-junit junit.xml]
    python benchmarks/gpu_timings.py --dry-run --out dry.json     # tiny sizes on the CPU: the pieces run

On a GPU: MACKO SpMV (the Triton kernel) vs dense fp16 ``torch.mv`` (cuBLAS) at 50-90% sparsity (each sample
100 back-to-back calls, so launch and synchronisation are not what is timed);
Token Sparse Attention vs dense prefill of SmolLM2-135M at 8k and 16k tokens; self-speculative vs
greedy decoding tok/s on SmolLM2-135M. Every timing is a median after a warm-up, the two sides
called alternately, synchronised around each call. ``--dry-run`` runs the same code with tiny
sizes on the CPU (tiny-llama, reference kernels): it checks the script, its numbers are no claim.
A section that fails records its error and the script exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmarks

from sparse_attention import paired_medians  # noqa: E402
from spmv import pruned_matrix  # noqa: E402

FULL = {"spmv_shapes": [(4096, 4096), (1536, 576), (576, 1536)], "sparsities": [0.5, 0.6, 0.7, 0.8, 0.9], "spmv_reps": 30, "spmv_inner": 100,
        "model": "smollm2-135m", "lengths": [8192, 16384], "prefill_reps": 5, "spec_prompts": 4, "spec_new_tokens": 64}
DRY = {"spmv_shapes": [(64, 64)], "sparsities": [0.5, 0.9], "spmv_reps": 3, "spmv_inner": 2,
       "model": "tiny-llama", "lengths": [256], "prefill_reps": 2, "spec_prompts": 2, "spec_new_tokens": 8}


def spmv(device: torch.device, sizes: dict[str, Any]) -> list[dict[str, Any]]:
    """MACKO SpMV vs the dense matvec of the same fp16 matrix (the Triton kernel and cuBLAS on a GPU)."""
    from paretolab.kernels.macko import dense_bytes, macko_encode, macko_spmv_ref

    if device.type == "cuda":
        from paretolab.kernels.macko_triton import macko_spmv_triton as macko_fn
    else:
        macko_fn = macko_spmv_ref
    dtype = torch.float16 if device.type == "cuda" else torch.float32  # CPU half matvec is not a fair baseline
    rows_out = []
    for rows, cols in sizes["spmv_shapes"]:
        for sparsity in sizes["sparsities"]:
            w16 = pruned_matrix(rows, cols, sparsity, device=device)
            fmt = macko_encode(w16)
            w, x = w16.to(dtype), torch.randn(cols, device=device, dtype=torch.float16).to(dtype)
            dense_s, macko_s = paired_medians(lambda: torch.mv(w, x), lambda: macko_fn(fmt, x), device, sizes["spmv_reps"],
                                                inner=sizes["spmv_inner"])
            rows_out.append({"shape": f"{rows}x{cols}", "sparsity": sparsity, "macko_us": macko_s * 1e6, "dense_us": dense_s * 1e6,
                             "speedup_vs_dense": dense_s / macko_s, "bytes_vs_dense_fp16": fmt.nbytes / dense_bytes((rows, cols), 16),
                             # achieved bandwidth (matrix bytes read per call / time): against the copy ceiling, how far each is from memory-bound
                             "macko_gb_s": fmt.nbytes / macko_s / 1e9, "dense_gb_s": w.numel() * w.element_size() / dense_s / 1e9})
    return rows_out


def token_sparse_prefill(device: torch.device, sizes: dict[str, Any]) -> list[dict[str, Any]]:
    """Whole-model prefill, dense vs token-sparse attention (tau 0.05, W 128, from layer 15 of 30), same tokens."""
    import copy

    from paretolab.models import load_subject
    from paretolab.plugins._layerwise import decoder_layers
    from paretolab.plugins.token_sparse_attention import SparseSettings, install
    from paretolab.tasks import corpus_ids

    subject = load_subject(sizes["model"]).to(device)
    model = subject.model
    first = len(decoder_layers(model)) // 2
    window, min_tokens = (128, 1024) if device.type == "cuda" else (16, 64)
    sparse_model = copy.deepcopy(model)
    install(sparse_model, SparseSettings(0.05, window, min_tokens, 7, base=""), first)
    ids_all = corpus_ids(subject.tokenizer, "pydoc", max(sizes["lengths"])).to(device)
    out = []
    for length in sizes["lengths"]:
        ids = ids_all[:length][None]
        with torch.no_grad():
            dense_s, sparse_s = paired_medians(lambda: model(input_ids=ids, logits_to_keep=1),
                                               lambda: sparse_model(input_ids=ids, logits_to_keep=1), device, sizes["prefill_reps"])
        out.append({"tokens": length, "dense_ms": dense_s * 1e3, "sparse_ms": sparse_s * 1e3, "speedup_vs_dense": dense_s / sparse_s,
                    "sparse_from_layer": first, "tau": 0.05, "window": window})
    return out


def speculative(device: torch.device, sizes: dict[str, Any]) -> dict[str, Any]:
    """Self-speculative (layer-skip draft, k=4) and prompt lookup (4, growing to 16; a tree verify through the lean forward)
    vs greedy decoding tok/s on the same held-out prompts, interleaved."""
    from paretolab.models import load_subject
    from paretolab.plugin_api.context import TrialContext
    from paretolab.plugins.speculative import Speculative, compare_with_greedy
    from paretolab.plugins.speculative.corpus import heldout_prompts

    subject = load_subject(sizes["model"]).to(device)
    params = {"draft": "self", "k": 4, "skip": max(1, subject.model.config.num_hidden_layers // 3), "calib_samples": 4, "calib_seq_len": 128}
    subject = Speculative().transform(subject, params, TrialContext(seed=0, workdir=Path("."), device=device))
    prompts = heldout_prompts(subject.tokenizer, n=sizes["spec_prompts"], length=64)
    result = {**compare_with_greedy(subject, prompts, sizes["spec_new_tokens"]), "draft": "self", "k": 4, "skip": params["skip"]}
    lookup = Speculative().transform(subject, {"draft": "lookup", "lookup": 4, "lookup_max": 16}, TrialContext(seed=0, workdir=Path("."), device=device))
    return {**result, "lookup": compare_with_greedy(lookup, prompts, sizes["spec_new_tokens"]) | {"lookup": 4, "lookup_max": 16}}


def pytest_summary(junit: Path) -> dict[str, Any]:
    """Counts and failing test ids from pytest's JUnit XML."""
    root = ET.parse(junit).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    failed = [f"{case.get('classname')}::{case.get('name')}" for case in suite.iter("testcase")
              if case.find("failure") is not None or case.find("error") is not None]
    return {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")} | {"failed": failed, "time_s": float(suite.get("time", 0))}


SECTIONS: dict[str, Callable[[torch.device, dict[str, Any]], Any]] = {
    "macko_spmv_vs_dense": spmv, "token_sparse_vs_dense_prefill": token_sparse_prefill, "speculative_vs_greedy": speculative,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU: checks the pieces, measures nothing")
    parser.add_argument("--tests-junit", type=Path, help="pytest JUnit XML of the gpu-marked tests, summarised into the JSON")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated sections to run (default: all of {', '.join(SECTIONS)})")
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.sections.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown or not chosen:
        parser.error(f"--sections {args.sections!r}: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(SECTIONS)}")

    if args.dry_run:
        device, sizes = torch.device("cpu"), DRY
    elif torch.cuda.is_available():
        device, sizes = torch.device("cuda", 0), FULL
    else:
        print("no CUDA device: run with --dry-run on a CPU machine", file=sys.stderr)
        return 2
    report: dict[str, Any] = {
        "dry_run": args.dry_run,
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu (dry run: no claim)",
        "torch": torch.__version__, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if args.tests_junit:
        report["gpu_tests"] = pytest_summary(args.tests_junit)
    failed = False
    for name in chosen:
        section = SECTIONS[name]
        start = time.perf_counter()
        try:
            report[name] = section(device, sizes)
        except Exception as exc:  # one broken section must not hide the others' numbers
            report[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            failed = True
        print(f"{name}: {time.perf_counter() - start:.1f}s{' FAILED' if failed and 'error' in report[name] else ''}", flush=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

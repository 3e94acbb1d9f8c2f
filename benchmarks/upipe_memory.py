"""UPipe's head-chunked attention against plain attention: one training step's memory and time, by context length.

    python benchmarks/upipe_memory.py                          # scratch-5m, 2k/4k/8k tokens, batch 1
    python benchmarks/upipe_memory.py --contexts 16384 --rounds 1 --out upipe_16k.json

The model is built from its shape with random weights (a step's memory and time do not depend on the
values). Per context and attention kernel (``sdpa``, PyTorch's fused attention, the scratch models' default;
``eager``, transformers' plain matmul-softmax-matmul, which keeps the (heads, S, S) scores), two arms on the
same model: plain attention, and ``upipe`` with one key/value head per chunk, recomputed in backward. For each:

- ``saved_mb``: the activations one step saves for backward (the train stage's ``peak_act_mb``, saved-tensor hooks);
- ``peak_mb``: the most bytes the step's tensors hold at once, forward and backward, gradients excluded
  (:class:`paretolab.measure.live_memory.LiveTensorBytes`; scratch inside a fused kernel is not a tensor);
- ``step_s``: median of ``--rounds`` timed steps (forward + backward), the two arms alternating, order flipped
  each round, after one untimed warm-up step each; ``time_ratio`` is the median per-round ratio upipe / plain.

A plain eager arm whose scores alone would not fit in half of the free memory is not run: its row says so, with
the bytes it would need (that is the baseline running out of memory).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from paretolab.measure.live_memory import LiveTensorBytes
from paretolab.measure.timing import node_lock, time_paired, torch_threads
from paretolab.plugins.upipe import PAPER_SHAPES, Shape, attention_buffer_bytes, chunk_heads, chunking_off
from paretolab.training.memory import saved_activations


def free_bytes() -> int:
    with open("/proc/meminfo", encoding="ascii") as info:
        line = next(row for row in info if row.startswith("MemAvailable:"))
    return int(line.split()[1]) * 1024


def build(model_name: str, attn: str) -> torch.nn.Module:
    from paretolab.models import load_subject

    model = load_subject(model_name).model
    model.config._attn_implementation = attn
    chunk_heads(model, 1, recompute=True)
    return model.train()


def arm_memory(model: torch.nn.Module, step) -> dict[str, float]:
    step()  # the gradients exist from here on: what is counted next is activations and workspace
    with saved_activations(model) as saved:
        step()
    with LiveTensorBytes() as live:
        step()
    return {"saved_mb": saved.mb, "peak_mb": live.peak / 2**20}


def run(model_name: str, contexts: list[int], batch: int, rounds: int) -> list[dict]:
    rows = []
    for attn in ("sdpa", "eager"):
        model = build(model_name, attn)
        cfg = model.config
        for context in contexts:
            ids = torch.randint(0, cfg.vocab_size, (batch, context), generator=torch.Generator().manual_seed(context))

            def step(ids: torch.Tensor = ids) -> None:
                model(input_ids=ids, labels=ids, use_cache=False).loss.backward()

            row = {"attn": attn, "context": context, "batch": batch}
            scores = batch * cfg.num_attention_heads * context * context * 4 * cfg.num_hidden_layers * 2  # probabilities + their grad, every layer
            if attn == "eager" and scores > free_bytes() / 2:
                row["plain"] = f"not run: its scores alone need {scores / 2**30:.1f} GiB, over half of the {free_bytes() / 2**30:.1f} GiB free"
                row["upipe"] = arm_memory(model, step)
                rows.append(row)
                print(row, flush=True)
                continue
            with chunking_off(model):
                row["plain"] = arm_memory(model, step)
            row["upipe"] = arm_memory(model, step)

            def plain_step() -> None:
                with chunking_off(model):
                    step()

            times = time_paired(step, plain_step, min_rounds=rounds, max_rounds=rounds, max_s=float("inf"), target=0.0)
            model.zero_grad(set_to_none=True)
            row["plain"]["step_s"], row["upipe"]["step_s"] = statistics.median(times.base), statistics.median(times.method)
            row["time_ratio"] = statistics.median(1 / r for r in times.ratios)  # per round, upipe / plain
            row["peak_ratio"] = row["upipe"]["peak_mb"] / row["plain"]["peak_mb"]
            row["saved_ratio"] = row["upipe"]["saved_mb"] / row["plain"]["saved_mb"]
            # the memory model on one device: plain attention saves every layer's q, k, v and output, upipe none of them
            shape = Shape(cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads)
            row["model_saved_drop_mb"] = shape.layers * batch * attention_buffer_bytes(shape, context, 1, element_bytes=4) / 2**20
            row["measured_saved_drop_mb"] = row["plain"]["saved_mb"] - row["upipe"]["saved_mb"]
            rows.append(row)
            print(row, flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="scratch-5m", help="a model name paretolab knows (default: scratch-5m)")
    parser.add_argument("--contexts", type=int, nargs="+", default=[2048, 4096, 8192], help="tokens per sequence")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="timed steps per arm (alternating)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--out", type=Path, default=Path("upipe_memory.json"))
    args = parser.parse_args(argv)
    with node_lock(), torch_threads(args.threads):
        rows = run(args.model, args.contexts, args.batch, args.rounds)
    report = {"model": args.model, "threads": args.threads or torch.get_num_threads(), "rows": rows}
    args.out.write_text(json.dumps(report, indent=1))
    print(f"{'attn':6s} {'context':>7s} {'plain peak':>11s} {'upipe peak':>11s} {'ratio':>6s} {'plain saved':>12s} {'upipe saved':>12s} {'time ratio':>10s}")
    for row in rows:
        plain = row["plain"]
        if isinstance(plain, str):
            print(f"{row['attn']:6s} {row['context']:7d} {'(' + plain + ')':>11s} {row['upipe']['peak_mb']:10.0f}M")
            continue
        print(f"{row['attn']:6s} {row['context']:7d} {plain['peak_mb']:10.0f}M {row['upipe']['peak_mb']:10.0f}M {row['peak_ratio']:6.2f} "
              f"{plain['saved_mb']:11.0f}M {row['upipe']['saved_mb']:11.0f}M {row['time_ratio']:10.2f}")
    print("\nthe multi-device memory model (a model, not a measurement): attention buffers per device while one layer runs,")
    print("DeepSpeed-Ulysses on 8 devices vs UPipe at one query head per device per chunk, bf16")
    for name, shape in PAPER_SHAPES.items():
        for tokens in (2**20, 5 * 2**20):
            ulysses, upipe = attention_buffer_bytes(shape, tokens, 8), attention_buffer_bytes(shape, tokens, 8, heads_per_chunk=1)
            print(f"  {name:11s} {tokens / 2**20:.0f}M tokens: Ulysses {ulysses / 2**30:6.2f} GiB, UPipe {upipe / 2**30:6.2f} GiB ({1 - upipe / ulysses:.1%} less)")
    report["model_8_devices"] = {name: {str(t): [attention_buffer_bytes(s, t, 8), attention_buffer_bytes(s, t, 8, heads_per_chunk=1)]
                                        for t in (2**20, 5 * 2**20)} for name, s in PAPER_SHAPES.items()}
    args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

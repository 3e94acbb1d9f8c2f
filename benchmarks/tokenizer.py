"""IncrementalBPE vs Hugging Face `tokenizers` vs tiktoken on SmolLM2's vocabulary, side by side.

    python benchmarks/tokenizer.py [--repeats 2] [--stream-kb 4]

Every row encodes the same text with each tokenizer (one call, one thread unless it says
batch), after a warm-up, and reports the best of ``--repeats`` runs in MB/s of UTF-8 input plus
our speed-up. "stream" feeds 16-char chunks: ours returns final tokens per chunk; HF has no
streaming API, so it re-encodes the whole text so far at every chunk (what a server does to
find which tokens are final), which is quadratic: it runs on the first ``--stream-kb`` KiB only.
tiktoken is built from the same merges (rank = merge rank, the GPT-2 regex); it merges any pair
whose concatenation is a token, so it can differ from HF: the agreement column says how often.
"""

from __future__ import annotations

import argparse
import json
import random
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from paretolab.data import load_corpus

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def inputs() -> dict[str, str]:
    """The input classes: real prose, real code, and the two pathological shapes."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    code = "".join(p.read_text(encoding="utf-8", errors="replace") for p in sorted(stdlib.glob("*.py"))[:80])
    rng = random.Random(0)
    return {
        "wikitext2": load_corpus("wikitext2")[0],
        "code (stdlib)": code[:1_000_000],
        "single-char run": "a" * 20_000,
        "unspaced run": "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(20_000)),
    }


def build_tiktoken(hf: Any) -> tuple[Any, dict[int, int]]:
    """A tiktoken Encoding over the same byte-level merges, and its id -> HF id map."""
    import tiktoken

    from paretolab.plugins.incremental_bpe._vocab import tables_from_hf

    tables = tables_from_hf(hf)
    ranks: dict[bytes, int] = {bytes([b]): b for b in range(256)}  # tiktoken needs all 256 bytes
    to_hf = {b: tables.byte_token[b] for b in range(256)}
    for tid, data in enumerate(tables.token_bytes):
        if tables.rank[tid] >= 0:
            ranks[data] = 256 + tables.rank[tid]
            to_hf[256 + tables.rank[tid]] = tid
    specials = {s.content: 256 + len(tables.merge_rank) + i for i, s in enumerate(tables.specials)}
    to_hf.update({v: s.id for v, s in zip(specials.values(), tables.specials)})
    enc = tiktoken.Encoding("smollm2-bpe", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens=specials)
    return enc, to_hf


def best_seconds(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up (caches, lazy init)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--stream-kb", type=int, default=4)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from paretolab.models import SmolLM2
    from paretolab.plugins.incremental_bpe import IncrementalBPE

    hf = AutoTokenizer.from_pretrained(SmolLM2().pull())
    backend = hf.backend_tokenizer
    start = time.perf_counter()
    ours = IncrementalBPE.from_hf(hf)
    print(f"IncrementalBPE backend={ours.backend}, built in {time.perf_counter() - start:.2f} s")
    enc, tik_to_hf = build_tiktoken(hf)

    rows = []
    for name, text in inputs().items():
        mb = len(text.encode("utf-8")) / 1e6
        truth = backend.encode(text, add_special_tokens=False).ids
        assert ours.encode(text) == truth, f"{name}: IncrementalBPE differs from HF"
        tik = [tik_to_hf[t] for t in enc.encode_ordinary(text)]
        agree = sum(a == b for a, b in zip(tik, truth)) / max(len(truth), 1) if len(tik) == len(truth) else 0.0
        chunks = text.splitlines(keepends=True)
        t_ours = best_seconds(lambda: ours.encode(text), args.repeats)
        t_hf = best_seconds(lambda: backend.encode(text, add_special_tokens=False), args.repeats)
        t_tik = best_seconds(lambda: enc.encode_ordinary(text), args.repeats)
        t_hf_batch = best_seconds(lambda: backend.encode_batch(chunks, add_special_tokens=False), args.repeats)
        t_tik_batch = best_seconds(lambda: enc.encode_ordinary_batch(chunks), args.repeats)
        t_ours_lines = best_seconds(lambda: [ours.encode(c) for c in chunks], args.repeats)

        head = text[: args.stream_kb * 1024]
        head_mb = len(head.encode("utf-8")) / 1e6

        def ours_stream() -> None:
            s = ours.stream()
            for at in range(0, len(head), 16):
                s.feed(head[at : at + 16])
            s.finish()

        def hf_restream() -> None:
            for at in range(16, len(head) + 16, 16):
                backend.encode(head[:at], add_special_tokens=False)

        t_ours_stream = best_seconds(ours_stream, 1)
        t_hf_stream = best_seconds(hf_restream, 1)
        rows.append((name, mb, mb / t_ours, mb / t_hf, mb / t_tik, mb / t_ours_lines, mb / t_hf_batch,
                     mb / t_tik_batch, head_mb / t_ours_stream, head_mb / t_hf_stream, agree))  # fmt: skip

    print(f"\nMB/s (best of {args.repeats}); x = ours / theirs. batch = per-line list (HF/tiktoken use threads).")
    header = ("input", "MB", "ours", "HF", "x", "tiktoken", "x", "ours lines", "HF batch", "x",
              "tik batch", "x", "ours stream", "HF re-enc", "x", "tik agrees")  # fmt: skip
    print(" | ".join(header))
    for name, mb, o, h, t, ol, hb, tb, os_, hs, agree in rows:
        cells = (name, f"{mb:.2f}", f"{o:.1f}", f"{h:.1f}", f"{o / h:.1f}", f"{t:.1f}", f"{o / t:.2f}",
                 f"{ol:.1f}", f"{hb:.1f}", f"{ol / hb:.2f}", f"{tb:.1f}", f"{ol / tb:.2f}",
                 f"{os_:.2f}", f"{hs:.3f}", f"{os_ / hs:.0f}", f"{agree:.1%}")  # fmt: skip
        print(" | ".join(cells))
    print(json.dumps({"rows": [dict(zip(("input", "mb", "ours", "hf", "tiktoken", "ours_lines", "hf_batch", "tik_batch",
                                        "ours_stream", "hf_reencode_stream", "tiktoken_agreement"), r)) for r in rows]}))  # fmt: skip


if __name__ == "__main__":
    main()

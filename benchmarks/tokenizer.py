"""IncrementalBPE vs Hugging Face `tokenizers` vs tiktoken on SmolLM2's vocabulary, side by side.

    python benchmarks/tokenizer.py [--repeats 3] [--sizes 20000,200000] [--stream-kb 4] [--out FILE]

Inputs: prose (WikiText-2 test), code (80 stdlib modules, 1 MB) and a worst-case set, each at
every ``--sizes``: a run of every ASCII punctuation character, unspaced random letters, random
digits, repeated multi-byte characters (é, 中, 🙂), and the tokens with the deepest merge
trees repeated without spaces (adversarial merge chains).

*first-seen*: every tokenizer is built fresh (outside the timer) and encodes the text once, so
no word cache is warm; best of ``--repeats`` fresh builds. *warm*: the same object after one
warm-up encode, best of ``--repeats``. ns/B is per byte of UTF-8 input; "× prose" divides a
row's first-seen ns/B by prose's. tiktoken is built from the same merges (rank = merge rank, the
GPT-2 regex); it merges any pair whose concatenation is a token, so it can differ from HF on
rare inputs (the agreement column). *stream*: 16-byte chunks; ours returns final tokens per
chunk, HF and tiktoken have no streaming API, so they re-encode the text so far at every chunk
(what a server does to learn which tokens are final), on the first ``--stream-kb`` KiB only
(quadratic); p50/p99 latency per chunk in µs.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import string
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from paretolab.data import load_corpus

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def merge_depth(tables: Any) -> list[int]:
    """Depth of every token's merge tree (0 for single bytes)."""
    depth = [0] * tables.vocab_size
    for t in sorted(range(tables.vocab_size), key=lambda t: tables.rank[t]):
        if tables.rank[t] >= 0:
            depth[t] = 1 + max(depth[tables.left[t]], depth[tables.right[t]])
    return depth


def worst_inputs(tables: Any, size: int, prose: str) -> dict[str, str]:
    """The worst-case set at ``size`` characters (multi-byte runs: ``size`` bytes), after the
    prose of the same size it is compared with (a fresh engine's first bytes cost more: cold caches)."""
    rng = random.Random(0)
    out = {"prose (wikitext2)": prose[:size]}
    out.update({f"run {ch!r}": ch * size for ch in string.punctuation})
    out["letters"] = "".join(rng.choice(string.ascii_lowercase) for _ in range(size))
    out["digits"] = "".join(rng.choice(string.digits) for _ in range(size))
    for ch in "é中🙂":
        out[f"run {ch}"] = ch * (size // len(ch.encode()))
    depth = merge_depth(tables)
    deepest = sorted((t for t in range(tables.vocab_size) if tables.reachable[t]), key=lambda t: -depth[t])
    seen: set[str] = set()
    for t in deepest:  # repeated without spaces: one pre-token, longer than any cached word
        text = "".join(tables.token_bytes[t].decode("utf-8", errors="ignore").split())
        if text and text not in seen and len(seen) < 3:
            seen.add(text)
            out[f"chain {text[:12]!r} (depth {depth[t]})"] = (text * (size // len(text) + 1))[:size]
    return out


def everyday_inputs() -> dict[str, str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    code = "".join(p.read_text(encoding="utf-8", errors="replace") for p in sorted(stdlib.glob("*.py"))[:80])
    return {"prose (wikitext2)": load_corpus("wikitext2")[0], "code (stdlib)": code[:1_000_000]}


def build_tiktoken(tables: Any) -> Callable[[], tuple[Any, dict[int, int]]]:
    """A factory of fresh tiktoken Encodings over the same byte-level merges, with the id -> HF id map."""
    import tiktoken

    ranks: dict[bytes, int] = {bytes([b]): b for b in range(256)}  # tiktoken needs all 256 bytes
    to_hf = {b: tables.byte_token[b] for b in range(256)}
    for tid, data in enumerate(tables.token_bytes):
        if tables.rank[tid] >= 0:
            ranks[data] = 256 + tables.rank[tid]
            to_hf[256 + tables.rank[tid]] = tid
    return lambda: (tiktoken.Encoding("smollm2-bpe", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={}), to_hf)


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def first_seen(make: Callable[[], Callable[[str], Any]], text: str, repeats: int) -> float:
    """Best of ``repeats`` single encodes, each by a freshly built tokenizer."""
    return min(timed(lambda enc=make(): enc(text)) for _ in range(repeats))


def warm(encode: Callable[[str], Any], text: str, repeats: int) -> float:
    encode(text)
    return min(timed(lambda: encode(text)) for _ in range(repeats))


def chunk_latencies(feed: Callable[[str], Any], text: str) -> list[float]:
    out = []
    for at in range(0, len(text), 16):
        start = time.perf_counter()
        feed(text[at : at + 16])
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", default="20000,200000", help="worst-case input sizes, comma-separated")
    parser.add_argument("--stream-kb", type=int, default=4, help="prefix re-encoded by HF and tiktoken per chunk")
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()

    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from paretolab.models import SmolLM2
    from paretolab.plugins.incremental_bpe import IncrementalBPE
    from paretolab.plugins.incremental_bpe._forest import max_candidates

    hf = AutoTokenizer.from_pretrained(SmolLM2().pull())
    spec = hf.backend_tokenizer.to_str()
    ours_proto = IncrementalBPE.from_hf(hf)
    tables = ours_proto.tables
    new_tiktoken = build_tiktoken(tables)
    print(f"IncrementalBPE backend={ours_proto.backend}; candidates per byte at most {max_candidates(tables)}")

    def new_ours() -> Callable[[str], Any]:
        return IncrementalBPE(tables).encode

    def new_hf() -> Callable[[str], Any]:
        tok = Tokenizer.from_str(spec)
        return lambda text: tok.encode(text, add_special_tokens=False).ids

    def new_tik() -> Callable[[str], Any]:
        return new_tiktoken()[0].encode_ordinary

    # first-seen timings leave construction out, for all three; what each costs once, from a HF tokenizer:
    build_s = {"ours (tables + forest + automaton)": min(timed(lambda: IncrementalBPE.from_hf(hf)) for _ in range(args.repeats)),
               "hf (Tokenizer.from_str)": min(timed(new_hf) for _ in range(args.repeats)),
               "tiktoken (ranks + Encoding)": min(timed(lambda: build_tiktoken(tables)()) for _ in range(args.repeats))}  # fmt: skip
    print("built in " + ", ".join(f"{k} {v:.3f} s" for k, v in build_s.items()))

    everyday = everyday_inputs()
    inputs = {name: ("everyday", text) for name, text in everyday.items()}
    for size in (int(s) for s in args.sizes.split(",")):
        group = f"{size // 1000}k"
        worst = worst_inputs(tables, size, everyday["prose (wikitext2)"])
        inputs.update({f"{name} @{group}": (group, text) for name, text in worst.items()})

    enc_tik, tik_to_hf = new_tiktoken()
    rows = []
    for name, (group, text) in inputs.items():
        nbytes = len(text.encode("utf-8"))
        truth = new_hf()(text)
        assert ours_proto.encode(text) == truth, f"{name}: IncrementalBPE differs from HF"
        tik = [tik_to_hf[t] for t in enc_tik.encode_ordinary(text)]
        row: dict[str, Any] = {"input": name, "group": group, "bytes": nbytes, "tiktoken_agrees": tik == truth}
        for who, make in (("ours", new_ours), ("hf", new_hf), ("tiktoken", new_tik)):
            row[f"{who}_first_ns_b"] = first_seen(make, text, args.repeats) / nbytes * 1e9
            row[f"{who}_warm_ns_b"] = warm(make(), text, args.repeats) / nbytes * 1e9
        head = text[: args.stream_kb * 1024]
        stream = IncrementalBPE(tables).stream()
        ours_lat = chunk_latencies(stream.feed, text)
        stream.finish()
        for who, make in (("hf", new_hf), ("tiktoken", new_tik)):
            encode, seen = make(), [""]

            def re_encode(chunk: str, encode: Callable[[str], Any] = encode, seen: list[str] = seen) -> None:
                seen[0] += chunk
                encode(seen[0])

            lat = chunk_latencies(re_encode, head)
            row[f"{who}_stream_p50_us"], row[f"{who}_stream_p99_us"] = _p50_p99(lat)
        row["ours_stream_p50_us"], row["ours_stream_p99_us"] = _p50_p99(ours_lat)
        rows.append(row)
        print(f"  {name}: ours {row['ours_first_ns_b']:.1f} ns/B first-seen", flush=True)

    prose = {r["group"]: r["ours_first_ns_b"] for r in rows if r["input"].startswith("prose")}
    for r in rows:
        r["ours_x_prose"] = r["ours_first_ns_b"] / prose[r["group"]]
        r["ours_x_full_prose"] = r["ours_first_ns_b"] / prose["everyday"]
    print_table(rows)
    summary: dict[str, Any] = {"build_s": build_s, "prose_first_ns_b": prose, "tiktoken_over_ours_prose": rows[0]["tiktoken_first_ns_b"] / rows[0]["ours_first_ns_b"],
                               "hf_over_ours_prose": rows[0]["hf_first_ns_b"] / rows[0]["ours_first_ns_b"]}  # fmt: skip
    for group in sorted(set(prose) - {"everyday"}, key=lambda g: int(g[:-1])):
        worst = max((r for r in rows if r["group"] == group and not r["input"].startswith("prose")), key=lambda r: r["ours_x_prose"])
        summary[f"worst @{group}"] = {"input": worst["input"], "ns_b": worst["ours_first_ns_b"], "x_prose_same_size": worst["ours_x_prose"],
                                     "x_full_prose": worst["ours_x_full_prose"]}  # fmt: skip
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))


def _p50_p99(lat: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(lat, n=100, method="inclusive")
    return q[49] * 1e6, q[98] * 1e6


def print_table(rows: list[dict[str, Any]]) -> None:
    print("\nns per byte (lower is better); x = theirs / ours; × prose = ours first-seen / ours on prose of the same size;"
          " stream = µs per 16-byte chunk (p50 / p99)")
    head = ("input", "ours 1st", "ours warm", "× prose", "HF 1st", "x", "tik 1st", "x", "tik warm", "x",
            "ours p50/p99", "HF re-enc p50/p99", "tik re-enc p50/p99", "tik = HF")  # fmt: skip
    print(" | ".join(head))
    for r in rows:
        o = r["ours_first_ns_b"]
        cells = (r["input"], f"{o:.1f}", f"{r['ours_warm_ns_b']:.1f}", f"{r['ours_x_prose']:.2f}",
                 f"{r['hf_first_ns_b']:.0f}", f"{r['hf_first_ns_b'] / o:.1f}", f"{r['tiktoken_first_ns_b']:.1f}",
                 f"{r['tiktoken_first_ns_b'] / o:.2f}", f"{r['tiktoken_warm_ns_b']:.1f}",
                 f"{r['tiktoken_warm_ns_b'] / r['ours_warm_ns_b']:.2f}",
                 f"{r['ours_stream_p50_us']:.1f}/{r['ours_stream_p99_us']:.1f}",
                 f"{r['hf_stream_p50_us']:.0f}/{r['hf_stream_p99_us']:.0f}",
                 f"{r['tiktoken_stream_p50_us']:.0f}/{r['tiktoken_stream_p99_us']:.0f}",
                 "yes" if r["tiktoken_agrees"] else "no")  # fmt: skip
        print(" | ".join(cells))


if __name__ == "__main__":
    main()

"""IncrementalBPE vs Hugging Face `tokenizers` vs tiktoken on SmolLM2's vocabulary, side by side.

    python benchmarks/tokenizer.py [--runs 3] [--sizes 20000,200000,2000000] [--out docs/tokenizer_cpu.json]

Inputs: prose (the whole WikiText-2 test split) and code (80 stdlib modules, 1 MB), then at every
``--sizes`` (bytes): prose from two corpora cut to that size, never repeated where the data is on
this machine (``tokenizer_prose``: Wikipedia, WikiText-2 test then BoolQ's passages; Python
documentation, the reference manual (pydoc) then the standard library's docstrings), and a
worst-case set: a run of every ASCII punctuation character, unspaced random letters, random
digits, runs of é, 中 and 🙂, the tokens with the deepest merge trees repeated without spaces, and
inputs the engine was not tuned on (``_inputs.UNTUNED``: base64, hex, URLs, minified code, CJK
without spaces, a run of one emoji).

Timings read the process's CPU time (``--clock wall`` for wall time; see ``timed``), with the
garbage collector off (and what the imports made frozen). *first-seen*: a fresh tokenizer (ours from its table file, as a new process gets it; built outside
the timer) encodes the text once, so no word cache is warm. *warm*: the same object after one
encode. Every figure is the median of ``--runs`` runs; within a run all inputs of a size are
timed one after another, so machine noise falls on all of them alike. ns/B is per byte of UTF-8
input; "× wiki" / "× pydoc" divide a row's first-seen ns/B by that prose's at the same size.
HF and tiktoken are timed up to 200 kB and on the everyday rows (at 2 MB they would take minutes);
ours is checked against HF on every input at every size. tiktoken is built from the same merges
(rank = merge rank, the GPT-2 regex); it merges any pair whose concatenation is a token, so it can
differ from HF on rare inputs (the agreement column). *stream*: 16-byte chunks; ours returns final
tokens per chunk, HF and tiktoken have no streaming API, so they re-encode the text so far at
every chunk, on the first ``--stream-kb`` KiB only (quadratic); p50/p99 µs per chunk.

*construction, cold*: each tokenizer built in a fresh Python process from what a process has at
start (ours: ``IncrementalBPE.from_hf`` with its table file on disk, and once more with an empty
cache, the first build ever; HF: ``Tokenizer.from_str``; tiktoken: ``Encoding`` from its ranks),
median of ``--runs`` processes, only the construction call timed (imports reported apart).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import platform
import random
import statistics
import string
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from paretolab.data import load_corpus
from paretolab.measure.timing import cpu_name, settle_allocator
from tokenizer_prose import PROSE, cut, prose_corpora

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
OTHERS_UP_TO = 200_000  # HF and tiktoken are timed on inputs up to this many bytes


def merge_depth(tables: Any) -> list[int]:
    """Depth of every token's merge tree (0 for single bytes)."""
    depth = [0] * tables.vocab_size
    for t in sorted(range(tables.vocab_size), key=lambda t: tables.rank[t]):
        if tables.rank[t] >= 0:
            depth[t] = 1 + max(depth[tables.left[t]], depth[tables.right[t]])
    return depth


def worst_inputs(tables: Any, size: int) -> dict[str, str]:
    """The worst-case set at ``size`` bytes."""
    from paretolab.plugins.incremental_bpe._inputs import UNTUNED, gen_letters

    rng = random.Random(0)
    out = {f"run {ch!r}": ch * size for ch in string.punctuation}
    out["letters"] = gen_letters(size)
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
    out.update({f"{name} (untuned)": make(size) for name, make in UNTUNED.items()})
    return out


def everyday_inputs() -> dict[str, str]:
    """The whole WikiText-2 test split (1.29 MB, nothing added) and 1 MB of code."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    code = "".join(p.read_text(encoding="utf-8", errors="replace") for p in sorted(stdlib.glob("*.py"))[:80])
    return {"prose (wikitext2)": load_corpus("wikitext2")[0], "code (stdlib)": code[:1_000_000]}


def tiktoken_ranks(tables: Any) -> tuple[dict[bytes, int], dict[int, int]]:
    """tiktoken's ranks over the same byte-level merges, with the id -> HF id map."""
    ranks: dict[bytes, int] = {bytes([b]): b for b in range(256)}  # tiktoken needs all 256 bytes
    to_hf = {b: tables.byte_token[b] for b in range(256)}
    for tid, data in enumerate(tables.token_bytes):
        if tables.rank[tid] >= 0:
            ranks[data] = 256 + tables.rank[tid]
            to_hf[256 + tables.rank[tid]] = tid
    return ranks, to_hf


CLOCK = "cpu"  # --clock: "cpu" (the calling thread's CPU time) or "wall"


def timed(fn: Callable[[], Any]) -> float:
    """Seconds ``fn`` takes: the calling thread's CPU time by default, wall time with ``--clock wall``.

    The thread's CPU time, because on a shared machine whose CPUs are oversubscribed a 20 kB
    encode's wall time is mostly the run queue's wait (20-50x its CPU time, at random). All three
    tokenizers encode on the calling thread. Before the clock starts the allocator is settled
    (``settle_allocator``); while ``fn`` runs the garbage collector is off: a collection over the
    million objects torch and transformers leave would otherwise land inside some timings and not others.
    """
    clock = time.thread_time if CLOCK == "cpu" else time.perf_counter
    settle_allocator()
    gc.disable()
    try:
        start = clock()
        fn()
        return clock() - start
    finally:
        gc.enable()


def chunk_latencies(feed: Callable[[str], Any], text: str) -> list[float]:
    out = []
    for at in range(0, len(text), 16):
        start = time.perf_counter()
        feed(text[at : at + 16])
        out.append(time.perf_counter() - start)
    return out


_COLD = {
    "ours (from_hf, table file on disk)": """
import time, tokenizers
hf = tokenizers.Tokenizer.from_file({spec!r})
t0 = time.perf_counter()
from paretolab.plugins.incremental_bpe import IncrementalBPE
t1 = time.perf_counter()
bpe = IncrementalBPE.from_hf(hf)
t2 = time.perf_counter()
assert bpe.backend == "c"
print(t2 - t1, t1 - t0)
""",
    "hf (Tokenizer.from_str)": """
import time, tokenizers
spec = open({spec!r}, encoding="utf-8").read()
t0 = time.perf_counter()
tokenizers.Tokenizer.from_str(spec)
print(time.perf_counter() - t0, 0.0)
""",
    "tiktoken (Encoding from ranks)": """
import pickle, time, tiktoken
ranks = pickle.load(open({ranks!r}, "rb"))
t0 = time.perf_counter()
tiktoken.Encoding("smollm2-bpe", pat_str={pattern!r}, mergeable_ranks=ranks, special_tokens={{}})
print(time.perf_counter() - t0, 0.0)
""",
}


def cold_construction(spec: str, ranks: dict[bytes, int], runs: int) -> dict[str, Any]:
    """Each tokenizer built in fresh processes: median seconds of the construction call (and of importing the plugin)."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, ranks_path = Path(tmp) / "tokenizer.json", Path(tmp) / "ranks.pkl"
        spec_path.write_text(spec, encoding="utf-8")
        ranks_path.write_bytes(pickle.dumps(ranks))

        def run(name: str, env: dict[str, str]) -> tuple[float, float]:
            code = _COLD[name].format(spec=str(spec_path), ranks=str(ranks_path), pattern=GPT2_PATTERN)
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
            build, imports = map(float, done.stdout.split())
            return build, imports

        for name in _COLD:
            results = [run(name, dict(os.environ)) for _ in range(runs)]
            out[name] = {"s": statistics.median(r[0] for r in results), "runs_s": [r[0] for r in results]}
            if name.startswith("ours"):
                out[name]["import_plugin_s"] = statistics.median(r[1] for r in results)
        empty = dict(os.environ, PARETOLAB_CACHE=str(Path(tmp) / "empty-cache"))
        first = run("ours (from_hf, table file on disk)", empty)
        out["ours (from_hf, first build: no table file)"] = {"s": first[0], "runs_s": [first[0]]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (medians)")
    parser.add_argument("--sizes", default="20000,200000,2000000", help="input sizes in bytes, comma-separated")
    parser.add_argument("--stream-kb", type=int, default=4, help="prefix re-encoded by HF and tiktoken per chunk")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help="what a timing reads (see timed())")
    parser.add_argument("--out", type=Path, help="also write everything as JSON here (docs/tokenizer_cpu.json)")
    args = parser.parse_args()
    global CLOCK
    CLOCK = args.clock

    import tiktoken
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from paretolab.models import SmolLM2
    from paretolab.plugins.incremental_bpe import IncrementalBPE
    from paretolab.plugins.incremental_bpe._forest import max_candidates

    load_at_start = os.getloadavg()
    hf = AutoTokenizer.from_pretrained(SmolLM2().pull())
    spec = hf.backend_tokenizer.to_str()
    ours_proto = IncrementalBPE.from_hf(hf)  # writes the table file if there is none
    tables = ours_proto.tables
    ranks, tik_to_hf = tiktoken_ranks(tables)
    bound = max_candidates(tables)
    print(f"IncrementalBPE backend={ours_proto.backend}; candidates per byte at most {bound}; CPU {cpu_name()}, {os.cpu_count()} cores")

    def new_ours() -> Callable[[str], Any]:
        return IncrementalBPE.from_hf(hf).encode

    def new_hf() -> Callable[[str], Any]:
        tok = Tokenizer.from_str(spec)
        return lambda text: tok.encode(text, add_special_tokens=False).ids

    def new_tik() -> Callable[[str], Any]:
        return tiktoken.Encoding("smollm2-bpe", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={}).encode_ordinary


    prose = prose_corpora()
    groups: dict[str, dict[str, str]] = {"everyday": everyday_inputs()}
    cycled: dict[str, list[str]] = {}
    for size in (int(s) for s in args.sizes.split(",")):
        group = f"{size // 1000}k"
        rows = {}
        for corpus in PROSE:
            rows[f"prose ({corpus})"], was_cycled = cut(prose[corpus], size)
            if was_cycled:
                cycled.setdefault(group, []).append(corpus)
        rows.update(worst_inputs(tables, size))
        groups[group] = rows

    enc_tik = new_tik()
    gc.collect()
    gc.freeze()  # what exists now is never collected again: later collections only walk new objects
    results: list[dict[str, Any]] = []
    for group, inputs in groups.items():
        print(f"[{group}] checking {len(inputs)} inputs against HF ...", flush=True)
        rows = []
        for name, text in inputs.items():
            nbytes = len(text.encode("utf-8"))
            truth = new_hf()(text)
            assert ours_proto.encode(text) == truth, f"{name} @{group}: IncrementalBPE differs from HF"
            others = group == "everyday" or nbytes <= OTHERS_UP_TO
            row: dict[str, Any] = {"input": name, "group": group, "bytes": nbytes, "ids_equal_hf": True}
            if others:
                row["tiktoken_agrees"] = [tik_to_hf[t] for t in enc_tik(text)] == truth
            rows.append((row, text, others))
        who_all = (("ours", new_ours), ("hf", new_hf), ("tiktoken", new_tik))
        first: dict[tuple[str, str], list[float]] = {}
        warm: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.runs):  # a run times every input of the group, so noise falls on all alike
            for row, text, others in rows:
                for who, make in who_all if others else who_all[:1]:
                    encode = make()
                    first.setdefault((row["input"], who), []).append(timed(lambda: encode(text)) / row["bytes"] * 1e9)
                    warm.setdefault((row["input"], who), []).append(timed(lambda: encode(text)) / row["bytes"] * 1e9)
        for row, text, others in rows:
            for who, _ in who_all if others else who_all[:1]:
                row[f"{who}_first_ns_b"] = statistics.median(first[(row["input"], who)])
                row[f"{who}_first_runs"] = first[(row["input"], who)]
                row[f"{who}_warm_ns_b"] = statistics.median(warm[(row["input"], who)])
            if group in ("everyday", "20k"):
                _stream(row, text, args.stream_kb, IncrementalBPE.from_hf(hf), new_hf, new_tik)
            results.append(row)
        prose_ns = {c: next(r["ours_first_ns_b"] for r, _, _ in rows if r["input"] == f"prose ({c})") for c in PROSE if group != "everyday"}
        for row, _, _ in rows:
            for corpus, ns in prose_ns.items():
                row[f"x_{corpus}"] = row["ours_first_ns_b"] / ns
        print_table([r for r, _, _ in rows], group)

    construction = cold_construction(spec, ranks, args.runs)
    print("construction, cold process (median): " + ", ".join(f"{k} {v['s']:.3f} s" for k, v in construction.items()), flush=True)
    summary = summarize(results, groups, construction, cycled, bound)
    summary["load_average_start_end"] = [load_at_start, os.getloadavg()]
    summary["clock"] = CLOCK
    print(json.dumps({k: v for k, v in summary.items() if k != "worst_case"}, indent=1))
    print_ratio_table(summary)
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "rows": results}, indent=1, ensure_ascii=False) + "\n")


def _stream(row: dict[str, Any], text: str, stream_kb: int, ours: Any, new_hf: Callable[[], Any], new_tik: Callable[[], Any]) -> None:
    stream = ours.stream()
    row["ours_stream_p50_us"], row["ours_stream_p99_us"] = _p50_p99(chunk_latencies(stream.feed, text))
    stream.finish()
    head = text[: stream_kb * 1024]
    for who, make in (("hf", new_hf), ("tiktoken", new_tik)):
        encode, seen = make(), [""]

        def re_encode(chunk: str, encode: Callable[[str], Any] = encode, seen: list[str] = seen) -> None:
            seen[0] += chunk
            encode(seen[0])

        row[f"{who}_stream_p50_us"], row[f"{who}_stream_p99_us"] = _p50_p99(chunk_latencies(re_encode, head))


def summarize(results: list[dict[str, Any]], groups: dict[str, Any], construction: dict[str, Any], cycled: dict[str, list[str]], bound: int) -> dict[str, Any]:
    """The figures the issue asks for: per worst-case input, ns/B and × each prose at every size; flatness; construction; WikiText-2 vs tiktoken."""
    sizes = [g for g in groups if g != "everyday"]
    by = {(r["input"], r["group"]): r for r in results}
    worst_names = [n for n in groups[sizes[0]] if not n.startswith("prose")] if sizes else []
    worst: dict[str, Any] = {}
    for name in worst_names:
        entry: dict[str, Any] = {}
        for g in sizes:
            r = by[(name, g)]
            entry[g] = {"ns_b": r["ours_first_ns_b"], **{f"x_{c}": r[f"x_{c}"] for c in PROSE}}
        entry["flat_last_over_first_size"] = entry[sizes[-1]]["ns_b"] / entry[sizes[0]]["ns_b"]
        worst[name] = entry
    per_size = {}
    for g in sizes:
        rows = [by[(n, g)] for n in worst_names]
        top = {c: max(rows, key=lambda r, c=c: r[f"x_{c}"]) for c in PROSE}
        per_size[g] = {
            "prose_ns_b": {c: by[(f"prose ({c})", g)]["ours_first_ns_b"] for c in PROSE},
            **{f"worst_x_{c}": {"input": top[c]["input"], "x": top[c][f"x_{c}"], "ns_b": top[c]["ours_first_ns_b"]} for c in PROSE},
            "inputs_over_1.5x_either_prose": sorted(r["input"] for r in rows if max(r[f"x_{c}"] for c in PROSE) > 1.5),
        }
    wiki = by[("prose (wikitext2)", "everyday")]
    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "max_candidates_per_byte": bound,
        "construction_cold_s": construction,
        "wikitext2_first_seen_ns_b": {"ours": wiki["ours_first_ns_b"], "tiktoken": wiki["tiktoken_first_ns_b"], "hf": wiki["hf_first_ns_b"],
                                      "tiktoken_over_ours": wiki["tiktoken_first_ns_b"] / wiki["ours_first_ns_b"],
                                      "hf_over_ours": wiki["hf_first_ns_b"] / wiki["ours_first_ns_b"]},  # fmt: skip
        "per_size": per_size,
        "prose_cycled_to_reach_size": cycled,
        "worst_case": worst,
    }


def _p50_p99(lat: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(lat, n=100, method="inclusive")
    return q[49] * 1e6, q[98] * 1e6


def print_table(rows: list[dict[str, Any]], group: str) -> None:
    print(f"\n[{group}] ns per byte, medians (lower is better); x = theirs / ours; × wiki / × pydoc = ours first-seen / that prose's at this size")
    head = ("input", "ours 1st", "ours warm", "× wiki", "× pydoc", "HF 1st", "x", "tik 1st", "x", "tik warm", "x", "tik = HF")
    print(" | ".join(head))
    for r in rows:
        o = r["ours_first_ns_b"]
        cells = [r["input"], f"{o:.1f}", f"{r['ours_warm_ns_b']:.1f}", f"{r.get('x_wikitext2', float('nan')):.2f}", f"{r.get('x_pydoc', float('nan')):.2f}"]
        if "hf_first_ns_b" in r:
            cells += [f"{r['hf_first_ns_b']:.0f}", f"{r['hf_first_ns_b'] / o:.1f}", f"{r['tiktoken_first_ns_b']:.1f}",
                      f"{r['tiktoken_first_ns_b'] / o:.2f}", f"{r['tiktoken_warm_ns_b']:.1f}",
                      f"{r['tiktoken_warm_ns_b'] / r['ours_warm_ns_b']:.2f}", "yes" if r["tiktoken_agrees"] else "no"]  # fmt: skip
        print(" | ".join(cells), flush=True)


def print_ratio_table(summary: dict[str, Any]) -> None:
    worst = summary["worst_case"]
    if not worst:
        return
    sizes = [g for g in next(iter(worst.values())) if g != "flat_last_over_first_size"]
    print("\nfirst-seen ns/B and × prose (wiki / pydoc) per size; flat = ns/B at the largest size / at the smallest")
    print(" | ".join(["input", *[f"{g}: ns/B ×wiki ×pydoc" for g in sizes], "flat"]))
    for name, e in worst.items():
        cells = [f"{e[g]['ns_b']:.1f} {e[g]['x_wikitext2']:.2f} {e[g]['x_pydoc']:.2f}" for g in sizes]
        print(" | ".join([name, *cells, f"{e['flat_last_over_first_size']:.2f}"]))


if __name__ == "__main__":
    main()

"""The tokenizer benchmark's figures as the paragraph docs/methods/encodings.md prints, rendered from its JSON.

    python benchmarks/tokenizer_report.py                    # print the paragraph of docs/tokenizer_cpu.json
    python benchmarks/tokenizer_report.py --write            # put it between the markers in docs/methods/encodings.md
    python benchmarks/tokenizer_report.py --check            # exit 1 when the page differs from what the JSON renders

The page's figures are never typed by hand: a rerun of ``benchmarks/tokenizer.py --out docs/tokenizer_cpu.json`` and
``--write`` change them together, and a test runs ``--check``. The issue's targets are judged here, in one place:
every worst-case input at most 1.5x same-size prose (both corpora) at 200 kB and 2 MB, flat per byte from the
smallest size to the largest, WikiText-2 first-seen at least 3x tiktoken, cold construction at most 0.2 s.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from paretolab.plugin_api.numbers import number

ROOT = Path(__file__).resolve().parents[1]
JSON = ROOT / "docs" / "tokenizer_cpu.json"
PAGE = ROOT / "docs" / "methods" / "encodings.md"
BEGIN, END = "<!-- tokenizer-figures:begin (benchmarks/tokenizer_report.py --write) -->", "<!-- tokenizer-figures:end -->"
MAX_X, JUDGED_SIZES, MIN_OVER_TIKTOKEN, MAX_CONSTRUCTION_S, MAX_FLAT = 1.5, ("200k", "2000k"), 3.0, 0.2, 1.1
CORPORA = {"wikitext2": "Wikipedia", "pydoc": "Python docs"}


def describe(data: dict[str, Any]) -> str:
    """The paragraph, from the benchmark's JSON (``{"summary": ..., "rows": ...}``)."""
    s = data["summary"]
    cons = s["construction_cold_s"]
    ours_cold = cons["ours (from_hf, table file on disk)"]["s"]
    first = cons.get("ours (from_hf, first build: no table file)", {}).get("s")
    wiki = s["wikitext2_first_seen_ns_b"]
    runs = len(data["rows"][0]["ours_first_runs"]) if data.get("rows") else 0
    start, end = s.get("load_average_start_end", [[None], [None]])
    out = [f"Measured on {s['cpu']}, {s['cores']} cores, 1-min load average {number(start[0])} at the start and {number(end[0])} at the end"
           f" (`docs/tokenizer_cpu.json`: thread {'CPU' if s.get('clock', 'cpu') == 'cpu' else 'wall'} time, medians of {runs} runs,"
           f" the allocator settled before every clock). Construction in a cold process: {number(ours_cold)} s (HF"
           f" {number(cons['hf (Tokenizer.from_str)']['s'])} s, tiktoken {number(cons['tiktoken (Encoding from ranks)']['s'])} s"
           + (f"; the first build, with no table file, {number(first)} s)." if first is not None else ").")
           + f" WikiText-2 test, first-seen: {number(wiki['ours'])} ns/B (tiktoken {number(wiki['tiktoken'])}, ×{number(wiki['tiktoken_over_ours'])}"
           f" ours; HF {number(wiki['hf'])}, ×{number(wiki['hf_over_ours'])})."]
    for size, entry in s["per_size"].items():
        prose = ", ".join(f"{number(v)} ns/B ({CORPORA.get(c, c)})" for c, v in entry["prose_ns_b"].items())
        dearest = "; ".join(f"×{number(entry[f'worst_x_{c}']['x'])} {CORPORA.get(c, c)} ({_name(entry[f'worst_x_{c}']['input'])})" for c in entry["prose_ns_b"])
        over = ", ".join(_name(n) for n in entry["inputs_over_1.5x_either_prose"]) or "none"
        out.append(f"At {_size(size)} prose costs {prose}; the dearest worst case is {dearest}; over 1.5× either: {over}.")
    flat = sorted(((e["flat_last_over_first_size"], _name(n)) for n, e in s["worst_case"].items()), reverse=True)[:3]
    sizes = list(s["per_size"])
    out.append(f"Cost per byte, {_size(sizes[-1])} over {_size(sizes[0])}: at most " + ", ".join(f"{number(x)} ({n})" for x, n in flat) + ".")
    repeated = s.get("prose_cycled_to_reach_size") or {}
    if repeated:
        out.append("Prose repeated to reach a size (no longer text on that machine): "
                   + "; ".join(f"{_size(g)}: {', '.join(CORPORA.get(c, c) for c in cs)}" for g, cs in repeated.items()) + ".")
    missed = not_met(s)
    out.append("Every target met." if not missed else "Not met: " + "; ".join(missed) + ".")
    return "\n".join(out)


def not_met(s: dict[str, Any]) -> list[str]:
    """The targets these figures miss, each in words (empty: all met)."""
    missed = []
    for size in JUDGED_SIZES:
        entry = s["per_size"].get(size)
        if entry and entry["inputs_over_1.5x_either_prose"]:
            missed.append(f"at {_size(size)} {', '.join(_name(n) for n in entry['inputs_over_1.5x_either_prose'])} over {number(MAX_X)}× prose")
    steep = [_name(n) for n, e in s["worst_case"].items() if e["flat_last_over_first_size"] > MAX_FLAT]
    if steep:
        missed.append(f"per byte not flat (over ×{number(MAX_FLAT)} from the smallest size to the largest): {', '.join(steep)}")
    if s["wikitext2_first_seen_ns_b"]["tiktoken_over_ours"] < MIN_OVER_TIKTOKEN:
        missed.append(f"WikiText-2 first-seen ×{number(s['wikitext2_first_seen_ns_b']['tiktoken_over_ours'])} tiktoken, under ×{number(MIN_OVER_TIKTOKEN)}")
    cold = s["construction_cold_s"]["ours (from_hf, table file on disk)"]["s"]
    if cold > MAX_CONSTRUCTION_S:
        missed.append(f"cold construction {number(cold)} s, over {number(MAX_CONSTRUCTION_S)} s")
    return missed


def _name(name: str) -> str:
    return name.replace(" (untuned)", "")


def _size(group: str) -> str:
    kb = int(group.rstrip("k"))
    return f"{number(kb / 1000)} MB" if kb >= 1000 else f"{kb} kB"


def render_page(page: str, paragraph: str) -> str:
    """``page`` with the text between the markers replaced by ``paragraph``."""
    if BEGIN not in page or END not in page:
        raise SystemExit(f"{PAGE}: the markers {BEGIN!r} … {END!r} are missing; put them where the figures go")
    head, rest = page.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{paragraph}\n{END}{rest.split(END, 1)[1]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="?", type=Path, default=JSON, help=f"the benchmark's JSON (default {JSON.relative_to(ROOT)})")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"write the paragraph into {PAGE.relative_to(ROOT)}")
    mode.add_argument("--check", action="store_true", help="exit 1 when the page's paragraph is not what the JSON renders")
    args = parser.parse_args(argv)
    paragraph = describe(json.loads(args.json.read_text(encoding="utf-8")))
    if not (args.write or args.check):
        print(paragraph)
        return 0
    page = PAGE.read_text(encoding="utf-8")
    rendered = render_page(page, paragraph)
    if args.check:
        if rendered != page:
            print(f"{PAGE.relative_to(ROOT)}: the tokenizer figures are not what {args.json.name} renders; run "
                  "`python benchmarks/tokenizer_report.py --write` and commit", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(rendered, encoding="utf-8")
    print(f"wrote the tokenizer figures into {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

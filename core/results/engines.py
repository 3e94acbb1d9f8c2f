"""The engine measure read back: per trial and engine, what was served, throughput at each concurrency against the
unmodified model's served the same way, the engine's perplexity against the trial's, and the in-process figure beside it.

One builder for the results documents (:func:`engine_lines`) and the dashboard's Trial page (:func:`engine_cells`).
Ratios against ``none`` are the figures to read on a loaded machine: both trials were served by the same engine
under the same load generator, one after the other. A ratio's interval is the conservative quotient of the two
95 % t-intervals over repeats (low ÷ high, high ÷ low). The engine and the in-process measure *disagree* where one
says faster (its interval above 1) and the other slower (below 1), or one is clear and the other is not; the
in-process figure is ``decode_speedup`` (the latency measure's paired rounds against the unmodified model,
median ± half its IQR). The engine's perplexity is compared with the trial's by
:func:`paretolab.results.noise.engine_ppl_gaps` (the paired difference over the task's windows: within noise or not).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from paretolab.plugin_api.numbers import RATIO, interval_text, number, plain_text
from paretolab.results.load import MAX_LOAD
from paretolab.results.noise import engine_ppl_gaps, with_interval

ENGINES = {"llama": "llama.cpp", "vllm": "vLLM"}  # the engine measure's prefixes, as the documents name them
LEVELS = (1, 16)  # the concurrency levels the tables show where measured (the study's: one user and sixteen)


def engines_in(row: dict[str, Any]) -> list[str]:
    """The engines a trial was served by (its ``E_tok_s_c*`` metrics)."""
    return [e for e in ENGINES if any(k.startswith(f"{e}_tok_s_c") for k in row)]


def _number(row: dict[str, Any] | None, key: str) -> float | None:
    try:
        return float(row[key]) if row is not None and key in row else None
    except (TypeError, ValueError):
        return None


def ratio(row: dict[str, Any], base: dict[str, Any] | None, metric: str) -> tuple[float, float, float] | None:
    """``row[metric] / base[metric]`` with the conservative interval from the two logged 95 % intervals."""
    a, b = _number(row, metric), _number(base, metric)
    if a is None or not b:
        return None
    al, ah = _number(row, f"{metric}_ci_low"), _number(row, f"{metric}_ci_high")
    bl, bh = _number(base, f"{metric}_ci_low"), _number(base, f"{metric}_ci_high")
    if None in (al, ah, bl, bh) or bh <= 0:  # type: ignore[operator]
        return a / b, float("nan"), float("nan")
    return a / b, max(al, 0.0) / bh, ah / bl if bl > 0 else float("inf")  # type: ignore[operator]  # none's interval reaching 0: unbounded


def direction(value: float, low: float, high: float) -> str:
    """``faster`` (the interval above 1), ``slower`` (below 1), else ``no clear change``."""
    if low == low and low > 1.0:
        return "faster"
    if high == high and high < 1.0:
        return "slower"
    return "no clear change"


def in_process(row: dict[str, Any]) -> tuple[float, float, float] | None:
    """The latency measure's ``decode_speedup`` as (median, median − IQR/2, median + IQR/2)."""
    s = _number(row, "decode_speedup")
    if s is None:
        return None
    half = (_number(row, "decode_speedup_iqr") or 0.0) / 2
    return s, s - half, s + half


def _ratio_text(r: tuple[float, float, float] | None) -> str:
    if r is None:
        return ""
    v, lo, hi = r
    return number(v, RATIO) if lo != lo else interval_text(v, lo, hi, RATIO)  # ×1.24 [×1.08, ×1.43]


def _load_owner(served: list[dict[str, Any]], most: float) -> str:
    """Whose load that was: the server's own threads and the load generator's on the machine's cores, within the
    other work a timed study tolerates (``MAX_LOAD``, the one threshold of `results status`), or other work's too."""
    cores = {str(c) for r in served if (c := (r.get("run_params") or {}).get("info.cores")) not in (None, "")}
    if len(cores) != 1:
        return "the machine's cores were not recorded, so other work may have shared it"
    n = float(cores.pop())
    if most <= n + MAX_LOAD:
        return f"the server's and the load generator's own, on {number(n)} cores: no other work beyond {number(MAX_LOAD)}"
    return f"over the {number(n)} cores by more than {number(MAX_LOAD)}: shared with other work"


def engine_cells(row: dict[str, Any], e: str, base: dict[str, Any] | None, info: dict[str, Any]) -> dict[str, str]:
    """One trial in one engine, as text cells: served as, tok/s per level (÷ none), the engine's ppl and its gap."""
    cells = {"engine": ENGINES[e], "served as": plain_text(str(info.get(f"{e}_format", "")))}
    for c in LEVELS:
        metric = f"{e}_tok_s_c{c}"
        if metric in row:
            cells[f"tok/s at {c}"] = with_interval(row, metric)
            cells[f"÷ none at {c}"] = "" if base is row else _ratio_text(ratio(row, base, metric))
    if f"{e}_ppl" in row:
        cells["ppl in the engine"] = with_interval(row, f"{e}_ppl")
    gaps = engine_ppl_gaps({**row, "n_windows": row.get("n_windows")})
    cells["engine ppl − trial ppl"] = gaps.get(e) or str(info.get(f"{e}_ppl_note", ""))
    return cells


def gap_cell(gaps: dict[str, str]) -> str:
    """``llama +0.023 [-0.048, +0.092] within noise; vllm ... BEYOND NOISE``: a gap beyond noise stands out (frontier tables)."""
    return "; ".join(f"{e} {text.replace('beyond noise', 'BEYOND NOISE')}" for e, text in gaps.items()) or "-"


def engine_lines(rows: list[dict[str, Any]], baseline_of: Callable[[dict[str, Any]], Any],
                 markdown_table: Callable[[list[dict[str, Any]], list[str]], str]) -> list[str]:
    """The documents' engine section: one table row per trial and engine, then where engine and in-process disagree
    (``markdown_table``: the documents' table writer)."""
    served = [r for r in rows if engines_in(r)]
    if not served:
        return []
    table, notes, labels = [], [], []
    for r in sorted(served, key=lambda r: (r["method"] != "none", r["method"], r["trial"])):
        base = baseline_of(r)
        base = base if isinstance(base, dict) else None
        info = {k.removeprefix("info."): v for k, v in r.get("run_params", {}).items() if k.startswith("info.")}
        mine = in_process(r)
        labels += [f"- trial {r['trial']} ({r['method']}), {name}: {info[f'{e}_refused']}" for e, name in ENGINES.items() if info.get(f"{e}_refused")]
        for e in engines_in(r):
            cells = engine_cells(r, e, base, info)
            cells.update({"method": r["method"], "trial": str(r["trial"]), "trial ppl": with_interval(r, "ppl") if "ppl" in r else "",
                          "in-process decode_speedup": "" if base is r or mine is None else _ratio_text(mine)})
            table.append(cells)
            if base is None or base is r:
                continue
            for c in LEVELS:
                eng = ratio(r, base, f"{e}_tok_s_c{c}")
                if eng is None or mine is None:
                    continue
                said, ours = direction(*eng), direction(*mine)
                if said != ours:
                    notes.append(f"- trial {r['trial']} ({r['method']}), {ENGINES[e]} at {c} user{'s' if c > 1 else ''}: against none, the engine "
                                 f"says **{said}** ({_ratio_text(eng)}), the in-process decode **{ours}** ({_ratio_text(mine)}).")
            gap = _number(r, f"{e}_ppl_gap")
            if gap:
                notes.append(f"- trial {r['trial']} ({r['method']}), {ENGINES[e]}: the served model's perplexity differs from the "
                             f"trial's beyond noise ({cells['engine ppl − trial ppl']}).")
    columns = ["method", "trial", "engine", "served as", *[f"{k} at {c}" for c in LEVELS for k in ("tok/s", "÷ none")],
               "in-process decode_speedup", "trial ppl", "ppl in the engine", "engine ppl − trial ppl"]
    columns = [c for c in columns if any(t.get(c) for t in table)]
    out = ["### Served by the engines", "",
           "Tokens/s of the engine's own server under a fixed load (aggregate over users, mean over repeats, 95 % t-interval); "
           "`÷ none` divides by the unmodified model served the same way (the figure to read under load: conservative "
           "interval from both intervals). `in-process decode_speedup` is paretolab's own one-process decode against the "
           "unmodified model (median of paired rounds, ± half the IQR). The engine's perplexity is from its own "
           "log-probabilities on the task's windows, paired with the trial's over the same windows.", "",
           markdown_table(table, columns), ""]
    out += ["**Where they disagree** (the engine's ratio against none and the in-process one point different ways, or the "
            "engine's perplexity is off the trial's beyond noise):", "", *notes, ""] if notes else \
        ["The engine's ratios against none and the in-process ones point the same way for every trial and level, and every "
         "engine perplexity is within noise of the trial's.", ""]
    loads = [v for r in served for e in engines_in(r) if (v := _number(r, f"{e}_loadavg")) is not None]
    if loads:
        out += [f"**Under load**: the machine's 1-minute load average while the engines were under load was {min(loads):.1f}–"
                f"{max(loads):.1f} ({len(loads)} loads; {_load_owner(served, max(loads))}). Absolute tokens/s move with it; "
                "read the ratios against none.", ""]
    stopped = [bool(r.get("run_params", {}).get(f"info.{e}_server_stopped")) for r in served for e in engines_in(r)]
    if stopped and all(stopped):
        out += [f"Every server's process group ({len(stopped)}) was checked gone after its measure.", ""]
    if labels:
        out += ["**Refused by the engine** (its own message; the trial was then served as its dense equivalent):", "", *labels, ""]
    return out

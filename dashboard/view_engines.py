"""The engine measure on the dashboard: a section of the Trial page and a column of the frontier table.

The text comes from :mod:`paretolab.results.engines` (the results documents use the same cells); a gap
between the engine's perplexity and the trial's is judged by the one noise rule (:mod:`paretolab.results.noise`).
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from paretolab.results.engines import engine_cells, engines_in, gap_cell
from paretolab.results.noise import engine_ppl_gaps

GAP_COLUMN = "engine ppl vs the trial's"


def engine_section(metrics: dict[str, float], params: dict[str, Any]) -> None:
    """Per engine the trial was served by: what it served, tokens/s per level, its perplexity against the trial's; refusals."""
    engines = engines_in(metrics)
    info = {k.removeprefix("info."): v for k, v in params.items() if k.startswith("info.")}
    refused = {e: info[f"{e}_refused"] for e in ("llama", "vllm") if info.get(f"{e}_refused")}
    if not engines and not refused:
        return
    st.subheader("Served by an engine (engine measure)")
    rows = [engine_cells(metrics, e, None, info) for e in engines]
    frame = pd.DataFrame(rows)
    frame = frame[[c for c in frame.columns if frame[c].astype(str).str.len().gt(0).any()]] if not frame.empty else frame
    st.dataframe(frame, hide_index=True, width="stretch")
    for e, why in refused.items():
        st.warning(f"{e}: {why} — served as its dense equivalent (no engine kernel: dense cost).")
    st.caption("Tokens/s: the engine's own server under the measure's load, mean over repeats with its 95 % interval; "
               "the Frontier page's table and `paretolab frontier --json` carry the same figures.")


def gap_column(frame: pd.DataFrame) -> pd.DataFrame:
    """The frontier table with a column per trial: each engine's perplexity against the trial's (flagged beyond noise)."""
    if not any(c.endswith("_ppl_diff") for c in frame.columns):
        return frame
    cells = [gap_cell(engine_ppl_gaps({k: v for k, v in row.items() if pd.notna(v)})) for row in frame.to_dict("records")]
    return frame.assign(**{GAP_COLUMN: cells})

"""The engine measure on the dashboard: the Trial page's section and the frontier table's gap column."""

from __future__ import annotations

import pandas as pd
from streamlit.testing.v1 import AppTest

from paretolab.dashboard.view_engines import GAP_COLUMN, gap_column

METRICS = {"llama_tok_s_c1": 25.0, "llama_tok_s_c1_ci_low": 20.0, "llama_tok_s_c1_ci_high": 30.0, "llama_ppl": 20.5,
           "llama_ppl_diff": 0.4, "llama_ppl_diff_ci_low": 0.1, "llama_ppl_diff_ci_high": 0.7, "n_windows": 4.0,
           "vllm_tok_s_c16": 80.0, "vllm_tok_s_c16_ci_low": 70.0, "vllm_tok_s_c16_ci_high": 90.0}
PARAMS = {"info.llama_format": "Q4_0 (exact: the trial's codes)", "info.vllm_format": "F32 dense equivalent (no engine kernel: dense cost)",
          "info.vllm_refused": "vLLM did not serve the compressed-tensors checkpoint: ValueError: no kernel"}


def _page(metrics: dict, params: dict) -> None:
    from paretolab.dashboard.view_engines import engine_section

    engine_section(metrics, params)


def test_trial_page_section_shows_each_engine_and_the_refusal() -> None:
    at = AppTest.from_function(_page, args=(METRICS, PARAMS), default_timeout=60)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert [s.value for s in at.subheader] == ["Served by an engine (engine measure)"]
    frame = at.dataframe[0].value.set_index("engine")
    assert frame.loc["llama.cpp", "served as"] == "Q4_0 (exact: the trial's codes)"
    assert frame.loc["llama.cpp", "tok/s at 1"] == "25 [20, 30]" and frame.loc["vLLM", "tok/s at 16"] == "80 [70, 90]"
    assert frame.loc["llama.cpp", "engine ppl − trial ppl"] == "+0.4 [+0.1, +0.7] beyond noise (paired, 4 windows)"
    assert "ValueError: no kernel" in at.warning[0].value and "dense cost" in at.warning[0].value


def test_no_engine_no_section() -> None:
    at = AppTest.from_function(_page, args=({"ppl": 3.0}, {}), default_timeout=60)
    at.run()
    assert not at.exception and not at.subheader and not at.dataframe


def test_frontier_table_gets_the_gap_column_only_with_engines() -> None:
    front = pd.DataFrame([{"number": 0, **METRICS}, {"number": 1, "ppl": 3.0}])
    shown = gap_column(front)
    assert shown[GAP_COLUMN].tolist() == ["llama +0.4 [+0.1, +0.7] BEYOND NOISE (paired, 4 windows)", "-"]
    plain = pd.DataFrame([{"number": 0, "ppl": 3.0}])
    assert GAP_COLUMN not in gap_column(plain).columns

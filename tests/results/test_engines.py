"""The engine measure read back: its documents' section, the frontier's engine column and the Optuna copy of its figures."""

from __future__ import annotations

from paretolab.records import TrialResult
from paretolab.results.engines import direction, engine_lines, gap_cell, ratio
from paretolab.results.noise import engine_ppl_gaps
from paretolab.results.replicates import baseline_finder
from paretolab.results.section import markdown_table
from paretolab.study.recording import engine_attrs


def _row(trial: int, method: str, c1: tuple[float, float, float], gap: tuple[float, float, float], **extra) -> dict:
    row = {"trial": trial, "method": method, "params": {}, "ppl": 20.3, "ppl_ci_low": 19.0, "ppl_ci_high": 21.5, "n_windows": 4.0,
           "llama_tok_s_c1": c1[0], "llama_tok_s_c1_ci_low": c1[1], "llama_tok_s_c1_ci_high": c1[2],
           "llama_tok_s_c16": 2 * c1[0], "llama_tok_s_c16_ci_low": 2 * c1[1], "llama_tok_s_c16_ci_high": 2 * c1[2],
           "llama_ppl": 20.3 + gap[0], "llama_ppl_ci_low": 19.0, "llama_ppl_ci_high": 22.0,
           "llama_ppl_diff": gap[0], "llama_ppl_diff_ci_low": gap[1], "llama_ppl_diff_ci_high": gap[2],
           "llama_ppl_gap": 0.0 if gap[1] <= 0 <= gap[2] else 1.0,
           "run_params": {"info.llama_format": "Q4_0 (exact: ...)" if method == "rtn" else "F32"}}
    row.update(extra)
    return row


def test_ratio_interval_and_direction() -> None:
    got = ratio({"m": 30.0, "m_ci_low": 28.0, "m_ci_high": 32.0}, {"m": 20.0, "m_ci_low": 18.0, "m_ci_high": 22.0}, "m")
    assert got == (1.5, 28.0 / 22.0, 32.0 / 18.0)
    unbounded = ratio({"m": 30.0, "m_ci_low": 28.0, "m_ci_high": 32.0}, {"m": 20.0, "m_ci_low": 0.0, "m_ci_high": 40.0}, "m")
    assert unbounded == (1.5, 0.7, float("inf")) and direction(*unbounded) == "no clear change"  # none's interval reaching 0
    assert direction(*got) == "faster" and direction(0.8, 0.7, 0.9) == "slower" and direction(1.0, 0.9, 1.1) == "no clear change"


def test_the_section_says_where_the_engine_and_the_in_process_figure_disagree() -> None:
    none = _row(0, "none", (20.0, 18.0, 22.0), (0.01, -0.02, 0.04), llama_loadavg=11.5)
    # llama.cpp serves the Q4_0 trial 1.5x faster than none; the in-process decode is slower than the unmodified model
    rtn = _row(1, "rtn", (30.0, 28.0, 32.0), (0.5, 0.3, 0.7), decode_speedup=0.8, decode_speedup_iqr=0.1, llama_loadavg=13.25)
    rtn["run_params"]["info.vllm_refused"] = "vLLM did not serve the compressed-tensors checkpoint: ValueError: no kernel"
    lines = engine_lines([none, rtn], baseline_finder([none, rtn], ()), markdown_table)
    text = "\n".join(lines)
    assert "| none | 0 | llama.cpp | F32 | 20 [18, 22] |" in text
    assert "| rtn | 1 | llama.cpp | Q4_0 (exact: ...) | 30 [28, 32] | ×1.5 [×1.273, ×1.778] |" in text
    assert "trial 1 (rtn), llama.cpp at 1 user: against none, the engine says **faster** (×1.5 [×1.273, ×1.778]), the in-process decode **slower**" in text
    assert "trial 1 (rtn), llama.cpp: the served model's perplexity differs from the trial's beyond noise (+0.5 [+0.3, +0.7] beyond noise (paired, 4 windows))" in text
    assert "trial 0" not in text.split("Where they disagree")[1]  # the baseline is compared with nothing
    assert "1-minute load average while the engines were under load was 11.5–13.2 (2 loads" in text
    assert "- trial 1 (rtn), vLLM: vLLM did not serve the compressed-tensors checkpoint: ValueError: no kernel" in text


def test_the_load_line_says_whose_load_it_was_against_the_cores_the_trials_recorded() -> None:
    """The server's own threads load the machine (2.2 beside 2 cores, run alone): the line said "shared with other work"
    whatever the load was."""
    def section(load: float, cores: object) -> str:
        rows = [_row(t, m, (20.0, 18.0, 22.0), (0.01, -0.02, 0.04), llama_loadavg=load) for t, m in ((0, "none"), (1, "rtn"))]
        for r in rows:
            if cores is not None:
                r["run_params"]["info.cores"] = cores
        return "\n".join(engine_lines(rows, baseline_finder(rows, ()), markdown_table))

    assert "(2 loads; the server's and the load generator's own, on 2 cores: no other work beyond 1)" in section(2.2, "2")
    assert "(2 loads; over the 2 cores by more than 1: shared with other work)" in section(11.5, "2")
    assert "(2 loads; the machine's cores were not recorded, so other work may have shared it)" in section(2.2, None)


def test_the_section_says_so_when_they_agree_and_is_absent_without_engines() -> None:
    none = _row(0, "none", (20.0, 18.0, 22.0), (0.01, -0.02, 0.04))
    rtn = _row(1, "rtn", (30.0, 28.0, 32.0), (0.01, -0.02, 0.04), decode_speedup=1.4, decode_speedup_iqr=0.1)
    text = "\n".join(engine_lines([none, rtn], baseline_finder([none, rtn], ()), markdown_table))
    assert "point the same way for every trial and level" in text and "Where they disagree" not in text
    assert engine_lines([{"trial": 0, "method": "none", "ppl": 3.0}], baseline_finder([], ()), markdown_table) == []


def test_frontier_flags_an_engine_gap_beyond_noise_with_the_one_noise_rule() -> None:
    gaps = engine_ppl_gaps({"llama_ppl_diff": 0.023, "llama_ppl_diff_ci_low": -0.048, "llama_ppl_diff_ci_high": 0.092,
                            "vllm_ppl_diff": 0.5, "vllm_ppl_diff_ci_low": 0.2, "vllm_ppl_diff_ci_high": 0.8, "n_windows": 4})
    assert gaps == {"llama": "+0.023 [-0.048, +0.092] within noise (paired, 4 windows)",
                    "vllm": "+0.5 [+0.2, +0.8] beyond noise (paired, 4 windows)"}
    assert gap_cell(gaps) == ("llama +0.023 [-0.048, +0.092] within noise (paired, 4 windows); "
                                                  "vllm +0.5 [+0.2, +0.8] BEYOND NOISE (paired, 4 windows)")


def test_optuna_keeps_the_engine_figures_and_labels() -> None:
    result = TrialResult(metrics={"ppl": 20.3, "n_windows": 4.0, "llama_tok_s_c1": 25.0, "vllm_ppl_gap": 0.0, "decode_tok_s": 9.0},
                         info={"llama_format": "Q4_0 (exact)", "vllm_refused": "ValueError: no kernel", "weights": "fp32"})
    assert engine_attrs(result.metrics, result.info) == {"llama_tok_s_c1": 25.0, "vllm_ppl_gap": 0.0, "llama_format": "Q4_0 (exact)",
                                                         "vllm_refused": "ValueError: no kernel", "n_windows": 4.0}
    assert engine_attrs({"ppl": 20.3}, {"llama_format": "x"}) == {}  # no engine measure: nothing kept


def test_frontier_rows_carry_the_engine_figures_from_optuna_else_from_mlflow() -> None:
    import optuna

    from paretolab.results.read import _add_engines
    from paretolab.study.recording import ENGINE

    study = optuna.create_study()
    study.enqueue_trial({})
    kept = engine_attrs({"llama_ppl_diff": 0.5, "llama_ppl_diff_ci_low": 0.2, "llama_ppl_diff_ci_high": 0.8, "n_windows": 4.0}, {"llama_format": "Q4_0"})
    study.optimize(lambda t: (t.set_user_attr(ENGINE, kept), 1.0)[1], n_trials=2)
    trials = {t.number: t for t in study.get_trials()}
    trials[1].user_attrs.clear()  # recorded before Optuna kept them: MLflow's metrics instead

    class Logged:
        def run_metrics(self, run_id: str) -> dict:
            return {"vllm_ppl_diff": 0.01, "vllm_ppl_diff_ci_low": -0.02, "vllm_ppl_diff_ci_high": 0.04, "ppl": 3.0} if run_id == "r1" else {}

    rows = [{"trial": 0, "mlflow_run_id": "r0"}, {"trial": 1, "mlflow_run_id": "r1"}, {"trial": 2, "mlflow_run_id": "r2"}]
    _add_engines(rows, trials, Logged())  # type: ignore[arg-type]
    assert rows[0]["engine"]["llama_format"] == "Q4_0"
    assert rows[0]["engine_ppl"] == {"llama": "+0.5 [+0.2, +0.8] beyond noise (paired, 4 windows)"}
    assert rows[1]["engine_ppl"] == {"vllm": "+0.01 [-0.02, +0.04] within noise (paired over windows)"}
    assert "engine" not in rows[2]  # no engine measure: the row is as it was

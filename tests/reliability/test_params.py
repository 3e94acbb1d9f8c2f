"""Stage orders that cannot compose and integer parameters searched with fractions are refused before any trial."""

from __future__ import annotations

from tests.reliability.conftest import TINY, refused


def pipeline_with(tmp_path, stages: str) -> str:
    start, end = TINY.index("stages:"), TINY.index("objectives:")
    path = tmp_path / "p.yaml"
    path.write_text(TINY[:start] + "stages:\n" + stages + TINY[end:])
    return str(path)


def test_rtn_after_macko_is_refused_naming_both_stages(tmp_path):
    line = refused("check", pipeline_with(tmp_path, "  - {method: macko, params: {sparsity: 0.5}}\n"
                                                    "  - choice: [{method: rtn}, {method: none}]\n"), cwd=tmp_path)
    assert "stages[1] ('rtn'" in line and "stages[0] ('macko'" in line and "replaces the linear modules" in line


def test_magnitude_after_cat_is_refused(tmp_path):
    line = refused("check", pipeline_with(tmp_path, "  - {method: cat}\n  - {method: magnitude, params: {sparsity: 0.5}}\n"), cwd=tmp_path)
    assert "'magnitude'" in line and "'cat'" in line


def test_macko_after_rtn_composes(tmp_path):
    from paretolab.study.spec import load_spec

    spec = load_spec(pipeline_with(tmp_path, "  - {method: rtn, params: {bits: 8}}\n  - {method: macko, params: {sparsity: 0.5, score: magnitude, calib_corpus: pystdlib-train}}\n"))
    assert [s.options[0].method for s in spec.stages] == ["rtn", "macko"]


def test_a_fractional_step_on_integer_choices_is_refused(tmp_path):
    line = refused("check", pipeline_with(tmp_path, "  - {method: rtn, params: {bits: {low: 2, high: 4, step: 0.5}}}\n"), cwd=tmp_path)
    assert "0.5 is not an integer; rtn.bits is an integer" in line and "step 0.5" in line


def test_fractional_bounds_on_integer_choices_are_refused(tmp_path):
    line = refused("check", pipeline_with(tmp_path, "  - {method: rtn, params: {bits: {low: 2.5, high: 4}}}\n"), cwd=tmp_path)
    assert "2.5 is not an integer; rtn.bits is an integer" in line


def test_a_fractional_fixed_value_is_refused(tmp_path):
    assert "is not an integer" in refused("check", pipeline_with(tmp_path, "  - {method: rtn, params: {bits: 2.5}}\n"), cwd=tmp_path)


def test_a_fractional_step_on_an_integer_default_is_refused(tmp_path):
    line = refused("check", pipeline_with(tmp_path, "  - {method: wanda, params: {calib_samples: {low: 2, high: 8, step: 1.5}}}\n"), cwd=tmp_path)
    assert "wanda.calib_samples is an integer" in line and "1.5 is not an integer" in line


def test_numeric_choices_are_documented_as_a_search_space():
    from paretolab.plugin_api.manager import registries

    described = registries().methods.get("rtn").describe()["search_space"]["bits"]
    assert described == "searched over 2, 3, 4, 8 (other numbers allowed)"

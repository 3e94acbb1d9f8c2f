"""A pipeline whose methods calibrate on the corpus its task evaluates on is refused before it runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from paretolab.errors import CalibrationLeakError, ConfigError
from paretolab.study.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[2]


def _spec(task: dict, params: dict, method: str = "wanda") -> dict:
    return {"name": "leak", "model": "tiny-llama", "task": {"name": "perplexity", **task},
            "stages": [{"method": method, "params": params}], "objectives": [{"metric": "ppl"}]}


def test_calibrating_on_the_evaluation_corpus_is_refused_naming_the_field() -> None:
    with pytest.raises(CalibrationLeakError, match=r"stages\.stage0\.wanda\.params\.calib_corpus: 'wikitext2' is the corpus task\.corpus evaluates on"):
        parse_spec(_spec({"corpus": "wikitext2"}, {"calib_corpus": "wikitext2"}))
    assert issubclass(CalibrationLeakError, ConfigError)  # the CLI exits 2 on it, like any config error


def test_a_default_or_a_choice_that_leaks_is_refused_too() -> None:
    with pytest.raises(CalibrationLeakError, match="'pydoc'"):  # wanda calibrates on pydoc unless told otherwise
        parse_spec(_spec({"corpus": "pydoc"}, {}))
    with pytest.raises(CalibrationLeakError, match="'wikitext2'"):
        parse_spec(_spec({"corpus": "wikitext2"}, {"calib_corpus": ["pydoc", "wikitext2"]}))


def test_the_same_file_by_another_name_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "wikitext2").mkdir()
    test_file = tmp_path / "wikitext2" / "wiki.test.raw"
    test_file.write_text("some evaluation text " * 50)
    monkeypatch.setenv("PARETOLAB_DATA_DIR", str(tmp_path))
    with pytest.raises(CalibrationLeakError):
        parse_spec(_spec({"corpus": "wikitext2"}, {"calib_corpus": str(test_file)}))


def test_other_corpora_and_methods_without_calibration_pass() -> None:
    parse_spec(_spec({"corpus": "wikitext2"}, {"calib_corpus": "pydoc"}))
    parse_spec(_spec({"corpus": "pydoc"}, {"sparsity": 0.5}, method="magnitude"))


def test_every_shipped_pipeline_passes() -> None:
    from tests.study.shipped_pipelines import load_shipped

    for path in sorted((ROOT / "pipelines").glob("*.yaml")):
        load_shipped(path)

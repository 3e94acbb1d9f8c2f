"""Bounded work for bounded input, and `check` refuses what every trial would fail on (issue 69).

A layer range, a trial count, a grid or a time limit is judged by its size before anything is built from it (a layer
setting `each 0-99999999999999999999` grew `check` to 21.8 GB); NaN and inf are refused wherever a number is expected
(`--max-load nan` planned a rerun of every timed study); a value of the wrong sign for a method's parameter and an
engine that is not installed are refused by `check` and `run`, not found in every trial."""

from __future__ import annotations

import resource
import subprocess
from pathlib import Path

import pytest

from tests.conftest import BIN, cli_here, run_cli
from tests.reliability.conftest import TINY, one_line, refused

MEMORY = 2 * 2**30  # `paretolab check` of a valid pipeline runs in well under this (address space, imports included)


def write(tmp_path: Path, text: str, name: str = "p.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def check_in_bounded_memory(path: str, cwd: Path) -> subprocess.CompletedProcess:
    """The real `paretolab check PATH` under an address-space limit: runaway work is a MemoryError, never 21.8 GB."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))

    return subprocess.run([str(BIN / "paretolab"), "check", path], cwd=cwd, capture_output=True, text=True, timeout=300, preexec_fn=limit)


LAYERS = TINY.replace("params: {bits: [4, 8], group_size: 32}", "params: {bits: [4, 8], group_size: 32}\n    layers: LAYERS")


@pytest.mark.parametrize("number", ["99999999999999999999", "9" * 100])
def test_a_huge_layer_range_is_refused_before_it_is_built(number, tmp_path):
    proc = check_in_bounded_memory(write(tmp_path, LAYERS.replace("LAYERS", f'{{"each 0-{number}": {{bits: [2, 4]}}}}')), tmp_path)
    line = one_line(proc)
    assert f"stages[0].layers.each 0-{number}: " in line and "is past the last layer" in line, line


@pytest.mark.parametrize("selector", ["each 0-512", "600", "0-3 27-100000"])
def test_layer_numbers_past_any_model_are_refused_naming_the_field(selector, tmp_path):
    line = refused("check", write(tmp_path, LAYERS.replace("LAYERS", f'{{"{selector}": {{bits: [2, 4]}}}}')), cwd=tmp_path)
    assert line.startswith("paretolab: error: stages[0].layers.") and "is past the last layer a selector may name (511)" in line, line


def test_a_grid_of_a_trillion_points_is_refused_before_it_is_built(tmp_path):
    text = TINY.replace("bits: [4, 8]", "bits: {low: 2, high: 1000000000000, step: 1}").replace("sampler: random", "sampler: grid")
    line = one_line(check_in_bounded_memory(write(tmp_path, text), tmp_path))
    assert "the space has 999999999999 points, more than the 100000 trials a study may plan" in line, line


@pytest.mark.parametrize("search, expected", [
    ("trials: 100000000000000000000", "search.trials: 100000000000000000000 is more than the 100000 trials"),
    ("trials: 2, trial_timeout_s: .inf", "search.trial_timeout_s: expected a positive number of seconds, at most"),
    ("trials: 2, trial_timeout_s: 1.0e+300", "search.trial_timeout_s: expected a positive number of seconds, at most"),
    ("trials: 2, trial_timeout_s: .nan", "search.trial_timeout_s: NaN is not a usable value"),
])
def test_trial_counts_and_time_limits_are_checked_for_size_and_finiteness(search, expected, tmp_path):
    text = TINY.replace("search: {sampler: random, trials: 2, seed: 0}", f"search: {{sampler: random, seed: 0, {search}}}")
    assert expected in refused("check", write(tmp_path, text), cwd=tmp_path)


NUMBER_FLAGS = [
    (["results", "run", "--max-load", "nan", "--dry-run"], "--max-load"),
    (["results", "run", "--max-load", "inf", "--dry-run"], "--max-load"),
    (["results", "run", "--wait-min", "-1", "--dry-run"], "--wait-min"),
    (["sensitivity", "--method", "rtn", "--budget-mb", "nan"], "--budget-mb"),
    (["sensitivity", "--method", "rtn", "--budget-mb=-inf"], "--budget-mb"),
    (["sensitivity", "--method", "rtn", "--seed", "1e99"], "--seed"),
    (["check", "PIPELINE", "--trials", "0"], "--trials"),
    (["run", "PIPELINE", "--trials", "99999999999999999999"], "--trials"),
    (["jobs", "stop", "job1", "--wait", "nan"], "--wait"),
    (["draft", "train", "--budget-min", "inf"], "--budget-min"),
    (["draft", "train", "--prompts", "0"], "--prompts"),
    (["export", "demo", "-1", "--out", "x"], "trial"),
    (["dashboard", "--port", "70000"], "--port"),
]


@pytest.mark.parametrize("argv, flag", NUMBER_FLAGS, ids=lambda a: " ".join(a) if isinstance(a, list) else a)
def test_a_number_flag_refuses_nan_inf_and_out_of_range(argv, flag, pipeline, capsys):
    """Parsed only (a regression must not start a draft's training or a run): argparse's usage, then its one error line."""
    from paretolab.cli.parser import build_parser

    with pytest.raises(SystemExit) as info:
        build_parser().parse_args([str(pipeline) if a == "PIPELINE" else a for a in argv])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert f"error: argument {flag}:" in last and ("finite" in last or "out of range" in last or "not a whole number" in last), last


def test_max_load_nan_plans_nothing(tmp_path):
    """The case met: `results run --max-load nan` read every timed bundle as busy and planned them all again."""
    proc = cli_here("results", "run", "--max-load", "nan", "--dry-run", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and not proc.stdout.strip(), proc.stdout
    assert "argument --max-load: 'nan' is not a finite number" in proc.stderr.strip().splitlines()[-1]


def test_the_cli_and_the_pipeline_share_one_trial_cap():
    from paretolab.cli.numbers import MAX_TRIALS as CLI
    from paretolab.study.spec import MAX_TRIALS

    assert CLI == MAX_TRIALS


@pytest.mark.parametrize("params, value, allowed", [
    ("{bits: [-2, 4], group_size: 32}", "-2", "a number greater than 0"),
    ("{bits: 0, group_size: 32}", "0", "a number greater than 0"),
    ("{bits: {low: -4, high: 8}, group_size: 32}", "-4", "a number greater than 0"),
    ("{bits: 4, group_size: 0}", "0", "a number greater than 0 or -1"),
    ("{bits: 4, group_size: [-5, 32]}", "-5", "a number greater than 0 or -1"),
])
def test_a_value_of_the_wrong_sign_for_the_methods_space_is_refused(params, value, allowed, tmp_path):
    text = TINY.replace("params: {bits: [4, 8], group_size: 32}", f"params: {params}")
    line = refused("check", write(tmp_path, text), cwd=tmp_path)
    assert f"stages[0].params.{'bits' if 'bits: 4' not in params else 'group_size'}: {value} is outside the method's search space" in line
    assert allowed in line, line


def test_other_positive_values_and_the_special_ones_stay_allowed(tmp_path):
    text = TINY.replace("params: {bits: [4, 8], group_size: 32}", "params: {bits: [5, 16], group_size: [-1, 48]}")
    assert cli_here("check", write(tmp_path, text), cwd=tmp_path).returncode == 0


ENGINE = TINY.replace("search:", "measures: {size: {}, engine: {engine: ENGINE}}\nsearch:")


@pytest.fixture
def no_engines(tmp_path, monkeypatch) -> dict[str, str]:
    for name in ("PARETOLAB_LLAMA_PYTHON", "PARETOLAB_LLAMA_CONVERTER", "PARETOLAB_VLLM_PYTHON"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "engines").mkdir()
    return {"PARETOLAB_ENGINES": str(tmp_path / "engines")}


@pytest.mark.parametrize("engine, target", [("llama", "make engines-llama"), ("vllm", "make engines-vllm"), ("[llama, vllm]", "make engines-llama")])
def test_check_refuses_an_engine_that_is_not_installed_naming_the_make_target(engine, target, tmp_path, no_engines):
    line = refused("check", write(tmp_path, ENGINE.replace("ENGINE", engine)), cwd=tmp_path, env=no_engines)
    assert line.startswith("paretolab: error: measures.engine: engine ") and "is not installed" in line and target in line, line


def test_run_refuses_an_engine_that_is_not_installed_before_any_trial(tmp_path, no_engines):
    proc = run_cli("run", write(tmp_path, ENGINE.replace("ENGINE", "vllm")), "--home", str(tmp_path / "home"), "--no-progress",
                   cwd=tmp_path, env=no_engines, check=False, timeout=300)
    assert "make engines-vllm" in one_line(proc)  # was: exit code 0, every trial failed
    assert not (tmp_path / "home" / "optuna.db").exists()  # nothing started


def test_too_many_layer_groups_in_one_stage_are_refused(tmp_path):
    groups = '{"each 0-511 q_proj": {bits: [2, 4]}, "each 0-511 k_proj": {bits: [2, 4]}, "each 0-511 v_proj": {bits: [2, 4]}}'
    line = refused("check", write(tmp_path, LAYERS.replace("LAYERS", groups)), cwd=tmp_path)
    assert "stages[0].layers.each 0-511 v_proj: 1536 layer groups in one stage, more than the 1024" in line, line

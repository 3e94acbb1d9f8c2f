"""Failed trials are listed with their reasons, grouped, not only counted."""

from __future__ import annotations

import optuna

from tests.conftest import cli_here


def _study_with_failures(home):
    home.mkdir()
    study = optuna.create_study(study_name="faulty", storage=f"sqlite:///{home / 'optuna.db'}", directions=["minimize"])
    study.set_user_attr("objectives", [["ppl", "minimize"]])
    for reason in ["RuntimeError: deliberate failure\nTraceback ...", "RuntimeError: deliberate failure", "metric(s) ppl are NaN", None]:
        trial = study.ask()
        if reason:
            trial.set_user_attr("fail_reason", reason)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
    study.tell(study.ask(), 1.0)


def test_studies_prints_failure_reasons_grouped(tmp_path):
    _study_with_failures(tmp_path / ".paretolab")
    out = cli_here("studies", cwd=tmp_path).stdout
    lines = out.splitlines()
    at = lines.index("failed trials of 'faulty' by reason:")
    assert [line.split(" x ", 1) for line in lines[at + 1:at + 4]] == [
        ["     2", "RuntimeError: deliberate failure"],
        ["     1", "metric(s) ppl are NaN"],
        ["     1", "no reason recorded"],
    ]

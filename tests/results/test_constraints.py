"""Issue 32, read back: frontiers over the feasible trials only, the infeasible ones marked with why; pruned trials
counted, never complete, never on a frontier. Stores: ``constrained_home`` (tests/dashboard/conftest.py builds them)."""

from __future__ import annotations

import json

import pytest

from paretolab.results import read, section
from paretolab.stores import resolve_stores
from tests.conftest import cli_here
from tests.dashboard.conftest import INFEASIBLE_DOMINATING, PRUNED_TRIAL

BOUNDS = ["decode_tok_s >= 150", "ppl <= 1.5 x none"]
WHY = "decode_tok_s 100 breaks decode_tok_s >= 150"


@pytest.fixture
def stores(constrained_home):
    return resolve_stores(home=str(constrained_home))


def test_frontier_rows_leave_off_an_infeasible_trial_that_dominates_every_other(stores):
    rows = read.frontier_rows("constrained", stores)
    assert [r["trial"] for r in rows if r["feasible"]] == [0, 1, 2]  # trial 3 beats all three on ppl and size
    assert [(r["trial"], r["infeasible_because"]) for r in rows if not r["feasible"]] == [(INFEASIBLE_DOMINATING, WHY)]
    assert rows.constraints == BOUNDS
    # trial 4 breaks the ppl bound but trial 3 dominates it: it would not be on the frontier anyway, so it is not listed
    assert 4 not in [r["trial"] for r in rows]
    # noise is judged between neighbours along the feasible frontier only
    assert rows[0]["noise"] == "ppl ≈ trial 1" and "noise" not in rows[-1]


def test_frontier_text_says_under_which_bounds_and_marks_the_trial_it_leaves_off(stores, capsys):
    read.print_frontier("constrained", read.frontier_rows("constrained", stores))
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "Pareto set of study 'constrained' (3 trial(s)); feasible frontier under: decode_tok_s >= 150; ppl <= 1.5 x none:"
    cut = next(i for i, line in enumerate(out) if line.startswith("left off as infeasible ✗, 1 trial(s)"))
    assert [line.split()[0] for line in out[2:cut]] == ["0", "1", "2"]
    assert out[cut + 1].split()[:6] == ["trial", "ppl", "size_bytes", "infeasible", "because", "params"]
    assert out[cut + 2].startswith("3 ✗") and WHY in out[cut + 2]


def test_frontier_json_keeps_its_list_and_marks_each_row(constrained_home, tmp_path):
    done = cli_here("frontier", "constrained", "--home", str(constrained_home), "--json", cwd=tmp_path)
    rows = json.loads(done.stdout)
    assert [(r["trial"], r["feasible"]) for r in rows] == [(0, True), (1, True), (2, True), (INFEASIBLE_DOMINATING, False)]
    assert rows[-1]["infeasible_because"] == WHY and all("infeasible_because" not in r for r in rows[:-1])
    assert f"feasible frontier under: {'; '.join(BOUNDS)}" in done.stderr
    # an unconstrained study (with a pruned trial): the same rows as ever, each feasible, and no note
    plain = cli_here("frontier", "pruned", "--home", str(constrained_home), "--json", cwd=tmp_path)
    rows = json.loads(plain.stdout)
    assert rows and all(r["feasible"] is True and "infeasible_because" not in r for r in rows)
    assert PRUNED_TRIAL not in [r["trial"] for r in rows] and "feasible frontier" not in plain.stderr


def test_the_report_draws_its_frontier_over_feasible_trials_and_states_the_bounds(stores):
    text = section.study_section("constrained", stores, ["decode_tok_s"])
    assert "**Constraints:** `decode_tok_s >= 150`; `ppl <= 1.5 x none`. Frontiers are drawn over the feasible trials only; 2 of 6" in text
    assert f"✗ trial 3 (magnitude+rtn): {WHY}" in text and "✗ trial 4 (rtn): ppl 95 breaks ppl <= 1.5 x none = 30" in text
    assert sorted(_table(text)) == ["0", "1", "2", "5"]  # each method's feasible frontier; trials 3 and 4 are left off
    every = section.study_section("constrained", stores, ["decode_tok_s"], frontier=False)
    marks = _table(every, "infeasible because")
    assert marks["3"] == f"✗ {WHY}" and marks["4"].startswith("✗ ppl 95 breaks") and marks["0"] == ""


def _table(text: str, column: str = "trial") -> dict[str, str]:
    """{trial: the cell of ``column``} from the section's Markdown table."""
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[1:]]
    return {r["trial"]: r[column] for r in rows}


def test_trial_rows_carry_their_verdict_and_method_frontiers_keep_feasible_rows(stores):
    _, rows = read.trial_table("constrained", stores)
    assert {r["trial"]: r["feasible"] for r in rows} == {0: True, 1: True, 2: True, 3: False, 4: False, 5: True}
    assert next(r for r in rows if r["trial"] == 3)["infeasible_because"] == WHY and rows[0]["infeasible_because"] == ""
    assert [(r["method"], r["trial"]) for r in read.method_frontiers("constrained", stores)] == [
        ("magnitude+rtn", 5), ("none", 0), ("rtn", 2), ("rtn", 1)]
    from paretolab.api.frames import load_study

    assert load_study("constrained", stores=stores).frontier["trial"].tolist() == [0, 1, 2]


def test_pruned_trials_are_counted_and_never_complete(stores, constrained_home, tmp_path):
    summaries = {s["study"]: s for s in read.study_summaries(stores)}
    assert (summaries["pruned"]["complete"], summaries["pruned"]["pruned"]) == (4, 1) and summaries["constrained"]["pruned"] == 0
    assert PRUNED_TRIAL not in [r["trial"] for r in read.trial_table("pruned", stores)[1]]
    assert PRUNED_TRIAL not in [r["trial"] for r in read.frontier_rows("pruned", stores)]
    assert "4 complete trial(s), 0 failed, 1 pruned" in section.study_section("pruned", stores, [])
    listing = cli_here("studies", "--home", str(constrained_home), cwd=tmp_path).stdout.splitlines()
    header = listing[0].split()
    assert header[:6] == ["study", "status", "complete", "failed", "pruned", "running"]
    assert next(line for line in listing if line.startswith("pruned")).split()[:6] == ["pruned", "finished", "4", "0", "1", "0"]


def test_a_study_section_says_why_its_trials_failed(stores, tmp_path):
    """`N failed` alone leaves a reader guessing whether a setting broke or the run was stopped: the reasons are given."""
    from tests.dashboard.conftest import build_stores

    text = section.study_section("demo", build_stores(tmp_path), [])  # two trials failed on a nan objective
    assert "2 failed (1× objective metric 'ppl' is nan (trial " in text and "; 1× objective metric 'ppl' is nan (trial " in text
    assert "4 complete trial(s), 0 failed, 1 pruned" in section.study_section("pruned", stores, [])  # none failed: no reasons

"""The claims' verdicts on the dashboard (issue 72): the Frontier's Claims panel and its rings, the Studies page's
column, the Trial page's claims; the verdicts the same rows as ``paretolab.load_study(...).verdicts``.

The stores hold the committed bundle ``wanda_vs_magnitude`` (one claim, judged at three sparsities: held at each) and
the same trials as ``wanda_mixed`` with claims added that do not hold, are inconclusive, or get no verdict.
"""

from __future__ import annotations

import re
from pathlib import Path

import optuna
import pytest

from paretolab.plugin_api.numbers import RATIO, interval_text
from paretolab.results.verdicts import verdict_category
from paretolab.stores import resolve_stores
from tests.dashboard.test_app import figure, frame_of, open_app

BUNDLE = Path(__file__).resolve().parents[2] / "results" / "bundles" / "wanda_vs_magnitude.jsonl.gz"
WANDA, MIXED = "wanda_vs_magnitude", "wanda_mixed"
HELD_TRIALS = {0: (0, 9), 1: (1, 10), 2: (2, 11)}  # wanda seeds 0..2 at sparsity 0.3 / 0.5 / 0.7 against magnitude 9 / 10 / 11


def mixed_claims(claim: dict) -> list[dict]:
    """The bundle's claim, its reverse (did not hold), an equivalence (held at 0.3 and 0.5, inconclusive at 0.7),
    one on a `works` metric no trial reports (no verdict, said why) and one on a method no trial ran (no pair)."""
    return [claim,
            {**claim, "text": "Magnitude beats Wanda", "method": "magnitude", "baseline": "wanda"},
            {**claim, "text": "Wanda is equivalent to magnitude within a 95 % margin", "expect": "equivalent", "margin": 0.95},
            {**claim, "text": "Wanda decodes and beats magnitude", "works": "decode_ok"},
            {**claim, "text": "SparseGPT beats magnitude", "method": "sparsegpt"}]


@pytest.fixture(scope="session")
def claims_home(tmp_path_factory) -> Path:
    from paretolab.results.bundle_stores import import_bundle

    home = tmp_path_factory.mktemp("claims_store")
    stores = resolve_stores(home=str(home))
    import_bundle(BUNDLE, stores)
    import_bundle(BUNDLE, stores, rename=MIXED)
    study = optuna.load_study(study_name=MIXED, storage=stores.optuna_url)
    pipeline = dict(study.user_attrs["pipeline"])
    study.set_user_attr("pipeline", {**{k: v for k, v in pipeline.items() if k != "claim"}, "claims": mixed_claims(pipeline["claim"])})
    return home


@pytest.fixture
def claims_env(claims_home, monkeypatch) -> Path:
    stores = resolve_stores(home=str(claims_home))
    monkeypatch.setenv("PARETOLAB_OPTUNA_STORAGE", stores.optuna_url)
    monkeypatch.setenv("PARETOLAB_TRACKING_URI", stores.tracking_uri)
    monkeypatch.delenv("PARETOLAB_RAY_ADDRESS", raising=False)
    return claims_home


def lines(at) -> list[str]:
    """The page's Markdown as the reader sees it (the escapes of names undone)."""
    return [re.sub(r"\\(.)", r"\1", str(m.value)) for m in at.markdown]


def verdict_lines(at, badge: str) -> list[str]:
    return [line for line in lines(at) if line.startswith(badge)]


def loaded_verdicts(home: Path, name: str):
    import paretolab

    return paretolab.load_study(name, home=str(home)).verdicts


def paretolab_trials(home: Path, name: str):
    import paretolab

    return paretolab.load_study(name, home=str(home)).trials.set_index("trial")


@pytest.mark.parametrize(("text", "category"), [
    ("held", "held"), ("held: -40.16 MiB on each of 3 seeds, deterministic", "held"), ("did not hold", "did not hold"),
    ("did not hold: +2 MiB on each of 3 seeds, deterministic", "did not hold"), ("within noise", "within noise"),
    ("inconclusive", "inconclusive"), ("no verdict: both at chance (ppl wanda 5e4 and magnitude 6e4 ≥ vocabulary 49152)", "no verdict"),
    ("no verdict: no variation observed across 3 replicate(s)", "no verdict"),
])
def test_a_verdicts_category_is_read_from_its_words(text, category):
    assert verdict_category(text) == category


def test_frontier_shows_each_claim_with_its_badge_effect_and_interval(claims_env):
    at = open_app(page="Frontier", study=WANDA)
    assert "Claims" in [s.value for s in at.subheader]
    assert "**Wanda beats magnitude pruning at the same sparsity**" in lines(at)
    held = verdict_lines(at, ":green-badge[held]")
    assert [re.search(r"sparsity=0\.\d", line).group() for line in held] == ["sparsity=0.3", "sparsity=0.5", "sparsity=0.7"]
    rows = loaded_verdicts(claims_env, WANDA)  # the numbers the Python API gives, written by the one formatter
    for line, row in zip(held, rows.itertuples()):
        assert f"ppl wanda ÷ magnitude = {interval_text(row.difference, row.low, row.high, RATIO)}" in line
        assert ", ".join(f"{m} vs {b}" for m, b in row.trials) in line
    assert not [line for line in lines(at) if re.match(r":\w+-badge\[", line) and line not in held]  # no other verdict


def test_every_badge_of_a_study_with_mixed_verdicts(claims_env):
    at = open_app(page="Frontier", study=MIXED)
    assert len(verdict_lines(at, ":green-badge[held]")) == 5  # 3 of the bundle's claim, 2 of the equivalence
    assert [line.split("**")[1] for line in verdict_lines(at, ":red-badge[did not hold]")] == ["sparsity=0.3", "sparsity=0.5", "sparsity=0.7"]
    assert len(verdict_lines(at, ":orange-badge[inconclusive]")) == 1 and "sparsity=0.7" in verdict_lines(at, ":orange-badge[inconclusive]")[0]
    grey = verdict_lines(at, ":gray-badge[no verdict]")
    assert len(grey) == 4  # decode_ok at three sparsities, and the claim no trial can be paired for
    assert sum("did not work here" in line for line in grey) == 3  # the verdict's own words say why
    assert "no pair of trials could be compared" in grey[-1]
    assert "**SparseGPT beats magnitude**" in lines(at)


def test_the_compared_trials_are_ringed_on_the_frontier_in_the_badges_colour(claims_env):
    at = open_app(page="Frontier", study=MIXED)
    fig = figure(at)
    rings = {t["name"]: t for t in fig["data"] if t["name"].startswith("claim: ")}
    assert set(rings) == {"claim: held", "claim: did not hold", "claim: inconclusive", "claim: no verdict"}
    # every wanda configuration (its three draws at their mean: one point, first trial 0, 1, 2) and the three magnitude trials
    assert sorted(rings["claim: held"]["customdata"]) == [0, 1, 2, 9, 10, 11]
    assert sorted(rings["claim: inconclusive"]["customdata"]) == [2, 11]  # sparsity 0.7
    assert rings["claim: held"]["marker"]["symbol"] == "circle-open" and rings["claim: held"]["marker"]["color"] == "#2ca02c"
    trials = paretolab_trials(claims_env, MIXED)
    ring = rings["claim: inconclusive"]
    draws = {2: [2, 5, 8], 11: [11]}  # on the point's own marker: the draws' mean ppl, size in MB
    for number, x, y in zip(ring["customdata"], ring["x"], ring["y"]):
        assert (x, y) == pytest.approx((trials.loc[draws[number], "ppl"].mean(), trials.loc[draws[number], "size_bytes"].mean() / 1e6))
    assert "trial 11" in ring["hovertext"][-1] and "magnitude arm" in ring["hovertext"][-1]


def test_a_study_without_claims_gets_no_panel_and_no_rings(store_env):
    at = open_app(page="Frontier", study="demo")
    assert "Claims" not in [s.value for s in at.subheader]
    assert not [t for t in figure(at)["data"] if t["name"].startswith("claim: ")]


def test_studies_page_counts_each_studys_verdicts(claims_env):
    table = frame_of(open_app())
    claims = dict(zip(table["study"].str.rsplit("=", n=1).str[-1], table["claims"]))
    assert claims == {WANDA: "3 held", MIXED: "5 held, 3 did not hold, 1 inconclusive, 4 no verdict"}


def test_studies_without_claims_read_a_dash(store_env):
    assert set(frame_of(open_app())["claims"]) == {"—"}


@pytest.mark.parametrize(("trial", "role", "setting"), [(4, "method", "sparsity=0.5"), (11, "baseline", "sparsity=0.7")])
def test_trial_page_lists_the_claims_the_trial_takes_part_in(claims_env, trial, role, setting):
    at = open_app(page="Trial", study=WANDA, trial=trial)
    assert "Claims" in [s.value for s in at.subheader]
    shown = [line for line in lines(at) if "-badge[" in line]
    assert len(shown) == 1 and shown[0].startswith(":green-badge[held]")
    assert "Wanda beats magnitude pruning at the same sparsity" in shown[0] and setting in shown[0]
    assert f"on the {role}'s arm" in shown[0]


def test_trial_page_of_a_trial_in_no_claim_shows_none(claims_env):
    at = open_app(page="Trial", study=WANDA, trial=12)  # the unmodified model: in no comparison
    assert "Claims" not in [s.value for s in at.subheader]


@pytest.fixture
def judged_calls(monkeypatch) -> list:
    """The study names the dashboard judges from here on (its cache emptied first)."""
    from collections import OrderedDict

    from paretolab.dashboard import claims_panel

    calls: list = []
    judge = claims_panel.study_verdicts
    monkeypatch.setattr(claims_panel, "_JUDGED", OrderedDict())
    monkeypatch.setattr(claims_panel, "study_verdicts", lambda name, stores: calls.append(name) or judge(name, stores))
    return calls


def test_the_page_judges_as_load_study_does_once_per_version_of_the_study(claims_env, judged_calls):
    from dataclasses import replace

    from paretolab.dashboard import claims_panel, data

    stores = resolve_stores(home=str(claims_env))
    info = next(s for s in data.list_studies(stores.optuna_url) if s.name == MIXED)
    for _ in range(2):  # a repaint judges nothing again
        judged, error = claims_panel.verdicts(stores, info)
    assert judged_calls == [MIXED] and not error
    expected = loaded_verdicts(claims_env, MIXED)
    assert [r["verdict"] for r in judged.rows] == expected["verdict"].tolist()
    assert [r["difference"] for r in judged.rows] == pytest.approx(expected["difference"].tolist())
    claims_panel.verdicts(stores, replace(info, counts={**info.counts, "COMPLETE": info.counts["COMPLETE"] + 1}))
    assert judged_calls == [MIXED, MIXED]  # a trial more: judged again


def test_the_studies_page_and_the_frontier_judge_each_study_once(claims_env, judged_calls):
    at = open_app()
    assert sorted(judged_calls) == [MIXED, WANDA]
    at = open_app(page="Frontier", study=MIXED)
    at.run()  # a repaint
    assert sorted(judged_calls) == [MIXED, WANDA] and verdict_lines(at, ":green-badge[held]")


def test_the_decide_panel_shows_pick_s_choice_and_marks_it_on_the_frontier(claims_env):
    """The Frontier's Decide panel: the rule and budget typed in, the decision `paretolab pick` prints, the choice starred."""
    from paretolab.results.decision_record import decide_study, decision_lines

    at = open_app(page="Frontier", study=WANDA)
    assert at.text_input(key="pick_keep").value == "ppl no_worse 2 % vs none"  # the first objective within 2 % of none
    at.text_input(key="pick_keep").set_value("ppl no_worse 25 % vs none")
    at.text_input(key="pick_where").set_value("size_bytes <= 0.8 x none")
    at.toggle(key="pick_on").set_value(True)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    shown = "\n".join(str(m.value) for m in at.markdown)
    decision = decide_study(WANDA, resolve_stores(home=str(claims_env)), keep="ppl no_worse 25 % vs none",
                            budgets=["size_bytes <= 0.8 x none"])
    assert decision.choice is not None and decision.choice.name() == "wanda[sparsity=0.3]"
    assert "\n".join(decision_lines(decision)[2:]) in shown  # the CLI's own lines
    marks = {t["name"]: t for t in figure(at)["data"] if t["name"].startswith("pick: ")}
    assert list(marks["pick: choice"]["customdata"]) == [0] and marks["pick: choice"]["marker"]["symbol"] == "star-diamond"  # 0+3+6's point
    at.text_input(key="pick_keep").set_value("perplexity no_worse 2 % vs none")
    at.run()
    assert any("no trial recorded 'perplexity'" in str(e.value) for e in at.error)  # refused in its one line, no traceback


def test_a_configuration_repeated_over_draws_is_one_point_at_their_mean(claims_env):
    """wanda's three calibration draws per sparsity: one point each at the draws' mean, the frontier over the means, as
    `paretolab frontier` lists it; the caption says so."""
    from paretolab.results.read import frontier_rows

    at = open_app(page="Frontier", study=WANDA)
    fig = figure(at)
    points = [t for t in fig["data"] if t.get("customdata") is not None and t["name"] == "wanda"]
    assert points and sorted(int(row[0]) for t in points for row in t["customdata"]) == [0, 1, 2]  # one per sparsity
    means = {tuple(r["trials"]): r for r in frontier_rows(WANDA, resolve_stores(home=str(claims_env)))}
    xs = sorted(x for t in points for x in t["x"])
    assert xs == pytest.approx(sorted(r["ppl"] for k, r in means.items() if len(k) == 3))
    assert any("each point is a configuration at the mean over its draws (calib_seed" in str(c.value) for c in at.caption)

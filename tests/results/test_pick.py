"""paretolab pick: the cheapest configuration whose quality holds, judged by all its replicates, refusing bad rules."""

from __future__ import annotations

import json
import re

import pytest

from paretolab.errors import ConfigError
from paretolab.results.decision_record import decision_lines, decision_record
from paretolab.results.pick import decide

DIRECTIONS = {"ppl": "lower", "size_bytes": "lower", "acc": "higher", "decode_tok_s": "higher"}
PIPELINE = {"claims": [{"text": "t", "metric": "ppl", "method": "rtn", "baseline": "none", "replicates": ["calib_seed"]}]}


def trial(number, label, ppl, size, **params):
    prefix = f"stage0.{label}."
    return {"trial": number, "label": label, "ppl": ppl, "size_bytes": size, "run_params": {},
            "params": {prefix + k: v for k, v in params.items()}}


def study(extra=()):
    """none (1 trial); gptq 4-bit on three calibration draws (1.0 %-1.4 % worse); rtn 4-bit (no draws, 8 % worse);
    rtn 3-bit (45 % worse); gptq 3-bit whose *best* draw is 1 % worse but whose draws average 30 % worse."""
    rows = [trial(0, "none", 20.0, 500e6)]
    rows += [trial(1 + s, "gptq", 20.0 * f, 70e6, bits=4, calib_seed=s) for s, f in enumerate((1.010, 1.012, 1.014))]
    rows += [trial(4, "rtn", 21.6, 68e6, bits=4), trial(5, "rtn", 29.0, 52e6, bits=3)]
    rows += [trial(6 + s, "gptq", 20.0 * f, 54e6, bits=3, calib_seed=s) for s, f in enumerate((1.01, 1.4, 1.5))]
    return rows + list(extra)


def pick(rows=None, keep="ppl no_worse 3 % vs none", where=("size_bytes <= 100 MB",), **kw):
    return decide("s", study() if rows is None else rows, PIPELINE, DIRECTIONS, keep=keep, where=list(where), **kw)


def test_the_cheapest_configuration_that_keeps_the_rule_is_chosen_by_its_replicates_never_its_luckiest_draw():
    d = pick()
    assert d.choice is not None and d.choice.name() == "gptq[bits=4]" and d.choice.numbers == [1, 2, 3]
    assert d.choice.cost == pytest.approx(70e6) and d.choice.replicates == 3
    assert d.choice.low is not None and d.choice.high < 1.03 and d.choice.category == "held"
    # gptq 3-bit's first draw alone (×1.01) would pass; its three draws do not: it is judged, not chosen
    three = next(c for c in d.candidates if c.name() == "gptq[bits=3]")
    assert three.numbers == [6, 7, 8] and three.category != "held" and three.difference > 1.2
    text = "\n".join(decision_lines(d))
    assert "**Choice: `gptq[bits=4]`** — trials 1, 2, 3; size_bytes 70 MB" in text, text
    assert "`stage0.gptq.bits=4`" in text  # the settings to ship, in full


def test_a_budget_can_be_a_ratio_to_an_arm_and_a_tighter_budget_moves_the_choice_or_names_the_nearest_miss():
    assert pick(where=["size_bytes <= 0.2 x none"]).choice.name() == "gptq[bits=4]"  # 100 MB: as above
    d = pick(where=["size_bytes <= 60 MB"])  # only the 3-bit ones fit; neither keeps 3 %
    assert d.choice is None and d.nearest is not None
    assert d.nearest.name() in ("gptq[bits=3]", "rtn[bits=3]") and "keeps the rule" in d.why
    lines = "\n".join(decision_lines(d))
    assert "**No choice:**" in lines and "Nearest miss: `" in lines
    d = pick(keep="ppl no_worse 3 % vs none", where=["size_bytes <= 10 MB"])  # nothing fits: the best that keeps it, over budget
    assert d.choice is None and d.nearest.name() == "gptq[bits=4]" and "70 MB breaks size_bytes <= 10 MB" in d.why


def test_rivals_are_the_held_configurations_whose_cost_is_within_noise_of_the_choice():
    twin = [trial(10 + s, "awq", 20.0 * f, 70e6, bits=4, calib_seed=s) for s, f in enumerate((1.0, 1.005, 1.01))]
    d = pick(study(twin))
    names = [d.choice.name(), *[r.name() for r in d.rivals]]
    assert sorted(names) == ["awq", "gptq[bits=4]"], names  # a label with one configuration is named by the label alone


def test_cheaper_configurations_the_data_cannot_confirm_are_listed_apart():
    noisy = [trial(10 + s, "hqq", 20.0 * f, 60e6, bits=4, calib_seed=s) for s, f in enumerate((0.9, 1.02, 1.2))]
    d = pick(study(noisy))
    assert d.choice.name() == "gptq[bits=4]"
    assert [u.name() for u in d.unconfirmed] == ["gptq[bits=3]", "hqq"]  # cheaper than the choice, by cost
    assert {u.category for u in d.unconfirmed} == {"inconclusive"}


def test_the_record_is_json_with_the_choice_its_interval_and_every_candidate():
    record = json.loads(json.dumps(decision_record(pick())))
    assert record["choice"]["configuration"] == "gptq[bits=4]" and record["choice"]["trials"] == [1, 2, 3]
    assert record["rule"] == "ppl no_worse 3 % vs none" and record["budgets"] == ["size_bytes <= 100 MB"]
    assert len(record["candidates"]) == 5 and record["choice"]["low"] < record["choice"]["high"]


@pytest.mark.parametrize("keep, where, cost, message", [
    ("perplexity no_worse 2 % vs none", [], "size_bytes", r"--keep: no trial recorded 'perplexity'.*did you mean 'ppl'"),
    ("ppl no_worse 2 pt vs none", [], "size_bytes", r"'pt' \(percentage points\) is for a fraction such as acc, not ppl"),
    ("acc no_worse 2 % vs none", [], "size_bytes", r"acc is a fraction, so '2 %' is ambiguous.*'2 pt'"),
    ("ppl no_worse vs none", [], "size_bytes", r"'no_worse' needs a margin"),
    ("ppl lower 2 % vs none", [], "size_bytes", r"'lower' takes no margin"),
    ("ppl better 2 % vs none", [], "size_bytes", r"'better' .* is not one of lower, higher, no_worse, equivalent"),
    ("ppl no_worse 2 % vs magnitude", [], "size_bytes", r"no trial of the baseline 'magnitude' recorded ppl; the study's labels: gptq, none, rtn"),
    ("ppl no_worse 2 % vs gptq", [], "size_bytes", r"the baseline 'gptq' spans 2 configurations \(gptq\[bits=4\], gptq\[bits=3\]\); name one"),
    ("ppl no_worse 2 % vs none", ["size_bytes <= 80 parsecs"], None, r"unknown unit 'parsecs'.*bytes take B, bytes, kB"),
    ("ppl no_worse 2 % vs none", ["size_bytes <= 0.5 x"], None, r"gives a ratio without its arm"),
    ("ppl no_worse 2 % vs none", ["ppl <= 30 MB"], None, r"ppl is not counted in bytes"),
    ("ppl no_worse 2 % vs none", [], "decode_tok_s", r"--cost: no trial recorded 'decode_tok_s'"),
    ("ppl no_worse 2 % vs none", [], None, r"name the cost to minimize"),
])
def test_a_bad_rule_is_refused_in_one_line_naming_the_field_and_the_fix(keep, where, cost, message):
    rows = study() + [{**trial(20, "rtn", 21.0, 60e6, bits=2), "acc": 0.5}]
    with pytest.raises(ConfigError) as refused:
        decide("s", rows, PIPELINE, DIRECTIONS, keep=keep, where=where, cost=cost)
    said = str(refused.value)
    assert len(said.splitlines()) == 1 and re.search(message, said), said


def test_a_margin_in_points_judges_a_fraction_metric_on_its_own_scale():
    rows = [{**trial(0, "none", 20.0, 500e6), "acc": 0.50}]
    rows += [{**trial(1 + s, "rtn", 20.0, 70e6, bits=4, seed=s), "acc": a} for s, a in enumerate((0.497, 0.496, 0.498))]
    d = decide("s", rows, {}, DIRECTIONS, keep="acc no_worse 1 pt vs none", where=["size_bytes <= 100 MB"])
    assert d.rule.margin == pytest.approx(0.01) and d.rule.scale == "linear"
    assert d.choice is not None and d.choice.name() == "rtn" and d.choice.difference == pytest.approx(-0.003)


BUNDLE = "results/bundles/wanda_vs_magnitude.jsonl.gz"  # wanda on three calibration draws, magnitude, none: SmolLM2


def test_pick_on_a_committed_bundle_prints_the_choice_and_writes_its_record(tmp_path):
    from tests.conftest import ROOT, cli_here, run_cli

    args = ("pick", "wanda_vs_magnitude", "--bundle", str(ROOT / BUNDLE), "--where", "size_bytes <= 0.8 x none")
    said = run_cli(*args, "--keep", "ppl no_worse 25 % vs none", "--out", str(tmp_path / "decision"), cwd=tmp_path).stdout
    assert "**Choice: `wanda[sparsity=0.3]`** — trials 0, 3, 6; size_bytes 424.4 MB" in said, said
    assert "ppl ÷ none = ×1.184 [×1.159, ×1.211] over 3 pair(s): held" in said, said
    record = json.loads((tmp_path / "decision" / "decision.json").read_text())
    assert record["choice"]["trials"] == [0, 3, 6] and (tmp_path / "decision" / "decision.md").read_text().startswith("# Decision")
    # 2 % cannot be kept within the budget: no choice (exit 3), the nearest miss named with its verdict
    missed = cli_here(*args, "--keep", "ppl no_worse 2 % vs none", "--json", cwd=tmp_path, check=False)
    assert missed.returncode == 3, missed.stderr
    record = json.loads(missed.stdout)
    assert record["choice"] is None and record["nearest_miss"]["configuration"] == "wanda[sparsity=0.3]"
    assert "did not hold" in record["why"]
    refused = cli_here(*args, "--keep", "ppl no_worse 2 % vs none", "--export", "out", cwd=tmp_path, check=False)
    assert refused.returncode == 2 and "import the bundle first" in refused.stderr and len(refused.stderr.splitlines()) == 1


def test_a_results_document_carries_the_decisions_its_manifest_names():
    """results/documents.yaml's decision extras: the compression document prints pick's decision on each named study's
    bundle (the same lines as the CLI), and a decision about a study the document does not hold is refused."""
    from paretolab.results.decision_record import decide_study, decision_lines
    from paretolab.results.extras import check_extras
    from paretolab.results.source import BundleSource
    from tests.conftest import ROOT

    text = (ROOT / "pipelines" / "README.md").read_text(encoding="utf-8")
    decision = decide_study("wanda_vs_magnitude", BundleSource([ROOT / BUNDLE]), keep="ppl no_worse 25 % vs none",
                            budgets=["size_bytes <= 0.8 x none"])
    assert "## Decision: wanda_vs_magnitude, keeping `ppl no_worse 25 % vs none`" in text
    assert "\n".join(decision_lines(decision)[2:]) in text and "**Not confirmed:**" in text
    with pytest.raises(ConfigError, match=r"extras\[0\].decision: 'macko' is not among the document's studies"):
        check_extras([{"decision": "macko", "keep": "ppl no_worse 2 % vs none"}], ("wanda_vs_magnitude",), "doc")


def test_the_record_carries_what_the_engines_measured_for_each_candidate():
    rows = study([{**trial(10, "kquant", 21.0, 80e6, type="Q4_K_M"), "llama_tok_s_c1": 40.0, "llama_model_bytes": 8.1e7}])
    record = decision_record(pick(rows, keep="ppl no_worse 10 % vs none"))
    by_name = {c["configuration"]: c for c in record["candidates"]}
    assert by_name["kquant"]["engines"] == {"llama_model_bytes": 8.1e7, "llama_tok_s_c1": 40.0}
    assert by_name["gptq[bits=4]"]["engines"] == {}

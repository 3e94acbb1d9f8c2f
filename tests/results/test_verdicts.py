"""Verdicts a statistician would sign: named replicates, per-setting verdicts, both noises, no zero width, several claims."""

from __future__ import annotations

from pathlib import Path

import pytest

from paretolab.errors import ConfigError
from paretolab.results.claims import claims_lines
from paretolab.results.estimate import estimate, holm
from paretolab.study.report_spec import Claim
from paretolab.study.spec import parse_spec
from tests.conftest import edited
from tests.results.test_claims import PIPELINE

ROOT = Path(__file__).resolve().parents[2]


def _verdicts(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("**Verdict")]


def _lines(claims, trials, fetch=None, bounds=None):
    return claims_lines(claims, trials, lambda run: None, fetch, bounds)


def _trial(n, label, metric, value, **params):
    return {"trial": n, "label": label, metric: value, "run_id": f"r{n}", "params": params}


def test_a_pipeline_with_two_claims_reports_two_verdicts_and_the_holm_adjusted_set():
    """One claim expects higher acc; the other says the time is no worse than the baseline's by 10 % (a ratio)."""
    pipeline = edited(PIPELINE, "claim", KeyError)
    pipeline["claims"] = [
        {"text": "pruning raises ppl", "metric": "ppl", "method": "magnitude", "baseline": "none", "expect": "higher", "replicates": ["bits"]},
        {"text": "and costs no more than 10 % size", "metric": "size_bytes", "method": "magnitude", "baseline": "none",
         "expect": "no_worse", "margin": 0.1, "scale": "log", "replicates": ["bits"]},
    ]
    claims = parse_spec(pipeline).claims
    assert [(c.expect, c.margin, c.scale, c.better, c.replicates) for c in claims] == [
        ("higher", None, "linear", "lower", ("bits",)), ("no_worse", 0.1, "log", "lower", ("bits",))]
    trials = []
    for seed, (ppl_m, ppl_b, size_m, size_b) in enumerate([(30.0, 20.0, 1.00e6, 1.0e6), (31.0, 20.5, 1.02e6, 1.0e6), (29.0, 19.5, 0.99e6, 1.0e6)]):
        for label, ppl, size in (("magnitude", ppl_m, size_m), ("none", ppl_b, size_b)):
            trials.append({"trial": len(trials), "label": label, "ppl": ppl, "size_bytes": size, "params": {"stage1.rtn.bits": seed}})
    lines = _lines(list(claims), trials)
    verdicts = _verdicts(lines)
    assert len(verdicts) == 2, verdicts
    assert verdicts[0].startswith("**Verdict: held** — ppl magnitude − none = +10")
    # size ratios ×1.00, ×1.02, ×0.99: the whole interval below ×1.10
    assert verdicts[1].startswith("**Verdict: held** — size_bytes magnitude ÷ none = ×1.003 [×"), verdicts[1]
    assert "no_worse within a margin of 10.0% (the ratio at most ×1.1) expected, judged as a ratio" in "\n".join(lines)
    holm_line = next(line for line in lines if line.startswith("**Holm-adjusted**"))
    assert "(2 claim(s), 2 comparison(s)" in holm_line and holm_line.count(": held") == 2, holm_line


def test_no_worse_and_equivalent_are_judged_against_the_margin_on_the_metrics_good_side():
    def one(expect, margin, diffs, better="lower"):
        trials = []
        for seed, d in enumerate(diffs):
            trials += [_trial(2 * seed, "a", "m", 1.0 + d, seed=seed), _trial(2 * seed + 1, "b", "m", 1.0, seed=seed)]
        claim = Claim("t", "m", "a", "b", expect, ("seed",), margin=margin, better=better)
        return _verdicts(_lines([claim], trials))[0].split("**")[1]

    assert one("no_worse", 0.05, [0.01, 0.02, 0.015]) == "Verdict: held"  # at most 0.05 worse (higher is worse)
    assert one("no_worse", 0.05, [0.10, 0.12, 0.11]) == "Verdict: did not hold"
    assert one("no_worse", 0.05, [0.00, 0.10, 0.05]) == "Verdict: inconclusive"
    assert one("no_worse", 0.05, [-0.10, -0.12, -0.11], better="higher") == "Verdict: did not hold"  # lower is worse here
    assert one("equivalent", 0.05, [0.01, -0.01, 0.0]) == "Verdict: held"
    assert one("equivalent", 0.05, [0.2, 0.21, 0.22]) == "Verdict: did not hold"


def test_a_log_scale_margin_means_the_ratio_written():
    """10 % on ``scale: log`` is method ÷ baseline within ×0.9 … ×1.1, not ±0.1 on the log (×0.905 … ×1.105)."""
    def one(expect, ratios, better="lower"):
        trials = []
        for seed, r in enumerate(ratios):
            trials += [_trial(2 * seed, "a", "m", 10.0 * r, seed=seed), _trial(2 * seed + 1, "b", "m", 10.0, seed=seed)]
        claim = Claim("t", "m", "a", "b", expect, ("seed",), margin=0.1, scale="log", better=better)
        return _verdicts(_lines([claim], trials))[0].split("**")[1]

    # ratios ×1.1005 ± tiny: beyond ×1.1, though inside ×1.105 (what a margin of 0.1 on the log would have allowed)
    assert one("no_worse", [1.1004, 1.1005, 1.1006]) == "Verdict: did not hold"
    assert one("no_worse", [1.098, 1.0985, 1.099]) == "Verdict: held"
    # lower is worse: at least ×0.9; ×0.8997 … is beyond it, though inside ×0.905's complement reading
    assert one("no_worse", [0.8996, 0.8997, 0.8998], better="higher") == "Verdict: did not hold"
    assert one("equivalent", [0.9004, 0.9005, 0.9006]) == "Verdict: held"  # inside ×0.9 … ×1.1 (outside ×0.905)
    assert one("equivalent", [1.1004, 1.1005, 1.1006]) == "Verdict: did not hold"


def test_a_narrow_interval_on_a_verdict_line_never_reads_as_zero_width():
    """OMNISIFT's prefill FLOPs: "held — ×1.003 [×1.003, ×1.003]" looked like the zero width that gets no verdict."""
    trials = []
    for seed, r in enumerate((1.00300, 1.00301, 1.00302)):
        trials += [_trial(2 * seed, "a", "m", 10.0 * r, seed=seed), _trial(2 * seed + 1, "b", "m", 10.0, seed=seed)]
    line = _verdicts(_lines([Claim("t", "m", "a", "b", "no_worse", ("seed",), margin=0.1, scale="log")], trials))[0]
    low, high = line.split(" [")[1].split("]")[0].split(", ")
    assert low != high, line
    assert line.startswith("**Verdict: held** — m a ÷ b = ×1.00301 [×1.00299, ×1.00303]"), line


def test_an_arm_spanning_an_unnamed_setting_gets_one_verdict_per_setting_not_a_pooled_one():
    """wanda vs magnitude over sparsity with no replicate: sparsity is a treatment setting, never a draw."""
    trials = []
    for sparsity, (w, m) in {0.5: (22.0, 24.0), 0.6: (40.0, 90.0), 0.7: (150.0, 4000.0)}.items():
        trials += [_trial(len(trials), "wanda", "ppl", w, **{"stage0.wanda.sparsity": sparsity}),
                   _trial(len(trials) + 1, "magnitude", "ppl", m, **{"stage0.magnitude.sparsity": sparsity})]
    claim = Claim("t", "ppl", "wanda", "magnitude", "lower", (), scale="log")
    lines = _lines([claim], trials)
    assert "The arms span 3 settings (sparsity): one verdict per setting." in lines
    verdicts = _verdicts(lines)
    assert [v.split(":")[0] for v in verdicts] == ["**Verdict at sparsity=0.5", "**Verdict at sparsity=0.6", "**Verdict at sparsity=0.7"]
    assert all("no verdict: one replicate and no per-example scores stored" in v for v in verdicts)  # no windows stored: no interval
    assert "Holm" in lines[-2]  # three comparisons: the set is adjusted too


def test_a_log_scale_judges_a_ratio_that_a_linear_interval_drowns():
    """Wanda lower than magnitude at every seed by ~10 %, at ppl levels four orders of magnitude apart."""
    trials = []
    for seed, level in enumerate((20.0, 300.0, 5000.0, 90000.0)):
        trials += [_trial(2 * seed, "wanda", "ppl", level * (0.9 + 0.01 * seed), seed=seed), _trial(2 * seed + 1, "magnitude", "ppl", level, seed=seed)]
    linear = _verdicts(_lines([Claim("t", "ppl", "wanda", "magnitude", "lower", ("seed",))], trials))[0]
    log = _verdicts(_lines([Claim("t", "ppl", "wanda", "magnitude", "lower", ("seed",), scale="log")], trials))[0]
    assert linear.startswith("**Verdict: within noise**") and log.startswith("**Verdict: held** — ppl wanda ÷ magnitude = ×0.91"), (linear, log)


def test_replicates_that_agree_exactly_give_no_verdict_unless_their_examples_carry_noise():
    """prac's peak_act_mb: −8.435 MiB (−8.845 MB) on both seeds and no per-example scores is "no variation observed", never "held", unless the
    metric is registered exact (then it is an exact effect: tests/results/test_verdict_rules.py)."""
    trials = [_trial(0, "prac", "peak_act_mb", 1.565, seed=0), _trial(1, "none", "peak_act_mb", 10.0, seed=0),
              _trial(2, "prac", "peak_act_mb", 1.565, seed=1), _trial(3, "none", "peak_act_mb", 10.0, seed=1)]
    verdict = _verdicts(_lines([Claim("t", "peak_act_mb", "prac", "none", "lower", ("seed",))], trials))[0]
    assert verdict.startswith("**Verdict: no verdict: no variation observed across 2 replicate(s)** — peak_act_mb prac − none = -8.845 MB"), verdict
    assert "[" not in verdict.split("=", 1)[1].split(",")[0]  # no interval printed as if it were one
    # the same two replicates, identical, but each scored on 40 examples: the example noise gives the interval its width
    payloads = {f"r{n}": {"unit": "example", "n": 40, "scores": {"acc": [float((i * (n + 3)) % 3 == 0) for i in range(40)]}} for n in range(4)}
    acc_trials = [{**t, "acc": sum(payloads[t["run_id"]]["scores"]["acc"]) / 40} for t in trials]
    for t, base in zip(acc_trials[2:], acc_trials[:2]):  # seed 1 scored exactly as seed 0
        payloads[t["run_id"]] = payloads[base["run_id"]]
        t["acc"] = base["acc"]
    est = estimate([(acc_trials[0], acc_trials[1]), (acc_trials[2], acc_trials[3])], "acc", fetch=payloads.get, bounds=(0.0, 1.0))
    assert est is not None and est.high - est.low > 0.1 and est.units == "40 examples", est


def test_a_bounded_metrics_difference_stays_within_its_range():
    """Select to Think's symptom: two replicates of an accuracy difference, a t interval past +1."""
    trials = [_trial(0, "s2t", "acc", 0.9375, seed=0), _trial(1, "small", "acc", 0.0, seed=0),
              _trial(2, "s2t", "acc", 0.5625, seed=1), _trial(3, "small", "acc", 0.125, seed=1)]
    claim = Claim("t", "acc", "s2t", "small", "higher", ("seed",))
    verdict = _verdicts(_lines([claim], trials, bounds=lambda m: (0.0, 1.0)))[0]
    high = float(verdict.split("[", 1)[1].split("]")[0].split(",")[1])
    low = float(verdict.split("[", 1)[1].split("]")[0].split(",")[0])
    assert -1.0 <= low and high <= 1.0 and "clipped to the metric’s range" in verdict, verdict
    unclipped = _verdicts(_lines([claim], trials))[0]
    assert float(unclipped.split("[", 1)[1].split("]")[0].split(",")[1]) > 1.0  # what it said before: the bound is what keeps it in


def test_holm_steps_down_and_stops_at_the_first_failure():
    assert holm([0.001, 0.02, 0.03]) == [True, False, False]  # 0.001 <= .025/3; 0.02 > .025/2
    assert holm([0.02, 0.001, 0.011]) == [True, True, True]  # .001 <= .0083, .011 <= .0125, .02 <= .025
    assert holm([None, 0.001]) == [False, True]  # a test without an interval never holds


@pytest.mark.parametrize("claim, message", [
    ({"expect": "no_worse"}, "claim.margin: expect no_worse needs a margin >= 0"),
    ({"expect": "lower", "margin": 0.1}, "claim.margin: a margin belongs to expect no_worse or equivalent, not lower"),
    ({"scale": "ratio"}, "claim.scale: expected linear or log"),
    ({"replicates": ["calib_seed"]}, "claim.replicates: 'calib_seed' is no parameter of this pipeline's methods"),
    ({"replicates": "bits", "pair_by": "bits"}, "claim.pair_by: give either replicates (a list) or pair_by"),
    ({"replicates": [3]}, "claim.replicates: expected a list of parameter names"),
])
def test_a_malformed_claim_option_is_refused_naming_the_field(claim, message):
    raw = {k: v for k, v in PIPELINE["claim"].items() if k != "pair_by"}
    with pytest.raises(ConfigError) as err:
        parse_spec(edited(PIPELINE, "claim", {**raw, **claim}))
    assert message in str(err.value)


def test_claim_and_claims_together_are_refused_and_pair_by_stays_a_spelling_of_replicates():
    with pytest.raises(ConfigError, match="claims: give either `claim:` .* or `claims:`"):
        parse_spec({**PIPELINE, "claims": [PIPELINE["claim"]]})
    assert parse_spec(PIPELINE).claim.replicates == ("bits",)
    assert parse_spec(edited(PIPELINE, "claim.pair_by", "none")).claim.replicates == ()


def test_two_methods_knobs_that_share_a_name_but_no_value_do_not_block_the_pairing():
    """sdr.threshold and route_confidence.threshold are unrelated knobs: pairs form on the split; a shared memory=0.5 still matches."""
    from paretolab.results.pairing import group_pairs

    trials = []
    for split in (0, 1, 2):
        trials += [_trial(len(trials), "sdr", "auc", 0.7, **{"s.sdr.threshold": 0.5, "s.sdr.split": split}),
                   _trial(len(trials) + 1, "route_confidence", "auc", 0.6, **{"s.route_confidence.threshold": 0.6, "s.route_confidence.split": split})]
    groups, ambiguous = group_pairs(Claim("t", "auc", "sdr", "route_confidence", "higher", ("split",)), trials)
    assert len(groups) == 1 and len(groups[0].pairs) == 3 and ambiguous == 0


def test_examples_that_all_agree_are_no_variation_too_and_say_so():
    """PMATIC decodes every one of 3 texts, plain arithmetic coding none: zero width even over the examples."""
    payloads = {"r0": {"unit": "text", "n": 3, "scores": {"decode_ok": [1.0, 1.0, 1.0]}},
                "r1": {"unit": "text", "n": 3, "scores": {"decode_ok": [0.0, 0.0, 0.0]}}}
    trials = [_trial(0, "pmatic", "decode_ok", 1.0), _trial(1, "arith_coding", "decode_ok", 0.0)]
    verdict = _verdicts(_lines([Claim("t", "decode_ok", "pmatic", "arith_coding", "higher", ())], trials, payloads.get))[0]
    assert verdict.startswith("**Verdict: no verdict: no variation observed across 1 replicate(s) and every resample of its 3 texts** — "
                              "decode_ok pmatic − arith_coding = +1 (the same on all 1 replicate(s) and on every resample of their 3 texts)"), verdict


def _calibrated(n, label, value, draw, **params):
    return {**_trial(n, label, "ppl", value, **params), "run_params": {"info.calibration_draws": draw} if draw else {}}


def test_a_calibrated_method_on_fewer_than_three_draws_gets_no_verdict():
    """Wanda's result moves with its calibration sample: one draw per setting is no evidence about the method."""
    claim = Claim("t", "ppl", "wanda", "magnitude", "lower", ("calib_seed",), scale="log")
    one = [_calibrated(0, "wanda", 20.0, "pydoc seed 0, 16x256", calib_seed=0), _calibrated(1, "magnitude", 30.0, "", calib_seed=0)]
    verdicts = _verdicts(_lines([claim], one))
    assert verdicts[0].startswith("**Verdict: no verdict: one calibration draw on the method's side"), verdicts
    two = one + [_calibrated(2, "wanda", 21.0, "pydoc seed 1, 16x256", calib_seed=1), _calibrated(3, "magnitude", 30.5, "", calib_seed=1)]
    assert "no verdict: 2 calibration draws" in _verdicts(_lines([claim], two))[0]
    three = two + [_calibrated(4, "wanda", 20.5, "pydoc seed 2, 16x256", calib_seed=2), _calibrated(5, "magnitude", 29.0, "", calib_seed=2)]
    assert _verdicts(_lines([claim], three))[0].startswith("**Verdict: held**")


def test_the_holm_line_says_what_each_comparisons_own_line_says():
    """A comparison with no verdict (or within noise) is never "not held" in the Holm line; only a held one can lose."""
    held = Claim("held", "ppl", "a", "b", "lower", ("seed",))
    noise = Claim("noise", "ppl", "c", "b", "lower", ("seed",))
    flat = Claim("flat", "ppl", "d", "b", "lower", ("seed",))
    trials = []
    for seed in range(3):
        trials += [_trial(len(trials), "b", "ppl", 10.0 + seed, seed=seed), _trial(len(trials) + 1, "a", "ppl", 5.0 + seed * 1.01, seed=seed),
                   _trial(len(trials) + 2, "c", "ppl", 10.0 + seed + (-1) ** seed, seed=seed), _trial(len(trials) + 3, "d", "ppl", 10.0 + seed, seed=seed)]
    lines = _lines([held, noise, flat], trials)
    holm_line = next(line for line in lines if line.startswith("**Holm-adjusted**"))
    assert "`ppl` a: held" in holm_line
    assert "`ppl` c: within noise" in holm_line
    assert "`ppl` d: no verdict: no variation observed" in holm_line
    assert "not held" not in holm_line


def test_no_cost_verdict_where_the_method_did_not_work():
    """PMATIC's bits at a setting where it does not decode say nothing of its cost: `works: decode_ok`."""
    claim = Claim("t", "bpb", "pmatic", "arith", "higher", (), works="decode_ok")
    trials = []
    for prec, ok in (("fp32", 1.0), ("bf16", 0.25)):
        trials += [{**_trial(len(trials), "pmatic", "bpb", 2.1, **{"s.pmatic.precision": prec}), "decode_ok": ok},
                   {**_trial(len(trials) + 1, "arith", "bpb", 2.0, **{"s.arith.precision": prec}), "decode_ok": 1.0}]
    claim = Claim("t", "bpb", "pmatic", "arith", "higher", (), works="decode_ok")
    verdicts = _verdicts(_lines([claim], trials))
    assert any("no verdict: pmatic did not work here (decode_ok = 0.25, below 1)" in v for v in verdicts), verdicts
    assert sum("did not work" in v for v in verdicts) == 1


def test_a_log_scale_margin_of_one_or_more_is_refused():
    pipeline = edited(PIPELINE, "claim", {"text": "t", "metric": "size_bytes", "method": "magnitude", "baseline": "none",
                                          "expect": "no_worse", "margin": 1.5, "scale": "log", "replicates": "none"})
    with pytest.raises(ConfigError, match=r"claim.margin: 1.5 with scale: log .* needs a margin below 1"):
        parse_spec(pipeline)


def test_the_equal_flops_line_says_what_train_flops_counts():
    from paretolab.results.claims import flops_counted
    from paretolab.results.pairing import Group

    plain = ({"run_params": {}}, {"run_params": {}})
    upipe = ({"run_params": {"info.train_flops_counts": "the attention chunks recomputed"}}, {"run_params": {}})
    assert flops_counted(Group((), [plain])) == "`train_flops` counts: forward and backward of every step."
    assert flops_counted(Group((), [upipe])).endswith("plus the attention chunks recomputed.")


@pytest.mark.parametrize("pipeline", sorted((ROOT / "pipelines").glob("*.yaml")), ids=lambda p: p.stem)
def test_a_stored_pipeline_gives_back_the_claims_it_was_validated_with(pipeline):
    """Reports read claims from the pipeline a study stored (a store or a bundle), not from the YAML: every field must come
    back as parse_spec made it (`works: decode_ok` was dropped there, and PMATIC's bits at bf16, where it does not
    decode, read "held")."""
    from paretolab.plugin_api.manager import registries
    from paretolab.study.report_spec import claims_from
    from tests.study.shipped_pipelines import load_as_shipped

    spec = load_as_shipped(pipeline)
    assert claims_from(spec.raw, {m.name: m.direction for m in registries().metrics}) == list(spec.claims)

"""The verdict rules that keep a comparison from saying more than it can: arms at chance, budgets the claim names but the
trials did not get, and exact effects of a deterministic measure (issue 72)."""

from __future__ import annotations

import pytest

from paretolab.errors import ConfigError
from paretolab.results.claims import claims_lines, verdict_rows
from paretolab.results.section import chance_levels, metric_exact
from paretolab.study.report_spec import Claim, claim_from
from paretolab.study.spec import parse_spec
from tests.conftest import edited
from tests.results.test_claims import PIPELINE

SMOL = {"model": "smollm2-135m", "task": {"name": "perplexity", "corpus": "wikitext2"}}
RECALL = {"model": "scratch-1m", "task": {"name": "assoc_recall", "corpus": "assoc-recall-val"}}


def _trial(n, label, seed, **metrics):
    return {"trial": n, "label": label, "run_id": f"r{n}", "params": {"seed": seed}, **metrics}


def _arms(method, baseline, metric, method_values, baseline_values, **extra):
    """Paired trials: seed s has the method's ``method_values[s]`` and the baseline's ``baseline_values[s]``."""
    trials = []
    for seed, (m, b) in enumerate(zip(method_values, baseline_values)):
        trials += [_trial(len(trials), method, seed, **{metric: m}, **{k: v[0][seed] for k, v in extra.items()}),
                   _trial(len(trials) + 1, baseline, seed, **{metric: b}, **{k: v[1][seed] for k, v in extra.items()})]
    return trials


def _verdicts(claim, trials, pipeline=None, exact=None):
    chance = chance_levels(pipeline) if pipeline is not None else None
    lines = claims_lines([claim], trials, lambda run: None, None, None, chance, exact)
    return [line for line in lines if line.startswith("**Verdict")]


# ---- an arm at or beyond chance ----------------------------------------------------------------


def test_both_arms_beyond_the_vocabulary_is_no_verdict_both_at_chance():
    """CAT-Q over absmean ternarization: ppl 1e5-5e5 against 5e6 on SmolLM2 (49152 tokens) read "held"; both are worse
    than a uniform guess over the vocabulary, so the ratio between them says nothing about the method."""
    claim = Claim("catq beats absmean", "ppl", "catq", "absmean", "lower", ("seed",), scale="log")
    trials = _arms("catq", "absmean", "ppl", [553050.0, 101853.0, 190344.0], [4.952e6, 4.952e6, 4.952e6])
    assert _verdicts(claim, trials)[0].startswith("**Verdict: held**")  # without the chance levels: what it said
    verdict = _verdicts(claim, trials, SMOL)[0]
    assert verdict.startswith("**Verdict: no verdict: both at chance (ppl catq 101853–553050 and absmean 4.952M ≥ vocabulary 49152)** — "
                              "ppl catq ÷ absmean = ×"), verdict


def test_one_arm_at_chance_says_which_and_an_arm_whose_median_trial_beats_chance_is_not():
    """Few-layer dominance at k=21: greedy_bi 44775-57929 (median below 49152) against random layers at 2.6M-23M."""
    claim = Claim("greedy beats random", "ppl", "greedy", "random", "lower", ("seed",), scale="log")
    trials = _arms("greedy", "random", "ppl", [44775.0, 57929.0, 44775.0], [2.565e6, 8.014e6, 23.36e6])
    verdict = _verdicts(claim, trials, SMOL)[0]
    assert verdict.startswith("**Verdict: no verdict: the baseline is at chance (ppl random 2.565M–23.36M ≥ vocabulary 49152)**"), verdict
    # below the vocabulary on both arms (a random layer set that still predicts): judged as before
    fine = _arms("greedy", "random", "ppl", [60.0, 58.0, 61.0], [1619.0, 33507.0, 112.4])
    assert not _verdicts(claim, fine, SMOL)[0].startswith("**Verdict: no verdict"), _verdicts(claim, fine, SMOL)


def test_an_accuracy_at_the_tasks_chance_rate_is_at_chance_on_the_higher_is_better_side():
    """assoc_recall declares chance 1/26: a method recalling 2 % of values is guessing, whatever the baseline does."""
    claim = Claim("method recalls more", "acc", "method", "base", "higher", ("seed",), better="higher")
    trials = _arms("method", "base", "acc", [0.02, 0.03, 0.01], [0.30, 0.35, 0.32])
    verdict = _verdicts(claim, trials, RECALL)[0]
    assert verdict.startswith("**Verdict: no verdict: the method is at chance (acc method 0.01–0.03 ≤ chance 0.03846 (assoc_recall))**"), verdict
    assert _verdicts(claim, trials, SMOL)[0].startswith("**Verdict: did not hold**")  # perplexity declares no acc chance


def test_the_chance_levels_come_from_the_model_source_and_the_task_and_follow_a_base_trained_here():
    assert chance_levels(SMOL)("ppl") == (49152.0, "vocabulary 49152")
    assert chance_levels(SMOL)("wiki_ppl") == (49152.0, "vocabulary 49152")  # a metric registered in unit ppl
    assert chance_levels(SMOL)("nll") is None and chance_levels(SMOL)("acc") is None
    assert chance_levels(RECALL)("acc")[0] == pytest.approx(1 / 26)
    assert chance_levels({"model": "gemma3-270m", "task": {"name": "perplexity"}})("ppl")[0] == 262144

    class Bundle:  # a bundle keeps the record of a base trained on the machine that ran the study
        def trained_base(self, model):
            return (model, {"base": "scratch-5m"}) if model == "scratch-5m-fp32" else None

    trained = {"model": "scratch-5m-fp32", "task": {"name": "perplexity"}}
    assert chance_levels(trained, Bundle())("ppl") == (4096.0, "vocabulary 4096")
    assert chance_levels(trained)("ppl") is None  # no record to follow, no registered model of that name: no chance rule


# ---- a budget the claim names but the trials did not get ---------------------------------------


def test_a_claim_at_equal_tokens_gets_no_verdict_where_a_time_cap_cut_one_arms_tokens():
    """kalman_recall: "at equal parameters and tokens", but under load Kalman trained on 78-102 k tokens, GLA on 184-199 k."""
    claim = Claim("kalman recalls more at equal tokens", "acc", "kalman", "gla", "higher", ("seed",), budget="tokens")
    tokens = ([77824, 102400], [184320, 198656])
    trials = _arms("kalman", "gla", "acc", [0.4, 0.5], [0.1, 0.15], train_tokens=tokens)
    verdict = _verdicts(claim, trials)[0]
    assert verdict.startswith("**Verdict: no verdict: budgets differ (tokens kalman 77824–102400 vs gla 184320–198656, "
                              "more than 5 % apart)** — acc kalman − gla = "), verdict
    unnamed = Claim("kalman recalls more", "acc", "kalman", "gla", "higher", ("seed",))
    assert _verdicts(unnamed, trials)[0].startswith("**Verdict: held**")  # a claim that names no budget is judged as before
    within = _arms("kalman", "gla", "acc", [0.4, 0.5], [0.1, 0.15], train_tokens=([98304, 98304], [98304, 100000]))
    assert _verdicts(claim, within)[0].startswith("**Verdict: held**")  # 1.7 % apart: equal within 5 %
    loose = Claim("t", "acc", "kalman", "gla", "higher", ("seed",), budget="tokens", budget_tolerance=0.6)
    assert _verdicts(loose, trials)[0].startswith("**Verdict: held**")  # at most 58 % apart, a 60 % tolerance stated


def test_a_budget_no_trial_recorded_is_no_verdict_naming_the_trials_and_flops_and_steps_map_to_the_train_metrics():
    claim = Claim("t", "val_loss", "a", "b", "lower", ("seed",), budget="steps")
    trials = _arms("a", "b", "val_loss", [3.0, 3.1], [3.5, 3.6])
    assert _verdicts(claim, trials)[0].startswith(
        "**Verdict: no verdict: the claim is at equal steps, but trial(s) 0, 1, 2, 3 recorded no `train_steps` to check it by**")
    flops = _arms("a", "b", "val_loss", [3.0, 3.1], [3.5, 3.6], train_flops=([1e12, 1e12], [2e12, 2e12]))
    said = _verdicts(Claim("t", "val_loss", "a", "b", "lower", ("seed",), budget="flops"), flops)[0]
    assert said.startswith("**Verdict: no verdict: budgets differ (flops a 1T vs b 2T, more than 5 % apart)**"), said


def test_the_budget_is_declared_on_the_claim_validated_and_read_back_from_the_stored_pipeline():
    claim = {**PIPELINE["claim"], "budget": "tokens"}
    parsed = parse_spec(edited(PIPELINE, "claim", claim)).claim
    assert (parsed.budget, parsed.budget_metric, parsed.budget_tolerance) == ("tokens", "train_tokens", 0.05)
    assert claim_from(claim) == Claim(parsed.text, "ppl", "magnitude", "none", "higher", ("bits",), budget="tokens")
    assert parse_spec(edited(PIPELINE, "claim", {**claim, "budget": "size_bytes", "budget_tolerance": 0.01})).claim.budget_metric == "size_bytes"
    for bad, message in [({"budget": "tokenz"}, "claim.budget"), ({"budget_tolerance": 0.1}, "claim.budget_tolerance: belongs to a budget"),
                         ({"budget": "tokens", "budget_tolerance": 1.5}, "claim.budget_tolerance: expected a fraction in [0, 1)")]:
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
            parse_spec(edited(PIPELINE, "claim", {**PIPELINE["claim"], **bad}))


# ---- an exact effect ----------------------------------------------------------------------------


def test_an_exact_metrics_identical_replicates_are_an_exact_effect_judged_against_the_claim():
    """UPipe's activation memory: -40.16 MiB (-42.11 MB) on every seed is what head-chunking saves, not "no variation observed";
    written in decimal MB, as every surface writes bytes."""
    assert metric_exact("peak_act_mb") and not metric_exact("val_loss")
    claim = Claim("upipe saves memory", "peak_act_mb", "upipe", "none", "lower", ("seed",))
    trials = _arms("upipe", "none", "peak_act_mb", [195.0, 195.0, 195.0], [235.16, 235.16, 235.16])
    verdict = _verdicts(claim, trials, exact=metric_exact)[0]
    assert verdict.startswith("**Verdict: held: -42.11 MB on each of 3 seeds, deterministic** — peak_act_mb upipe − none = -42.11 MB"), verdict
    assert _verdicts(claim, trials)[0].startswith("**Verdict: no verdict: no variation observed across 3 replicate(s)**")
    more = Claim("upipe costs memory", "peak_act_mb", "upipe", "none", "higher", ("seed",))
    assert _verdicts(more, trials, exact=metric_exact)[0].startswith("**Verdict: did not hold: -42.11 MB on each of 3 seeds, deterministic**")
    ratio = Claim("prac saves memory", "peak_act_mb", "upipe", "none", "no_worse", ("seed",), margin=0.05, scale="log")
    assert _verdicts(ratio, trials, exact=metric_exact)[0].startswith("**Verdict: held: ×0.8292 on each of 3 seeds, deterministic**")
    # beside a loss claim held at one-sided p = 0.018: the exact effect counts as held (p = 0) in Holm's step-down, so the
    # loss claim is tested at 2.5 %, not at 1.25 % as if the exact effect were a comparison that failed
    loss = Claim("upipe keeps the loss", "val_loss", "upipe", "none", "lower", ("seed",))
    both = [{**t, "val_loss": 3.0 + (0.0 if t["label"] == "none" else (-1.0, -1.2, -2.0)[t["params"]["seed"]])} for t in trials]
    lines = claims_lines([claim, loss], both, lambda run: None, None, None, None, metric_exact)
    holm = next(line for line in lines if line.startswith("**Holm"))
    assert "upipe: held: -42.11 MB" in holm and "`val_loss` upipe: held" in holm and "not held after adjustment" not in holm, holm
    assert [r["verdict"] for r in verdict_rows([claim], trials, exact=metric_exact)] == ["held: -42.11 MB on each of 3 seeds, deterministic"]


def test_no_variation_stays_no_verdict_unless_the_metric_is_exact_and_each_arm_reads_the_same_on_every_replicate():
    claim = Claim("t", "peak_act_mb", "upipe", "none", "lower", ("seed",))
    moving = _arms("upipe", "none", "peak_act_mb", [195.0, 205.0], [235.16, 245.16])  # same difference, arms that move
    assert _verdicts(claim, moving, exact=metric_exact)[0].startswith("**Verdict: no verdict: no variation observed across 2 replicate(s)**")
    one = _arms("upipe", "none", "peak_act_mb", [195.0], [235.16])  # one seed shows nothing about determinism
    assert _verdicts(claim, one, exact=metric_exact)[0].startswith("**Verdict: no verdict: one replicate")
    speed = Claim("t", "speedup_at_97", "lazy", "cheap", "higher", ("seed",))  # identical replicates, but not an exact measure
    same = _arms("lazy", "cheap", "speedup_at_97", [2.0, 2.0, 2.0], [2.0, 2.0, 2.0])
    assert _verdicts(speed, same, exact=metric_exact)[0].startswith("**Verdict: no verdict: no variation observed across 3 replicate(s)**")


# ---- the documents judge the claims the pipeline states now -------------------------------------


def test_a_document_judges_the_claim_its_pipeline_states_now_when_the_bundle_ran_that_pipeline(tmp_path):
    import yaml

    from paretolab.results.documents import current_claims
    from paretolab.study.spec import pipeline_hash

    (tmp_path / "pipelines").mkdir()
    now = {**PIPELINE, "claim": {**PIPELINE["claim"], "budget": "tokens"}}
    (tmp_path / "pipelines" / "claimed.yaml").write_text(yaml.safe_dump(now))

    class Record:
        def __init__(self, hash_):
            self.user_attrs = {"pipeline": dict(PIPELINE), "pipeline_hash": hash_}

    same = Record(pipeline_hash(PIPELINE))
    current_claims(tmp_path, "claimed", same)
    assert same.user_attrs["pipeline"]["claim"]["budget"] == "tokens"  # claims are outside the hash: the study is the same
    other = Record("0000000000000000")
    current_claims(tmp_path, "claimed", other)
    assert "budget" not in other.user_attrs["pipeline"]["claim"]  # another pipeline ran these trials: its claim stays

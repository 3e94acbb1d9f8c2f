"""A pipeline's claim: refused with a named error when malformed; its verdict in the report from stored trials."""

from __future__ import annotations

import json

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import create_trial

from paretolab.errors import ConfigError
from paretolab.results import section as report
from paretolab.stores import Stores
from paretolab.study.spec import parse_spec
from tests.conftest import edited

# magnitude | none, then rtn with bits searched: bits plays the seed's part (the train stage's seed is the usual pair_by)
PIPELINE = {
    "name": "claimed",
    "model": "tiny-llama",
    "task": {"name": "perplexity", "corpus": "pydoc", "max_tokens": 4096},
    "stages": [
        {"choice": [{"method": "magnitude", "params": {"sparsity": 0.5}}, {"method": "none"}]},
        {"method": "rtn", "params": {"bits": [4, 8]}},
    ],
    "objectives": [{"metric": "ppl"}, {"metric": "size_bytes"}],
    "claim": {"text": "pruning half the weights costs perplexity", "metric": "ppl", "method": "magnitude",
              "baseline": "none", "expect": "higher", "pair_by": "bits"},
}


def test_a_claim_parses_and_is_left_out_of_the_pipeline_hash():
    spec = parse_spec(PIPELINE)
    assert spec.claim is not None and (spec.claim.method, spec.claim.baseline, spec.claim.expect, spec.claim.pair_by) == ("magnitude", "none", "higher", "bits")
    reworded = parse_spec(edited(PIPELINE, "claim.text", "another wording"))
    without = parse_spec(edited(PIPELINE, "claim", KeyError))
    assert spec.pipeline_hash() == reworded.pipeline_hash() == without.pipeline_hash()  # editing a claim does not block --resume


@pytest.mark.parametrize(
    "path, value, message",
    [
        ("claim", "better", "claim: expected a mapping {text, metric, method, baseline, expect, replicates, pair_by, margin, scale, reference, target, tolerance, works, budget, budget_tolerance}, got 'better'"),
        ("claim.verdict", "held", "claim.verdict: unknown field"),
        ("claim.text", KeyError, "claim.text: required field is missing"),
        ("claim.metric", "perplexity", "claim.metric: unknown metric 'perplexity'"),
        ("claim.method", "wanda", "claim.method: claim 'pruning half the weights costs perplexity' compares 'wanda', but no stage of this "
                                  "pipeline runs 'wanda'; name methods of its stages joined by + (magnitude, none, rtn), or add 'wanda' to a choice stage"),
        ("claim.baseline", "magnitude", "claim.baseline: 'magnitude' is also the claim's method"),
        ("claim.expect", "better", "claim.expect: expected lower or higher (the direction the method should move ppl), or no_worse / equivalent with a margin; got 'better'"),
        ("claim.pair_by", KeyError, "claim.pair_by: 'seed' is no parameter of this pipeline's methods; give one of"),  # the default
    ],
)
def test_a_malformed_claim_is_refused_naming_the_field(path, value, message):
    with pytest.raises(ConfigError) as err:
        parse_spec(edited(PIPELINE, path, value))
    assert message in str(err.value)


# ---- verdicts on stored trials ------------------------------------------------------------------

STAGE0 = CategoricalDistribution(["bhyt", "none"])
SEEDS = CategoricalDistribution([0, 1, 2])
TRAINING = {
    "name": "norms", "model": "tiny-llama", "task": {"name": "perplexity", "corpus": "pydoc"},
    "stages": [{"choice": [{"method": "bhyt"}, {"method": "none"}]},
               {"method": "train", "params": {"tokens": 4096, "lr": 0.003, "seed": [0, 1, 2]}}],
    "objectives": [{"metric": "val_loss"}, {"metric": "train_flops"}],
}


def _curve(flops: float, final: float) -> bytes:
    """A learning curve falling linearly from final + 1 to ``final`` over ``flops``, four eval points."""
    rows = [{"stage": "stage1", "step": 10 * i, "tokens": 1024 * i, "flops": flops * i / 4, "train_loss": final + 1.1 - i / 4,
             "val_loss": final + 1 - i / 4, "lr": 0.003, "s": float(i)} for i in range(1, 5)]
    return json.dumps({"rows": rows, "seed": 0}).encode()


def _add_study(stores, name, trials, claim, *, curves=True) -> None:
    """A training study written as the driver writes one: Optuna trials, MLflow runs with learning-curve artifacts."""
    from paretolab.records import TrialResult
    from paretolab.stores.tracking import Tracker

    pipeline = {**TRAINING, "name": name, "claim": claim}
    study = optuna.create_study(study_name=name, storage=stores.optuna_url, directions=["minimize", "minimize"])
    study.set_user_attr("objectives", [["val_loss", "minimize"], ["train_flops", "minimize"]])
    study.set_user_attr("model", "scratch-1m")
    study.set_user_attr("pipeline", pipeline)
    tracker = Tracker(stores, name)
    parent = tracker.study_run({}, {"pipeline": pipeline})
    for number, (method, seed, loss, flops) in enumerate(trials):
        artifacts = {"learning_curve.json": _curve(flops, loss)} if curves else {}
        result = TrialResult(metrics={"val_loss": loss, "train_flops": flops}, artifacts=artifacts)
        run_params = {"stage0.method": method, "stage1.method": "train", "stage1.train.seed": seed, "stage1.train.lr": 0.003,
                      "stage1.train.tokens": 4096, "trial.attempt": 1}
        run_id = tracker.log_trial(parent, number, run_params, result, {})
        study.add_trial(create_trial(params={"stage0.method": method, "train.seed": seed}, distributions={"stage0.method": STAGE0, "train.seed": SEEDS},
                                     values=[loss, flops], user_attrs={"mlflow_run_id": run_id}))


CLAIM = {"text": "BHyT trains to a lower loss than RMSNorm", "metric": "val_loss", "method": "bhyt", "baseline": "none",
         "expect": "lower", "pair_by": "seed"}
BASE = [3.0, 3.2, 2.9]  # the baseline's val_loss on seeds 0, 1, 2


def _paired(diffs, flops=(1e9, 1e9)):
    """Baseline trials 0-2 (seeds 0-2), then method trials 3-5 whose loss is the same seed's plus ``diffs``."""
    return [("none", s, BASE[s], flops[1]) for s in range(3)] + [("bhyt", s, BASE[s] + d, flops[0]) for s, d in enumerate(diffs)]


STUDIES = {  # name -> (trials, claim, curves)
    "held": (_paired([-0.10, -0.12, -0.11]), CLAIM, True),
    "not_held": (_paired([0.20, 0.22, 0.21]), CLAIM, True),
    "noise": (_paired([0.05, -0.06, 0.02]), CLAIM, True),
    "higher": (_paired([0.20, 0.22, 0.21]), {**CLAIM, "expect": "higher"}, True),
    # baseline trials stored as seeds 2, 0, 1 and method trials as 1, 2, 0; the method lowers each seed's loss by exactly 0.1
    "order": ([("none", s, BASE[s], 1e9) for s in (2, 0, 1)] + [("bhyt", s, BASE[s] - 0.1, 1e9) for s in (1, 2, 0)], CLAIM, True),
    "flops": (_paired([0.05, 0.06, 0.04], flops=(0.5e9, 1e9)), CLAIM, True),
    "no_curves": (_paired([0.05, 0.05, 0.05], flops=(0.5e9, 1e9)), CLAIM, False),
    "one_pair": ([("none", 0, 3.0, 1e9), ("bhyt", 0, 2.9, 1e9)], CLAIM, True),
    "no_claim": ([("none", 0, 3.0, 1e9), ("bhyt", 0, 2.9, 1e9)], None, True),
}


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> Stores:
    """One store holding every scenario as its own study (an MLflow store is the slow part to create)."""
    home = tmp_path_factory.mktemp("claims")
    stores = Stores(f"sqlite:///{home / 'optuna.db'}", f"sqlite:///{home / 'mlflow.db'}", str(home / "artifacts"))
    for name, (trials, claim, curves) in STUDIES.items():
        _add_study(stores, name, trials, claim, curves=curves)
    return stores


def _section(stores, name):
    return report.study_section(name, stores, ["val_loss"], frontier=False)


def _verdict(text: str) -> str:
    """The section's first verdict as the verdict code wrote it (the section puts each on a line of its own, marked)."""
    from paretolab.results.layout import unmarked

    return next(unmarked(line) for line in text.splitlines() if unmarked(line).startswith("**Verdict"))


def test_claim_held_when_every_paired_difference_is_on_the_expected_side(stores):
    text = _section(stores, "held")
    lines = text.splitlines()
    assert lines[0] == "## held" and lines[2] == "**Claim:** BHyT trains to a lower loss than RMSNorm"  # at the top of the section
    assert "against baseline `none` on `val_loss` (lower expected), paired on replicates `seed` and every other shared setting" in text
    verdict = _verdict(text)
    assert verdict.startswith("**Verdict: held** — val_loss bhyt − none = -0.11 [")
    assert "(95 % interval: t over 3 replicates; no per-example scores stored), mean over n = 3 pair(s) (trials 3 vs 0, 4 vs 1, 5 vs 2)" in verdict
    # t(0.975, 2) = 4.303; sd of (-.10, -.12, -.11) is 0.01: the interval is -0.11 ± 0.02484
    low, high = (float(x) for x in verdict.split("[", 1)[1].split("]", 1)[0].split(","))
    assert low == pytest.approx(-0.11 - 0.02484, abs=2e-4) and high == pytest.approx(-0.11 + 0.02484, abs=2e-4)
    assert "equal training FLOPs" not in text  # equal budgets: nothing to read off the curves


def test_claim_did_not_hold_when_the_method_is_worse_on_every_pair(stores):
    assert _verdict(_section(stores, "not_held")).startswith("**Verdict: did not hold** — val_loss bhyt − none = +0.21 [")


def test_claim_within_noise_when_the_interval_contains_zero(stores):
    assert _verdict(_section(stores, "noise")).startswith("**Verdict: within noise** — val_loss bhyt − none = +0.003333 [-0.1")


def test_expect_higher_turns_the_verdict_round(stores):
    assert _verdict(_section(stores, "higher")).startswith("**Verdict: held**")


def test_pairs_are_matched_on_the_seed_not_on_the_trial_order(stores):
    verdict = _verdict(_section(stores, "order"))
    assert "= -0.1 (the same on all 3 replicate(s)" in verdict, verdict  # zero spread: only a seed-matched pairing gives equal differences
    assert "trials 5 vs 1, 3 vs 2, 4 vs 0" in verdict  # (method, baseline) for seeds 0, 1, 2


def test_loss_at_equal_flops_reads_the_larger_budgets_curve(stores):
    # bhyt spends 0.5e9 FLOPs, the baseline 1e9: the baseline's curve is read at 0.5e9, where it is final + 0.5
    text = _section(stores, "flops")
    line = next(line for line in text.splitlines() if line.startswith("At equal training FLOPs"))
    # val_loss(bhyt) - baseline curve at 0.5e9 = (base + d) - (base + 0.5) = d - 0.5 on every pair: -0.45, -0.44, -0.46
    assert line.startswith("At equal training FLOPs: **held** — val_loss bhyt − none = -0.45 ["), line
    assert _verdict(text).startswith("**Verdict: did not hold**")  # at its own (smaller) budget the loss is higher


def test_unreadable_curves_are_said_when_budgets_differ(stores):
    assert "their learning curves (`learning_curve.json`) are not readable from the store" in _section(stores, "no_curves")


def test_one_pair_gives_no_verdict_and_a_study_without_a_claim_gets_no_block(stores):
    verdict = _verdict(_section(stores, "one_pair"))
    assert verdict.startswith("**Verdict: no verdict: one replicate and no per-example scores stored (an interval needs two replicates or the examples)** "
                              "— val_loss bhyt − none = -0.1, mean over n = 1")
    plain = _section(stores, "no_claim")
    assert "Claim" not in plain and "Verdict" not in plain


@pytest.mark.parametrize("label, message", [
    ("magnitude[sparsity=0.5", "claim.method: 'magnitude[sparsity=0.5' opens '[' without closing it"),
    ("magnitude[sparsity]", "claim.method: 'sparsity' in 'magnitude[sparsity]' is not param=value"),
    ("magnitude[bits=4]", "claim.method: 'magnitude[bits=4]' selects on 'bits', which is no parameter of 'magnitude'"),
])
def test_a_malformed_bracket_label_is_refused(label, message):
    with pytest.raises(ConfigError) as err:
        parse_spec(edited(PIPELINE, "claim.method", label))
    assert message in str(err.value)
    assert parse_spec(edited(PIPELINE, "claim.method", "magnitude[sparsity=0.5]")).claim.method == "magnitude[sparsity=0.5]"


def test_a_reference_gives_the_share_of_the_gap_closed():
    """tetrajet vs naive NVFP4 with fp32 (none) as the reference: (naive − tetrajet) / (naive − none) per seed."""
    from paretolab.results.claims import claim_lines
    from paretolab.study.report_spec import Claim

    losses = {(0, "tetrajet"): 3.2, (0, "naive"): 3.4, (0, "none"): 3.0, (1, "tetrajet"): 3.3, (1, "naive"): 3.6, (1, "none"): 3.0}
    trials = []
    for n, ((seed, arm), loss) in enumerate(sorted(losses.items())):
        label = "none" if arm == "none" else "tetrajet"
        params = {"stage1.train.seed": seed, **({"stage0.tetrajet.recipe": arm} if label == "tetrajet" else {})}
        trials.append({"trial": n, "label": label, "val_loss": loss, "params": params})
    claim = Claim("t", "val_loss", "tetrajet[recipe=tetrajet]", "tetrajet[recipe=naive]", "lower", "seed", reference="none")
    text = "\n".join(claim_lines(claim, trials, lambda run: None))
    line = next(line for line in text.splitlines() if line.startswith("Share of the"))
    # seed 0: (3.4 − 3.2)/(3.4 − 3.0) = 50 %; seed 1: (3.6 − 3.3)/(3.6 − 3.0) = 50 %
    assert "closed by `tetrajet[recipe=tetrajet]`: (baseline − method) / (baseline − reference) = 50.0% (the same on all 2: no variation observed)" in line, line
    assert "n = 2 triple(s)" in line
    with pytest.raises(ConfigError, match="claim.reference: expected a label other than the method and the baseline"):
        parse_spec(edited(PIPELINE, "claim.reference", "none"))
    assert parse_spec(edited(edited(PIPELINE, "stages.0.choice", [{"method": "magnitude"}, {"method": "dyt"}, {"method": "none"}]),
                             "claim.reference", "dyt")).claim.reference == "dyt"


# ---- one pair judged on its windows, pair_by: none, value claims ---------------------------------


def _window_payload(nlls):
    return {"unit": "window", "n": len(nlls), "scores": {"nll": list(nlls)}, "weights": [128.0] * len(nlls)}


def test_one_pair_is_judged_on_the_paired_bootstrap_over_its_windows_when_they_are_stored():
    """catq[steps=160] vs absmean_ternary share no seed: pair_by none, one pair, verdict over the 16 windows."""
    from paretolab.results.claims import claim_lines
    from paretolab.study.report_spec import Claim

    import math

    base = [5.0 + 0.1 * (i % 5) for i in range(16)]
    payloads = {"catq": _window_payload([v - 0.05 for v in base]), "absmean": _window_payload(base),
                "noisy": _window_payload([v + (0.4 if i % 2 else -0.39) for i, v in enumerate(base)])}

    def ppl(run):  # what the task logs: exp of the token-weighted mean window NLL
        return math.exp(sum(payloads[run]["scores"]["nll"]) / 16)

    trials = [{"trial": 0, "label": "catq", "ppl": ppl("catq"), "run_id": "catq", "params": {"stage0.catq.steps": 160}},
              {"trial": 1, "label": "catq", "ppl": ppl("noisy"), "run_id": "noisy", "params": {"stage0.catq.steps": 10}},
              {"trial": 2, "label": "absmean_ternary", "ppl": ppl("absmean"), "run_id": "absmean", "params": {}}]
    claim = Claim("t", "ppl", "catq[steps=160]", "absmean_ternary", "lower", "none")
    text = "\n".join(claim_lines(claim, trials, lambda run: None, payloads.get))
    assert "paired on no replicate (each setting rests on its examples)" in text
    verdict = _verdict(text)
    assert verdict.startswith("**Verdict: held** — ppl catq[steps=160] − absmean_ternary = "), verdict
    assert "(95 % interval: paired bootstrap over 16 windows; one replicate: evaluation noise only, not seed-to-seed), mean over n = 1 pair(s) (trials 0 vs 2)" in verdict
    # the unit is named in the plural the reader expects ("queries", not "querys")
    as_queries = {run: {**payload, "unit": "query"} for run, payload in payloads.items()}
    assert "paired bootstrap over 16 queries;" in _verdict("\n".join(claim_lines(claim, trials, lambda run: None, as_queries.get)))
    # the same pair with no stored windows: no interval, said as before
    bare = _verdict("\n".join(claim_lines(claim, trials, lambda run: None, lambda run: None)))
    assert bare.startswith("**Verdict: no verdict: one replicate and no per-example scores stored"), bare
    # a noisy pair straddles zero: within noise
    noisy = Claim("t", "ppl", "catq[steps=10]", "absmean_ternary", "lower", "none")
    assert _verdict("\n".join(claim_lines(noisy, trials, lambda run: None, payloads.get))).startswith("**Verdict: within noise**")


def test_pair_by_none_is_accepted_and_a_value_claim_is_checked_against_its_target():
    from paretolab.results.claims import claim_lines
    from paretolab.study.report_spec import claim_from

    spec = parse_spec(edited(PIPELINE, "claim.pair_by", "none"))
    assert spec.claim.pair_by == "none"
    depth = {"name": "probe", "model": "tiny-llama", "task": {"name": "perplexity", "corpus": "pydoc"},
             "stages": [{"method": "none"}], "objectives": [{"metric": "ppl"}],
             "claim": {"text": "alpha ~ 1", "metric": "depth_alpha", "target": 1.0, "tolerance": 0.3}}
    claim = parse_spec(depth).claim
    assert (claim.target, claim.tolerance, claim.method) == (1.0, 0.3, "")

    def verdict(*alphas):
        trials = [{"trial": n, "label": "none", "depth_alpha": a, "params": {}} for n, a in enumerate(alphas)]
        return _verdict("\n".join(claim_lines(claim, trials, lambda run: None)))

    assert verdict(0.474) == "**Verdict: no verdict: point estimates, no interval** — depth_alpha = 0.474 (trial 0); outside the band."
    assert verdict(0.9, 1.25).endswith("; inside the band.")
    assert verdict(0.9, 0.2).endswith("; partly inside the band.")
    assert verdict().startswith("**Verdict: no verdict: no trial reported depth_alpha")
    assert claim_from(depth["claim"]) == claim  # as the report reads it back from the stored pipeline


@pytest.mark.parametrize("edit, message", [
    ({"tolerance": KeyError}, "claim.tolerance: required field is missing (a value claim needs text, metric, target and tolerance)"),
    ({"tolerance": 0}, "claim.tolerance: expected a number > 0"),
    ({"target": "one"}, "claim.target: expected a number, got 'one'"),
    ({"method": "none"}, "claim.method: a value claim (target, tolerance) compares no methods"),
])
def test_a_malformed_value_claim_is_refused_naming_the_field(edit, message):
    claim = {"text": "alpha ~ 1", "metric": "depth_alpha", "target": 1.0, "tolerance": 0.3}
    for key, value in edit.items():
        if value is KeyError:
            claim.pop(key)
        else:
            claim[key] = value
    with pytest.raises(ConfigError) as err:
        parse_spec(edited(PIPELINE, "claim", claim))
    assert message in str(err.value)


def test_resuming_with_an_edited_claim_updates_the_stored_pipeline_the_report_reads(tmp_path):
    """The claim and description are outside the pipeline hash: --resume keeps the study and stores their new text."""
    from paretolab.study.optuna_study import open_study

    stores = Stores(f"sqlite:///{tmp_path / 'optuna.db'}", f"sqlite:///{tmp_path / 'mlflow.db'}", str(tmp_path / "artifacts"))
    open_study(parse_spec(PIPELINE), stores, resume=False)
    reworded = edited(edited(PIPELINE, "claim.text", "another wording"), "description", "the paper says so")
    study = open_study(parse_spec(reworded), stores, resume=True)
    stored = optuna.load_study(study_name=study.study_name, storage=stores.optuna_url).user_attrs["pipeline"]
    assert stored["claim"]["text"] == "another wording" and stored["description"] == "the paper says so"

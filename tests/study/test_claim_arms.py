"""A claim compares arms the search produces: two settings of one method are two arms (in a choice stage beside other
methods, or in a stage of its own); a method no stage runs, a value the search never gives, or two labels that select
the same trials are refused by `paretolab check` in one line naming the claim and the fix; `check` prints the claims."""

from __future__ import annotations

import copy

import pytest
import yaml

from paretolab.errors import ConfigError
from paretolab.study.spec import parse_spec

BASE = {"name": "arms", "model": "tiny-llama", "task": {"name": "perplexity", "corpus": "pystdlib-val", "max_tokens": 4096},
        "objectives": [{"metric": "ppl"}, {"metric": "size_bytes"}]}
KQUANT = {"method": "kquant", "params": {"type": ["Q4_K_M", "Q4_0"]}}
SETTINGS = {"text": "Q4_K_M beats Q4_0", "metric": "ppl", "method": "kquant[type=Q4_K_M]", "baseline": "kquant[type=Q4_0]",
            "expect": "lower", "scale": "log", "replicates": "none"}


def pipeline(stages, claim=SETTINGS):
    return {**copy.deepcopy(BASE), "stages": copy.deepcopy(stages), "claim": dict(claim)}


@pytest.mark.parametrize("stages", [
    [{"choice": [KQUANT, {"method": "rtn", "params": {"bits": 4}}, {"method": "none"}]}],  # a second method shares the choice stage
    [{"choice": [KQUANT, {"method": "none"}]}],
    [KQUANT],  # the method's own stage, no choice at all
], ids=["shared-choice", "choice-with-none", "own-stage"])
def test_two_settings_of_one_method_are_two_arms(stages):
    claim = parse_spec(pipeline(stages)).claim
    assert (claim.method, claim.baseline) == ("kquant[type=Q4_K_M]", "kquant[type=Q4_0]")


@pytest.mark.parametrize("stages, claim, says", [
    ([{"choice": [{"method": "rtn", "params": {"bits": 4}}, {"method": "none"}]}], {"method": "gptq", "baseline": "none"},
     "claim.method: claim 'Q4_K_M beats Q4_0' compares 'gptq', but no stage of this pipeline runs 'gptq'; name methods of "
     "its stages joined by + (none, rtn), or add 'gptq' to a choice stage"),
    ([{"choice": [{"method": "cat", "params": {"transform": "cat", "w_bits": 4}}, {"method": "none"}]}],
     {"method": "cat[transform=hadamard]", "baseline": "cat[transform=cat]"},
     "claim.method: cat.transform is fixed at 'cat' in this pipeline, so transform=hadamard never runs (claim 'Q4_K_M beats "
     "Q4_0'); name an arm the search runs, or add the value to the method's params"),
    ([KQUANT], {"method": "kquant[type=Q4_K_M]", "baseline": "kquant[type=Q8_0]"},
     "claim.baseline: kquant.type: 'Q8_0' is not one of its values ['Q4_K_M', 'Q4_0'] (claim 'Q4_K_M beats Q4_0')"),
    ([KQUANT], {"method": "kquant[type=Q4_K_M]", "baseline": "kquant"},
     "claim.baseline: claim 'Q4_K_M beats Q4_0' compares 'kquant[type=Q4_K_M]' with 'kquant', which select the same trials"),
    ([{"method": "magnitude", "params": {"sparsity": 0.5}}, {"choice": [{"method": "rtn", "params": {"bits": 4}}, {"method": "none"}]}],
     {"method": "magnitude", "baseline": "none"},  # magnitude runs in every trial: both labels are the trials that chose none
     "claim.baseline: claim 'Q4_K_M beats Q4_0' compares 'magnitude' with 'none', which select the same trials"),
], ids=["method-not-run", "value-fixed-elsewhere", "value-not-searched", "overlapping", "fixed-stage-is-every-trial"])
def test_an_arm_the_search_cannot_produce_is_refused_naming_the_claim(stages, claim, says):
    with pytest.raises(ConfigError) as err:
        parse_spec(pipeline(stages, {**SETTINGS, **claim}))
    assert says in str(err.value), str(err.value)


def _check(raw, tmp_path, capsys):
    from paretolab.cli import main

    path = tmp_path / "arms.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    rc = main(["check", str(path), "--home", str(tmp_path / "home")])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_check_prints_the_claims_and_refuses_an_arm_in_one_line(tmp_path, capsys):
    stages = [{"choice": [KQUANT, {"method": "rtn", "params": {"bits": 4}}, {"method": "none"}]}]
    claims = [SETTINGS, {"text": "RTN at 4 bits keeps perplexity within 5 %", "metric": "ppl", "method": "rtn", "baseline": "none",
                         "expect": "no_worse", "margin": 0.05, "scale": "log", "replicates": "none"}]
    raw = {**pipeline(stages), "claims": claims}
    del raw["claim"]
    rc, out, _ = _check(raw, tmp_path, capsys)
    assert rc == 0, out
    assert "claims (`paretolab report arms` judges them on the stored trials):" in out
    assert ('  "Q4_K_M beats Q4_0": ppl, kquant[type=Q4_K_M] vs kquant[type=Q4_0], expect lower, judged as the ratio '
            "method ÷ baseline; replicates: none") in out
    assert '  "RTN at 4 bits keeps perplexity within 5 %": ppl, rtn vs none, expect no_worse (margin 5 % on the ratio); replicates: none' in out

    raw["claims"][1]["method"] = "gptq"
    rc, out, err = _check(raw, tmp_path, capsys)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "claims[1].method: claim 'RTN at 4 bits keeps perplexity within 5 %' compares 'gptq'" in err and "add 'gptq' to a choice stage" in err


def test_the_arms_of_a_methods_own_stage_pair_on_the_stored_trials():
    """Trials of a pipeline without a choice stage are labelled none; a claim naming its stage's method still finds them."""
    from paretolab.results.pairing import group_pairs
    from paretolab.study.report_spec import Claim

    claim = Claim("t", "ppl", "kquant[type=Q4_K_M]", "kquant[type=Q4_0]", "lower", ())
    trials = [{"trial": n, "label": "none", "ppl": 20.0 + n, "params": {"kquant.type": kind}}
              for n, kind in enumerate(["Q4_0", "Q4_K_M"])]
    groups, ambiguous = group_pairs(claim, trials)
    assert [[(m["trial"], b["trial"]) for m, b in g.pairs] for g in groups] == [[(1, 0)]] and ambiguous == 0
    # a label's method that a choice picked somewhere must still be the trial's pick: `train` against `none` (mup_upscale)
    chosen = [{"trial": 2, "label": "train", "ppl": 3.0, "params": {"s1.train.seed": 0, "s3.train.seed": 0}},
              {"trial": 3, "label": "none", "ppl": 4.0, "params": {"s3.train.seed": 0}}]
    groups, _ = group_pairs(Claim("t", "ppl", "train", "none", "lower", ("s3.train.seed",)), chosen)
    assert [[(m["trial"], b["trial"]) for m, b in g.pairs] for g in groups] == [[(2, 3)]]

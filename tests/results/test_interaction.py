"""paretolab interaction: the log-scale interaction term of two stacked methods, paired over the windows."""

from __future__ import annotations

import math

import numpy as np
import pytest

from paretolab.results.interaction import arms_of, log_term, paired_term
from paretolab.errors import ConfigError
from paretolab.stats import Samples


def nll_samples(values, weights=None):
    v = np.asarray(values, dtype=float)
    return Samples(v, np.asarray(weights or [1.0] * len(v), dtype=float), True, "window")


def test_effects_that_multiply_have_no_interaction():
    ea, eb, eab, term = log_term(10.0, 12.0, 15.0, 18.0)  # 12/10 * 15/10 = 18/10
    assert (ea, eb, eab) == pytest.approx((math.log(1.2), math.log(1.5), math.log(1.8)))
    assert term == pytest.approx(0.0, abs=1e-12)
    assert log_term(10.0, 12.0, 15.0, 27.0)[3] == pytest.approx(math.log(27 / 18))  # stacking costs 1.5x more than predicted
    with pytest.raises(ConfigError, match="positive values"):
        log_term(0.0, 1.0, 1.0, 1.0)


def test_per_window_additive_losses_give_a_zero_interval_and_a_real_interaction_one_that_excludes_zero():
    rng = np.random.default_rng(0)
    base = rng.normal(3.0, 0.5, 16)
    a, b = base + rng.normal(0.1, 0.05, 16), base + rng.normal(0.2, 0.05, 16)
    additive = a + b - base  # log ppl is the mean NLL: window by window additive means a zero term on every resample
    low, high, n = paired_term(*(nll_samples(x) for x in (base, a, b, additive)))
    assert n == 16 and low == pytest.approx(0.0, abs=1e-12) and high == pytest.approx(0.0, abs=1e-12)
    worse = additive + 0.3 + rng.normal(0, 0.02, 16)
    low, high, _ = paired_term(*(nll_samples(x) for x in (base, a, b, worse)))
    assert 0.25 < low < 0.3 < high < 0.35
    assert paired_term(nll_samples(base), nll_samples(a), nll_samples(b), nll_samples(worse[:8])) is None  # other windows


def test_the_four_arms_are_found_by_label_and_a_missing_one_is_named():
    rows = [{"method": "none", "trial": 0}, {"method": "wanda", "trial": 1}, {"method": "rtn", "trial": 2}, {"method": "wanda+rtn", "trial": 3}]
    assert {k: v["trial"] for k, v in arms_of(rows, "rtn", "wanda", "s").items()} == {"base": 0, "A": 2, "B": 1, "A+B": 3}
    with pytest.raises(ConfigError, match=r"no complete trial of A \(magnitude\); it has none, rtn, wanda, wanda\+rtn"):
        arms_of(rows, "magnitude", "rtn", "s")
    with pytest.raises(ConfigError, match=r"no complete trial of A\+B \(rtn\+wanda or wanda\+rtn\)"):
        arms_of(rows[:3], "rtn", "wanda", "s")


@pytest.mark.ray
def test_a_stacked_study_gives_the_term_of_its_recorded_numbers_with_an_interval_over_its_windows(tmp_path, ray_head):
    import yaml

    from paretolab.results.interaction import interaction
    from paretolab.stores.locations import resolve_stores
    from tests.conftest import run_cli

    spec = {"name": "pxq", "model": "tiny-llama", "task": {"name": "perplexity", "corpus": "pystdlib-val", "max_tokens": 512, "context": 64, "stride": 64},
            "stages": [{"choice": [{"method": "magnitude", "params": {"sparsity": 0.6}}, {"method": "none"}]},
                       {"choice": [{"method": "rtn", "params": {"bits": 2, "group_size": 32}}, {"method": "none"}]}],
            "objectives": [{"metric": "ppl"}, {"metric": "size_bytes"}], "search": {"sampler": "grid", "trials": 4, "seed": 0},
            "resources": {"cpus": 1}, "measures": ["size", "params"]}
    (tmp_path / "pxq.yaml").write_text(yaml.safe_dump(spec))
    run_cli("run", "pxq.yaml", "--address", ray_head, "--no-progress", cwd=tmp_path)
    stores = resolve_stores(home=str(tmp_path / ".paretolab"), create=False)
    ppl, size = interaction("pxq", stores, "magnitude", "rtn", ["ppl", "size_bytes"])
    v = ppl.values
    assert ppl.term == pytest.approx(math.log(v["A+B"]) - math.log(v["A"]) - math.log(v["B"]) + math.log(v["base"]))
    assert ppl.n == 8 and ppl.low < ppl.term < ppl.high
    assert size.low is None and size.reading.startswith("no interval")
    assert size.values["A+B"] < min(size.values["A"], size.values["B"])
    said = run_cli("interaction", "pxq", "--a", "magnitude", "--b", "rtn", cwd=tmp_path).stdout
    assert "magnitude+rtn" in said and f"{ppl.term:+.4f}" in said and "8 windows, paired" in said


def test_document_extras_are_checked_and_a_sensitivity_run_renders_its_ranked_table(tmp_path):
    import json

    from paretolab.results.extras import check_extras, sensitivity_section

    with pytest.raises(ConfigError, match=r"extras\[0\]\.interaction: 'other' is not among the document's studies"):
        check_extras([{"interaction": "other", "a": "x", "b": "y"}], ("mine",), "doc")
    with pytest.raises(ConfigError, match=r"extras\[0\]: unknown field 'metric'"):
        check_extras([{"sensitivity": "p", "metric": "ppl"}], (), "doc")
    data = {"model": "m", "method": "rtn", "params": {"bits": 3}, "metric": "ppl", "base": 18.2, "base_size": 5.4e8, "windows": 8,
            "task": {"corpus": "pydoc", "max_tokens": 2048},
            "groups": [{"group": "7", "modules": 7, "metric": 18.3, "delta": 0.1, "low": -0.05, "high": 0.2, "bytes_saved": 1.2e7, "per_mb": 0.0083},
                       {"group": "0", "modules": 7, "metric": 21.6, "delta": 3.4, "low": 2.3, "high": 4.8, "bytes_saved": 1.2e7, "per_mb": 0.28}]}
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "sens.json").write_text(json.dumps(data))
    (tmp_path / "results" / "sens.png").write_bytes(b"png")
    text = sensitivity_section(tmp_path / "results" / "sens", tmp_path / "pipelines" / "LAYERS.md")
    assert "](../results/sens.png)" in text
    assert text.index("| 1 | 7 |") < text.index("| 2 | 0 |") and "| yes |" in text.split("| 1 | 7 |")[1].splitlines()[0]


def test_a_relative_metric_needs_only_b_and_a_plus_b_and_resamples_each_trials_prompts_apart():
    from paretolab.results.interaction import unpaired_term

    rows = [{"method": "speculative", "trial": 1}, {"method": "rtn+speculative", "trial": 0}]
    assert {k: v["trial"] for k, v in arms_of(rows, "rtn", "speculative", "s", relative=True).items()} == {"B": 1, "A+B": 0}
    with pytest.raises(ConfigError, match="A relative metric needs B alone and A"):
        arms_of(rows[1:], "rtn", "speculative", "s", relative=True)
    with pytest.raises(ConfigError, match=r"no complete trial of base \(none\)"):
        arms_of(rows, "rtn", "speculative", "s")  # not relative: the four arms
    rng = np.random.default_rng(1)

    def speedups(center, n=8):
        return Samples(rng.normal(center, 0.05, n), np.ones(n), False, "prompt")

    low, high, n = unpaired_term(speedups(2.0), speedups(1.0, 6))  # B doubles the base's speed, only 1x on A's target
    assert n == 6 and low < math.log(0.5) < high and high < 0, "half the speedup on the quantized target: beyond noise"
    low, high, _ = unpaired_term(speedups(2.0), speedups(2.0))
    assert low < 0 < high, "the same speedup on both targets: no interaction"


def test_per_prompt_figures_weigh_to_the_trials_ratios_of_sums():
    import json

    from paretolab.generation import Generation
    from paretolab.plugins.speculative import per_prompt_json
    from paretolab.stats import samples

    def gen(tokens, seconds, accepted=1.0):
        return Generation(sequences=[list(range(tokens + 1))], tokens_total=tokens + 1, tokens_sequential=tokens + 1, prefill_s=0.01, decode_s=seconds,
                          stats={"mean_accepted_len": accepted})

    spec = [gen(10, 0.5, 2.0), gen(20, 2.0, 1.5), gen(30, 1.0, 3.0)]
    greedy = [gen(10, 1.0), gen(20, 1.0), gen(30, 3.0)]
    rates, accepted = (json.loads(part) for part in per_prompt_json(spec, greedy))
    spec_rate = samples(rates, "spec_decode_tok_s").value()
    assert spec_rate == pytest.approx(60 / 3.5), "the spec rate over all prompts: tokens / seconds"
    assert samples(rates, "speedup_vs_greedy").value() == pytest.approx((60 / 3.5) / (60 / 5.0)), "the speedup: a ratio of sums"
    assert samples(accepted, "mean_accepted_len").value() == pytest.approx((2.0 + 1.5 + 3.0) / 3)

"""Which trials a claim pairs: replicates and shared settings, brackets, a method's own parameters, one group per setting."""

from __future__ import annotations


def test_pairs_need_the_same_shared_parameters_and_ambiguous_seeds_are_counted_not_guessed():
    from paretolab.results.pairing import group_pairs
    from paretolab.study.report_spec import Claim

    claim = Claim("t", "val_loss", "kv_heads", "none", "lower", "seed")

    def trial(n, label, seed, lr, **own):
        return {"trial": n, "label": label, "val_loss": 3.0,
                "params": {"stage1.train.seed": seed, "stage1.train.lr": lr, **{f"stage0.kv_heads.{k}": v for k, v in own.items()}}}

    trials = [trial(0, "none", 0, 3e-3), trial(1, "none", 1, 3e-3), trial(2, "none", 0, 1e-3),
              trial(3, "kv_heads", 0, 3e-3, kv_heads=1),  # pairs with 0 (seed 0, lr 3e-3)
              trial(4, "kv_heads", 0, 1e-3, kv_heads=1), trial(5, "kv_heads", 0, 1e-3, kv_heads=2),  # two settings of the method's own kv_heads
              trial(6, "kv_heads", 2, 3e-3, kv_heads=1),  # no baseline on seed 2
              trial(7, "none", 1, 3e-3), trial(8, "kv_heads", 1, 3e-3, kv_heads=1), trial(9, "kv_heads", 1, 3e-3, kv_heads=1)]  # a duplicate
    groups, ambiguous = group_pairs(claim, trials)
    got = {g.label(): [(m["trial"], b["trial"]) for m, b in g.pairs] for g in groups}
    # lr (shared) and kv_heads (the method's own) vary: one group per setting, never pooled; the duplicate is counted, not guessed
    assert got == {"kv_heads=1, lr=0.001": [(4, 2)], "kv_heads=2, lr=0.001": [(5, 2)], "kv_heads=1, lr=0.003": [(3, 0)]}, got
    assert ambiguous == 1


def test_a_train_stage_chosen_against_none_pairs_on_the_shared_train_stage_seed():
    """mup_upscale's claim: s1 = train | none, then a fixed s3 train; the s1 train's own seed is not a pairing key."""
    from paretolab.results.claims import pair_trials
    from paretolab.study.report_spec import Claim

    claim = Claim("t", "val_loss", "train", "none", "lower", "train.seed")

    def trial(n, label, seed, parametrization):
        own = {"s1.train.seed": 0, "s1.train.tokens": 49152} if label == "train" else {}
        return {"trial": n, "label": label, "val_loss": 3.0 + n,
                "params": {**own, "s3.train.seed": seed, "mup_upscale.parametrization": parametrization}}

    trials = [trial(0, "train", 0, "mup"), trial(1, "train", 1, "mup"), trial(2, "train", 0, "sp"),
              trial(3, "none", 0, "mup"), trial(4, "none", 1, "mup"), trial(5, "none", 0, "sp")]
    pairs, ambiguous = pair_trials(claim, trials)
    assert sorted((m["trial"], b["trial"]) for m, b in pairs) == [(0, 3), (1, 4), (2, 5)] and ambiguous == 0


def test_two_methods_each_with_their_own_pair_by_parameter_pair_on_its_value():
    """The MoE claims: puzzle_moe.calib_seed against expert_drop.calib_seed (no stage both share) pair on the value."""
    from paretolab.results.claims import pair_trials
    from paretolab.study.report_spec import Claim

    def trial(n, label, seed, memory):
        return {"trial": n, "label": label, "ppl": 13.0 + n, "params": {f"stage0.{label}.calib_seed": seed, f"stage0.{label}.memory": memory}}

    trials = [trial(0, "puzzle_moe", 0, 0.5), trial(1, "puzzle_moe", 1, 0.5), trial(2, "puzzle_moe", 0, 0.75),
              trial(3, "expert_drop", 1, 0.5), trial(4, "expert_drop", 0, 0.5), trial(5, "expert_drop", 0, 0.75)]
    claim = Claim("t", "ppl", "puzzle_moe[memory=0.5]", "expert_drop[memory=0.5]", "lower", "calib_seed")
    assert sorted((m["trial"], b["trial"]) for m, b in pair_trials(claim, trials)[0]) == [(0, 4), (1, 3)]


def test_a_label_in_brackets_selects_trials_by_the_methods_own_parameter():
    """A baseline that is a parameter of the method (tetrajet's recipe: naive) is named as ``tetrajet[recipe=naive]``."""
    from paretolab.results.claims import pair_trials
    from paretolab.study.report_spec import Claim

    def trial(n, label, seed, **own):
        return {"trial": n, "label": label, "val_loss": 3.0, "params": {"stage1.train.seed": seed, **{f"stage0.{label}.{k}": v for k, v in own.items()}}}

    trials = [trial(0, "tetrajet", 0, recipe="tetrajet"), trial(1, "tetrajet", 0, recipe="naive"), trial(2, "none", 0),
              trial(3, "tetrajet", 1, recipe="tetrajet"), trial(4, "tetrajet", 1, recipe="naive"), trial(5, "none", 1)]
    claim = Claim("t", "val_loss", "tetrajet[recipe=tetrajet]", "tetrajet[recipe=naive]", "lower", "seed")
    assert [(m["trial"], b["trial"]) for m, b in pair_trials(claim, trials)[0]] == [(0, 1), (3, 4)]
    against_none = Claim("t", "val_loss", "tetrajet[recipe=naive]", "none", "lower", "seed")
    assert [(m["trial"], b["trial"]) for m, b in pair_trials(against_none, trials)[0]] == [(1, 2), (4, 5)]
    unqualified = Claim("t", "val_loss", "tetrajet", "none", "lower", "seed")
    from paretolab.results.pairing import group_pairs
    groups = group_pairs(unqualified, trials)[0]  # two tetrajet trials per seed: one verdict per recipe, not pooled
    assert {g.label(): [(m["trial"], b["trial"]) for m, b in g.pairs] for g in groups} == {"recipe=naive": [(1, 2), (4, 5)], "recipe=tetrajet": [(0, 2), (3, 5)]}


def test_same_method_on_both_sides_also_pairs_on_its_parameters_no_bracket_names():
    """layerdrop[score=greedy_bi] vs layerdrop[score=random] over k and seed: pairs at the same k and seed."""
    from paretolab.results.claims import pair_trials
    from paretolab.study.report_spec import Claim

    def trial(n, score, k, seed):
        return {"trial": n, "label": "layerdrop", "ppl": 50.0, "params": {f"stage0.layerdrop.{p}": v for p, v in (("score", score), ("k", k), ("seed", seed))}}

    trials = [trial(i, score, k, seed) for i, (score, k, seed) in enumerate(
        (s, k, seed) for k in (21, 23) for seed in (0, 1) for s in ("greedy_bi", "random"))]
    claim = Claim("t", "ppl", "layerdrop[score=greedy_bi]", "layerdrop[score=random]", "lower", "seed")
    pairs, ambiguous = pair_trials(claim, trials)
    assert ambiguous == 0
    assert sorted((m["params"]["stage0.layerdrop.k"], m["params"]["stage0.layerdrop.seed"], m["trial"] + 1 == b["trial"]) for m, b in pairs) == [
        (21, 0, True), (21, 1, True), (23, 0, True), (23, 1, True)]


def test_a_baseline_without_replicates_pairs_with_every_draw_of_the_method():
    """wanda_vs_magnitude: Wanda on three calibration draws, magnitude pruning (no calibration) once per sparsity."""
    from paretolab.results.pairing import group_pairs
    from paretolab.study.report_spec import Claim

    claim = Claim("t", "ppl", "wanda", "magnitude", "lower", "calib_seed")

    def trial(n, label, sparsity, **extra):
        return {"trial": n, "label": label, "ppl": 30.0 + n, "params": {f"{label}.sparsity": sparsity, **{f"{label}.{k}": v for k, v in extra.items()}}}

    trials = [trial(n, "wanda", s, calib_seed=c) for n, (s, c) in enumerate((s, c) for s in (0.3, 0.5) for c in (0, 1, 2))]
    trials += [trial(6, "magnitude", 0.3, scope="row"), trial(7, "magnitude", 0.5, scope="row")]
    groups, ambiguous = group_pairs(claim, trials)
    got = {g.label(): [(m["trial"], b["trial"]) for m, b in g.pairs] for g in groups}
    assert got == {"sparsity=0.3": [(0, 6), (1, 6), (2, 6)], "sparsity=0.5": [(3, 7), (4, 7), (5, 7)]}, got
    assert ambiguous == 0
    trials[6]["params"]["magnitude.calib_seed"] = 0  # a baseline that has draws pairs on them: only calib_seed 0 now
    got = [[(m["trial"], b["trial"]) for m, b in g.pairs] for g in group_pairs(claim, trials)[0]]
    assert got == [[(0, 6)]], got  # the magnitude trial without a draw (7) has no replicate to pair on

"""A confirm split: the search never scores the confirm part; `pick` re-measures its choice there and judges the rule again."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from paretolab.errors import ConfigError
from paretolab.plugin_api.examples import ExampleSplit

TASK = {"name": "perplexity", "corpus": "pystdlib-val", "max_tokens": 1024, "context": 64, "stride": 64}  # 16 windows


def test_the_parts_are_disjoint_cover_every_example_and_are_fixed_by_the_seed():
    search, confirm = ExampleSplit(0.5, 3).indices(16), ExampleSplit(0.5, 3, "confirm").indices(16)
    assert len(confirm) == 8 and not set(search) & set(confirm) and sorted(search + confirm) == list(range(16))
    assert ExampleSplit(0.5, 3, "confirm").indices(16) == confirm != ExampleSplit(0.5, 4, "confirm").indices(16)
    assert len(ExampleSplit(0.25, 0, "confirm").indices(12)) == 3
    with pytest.raises(ConfigError, match="2 window.* cannot be split.*evaluate more windows"):
        ExampleSplit(0.9, 0).indices(2, "window")


def test_search_time_perplexity_never_reads_a_confirm_window(tiny, ctx):
    """The model sees only search windows; each scored window is the very window the unsplit task scores."""
    from paretolab.plugin_api.options import parse_options
    from paretolab.plugin_api.manager import registries
    from paretolab.stats import ARTIFACT

    task = registries().tasks.get("perplexity")
    options = parse_options(task.options, {k: v for k, v in TASK.items() if k != "name"}, where="task")
    seen: list[torch.Tensor] = []
    tiny.model.register_forward_pre_hook(lambda _, args, kwargs: seen.append(kwargs["input_ids"].clone()), with_kwargs=True)
    whole = task.evaluate(tiny, options, ctx)
    every = torch.cat(seen)
    per_window = json.loads((ctx.workdir / ARTIFACT).read_text())["scores"]["nll"]
    for part in ("search", "confirm"):
        seen.clear()
        ctx.split, ctx.examples_used, ctx.workdir = ExampleSplit(0.5, 0, part), "", ctx.workdir.parent / part  # a fresh artifact
        scored = task.evaluate(tiny, options, ctx)
        kept = ExampleSplit(0.5, 0, part).indices(16)
        assert torch.equal(torch.cat(seen), every[kept]), f"the {part} part read windows outside it"
        assert scored["n_windows"] == 8  # and the trial records which windows its part holds
        assert ctx.examples_used == f"{part} part: 8 of 16 windows (confirm share 0.5, seed 0): windows {','.join(map(str, kept))}"
        mine = json.loads((ctx.workdir / ARTIFACT).read_text())["scores"]["nll"]
        assert mine == pytest.approx([per_window[i] for i in kept], rel=1e-5)
    assert whole["n_windows"] == 16


def test_a_confirm_block_is_validated_with_the_pipeline():
    from paretolab.study.spec import parse_spec

    raw = {"name": "c", "model": "tiny-llama", "task": TASK, "stages": [{"method": "none"}],
           "objectives": [{"metric": "ppl"}], "search": {"sampler": "grid", "trials": 1}}
    assert parse_spec({**raw, "confirm": {"share": 0.5, "seed": 2}}).confirm == {"share": 0.5, "seed": 2}
    assert parse_spec(raw).confirm is None
    for bad, message in (({"share": 1.5}, r"confirm.share: .* at most 0.9; got 1.5"), ({"seed": -1}, r"confirm.seed"),
                         ({"part": "x"}, r"confirm.part"), ("half", r"confirm: expected a mapping")):
        with pytest.raises(ConfigError, match=message):
            parse_spec({**raw, "confirm": bad})
    arith = {**raw, "task": {"name": "arithmetic", "limit": 4}, "objectives": [{"metric": "acc"}]}
    with pytest.raises(ConfigError, match=r"the task 'arithmetic' does not split its examples.*perplexity"):
        parse_spec({**arith, "confirm": {"share": 0.5}})


@pytest.mark.ray
def test_pick_confirms_its_choice_on_the_part_the_search_never_scored(tmp_path, ray_head, monkeypatch):
    """A study with a confirm split: every trial scored 8 of 16 windows; pick re-applies the choice and the baseline and
    scores the other 8, as an evaluation of those windows alone would (the tiny model is at chance: its chance level is
    set aside here, the mechanics are what is checked)."""
    import paretolab
    from paretolab.results import decision_record, metric_facts
    from tests.conftest import run_cli

    spec = {"name": "cf", "model": "tiny-llama", "task": TASK, "confirm": {"share": 0.5, "seed": 1},
            "stages": [{"choice": [{"method": "none"}, {"method": "rtn", "params": {"bits": [2, 8], "group_size": 32}}]}],  # random weights: 2 bits keep ppl
            "objectives": [{"metric": "ppl"}, {"metric": "size_bytes"}], "measures": ["size", "params"],
            "search": {"sampler": "grid", "trials": 3, "seed": 0, "trial_timeout_s": 300}, "resources": {"cpus": 1}}
    (tmp_path / "cf.yaml").write_text(yaml.safe_dump(spec))
    run_cli("run", "cf.yaml", "--address", ray_head, "--no-progress", cwd=tmp_path)
    frames = paretolab.load_study("cf", home=str(tmp_path / ".paretolab")).trials
    assert set(frames["n_windows"]) == {8.0}  # the search scored its part only
    monkeypatch.setattr(metric_facts, "vocabulary", lambda *a, **k: None)  # tiny-llama is at chance: judge it anyway
    from paretolab.stores.locations import resolve_stores

    stores = resolve_stores(home=str(tmp_path / ".paretolab"), create=False)
    decision = paretolab.pick("cf", keep="ppl no_worse 10 % vs none", where="size_bytes <= 0.6 x none", stores=stores,
                              progress=lambda _: None)
    assert decision.choice is not None and decision.choice.name() == "rtn[bits=2]", decision_record.decision_lines(decision)
    conf = decision.confirmation
    assert conf is not None and conf.examples == "confirm part: 8 of 16 windows (confirm share 0.5, seed 1)"
    again = conf.candidates["rtn[bits=2]"]
    assert again.trials[0]["n_windows"] == 8 and again.quality != decision.choice.quality  # other windows, another value
    assert again.low is not None and again.low <= again.difference <= again.high
    text = "\n".join(decision_record.decision_lines(decision))
    assert "**On the confirm part** (confirm part: 8 of 16 windows" in text and "search part: ×" in text
    assert "smallest difference the confirm part could detect" in text
    assert json.loads(json.dumps(decision_record.decision_record(decision)))["confirmation"]["candidates"]["rtn[bits=2]"]["trials"]


def test_a_calibrated_method_is_confirmed_on_fresh_calibration_draws():
    from paretolab.api.confirm import FRESH_DRAWS, fresh_draws

    params = {"stage0.method": "gptq", "stage0.gptq.calib_seed": 2, "stage0.gptq.bits": 4, "seed": 3}
    assert fresh_draws(params) == {**params, "stage0.gptq.calib_seed": 2 + FRESH_DRAWS}  # the trial's own seed stays
    assert fresh_draws({"stage0.method": "rtn", "stage0.rtn.bits": 4}) == {"stage0.method": "rtn", "stage0.rtn.bits": 4}

"""What docs/plugins.md says of the code, checked against the code: rtn's grid and its whole-row group, the order in
which a per-layer stage transforms its groups, and how a calibrated method pairs with an uncalibrated baseline."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
import torch

from paretolab import Method

ROOT = Path(__file__).resolve().parents[2]
GUIDE = " ".join((ROOT / "docs" / "plugins.md").read_text(encoding="utf-8").split())  # line breaks undone


def _numbers(text: str) -> list[int]:
    return [int(n.replace("−", "-")) for n in re.findall(r"[−-]?\d+", text)]


def test_the_guide_gives_rtns_grid_as_the_method_searches_it():
    from paretolab.plugins.baselines import RTN

    said = re.search(r"it searches `bits` over ([\d, ]+) and `group_size` over ([\d, −-]+) \(defaults (\d+) and (\d+);", GUIDE)
    assert said, "the guide no longer states rtn's grid"
    space, defaults = RTN().search_space(), RTN().defaults()
    assert _numbers(said[1]) == list(space["bits"].choices) and _numbers(said[2]) == list(space["group_size"].choices)
    assert [int(said[3]), int(said[4])] == [defaults["bits"], defaults["group_size"]]


def test_a_whole_row_group_is_recorded_as_the_rows_width():
    """rtn's group_size -1 records group_size = the row's width; -1 itself in set_storage would count fewer bytes."""
    import paretolab
    from paretolab.plugin_api.storage import TensorStorage

    assert "A whole row as one group is `group_size=weight.shape[1]`" in GUIDE
    ran = paretolab.apply("tiny-llama", "rtn", bits=4, group_size=-1)
    weights = dict(ran.subject.model.named_parameters())
    records = ran.subject.current_storage()
    assert records and all(r.group_size == weights[name].shape[1] for name, r in records.items()), records
    weight = next(iter(weights[name] for name in records))
    row, wrong = TensorStorage(value_bits=4, group_size=weight.shape[1]), TensorStorage(value_bits=4, group_size=-1)
    assert wrong.nbytes(weight) < TensorStorage(value_bits=4).nbytes(weight) < row.nbytes(weight)  # why the guide warns


class Recorder(Method):
    """Records each scope it is called with, in order."""

    name = "scope_recorder"
    layerwise = True

    def __init__(self):
        self.seen: list[list[str]] = []

    def transform(self, subject, params, ctx):
        self.seen.append(sorted({m.split(".")[2] for m in subject.scope}))  # the layer numbers of the group
        return subject


def test_per_layer_groups_run_in_the_models_order_whatever_the_pipelines_order():
    from paretolab.models import load_subject
    from paretolab.plugin_api.context import TrialContext
    from paretolab.records import StagePlan
    from paretolab.study.layered import apply_by_layer

    assert "**The order of the groups is the model's**, not the pipeline's" in GUIDE
    method, ctx = Recorder(), TrialContext(seed=0, workdir=Path(tempfile.mkdtemp(prefix="guide-layers-")))
    subject = load_subject("tiny-llama").copy()  # two decoder layers
    apply_by_layer(method, subject, StagePlan("s0", method.name, {}, {"1": {}, "0": {}}), ctx)  # listed last layer first
    assert method.seen == [["0"], ["1"]]
    method.seen.clear()
    apply_by_layer(method, subject, StagePlan("s0", method.name, {}, {"1": {}}), ctx)  # layer 0 left to rest: it runs first
    assert method.seen == [["0"], ["1"]]
    method.seen.clear()
    apply_by_layer(method, subject, StagePlan("s0", method.name, {}, {"1": {}, "rest": None}), ctx)  # rest: keep is skipped
    assert method.seen == [["1"]]


def _trial(n, label, ppl, **params):
    seed = next((v for k, v in params.items() if k.endswith("calib_seed")), None)
    return {"trial": n, "label": label, "ppl": ppl, "params": params,
            "run_params": {"info.calibration_draws": f"pydoc:{seed}:32"} if seed is not None else {}}


@pytest.mark.parametrize("replicates", [("calib_seed",), ()], ids=["named", "none"])
def test_a_calibrated_method_pairs_with_an_uncalibrated_baseline_as_the_guide_says(replicates):
    from paretolab.results.claims import verdict_rows
    from paretolab.study.report_spec import Claim

    trials = [_trial(s, "gptq", 15.0 + 0.1 * s, **{"gptq.calib_seed": s, "gptq.bits": 4}) for s in range(3)]
    trials.append(_trial(3, "rtn", 16.0, **{"rtn.bits": 4}))
    rows = verdict_rows([Claim("t", "ppl", "gptq", "rtn", "lower", replicates, scale="log")], trials)
    if replicates:  # the baseline's one trial pairs with every draw: three pairs, one verdict
        assert "replicates: [calib_seed]" in GUIDE and "pairs with the method's trial of every draw" in GUIDE
        assert [(r["trials"], r["verdict"]) for r in rows] == [([(0, 3), (1, 3), (2, 3)], "held")]
    else:  # each draw a setting of its own, on one pair: no verdict
        said = "no verdict: one calibration draw on the method's side"
        assert said in GUIDE and len(rows) == 3 and all(r["verdict"].startswith(said) and len(r["trials"]) == 1 for r in rows)

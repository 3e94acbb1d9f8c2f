"""Hooks run in stage order (end_of_training reversed); loss/data have one owner; the loop calls every event."""

from __future__ import annotations

import pytest
import torch

from paretolab.errors import ConfigError
from paretolab.plugin_api.manager import registries
from paretolab.training import TrainingHook, training_of
from tests.training.conftest import make_ctx

EVENTS = ("convert_model", "param_groups", "before_step", "after_backward", "after_step", "end_of_training")


class Recorder(TrainingHook):
    def __init__(self, log: list, tag: str) -> None:
        self.log, self.tag = log, tag

    def convert_model(self, model, state):
        self.log.append(("convert_model", self.tag))

    def param_groups(self, groups, state):
        self.log.append(("param_groups", self.tag))

    def before_step(self, state):
        self.log.append(("before_step", self.tag))

    def after_backward(self, state):
        self.log.append(("after_backward", self.tag))

    def after_step(self, state):
        self.log.append(("after_step", self.tag))

    def end_of_training(self, state):
        self.log.append(("end_of_training", self.tag))


def test_hooks_run_in_stage_order_and_end_of_training_in_reverse(tiny, small, tmp_path):
    log: list = []
    record = training_of(tiny)
    for tag in ("first", "second", "third"):
        record.attach(Recorder(log, tag), method=tag)
    registries().methods.get("train").transform(tiny, {**small, "tokens": 2 * 8 * 32}, make_ctx(tmp_path))
    for event in EVENTS:
        tags = [t for e, t in log if e == event]
        per_call = tags[:3]
        assert per_call == (["third", "second", "first"] if event == "end_of_training" else ["first", "second", "third"]), event
    assert [t for e, t in log if e == "before_step"] == ["first", "second", "third"] * 2  # two steps


class OwnLoss(TrainingHook):
    replaces = ("loss",)

    def __init__(self) -> None:
        self.calls = 0

    def loss(self, model, batch, state):
        self.calls += 1
        logits = model(input_ids=batch[:, :-1]).logits
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)) * 0.5


def test_a_second_loss_owner_is_refused_naming_both_methods(tiny):
    record = training_of(tiny)
    record.attach(OwnLoss(), method="distill")
    with pytest.raises(ConfigError, match=r"methods 'distill' and 'z_loss' both replace the training loss"):
        record.attach(OwnLoss(), method="z_loss")


def test_the_loss_and_data_owners_replace_the_defaults(tiny, small, tmp_path):
    class OwnData(TrainingHook):
        replaces = ("data",)

        def data(self, state):
            gen = torch.Generator().manual_seed(1)
            while True:
                yield torch.randint(0, 200, (2, 17), generator=gen).to(state.device)

    loss, data = OwnLoss(), OwnData()
    record = training_of(tiny)
    record.attach(loss, method="own_loss")
    record.attach(data, method="own_data")
    registries().methods.get("train").transform(tiny, {**small, "tokens": 3 * 2 * 16, "seq_len": 16, "batch": 2}, make_ctx(tmp_path))
    assert loss.calls == 3
    assert record.tokens == 3 * 2 * 16  # the owner's (2, 17) windows, not the stage's batch

"""A hook that adds parameters mid-stage asks the loop to rebuild AdamW; old moments are carried, the new parameter trains."""

from __future__ import annotations

import torch

from paretolab.plugin_api.manager import registries
from paretolab.training import TrainingHook, training_of
from tests.training.conftest import make_ctx


class AddBiasAtStep(TrainingHook):
    """At step ``at`` give the final norm a new trainable parameter that shifts its output."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.seen: dict[str, torch.Tensor] = {}
        self.opt_params: list[int] = []

    def before_step(self, state):
        if state.step == self.at:
            norm = state.model.model.norm
            self.seen = {n: state.optimizer.state[p]["exp_avg"].clone() for n, p in state.model.named_parameters() if p in state.optimizer.state}
            norm.shift = torch.nn.Parameter(torch.zeros(norm.weight.shape, device=norm.weight.device))
            norm.register_forward_hook(lambda m, i, out: out + m.shift)
            state.rebuild_optimizer = True

    def after_backward(self, state):
        if state.step == self.at:  # the optimizer this step uses: rebuilt, with the new parameter and the old moments
            params = {id(p) for g in state.optimizer.param_groups for p in g["params"]}
            self.opt_params = [id(p) for p in state.model.parameters() if id(p) in params]
            by_name = dict(state.model.named_parameters())
            for name, moment in self.seen.items():
                assert torch.equal(state.optimizer.state[by_name[name]]["exp_avg"], moment), name
            assert by_name["model.norm.shift"] not in state.optimizer.state


def test_loop_rebuilds_the_optimizer_when_a_hook_asks(tiny, small, tmp_path):
    hook = AddBiasAtStep(at=2)
    training_of(tiny).attach(hook, method="grow")
    registries().methods.get("train").transform(tiny, {**small, "tokens": 4 * 8 * 32}, make_ctx(tmp_path))
    assert hook.seen, "the hook never saw step 2"
    shift = tiny.model.model.norm.shift
    assert id(shift) in hook.opt_params  # the rebuilt optimizer holds the new parameter ...
    assert torch.count_nonzero(shift.detach()) > 0  # ... and trained it
    assert "model.norm.shift" in training_of(tiny).optimizer_state  # its moments are saved for a later stage

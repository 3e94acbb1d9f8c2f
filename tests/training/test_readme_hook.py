"""The plugin guide's training-time method example (docs/plugins.md, section 9) runs as written: its hook owns the loss of a real train stage."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from paretolab.errors import ConfigError
from paretolab.training import TrainingHook, training_of
from tests.training.test_loop import train

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


def readme_example() -> dict:
    """Execute the first Python block under '### Writing a training-time method' and return its names."""
    section = GUIDE.read_text(encoding="utf-8").split("### Writing a training-time method", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    names: dict = {}
    exec(compile(code, "docs/plugins.md", "exec"), names)  # noqa: S102 - our own guide
    return names


def test_the_readme_hook_replaces_the_loss_of_a_train_stage_and_a_second_owner_is_refused(tiny, small, tmp_path):
    example = readme_example()
    method = example["ZLossMethod"]()
    subject = method.transform(tiny, {"weight": 1e-2}, None)
    hook = training_of(subject).owner("loss")
    assert type(hook).__name__ == "ZLoss" and hook.method == "z_loss"
    calls = []
    original = hook.loss
    hook.loss = lambda model, batch, state: calls.append(state.step) or original(model, batch, state)
    subject = train(subject, {**small, "tokens": 1024}, tmp_path)
    assert calls == [0, 1, 2, 3]  # the hook computed every step's loss (4 steps of 8 x 32 tokens)
    assert math.isfinite(subject.training.metrics["val_loss"])

    class OtherLoss(TrainingHook):
        replaces = ("loss",)

    with pytest.raises(ConfigError, match="methods 'z_loss' and 'other' both replace the training loss"):
        training_of(subject).attach(OtherLoss(), method="other")

"""The method contract suite on the train stage (a few steps on tiny-llama)."""

from __future__ import annotations

import pytest

from paretolab.testing import MethodContract
from paretolab.training.method import Train


class TestTrainContract(MethodContract):
    @pytest.fixture
    def method(self):
        return Train()

    @pytest.fixture
    def params(self, method, train_text):
        return {**method.defaults(), "tokens": 512, "seq_len": 32, "batch": 4, "eval_every": 2, "eval_tokens": 256, "corpus": train_text}

"""The contract suite catches a non-causal method and a saving that changes nothing (unless declared lossless)."""

from __future__ import annotations

import pytest
import torch

from paretolab import Method
from paretolab.testing import MethodContract


class PeeksAhead(Method):
    """Adds the mean over the whole sequence's hidden states to each position: position t reads tokens after t."""

    name = "peeks_ahead"

    def transform(self, subject, params, ctx):
        norm = subject.model.model.norm

        def hook(module, inputs, output):
            return output + output.mean(dim=1, keepdim=True)

        norm.register_forward_hook(hook)
        return subject


def _claims_four_bits(subject):
    for name, module in subject.model.named_modules():
        if isinstance(module, torch.nn.Linear) and "lm_head" not in name:
            subject.set_storage(f"{name}.weight", value_bits=4, group_size=32, scale_bits=16)


class ClaimsOnly(Method):
    """Reports 4-bit weights but leaves them as they are: a saving on paper, the base model's output."""

    name = "claims_only"

    def transform(self, subject, params, ctx):
        _claims_four_bits(subject)
        return subject


class Lossless(ClaimsOnly):
    name = "lossless_claim"
    lossless = True


class FalselyLossless(Method):
    name = "falsely_lossless"
    lossless = True

    def transform(self, subject, params, ctx):
        with torch.no_grad():
            subject.model.model.layers[0].mlp.up_proj.weight.mul_(0.5)
        return subject


@pytest.fixture
def contract():
    return MethodContract()


def test_a_method_that_reads_later_tokens_fails_the_causality_check(contract, tiny, ctx):
    with pytest.raises(AssertionError, match="when tokens are appended"):
        contract.test_is_causal(PeeksAhead(), tiny, {}, ctx)


def test_real_methods_are_causal(contract, tiny, ctx):
    from paretolab.plugin_api.manager import registries

    for name, params in (("rtn", {"bits": 4, "group_size": 32}), ("magnitude", {"sparsity": 0.5, "scope": "row"})):
        contract.test_is_causal(registries().methods.get(name), tiny, params, ctx)


def test_a_saving_with_the_base_model_s_output_fails(contract, tiny, ctx):
    with pytest.raises(AssertionError, match="while computing exactly the base model's output"):
        contract.test_a_saving_changes_what_it_saves(ClaimsOnly(), tiny, {}, ctx)


def test_a_declared_lossless_saving_passes_and_a_false_claim_fails(contract, tiny, ctx):
    contract.test_a_saving_changes_what_it_saves(Lossless(), tiny, {}, ctx)
    with pytest.raises(AssertionError, match="declared lossless, but its output differs"):
        contract.test_a_saving_changes_what_it_saves(FalselyLossless(), tiny, {}, ctx)


def test_a_real_saving_passes(contract, tiny, ctx):
    from paretolab.plugin_api.manager import registries

    contract.test_a_saving_changes_what_it_saves(registries().methods.get("rtn"), tiny, {"bits": 4, "group_size": 32}, ctx)

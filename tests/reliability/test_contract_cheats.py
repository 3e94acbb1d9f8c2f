"""The contract suite catches the three cost cheats of issue 69 in a GPTQ-style quantizer, and reads what a method
declares about itself from the method.

An honest round-to-nearest quantizer (group scales, ``bits`` searched, lossless at 16 bits, ``cost_is = "simulated"``)
passes the whole suite. Three variants of it each plant one cheat that the suite used to pass: one ignores ``bits``
(8-bit quality at 2-bit size on the frontier), one changes the outputs at its declared lossless setting, and one
reports fewer bytes than its weights' distinct values need. Each fails with a message naming the cheat.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from optuna.distributions import CategoricalDistribution

from paretolab import Method, Subject, TrialContext
from paretolab.plugin_api.layers import linear_modules
from paretolab.testing import MethodContract, needed_bits, size_shortfalls


def round_to_nearest(weight: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """Symmetric RTN with one absmax scale per ``group`` input channels (what GPTQ rounds to, without its updates)."""
    rows, cols = weight.shape
    grouped = weight.reshape(rows, cols // group, group)
    qmax = 2 ** (bits - 1) - 1
    scale = grouped.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / qmax
    return (torch.clamp(torch.round(grouped / scale), -qmax - 1, qmax) * scale).reshape(rows, cols)


class HonestQuant(Method):
    """Quantizes every Linear but the LM head to ``bits`` with a 16-bit scale per group, and says so."""

    name = "honest_quant"
    kind = "weights"
    cost_is = "simulated"
    works_on = ("linear",)
    lossless_setting = {"bits": 16}

    def search_space(self) -> dict[str, Any]:
        return {"bits": CategoricalDistribution([2, 3, 4, 8]), "group_size": CategoricalDistribution([16, 32])}

    def defaults(self) -> dict[str, Any]:
        return {"bits": 4, "group_size": 32}

    def quantized_bits(self, bits: int) -> int:
        """The bits the weights are rounded to."""
        return bits

    def reported_bits(self, bits: int) -> int:
        """The bits ``size_bytes`` is told each weight takes."""
        return bits

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        bits, group = int(p["bits"]), int(p["group_size"])
        for name, layer in linear_modules(subject.model):
            with torch.no_grad():
                layer.weight.copy_(round_to_nearest(layer.weight, self.quantized_bits(bits), group))
            subject.set_storage(f"{name}.weight", value_bits=self.reported_bits(bits), group_size=group, scale_bits=16)
        return subject


class IgnoresBits(HonestQuant):
    """Cheat 1: always rounds to 8 bits, whatever ``bits`` says, and reports ``bits``: 8-bit quality at 2-bit size."""

    name = "ignores_bits"

    def quantized_bits(self, bits: int) -> int:
        return 8


class LossyAtSixteen(HonestQuant):
    """Cheat 2: declares ``{"bits": 16}`` lossless, but never rounds finer than 4 bits."""

    name = "lossy_at_sixteen"

    def quantized_bits(self, bits: int) -> int:
        return min(bits, 4)


class UnderReports(HonestQuant):
    """Cheat 3: rounds to ``bits`` but reports half of them (``cost_is = "simulated"``, which the size check used to skip)."""

    name = "under_reports"

    def reported_bits(self, bits: int) -> int:
        return max(1, bits // 2)


class Checks:
    """The contract's checks, called directly; a check that skips fails here (a skipped check passes every cheat)."""

    def __getattr__(self, name: str) -> Any:
        check = getattr(MethodContract(), name)

        def run(*args: Any) -> None:
            try:
                check(*args)
            except pytest.skip.Exception as skipped:
                pytest.fail(f"{name} skipped instead of judging: {skipped}")

        return run


@pytest.fixture
def contract() -> Checks:
    return Checks()


@pytest.fixture
def subject() -> Subject:
    from paretolab.models import TinyLlama

    return TinyLlama(layers=2, hidden=64).load()  # the contract's own subject


PARAMS = {"bits": 4, "group_size": 32}


class TestHonestQuantContract(MethodContract):
    """The honest quantizer passes the whole suite, with nothing declared here but the method."""

    @pytest.fixture(autouse=True)
    def _registered(self, register):
        register(HonestQuant())  # run_trial finds a stage's method by name

    @pytest.fixture
    def method(self) -> Method:
        return HonestQuant()


def test_the_honest_quantizer_passes_the_three_cost_checks(contract, subject, ctx):
    contract.test_every_parameter_changes_the_result(HonestQuant(), subject, PARAMS, ctx)
    contract.test_lossless_setting_keeps_the_output(HonestQuant(), subject, PARAMS, ctx)
    for bits in (2, 3, 4, 8):
        contract.test_size_covers_the_weights_information(HonestQuant(), subject, {**PARAMS, "bits": bits}, ctx)


def test_a_quantizer_that_ignores_its_bits_fails(contract, subject, ctx):
    with pytest.raises(AssertionError, match=r"bits=2 and bits=8 gave the same weights.*the method ignores 'bits'"):
        contract.test_every_parameter_changes_the_result(IgnoresBits(), subject, PARAMS, ctx)


def test_a_quantizer_that_changes_outputs_at_its_lossless_setting_fails(contract, subject, ctx):
    with pytest.raises(AssertionError, match=r"at its lossless setting \{'bits': 16\} the outputs changed by [0-9.e-]+ \(relative"):
        contract.test_lossless_setting_keeps_the_output(LossyAtSixteen(), subject, PARAMS, ctx)
    contract.test_every_parameter_changes_the_result(LossyAtSixteen(), subject, PARAMS, ctx)  # its other claims hold


def test_a_simulated_quantizer_that_under_reports_its_bytes_fails(contract, subject, ctx):
    assert UnderReports.cost_is == "simulated"
    with pytest.raises(AssertionError, match=r"reports \d+ bytes but its weights need at least \d+ \(distinct values per group\)") as caught:
        contract.test_size_covers_the_weights_information(UnderReports(), subject, PARAMS, ctx)
    assert "distinct values per group of 32: 4 bits each, 2 declared" in str(caught.value)
    with pytest.raises(AssertionError, match=r"at bits=\d it reports \d+ bytes but its weights need at least"):
        contract.test_every_parameter_changes_the_result(UnderReports(), subject, PARAMS, ctx)


def test_each_cheat_fails_only_its_own_check(contract, subject, ctx):
    """A cheat is named by the check it breaks, not by a side effect: where its other claims are true, the other checks
    pass it (ignoring bits is sized right at 8 bits; rounding to 4 bits is reported as such; under-reporting is still
    lossless at 16 bits)."""
    contract.test_size_covers_the_weights_information(IgnoresBits(), subject, {**PARAMS, "bits": 8}, ctx)
    contract.test_size_covers_the_weights_information(LossyAtSixteen(), subject, PARAMS, ctx)
    contract.test_lossless_setting_keeps_the_output(UnderReports(), subject, PARAMS, ctx)


def test_needed_bits_counts_distinct_values_per_group():
    from paretolab.plugin_api.storage import TensorStorage

    row = torch.tensor([[0.0, 1.0, 1.0, 2.0, 5.0, 5.0, 5.0, 5.0]])  # groups of 4: {0, 1, 2} then {5}
    assert needed_bits(row, TensorStorage(value_bits=2, group_size=4))[0] == 4 * 2 + 4 * 0
    assert needed_bits(row, TensorStorage(value_bits=2))[0] == 8 * 2  # one group per row: 4 distinct values
    assert needed_bits(row, TensorStorage(sparse=True))[0] == 7 * 2  # only the kept entries: {1, 2, 5}
    flat = torch.tensor([[1.0, 2.0], [1.0, 2.0]])
    assert needed_bits(flat, TensorStorage(value_bits=1, group_size=4, flat_groups=True))[0] == 4 * 1


def test_a_dense_model_has_no_shortfall(subject):
    short, reported, needed = size_shortfalls(subject)
    assert short == [] and reported == needed > 0


def test_what_a_method_is_lives_on_the_method():
    """UPipe and the identity declare that they preserve the output; no contract subclass under tests/ sets what a
    method is, or overrides a check of the suite."""
    import ast
    from pathlib import Path

    from paretolab.plugin_api.manager import registries

    methods = registries().methods
    assert methods.get("upipe").preserves_output and methods.get("none").preserves_output
    assert methods.get("rtn").lossless_setting == {"bits": 16} and methods.get("rtn").works_on == ("linear",)
    checks = {name for name in dir(MethodContract) if name.startswith("test_")}
    allowed = {"method", "subject", "params", "ctx"}  # choosing the method, its model and (for speed) its parameters
    found = []
    for path in sorted((Path(__file__).parents[1] / "plugins").rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        classes = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}

        def is_contract(node: ast.ClassDef) -> bool:
            names = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
            return any(n.endswith("MethodContract") or (n in classes and is_contract(classes[n])) for n in names)

        for node in filter(is_contract, classes.values()):
            for item in node.body:
                if isinstance(item, (ast.Assign, ast.AnnAssign)):
                    found.append(f"{path.name}:{item.lineno} {node.name} sets {ast.unparse(item)}")
                elif isinstance(item, ast.FunctionDef) and (item.name in checks or (item.name not in allowed and not item.name.startswith("_"))):
                    found.append(f"{path.name}:{item.lineno} {node.name} overrides {item.name}")
    assert not found, "declare these on the method, not in its contract's subclass:\n" + "\n".join(found)


def test_a_subclass_that_still_declares_changes_subject_is_told_where_it_goes(subject, ctx):
    from paretolab.plugin_api.method import NoMethod

    class Old(MethodContract):
        changes_subject = False

    with pytest.raises(AssertionError, match=r"declare it on the method instead \(NoMethod.preserves_output = True\)"):
        Old().test_changes_the_subject(NoMethod(), subject, {}, ctx)


# Built-in weights and architecture methods whose tests hold no contract subclass: the three cost checks run on them here
# (the others run them through their own contract classes under tests/plugins).
WITHOUT_A_CONTRACT_CLASS = ("absmean_ternary", "cat", "catq", "layerdrop", "psumquant")


@pytest.mark.parametrize("name", WITHOUT_A_CONTRACT_CLASS)
def test_built_in_quantizers_and_pruners_pass_the_cost_checks(name, contract, subject, ctx):
    from paretolab.plugin_api.manager import registries
    from paretolab.testing import sample_params
    from tests.plugins.test_device_contract import CHEAP

    method = registries().methods.get(name)
    params = {**sample_params(method, seed=0), **CHEAP.get(name, {})}
    contract.test_every_parameter_changes_the_result(method, subject, params, ctx)
    contract.test_size_covers_the_weights_information(method, subject, params, ctx)
    if method.lossless_setting:
        contract.test_lossless_setting_keeps_the_output(method, subject, params, ctx)

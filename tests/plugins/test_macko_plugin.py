"""macko: pruned Linears stored in the MACKO format, run from it, and sized by it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from paretolab import TrialContext
from paretolab.errors import ConfigError
from paretolab.kernels.macko import macko_spmv_ref
from paretolab.plugin_api.method import validate_method
from paretolab.plugin_api.metrics import Metric
from paretolab.plugin_api.subject import Subject
from paretolab.plugins import macko
from paretolab.plugins.baselines import Magnitude, linear_weights
from paretolab.plugins.macko import Macko, MackoLinear
from paretolab.plugins.wanda import Wanda
from paretolab.testing import MethodContract

CALIB_TEXT = "Sparse rows keep their largest scores; the format keeps four bits per step. " * 40


@pytest.fixture
def calib(tmp_path: Path) -> dict[str, object]:
    path = tmp_path / "calib.txt"
    path.write_text(CALIB_TEXT, encoding="utf-8")
    return {"calib_corpus": str(path), "calib_samples": 4, "calib_seq_len": 32}


def macko_layers(subject: Subject) -> dict[str, MackoLinear]:
    return {name: m for name, m in subject.model.named_modules() if isinstance(m, MackoLinear)}


def round_weights_to_fp16(subject: Subject) -> Subject:
    for _, layer in linear_weights(subject.model):
        with torch.no_grad():
            layer.weight.copy_(layer.weight.half().float())
    return subject


def test_registers_a_valid_real_cost_method_and_its_metric() -> None:
    methods: list[object] = []
    metrics: list[Metric] = []
    macko.register_methods(methods.append)
    macko.register_metrics(metrics.append)
    (method,) = methods
    validate_method(method, "paretolab.plugins.macko")
    assert method.name == "macko" and method.cost_is == "real"
    assert [m.name for m in metrics] == ["macko_bytes_ratio"]


def test_every_pruned_linear_keeps_only_macko_buffers(tiny: Subject, ctx: TrialContext, calib: dict[str, object]) -> None:
    subject = Macko().transform(tiny.copy(), {"sparsity": 0.5, **calib}, ctx)
    assert not list(linear_weights(subject.model))  # no dense Linear left inside the blocks
    layers = macko_layers(subject)
    assert len(layers) == 2 * 7
    for layer in layers.values():
        assert [n for n, _ in layer.named_parameters()] == []  # tiny-llama has no biases
        assert sorted(n for n, _ in layer.named_buffers()) == ["deltas", "row_ptr", "values"]
        assert layer.values.dtype == torch.float16 and layer.deltas.dtype == torch.uint8


@pytest.mark.parametrize("score", ["wanda", "magnitude"])
def test_output_equals_the_pruned_dense_model(tiny: Subject, ctx: TrialContext, calib: dict[str, object], score: str) -> None:
    params = {"sparsity": 0.6, "score": score, **calib}
    packed = Macko().transform(tiny.copy(), params, ctx)
    if score == "wanda":
        pruned = Wanda().transform(tiny.copy(), params, ctx)
    else:
        pruned = Magnitude().transform(tiny.copy(), {"sparsity": 0.6, "scope": "row"}, ctx)
    ids = torch.randint(0, 250, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = packed.model(input_ids=ids).logits
        same_weights = round_weights_to_fp16(pruned.copy()).model(input_ids=ids).logits
        fp32_weights = pruned.model(input_ids=ids).logits
    torch.testing.assert_close(out, same_weights, rtol=1e-5, atol=1e-5)  # only summation order differs
    torch.testing.assert_close(out, fp32_weights, rtol=0, atol=1e-2)  # fp16 rounding of the weights
    assert torch.isfinite(out).all()


def test_single_token_forward_matches_the_reference_spmv(tiny: Subject, ctx: TrialContext, calib: dict[str, object]) -> None:
    packed = Macko().transform(tiny.copy(), {"sparsity": 0.5, "score": "magnitude", **calib}, ctx)
    layer = next(iter(macko_layers(packed).values()))
    x = torch.randn(1, 1, layer.in_features)
    torch.testing.assert_close(layer(x), macko_spmv_ref(layer.fmt, x), rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # batch 1, one token: the decode step of generation
        logits = packed.model(input_ids=torch.tensor([[5]])).logits
    assert logits.shape == (1, 1, packed.model.config.vocab_size) and torch.isfinite(logits).all()


def test_bias_is_kept_and_added() -> None:
    linear = torch.nn.Linear(40, 24)
    with torch.no_grad():
        linear.weight[torch.rand(24, 40) < 0.7] = 0
    packed = MackoLinear.from_linear(linear)
    for x in (torch.randn(40), torch.randn(3, 5, 40)):
        torch.testing.assert_close(packed(x), linear(x), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("sparsity", [0.3, 0.5, 0.9])
def test_size_bytes_is_20_bits_per_padded_entry_plus_row_pointers(tiny: Subject, ctx: TrialContext, calib: dict[str, object], sparsity: float) -> None:
    subject = Macko().transform(tiny.copy(), {"sparsity": sparsity, "score": "magnitude", **calib}, ctx)
    for name, layer in macko_layers(subject).items():
        rows, cols = layer.out_features, layer.in_features
        padded = math.ceil(int(layer.row_ptr[-1]) / 8) * 8  # kept + gap-padding zeros, then to a multiple of 8
        nnz = rows * (cols - int(cols * sparsity))
        assert int(layer.row_ptr[-1]) >= nnz
        assert layer.nbytes == (20 * padded + 32 * (rows + 1)) // 8
        assert subject.storage_of(f"format:{name}").stored_bytes == layer.nbytes
    ratio = Macko().measure(subject, ctx)["macko_bytes_ratio"]
    assert ratio < 1.0
    if sparsity == 0.5:  # the format's best case, 1.25 x density, plus the row pointers of small matrices
        assert 0.625 <= ratio < 0.7


def test_bfloat16_values(tiny: Subject, ctx: TrialContext, calib: dict[str, object]) -> None:
    subject = Macko().transform(tiny.copy(), {"sparsity": 0.5, "score": "magnitude", "value_dtype": "bfloat16", **calib}, ctx)
    assert all(m.values.dtype == torch.bfloat16 for m in macko_layers(subject).values())
    with torch.no_grad():
        assert torch.isfinite(subject.model(input_ids=torch.arange(8)[None]).logits).all()


def test_the_copy_a_trial_gets_is_independent(tiny: Subject, ctx: TrialContext, calib: dict[str, object]) -> None:
    subject = Macko().transform(tiny.copy(), {"sparsity": 0.5, "score": "magnitude", **calib}, ctx)
    clone = subject.copy()
    next(iter(macko_layers(clone).values())).values.zero_()
    assert next(iter(macko_layers(subject).values())).values.any()


@pytest.mark.parametrize("params, field", [({"score": "random"}, "score"), ({"value_dtype": "float32"}, "value_dtype"), ({"sparsity": -0.1}, "sparsity")])
def test_bad_params_are_refused_by_name(tiny: Subject, ctx: TrialContext, params: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        Macko().transform(tiny.copy(), {"sparsity": 0.5, "score": "magnitude", **params}, ctx)


def test_core_size_measure_counts_the_stored_format(tiny: Subject, ctx: TrialContext, calib: dict[str, object]) -> None:
    from paretolab.measure.measures import Size
    from paretolab.plugin_api.storage import unique_parameters

    subject = Macko().transform(tiny.copy(), {"sparsity": 0.7, "score": "magnitude", **calib}, ctx)
    size = Size().measure(subject, None, ctx)["size_bytes"]
    rest = sum(t.numel() * t.element_size() for _, t in unique_parameters(subject.model))  # embeddings, norms
    assert size == rest + sum(m.nbytes for m in macko_layers(subject).values())
    dense_size = Size().measure(tiny, None, ctx)["size_bytes"]
    assert size < dense_size


class TestMackoContract(MethodContract):
    @pytest.fixture
    def method(self) -> Macko:
        return Macko()

    @pytest.fixture
    def params(self, method: Macko) -> dict[str, object]:
        from paretolab.testing import sample_params

        return {**sample_params(method, seed=0), "calib_samples": 4, "calib_seq_len": 32}

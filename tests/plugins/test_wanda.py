"""wanda: activation-aware pruning per output row, against the magnitude baseline."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from paretolab import TrialContext
from paretolab.errors import ConfigError
from paretolab.plugin_api.method import validate_method
from paretolab.plugin_api.subject import Subject
from paretolab.plugins import wanda
from paretolab.plugins.baselines import Magnitude, linear_weights
from paretolab.plugins.wanda import Wanda, activation_norms, mask_lowest, wanda_mask
from paretolab.testing import MethodContract, sample_params

CALIB_TEXT = "The quick brown fox jumps over the lazy dog while the compiler checks every branch. " * 40


@pytest.fixture
def calib_file(tmp_path: Path) -> str:
    path = tmp_path / "calib.txt"
    path.write_text(CALIB_TEXT, encoding="utf-8")
    return str(path)


def small_params(calib_file: str, **extra: object) -> dict[str, object]:
    return {"sparsity": 0.5, "calib_corpus": calib_file, "calib_samples": 4, "calib_seq_len": 32, **extra}


def test_registers_a_valid_method_with_its_paper() -> None:
    registered: list[object] = []
    wanda.register_methods(registered.append)
    (method,) = registered
    validate_method(method, "paretolab.plugins.wanda")
    assert method.name == "wanda" and method.cost_is == "simulated"
    assert "2306.11695" in str(method.paper)


def test_transform_leaves_a_runnable_model_with_the_target_sparsity_per_row(tiny: Subject, ctx: TrialContext, calib_file: str) -> None:
    subject = Wanda().transform(tiny.copy(), small_params(calib_file, sparsity=0.6), ctx)
    for name, layer in linear_weights(subject.model):
        zeros_per_row = (layer.weight == 0).sum(dim=1)
        assert zeros_per_row.eq(int(layer.in_features * 0.6)).all(), name
        assert subject.storage_of(f"{name}.weight").sparse
    with torch.no_grad():
        logits = subject.model(input_ids=torch.arange(20).reshape(1, 20)).logits
    assert torch.isfinite(logits).all()


def test_default_calibration_uses_the_builtin_corpus(tiny: Subject, ctx: TrialContext) -> None:
    subject = Wanda().transform(tiny.copy(), {"sparsity": 0.5, "calib_samples": 2, "calib_seq_len": 16}, ctx)
    q = subject.model.model.layers[0].self_attn.q_proj.weight
    assert (q == 0).float().mean().item() == pytest.approx(0.5)


def test_same_seed_same_masks_and_differs_from_magnitude(tiny: Subject, ctx: TrialContext, calib_file: str) -> None:
    a = Wanda().transform(tiny.copy(), small_params(calib_file), ctx)
    b = Wanda().transform(tiny.copy(), small_params(calib_file), ctx)
    m = Magnitude().transform(tiny.copy(), {"sparsity": 0.5, "scope": "row"}, ctx)
    wa, wb, wm = (dict(linear_weights(s.model)) for s in (a, b, m))
    for name in wa:
        assert torch.equal(wa[name].weight, wb[name].weight)
    assert any(not torch.equal(wa[n].weight == 0, wm[n].weight == 0) for n in wa)


def test_hooks_see_each_layers_input(tiny: Subject, ctx: TrialContext, calib_file: str) -> None:
    norms = activation_norms(tiny, ctx, corpus=calib_file, n_samples=3, seq_len=24, seed=ctx.seed)
    attn = "model.layers.0.self_attn"
    assert set(norms) == {name for name, _ in linear_weights(tiny.model)}
    torch.testing.assert_close(norms[f"{attn}.q_proj"], norms[f"{attn}.k_proj"])  # same input
    assert norms[f"{attn}.q_proj"].shape == (64,) and (norms[f"{attn}.q_proj"] > 0).all()
    assert norms["model.layers.0.mlp.down_proj"].shape == (128,)


def test_a_small_weight_on_a_loud_input_survives() -> None:
    """The point of the score: magnitude alone would prune column 0, the activation norm saves it."""
    weight = torch.tensor([[0.1, 1.0, 0.9, 0.8]])
    norms = torch.tensor([100.0, 1.0, 1.0, 1.0])
    assert wanda_mask(weight, norms, 0.5).tolist() == [[1.0, 1.0, 0.0, 0.0]]


def test_n_of_m_patterns_prune_n_per_group() -> None:
    scores = torch.rand(6, 16)
    keep = mask_lowest(scores, 0.0, pattern="2:4")
    assert keep.reshape(6, 4, 4).sum(dim=2).eq(2).all()
    with pytest.raises(ConfigError, match="divisible by 8"):
        mask_lowest(torch.rand(2, 12), 0.0, pattern="4:8")


@pytest.mark.parametrize("params, field", [({"sparsity": 1.0}, "sparsity"), ({"pattern": "3:7"}, "pattern"), ({"calib_samples": 0}, "calib_samples")])
def test_bad_params_are_refused_by_name(tiny: Subject, ctx: TrialContext, params: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        Wanda().transform(tiny.copy(), {"sparsity": 0.5, **params}, ctx)


class TestWandaContract(MethodContract):
    @pytest.fixture
    def method(self) -> Wanda:
        return Wanda()

    @pytest.fixture
    def params(self, method: Wanda) -> dict[str, object]:
        return {**sample_params(method, seed=0), "calib_samples": 4, "calib_seq_len": 32}


# --- the paper's claim on the real model ---------------------------------------------------


def wikitext2_or_pydoc() -> str:
    """WikiText-2 where its file is on this machine, else the built-in corpus."""
    from paretolab.data import load_corpus

    try:
        load_corpus("wikitext2")
    except ConfigError:
        return "pydoc"
    return "wikitext2"


@pytest.mark.slow
@pytest.mark.results
def test_wanda_beats_magnitude_at_50_percent_on_smollm2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from paretolab.models import SmolLM2
    from paretolab.tasks import Perplexity, PerplexityOptions

    base = SmolLM2().load()
    ctx = TrialContext(seed=0, workdir=tmp_path)
    options = PerplexityOptions(corpus=wikitext2_or_pydoc(), max_tokens=4096)

    def ppl(subject: Subject) -> float:
        return Perplexity().evaluate(subject, options, ctx)["ppl"]

    # Calibration on the built-in corpus, evaluation on WikiText-2 test: no evaluated text is seen while pruning.
    ppl_wanda = ppl(Wanda().transform(base.copy(), {"sparsity": 0.5}, ctx))
    ppl_magnitude = ppl(Magnitude().transform(base.copy(), {"sparsity": 0.5, "scope": "row"}, ctx))
    with capsys.disabled():
        print(f"\nSmolLM2-135M, {options.corpus} {options.max_tokens} tokens: wanda 50% ppl {ppl_wanda:.2f}, magnitude 50% ppl {ppl_magnitude:.2f}")
    assert ppl_wanda < ppl_magnitude


@pytest.mark.parametrize("pipeline", ["wanda_vs_magnitude.yaml", "macko.yaml"])
def test_pipelines_validate(pipeline: str) -> None:
    from paretolab.study.spec import load_spec

    spec = load_spec(Path(__file__).resolve().parents[2] / "pipelines" / pipeline)
    assert spec.model == "smollm2-135m" and [o.metric for o in spec.objectives] == ["ppl", "size_bytes"]

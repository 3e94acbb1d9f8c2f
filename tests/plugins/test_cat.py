"""cat: concentration–alignment transform before W4A4/W4A16 fake quantization, vs none and Hadamard."""

from __future__ import annotations

import json

import pytest
import torch

from paretolab import TrialContext
from paretolab.errors import ConfigError
from paretolab.plugin_api.method import validate_method
from paretolab.plugin_api.subject import Subject
from paretolab.plugins import cat
from paretolab.plugins.cat import (
    CAT,
    CATLinear,
    block_gram,
    block_size_for,
    cat_blocks,
    hadamard,
    sqnr_db,
)

SMALL = {"calib_samples": 4, "calib_seq_len": 64}


@pytest.fixture(scope="module")
def prompt() -> torch.Tensor:
    return torch.randint(0, 250, (2, 24), generator=torch.Generator().manual_seed(3))


def outlier_layer(seed: int = 0) -> tuple[torch.Tensor, torch.nn.Linear]:
    """Correlated activations with a few huge channels, and a weight whose input columns vary in scale."""
    gen = torch.Generator().manual_seed(seed)
    d, out, n = 128, 96, 2048
    mix = torch.eye(d) + 0.3 * torch.randn(d, d, generator=gen) / d**0.5
    x = torch.randn(n, d, generator=gen) @ mix
    x[:, :4] *= 30.0
    linear = torch.nn.Linear(d, out, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(out, d, generator=gen) / d**0.5 * (2 * torch.rand(d, generator=gen)))
    return x, linear


@pytest.mark.parametrize("kind", ["hadamard", "cat"])
def test_transform_preserves_the_function_before_quantization(tiny: Subject, ctx: TrialContext, prompt: torch.Tensor, kind: str) -> None:
    reference = tiny.model(input_ids=prompt).logits
    subject = CAT().transform(tiny.copy(), {"transform": kind, "w_bits": 16, "a_bits": 16, **SMALL}, ctx)
    assert isinstance(subject.model.model.layers[0].mlp.down_proj, CATLinear)
    assert torch.allclose(subject.model(input_ids=prompt).logits, reference, atol=1e-4)


def test_cat_beats_rtn_and_hadamard_sqnr_on_outlier_channels() -> None:
    x, linear = outlier_layer()
    y = linear(x).detach()
    t_had = hadamard(64).unsqueeze(0).repeat(2, 1, 1).float()
    t_cat = cat_blocks(block_gram(x, 64), block_gram(linear.weight.detach(), 64)).float()
    for a_bits in (4, 16):
        sq = {name: sqnr_db(y, CATLinear(linear, t, w_bits=4, group_size=-1, a_bits=a_bits)(x).detach()) for name, t in (("none", None), ("hadamard", t_had), ("cat", t_cat))}
        assert sq["cat"] >= sq["none"] + 3.0, sq
        assert sq["cat"] >= sq["hadamard"], sq


def test_strength_zero_is_the_hadamard_rotation() -> None:
    x, linear = outlier_layer(1)
    blocks = cat_blocks(block_gram(x, 64), block_gram(linear.weight.detach(), 64), strength=0.0)
    assert torch.allclose(blocks, hadamard(64).expand(2, 64, 64), atol=1e-9)


def test_inputs_shared_by_qkv_share_one_transform_counted_once(tiny: Subject, ctx: TrialContext) -> None:
    subject = CAT().transform(tiny.copy(), {"transform": "cat", **SMALL}, ctx)
    attn, mlp = subject.model.model.layers[0].self_attn, subject.model.model.layers[0].mlp
    assert attn.q_proj.blocks is attn.k_proj.blocks is attn.v_proj.blocks
    assert mlp.gate_proj.blocks is mlp.up_proj.blocks
    assert attn.o_proj.blocks is not attn.q_proj.blocks
    t_bytes = attn.q_proj.blocks.numel() * 2
    q_size = subject.storage_of("model.layers.0.self_attn.q_proj.weight").stored_bytes
    k_size = subject.storage_of("model.layers.0.self_attn.k_proj.weight").stored_bytes
    assert q_size == 64 * 64 // 2 + 64 * 2 + t_bytes  # 4-bit weights + one fp16 scale per row + T once
    assert k_size == 32 * 64 // 2 + 32 * 2


def test_reports_per_layer_sqnr_artifact_and_mean_metric(tiny: Subject, ctx: TrialContext) -> None:
    method = CAT()
    subject = method.transform(tiny.copy(), {"transform": "none", "a_bits": 4, **SMALL}, ctx)
    report = json.loads((ctx.workdir / "cat_sqnr.json").read_text())
    assert set(report["sqnr_db"]) == {f"model.layers.{i}.{p}" for i in range(2) for p in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    metrics = method.evaluate(subject, ctx)
    assert metrics["sqnr_db"] == pytest.approx(sum(report["sqnr_db"].values()) / 14)
    assert 0 < metrics["sqnr_db"] < 60


def test_fewer_activation_bits_lower_sqnr(tiny: Subject, ctx: TrialContext) -> None:
    sq = {a: CAT().transform(tiny.copy(), {"transform": "cat", "a_bits": a, **SMALL}, ctx).info["cat"]["sqnr_db"] for a in (4, 16)}
    assert sq[16] > sq[4]


def test_block_size_falls_back_to_a_power_of_two_dividing_the_width() -> None:
    assert block_size_for(576, 128) == 64
    assert block_size_for(1536, 128) == 128
    assert block_size_for(96, 64) == 32


@pytest.mark.parametrize("bad", [{"transform": "rotate"}, {"w_bits": 1}, {"strength": 2.0}, {"group_size": 48}])
def test_bad_params_name_the_field(tiny: Subject, ctx: TrialContext, bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="cat"):
        CAT().transform(tiny.copy(), {**SMALL, **bad}, ctx)


def test_registers_the_method_and_its_metric() -> None:
    methods, metrics = [], []
    cat.register_methods(methods.append)
    cat.register_metrics(metrics.append)
    validate_method(methods[0], "test")
    assert [m.name for m in methods] == ["cat"] and [m.name for m in metrics] == ["sqnr_db"]


def test_heldout_windows_share_no_token_with_the_calibration_windows(monkeypatch) -> None:
    from paretolab.data import tokens as data

    monkeypatch.setattr(data, "encode", lambda tokenizer, text: list(range(3000)))  # an id is its position
    fit = data.calibration_ids(None, n_samples=8, seq_len=64, seed=3)
    held = data.heldout_calibration_ids(None, n_samples=8, seq_len=64, seed=3, n_heldout=5)
    assert held.shape == (5, 64)
    assert not set(fit.flatten().tolist()) & set(held.flatten().tolist())


def test_sqnr_is_scored_on_tokens_the_transform_was_not_fitted_on(tiny: Subject, ctx: TrialContext, monkeypatch) -> None:
    fed: list[torch.Tensor] = []
    real = cat.run_model
    monkeypatch.setattr(cat, "run_model", lambda model, ids, **kw: (fed.append(ids), real(model, ids, **kw))[1])
    CAT().transform(tiny.copy(), {"transform": "cat", "sqnr_tokens": 64, **SMALL}, ctx)
    fitted, scored = fed  # the calibration pass, then the SQNR pass
    windows = {tuple(row) for row in fitted.tolist()}
    assert scored.shape[1] == SMALL["calib_seq_len"] and not windows & {tuple(row) for row in scored.tolist()}


def test_the_fit_and_held_out_windows_encode_the_corpus_once(tiny: Subject, monkeypatch) -> None:
    from paretolab.data import tokens as data

    calls: list[int] = []
    real = data.encode
    monkeypatch.setattr(data, "encode", lambda tokenizer, text: (calls.append(len(text)), real(tokenizer, text))[1])
    fit = data.calibration_ids(tiny.tokenizer, corpus="pystdlib-val", n_samples=4, seq_len=64, seed=5)
    held = data.heldout_calibration_ids(tiny.tokenizer, corpus="pystdlib-val", n_samples=4, seq_len=64, seed=5, n_heldout=2)
    assert len(calls) == 1  # one encode of the whole corpus for both (a 10 MB corpus: ~14 s each)
    ids = torch.tensor(real(tiny.tokenizer, data.load_corpus("pystdlib-val")[0]))
    starts = torch.randint(0, ids.numel() - 64, (4,), generator=torch.Generator().manual_seed(5))
    assert torch.equal(fit, torch.stack([ids[s : s + 64] for s in starts.tolist()]))  # the windows calibration always cut
    assert held.shape == (2, 64)

"""kalman_attention and gla: scan == recurrence, cached decoding == recompute, padding, rollback, equal parameters, contract."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from paretolab import TrialContext
from paretolab.errors import ConfigError
from paretolab.generation.decoding import BatchDecoder
from paretolab.models import TinyLlama
from paretolab.plugin_api.method import Method
from paretolab.plugin_api.subject import Subject
from paretolab.plugins._scan import AFFINE, MOBIUS, blocked_scan, gated_chunk_attention
from paretolab.plugins.linear_attention import (
    GatedLinearAttention,
    GLACell,
    KalmanAttention,
    KalmanCell,
    LinearAttention,
)
from paretolab.testing import MethodContract
from paretolab.training.loop import reinitialise
from tests.plugins.test_kv_sharing import greedy


@pytest.fixture
def tiny() -> Subject:
    return TinyLlama(layers=2, hidden=64).load()  # 4 heads, 2 key/value heads, head_dim 16, fp32


@pytest.fixture
def ctx(tmp_path: Path) -> TrialContext:
    return TrialContext(seed=0, workdir=tmp_path)


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


CELLS = {
    "kalman_tied": lambda: KalmanCell(32, 2, 8, 4, tied=True),
    "kalman_paper": lambda: KalmanCell(32, 2, 8, 4, tied=False),
    "gla": lambda: GLACell(32, 2, 8, 4),
}


@pytest.mark.parametrize("cell_name", sorted(CELLS))
@pytest.mark.parametrize("length", [1, 7, 16, 37])  # chunk 8: shorter than, equal to a multiple of, and not a multiple of it
def test_scan_equals_recurrence(cell_name: str, length: int) -> None:
    torch.manual_seed(0)
    cell = CELLS[cell_name]()
    x, q, k, v = randn(2, length, 32, seed=1), randn(2, 2, length, 8, seed=2), randn(2, 2, length, 8, seed=3), randn(2, 2, length, 8, seed=4)
    with torch.no_grad():
        scanned, final = cell.scan(x, q, k, v, None, None, 8)
        state, outs = cell.initial(2, q), []
        for t in range(length):
            y, state = cell.step(x[:, t : t + 1], q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], None, state)
            outs.append(y)
    torch.testing.assert_close(scanned, torch.cat(outs, dim=2), rtol=1e-5, atol=1e-5)
    for a, b in zip(final, state):
        torch.testing.assert_close(a, b.expand_as(a), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("length", [5, 24, 29])
def test_blocked_scan_equals_sequential_composition(length: int) -> None:
    positive = [randn(1, 2, length, 3, 3, seed=s).abs() + 0.1 for s in range(4)]
    for op, leaves in ((AFFINE, tuple(positive[:2])), (MOBIUS, tuple(positive))):
        prefixes = blocked_scan(op, leaves, 8)
        acc = tuple(x[:, :, 0] for x in leaves)
        for t in range(1, length):
            acc = op.combine(acc, tuple(x[:, :, t] for x in leaves))
        if op is MOBIUS:  # the maps are equal up to scale: compare them applied to λ = 2
            def apply(m: tuple[torch.Tensor, ...]) -> torch.Tensor:
                return (m[0] * 2 + m[1]) / (m[2] * 2 + m[3])
            torch.testing.assert_close(apply(tuple(p[:, :, -1] for p in prefixes)), apply(acc))
        else:
            torch.testing.assert_close(tuple(p[:, :, -1] for p in prefixes), acc)


def test_chunkwise_gated_attention_equals_materialised_states() -> None:
    q, k, v, log_g = randn(1, 2, 19, 4, seed=1), randn(1, 2, 19, 4, seed=2), randn(1, 2, 19, 5, seed=3), -randn(1, 2, 19, 4, seed=4).abs()
    s0 = randn(1, 2, 4, 5, seed=5)
    out, final = gated_chunk_attention(q, k, v, log_g, s0, 6)
    pa, pu = blocked_scan(AFFINE, (log_g.exp().unsqueeze(-1), k.unsqueeze(-1) * v.unsqueeze(-2)), 4)
    states = pa * s0.unsqueeze(2) + pu
    torch.testing.assert_close(out, torch.einsum("bhti,bhtij->bhtj", q, states), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final, states[:, :, -1], rtol=1e-5, atol=1e-5)


def test_kalman_without_dynamics_is_precision_weighted_normalised_linear_attention() -> None:
    # a = 1 and p = 0 (no forgetting, no process noise): λ = 1 + Σ Λ k², η = Σ Λ v k, y = q·η/λ + skip·v
    cell = KalmanCell(32, 1, 4, 2, tied=False)
    with torch.no_grad():
        cell.lambda_log.fill_(-40.0)  # a = exp(−Δ·e^−40) = 1 in fp32
        cell.process_noise.fill_(0.0)  # floored at 1e-7, times Δ ≤ 0.1: negligible
    x, q, k, v = randn(1, 6, 32, seed=1), randn(1, 1, 6, 4, seed=2), randn(1, 1, 6, 4, seed=3), randn(1, 1, 6, 4, seed=4)
    with torch.no_grad():
        y, _ = cell.scan(x, q, k, v, None, None, 4)
        prec = 1.0 / (torch.nn.functional.softplus(cell.noise_up(cell.noise_down(x))).view(1, 6, 1, 4).transpose(1, 2) + cell.OBS_VAR_MIN)
        kn, qn = torch.nn.functional.normalize(k, dim=-1), torch.nn.functional.normalize(q, dim=-1)
        lam = 1.0 + torch.cumsum((kn * kn).unsqueeze(-1) * prec.unsqueeze(-2), dim=2)
        eta = torch.cumsum(kn.unsqueeze(-1) * (v * prec).unsqueeze(-2), dim=2)
        expected = torch.einsum("bhti,bhtij->bhtj", qn, eta / lam) + cell.skip * v
    torch.testing.assert_close(y, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("method", [KalmanAttention(), GatedLinearAttention()], ids=lambda m: m.name)
def test_cached_generation_equals_recompute(method: Method, tiny: Subject, ctx: TrialContext) -> None:
    model = method.transform(tiny, {"chunk": 4}, ctx).model
    assert all(isinstance(layer.self_attn, LinearAttention) for layer in model.model.layers)
    prompt = torch.randint(3, 250, (1, 11), generator=torch.Generator().manual_seed(1))
    recomputed = greedy(model, prompt, 12, cached=False)
    assert greedy(model, prompt, 12, cached=True) == recomputed
    hf = model.generate(prompt, max_new_tokens=12, do_sample=False, use_cache=True, pad_token_id=0)
    assert hf[0, 11:].tolist() == recomputed


@pytest.mark.parametrize("method", [KalmanAttention(), GatedLinearAttention()], ids=lambda m: m.name)
def test_left_padded_rows_decode_as_alone_and_roll_back(method: Method, tiny: Subject, ctx: TrialContext) -> None:
    model = method.transform(tiny, {}, ctx).model

    def run(prompts: list[list[int]]) -> tuple[BatchDecoder, list[torch.Tensor]]:
        decoder = BatchDecoder(model)
        logits = [decoder.prefill(prompts)]
        for _ in range(3):
            logits.append(decoder.extend(logits[-1].argmax(-1)))
        return decoder, logits

    decoder, both = run([[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]])
    _, alone = run([[12, 13, 14]])
    for b, a in zip(both, alone):
        torch.testing.assert_close(b[1], a[0], rtol=1e-5, atol=1e-5)
    decoder.rollback(decoder.length - 1)  # back one token, then the same token again
    torch.testing.assert_close(decoder.extend(both[-2].argmax(-1)), both[-1])
    with pytest.raises(ConfigError, match="roll back"):
        decoder.rollback(3)  # inside the prefill: that state was never kept
    decoder.select([1])
    torch.testing.assert_close(decoder.extend(alone[-1].argmax(-1)), run([[12, 13, 14]])[0].extend(alone[-1].argmax(-1)), rtol=1e-5, atol=1e-5)


def test_gla_and_kalman_have_equal_parameters(tiny: Subject, ctx: TrialContext) -> None:
    from paretolab.training.models import presets

    for subject in (tiny, next(s for s in presets() if s.name == "scratch-1m").load()):
        counts = [sum(p.numel() for p in m.transform(subject.copy(), params, ctx).model.parameters())
                  for m, params in ((KalmanAttention(), {}), (GatedLinearAttention(), {}), (KalmanAttention(), {"tied": False}),
                                    (GatedLinearAttention(), {"match_tied": False}))]
        assert abs(counts[0] - counts[1]) / counts[0] < 2e-3 and abs(counts[2] - counts[3]) / counts[2] < 2e-3, counts


def test_retrain_reinitialises_the_new_modules(tiny: Subject, ctx: TrialContext) -> None:
    model = KalmanAttention().transform(tiny, {}, ctx).model
    cell = model.model.layers[0].self_attn.cell
    with torch.no_grad():
        cell.skip.fill_(5.0)
    reinitialise(model, seed=0)
    assert float(cell.skip.detach()) == KalmanCell.SKIP_INIT


def test_bad_params_name_the_field(tiny: Subject, ctx: TrialContext) -> None:
    with pytest.raises(ConfigError, match="kalman_attention.tied"):
        KalmanAttention().transform(tiny.copy(), {"tied": "yes"}, ctx)
    with pytest.raises(ConfigError, match="gla.chunk"):
        GatedLinearAttention().transform(tiny.copy(), {"chunk": 0}, ctx)
    once = GatedLinearAttention().transform(tiny, {}, ctx)
    with pytest.raises(ConfigError, match="already linear attention"):
        KalmanAttention().transform(once, {}, ctx)


class TestKalmanAttentionContract(MethodContract):
    @pytest.fixture
    def method(self) -> Method:
        return KalmanAttention()


class TestGLAContract(MethodContract):
    @pytest.fixture
    def method(self) -> Method:
        return GatedLinearAttention()


def test_recurrent_cache_layer_keeps_recent_rollback_points_and_crops_padding() -> None:
    from paretolab.plugins._recurrent_cache import MAX_SAVED, RecurrentStateLayer

    layer = RecurrentStateLayer()
    layer.advance((torch.zeros(2, 1),), 5)  # a prefill of 5 positions
    for i in range(MAX_SAVED + 5):
        layer.advance((torch.full((2, 1), float(i)),), 1)
    assert layer.get_seq_length() == 5 + MAX_SAVED + 5
    with pytest.raises(ConfigError, match="roll back"):
        layer.crop(-(MAX_SAVED + 5))  # back to the prefill: dropped, older than the last MAX_SAVED forwards
    layer.crop(-3)
    assert float(layer.state[0][0, 0]) == MAX_SAVED + 1 and layer.get_seq_length() == 5 + MAX_SAVED + 2
    layer.crop_front(2)  # two leading padding positions gone: same state, shorter, rollback points shifted
    layer.crop(-1)
    assert float(layer.state[0][0, 0]) == MAX_SAVED and layer.get_seq_length() == 4 + MAX_SAVED
    layer.batch_select_indices(torch.tensor([1]))
    assert layer.state[0].shape == (1, 1)


def test_kv_cache_measure_weighs_the_recurrent_state(tiny: Subject, ctx: TrialContext) -> None:
    from paretolab.plugins.kv_sharing import cache_bytes_per_token

    model = KalmanAttention().transform(tiny, {}, ctx).model  # 2 layers, 4 heads of 16: λ [4, 16, 1] and η [4, 16, 16] per layer
    state_bytes = 2 * 4 * (16 + 16 * 16) * 4
    assert cache_bytes_per_token(model, tokens=8) == state_bytes / 8
    assert cache_bytes_per_token(model, tokens=32) == state_bytes / 32  # constant state: fewer bytes per token of context

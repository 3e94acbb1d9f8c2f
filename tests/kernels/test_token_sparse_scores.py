"""Token Sparse Attention scoring: the Triton kernel (CPU interpreter) against the PyTorch reference."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported; benchmarks/gpu_check.sh sets 0

import pytest
import torch

try:
    import triton  # noqa: F401
except ImportError as exc:  # fail the run loudly: these tests are part of CI, never skipped
    raise ImportError("tests/kernels need triton (a dev dependency): pip install triton") from exc

from paretolab.kernels.token_sparse import window_scores_ref
from paretolab.kernels.token_sparse_triton import window_scores_triton

pytestmark = pytest.mark.triton

# (B, H, Hkv, L, D, W): grouped and plain heads, head dims that are and are not powers of two,
# windows and prefixes that do not fill the kernel's blocks.
SHAPES = [(1, 4, 2, 40, 16, 8), (2, 3, 3, 70, 48, 17), (1, 9, 3, 90, 64, 32), (1, 2, 1, 33, 24, 1)]


def qk(b: int, h: int, hkv: int, length: int, d: int, seed: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(b, h, length, d, generator=gen).to(dtype), (2 * torch.randn(b, hkv, length, d, generator=gen)).to(dtype)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_triton_matches_reference(shape: tuple[int, ...]) -> None:
    b, h, hkv, length, d, w = shape
    q, k = qk(b, h, hkv, length, d, seed=length)
    got = window_scores_triton(q, k, w)
    want = window_scores_ref(q, k, w)
    assert got.shape == (b, h, length - w) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_triton_reads_half_precision_inputs() -> None:
    q, k = qk(1, 4, 2, 40, 16, seed=3, dtype=torch.float16)
    torch.testing.assert_close(window_scores_triton(q, k, 8, scale=0.2), window_scores_ref(q, k, 8, scale=0.2), rtol=1e-3, atol=1e-5)


def test_reference_is_the_mean_of_the_last_window_rows_of_causal_attention() -> None:
    b, h, hkv, length, d, w = 1, 4, 2, 30, 16, 6
    q, k = qk(b, h, hkv, length, d, seed=1)
    kk = k.repeat_interleave(h // hkv, dim=1)
    logits = q @ kk.transpose(-1, -2) / d**0.5
    logits = logits.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), float("-inf"))
    probs = torch.softmax(logits, dim=-1)  # (B, H, L, L): full causal attention
    want = probs[:, :, -w:, : length - w].mean(dim=2)
    torch.testing.assert_close(window_scores_ref(q, k, w), want)
    # each window row's prefix share is below 1: the rest of its mass sits on window keys
    assert bool((window_scores_ref(q, k, w).sum(-1) < 1).all())


def test_reference_honours_a_padding_mask() -> None:
    q, k = qk(1, 2, 2, 20, 16, seed=2)
    allowed = torch.ones(20, 20, dtype=torch.bool).tril()
    allowed[:, :3] = False  # three padding tokens on the left
    scores = window_scores_ref(q, k, 5, mask=allowed[-5:][None, None])
    assert bool((scores[..., :3] == 0).all()) and bool((scores[..., 3:] > 0).all())


@pytest.mark.parametrize("bad", [0, 40])
def test_window_out_of_range_is_refused(bad: int) -> None:
    q, k = qk(1, 2, 2, 40, 16, seed=0)
    with pytest.raises(ValueError, match="window"):
        window_scores_triton(q, k, bad)

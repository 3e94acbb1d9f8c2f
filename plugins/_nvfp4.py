"""Exact fake quantisers for simulated low-precision training: NVFP4 (E2M1 + E4M3 block scales), MXFP8, a 16-wide random Hadamard.

NVFP4 as TetraJet-v2's fake-quant kernel does it (thu-ml/TetraJet-v2-NVFP4Training,
``kernels/baseline_fakequant/nvfp4_quant_fused_kernel.py``; our own PyTorch code): along the last
dimension, an fp32 outer scale s₀ = amax/(448·6) per ``outer`` elements (the paper's double-block
quantisation uses 128; ``outer=0`` gives the standard NVFP4 per-tensor scale), an E4M3 scale per 16
elements s₁ = E4M3(amax₁₆/(s₀·6)) (round to nearest even), and each value v = x/(s₀s₁) rounded to the
E2M1 grid {0, 0.5, 1, 1.5, 2, 3, 4, 6}: exponent e = clamp(⌊log₂|v|⌋, 0, 2), one mantissa bit,
round-half-even, or stochastic rounding (uniform noise in ±half a step), saturating at 6. A tail
shorter than a block is padded with zeros (they change no amax). MXFP8 (OCP MX): E4M3 values with a
power-of-two (E8M0) scale 2^(⌊log₂ amax⌋ − 8) per 32 elements.
"""

from __future__ import annotations

import torch

E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX, E4M3_MAX = 6.0, 448.0


def _blocks(x: torch.Tensor, size: int) -> tuple[torch.Tensor, int]:
    """x (..., K) as (..., ceil(K/size), size), zero-padded; and K."""
    k = x.shape[-1]
    pad = (-k) % size
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    return x.reshape(*x.shape[:-1], -1, size), k


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest FP8 E4M3 value (ties to even), as a float32 tensor."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)


def round_e2m1(v: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
    """|v| rounded onto the E2M1 grid (sign kept): nearest-even, or stochastic given uniform ``noise`` in [-0.5, 0.5)."""
    mag = v.abs()
    expo = torch.floor(torch.log2(mag.clamp_min(1.0))).clamp_max(2.0)  # below 1: exponent 0, the subnormal step 0.5 (no -inf: slow on CPU)
    step = torch.exp2(expo)
    mant = mag / step
    whole = torch.floor(mant)
    halves = (mant - whole) * 2.0
    if noise is not None:
        halves = halves + noise
    q = (step * (whole + torch.round(halves) / 2.0)).clamp(max=E2M1_MAX)
    return torch.copysign(q, v)


def nvfp4(x: torch.Tensor, *, inner: int = 16, outer: int = 128, stochastic: bool = False,
          generator: torch.Generator | None = None) -> torch.Tensor:
    """x fake-quantised to NVFP4 along its last dimension (the dequantised values, float32, x's shape)."""
    shape = x.shape
    x = x.float()
    if outer > 0:
        grouped, k = _blocks(x, outer)  # (..., n_outer, outer)
        s0 = grouped.abs().amax(-1, keepdim=True) / (E4M3_MAX * E2M1_MAX)
    else:
        grouped, k = x.reshape(*x.shape[:-1], 1, x.shape[-1]), x.shape[-1]
        s0 = x.abs().amax().reshape(1, 1) / (E4M3_MAX * E2M1_MAX)
    s0 = s0.masked_fill(s0 == 0, 1.0)
    inner_blocks, width = _blocks(grouped, inner)  # (..., n_outer, n_inner, inner)
    s1 = to_e4m3(inner_blocks.abs().amax(-1, keepdim=True) / (s0.unsqueeze(-1) * E2M1_MAX))
    scale = s1 * s0.unsqueeze(-1)
    noise = None
    if stochastic:
        noise = torch.rand(inner_blocks.shape, generator=generator, device=x.device, dtype=torch.float32) - 0.5
    # a block whose E4M3 scale underflows to 0 comes out 0 (q · 0); dividing by 1 there keeps v finite
    q = round_e2m1(inner_blocks / scale.masked_fill(scale == 0, 1.0), noise) * scale
    q = q.reshape(*q.shape[:-2], -1)[..., :width]  # (..., n_outer, outer): the inner padding dropped
    return q.reshape(*q.shape[:-2], -1)[..., :k].reshape(shape)


def mxfp8(x: torch.Tensor, *, block: int = 32) -> torch.Tensor:
    """x fake-quantised to MXFP8 (E4M3 values, one power-of-two scale per ``block``) along its last dimension."""
    shape = x.shape
    blocks, k = _blocks(x.float(), block)
    amax = blocks.abs().amax(-1, keepdim=True)
    scale = torch.exp2(torch.floor(torch.log2(torch.where(amax == 0, torch.ones_like(amax), amax))) - 8.0)  # 8: E4M3's max exponent
    q = to_e4m3(blocks / scale) * scale
    return q.reshape(*q.shape[:-2], -1)[..., :k].reshape(shape)


def hadamard16(device: torch.device | str) -> torch.Tensor:
    """The orthonormal 16×16 Sylvester Hadamard matrix."""
    h = torch.ones(1, 1, device=device)
    for _ in range(4):
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / 4.0


def random_hadamard(generator: torch.Generator, device: torch.device | str) -> torch.Tensor:
    """diag(s)·H₁₆ with random signs s: orthogonal, so applying it to both operands of a product changes nothing."""
    signs = torch.randint(0, 2, (16,), generator=generator, device=device).float() * 2.0 - 1.0
    return signs.unsqueeze(1) * hadamard16(device)


def rotate16(x: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """Apply the 16×16 ``rotation`` to every 16 consecutive entries of the last dimension (zero-padded to a multiple of 16)."""
    blocks, _ = _blocks(x, 16)
    return (blocks @ rotation).reshape(*x.shape[:-1], -1)

"""PuzzleMoE's packed word: one merged magnitude and two experts' sign and mask bits in 32 bits, decoded exactly.

The paper packs each pair's sign and mask bits into bf16 exponent bits the weights never use. Our
base is fp32, so ours is the same idea in an fp32 word (one word per entry for the *pair*, i.e.
half the bytes of the two fp32 experts):

    bit 31  sign of expert a        bit 29  mask of expert a      bits 27..23  exponent code (5 bits)
    bit 30  sign of expert b        bit 28  mask of expert b      bits 22..0   fp32 mantissa of |M|

A magnitude needs no sign bit, and a tensor's magnitudes span far fewer than 256 binades: the
exponent is stored relative to the tensor's largest one (``top``, one int32 per tensor), code c in
1..31 meaning exponent top − 31 + c, code 0 meaning zero. Magnitudes more than 2^30 below the
largest (and subnormals) become 0 at encoding; every value the encoder returns decodes bit-exactly.
"""

from __future__ import annotations

import torch

CODES = 31  # binades below the top one that keep their value (codes 1..31)
MANTISSA = (1 << 23) - 1


def encode(magnitude: torch.Tensor, sign_a: torch.Tensor, sign_b: torch.Tensor, mask_a: torch.Tensor,
           mask_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int32 words, int32 top exponent) of fp32 magnitudes ≥ 0 and four bool tensors of the same shape."""
    bits = magnitude.float().contiguous().view(torch.int32).to(torch.int64) & 0x7FFFFFFF
    exponent = bits >> 23
    top = int(exponent.max()) if exponent.numel() else 0
    lowest = max(1, top - CODES + 1)
    keep = exponent >= lowest
    code = torch.where(keep, exponent - lowest + 1, torch.zeros_like(exponent))
    mantissa = torch.where(keep, bits & MANTISSA, torch.zeros_like(bits))
    word = (sign_a.to(torch.int64) << 31) | (sign_b.to(torch.int64) << 30) | (mask_a.to(torch.int64) << 29) | (mask_b.to(torch.int64) << 28)
    word = word | (code << 23) | mantissa
    word = torch.where(word >= 1 << 31, word - (1 << 32), word)  # as a signed int32
    return word.to(torch.int32), torch.tensor(top, dtype=torch.int32, device=magnitude.device)


def decode_fields(words: torch.Tensor, top: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(magnitude fp32, sign_a, sign_b, mask_a, mask_b) from ``encode``'s words."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    code = (w >> 23) & 0x1F
    lowest = torch.clamp(top.to(torch.int64) - CODES + 1, min=1)
    exponent = torch.where(code > 0, code + lowest - 1, torch.zeros_like(code))
    bits = torch.where(code > 0, (exponent << 23) | (w & MANTISSA), torch.zeros_like(w))
    magnitude = bits.to(torch.int32).view(torch.float32)
    return magnitude, (w >> 31) & 1 == 1, (w >> 30) & 1 == 1, (w >> 29) & 1 == 1, (w >> 28) & 1 == 1


def decode(words: torch.Tensor, top: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two experts' weights (fp32) a pair's words stand for: ±magnitude where an expert's mask bit is set, else 0."""
    magnitude, sign_a, sign_b, mask_a, mask_b = decode_fields(words, top)
    a = torch.where(mask_a, torch.where(sign_a, -magnitude, magnitude), torch.zeros_like(magnitude))
    b = torch.where(mask_b, torch.where(sign_b, -magnitude, magnitude), torch.zeros_like(magnitude))
    return a, b


def representable(magnitude: torch.Tensor) -> torch.Tensor:
    """``magnitude`` as the format keeps it (values below the 31-binade window set to 0): what a round trip must return."""
    bits = magnitude.float().contiguous().view(torch.int32).to(torch.int64) & 0x7FFFFFFF
    exponent = bits >> 23
    top = int(exponent.max()) if exponent.numel() else 0
    return torch.where(exponent >= max(1, top - CODES + 1), magnitude.float().abs(), torch.zeros_like(magnitude.float()))

"""A Llama decoder layer's non-linear work for a few tokens on the CPU, one C call each (``compute_kernels/_lean_cpu.c``).

The lean forward (``paretolab.generation.lean``) spends most of a decoding step's non-linear time
in dispatching ~40 small torch operations a layer. Where this extension runs its AVX-512 path,
:func:`lean_ops` returns them bound to it, unchecked (:class:`LeanOps`), and the lean forward calls:

- ``rms_norm(x, weight, eps)``: transformers' ``LlamaRMSNorm`` (sums in another order);
- ``rotary_(t, cos, sin, heads)``: ``t * cos + rotate_half(t) * sin`` in place, bit-identical;
- ``attention(q, keys, values, past, scale, kv_heads, block_mask)``: causal (or tree-masked)
  attention of a block of queries over a :class:`~paretolab.generation.lean.LeanCache` layer,
  grouped key/value heads, the output in the (tokens, heads * dim) layout ``o_proj`` takes;
- ``silu_mul(gate, up)``: ``silu(gate) * up`` (exp by a polynomial, ~1 ulp).

All take fp32, contiguous CPU tensors and check it; each row's result depends only on that row
(and, for attention, on the keys it sees, in position order), so a token decoded alone and
inside a speculative verify block gets the same bits. ``path=`` caps the instruction path (the
tests compare the AVX-512 path with the scalar one). Where the extension is not built, the CPU
lacks AVX-512 (the scalar loops would be slower than torch's) or ``PARETOLAB_CPU_KERNELS=0``,
``lean_ops()`` is None and the lean forward keeps torch's operations.
"""

from __future__ import annotations

from types import ModuleType

import torch

from paretolab.kernels.cpu_ext import extension, path_cap

NAME = "_lean_cpu"
MAX_TOKENS = 16  # block rows above which (a prefill) the lean forward keeps torch's attention


class LeanOps:
    """The C operations bound to the extension at one path, with no checks: what the lean forward calls (~100 times a
    step), its tensors being contiguous fp32 CPU tensors of the right shapes by construction. The module's functions
    below check their inputs, then call these."""

    def __init__(self, ext: ModuleType, cap: int) -> None:
        self.ext, self.cap = ext, cap

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        y = torch.empty_like(x)
        dim = x.shape[-1]
        self.ext.rms_norm(x.data_ptr(), weight.data_ptr(), y.data_ptr(), x.numel() // max(dim, 1), dim, float(eps), self.cap)
        return y

    def rotary_(self, t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> torch.Tensor:
        rows, dim = cos.shape
        self.ext.rotary(t.data_ptr(), cos.data_ptr(), sin.data_ptr(), rows, heads, dim, self.cap)
        return t

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(gate)
        self.ext.silu_mul(gate.data_ptr(), up.data_ptr(), out.data_ptr(), gate.numel(), self.cap)
        return out

    def attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, past: int, scale: float, *,
                  block_mask: torch.Tensor | None = None, new: tuple[torch.Tensor, torch.Tensor] | None = None,
                  rotary: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        _, kv_heads, capacity, dim = keys.shape
        tokens = q.numel() // q.shape[-1]
        extra: tuple[int, ...] = ()
        if new is not None:
            extra = (new[0].data_ptr(), new[1].data_ptr(), *((rotary[0].data_ptr(), rotary[1].data_ptr()) if rotary is not None else ()))
        out = torch.empty_like(q)
        self.ext.attention(q.data_ptr(), keys.data_ptr(), values.data_ptr(), out.data_ptr(), 0 if block_mask is None else block_mask.data_ptr(),
                           tokens, q.shape[-1] // dim, kv_heads, dim, past, capacity * dim, float(scale), self.cap, *extra)
        return out


_BOUND: dict[tuple[int, int], LeanOps] = {}


def _bound(ext: ModuleType, cap: int) -> LeanOps:
    key = (id(ext), cap)
    if key not in _BOUND:
        _BOUND[key] = LeanOps(ext, cap)
    return _BOUND[key]


def lean_ops() -> LeanOps | None:
    """The unchecked operations at the AVX-512 path where the C extension runs it (the lean forward's switch), else None."""
    ext = extension(NAME)
    return None if ext is None or ext.isa() != "avx512" else _bound(ext, path_cap(ext, None))


def _ext() -> ModuleType:
    ext = extension(NAME)
    if ext is None:
        raise RuntimeError(f"paretolab.kernels.{NAME} is not built or PARETOLAB_CPU_KERNELS=0; check lean_ops() first, "
                           "or rebuild with `pip install -e . --no-deps --no-build-isolation`")
    return ext


def _check(name: str, *tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous():
            raise ValueError(f"lean_cpu.{name} takes contiguous fp32 CPU tensors; got {tuple(t.shape)} {t.dtype} on {t.device}"
                             f"{'' if t.is_contiguous() else ' (not contiguous)'}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, path: str | None = None) -> torch.Tensor:
    """``weight * (x / sqrt(mean(x**2, -1) + eps))`` over the last dimension of x (..., D)."""
    ext = _ext()
    _check("rms_norm", x, weight)
    dim = x.shape[-1]
    if weight.shape != (dim,):
        raise ValueError(f"lean_cpu.rms_norm: weight must have shape ({dim},), got {tuple(weight.shape)}")
    return _bound(ext, path_cap(ext, path)).rms_norm(x, weight, eps)


def rotary_(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, *, path: str | None = None) -> torch.Tensor:
    """Rotate ``t`` (..., T, heads * D) in place by ``cos``/``sin`` (T, D); returns t."""
    ext = _ext()
    _check("rotary_", t, cos, sin)
    rows, dim = cos.shape
    if sin.shape != cos.shape or t.shape[-1] != heads * dim or t.numel() != rows * heads * dim or dim % 2:
        raise ValueError(f"lean_cpu.rotary_: t {tuple(t.shape)} must be (T, heads * D) for cos and sin (T, D) = {tuple(cos.shape)}, "
                         f"{tuple(sin.shape)} with {heads} heads and D even")
    return _bound(ext, path_cap(ext, path)).rotary_(t, cos, sin, heads)


def silu_mul(gate: torch.Tensor, up: torch.Tensor, *, path: str | None = None) -> torch.Tensor:
    """``silu(gate) * up`` elementwise (same shapes)."""
    ext = _ext()
    _check("silu_mul", gate, up)
    if gate.shape != up.shape:
        raise ValueError(f"lean_cpu.silu_mul: gate {tuple(gate.shape)} and up {tuple(up.shape)} must have one shape")
    return _bound(ext, path_cap(ext, path)).silu_mul(gate, up)


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, past: int, scale: float, *,
              block_mask: torch.Tensor | None = None, new: tuple[torch.Tensor, torch.Tensor] | None = None,
              rotary: tuple[torch.Tensor, torch.Tensor] | None = None, path: str | None = None) -> torch.Tensor:
    """Attention of T queries ``q`` (..., T, heads * D) over ``keys``/``values`` (1, kv_heads, capacity, D) buffers.

    Positions ``0 .. past - 1`` are the past (every query sees them), ``past .. past + T - 1`` the
    block's own keys: query t sees block row u where ``block_mask[t, u]`` (bool (T, T)), causal
    (u <= t) without one. The buffers are LeanCache's (contiguous). ``new``: the block's keys and
    values (..., T, kv_heads * D), written into the buffers at ``past ..`` first (else they must be
    there already); with ``rotary`` = (cos, sin) (T, D), q and the new keys are rotated in place first.
    """
    ext = _ext()
    _check("attention", q, keys, values, *(new or ()), *(rotary or ()))
    _, kv_heads, capacity, dim = keys.shape
    tokens = q.numel() // q.shape[-1]
    heads = q.shape[-1] // dim if dim else 0
    if (keys.dim() != 4 or keys.shape[0] != 1 or values.shape != keys.shape or heads * dim != q.shape[-1] or kv_heads == 0
            or heads % kv_heads or past + tokens > capacity):
        raise ValueError(f"lean_cpu.attention: q {tuple(q.shape)} must be (T, heads * D) for keys/values (1, kv_heads, capacity, D) "
                         f"= {tuple(keys.shape)}, {tuple(values.shape)}, heads a multiple of kv_heads, past + T = {past + tokens} <= capacity")
    if block_mask is not None:
        if block_mask.shape != (tokens, tokens) or block_mask.dtype != torch.bool or block_mask.device.type != "cpu":
            raise ValueError(f"lean_cpu.attention: block_mask must be bool ({tokens}, {tokens}) on the CPU, got "
                             f"{tuple(block_mask.shape)} {block_mask.dtype} on {block_mask.device}")
        block_mask = block_mask.contiguous()
    if new is not None:
        if any(t.numel() != tokens * kv_heads * dim for t in new) or (rotary is not None and any(t.shape != (tokens, dim) for t in rotary)):
            raise ValueError(f"lean_cpu.attention: new keys/values must hold ({tokens}, {kv_heads * dim}) and cos/sin be ({tokens}, {dim}); "
                             f"got {[tuple(t.shape) for t in new]} and {None if rotary is None else [tuple(t.shape) for t in rotary]}")
    elif rotary is not None:
        raise ValueError("lean_cpu.attention: rotary is applied to the new keys with q; pass new=(keys, values) with it")
    return _bound(ext, path_cap(ext, path)).attention(q, keys, values, past, scale, block_mask=block_mask, new=new, rotary=rotary)

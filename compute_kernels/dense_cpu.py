"""A dense linear layer for a few input rows on the CPU, each weight read once (C: ``compute_kernels/_dense_cpu.c``).

``linear_cpu(x, weight, bias)`` is ``torch.nn.functional.linear`` for fp32 ``x`` with at most
``MAX_ROWS`` rows (all leading dimensions flattened) and an fp32 or bf16 ``weight``; the sums are
fp32. Its point is decoding at batch 1: one token, or the k+1 tokens of a speculative verify, cost
one pass over the weights, at the memory's speed. Each output's summation order depends on
neither the number of rows nor the thread count, so a row's result is bit-identical alone or in
a block of rows (a speculative verify reproduces one-token greedy decoding exactly).

``fast_linears(model)`` routes every ``nn.Linear`` of a CPU model through it while active, for
inputs of at most ``MAX_ROWS`` rows (longer ones, a prefill, stay with torch's matmul), and puts
the modules back as they were on exit. Where the extension is not built, or with
``PARETOLAB_CPU_KERNELS=0``, ``dense_cpu_kernel()`` is None and ``fast_linears`` changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from paretolab.kernels.cpu_ext import extension, path_cap

NAME = "_dense_cpu"
MAX_ROWS = 16  # rows of x above which torch's matmul (compute-bound by then) is used instead
PARALLEL_MIN = 1 << 15  # weights below which one thread does it all (waking a second costs more)
WEIGHT_DTYPES = (torch.float32, torch.bfloat16)


def dense_cpu_kernel() -> str | None:
    """The path ``linear_cpu`` takes now: ``"avx512"``, ``"avx2"`` or ``"scalar"``, or None (not built, or switched off)."""
    ext = extension(NAME)
    return None if ext is None else ext.isa()


def fits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether ``linear_cpu`` takes these tensors: CPU, fp32 x of at most MAX_ROWS rows, a contiguous fp32/bf16 weight."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and weight.device.type == "cpu" and weight.dtype in WEIGHT_DTYPES
            and weight.dim() == 2 and weight.is_contiguous() and x.shape[-1] == weight.shape[1]
            and x.numel() <= MAX_ROWS * max(1, weight.shape[1])
            and (bias is None or (bias.device.type == "cpu" and bias.dtype == torch.float32 and bias.shape == weight.shape[:1])))


def linear_cpu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, threads: int | None = None,
               path: str | None = None) -> torch.Tensor:
    """``x @ weight.T (+ bias)`` for x (..., K) of at most MAX_ROWS rows; ``path`` caps the instruction path (tests run each)."""
    ext = extension(NAME)
    if ext is None:
        raise RuntimeError("linear_cpu: the C extension paretolab.kernels._dense_cpu is not built or PARETOLAB_CPU_KERNELS=0; "
                           "check dense_cpu_kernel() first, or rebuild with `pip install -e . --no-deps --no-build-isolation`")
    if not fits(x, weight, bias):
        raise ValueError(f"linear_cpu needs CPU tensors: fp32 x (..., K) of at most {MAX_ROWS} rows, a contiguous fp32 or bf16 "
                         f"weight (N, K) and an fp32 bias (N,) or None; got x {tuple(x.shape)} {x.dtype} on {x.device}, weight "
                         f"{tuple(weight.shape)} {weight.dtype}, bias {None if bias is None else (tuple(bias.shape), bias.dtype)}")
    cap = path_cap(ext, path)
    n, k = weight.shape
    xc = x.contiguous()
    rows = xc.numel() // k if k else 0
    if threads is None:
        threads = torch.get_num_threads() if n * k >= PARALLEL_MIN else 1
    elif threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}; pass None for torch's thread count")
    y = torch.empty(*x.shape[:-1], n, dtype=torch.float32, device="cpu")  # the kernel runs on the CPU
    bias_ptr = 0 if bias is None else bias.contiguous().data_ptr()
    ext.linear(xc.data_ptr(), weight.data_ptr(), bias_ptr, y.data_ptr(), rows, k, n, weight.dtype == torch.bfloat16, threads, cap)
    return y


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` through ``linear_cpu`` where the kernel is on and takes the tensors (no autograd needed), else torch's.

    A bf16 weight beside fp32 ``x`` (a module stored in bf16 for the kernel's sake) is widened to
    fp32 on torch's path: the same products the kernel computes, for inputs it does not take.
    """
    if (fits(x, weight, bias) and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
            and extension(NAME) is not None):
        return linear_cpu(x, weight, bias)
    if weight.dtype != x.dtype and weight.dtype == torch.bfloat16 and x.dtype == torch.float32:
        weight = weight.float()
    return F.linear(x, weight, bias)


def _forward(module: nn.Linear, ext: Any) -> Any:
    """The module's forward while ``fast_linears`` is active.

    A decoder calls its linears ~200 times a token, so the common case is checked lean: what
    cannot change while active is settled once here (the weight's dtype, shape and layout, the
    bias), each call checks x and that the module still holds the same weight and bias (else, and
    for anything the lean checks do not take, ``linear`` decides as before). Same kernel call, so
    the same bits as ``linear_cpu``; ~5 us a call instead of ~11 (a token of SmolLM2: ~1 ms less).
    """
    weight, bias = module.weight, module.bias
    n, k = weight.shape
    bf16 = weight.dtype == torch.bfloat16
    lean = k > 0 and weight.device.type == "cpu" and weight.dtype in WEIGHT_DTYPES and weight.is_contiguous() and (
        bias is None or (bias.device.type == "cpu" and bias.dtype == torch.float32 and bias.shape == (n,) and bias.is_contiguous()))
    parallel = n * k >= PARALLEL_MIN
    best = path_cap(ext, None)

    def forward(x: torch.Tensor) -> torch.Tensor:
        if (lean and module.weight is weight and module.bias is bias and x.dtype == torch.float32 and x.device.type == "cpu"
                and x.shape[-1] == k and x.numel() <= MAX_ROWS * k and x.is_contiguous()
                and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))):
            y = torch.empty(*x.shape[:-1], n, dtype=torch.float32, device="cpu")  # the kernel runs on the CPU
            ext.linear(x.data_ptr(), weight.data_ptr(), 0 if bias is None else bias.data_ptr(), y.data_ptr(), x.numel() // k, k, n,
                       bf16, torch.get_num_threads() if parallel else 1, best)
            return y
        return linear(x, module.weight, module.bias)

    return forward


@contextmanager
def fast_linears(*models: nn.Module) -> Iterator[int]:
    """While active, the models' ``nn.Linear`` layers run ``linear_cpu`` on inputs of <= MAX_ROWS rows; yields how many.

    Nothing changes where the kernel is unavailable, a model is not on the CPU, or autograd needs
    the product (the kernel has no backward). On exit every module's own ``forward`` is back.
    """
    if dense_cpu_kernel() is None:
        yield 0
        return
    unique = {id(m): m for model in models for m in model.modules()}.values()  # a module shared by two models is swapped once
    swapped = [m for m in unique if type(m) is nn.Linear and m.weight.device.type == "cpu" and m.weight.dtype in WEIGHT_DTYPES
               and m.weight.is_contiguous() and "forward" not in m.__dict__]
    ext = extension(NAME)
    for module in swapped:
        module.forward = _forward(module, ext)  # an instance attribute shadows the class's forward
    try:
        yield len(swapped)
    finally:
        for module in swapped:
            del module.forward

"""MACKO: prune, then store each pruned Linear in the MACKO sparse format and run from it.

Format and SpMV kernel: V. Macko, V. Boža, "MACKO-SpMV" (github.com/vlejd/macko_spmv); the
format lives in ``paretolab.kernels.macko`` (see its docstring for the paper's details and
ours). The pruning is ``wanda`` (default) or ``magnitude`` scores per output row, a param.

What runs (our choices, the official code only ships the CUDA SpMV for batch 1):
- one token (batch*seq == 1) on a CUDA device with triton installed: the Triton SpMV kernel;
- up to ``CPU_KERNEL_MAX_TOKENS`` tokens on the CPU: the C SpMV (``paretolab.kernels.macko_cpu``,
  torch's thread count), which reads only the format's buffers; where the extension is not built
  or ``PARETOLAB_CPU_KERNELS=0``, the decode path below (same numbers up to summation order);
- everything else (more tokens, or CUDA without triton): the matrix is decoded from the format
  for that forward call only and multiplied with ``F.linear``; nothing dense is kept between
  calls (decoding costs ms per matrix on a CPU: that path saves memory, not time).
The layer keeps only the MACKO buffers (fp16 or bf16 values, 4-bit deltas, int32 row
pointers) plus its bias; ``size_bytes`` counts those buffers exactly (recorded as the storage
entry ``format:<module name>``), so the saving is real.
Values are rounded to the 16-bit value dtype, so outputs match the pruned fp32 model to fp16
precision, and exactly the pruned model with fp16-rounded weights up to summation order.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from optuna.distributions import CategoricalDistribution, FloatDistribution

from paretolab import Method, Metric, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.kernels.macko import MackoMatrix, dense_bytes, macko_decode, macko_encode
from paretolab.kernels.cpu_ext import enabled as cpu_kernels_enabled
from paretolab.kernels.macko_cpu import macko_spmv_cpu, spmv_runner
from paretolab.plugin_api.subject import Subject
from paretolab.plugins._layerwise import calib_seed
from paretolab.plugins.baselines import linear_weights, magnitude_mask
from paretolab.plugins.wanda import activation_norms, check_sparsity, wanda_mask

SCORES = ("wanda", "magnitude")
# Up to this many tokens a CPU forward runs the C SpMV (x read once per token per entry); more: decode + matmul.
# Measured here (1536x576 at 50 %, one thread): the kernel is faster up to about 64 tokens (decoding the matrix costs ~8 ms).
CPU_KERNEL_MAX_TOKENS = 64
VALUE_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


class MackoLinear(torch.nn.Module):
    """A Linear layer whose weight exists only as MACKO buffers; forward runs from the format."""

    def __init__(self, fmt: MackoMatrix, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = fmt.shape
        self.register_buffer("values", fmt.values)
        self.register_buffer("deltas", fmt.deltas)
        self.register_buffer("row_ptr", fmt.row_ptr)
        self.bias = torch.nn.Parameter(bias.detach().clone(), requires_grad=False) if bias is not None else None

    @classmethod
    def from_linear(cls, layer: torch.nn.Linear, *, value_dtype: torch.dtype = torch.float16) -> MackoLinear:
        """Encode ``layer.weight`` (zeros are not stored) into a new MackoLinear."""
        return cls(macko_encode(layer.weight, value_dtype=value_dtype), layer.bias)

    @property
    def fmt(self) -> MackoMatrix:
        return MackoMatrix(self.values, self.deltas, self.row_ptr, (self.out_features, self.in_features))

    @property
    def nbytes(self) -> int:
        """Stored bytes of the weight in MACKO format (the bias is not included)."""
        return self.fmt.nbytes

    def dense_module(self) -> torch.nn.Linear:
        """The fp32 ``nn.Linear`` this layer computes (``paretolab export`` writes it where a model must load in transformers)."""
        layer = torch.nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device=self.values.device)
        with torch.no_grad():
            layer.weight.copy_(macko_decode(self.fmt).float())
            if self.bias is not None:
                layer.bias.copy_(self.bias)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (..., in_features)
        if (x.dtype == torch.float32 and x.device.type == "cpu" and x.numel() <= CPU_KERNEL_MAX_TOKENS * self.in_features
                and x.is_contiguous() and not (x.requires_grad and torch.is_grad_enabled())):
            run = self._cpu_runner()
            if run is not None:  # decoding: the C SpMV with the format checked once (~200 calls a token)
                y = run(x)
                return y if self.bias is None else y + self.bias
        bias = None if self.bias is None else self.bias.to(x.dtype)
        if x.is_cuda and x.numel() == self.in_features and _triton_kernel() is not None:
            y = _triton_kernel()(self.fmt, x.reshape(self.in_features)).reshape(*x.shape[:-1], self.out_features)
            return y if bias is None else y + bias
        if x.device.type == "cpu" and x.shape[:-1].numel() <= CPU_KERNEL_MAX_TOKENS and not (x.requires_grad and torch.is_grad_enabled()):
            y = macko_spmv_cpu(self.fmt, x)  # the C kernel where built (else decode + matmul, the same numbers); no autograd
            return y if bias is None else y + bias
        weight = macko_decode(self.fmt).to(x.dtype)  # (out, in), freed after this call
        return F.linear(x, weight, bias)

    def _cpu_runner(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """The C SpMV for this layer's current buffers (built once, again after ``.to()`` or a swap), or None (kernel off)."""
        if not cpu_kernels_enabled():
            return None
        buffers = self._buffers
        values, deltas, row_ptr = buffers["values"], buffers["deltas"], buffers["row_ptr"]
        run = self.__dict__.get("_cpu_run")
        if run is None or run.buffers[0] is not values or run.buffers[1] is not deltas or run.buffers[2] is not row_ptr:
            if values.device.type != "cpu" or (self.bias is not None and self.bias.dtype != torch.float32):
                return None
            run = self.__dict__["_cpu_run"] = spmv_runner(self.fmt)
        return run

    def __getstate__(self) -> dict[str, Any]:  # pickling and deepcopy: the runner (a closure over addresses) is rebuilt on use
        state = self.__dict__.copy()
        state.pop("_cpu_run", None)
        return state

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, stored_bytes={self.nbytes}"


@functools.cache
def _triton_kernel() -> Callable[[MackoMatrix, torch.Tensor], torch.Tensor] | None:
    """The Triton SpMV where triton is installed, else None (then the decode path runs)."""
    try:
        from paretolab.kernels.macko_triton import macko_spmv_triton
    except ImportError:
        return None
    return macko_spmv_triton


class Macko(Method):
    """Prune (wanda or magnitude scores) and keep the pruned Linears in the MACKO format."""

    name = "macko"
    metrics = ("macko_bytes_ratio",)
    kind = "weights"
    works_on = ("linear",)
    replaces = ("linear",)  # MackoLinear: a later weights method finds no nn.Linear to change
    paper = Paper("MACKO-SpMV: Mutually Aligned Compressed coordinates Kernel Optimised SpMV", "", "https://github.com/vlejd/macko_spmv")
    cost_is = "real"

    def search_space(self) -> dict[str, Any]:
        return {
            "sparsity": FloatDistribution(0.0, 0.9),
            "score": CategoricalDistribution(list(SCORES)),
        }

    def defaults(self) -> dict[str, Any]:
        return {
            "sparsity": 0.5,
            "score": "wanda",
            "value_dtype": "float16",
            "calib_corpus": "pydoc",
            "calib_samples": 16,
            "calib_seq_len": 256,
            "calib_seed": -1,
        }

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        sparsity, score, dtype_name = float(p["sparsity"]), str(p["score"]), str(p["value_dtype"])
        check_sparsity(self.name, sparsity, "unstructured")
        if score not in SCORES:
            raise ConfigError(f"macko.score must be one of {', '.join(SCORES)}; got {score!r}")
        if dtype_name not in VALUE_DTYPES:
            raise ConfigError(f"macko.value_dtype must be one of {', '.join(VALUE_DTYPES)}; got {dtype_name!r}")
        norms = (
            activation_norms(subject, ctx, corpus=p["calib_corpus"], n_samples=int(p["calib_samples"]), seq_len=int(p["calib_seq_len"]),
                             seed=calib_seed(ctx, p))
            if score == "wanda"
            else {}
        )
        layers = list(linear_weights(subject.model))
        for name, layer in layers:
            with torch.no_grad():
                if score == "wanda":
                    mask = wanda_mask(layer.weight, norms[name], sparsity)
                else:
                    mask = magnitude_mask(layer.weight, sparsity, per_row=True)
                layer.weight.mul_(mask)
            packed = MackoLinear.from_linear(layer, value_dtype=VALUE_DTYPES[dtype_name])
            _replace_module(subject.model, name, packed)
            # The weight is no Parameter any more: the size measure reads formats under "format:<module>".
            subject.set_storage(f"format:{name}", stored_bytes=packed.nbytes)
        return subject

    def measure(self, subject: Subject, ctx: TrialContext) -> dict[str, float]:
        layers = [m for m in subject.model.modules() if isinstance(m, MackoLinear)]
        if not layers:
            return {}
        stored = sum(m.nbytes for m in layers)
        dense = sum(dense_bytes((m.out_features, m.in_features)) for m in layers)
        return {"macko_bytes_ratio": stored / dense}


def _replace_module(model: torch.nn.Module, name: str, new: torch.nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(Macko())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    register(
        Metric(
            "macko_bytes_ratio",
            "fraction",
            "minimize",
            "stored bytes of the MACKO-format layers over the same layers dense in fp16 (1.0 = no saving)",
        )
    )

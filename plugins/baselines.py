"""The two baselines every weights method is compared against: magnitude pruning and RTN quantization."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from optuna.distributions import CategoricalDistribution, FloatDistribution

from paretolab import Method, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.plugin_api.layers import linear_modules
from paretolab.plugin_api.subject import Subject


def linear_weights(model: torch.nn.Module, *, skip_lm_head: bool = True, scope: frozenset[str] | None = None) -> Iterator[tuple[str, torch.nn.Linear]]:
    """The Linear layers a weights method touches (the LM head and tied embeddings are left alone), within ``scope``
    (a per-layer stage's group, :attr:`Subject.scope`; None: all)."""
    yield from linear_modules(model, skip_lm_head=skip_lm_head, scope=scope)  # type: ignore[misc]


class Magnitude(Method):
    """Unstructured magnitude pruning: zero the smallest |w|, per output row or over each whole matrix.

    Storage is accounted as a bitmap of kept entries plus the kept values (``size_bytes`` falls
    with sparsity); the weights stay dense in memory, so the saving is ``simulated``.
    """

    name = "magnitude"
    works_on = ("linear",)
    lossless_setting = {"sparsity": 0.0}  # nothing pruned
    kind = "weights"
    layerwise = True
    paper = Paper("Learning both Weights and Connections for Efficient Neural Networks", "NeurIPS 2015", "https://arxiv.org/abs/1506.02626")
    cost_is = "simulated"

    def search_space(self) -> dict[str, Any]:
        return {
            "sparsity": FloatDistribution(0.0, 0.9),
            "scope": CategoricalDistribution(["row", "matrix"]),
        }

    def defaults(self) -> dict[str, Any]:
        return {"sparsity": 0.5, "scope": "row"}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        sparsity = float(params["sparsity"])
        scope = params["scope"]
        if not 0.0 <= sparsity < 1.0:
            raise ConfigError(f"magnitude.sparsity must be in [0, 1), got {sparsity}")
        if scope not in ("row", "matrix"):
            raise ConfigError(f"magnitude.scope must be 'row' or 'matrix', got {scope!r}")
        for name, layer in linear_weights(subject.model, scope=subject.scope):
            with torch.no_grad():
                layer.weight.mul_(magnitude_mask(layer.weight, sparsity, per_row=scope == "row"))
            subject.set_storage(f"{name}.weight", sparse=True)
        return subject


def magnitude_mask(weight: torch.Tensor, sparsity: float, *, per_row: bool) -> torch.Tensor:
    """A 0/1 mask keeping the largest-|w| ``1 - sparsity`` fraction (of each row, or of the matrix)."""
    scores = weight.abs() if per_row else weight.abs().reshape(1, -1)
    n_prune = int(scores.shape[1] * sparsity)
    mask = torch.ones_like(scores)
    if n_prune > 0:
        idx = torch.topk(scores, n_prune, dim=1, largest=False).indices
        mask.scatter_(1, idx, 0.0)
    return mask.reshape(weight.shape)


class RTN(Method):
    """Round-to-nearest weight quantization: symmetric, one scale per group of input channels.

    Fake-quantized (weights are dequantized back to float for the forward pass); ``size_bytes``
    counts ``bits`` per weight plus a 16-bit scale per group, so the saving is ``simulated``.
    """

    name = "rtn"
    works_on = ("linear",)
    lossless_setting = {"bits": 16}  # a 16-bit grid per group: below the logits' tolerance
    kind = "weights"
    layerwise = True
    paper = Paper("Round-to-nearest weight quantization (standard baseline)", "", "")
    cost_is = "simulated"

    def search_space(self) -> dict[str, Any]:
        return {
            "bits": CategoricalDistribution([2, 3, 4, 8]),
            "group_size": CategoricalDistribution([32, 64, 128, -1]),
        }

    def defaults(self) -> dict[str, Any]:
        return {"bits": 4, "group_size": 128}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        bits, group_size = int(params["bits"]), int(params["group_size"])
        if not 2 <= bits <= 16:
            raise ConfigError(f"rtn.bits must be between 2 and 16, got {bits}")
        if group_size == 0 or group_size < -1:
            raise ConfigError(f"rtn.group_size must be a positive number of input channels or -1 (whole row), got {group_size}")
        for name, layer in linear_weights(subject.model, scope=subject.scope):
            cols = layer.weight.shape[1]
            group = cols if group_size <= 0 else min(group_size, cols)
            with torch.no_grad():
                layer.weight.copy_(quantize_rtn(layer.weight, bits, group))
            subject.set_storage(f"{name}.weight", value_bits=bits, group_size=group, scale_bits=16)
        return subject


def quantize_rtn(weight: torch.Tensor, bits: int, group_size: int) -> torch.Tensor:
    """Symmetric round-to-nearest with one absmax scale per group along the input dimension.

    When ``group_size`` does not divide the row (SmolLM2's 576 channels with groups of 128),
    the last group of each row is shorter: zero padding never changes an absmax.
    """
    rows, cols = weight.shape
    pad = (-cols) % group_size
    padded = torch.nn.functional.pad(weight, (0, pad)) if pad else weight
    grouped = padded.reshape(rows, -1, group_size)
    qmax = 2 ** (bits - 1) - 1
    scale = grouped.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / qmax
    q = torch.clamp(torch.round(grouped / scale), -qmax - 1, qmax)
    return (q * scale).reshape(rows, -1)[:, :cols]


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    from paretolab.plugin_api.method import NoMethod

    register(NoMethod())
    register(Magnitude())
    register(RTN())

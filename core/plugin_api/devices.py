"""Tensors made without ``device=``: the contract suite's check that a method puts what it makes on the model's device."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode


# factory functions that make a tensor from nothing: where it lives is the caller's choice
_FACTORIES = frozenset({
    torch.arange, torch.empty, torch.eye, torch.full, torch.linspace, torch.logspace, torch.ones, torch.rand,
    torch.randint, torch.randn, torch.randperm, torch.tensor, torch.zeros,
})


class _DeviceNamed(TorchFunctionMode):
    """Raises when paretolab code (core, plugins, kernels) calls a tensor factory without ``device=``."""

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _FACTORIES and kwargs.get("device") is None:
            frame = sys._getframe(1)
            while frame is not None and frame.f_globals.get("__name__", "").startswith("torch"):
                frame = frame.f_back
            module = frame.f_globals.get("__name__", "") if frame is not None else ""
            if module.startswith("paretolab.") and not module.startswith("paretolab.testing"):
                raise RuntimeError(
                    f"{frame.f_code.co_filename}:{frame.f_lineno}: torch.{func.__name__}() without device=; "
                    "pass the model's device (or device='cpu' where the CPU is meant)"
                )
        return func(*args, **kwargs)


@contextmanager
def tensors_default_to(device: str = "meta") -> Iterator[None]:
    """Tensors made without ``device=`` fail: paretolab's own factory calls raise, others land on ``device``.

    A CPU run cannot see a tensor that would sit on the CPU beside a GPU model. Here a factory call
    in paretolab code (core, plugins, kernels) without ``device=`` raises with its file and line,
    and a tensor another library makes without one lands on "meta", so the first op that mixes it
    with the model's tensors fails. Code that means the CPU says ``device="cpu"``.
    """
    with torch.device(device), _DeviceNamed():
        yield

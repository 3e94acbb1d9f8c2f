"""Swap a model's nn.Linear layers for training-time wrappers and back (shared by prac and tetrajet).

The wrappers are built by a training hook's ``convert_model``, i.e. *after* the ``train`` stage has
(re)initialised the weights, so a method's trial starts from exactly the weights of its ``none``
baseline with the same train seed. A wrapper keeps the original Linear's ``weight`` and ``bias``
Parameters (the same objects, under the same names), so the optimizer, weight decay groups,
checkpoints (``save_as``) and tied embeddings see no difference. The LM head is left alone: in the
scratch models it is the tied embedding matrix (``linear_weights`` skips it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from paretolab.plugins.baselines import linear_weights


class WrappedLinear(torch.nn.Module):
    """Base of a training-time Linear wrapper: the original's Parameters under their own names, the original kept for unwrapping."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self._original = (linear,)  # a tuple, not a submodule: no second copy of the names in the state dict

    @property
    def original(self) -> torch.nn.Linear:
        return self._original[0]

    def reset_parameters(self) -> None:
        """A later ``init: reinit`` while still wrapped: torch's Linear initialisation (not transformers' normal(0, 0.02))."""
        self.original.reset_parameters()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def replace_module(model: torch.nn.Module, name: str, new: torch.nn.Module) -> None:
    """Put ``new`` where the submodule called ``name`` is."""
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


def wrap_linears(model: torch.nn.Module, build: Callable[[str, torch.nn.Linear], WrappedLinear]) -> list[WrappedLinear]:
    """Replace every Linear but the LM head with ``build(name, linear)``; Linears already wrapped stay as they are."""
    wrapped = [m for m in model.modules() if isinstance(m, WrappedLinear)]
    for name, linear in list(linear_weights(model)):
        module = build(name, linear)
        replace_module(model, name, module)
        wrapped.append(module)
    return wrapped


def unwrap_linears(model: torch.nn.Module, kind: type[WrappedLinear] = WrappedLinear) -> int:
    """Put the original Linears back in place of the wrappers of ``kind``; returns how many."""
    names = [name for name, m in model.named_modules() if isinstance(m, kind)]
    for name in names:
        replace_module(model, name, model.get_submodule(name).original)
    return len(names)


def wrappers(model: torch.nn.Module, kind: type[WrappedLinear] = WrappedLinear) -> list[WrappedLinear]:
    """The wrapped Linears of ``kind`` in module order."""
    return [m for m in model.modules() if isinstance(m, kind)]

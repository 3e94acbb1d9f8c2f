"""Training memory: activations saved for backward (saved-tensor hooks) and the whole training footprint."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


class SavedActivations:
    """Bytes of the distinct storages autograd saved for backward during the block (parameters left out)."""

    def __init__(self) -> None:
        self.storages: dict[int, int] = {}

    @property
    def mb(self) -> float:
        return sum(self.storages.values()) / 2**20


@contextmanager
def saved_activations(model: torch.nn.Module) -> Iterator[SavedActivations]:
    """Record what one forward saves for its backward. Every saved tensor stays alive until backward,
    so the sum over unique storages is the peak of activation memory the step holds at once."""
    meter = SavedActivations()
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse or wrapper tensors have no plain storage
            return tensor
        ptr = storage.data_ptr()
        if ptr not in weights:
            meter.storages[ptr] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield meter


def state_mb(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> float:
    """Parameters + gradients (one per trainable parameter) + the optimizer's state tensors, in MiB."""
    params = list(model.parameters())
    weights = sum(p.numel() * p.element_size() for p in params)
    grads = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    moments = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor))
    return (weights + grads + moments) / 2**20

"""The subject of a trial: a model, its tokenizer, and how it generates."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch

from paretolab.storage import DENSE, TensorStorage


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on a CUDA ``device`` (a no-op elsewhere), so a timer read after it holds that work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Subject:
    """What methods transform and tasks evaluate.

    - weights methods change ``model`` (and record how tensors are stored in ``storage``);
    - decoding methods replace ``generator`` (an object with ``generate(subject, prompts, ...)``)
      or the model's attention modules for prefill;
    - tokenizer methods replace ``tokenizer`` (and must keep its ids identical or say so);
    - training/architecture methods change ``model`` before a training stage.
    ``info`` carries facts a method wants reported (e.g. ``bits_per_weight``);
    ``cost_is`` lists which methods' savings are simulated.
    """

    model: torch.nn.Module
    tokenizer: Any
    model_name: str
    generator: Any = None
    storage: dict[str, TensorStorage] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    simulated_by: list[str] = field(default_factory=list)

    def storage_of(self, param_name: str) -> TensorStorage:
        """How parameter ``param_name`` is stored (dense in its dtype unless a method said otherwise)."""
        return self.storage.get(param_name, DENSE)

    def set_storage(self, param_name: str, **changes: object) -> None:
        """Compose a storage change (e.g. ``sparse=True``) onto what earlier stages set."""
        self.storage[param_name] = self.storage_of(param_name).with_(**changes)

    def copy(self) -> Subject:
        """A private deep copy for one trial (the tokenizer is shared: methods replace, never mutate it)."""
        return Subject(
            model=copy.deepcopy(self.model),
            tokenizer=self.tokenizer,
            model_name=self.model_name,
            generator=copy.deepcopy(self.generator),
            storage=dict(self.storage),
            info=copy.deepcopy(self.info),
            simulated_by=list(self.simulated_by),
        )

    def to(self, device: torch.device | str) -> Subject:
        """Move the model (and a generator's own modules, e.g. a draft) to ``device``; returns self."""
        self.model.to(device)
        if hasattr(self.generator, "to"):
            self.generator.to(device)
        return self

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

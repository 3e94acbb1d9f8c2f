"""The subject of a trial: a model, its tokenizer, and how it generates."""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from paretolab.plugin_api.storage import DENSE, TensorStorage

_TOKENIZER_ATTRS = ("padding_side", "truncation_side", "model_max_length", "chat_template", "special_tokens_map")
_BACKEND_ATTRS = ("normalizer", "pre_tokenizer", "post_processor", "decoder", "padding", "truncation")


def tokenizer_state(tokenizer: Any) -> tuple[str, ...]:
    """A cheap fingerprint (~30 µs) of what can change in place: size, added and special tokens, settings, pipeline."""
    parts = [type(tokenizer).__name__]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    probes = [("len", lambda: len(tokenizer)), ("added", lambda: sorted(tokenizer.get_added_vocab().items()))]
    probes += [(a, lambda a=a: getattr(tokenizer, a, None)) for a in _TOKENIZER_ATTRS]
    probes += [(a, lambda a=a: getattr(backend, a, None)) for a in _BACKEND_ATTRS if backend is not None]
    for name, probe in probes:
        try:
            parts.append(f"{name}={probe()!r}")
        except Exception:  # a tokenizer without this feature
            parts.append(f"{name}=?")
    return tuple(parts)


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
    - training/architecture methods change ``model`` before a ``train`` stage, or attach hooks to
      ``training`` (see :mod:`paretolab.training.hooks`) for what happens during it;
    - routing methods set ``router`` (a policy choosing which of the pipeline's role models answer,
      see :mod:`paretolab.plugins.routing`); the models themselves stay shared and unchanged.
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
    # The tensor (or, for "format:<module>", the module) each storage record was set for: a record
    # whose tensor has since been replaced describes a weight that is gone and no longer applies.
    storage_owner: dict[str, weakref.ref] = field(default_factory=dict, repr=False)
    pristine_tokenizer: Any = field(default=None, repr=False, compare=False)  # kept by a base subject to undo in-place changes
    # paretolab.training.hooks.Training: hooks training-time methods attached, tokens/FLOPs trained, the curve (None: never trained here)
    training: Any = None
    router: Any = None  # a routing method's policy over the role models (None: the subject's own model answers)
    # The modules a layerwise method may change now (a per-layer stage applies it group by group); None: every module
    scope: frozenset[str] | None = field(default=None, repr=False)

    def storage_of(self, param_name: str) -> TensorStorage:
        """How parameter ``param_name`` is stored (dense in its dtype unless a method said otherwise)."""
        if self._replaced(param_name):
            return DENSE
        return self.storage.get(param_name, DENSE)

    def set_storage(self, param_name: str, **changes: object) -> None:
        """Compose a storage change (e.g. ``sparse=True``) onto what earlier stages set for the same tensor."""
        self.storage[param_name] = self.storage_of(param_name).with_(**changes)
        owner = self._owner(param_name)
        if owner is None:
            self.storage_owner.pop(param_name, None)
        else:
            self.storage_owner[param_name] = weakref.ref(owner)

    def current_storage(self) -> dict[str, TensorStorage]:
        """The storage records that still describe a tensor or module of the model."""
        return {name: record for name, record in self.storage.items() if not self._replaced(name)}

    def _owner(self, name: str) -> Any:
        """The Parameter/buffer ``name`` names, or the module of a ``format:<module>`` record; None if absent."""
        path = name[len("format:"):] if name.startswith("format:") else name
        target: Any = self.model
        for part in path.split(".") if path else []:
            target = getattr(target, part, None)
            if target is None:
                return None
        return target if isinstance(target, (torch.Tensor, torch.nn.Module)) else None

    def _replaced(self, name: str) -> bool:
        ref = self.storage_owner.get(name)
        return ref is not None and ref() is not self._owner(name)

    def copy(self) -> Subject:
        """A private deep copy for one trial; the tokenizer is shared (copying SmolLM2's costs 0.35 s and
        every per-tokenizer cache): methods replace it, never mutate it, and run_trial fails one that does."""
        if self.pristine_tokenizer is None:
            self.pristine_tokenizer = copy.deepcopy(self.tokenizer)
        storage = self.current_storage()  # records of replaced tensors are dropped, not copied
        twin = Subject(
            model=copy.deepcopy(self.model),
            tokenizer=self.tokenizer,
            model_name=self.model_name,
            generator=copy.deepcopy(self.generator),
            storage=storage,
            info=copy.deepcopy(self.info),
            simulated_by=list(self.simulated_by),
            training=copy.deepcopy(self.training),
            router=copy.deepcopy(self.router),
        )
        for name in storage:
            owner = twin._owner(name) if name in self.storage_owner else None
            if owner is not None:  # the copy's tensor at the same name is the twin of the one the record describes
                twin.storage_owner[name] = weakref.ref(owner)
        return twin

    def restore_tokenizer(self) -> None:
        """Put back the tokenizer as it was at the first copy (after a method changed the shared one in place)."""
        if self.pristine_tokenizer is not None:
            self.tokenizer = copy.deepcopy(self.pristine_tokenizer)

    def to(self, device: torch.device | str) -> Subject:
        """Move the model (and a generator's own modules, e.g. a draft) to ``device``; returns self."""
        self.model.to(device)
        if hasattr(self.generator, "to"):
            self.generator.to(device)
        return self

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

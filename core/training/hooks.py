"""How a training-time method plugs into the ``train`` stage: one small hooks object per method.

A method's ``transform`` runs before the ``train`` stage it changes. It may change the model
directly (surgery: replace norms, tie projections, widen) and, for anything that happens *during*
training, attach a :class:`TrainingHook` to the subject::

    def transform(self, subject, params, ctx):
        training_of(subject).attach(MyHook(rate=params["rate"]), method=self.name)
        return subject

The ``train`` stage then calls every attached hook at fixed events, in the order the stages
attached them; ``end_of_training`` runs in reverse order (the last to wrap undoes first, as
with context managers). Hooks stay attached for later ``train`` stages of the same trial
(train → mup_upscale → train), and are copied with the subject.

What we took from others, and why:
- Composer's events/algorithms (a named event list, algorithms as small objects) — but with a
  fixed, short list of typed methods instead of a string event bus, so a typo is an
  AttributeError and an IDE completes them.
- torchtitan's model converters: surgery is a plain function over the module tree, run once
  before training (``convert_model``), not a subclass of the model.
- HF/Lightning callbacks' known problems: silent conflicts (two callbacks both replacing the
  loss) and order that depends on registration accidents. Here an event that *replaces*
  something (``loss``, ``data``) is owned by one hook: a second one is refused with an error
  naming both methods; and order is the pipeline's stage order, nothing else.
- Resuming: a trial is the unit of retry; a killed training trial reruns from its start, so
  hooks keep no state outside ``TrainState``/the subject.

The ``TrainState`` passed to every hook is the loop's live state (``step``, ``tokens``,
``flops``, ``max_steps``, the ``model``, ``optimizer``, ``params`` of the train stage, the
``ctx``) — see :mod:`paretolab.training.loop`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from paretolab.errors import ConfigError

if TYPE_CHECKING:
    from paretolab.plugin_api.subject import Subject

REPLACEABLE = ("loss", "data")


class TrainingHook:
    """Override any subset. Every method gets the loop's ``state``; return values are used only
    where the docstring says so. ``replaces`` names the events this hook owns outright (a subset
    of ``loss`` and ``data``): only one attached hook may own each."""

    replaces: ClassVar[tuple[str, ...]] = ()
    method: str = ""  # set by attach(): the method (stage) that attached the hook, for messages

    def convert_model(self, model: torch.nn.Module, state: Any) -> torch.nn.Module | None:
        """Before the first step of each train stage (after (re)initialisation): change the model; return a new one or None."""

    def param_groups(self, groups: list[dict[str, Any]], state: Any) -> list[dict[str, Any]] | None:
        """Before the optimizer is built: change the parameter groups (e.g. per-group lr for μP); return them or None."""

    def data(self, state: Any) -> Iterator[torch.Tensor] | None:
        """Replace the data source: an iterator of (batch, seq_len + 1) token-id tensors on ``state.device``. Owner only."""

    def loss(self, model: torch.nn.Module, batch: torch.Tensor, state: Any) -> torch.Tensor | None:
        """Replace the loss of one step (the default is next-token cross-entropy). Owner only."""

    def before_step(self, state: Any) -> None:
        """Before the forward pass of each optimizer step (e.g. choose the layers to skip). A hook that adds or replaces
        parameters here sets ``state.rebuild_optimizer = True``: the loop then rebuilds AdamW (groups again through
        ``param_groups``) before this step, carrying the moments of parameters whose name and shape are unchanged."""

    def after_backward(self, state: Any) -> None:
        """After backward, before clipping and the optimizer step (e.g. change gradients)."""

    def after_step(self, state: Any) -> None:
        """After the optimizer step (``state.last_loss`` holds this step's loss)."""

    def step_signature(self, state: Any) -> tuple[Any, ...]:
        """What makes this step's compute differ from another's (e.g. the set of skipped layers):
        FLOPs are counted once per distinct signature. Default: nothing."""
        return ()

    def end_of_training(self, state: Any) -> None:
        """After the last step of each train stage (reverse order): undo temporary changes, record facts."""


@dataclass
class Training:
    """The training facts a subject carries between stages: attached hooks, what was trained so far,
    the optimizer state a later stage may carry over, and the metrics/curve the ``train`` stage reports."""

    hooks: list[TrainingHook] = field(default_factory=list)
    stages_run: int = 0  # train stages finished on this subject
    tokens: int = 0  # training tokens seen, all stages
    flops: float = 0.0  # training FLOPs spent, all stages (forward + backward, attention counted)
    optimizer_state: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)  # parameter name -> AdamW state
    metrics: dict[str, float] = field(default_factory=dict)  # what the train stage reports (train_flops, val_loss, ...)
    curve: list[dict[str, float]] = field(default_factory=list)  # one row per eval point: step, tokens, flops, train_loss, val_loss, lr, s

    def attach(self, hook: TrainingHook, *, method: str) -> TrainingHook:
        """Attach ``hook`` for ``method``; refuse a second owner of the loss or the data, naming both."""
        hook.method = method
        for event in hook.replaces:
            if event not in REPLACEABLE:
                raise ConfigError(f"method {method!r}: a training hook can replace only {', '.join(REPLACEABLE)}; got {event!r}")
            owner = self.owner(event)
            if owner is not None:
                raise ConfigError(
                    f"methods {owner.method!r} and {method!r} both replace the training {event}; "
                    f"a trial can have one {event} replacement: drop one of them from the pipeline's stages"
                )
        self.hooks.append(hook)
        return hook

    def owner(self, event: str) -> TrainingHook | None:
        """The attached hook that replaces ``event`` (``loss`` or ``data``), if any."""
        return next((h for h in self.hooks if event in h.replaces), None)

    def of_type(self, kind: type) -> list[TrainingHook]:
        return [h for h in self.hooks if isinstance(h, kind)]


def training_of(subject: Subject) -> Training:
    """The subject's training record, created on first use."""
    if subject.training is None:
        subject.training = Training()
    return subject.training

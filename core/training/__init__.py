"""Training as a stage of a study: the ``train`` method, the loop, its hooks and its measures.

- :mod:`paretolab.training.hooks` — how a training-time method plugs in (one hooks object).
- :mod:`paretolab.training.loop` — the loop: budget in tokens/FLOPs/wall time, AdamW with warm-up
  and cosine decay, clipping, evaluation points, seeds that fix init and data order.
- :mod:`paretolab.training.flops` — FLOPs per step (FlopCounterMode, attention counted on CPU too).
- :mod:`paretolab.training.memory` — activations saved for backward, and the training footprint.
- :mod:`paretolab.training.batches` — the tokenized corpus (cached on disk), seeded windows, held-out windows.
- :mod:`paretolab.training.method` — the ``train`` stage as a method plugin, its metrics and its curve.
"""

from paretolab.training.hooks import Training, TrainingHook, training_of

__all__ = ["Training", "TrainingHook", "training_of"]

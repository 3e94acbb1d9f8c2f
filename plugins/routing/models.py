"""A cheaper SmolLM2 variant for the routing test bed: SmolLM2-135M with layers removed by block influence.

``smollm2-135m-drop8`` is SmolLM2-135M with the 8 of its 30 decoder layers of lowest ShortGPT block
influence (1 - cos(layer input, output), measured on 8 x 256 tokens of the built-in pydoc corpus,
seed 0) removed at load time (:mod:`paretolab.plugins.layerdrop`); it shares SmolLM2's tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from paretolab.data import calibration_ids
from paretolab.models import ModelSource, SmolLM2
from paretolab.plugin_api.hookspec import hookimpl
from paretolab.plugin_api.subject import Subject


class LayerDroppedSmolLM2(ModelSource):
    """SmolLM2-135M minus its ``k`` lowest block-influence layers (deterministic: fixed corpus, seed and sample)."""

    def __init__(self, k: int = 8) -> None:
        self.k = k
        self.name = f"smollm2-135m-drop{k}"
        self.description = f"SmolLM2-135M with the {k} of 30 layers of lowest block influence (ShortGPT, pydoc 8x256 tokens, seed 0) removed"
        self.weights = SmolLM2.weights
        self.vocab_size = SmolLM2.vocab_size
        self.base = SmolLM2()

    def is_cached(self) -> bool:
        return self.base.is_cached()

    def check(self) -> None:
        self.base.check()

    def pull(self) -> str:
        return self.base.pull()

    def load(self) -> Subject:
        from paretolab.plugins.layerdrop import layers_to_drop, remove_layers

        subject = self.base.load()
        ids = calibration_ids(subject.tokenizer, corpus="pydoc", n_samples=8, seq_len=256, seed=0)
        drop = layers_to_drop(subject.model, ids, self.k, "block_influence", torch.Generator(device="cpu").manual_seed(0))
        remove_layers(subject.model, drop)
        subject.model_name = self.name
        subject.info["dropped_layers"] = ",".join(map(str, drop))
        return subject

    def stored_bytes(self, subject: Subject) -> float:
        from paretolab.plugin_api.storage import unique_parameters

        kept = sum(t.numel() for _, t in unique_parameters(subject.model))
        full = 134_515_008  # SmolLM2-135M's parameters: the GGUF's bytes scaled by the share kept
        return self.base.stored_bytes(subject) * kept / full


@hookimpl
def register_models(register: Callable[[ModelSource], None]) -> None:
    register(LayerDroppedSmolLM2(8))

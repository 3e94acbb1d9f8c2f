"""Self-speculative drafting: the target itself, with some decoder layers skipped, is the draft.

Draft & Verify (Zhang et al., ACL 2024) drafts with the target minus some layers and verifies with
the full target; the paper picks the layers by Bayesian optimisation. Ours: the layers are scored
by the layerdrop plugin's layer-importance code (block influence, or its iterative representation
shift, on calibration text) and the least important go, no search, no adaptive draft length.
Also ours: the draft keeps its own KV cache (the skipped pass sees different hidden states,
so the target's cache is not reused), and it runs on the target's own weights (nothing copied):
during a draft forward the layerdrop plugin's ``layers_removed`` takes the skipped layers out, then puts them back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from paretolab.generation import forward_with_cache
from paretolab.plugins._layerwise import decoder_layers
from paretolab.plugins.layerdrop import layers_removed
from paretolab.plugins.speculative.generator import crop_cache


class LayerSkipDrafter:
    """Drafts greedily with the target minus the layers in ``skip`` (its own KV cache, rolled back to what was accepted)."""

    feature_layers: tuple[int, ...] = ()
    modules: tuple[torch.nn.Module, ...] = ()  # it runs on the target's own weights

    def __init__(self, skip: Sequence[int]) -> None:
        self.skip = tuple(sorted(skip))
        self.model: torch.nn.Module | None = None
        self.cache: Any = None
        self.fed: list[int] = []  # tokens whose keys/values are in self.cache, in order

    def __getstate__(self) -> dict[str, Any]:
        # a copied subject copies its generator: never drag the target model or a stale cache along
        return {**self.__dict__, "model": None, "cache": None, "fed": []}

    def start(self, target: torch.nn.Module) -> None:
        n = len(decoder_layers(target))
        if any(not 0 <= i < n for i in self.skip) or len(self.skip) >= n:
            raise ValueError(f"layers to skip {list(self.skip)} do not fit a model with {n} layers (keep at least one)")
        self.model, self.cache, self.fed = target, None, []

    @torch.no_grad()
    def propose(self, ids: list[int], features: torch.Tensor | None, k: int) -> list[int]:
        if k < 1:
            return []
        assert self.model is not None, "start() must be called before propose()"
        common = 0
        limit = min(len(self.fed), len(ids) - 1)  # always feed at least the last token, for its logits
        while common < limit and self.fed[common] == ids[common]:
            common += 1
        if self.cache is not None:
            crop_cache(self.cache, common)
        self.fed = self.fed[:common]
        device = next(self.model.parameters()).device
        draft: list[int] = []
        feed = ids[common:]
        with layers_removed(self.model, self.skip):
            while len(draft) < k:
                logits, self.cache = forward_with_cache(self.model, torch.tensor([feed], device=device), self.cache, last_only=True)
                self.fed.extend(feed)
                draft.append(int(logits[0, -1].argmax()))
                feed = draft[-1:]
        return draft

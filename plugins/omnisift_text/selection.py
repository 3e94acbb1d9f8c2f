"""Which tokens of a prompt enter prefill: a budget, protected last tokens, and a score per token from each selector.

Every selector keeps ``k = max(1, round(keep · L))`` of a prompt's L tokens in total: the last
``protect_last`` always (they count against k), the rest the highest-scoring earlier tokens, all in
their original order. The scores, and the FLOPs spent computing them:

- ``random``: uniform draws from the trial's seeded stream (one stream over the prompts in order); 0 FLOPs;
- ``recent``: the position itself, so the last k tokens are kept; 0 FLOPs;
- ``attention`` (SnapKV/H2O-style): one full-prompt forward of the subject; a token's score is the
  attention probability the last ``window`` queries give it, averaged over the window, the heads and
  the layers; the decoder layers on L tokens;
- ``perplexity`` (LLMLingua-style): the subject's surprisal ``-log p(x_i | x_<i)`` from one full
  forward, highest kept; the first token has no context and gets the mean surprisal of the others
  (neither favoured nor penalised); the layers on L tokens and the LM head on L - 1;
- ``learned``: the trained selector on the input embeddings (:mod:`.network`); its own FLOPs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from paretolab.plugins.omnisift_text.flops import LMShape
from paretolab.plugins.omnisift_text.masking import MaskState, patched
from paretolab.plugins.omnisift_text.network import TokenSelector, token_features

SELECTORS = ("learned", "random", "recent", "attention", "perplexity")


def budget(length: int, keep: float) -> int:
    """Tokens that enter prefill for a prompt of ``length``."""
    return min(length, max(1, round(keep * length)))


def top_kept(scores: torch.Tensor, k: int, protect_last: int) -> list[int]:
    """Sorted positions: the last ``protect_last`` (at most k) and the best-scoring earlier ones, k in all."""
    length = scores.shape[0]
    k = min(k, length)
    protected = min(protect_last, k)
    free = k - protected
    chosen = torch.topk(scores[: length - protected], free).indices.tolist() if free > 0 else []
    return sorted(chosen + list(range(length - protected, length)))


@dataclass
class Selection:
    """A selector with its settings; ``select`` gives a prompt's kept positions and the FLOPs spent scoring it."""

    selector: str
    keep: float
    protect_last: int
    window: int = 8
    rng: torch.Generator | None = None  # random's stream (CPU, seeded)
    net: TokenSelector | None = None  # learned's network

    def select(self, model: torch.nn.Module, prompt: Sequence[int]) -> tuple[list[int], float]:
        length = len(prompt)
        k = budget(length, self.keep)
        if k >= length:
            return list(range(length)), 0.0
        device = next(model.parameters()).device
        ids = torch.tensor(list(prompt), dtype=torch.long, device=device)
        scores, flops = self.scores(model, ids)
        return top_kept(scores, k, self.protect_last), flops

    @torch.no_grad()
    def scores(self, model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, float]:
        """(L,) scores of one prompt's ids and the FLOPs spent."""
        length = ids.shape[0]
        if self.selector == "recent":
            return torch.arange(length, dtype=torch.float32, device=ids.device), 0.0
        if self.selector == "random":
            assert self.rng is not None, "the random selector needs its seeded stream"
            return torch.rand(length, generator=self.rng, device="cpu").to(ids.device), 0.0
        shape = LMShape.of(model)
        if self.selector == "attention":
            return attention_scores(model, ids, self.window), shape.layer_flops(length)
        if self.selector == "perplexity":
            return surprisal_scores(model, ids), shape.layer_flops(length) + shape.head_flops(length - 1)
        if self.selector == "learned":
            assert self.net is not None, "the learned selector needs its trained network"
            return learned_scores(self.net, model, ids), self.net.flops(length)
        raise ValueError(f"unknown selector {self.selector!r}")


def attention_scores(model: torch.nn.Module, ids: torch.Tensor, window: int) -> torch.Tensor:
    """Attention mass from the last ``window`` queries per key, averaged over heads and layers: (L,)."""
    with patched(model, MaskState(window=min(window, ids.shape[0]))) as state:
        model.model(input_ids=ids[None], use_cache=False)
    return torch.stack(state.recorded).mean(0)[0]


def surprisal_scores(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """-log p(x_i | x_<i) from one forward: (L,); the first token gets the others' mean."""
    hidden = model.model(input_ids=ids[None], use_cache=False).last_hidden_state[0, :-1]
    logp = torch.log_softmax(model.get_output_embeddings()(hidden).float(), dim=-1)
    rest = -logp.gather(-1, ids[1:, None])[:, 0]
    first = rest.mean() if rest.numel() else torch.zeros((), device=ids.device)
    return torch.cat([first[None], rest])


def learned_scores(net: TokenSelector, model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The selector's scores on the frozen input embeddings: (L,)."""
    embeds = model.get_input_embeddings()(ids)[None].float()
    return net(embeds, token_features(ids)[None])[0]

"""The learned selector: a score per context token from the frozen LM's input embeddings (no LM forward).

Ours (the paper's compressor works on audio and video tokens with a spatio-temporal module):
``tanh(Linear(d → h))`` of each token's input embedding, concatenated with three position and
repetition features, then a bidirectional GRU of ``h`` per direction, then ``Linear(2h → 1)``;
plus a linear prior on the features. The prior starts as "more recent scores higher"
(``-PRIOR_RECENCY`` on the log distance to the prompt's end, the head near zero), so the untrained
selector keeps the most recent tokens and training moves it away from that where the loss says so.

Features of token i of a context of length L: ``log(1 + L - 1 - i) / 5`` (distance to the end),
``i / (L - 1)`` (relative position), ``log(1 + occurrences of the same id elsewhere in the context)``.
Parameters are initialised from a seeded CPU generator (never torch's global RNG).
"""

from __future__ import annotations

import math

import torch
from torch import nn

FEATURES = 3
PRIOR_RECENCY = 4.0


def token_features(ids: torch.Tensor) -> torch.Tensor:
    """(L, FEATURES) features of one context's ids (L,)."""
    length = ids.shape[0]
    pos = torch.arange(length, device=ids.device, dtype=torch.float32)
    to_end = torch.log1p(length - 1 - pos) / 5.0
    rel = pos / max(1, length - 1)
    repeats = torch.log1p((ids[:, None] == ids[None, :]).sum(-1).float() - 1.0)
    return torch.stack([to_end, rel, repeats], dim=-1)


class TokenSelector(nn.Module):
    """Scores (B, L) for input embeddings (B, L, d) and features (B, L, FEATURES); higher = keep."""

    def __init__(self, d_model: int, hidden: int, *, seed: int, device: torch.device) -> None:
        super().__init__()
        self.d_model, self.hidden = d_model, hidden
        with torch.random.fork_rng(devices=[]):  # construction draws from the global RNG; it is restored, then overwritten
            self.proj = nn.Linear(d_model, hidden, device=device)
            self.gru = nn.GRU(hidden + FEATURES, hidden, batch_first=True, bidirectional=True, device=device)
            self.head = nn.Linear(2 * hidden, 1, device=device)
            self.prior = nn.Linear(FEATURES, 1, bias=False, device=device)
        g = torch.Generator(device="cpu").manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                fan_in = p.shape[-1] if p.dim() > 1 else hidden
                bound = 1.0 / math.sqrt(fan_in)
                if name.startswith("head"):
                    bound *= 0.1  # the learned part starts small beside the recency prior
                p.copy_(torch.empty(p.shape, device="cpu").uniform_(-bound, bound, generator=g))
            self.prior.weight.copy_(torch.tensor([[-PRIOR_RECENCY, 0.0, 0.0]], device="cpu"))

    def forward(self, embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        x = torch.cat([torch.tanh(self.proj(embeds)), features], dim=-1)
        mixed, _ = self.gru(x)
        return self.head(mixed).squeeze(-1) + self.prior(features).squeeze(-1)

    def flops(self, n: int) -> float:
        """Matmul FLOPs of scoring n tokens (as FlopCounterMode counts them; the tests check it)."""
        h, f = self.hidden, FEATURES
        gru = 2 * 2 * n * 3 * h * (h + f + h)  # two directions, three gates, input and hidden matmuls
        return float(2 * n * self.d_model * h + gru + 2 * n * 2 * h + 2 * n * f)

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

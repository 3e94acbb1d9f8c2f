"""Forward FLOPs of a Llama-style LM on n tokens, counted as ``paretolab.training.flops`` counts them.

Matmuls only (2 per multiply-add); attention as torch's ``sdpa_flop_count`` counts it, ``Q·Kᵀ`` and
``P·V`` in full (``4·h·n²·d_head`` per layer, no causal discount). A prefill that produces one next
token runs the decoder layers on the n prompt tokens and the LM head on the last one
(``paretolab.generation`` asks for the last position's logits only). The tests check these
formulas against ``FlopCounterMode`` on the tiny model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LMShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int

    @classmethod
    def of(cls, model: torch.nn.Module) -> LMShape:
        c = model.config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return cls(c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads or c.num_attention_heads,
                   head_dim, c.intermediate_size, c.vocab_size)

    def layer_flops(self, n: int) -> float:
        """The decoder layers on n tokens: projections, gated MLP, attention."""
        projections = 2 * n * self.hidden * (2 * self.heads + 2 * self.kv_heads) * self.head_dim
        mlp = 2 * n * 3 * self.hidden * self.ffn
        attention = 4 * self.heads * self.head_dim * n * n
        return float(self.layers * (projections + mlp + attention))

    def head_flops(self, n: int) -> float:
        """The LM head on n positions."""
        return float(2 * n * self.hidden * self.vocab)

    def prefill_flops(self, n: int) -> float:
        """A prefill of n tokens that yields the next token's logits."""
        return self.layer_flops(n) + self.head_flops(1)

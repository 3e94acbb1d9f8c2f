"""The FLOP counter against a hand count for one small model."""

from __future__ import annotations

import torch

from paretolab.training.flops import StepFlops


def _hand_count(model, batch: int, seq: int) -> int:
    """6 · tokens · matmul parameters (forward 2, backward 4) + attention: forward 4·b·h·s²·d per layer, backward twice that."""
    cfg = model.config
    tokens = batch * seq
    matmul_params = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))  # lm_head included (tied)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    attention_forward = 4 * batch * cfg.num_attention_heads * seq * seq * head_dim * cfg.num_hidden_layers
    return 6 * tokens * matmul_params + 3 * attention_forward


def test_counter_matches_the_hand_count_exactly_with_cpu_attention_counted(tiny):
    model = tiny.model.train()
    batch = torch.randint(0, model.config.vocab_size, (4, 33), generator=torch.Generator().manual_seed(0))
    counter = StepFlops()
    key = (tuple(batch.shape), ())
    with counter.counting(key):
        logits = model(input_ids=batch[:, :-1]).logits
        torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)).backward()
    assert counter.get(key) == _hand_count(model, 4, 32)
    assert model.config._attn_implementation == "sdpa"  # the CPU SDPA kernel is what the registered formulas count


def test_each_distinct_step_is_counted_once(tiny):
    counter = StepFlops()
    for _ in range(3):
        with counter.counting(("a",)):
            pass
    assert len(counter) == 1 and counter.get(("a",)) == 0.0

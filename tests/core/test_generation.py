"""The default generator: greedy with a KV cache, identical to argmax over full re-forwards."""

import torch

from paretolab.generation import Generation, generate


def _reference_greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(n):
            next_id = model(input_ids=ids).logits[0, -1].argmax()
            ids = torch.cat([ids, next_id.view(1, 1)], dim=1)
    return ids[0, len(prompt):].tolist()


def test_default_generator_matches_uncached_greedy(tiny):
    prompts = [[5, 9, 2, 7], [1, 2, 3, 4, 5, 6, 7, 8]]
    out = generate(tiny, prompts, max_new_tokens=6)
    assert isinstance(out, Generation)
    assert out.sequences == [_reference_greedy(tiny.model, p, 6) for p in prompts]
    assert out.tokens_total == 12 and out.tokens_sequential == 12
    assert out.prefill_s > 0 and out.decode_s > 0


def test_stop_token_ends_a_sequence_and_is_kept(tiny):
    full = generate(tiny, [[5, 9, 2, 7]], max_new_tokens=6).sequences[0]
    stop = full[2]
    out = generate(tiny, [[5, 9, 2, 7]], max_new_tokens=6, stop_ids=[stop])
    assert out.sequences[0] == full[: full.index(stop) + 1]

"""The default generator: batched, KV-cached, left-padded; identical to per-prompt greedy, token for token."""

import pytest
import torch

from paretolab.errors import ConfigError
from paretolab.generation import (
    BatchedGenerator,
    Generation,
    GreedyGenerator,
    Sampling,
    generate,
)


def _reference_greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(n):
            next_id = model(input_ids=ids).logits[0, -1].argmax()
            ids = torch.cat([ids, next_id.view(1, 1)], dim=1)
    return ids[0, len(prompt):].tolist()


def _prompts(lengths=(3, 17, 8, 30, 1, 12), seed=0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 250, (n,), generator=gen).tolist() for n in lengths]


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


@pytest.mark.parametrize("batch_size", [1, 4, 6])
def test_batched_equals_per_prompt_greedy_with_mixed_lengths_and_stops(tiny, batch_size):
    prompts = _prompts()
    plain = GreedyGenerator().generate(tiny, prompts, max_new_tokens=24)
    stops = [plain.sequences[1][6], plain.sequences[2][3]]  # rows finish at different steps and leave the batch
    ref = GreedyGenerator().generate(tiny, prompts, max_new_tokens=24, stop_ids=stops)
    out = BatchedGenerator(batch_size=batch_size).generate(tiny, prompts, max_new_tokens=24, stop_ids=stops)
    assert out.sequences == ref.sequences
    assert len({len(s) for s in out.sequences}) > 1  # the stops really cut some rows short
    assert out.tokens_total == out.tokens_sequential == sum(map(len, ref.sequences))


def test_sampling_is_seeded_per_prompt_whatever_the_batch(tiny):
    prompts = _prompts((4, 9, 2, 6))
    sampling = Sampling(temperature=1.0, top_p=0.9, seed=3)
    whole = BatchedGenerator(batch_size=4, sampling=sampling).generate(tiny, prompts, max_new_tokens=12).sequences
    split = BatchedGenerator(batch_size=1, sampling=sampling).generate(tiny, prompts, max_new_tokens=12).sequences
    other = BatchedGenerator(batch_size=4, sampling=Sampling(temperature=1.0, top_p=0.9, seed=4)).generate(tiny, prompts, max_new_tokens=12).sequences
    greedy = BatchedGenerator().generate(tiny, prompts, max_new_tokens=12).sequences
    assert whole == split
    assert whole != other and whole != greedy


def test_top_p_near_zero_is_greedy(tiny):
    prompts = _prompts((5, 7))
    nucleus = BatchedGenerator(sampling=Sampling(temperature=1.0, top_p=1e-9, seed=0)).generate(tiny, prompts, max_new_tokens=8)
    assert nucleus.sequences == BatchedGenerator().generate(tiny, prompts, max_new_tokens=8).sequences


@pytest.mark.parametrize("bad", [{"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}])
def test_bad_sampling_settings_name_the_field(bad):
    with pytest.raises(ConfigError, match=next(iter(bad))):
        Sampling(**bad)


def test_bad_budget_is_refused(tiny):
    with pytest.raises(ConfigError, match="max_new_tokens"):
        generate(tiny, [[1, 2]], max_new_tokens=0)


@pytest.mark.slow
def test_batched_equals_per_prompt_greedy_on_smollm2():
    from paretolab.models import load_subject

    subject = load_subject("smollm2-135m")
    tok = subject.tokenizer
    texts = ["The capital of France is", "def fibonacci(n):\n   ", "Question: What is 7 + 5?\nAnswer:", "Once upon a time, in a land far away, there lived a"]
    prompts = [tok.encode(t) for t in texts]
    ref = GreedyGenerator().generate(subject, prompts, max_new_tokens=16, stop_ids=[tok.eos_token_id])
    out = BatchedGenerator(batch_size=4).generate(subject, prompts, max_new_tokens=16, stop_ids=[tok.eos_token_id])
    assert out.sequences == ref.sequences


def test_prefill_asks_the_model_for_the_last_positions_logits_only(tiny):
    from paretolab.generation.decoding import BatchDecoder

    widths = []
    handle = tiny.model.register_forward_hook(lambda m, a, out: widths.append(out.logits.shape[1]))
    try:
        logits = BatchDecoder(tiny.model).prefill([[5, 6, 7, 8, 9, 10, 11, 12], [3, 4]])
    finally:
        handle.remove()
    assert widths == [1] and logits.shape == (2, tiny.model.config.vocab_size)


def test_greedy_decode_time_covers_the_whole_loop_as_speculative_does(tiny, monkeypatch):
    """Time spent choosing tokens counts as decoding (the speculative timer covers its whole loop too)."""
    import time

    from paretolab.generation import decode_batch
    from paretolab.generation.decoding import TokenChooser

    real = TokenChooser.choose

    def slow(self, logits, row_ids):
        time.sleep(0.05)
        return real(self, logits, row_ids)

    monkeypatch.setattr(TokenChooser, "choose", slow)
    out = decode_batch(tiny.model, [[5, 6, 7]], max_new_tokens=6)
    assert len(out.sequences[0]) == 6
    assert out.prefill_s >= 0.05 and out.decode_s >= 5 * 0.05  # the first choice is prefill's, five more are decode's

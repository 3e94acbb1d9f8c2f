"""Text for the draft: training text and held-out prompts never overlap.

The built-in corpus (pydoc) is split by characters: the first 90% trains drafts, the last 10%
gives the prompts on which speculative decoding is measured.
"""

from __future__ import annotations

from typing import Any

import torch

from paretolab.data import encode, load_corpus

TRAIN_FRACTION = 0.9


def split_corpus(corpus: str) -> tuple[str, str]:
    """(training text, held-out text) of a corpus (built-in name or path)."""
    text, _ = load_corpus(corpus)
    cut = int(len(text) * TRAIN_FRACTION)
    return text[:cut], text[cut:]


def heldout_prompts(tokenizer: Any, *, corpus: str = "pydoc", n: int = 4, length: int = 64) -> list[list[int]]:
    """``n`` prompts of ``length`` tokens cut at evenly spaced offsets from the held-out part of ``corpus``."""
    ids = encode(tokenizer, split_corpus(corpus)[1])
    if len(ids) < n * length:
        raise ValueError(f"the held-out part of corpus {corpus!r} has {len(ids)} tokens, fewer than {n} prompts x {length}")
    step = len(ids) // n
    return [ids[i * step : i * step + length] for i in range(n)]


def training_sequences(tokenizer: Any, *, corpus: str = "pydoc", seq_len: int = 256, max_tokens: int = 32768) -> torch.Tensor:
    """(N, seq_len) consecutive windows of the training part of ``corpus``, at most ``max_tokens`` tokens in all."""
    ids = torch.tensor(encode(tokenizer, split_corpus(corpus)[0]), dtype=torch.long, device="cpu")  # callers move batches
    n = min(len(ids) // seq_len, max(1, max_tokens // seq_len))
    if n < 1:
        raise ValueError(f"corpus {corpus!r} has {len(ids)} training tokens, fewer than seq_len={seq_len}")
    # windows spread over the whole text, not just its beginning
    starts = torch.linspace(0, len(ids) - seq_len, n, device="cpu").long()
    return torch.stack([ids[s : s + seq_len] for s in starts.tolist()])

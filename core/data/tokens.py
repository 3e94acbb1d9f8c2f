"""Token windows cut from a corpus: seeded calibration batches and held-out windows that share no token with them."""

from __future__ import annotations

from typing import Any

from paretolab.data.corpora import load_corpus
from paretolab.errors import ConfigError


def calibration_ids(tokenizer: Any, *, corpus: str = "pydoc", n_samples: int = 16, seq_len: int = 256, seed: int = 0) -> Any:
    """(n_samples, seq_len) token ids cut at seeded random offsets from a corpus, for calibration."""
    import torch

    ids, starts = _calibration_windows(tokenizer, corpus, n_samples, seq_len, seed)
    return torch.stack([ids[s : s + seq_len] for s in starts.tolist()])


def heldout_calibration_ids(tokenizer: Any, *, corpus: str = "pydoc", n_samples: int = 16, seq_len: int = 256, seed: int = 0,
                            n_heldout: int = 1) -> Any:
    """(n_heldout, seq_len) windows of the corpus sharing no token with ``calibration_ids`` of the same arguments.

    For scores reported as held-out (e.g. an SQNR): they are measured on tokens the fit never saw.
    """
    import torch

    ids, starts = _calibration_windows(tokenizer, corpus, n_samples, seq_len, seed)
    candidates = torch.arange(0, ids.numel() - seq_len + 1, device="cpu")
    free = ((candidates[:, None] - starts[None, :]).abs() >= seq_len).all(dim=1)  # no overlap with any fit window
    choices = candidates[free]
    if choices.numel() < n_heldout:
        raise ConfigError(f"corpus {corpus!r} has no room for {n_heldout} held-out window(s) of {seq_len} tokens beside "
                          f"{n_samples} calibration windows; lower calib_samples or calib_seq_len")
    gen = torch.Generator(device="cpu").manual_seed(seed + 1)
    picked = choices[torch.randperm(choices.numel(), generator=gen, device="cpu")[:n_heldout]]
    return torch.stack([ids[s : s + seq_len] for s in picked.tolist()])


def _calibration_windows(tokenizer: Any, corpus: str, n_samples: int, seq_len: int, seed: int) -> tuple[Any, Any]:
    """(every token id of ``corpus``, the seeded start of each calibration window)."""
    import torch

    ids = _whole_corpus_ids(tokenizer, corpus)
    if ids.numel() <= seq_len:
        raise ConfigError(f"corpus {corpus!r} has {ids.numel()} tokens, fewer than seq_len={seq_len}")
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return ids, torch.randint(0, ids.numel() - seq_len, (n_samples,), generator=gen, device="cpu")


_ENCODED: dict[tuple[str, int], tuple[Any, Any]] = {}  # (corpus sha, id(tokenizer)) -> (tokenizer, ids): the last two


def _whole_corpus_ids(tokenizer: Any, corpus: str) -> Any:
    """Every token id of ``corpus`` encoded in one call (as calibration always has: the windows of stored trials stay
    where they were), kept for the next call with the same tokenizer object in this process: a calibrated method cuts
    its fit windows and its held-out windows from the same ids, and a 10 MB corpus takes ~14 s to encode on one core."""
    import torch

    text, digest = load_corpus(corpus)
    key = (digest, id(tokenizer))
    if key not in _ENCODED or _ENCODED[key][0] is not tokenizer:  # the tokenizer is held: its id cannot be reused meanwhile
        while len(_ENCODED) >= 2:
            _ENCODED.pop(next(iter(_ENCODED)))
        _ENCODED[key] = (tokenizer, torch.tensor(encode(tokenizer, text), dtype=torch.long, device="cpu"))  # callers move windows
    return _ENCODED[key][1]


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens, for any HF-style tokenizer."""
    try:
        return list(tokenizer.encode(text, add_special_tokens=False))
    except TypeError:
        return list(tokenizer.encode(text))

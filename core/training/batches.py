"""Training data: a corpus tokenized once (cached on disk), random windows in a seeded order, fixed held-out windows."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from typing import Any

import torch

from paretolab.data import cache_dir, encode, load_corpus
from paretolab.errors import ConfigError

_CHUNK_CHARS = 1 << 16  # tokenized in pieces cut at line ends: a 10 MB corpus in one call needs GBs
_IDS: dict[tuple[str, str], torch.Tensor] = {}  # (corpus sha, tokenizer fingerprint) -> ids, per process


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A hash of what decides the ids: the fast tokenizer's full JSON (vocab, merges, pipeline), else its class, size and vocab."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        text = backend.to_str()
    else:
        vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
        text = f"{type(tokenizer).__name__}:{len(tokenizer)}:{sorted(vocab.items())}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def corpus_token_ids(tokenizer: Any, corpus: str) -> torch.Tensor:
    """Every token id of ``corpus`` (int64, CPU), from the on-disk cache keyed by the corpus sha and the tokenizer fingerprint."""
    text, digest = load_corpus(corpus)
    key = (digest, tokenizer_fingerprint(tokenizer))
    if key in _IDS:
        return _IDS[key]
    path = cache_dir() / "tokens" / f"{digest[:20]}-{key[1][:20]}.pt"
    ids = None
    if path.is_file():
        try:
            ids = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # a truncated file cannot exist (written by rename), but a torch upgrade may refuse an old one
            ids = None
    if ids is None:
        ids = torch.tensor(_encode_chunks(tokenizer, text), dtype=torch.int32, device="cpu")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.part")
        torch.save(ids, tmp)
        os.replace(tmp, path)  # atomic: a killed trial leaves no half-written cache
    _IDS[key] = ids.to(torch.long)
    return _IDS[key]


def _encode_chunks(tokenizer: Any, text: str) -> list[int]:
    pieces, start = [], 0
    while start < len(text):
        end = text.find("\n", start + _CHUNK_CHARS)
        end = len(text) if end < 0 else end + 1
        pieces.append(text[start:end])
        start = end
    if callable(tokenizer) and hasattr(tokenizer, "backend_tokenizer"):
        out: list[int] = []
        for ids in tokenizer(pieces, add_special_tokens=False)["input_ids"]:
            out += ids
        return out
    return [i for piece in pieces for i in encode(tokenizer, piece)]


def random_batches(ids: torch.Tensor, *, batch: int, seq_len: int, generator: torch.Generator,
                   device: torch.device) -> Iterator[torch.Tensor]:
    """Endless (batch, seq_len + 1) windows at uniformly random starts drawn from ``generator`` (CPU: the same order on any device)."""
    span = ids.numel() - (seq_len + 1)
    if span < 1:
        raise ConfigError(f"train.seq_len: the training corpus has {ids.numel()} tokens, too few for windows of {seq_len + 1}; lower seq_len")
    offsets = torch.arange(seq_len + 1, device="cpu")
    while True:
        starts = torch.randint(0, span + 1, (batch,), generator=generator, device="cpu")
        yield ids[starts[:, None] + offsets].to(device)


def heldout_windows(tokenizer: Any, corpus: str, *, tokens: int, seq_len: int) -> tuple[torch.Tensor, int]:
    """(windows, bytes): the first ``tokens`` predicted tokens of ``corpus`` as (n, seq_len + 1) windows that overlap by one
    token (each token from the second on is predicted exactly once), and the UTF-8 bytes of the predicted text."""
    ids = corpus_token_ids(tokenizer, corpus)
    n = min(tokens, ids.numel() - 1) // seq_len
    if n < 1:
        raise ConfigError(f"train.eval_tokens: {tokens} held-out tokens of {corpus!r} ({ids.numel()} in all) make no window of seq_len={seq_len}; "
                          "raise eval_tokens or lower seq_len")
    used = ids[: n * seq_len + 1]
    windows = torch.stack([used[i * seq_len : (i + 1) * seq_len + 1] for i in range(n)])
    # bytes of the predicted text: all of it minus the first, never-predicted token
    n_bytes = len(tokenizer.decode(used.tolist()).encode("utf-8")) - len(tokenizer.decode(used[:1].tolist()).encode("utf-8"))
    return windows, max(n_bytes, 1)

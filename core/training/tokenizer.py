"""The small tokenizer models trained here use: byte-level BPE, 4096 tokens, trained on ``pystdlib-train``.

Trained once with the ``tokenizers`` library (seconds) and cached under
``cache_dir()/tokenizers/pystdlib-bpe4096-<corpus sha>.json``: the key is the training text's
sha256, so another Python's standard library gets its own tokenizer instead of a stale one.
A small vocabulary keeps the output head from dominating models of a few million parameters.
"""

from __future__ import annotations

import os
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

from paretolab.data import cache_dir, load_corpus

VOCAB_SIZE = 4096
CORPUS = "pystdlib-train"
SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")  # ids 0, 1, 2: bos, eos, pad


def tokenizer_path(vocab_size: int = VOCAB_SIZE) -> Path:
    """Where the trained tokenizer for this machine's ``pystdlib-train`` lives (it may not exist yet)."""
    _, digest = load_corpus(CORPUS)
    return cache_dir() / "tokenizers" / f"pystdlib-bpe{vocab_size}-{digest[:16]}.json"


def train_bpe(text: str, vocab_size: int = VOCAB_SIZE) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on ``text``: every byte is a token, so nothing is unknown."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_chunks(text), trainer=trainer, length=None)
    return backend


def _chunks(text: str, size: int = 1 << 20) -> list[str]:
    # pieces split at line ends: the pre-tokenizer never merges across a newline anyway
    pieces, start = [], 0
    while start < len(text):
        end = text.find("\n", start + size)
        end = len(text) if end < 0 else end + 1
        pieces.append(text[start:end])
        start = end
    return pieces


def ensure_tokenizer(vocab_size: int = VOCAB_SIZE) -> Path:
    """The cached tokenizer file, training it first if this machine has none (written atomically)."""
    path = tokenizer_path(vocab_size)
    if path.is_file():
        return path
    text, _ = load_corpus(CORPUS)
    start = time.perf_counter()
    backend = train_bpe(text, vocab_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.part")  # two processes training at once each write their own
    backend.save(str(tmp))
    os.replace(tmp, path)
    TRAIN_SECONDS[path.name] = time.perf_counter() - start
    return path


TRAIN_SECONDS: dict[str, float] = {}  # how long this process spent training each tokenizer (for reports and tests)


@lru_cache(maxsize=4)
def pystdlib_tokenizer(vocab_size: int = VOCAB_SIZE) -> Any:
    """The trained tokenizer as a ``transformers.PreTrainedTokenizerFast`` with bos ``<s>``, eos ``</s>``, pad ``<pad>``."""
    from transformers import PreTrainedTokenizerFast

    path = ensure_tokenizer(vocab_size)
    return PreTrainedTokenizerFast(
        tokenizer_file=str(path), bos_token="<s>", eos_token="</s>", pad_token="<pad>", name_or_path=f"pystdlib-bpe{vocab_size}"
    )

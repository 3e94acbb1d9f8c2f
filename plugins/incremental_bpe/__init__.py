"""Incremental BPE: exact, streaming byte-level BPE for SmolLM2's tokenizer (ModelTC/mtc-inc-bpe).

``IncrementalBPE.from_hf(hf)`` reproduces ``hf.encode(text, add_special_tokens=False)`` exactly
(added tokens, the GPT-2 pre-tokenizer with Oniguruma's Unicode tables, dropped bytes), and
``stream()`` returns every token the moment no later text can change it. How: ``_reference.py``.

Worst case (the paper's headline): each byte costs one amortised automaton step plus at most
``max_candidates`` constant-time tests against the suffix forest (``_forest.py``; 45 for SmolLM2),
whatever the input. The paper's own structure is the same forest, searched with centroid trees
for O(log² t); ours scans the candidates in order, fewer steps at this vocabulary's 45.
``benchmarks/tokenizer.py`` measures it on runs of every punctuation character, unspaced
letters, digits, multi-byte runs, merge chains and inputs it was not tuned on (``_inputs.py``:
base64, hex, URLs, minified code, CJK without spaces, an emoji run), at 20 kB, 200 kB and 2 MB,
first-seen and warm, against prose from two corpora, beside HF and tiktoken
(``docs/tokenizer_cpu.json``). Words of 512 bytes or more walk the automaton in four interleaved
segments (``_fast.c``), so the walk's cache misses overlap; words of up to 22 bytes go through a
word cache (one cache line a word, prefetched a few words ahead, switched off for a word length
while under 1 in 8 of its lookups hit, as for base64's runs of 4+ letters, which never repeat while
its pairs do).

Construction: the C engine's tables are kept in a table file per vocabulary
(``$PARETOLAB_CACHE/incremental_bpe``, ``_cache.py``), memory-mapped by every later process and
checked before use (format, sizes, CRC, key, every index); a damaged or stale file is rebuilt.

Fast path: a C extension (``_fast.c``), not numba. It needs only gcc and the Python headers,
which every machine that runs ``pip install -e .`` has; numba would add a ~100 MB dependency
pinned to NumPy/LLVM versions and a multi-second JIT warm-up in every worker process, and its
typed containers are awkward for the automaton and hash maps this algorithm lives on. When
the extension is not built, ``backend="auto"`` falls back to the pure-Python reference.
"""

from __future__ import annotations

import string
import time
from typing import Any

import paretolab
from paretolab.plugins.incremental_bpe._tokenizer import (
    BPEStream,
    IncrementalBPE,
    c_extension_available,
)
from paretolab.plugins.incremental_bpe._vocab import UnsupportedTokenizerError

__all__ = [
    "BPEStream",
    "IncrementalBPE",
    "IncrementalBPEMethod",
    "IncrementalBPETokenizer",
    "UnsupportedTokenizerError",
    "c_extension_available",
]

# A fixed mixed text for `measure` (prose, numbers, code, whitespace) and the inputs that make
# naive BPE quadratic: both small enough that measuring stays well under two seconds.
_SAMPLE = (
    "The tower is 324 metres (1,063 ft) tall, about the same height as an 81-storey building. "
    "Its base is square, measuring 125 metres (410 ft) on each side.\n"
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many in May. "
    "How many clips did she sell altogether? 48/2 = <<48/2=24>>24 clips in May.\n"
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\n"
    "    for key, value in sorted(items.items()):\n\t\tprint(f'{key!r}: {value:>8.3f}')\n"
)
# long runs that defeat word splitting: letters, digits, spaces, pairs, and every ASCII punctuation character
_UNSPACED = "".join("qwertyuiopasdfghjklzxcvbnm"[i * i * 7 % 26] for i in range(20_000))  # no repeating word to cache
_PATHOLOGICAL = ("a" * 20_000, "1" * 20_000, " " * 20_000, "ab" * 10_000, _UNSPACED, *(ch * 20_000 for ch in string.punctuation))
THROUGHPUT_CORPUS = "pydoc"  # real text, encoded once by a fresh engine: no warm cache, no repeated sample


class IncrementalBPETokenizer:
    """A drop-in for a HF tokenizer whose encoding goes through IncrementalBPE (decode stays HF's)."""

    def __init__(self, hf_tokenizer: Any, bpe: IncrementalBPE | None = None) -> None:
        self.hf = hf_tokenizer
        self.bpe = bpe if bpe is not None else IncrementalBPE.from_hf(hf_tokenizer)

    def encode(self, text: str, add_special_tokens: bool = False, **kwargs: Any) -> list[int]:
        """Token ids of ``text`` (identical to the HF tokenizer's)."""
        ids = self.bpe.encode(text)
        if add_special_tokens and hasattr(self.hf, "build_inputs_with_special_tokens"):
            ids = list(self.hf.build_inputs_with_special_tokens(ids))
        return ids

    def __call__(self, text: str | list[str], add_special_tokens: bool = False, return_tensors: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """``{"input_ids", "attention_mask"}`` like a HF tokenizer (no padding: equal lengths or one text)."""
        texts = [text] if isinstance(text, str) else list(text)
        ids = [self.encode(t, add_special_tokens=add_special_tokens) for t in texts]
        batch: dict[str, Any] = {"input_ids": ids, "attention_mask": [[1] * len(i) for i in ids]}
        if return_tensors == "pt":
            import torch

            batch = {k: torch.tensor(v, dtype=torch.long, device="cpu") for k, v in batch.items()}  # as HF tokenizers return
        elif isinstance(text, str):
            batch = {k: v[0] for k, v in batch.items()}
        return batch

    def decode(self, ids: Any, **kwargs: Any) -> str:
        """Text of ``ids`` (delegated to the HF tokenizer)."""
        return str(self.hf.decode(ids, **kwargs))

    def stream(self) -> BPEStream:
        """An incremental encoder (see ``IncrementalBPE.stream``)."""
        return self.bpe.stream()

    @property
    def eos_token_id(self) -> int | None:
        return getattr(self.hf, "eos_token_id", None)

    @property
    def bos_token_id(self) -> int | None:
        return getattr(self.hf, "bos_token_id", None)

    @property
    def pad_token_id(self) -> int | None:
        return getattr(self.hf, "pad_token_id", None)

    def __len__(self) -> int:
        return len(self.hf)

    def __getattr__(self, name: str) -> Any:
        # Everything else (chat template, name_or_path, vocab, ...) is the HF tokenizer's.
        if name in ("hf", "bpe"):
            raise AttributeError(name)
        return getattr(self.hf, name)


class IncrementalBPEMethod(paretolab.Method):
    """Replace the subject's tokenizer with IncrementalBPE: same ids, faster and streaming."""

    name = "incremental_bpe"
    metrics = ("tok_encode_mb_s", "tok_stream_p50_ms", "tok_stream_p99_ms", "tok_worst_ns_per_byte")
    kind = "tokenizer"
    cost_is = "real"
    paper = paretolab.Paper(
        "Incremental BPE tokenization for all prefixes (mtc-inc-bpe)",
        "ModelTC, 2025 (Rust crate)",
        "https://github.com/ModelTC/mtc-inc-bpe",
    )

    def search_space(self) -> dict[str, Any]:
        return {}

    def transform(self, subject: paretolab.Subject, params: dict[str, Any], ctx: paretolab.TrialContext) -> paretolab.Subject:
        """Swap in the incremental tokenizer (the HF one stays inside it, for decoding)."""
        if not isinstance(subject.tokenizer, IncrementalBPETokenizer):
            subject.tokenizer = IncrementalBPETokenizer(subject.tokenizer)
        subject.info["tokenizer_backend"] = subject.tokenizer.bpe.backend
        return subject

    def measure(self, subject: paretolab.Subject, ctx: paretolab.TrialContext) -> dict[str, float]:
        """Encode throughput, per-chunk streaming latency and worst ns/byte on pathological text."""
        tok = subject.tokenizer
        bpe = tok.bpe if isinstance(tok, IncrementalBPETokenizer) else IncrementalBPE.from_hf(tok)
        return measure_tokenizer(bpe)


def measure_tokenizer(bpe: IncrementalBPE, *, repeats: int = 40, chunk_chars: int = 16, corpus_chars: int = 200_000) -> dict[str, float]:
    """The four ``tok_*`` metrics: throughput on first-seen text, streaming latency, worst case (seconds with the C path)."""
    from paretolab.data import load_corpus

    fresh = bpe.fresh()  # its word cache is empty
    text = load_corpus(THROUGHPUT_CORPUS)[0][:corpus_chars]
    size = len(text.encode("utf-8"))
    start = time.perf_counter()
    fresh.encode(text)  # once: a repeated text would be timed on a warm cache
    encode_s = time.perf_counter() - start
    text = _SAMPLE * repeats

    latencies = []
    stream = bpe.stream()
    for at in range(0, len(text) // 4, chunk_chars):
        start = time.perf_counter()
        stream.feed(text[at : at + chunk_chars])
        latencies.append(time.perf_counter() - start)
    stream.finish()
    latencies.sort()

    worst = 0.0
    for patho in _PATHOLOGICAL:  # runs are longer than any cached word: the fresh engine serves them all
        start = time.perf_counter()
        fresh.encode(patho)
        worst = max(worst, (time.perf_counter() - start) * 1e9 / len(patho.encode("utf-8")))
    return {
        "tok_encode_mb_s": size / encode_s / 1e6,
        "tok_stream_p50_ms": latencies[len(latencies) // 2] * 1e3,
        "tok_stream_p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3,
        "tok_worst_ns_per_byte": worst,
    }


@paretolab.hookimpl
def register_methods(register: Any) -> None:
    register(IncrementalBPEMethod())


@paretolab.hookimpl
def register_metrics(register: Any) -> None:
    register(paretolab.Metric("tok_encode_mb_s", "MB/s", "maximize", "IncrementalBPE encode throughput on 200k chars of the built-in corpus, seen once by a fresh engine"))
    register(paretolab.Metric("tok_stream_p50_ms", "ms", "minimize", "median latency of one 16-char stream.feed()"))
    register(paretolab.Metric("tok_stream_p99_ms", "ms", "minimize", "99th-percentile latency of one 16-char stream.feed()"))
    register(paretolab.Metric("tok_worst_ns_per_byte", "ns/byte", "minimize", "worst encode cost per byte over 20k-char runs of letters, digits, spaces, unspaced letters and every ASCII punctuation character"))

"""Lossless text compression: bits per byte and whether every text decodes back exactly.

The coder comes from a ``coding`` method stage (``subject.info["coder"]``): a language-model coder
(``encode(tokens, logits)`` / ``decode(coded, first_logits, next_logits)``, e.g. PMATIC or plain
arithmetic coding) or a byte codec (``compress``/``decompress``: gzip, xz, zstd). The same stage
says which encoder/decoder mismatch the trial reproduces (``subject.info["mismatch"]``):

- ``none``: both sides decode step by step with a KV cache, fp32, the same threads (identical logits);
- ``prefill``: the encoder scores the whole text in one batched forward pass, the decoder step by step;
- ``threads``: the encoder runs with ``task.threads`` torch threads, the decoder with 1;
- ``bf16``: the decoder runs a bfloat16 copy of the model;
- ``noise``: the decoder's logits get seeded uniform noise in +-``mismatch_noise`` (synthetic, bounded).

The decoder always decodes for real (its own tokens fed back), so a broken decode shows up as
``decode_ok`` < 1, never as a number taken from the encoder.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from paretolab.data import encode, load_corpus
from paretolab.errors import ConfigError
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.hookspec import hookimpl
from paretolab.plugin_api.metrics import Metric
from paretolab.plugin_api.options import option
from paretolab.plugin_api.subject import Subject
from paretolab.stats import ARTIFACT, Samples, bootstrap_interval, per_example_json
from paretolab.tasks.base import Task

MISMATCHES = ("none", "prefill", "threads", "bf16", "noise")
HEADER_BITS = 32  # every LM-coded text carries its token count


@dataclass(frozen=True)
class CompressionOptions:
    corpus: str = option("pydoc", data="corpus")  # pydoc (built in) | wikitext2 | pystdlib-val | a UTF-8 text file
    n_texts: int = option(4, low=1)  # texts cut from the corpus at evenly spaced places
    text_chars: int = option(512, low=8)  # characters per text
    threads: int = option(2, low=1)  # the encoder's torch threads under mismatch "threads" (the decoder uses 1)


class Compression(Task):
    """Compress each text with the subject's coder, decode it back, and score size and exactness."""

    name = "compression"
    metrics = ("bpb", "bpb_ci_low", "bpb_ci_high", "decode_ok", "helper_bpb", "logit_mismatch", "compress_s", "decompress_s", "n_texts")
    options = CompressionOptions

    def evaluate(self, subject: Subject, options: CompressionOptions, ctx: TrialContext) -> dict[str, float]:
        coder = subject.info.get("coder")
        if coder is None:
            raise ConfigError("task compression: no coder; add a coding stage (method pmatic, arith_coding or byte_codec)")
        mismatch = str(subject.info.get("mismatch", "none"))
        if mismatch not in MISMATCHES:
            raise ConfigError(f"mismatch: expected one of {', '.join(MISMATCHES)}, got {mismatch!r}")
        rows = [self._one(subject, coder, mismatch, text, options, seed=ctx.seed * 1000 + i) for i, text in enumerate(texts_of(options))]
        n_bytes = np.asarray([r["bytes"] for r in rows], dtype=float)
        bpb_each = np.asarray([r["bits"] / r["bytes"] for r in rows])
        ok = [float(r["ok"]) for r in rows]
        low, high = bootstrap_interval(Samples(bpb_each, n_bytes, False, "text")) if len(rows) > 1 else (bpb_each[0], bpb_each[0])
        ctx.add_artifact(ARTIFACT, per_example_json("text", {"bpb": bpb_each.tolist(), "decode_ok": ok}, n_bytes.tolist()))
        total = float(n_bytes.sum())
        return {
            "bpb": float(sum(r["bits"] for r in rows) / total),
            "bpb_ci_low": float(low),
            "bpb_ci_high": float(high),
            "decode_ok": float(np.mean(ok)),
            "helper_bpb": float(sum(r["helper"] for r in rows) / total),
            "logit_mismatch": float(max(r["mismatch"] for r in rows)),
            "compress_s": float(np.mean([r["compress_s"] for r in rows])),
            "decompress_s": float(np.mean([r["decompress_s"] for r in rows])),
            "n_texts": float(len(rows)),
        }

    def _one(self, subject: Subject, coder: Any, mismatch: str, text: str, options: CompressionOptions, seed: int) -> dict[str, Any]:
        data = text.encode("utf-8")
        if hasattr(coder, "compress"):  # a byte codec: no model, no mismatch
            t0 = time.perf_counter()
            packed = coder.compress(data)
            t1 = time.perf_counter()
            ok = coder.decompress(packed) == data
            return {"bytes": len(data), "bits": 8 * len(packed), "ok": ok, "helper": 0.0, "mismatch": 0.0,
                    "compress_s": t1 - t0, "decompress_s": time.perf_counter() - t1}
        tokens = encode(subject.tokenizer, text)
        start = _start_id(subject)
        noise = float(subject.info.get("mismatch_noise", 0.0))
        encoder_side = LogitSource(subject.model, threads=options.threads if mismatch == "threads" else 1)
        decoder_side = LogitSource(
            subject.model, threads=1, bf16=mismatch == "bf16",
            noise=noise if mismatch == "noise" else 0.0, seed=seed,
        )
        t0 = time.perf_counter()
        enc_rows = encoder_side.prefill([start, *tokens[:-1]]) if mismatch == "prefill" else encoder_side.stepwise([start, *tokens[:-1]])
        coded = coder.encode(tokens, enc_rows)
        t1 = time.perf_counter()
        decoded, worst = _decode(coder, coded, decoder_side, start, tokens, enc_rows)
        t2 = time.perf_counter()
        ok = decoded == tokens and subject.tokenizer.decode(decoded) == text
        return {"bytes": len(data), "bits": len(coded.bits) + HEADER_BITS, "ok": ok, "helper": coded.helper_bits,
                "mismatch": worst, "compress_s": t1 - t0, "decompress_s": t2 - t1}


def _decode(coder: Any, coded: Any, source: LogitSource, start: int, truth: list[int], enc_rows: list[np.ndarray]) -> tuple[list[int], float]:
    """Run the decoder for real; also the largest |encoder - decoder| logit gap while its prefix was still right."""
    worst, step, right = 0.0, 0, True
    session = source.session()
    first = session(start)

    def next_logits(token: int) -> np.ndarray:
        nonlocal worst, step, right
        right = right and token == truth[step]
        step += 1
        row = session(token)
        if right:
            worst = max(worst, float(np.abs(row - enc_rows[step]).max()))
        return row

    worst = float(np.abs(first - enc_rows[0]).max())
    with source.threads_set():
        decoded = coder.decode(coded, first, next_logits)
    return decoded, worst


class LogitSource:
    """Next-token logits of one side of the channel: its dtype, threads and (synthetic) noise."""

    def __init__(self, model: torch.nn.Module, *, threads: int = 1, bf16: bool = False, noise: float = 0.0, seed: int = 0) -> None:
        self.model = _bf16_copy(model) if bf16 else model
        self.threads, self.noise, self.rng = threads, noise, np.random.default_rng(seed)

    @contextmanager
    def threads_set(self) -> Iterator[None]:
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    def _row(self, logits: torch.Tensor) -> np.ndarray:
        row = logits.float().cpu().numpy().astype(np.float64)
        if self.noise > 0:
            row = row + self.rng.uniform(-self.noise, self.noise, size=row.shape)
        return row

    def prefill(self, ids: list[int]) -> list[np.ndarray]:
        """Logits for every position from one batched forward pass."""
        device = next(self.model.parameters()).device
        with self.threads_set(), torch.no_grad():
            logits = self.model(input_ids=torch.tensor([ids], device=device)).logits[0]
        return [self._row(r) for r in logits]

    def session(self) -> Callable[[int], np.ndarray]:
        """A KV-cached decoding session: feed one token, get the next token's logits."""
        device = next(self.model.parameters()).device
        past: Any = None

        def feed(token: int) -> np.ndarray:
            nonlocal past
            with torch.no_grad():
                out = self.model(input_ids=torch.tensor([[token]], device=device), past_key_values=past, use_cache=True)
            past = out.past_key_values
            return self._row(out.logits[0, -1])

        return feed

    def stepwise(self, ids: list[int]) -> list[np.ndarray]:
        """Logits for every position, one cached decoding step at a time (what a decoder computes)."""
        feed = self.session()
        with self.threads_set():
            return [feed(i) for i in ids]


def _bf16_copy(model: torch.nn.Module) -> torch.nn.Module:
    import copy

    return copy.deepcopy(model).to(torch.bfloat16)


def _start_id(subject: Subject) -> int:
    tok = subject.tokenizer
    for name in ("bos_token_id", "eos_token_id"):
        value = getattr(tok, name, None)
        if value is not None:
            return int(value)
    return 0


def texts_of(options: CompressionOptions) -> list[str]:
    """``n_texts`` pieces of ``text_chars`` characters, evenly spaced over the corpus (deterministic)."""
    text, _ = load_corpus(options.corpus)
    if len(text) < options.n_texts * options.text_chars:
        raise ConfigError(f"task.corpus {options.corpus!r} has {len(text)} characters, fewer than n_texts * text_chars = {options.n_texts * options.text_chars}")
    stride = (len(text) - options.text_chars) // max(options.n_texts - 1, 1)
    return [text[i * stride : i * stride + options.text_chars] for i in range(options.n_texts)]


METRICS = (
    Metric("bpb", "bits/byte", "minimize", "compressed size per byte of UTF-8 text, headers included (compression task)"),
    Metric("bpb_ci_low", "bits/byte", "minimize", "lower end of the 95% bootstrap interval of bpb over the texts"),
    Metric("bpb_ci_high", "bits/byte", "minimize", "upper end of the 95% bootstrap interval of bpb over the texts"),
    Metric("decode_ok", "fraction", "maximize", "share of texts the decoder reproduced exactly under the trial's encoder/decoder mismatch"),
    Metric("helper_bpb", "bits/byte", "minimize", "PMATIC: estimated bits spent on helper bits per byte (part of bpb)"),
    Metric("logit_mismatch", "nats", "minimize", "largest |encoder - decoder| logit gap seen while the decoder was still on the right text"),
    Metric("compress_s", "s", "minimize", "wall time to compress one text (model passes + coding), mean over texts"),
    Metric("decompress_s", "s", "minimize", "wall time to decompress one text (model passes + decoding), mean over texts"),
    Metric("n_texts", "texts", "maximize", "texts behind bpb and decode_ok"),
)


@hookimpl
def register_tasks(register: Callable[[Task], None]) -> None:
    register(Compression())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    for metric in METRICS:
        register(metric)

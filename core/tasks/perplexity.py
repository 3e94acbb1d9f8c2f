"""Perplexity on a corpus, over fixed windows, with a bootstrap interval over the windows.

It keeps the per-window losses as the ``per_example.json`` artifact, so that two trials on the
same windows can be compared paired by ``paretolab report`` (see :mod:`paretolab.stats`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from paretolab.data import encode, load_corpus
from paretolab.errors import ConfigError
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.hookspec import hookimpl
from paretolab.plugin_api.options import option
from paretolab.plugin_api.subject import Subject
from paretolab.stats import ARTIFACT, Samples, bootstrap_interval, per_example_json
from paretolab.tasks.base import Task


@dataclass(frozen=True)
class PerplexityOptions:
    corpus: str = option("pydoc", data="corpus")  # pydoc (built in) | wikitext2 | a path to a UTF-8 text file
    max_tokens: int = option(4096, low=2)  # token budget: the first max_tokens tokens of the corpus
    context: int = option(512, low=2)  # window length fed to the model
    stride: int = option(512, low=1, at_most="context")  # step between windows; < context scores each token with more left context
    batch_size: int = option(4, low=1)  # windows per forward pass when windows do not overlap


class Perplexity(Task):
    """exp(mean NLL) of the first ``max_tokens`` tokens, in windows of ``context`` moved by ``stride``.

    ``ppl_ci_low``/``ppl_ci_high`` are a 95 % bootstrap interval over the ``n_windows`` windows
    (each resampled window brings its tokens' NLL and count): it says how much the number would
    move on another stretch of the same kind of text. A few windows give a rough interval.
    """

    name = "perplexity"
    metrics = ("ppl", "nll", "ppl_ci_low", "ppl_ci_high", "n_windows")
    options = PerplexityOptions
    splits = True  # a confirm split keeps whole windows apart (each window's tokens scored as without a split)

    def evaluate(self, subject: Subject, options: PerplexityOptions, ctx: TrialContext) -> dict[str, float]:
        if options.stride < 1 or options.stride > options.context:
            raise ConfigError(f"task.stride must be between 1 and task.context ({options.context}), got {options.stride}")
        ids = corpus_ids(subject.tokenizer, options.corpus, options.max_tokens).to(subject.device)
        window_nll: list[float] = []  # summed NLL of each window's scored tokens
        window_tokens: list[int] = []
        model = subject.model
        every = list(_windows(ids, options))
        with torch.no_grad():
            for inputs, labels in _batched([every[i] for i in ctx.examples(len(every), "window")], options):
                logits = model(input_ids=inputs).logits[:, :-1].float()
                target = labels[:, 1:]
                loss = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100, reduction="none"
                ).reshape(target.shape)
                window_nll += [float(v) for v in loss.sum(dim=1)]
                window_tokens += [int(v) for v in (target != -100).sum(dim=1)]
        nll = sum(window_nll) / max(sum(window_tokens), 1)
        ppl = _exp(nll)
        kept = [(s, t) for s, t in zip(window_nll, window_tokens) if t > 0]
        means, weights = [s / t for s, t in kept], [float(t) for _, t in kept]
        low, high = bootstrap_interval(Samples(np.asarray(means), np.asarray(weights), False, "window")) if len(kept) > 1 else (nll, nll)
        ctx.add_artifact(ARTIFACT, per_example_json("window", {"nll": means}, weights))
        return {"ppl": ppl, "nll": nll, "ppl_ci_low": _exp(low), "ppl_ci_high": _exp(high), "n_windows": float(len(kept))}


def _exp(nll: float) -> float:
    return math.exp(nll) if nll < 700 or math.isnan(nll) else float("inf")


def _windows(ids: torch.Tensor, opt: PerplexityOptions) -> Any:
    """(inputs, labels) of each window, (1, length) each; labels are -100 where a token was already scored by an earlier window."""
    n = ids.numel()
    if opt.stride == opt.context:  # non-overlapping windows: each scores all its tokens
        for s in range(0, max(n - 1, 1), opt.context):
            if s + opt.context <= n or n - s > 1:
                window = ids[s : s + opt.context].unsqueeze(0)
                yield window, window.clone()
        return
    prev_end = 0
    for begin in range(0, n, opt.stride):
        end = min(begin + opt.context, n)
        window = ids[begin:end].unsqueeze(0)
        labels = window.clone()
        labels[:, : window.shape[1] - (end - prev_end)] = -100  # score only tokens not scored before
        yield window, labels
        prev_end = end
        if end == n:
            break


def _batched(windows: list[tuple[torch.Tensor, torch.Tensor]], opt: PerplexityOptions) -> Any:
    """Windows of equal length stacked ``batch_size`` at a time (non-overlapping ones); any other window alone."""
    size = opt.batch_size if opt.stride == opt.context else 1
    i = 0
    while i < len(windows):
        group = [windows[i]]
        while len(group) < size and i + len(group) < len(windows) and windows[i + len(group)][0].shape == windows[i][0].shape:
            group.append(windows[i + len(group)])
        i += len(group)
        yield torch.cat([g[0] for g in group]), torch.cat([g[1] for g in group])


_IDS_CACHE: dict[tuple[str, str, int, int], torch.Tensor] = {}


def corpus_ids(tokenizer: Any, corpus: str, max_tokens: int) -> torch.Tensor:
    """The first ``max_tokens`` token ids of ``corpus`` (cached per tokenizer within a process)."""
    text, digest = load_corpus(corpus)
    key = (type(tokenizer).__name__ + str(getattr(tokenizer, "name_or_path", "")) + str(len(tokenizer)), digest, max_tokens, id(tokenizer))
    if key not in _IDS_CACHE:
        chars = max_tokens * 6
        while True:  # tokenize a growing prefix rather than the whole corpus
            ids = encode(tokenizer, text[:chars])
            if len(ids) > max_tokens or chars >= len(text):
                break
            chars *= 2
        if len(ids) < 2:
            raise ConfigError(f"corpus {corpus!r} yields fewer than 2 tokens")
        _IDS_CACHE[key] = torch.tensor(ids[:max_tokens], dtype=torch.long, device="cpu")  # a CPU cache; callers move it
    return _IDS_CACHE[key]


@hookimpl
def register_tasks(register: Callable[[Task], None]) -> None:
    register(Perplexity())

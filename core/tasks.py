"""Quality tasks: perplexity on a corpus and multiple-choice log-likelihood accuracy.

Both report their uncertainty next to the number (see :mod:`paretolab.stats`) and keep their
per-example (per-window) scores as the ``per_example.json`` artifact, so that two trials on the
same examples can be compared paired by ``paretolab report``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from paretolab.context import TrialContext
from paretolab.data import encode, load_corpus, read_jsonl
from paretolab.errors import ConfigError
from paretolab.hookspec import hookimpl
from paretolab.options import option
from paretolab.stats import ARTIFACT, Samples, bootstrap_interval, mean_with_stderr, per_example_json
from paretolab.subject import Subject


class Task:
    """A quality task: ``options`` is a dataclass parsed from the pipeline's ``task:`` block."""

    name: str = ""
    metrics: tuple[str, ...] = ()
    options: type = object

    def evaluate(self, subject: Subject, options: Any, ctx: TrialContext) -> dict[str, float]:
        raise NotImplementedError


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

    def evaluate(self, subject: Subject, options: PerplexityOptions, ctx: TrialContext) -> dict[str, float]:
        if options.stride < 1 or options.stride > options.context:
            raise ConfigError(f"task.stride must be between 1 and task.context ({options.context}), got {options.stride}")
        ids = corpus_ids(subject.tokenizer, options.corpus, options.max_tokens).to(subject.device)
        window_nll: list[float] = []  # summed NLL of each window's scored tokens
        window_tokens: list[int] = []
        model = subject.model
        with torch.no_grad():
            for inputs, labels in _windows(ids, options):
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
    """(inputs, labels) batches; labels are -100 where a token was already scored by an earlier window."""
    n = ids.numel()
    if opt.stride == opt.context:  # non-overlapping windows of equal length: batch them
        starts = list(range(0, max(n - 1, 1), opt.context))
        full = [s for s in starts if s + opt.context <= n]
        for i in range(0, len(full), opt.batch_size):
            batch = torch.stack([ids[s : s + opt.context] for s in full[i : i + opt.batch_size]])
            yield batch, batch.clone()
        rest = [s for s in starts if s + opt.context > n and n - s > 1]
        for s in rest:
            window = ids[s:].unsqueeze(0)
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


# The continuation delimiter of each data set's own task definition (llm-foundry's
# tasks_v0.3.yaml: "\nAnswer: " for these; the rest join query and choice with a space). The
# trailing space belongs to the choice, as in lm-eval's `Question: ...\nAnswer:` + " " + choice.
DELIMITERS: dict[str, str] = {"arc_easy": "\nAnswer:", "arc_challenge": "\nAnswer:", "piqa": "\nAnswer:", "boolq": "\nAnswer:"}


@dataclass(frozen=True)
class MultipleChoiceOptions:
    dataset: str = option("arc_easy", data="file")  # a name under <data dir>/mc/ (piqa, arc_easy, ...) or a jsonl path
    limit: int = option(200, low=0)  # the first `limit` examples (0 = all)
    batch_size: int = option(8, low=1)
    delimiter: str = "auto"  # text between query and " " + choice; auto = the data set's own (DELIMITERS), else none


class MultipleChoice(Task):
    """Log-likelihood accuracy, raw and length-normalised, with lm-evaluation-harness's conventions.

    Rows are ``{query, choices, gold}`` (the context is the query, trailing whitespace removed,
    plus the data set's continuation delimiter, e.g. ``"Question: ...\nAnswer:"``; each choice
    is scored as the continuation " " + choice), ``{context_options, continuation, gold}``
    (WinoGrande: the continuation scored after each context) or ``{context, continuation}``
    (LAMBADA: correct when greedy decoding reproduces it). ``acc`` takes the choice with the
    highest summed log-likelihood; ``acc_norm`` divides it by the choice's length in characters
    (lm-eval's acc_norm). ``acc_stderr``/``acc_norm_stderr`` are lm-eval's standard errors
    (sample std / sqrt(n)) over the ``n_examples`` rows.
    """

    name = "multiple_choice"
    metrics = ("acc", "acc_norm", "acc_stderr", "acc_norm_stderr", "n_examples")
    options = MultipleChoiceOptions

    def evaluate(self, subject: Subject, options: MultipleChoiceOptions, ctx: TrialContext) -> dict[str, float]:
        scored = score_rows(subject, options)
        hits = [r.hit for r in scored]
        hits_norm = [r.hit_norm for r in scored]
        ctx.add_artifact(ARTIFACT, per_example_json("example", {"acc": hits, "acc_norm": hits_norm}))
        return {**mean_with_stderr("acc", hits), **mean_with_stderr("acc_norm", hits_norm), "n_examples": float(len(scored))}


@dataclass(frozen=True)
class RowScore:
    """One row's outcome: each choice's summed log-likelihood and whether acc and acc_norm got it right."""

    loglikelihoods: list[float]
    hit: float
    hit_norm: float


def score_rows(subject: Subject, options: MultipleChoiceOptions) -> list[RowScore]:
    """Every evaluated row of ``options.dataset`` scored (the per-example data behind acc and acc_norm)."""
    rows = read_jsonl(options.dataset, folder="mc")
    if options.limit:
        rows = rows[: options.limit]
    if not rows:
        raise ConfigError(f"task.dataset {options.dataset!r} has no rows")
    delimiter = delimiter_of(options)
    out = []
    for row in rows:
        pairs, gold, texts = _choices(row, options.dataset, delimiter)
        scores = _loglikelihoods(subject, pairs, options.batch_size)
        if gold is None:  # LAMBADA-style: correct iff the continuation is the greedy one
            out.append(RowScore(scores, float(pairs[0][2]), float(pairs[0][2])))
            continue
        lengths = [max(len(text), 1) for text in texts]
        norm = [s / n for s, n in zip(scores, lengths)]
        out.append(RowScore(scores, float(_argmax(scores) == gold), float(_argmax(norm) == gold)))
    return out


def delimiter_of(options: MultipleChoiceOptions) -> str:
    """The continuation delimiter: the option, or for ``auto`` the data set's own (by file stem)."""
    if options.delimiter != "auto":
        return options.delimiter
    return DELIMITERS.get(Path(options.dataset).stem, "")


def _argmax(values: list[float]) -> int:
    return max(range(len(values)), key=lambda i: values[i])


def _choices(row: dict[str, Any], dataset: str, delimiter: str = "") -> tuple[list[tuple[str, str, bool]], int | None, list[str]]:
    """(context, continuation, greedy flag) pairs, the gold index and each choice's text (for length normalisation)."""
    if "choices" in row and "query" in row:
        context = row["query"].rstrip() + delimiter if delimiter else row["query"]
        return [(context, " " + c, False) for c in row["choices"]], int(row["gold"]), list(row["choices"])
    if "context_options" in row:
        return [(c, " " + row["continuation"], False) for c in row["context_options"]], int(row["gold"]), [row["continuation"]] * len(row["context_options"])
    if "context" in row and "continuation" in row:
        return [(row["context"], " " + row["continuation"].lstrip(), True)], None, [row["continuation"]]
    raise ConfigError(
        f"task.dataset {dataset!r}: a row has keys {sorted(row)}; expected query/choices/gold, "
        "context_options/continuation/gold or context/continuation"
    )


def _loglikelihoods(subject: Subject, pairs: list[tuple[str, str, bool]], batch_size: int) -> list[float]:
    """Summed log-probability of each continuation given its context (greedy flag checked in place)."""
    tok, model, device = subject.tokenizer, subject.model, subject.device
    scores: list[float] = []
    for i in range(0, len(pairs), batch_size):
        chunk = pairs[i : i + batch_size]
        seqs, spans = [], []
        for context, continuation, _ in chunk:
            ctx_ids, cont_ids = encode(tok, context), encode(tok, continuation)
            seq = (ctx_ids + cont_ids)[-2048:]
            seqs.append(seq)
            spans.append(len(cont_ids))
        width = max(len(s) for s in seqs)
        pad = getattr(tok, "pad_token_id", None) or 0
        batch = torch.full((len(seqs), width), pad, dtype=torch.long, device=device)
        mask = torch.zeros((len(seqs), width), dtype=torch.long, device=device)
        for j, seq in enumerate(seqs):
            batch[j, : len(seq)] = torch.tensor(seq, device=device)
            mask[j, : len(seq)] = 1
        with torch.no_grad():
            logprobs = torch.log_softmax(model(input_ids=batch, attention_mask=mask).logits.float(), dim=-1)
        for j, (seq, span) in enumerate(zip(seqs, spans)):
            positions = torch.arange(len(seq) - span - 1, len(seq) - 1, device=device)
            targets = torch.tensor(seq[len(seq) - span :], device=device)
            token_lp = logprobs[j, positions, targets]
            scores.append(float(token_lp.sum()))
            if chunk[j][2]:  # greedy check for LAMBADA rows
                greedy = logprobs[j, positions].argmax(-1)
                pairs[i + j] = (chunk[j][0], chunk[j][1], bool(torch.equal(greedy, targets)))
    return scores


@hookimpl
def register_tasks(register: Callable[[Task], None]) -> None:
    register(Perplexity())
    register(MultipleChoice())

"""Quality tasks: perplexity on a corpus and multiple-choice log-likelihood accuracy."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from paretolab.context import TrialContext
from paretolab.data import encode, load_corpus, read_jsonl
from paretolab.errors import ConfigError
from paretolab.hookspec import hookimpl
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
    corpus: str = "pydoc"  # pydoc (built in) | wikitext2 | a path to a UTF-8 text file
    max_tokens: int = 4096  # token budget: the first max_tokens tokens of the corpus
    context: int = 512  # window length fed to the model
    stride: int = 512  # step between windows; < context scores each token with more left context
    batch_size: int = 4  # windows per forward pass when windows do not overlap


class Perplexity(Task):
    """exp(mean NLL) of the first ``max_tokens`` tokens, in windows of ``context`` moved by ``stride``."""

    name = "perplexity"
    metrics = ("ppl", "nll")
    options = PerplexityOptions

    def evaluate(self, subject: Subject, options: PerplexityOptions, ctx: TrialContext) -> dict[str, float]:
        if options.stride < 1 or options.stride > options.context:
            raise ConfigError(f"task.stride must be between 1 and task.context ({options.context}), got {options.stride}")
        ids = corpus_ids(subject.tokenizer, options.corpus, options.max_tokens).to(subject.device)
        nll_sum, count = 0.0, 0
        model = subject.model
        with torch.no_grad():
            for inputs, labels in _windows(ids, options):
                logits = model(input_ids=inputs).logits[:, :-1].float()
                target = labels[:, 1:]
                loss = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100, reduction="sum"
                )
                nll_sum += float(loss)
                count += int((target != -100).sum())
        nll = nll_sum / max(count, 1)
        ppl = math.exp(nll) if nll < 700 or math.isnan(nll) else float("inf")
        return {"ppl": ppl, "nll": nll}


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


@dataclass(frozen=True)
class MultipleChoiceOptions:
    dataset: str = "arc_easy"  # a name under <data dir>/mc/ (piqa, arc_easy, ...) or a jsonl path
    limit: int = 200  # the first `limit` examples (0 = all)
    batch_size: int = 8


class MultipleChoice(Task):
    """Log-likelihood accuracy (raw and length-normalised) as in lm-evaluation-harness.

    Rows are ``{query, choices, gold}`` (each choice scored as the continuation " " + choice),
    ``{context_options, continuation, gold}`` (WinoGrande: the continuation scored after each
    context) or ``{context, continuation}`` (LAMBADA: correct when greedy decoding reproduces it).
    """

    name = "multiple_choice"
    metrics = ("acc", "acc_norm")
    options = MultipleChoiceOptions

    def evaluate(self, subject: Subject, options: MultipleChoiceOptions, ctx: TrialContext) -> dict[str, float]:
        rows = read_jsonl(options.dataset, folder="mc")
        if options.limit:
            rows = rows[: options.limit]
        if not rows:
            raise ConfigError(f"task.dataset {options.dataset!r} has no rows")
        correct = correct_norm = 0
        for row in rows:
            pairs, gold = _choices(row, options.dataset)
            scores = _loglikelihoods(subject, pairs, options.batch_size)
            lengths = [max(len(cont.encode("utf-8")), 1) for _, cont, _ in pairs]
            if gold is None:  # LAMBADA-style: correct iff the continuation is the greedy one
                correct += int(pairs[0][2])
                correct_norm += int(pairs[0][2])
                continue
            correct += int(max(range(len(scores)), key=lambda i: scores[i]) == gold)
            correct_norm += int(max(range(len(scores)), key=lambda i: scores[i] / lengths[i]) == gold)
        return {"acc": correct / len(rows), "acc_norm": correct_norm / len(rows)}


def _choices(row: dict[str, Any], dataset: str) -> tuple[list[tuple[str, str, bool]], int | None]:
    if "choices" in row and "query" in row:
        return [(row["query"], " " + c, False) for c in row["choices"]], int(row["gold"])
    if "context_options" in row:
        return [(c, " " + row["continuation"], False) for c in row["context_options"]], int(row["gold"])
    if "context" in row and "continuation" in row:
        return [(row["context"], " " + row["continuation"].lstrip(), True)], None
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

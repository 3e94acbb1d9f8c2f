"""Multiple-choice log-likelihood accuracy (ARC, PIQA, BoolQ, ...) with lm-eval's conventions and standard errors.

It keeps the per-row scores as the ``per_example.json`` artifact, so that two trials on the same
rows can be compared paired by ``paretolab report`` (see :mod:`paretolab.stats`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from paretolab.data import encode, read_jsonl
from paretolab.errors import ConfigError
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.hookspec import hookimpl
from paretolab.plugin_api.options import option
from paretolab.plugin_api.subject import Subject
from paretolab.stats import ARTIFACT, mean_with_stderr, per_example_json
from paretolab.tasks.base import Task

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
    splits = True  # a confirm split keeps whole questions apart

    def evaluate(self, subject: Subject, options: MultipleChoiceOptions, ctx: TrialContext) -> dict[str, float]:
        scored = score_rows(subject, options, part=lambda n: ctx.examples(n, "question"))
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


def score_rows(subject: Subject, options: MultipleChoiceOptions, part: Callable[[int], list[int]] | None = None) -> list[RowScore]:
    """Every evaluated row of ``options.dataset`` scored (the per-example data behind acc and acc_norm); ``part``: the
    indices of the rows to score among the first ``limit`` (a confirm split's part, ``TrialContext.examples``)."""
    rows = read_jsonl(options.dataset, folder="mc")
    if options.limit:
        rows = rows[: options.limit]
    if part is not None:
        rows = [rows[i] for i in part(len(rows))]
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
    register(MultipleChoice())

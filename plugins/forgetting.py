"""The ``forgetting`` measure: what fine-tuning gained on the new task and lost elsewhere, each against the unmodified model.

Measured on the trial's model and on the worker's unmodified model (``ctx.base``) over the same
examples; the base values are computed once per worker process and options (the same model on the
same examples gives the same numbers), outside a trial (no ``ctx.base``) the subject is its own base.

- forgetting: ``forget_nll`` = mean next-token NLL on the first ``max_tokens`` tokens of ``corpus``
  (WikiText-2 by default, non-overlapping windows of ``seq_len``) minus the base's, in nats/token
  (``wiki_ppl``/``base_wiki_ppl`` the perplexities); ``mc_drop`` = the base's log-likelihood accuracy
  on the first ``mc_limit`` rows of the multiple-choice set ``mc_dataset`` minus the model's
  (lm-eval conventions, :func:`paretolab.tasks.score_rows`; ``mc_n`` rows).
- gain: ``gain_nll`` = the base's NLL on the held-out new-task corpus ``task_corpus`` minus the
  model's (``task_nll``/``base_task_nll``); ``task_acc``/``base_task_acc`` = exact-answer accuracy on
  the first ``acc_problems`` held-out arithmetic problems (``arith-val``), greedy, prompted as the
  ``arithmetic`` task's ``fewshot`` style with ``acc_shots`` worked problems from ``arith-train``.
- ``forget_per_gain`` = forget_nll / gain_nll: nats of WikiText-2 loss given up per nat of new-task
  loss won — forgetting read at equal gain (to first order: a method that forgets less for the same
  gain has the lower ratio). Infinite when nothing was gained.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import astuple, dataclass
from typing import Any

import torch

from paretolab.measure.measures import Measure
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.hookspec import hookimpl
from paretolab.plugin_api.metrics import Metric
from paretolab.plugin_api.options import option, parse_options
from paretolab.plugin_api.subject import Subject

METRICS: tuple[Metric, ...] = (
    Metric("forget_nll", "nats/token", "minimize", "forgetting measure: rise of the mean NLL on the forgetting corpus (WikiText-2) over the unmodified model's, same windows"),
    Metric("wiki_ppl", "ppl", "minimize", "forgetting measure: perplexity of the forgetting corpus (WikiText-2), first max_tokens tokens"),
    Metric("base_wiki_ppl", "ppl", "minimize", "forgetting measure: the unmodified model's perplexity on the same windows"),
    Metric("mc_acc", "accuracy", "maximize", "forgetting measure: multiple-choice log-likelihood accuracy on the first mc_limit rows"),
    Metric("base_mc_acc", "accuracy", "maximize", "forgetting measure: the unmodified model's multiple-choice accuracy on the same rows"),
    Metric("mc_drop", "accuracy", "minimize", "forgetting measure: base_mc_acc - mc_acc on the same rows"),
    Metric("mc_n", "rows", "maximize", "forgetting measure: multiple-choice rows scored"),
    Metric("task_nll", "nats/token", "minimize", "forgetting measure: mean NLL on the held-out new-task corpus"),
    Metric("base_task_nll", "nats/token", "minimize", "forgetting measure: the unmodified model's NLL on the same held-out new-task tokens"),
    Metric("gain_nll", "nats/token", "maximize", "forgetting measure: base_task_nll - task_nll (what fine-tuning won on the new task)"),
    Metric("task_acc", "accuracy", "maximize", "forgetting measure: exact-answer accuracy on held-out arithmetic problems (greedy, fewshot prompt)"),
    Metric("base_task_acc", "accuracy", "maximize", "forgetting measure: the unmodified model's exact-answer accuracy on the same problems"),
    Metric("task_acc_n", "problems", "maximize", "forgetting measure: held-out arithmetic problems behind task_acc"),
    Metric("forget_per_gain", "ratio", "minimize", "forgetting measure: forget_nll / gain_nll, forgetting per nat of new-task gain (inf when no gain)"),
)


@dataclass(frozen=True)
class ForgettingOptions:
    corpus: str = option("wikitext2", data="corpus")  # where forgetting shows as a rise in NLL
    max_tokens: int = option(2048, low=2)
    seq_len: int = option(256, low=2)  # window length (non-overlapping windows)
    mc_dataset: str = option("arc_easy", data="file")  # a multiple-choice set under <data dir>/mc/ (0 rows: mc_limit 0)
    mc_limit: int = option(40, low=0)  # rows scored (0: no multiple choice)
    task_corpus: str = option("arith-val", data="corpus")  # the held-out new-task text
    task_tokens: int = option(2048, low=2)
    acc_problems: int = option(24, low=0)  # held-out arithmetic problems for exact-answer accuracy (0: none)
    acc_shots: int = option(2, low=0)
    acc_new_tokens: int = option(40, low=1)
    batch: int = option(4, low=1)


@torch.no_grad()
def window_nll(subject: Subject, corpus: str, max_tokens: int, seq_len: int, batch: int) -> float:
    """Mean next-token NLL (nats) over non-overlapping windows of the first ``max_tokens`` tokens of ``corpus``."""
    from paretolab.tasks import corpus_ids

    ids = corpus_ids(subject.tokenizer, corpus, max_tokens)
    length = min(seq_len, ids.numel())
    windows = ids[: ids.numel() // length * length].reshape(-1, length)
    total, count = 0.0, 0
    model = subject.model
    was_training = model.training
    model.eval()
    for chunk in windows.split(batch):
        chunk = chunk.to(subject.device)
        logits = model(input_ids=chunk, use_cache=False).logits[:, :-1].float()
        total += float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1), reduction="sum"))
        count += chunk[:, 1:].numel()
    model.train(was_training)
    return total / max(count, 1)


def mc_accuracy(subject: Subject, dataset: str, limit: int) -> tuple[float, int]:
    """(log-likelihood accuracy, rows scored) on the first ``limit`` rows of a multiple-choice set."""
    from paretolab.tasks import MultipleChoiceOptions, score_rows

    rows = score_rows(subject, MultipleChoiceOptions(dataset=dataset, limit=limit))
    return sum(r.hit for r in rows) / len(rows), len(rows)


def arithmetic_accuracy(subject: Subject, problems: int, shots: int, new_tokens: int, ctx: TrialContext) -> float:
    """Exact-answer accuracy, greedy, on the first held-out problems, prompted as the ``fewshot`` arithmetic task."""
    from paretolab.generation import generate
    from paretolab.tasks.arith_corpus import problems as corpus_problems
    from paretolab.tasks.arith_corpus import val_problems
    from paretolab.tasks.generation import (
        extract_number,
        parse_gold,
        prompt_ids,
        stop_ids,
    )

    tok = subject.tokenizer
    examples, worked = val_problems(problems), list(corpus_problems("arith-train")[:shots])
    prompts = [prompt_ids(tok, ex, worked, "fewshot") for ex in examples]
    was_training = subject.model.training
    subject.model.eval()
    out = generate(subject, prompts, max_new_tokens=new_tokens, stop_ids=stop_ids(tok, "fewshot"), ctx=ctx)
    subject.model.train(was_training)
    texts = [tok.decode(seq, skip_special_tokens=True) for seq in out.sequences]
    hits = [extract_number(text) == parse_gold(extract_number, ex.answer) for text, ex in zip(texts, examples)]
    return sum(hits) / len(hits)


def scores(subject: Subject, options: ForgettingOptions, ctx: TrialContext) -> dict[str, float]:
    """The raw numbers of one model: forgetting-corpus NLL, MC accuracy, new-task NLL and accuracy."""
    out = {"wiki_nll": window_nll(subject, options.corpus, options.max_tokens, options.seq_len, options.batch),
           "task_nll": window_nll(subject, options.task_corpus, options.task_tokens, options.seq_len, options.batch)}
    if options.mc_limit:
        out["mc_acc"], out["mc_n"] = mc_accuracy(subject, options.mc_dataset, options.mc_limit)
    if options.acc_problems:
        out["task_acc"] = arithmetic_accuracy(subject, options.acc_problems, options.acc_shots, options.acc_new_tokens, ctx)
    return out


# per worker process: base model -> (tokenizer id, options) -> its scores; weak keys, so a freed model's entry goes with it
_BASE: weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple[Any, ...], dict[str, float]]] = weakref.WeakKeyDictionary()


class Forgetting(Measure):
    """New-task gain and forgetting (WikiText-2 NLL rise, multiple-choice drop) against the unmodified model, same examples."""

    name = "forgetting"
    metrics = tuple(m.name for m in METRICS)
    options = ForgettingOptions
    default = False

    def measure(self, subject: Subject, options: Any, ctx: TrialContext) -> dict[str, float]:
        if not isinstance(options, ForgettingOptions):
            options = parse_options(ForgettingOptions, options, where="measures.forgetting")
        base = ctx.base if ctx.base is not None else subject
        cached = _BASE.setdefault(base.model, {})
        key = (id(base.tokenizer), astuple(options))
        if key not in cached:
            cached[key] = scores(base, options, ctx)
        before, after = cached[key], scores(subject, options, ctx)
        forget, gain = after["wiki_nll"] - before["wiki_nll"], before["task_nll"] - after["task_nll"]
        out = {"forget_nll": forget, "wiki_ppl": math.exp(after["wiki_nll"]), "base_wiki_ppl": math.exp(before["wiki_nll"]),
               "task_nll": after["task_nll"], "base_task_nll": before["task_nll"], "gain_nll": gain,
               "forget_per_gain": forget / gain if gain > 0 else math.inf}
        if options.mc_limit:
            out.update({"mc_acc": after["mc_acc"], "base_mc_acc": before["mc_acc"], "mc_drop": before["mc_acc"] - after["mc_acc"],
                        "mc_n": float(after["mc_n"])})
        if options.acc_problems:
            out.update({"task_acc": after["task_acc"], "base_task_acc": before["task_acc"], "task_acc_n": float(options.acc_problems)})
        return out


@hookimpl
def register_measures(register: Callable[[Measure], None]) -> None:
    register(Forgetting())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    for metric in METRICS:
        register(metric)

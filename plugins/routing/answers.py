"""Recorded multiple-choice answers of a model: every choice's log-likelihood, the query's hidden representation, the cost.

A routing study asks "what would model X have answered, at what cost" thousands of times while it
searches thresholds; the answers are computed once per (model weights, questions, scoring
settings, recorder version) and replayed from :mod:`paretolab.recorded` (the store parallel_probe's
traces use). Replayed seconds are the ones measured while recording, labelled ``replayed``.

Scoring follows lm-eval's convention (:mod:`paretolab.tasks.multiple_choice`: the query plus the
data set's delimiter, each choice scored as the continuation " " + choice). Ours: one batched
forward per question over its choices, logits computed only at the continuation positions (Gemma's
262k-entry head over every position would dominate the cost), and the query representation is the
mean of the final (normed) hidden state over the query's tokens — what SDR's decider reads.
Cost per question: the tokens of that forward, its wall seconds, and an estimate of its FLOPs
(2 x non-embedding parameters x tokens + 2 x head parameters x continuation tokens).
"""

from __future__ import annotations

import random
import time
import weakref
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from paretolab.data import encode, read_jsonl, recorded
from paretolab.errors import ConfigError
from paretolab.plugin_api.subject import Subject
from paretolab.tasks.multiple_choice import DELIMITERS, _choices

RECORDER_VERSION = 1  # bump when the scoring below changes what a recording holds
BUILTIN = "builtin"  # a generated arithmetic set (no files): tests and the contract


@dataclass(frozen=True)
class Question:
    """One multiple-choice question: a context, its choices (continuations), the gold index, where it came from."""

    context: str
    choices: tuple[str, ...]
    gold: int
    source: str


def builtin_questions(n: int = 24, seed: int = 0) -> list[Question]:
    """Seeded sums with four numeric choices: a question set that needs no data files."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        wrong = rng.sample([a + b + d for d in (-3, -2, -1, 1, 2, 3)], 3)
        choices = [a + b, *wrong]
        rng.shuffle(choices)
        out.append(Question(f"Question: What is {a} + {b}?\nAnswer:", tuple(f" {c}" for c in choices), choices.index(a + b), BUILTIN))
    return out


def load_questions(datasets: Sequence[str], limit: int, seed: int = 0) -> list[Question]:
    """The first ``limit`` rows (0: all) of each named set under <data>/mc (query/choices/gold rows), or the builtin set."""
    out: list[Question] = []
    for name in datasets:
        if name == BUILTIN:
            out += builtin_questions(limit or 24, seed)
            continue
        rows = read_jsonl(name, folder="mc")
        rows = rows[:limit] if limit else rows
        for row in rows:
            if "choices" not in row:
                raise ConfigError(f"task.datasets: {name!r} rows have no `choices` (give query/choices/gold sets such as arc_easy, piqa, openbook_qa)")
            pairs, gold, _ = _choices(row, name, DELIMITERS.get(name, ""))
            out.append(Question(pairs[0][0], tuple(p[1] for p in pairs), int(gold), name))
    if not out:
        raise ConfigError(f"task.datasets {list(datasets)!r}: no questions")
    return out


@dataclass
class Answers:
    """One model's recorded answers on a question list (row i belongs to question i)."""

    loglik: list[list[float]]  # summed log-likelihood of each choice
    chars: list[list[int]]  # each choice's length in characters (acc_norm divides by it)
    hidden: list[list[float]]  # the query's representation (mean final hidden state over its tokens)
    tokens: list[int]  # tokens in the question's forward
    seconds: list[float]  # wall seconds of that forward, measured while recording
    gflops: list[float]  # estimated forward FLOPs / 1e9

    def scores(self, norm: bool) -> list[np.ndarray]:
        """Per question, the choice scores argmax picks from (log-likelihood, or per character with ``norm``)."""
        return [np.asarray(l) / np.asarray(c) if norm else np.asarray(l) for l, c in zip(self.loglik, self.chars)]


_FINGERPRINTS: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()


def shared_fingerprint(model: torch.nn.Module) -> str:
    """The model's fingerprint, hashed once per model object: the role models are shared read-only across a
    worker's trials (hashing Gemma's 1 GB of fp32 weights every trial would cost seconds); a method's copy is a new object."""
    if model not in _FINGERPRINTS:
        _FINGERPRINTS[model] = recorded.model_fingerprint(model)
    return _FINGERPRINTS[model]


def answers_key(subject: Subject, questions: Sequence[Question], *, shared: bool = False) -> str:
    """The recording's key: model weights and config, every question's text and choices, tokenizer, device, recorder version."""
    material = {
        "kind": "mc-answers",
        "model": shared_fingerprint(subject.model) if shared else recorded.model_fingerprint(subject.model),
        "questions": [[q.context, list(q.choices)] for q in questions],
        "tokenizer": type(subject.tokenizer).__name__ + str(len(subject.tokenizer)),
        "device": subject.device.type,
    }
    return recorded.record_key(material, code=RECORDER_VERSION)


def load_or_record_answers(subject: Subject, questions: Sequence[Question], *, shared: bool = False) -> tuple[Answers, bool]:
    """The model's recorded answers, from the cache or scored now (then stored); (answers, was_cached).

    ``shared``: the subject is a role model the worker shares read-only, so its fingerprint is computed once.
    """
    key = answers_key(subject, questions, shared=shared)
    data, cached = recorded.load_or_record("answers", key, lambda: asdict(record_answers(subject, questions)))
    return Answers(**data), cached


@torch.no_grad()
def record_answers(subject: Subject, questions: Sequence[Question]) -> Answers:
    """Score every question's choices with one forward per question; keep the query representation and the cost."""
    model, tok, device = subject.model, subject.tokenizer, subject.device
    body, head = model.get_decoder(), model.get_output_embeddings()
    softcap = getattr(model.config, "final_logit_softcapping", None)
    head_params = head.weight.numel()
    embed_params = model.get_input_embeddings().weight.numel()
    body_params = sum(p.numel() for p in model.parameters()) - embed_params - (0 if head.weight is model.get_input_embeddings().weight else head_params)
    pad = getattr(tok, "pad_token_id", None) or 0
    out = Answers([], [], [], [], [], [])
    for q in questions:
        ctx_ids = encode(tok, q.context)
        conts = [encode(tok, c) for c in q.choices]
        seqs = [(ctx_ids + c)[-2048:] for c in conts]
        width = max(len(s) for s in seqs)
        batch = torch.full((len(seqs), width), pad, dtype=torch.long, device=device)
        mask = torch.zeros((len(seqs), width), dtype=torch.long, device=device)
        for j, seq in enumerate(seqs):
            batch[j, : len(seq)] = torch.tensor(seq, dtype=torch.long, device=device)
            mask[j, : len(seq)] = 1
        start = time.perf_counter()
        hidden = body(input_ids=batch, attention_mask=mask).last_hidden_state
        logliks = []
        for j, (seq, cont) in enumerate(zip(seqs, conts)):
            span = len(cont)
            positions = torch.arange(len(seq) - span - 1, len(seq) - 1, device=device)
            logits = head(hidden[j, positions]).float()
            if softcap:
                logits = torch.tanh(logits / softcap) * softcap
            targets = torch.tensor(seq[len(seq) - span :], dtype=torch.long, device=device)
            logliks.append(float(torch.log_softmax(logits, -1).gather(-1, targets[:, None]).sum()))
        n_ctx = max(1, min(len(ctx_ids), width - 1))
        query = hidden[0, :n_ctx].float().mean(0)
        seconds = time.perf_counter() - start
        tokens = sum(len(s) for s in seqs)
        cont_tokens = sum(len(c) for c in conts)
        out.loglik.append(logliks)
        out.chars.append([max(len(c.strip()), 1) for c in q.choices])
        out.hidden.append([round(float(v), 5) for v in query.cpu()])
        out.tokens.append(tokens)
        out.seconds.append(seconds)
        out.gflops.append((2 * body_params * tokens + 2 * head_params * cont_tokens) / 1e9)
    return out


def golds(questions: Sequence[Question]) -> np.ndarray:
    return np.asarray([q.gold for q in questions])


def as_arrays(answers: Answers, norm: bool) -> dict[str, Any]:
    """Arrays a router reads: per question the choice probabilities (softmax of the scores), the hidden vector and costs."""
    scores = answers.scores(norm)
    probs = [np.exp(s - s.max()) / np.exp(s - s.max()).sum() for s in scores]
    return {"probs": probs, "pred": np.asarray([int(np.argmax(s)) for s in scores]), "hidden": np.asarray(answers.hidden, dtype=np.float64),
            "tokens": np.asarray(answers.tokens, dtype=np.float64), "seconds": np.asarray(answers.seconds), "gflops": np.asarray(answers.gflops)}

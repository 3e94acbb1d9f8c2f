"""Synthetic associative recall (multi-query, seeded): key–value pairs in context, then the keys again; is each value recalled?

The data (ours, in the spirit of MQAR, Arora et al. 2023, "Zoology"): every example is one line of
single-letter words, each written with a leading space so that a byte-level BPE (the scratch
models' pystdlib tokenizer) gives one token per word. A line holds ``N_PAIRS`` = 8 pairs
``" k V"`` — keys are distinct lowercase letters (26 possible), values uppercase letters (26,
drawn with replacement) — then the separator ``" :"``, then the same 8 keys in a shuffled order,
each followed by its value: 2·8 + 1 + 2·8 = 33 tokens and a newline. Only the values after the
separator can be predicted; chance is 1/26.

Two corpora come from it (names usable wherever a corpus is, e.g. ``train.corpus``):
``assoc-recall-train`` (20,000 lines, seed 0) and ``assoc-recall-val`` (2,000 lines, seed 1; the
held-out one). The ``assoc_recall`` task scores the first ``examples`` lines of its ``corpus``:
each line is fed once (teacher forcing) and a query counts as recalled when the model's argmax
at every token of its value is that token; an example's score is the fraction of its 8 queries
recalled, ``acc`` the mean over examples with ``acc_stderr`` over examples (per-example scores in
``per_example.json`` for paired comparisons). Scoring works with any tokenizer (a value of several
tokens must come out whole), but the data is meant for the scratch models' tokenizer.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from paretolab.data import encode, load_corpus
from paretolab.errors import ConfigError
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.hookspec import hookimpl
from paretolab.plugin_api.options import option
from paretolab.plugin_api.subject import Subject
from paretolab.stats import ARTIFACT, mean_with_stderr, per_example_json
from paretolab.tasks.base import Task

KEYS = tuple(string.ascii_lowercase)
VALUES = tuple(string.ascii_uppercase)
N_PAIRS = 8
SEPARATOR = ":"
CORPORA = {"assoc-recall-train": (20_000, 0), "assoc-recall-val": (2_000, 1)}  # name -> (lines, seed)


def example_words(rng: random.Random, n_pairs: int = N_PAIRS) -> list[str]:
    """One example's words: pairs, separator, the keys shuffled with their values."""
    keys = rng.sample(KEYS, n_pairs)
    values = {k: rng.choice(VALUES) for k in keys}
    queries = rng.sample(keys, n_pairs)
    return [w for k in keys for w in (k, values[k])] + [SEPARATOR] + [w for k in queries for w in (k, values[k])]


def corpus_text(name: str) -> str:
    """The text of a synthetic corpus (one example per line, every word after a space), deterministic from its seed."""
    if name not in CORPORA:
        raise ConfigError(f"corpus {name!r} is not an associative-recall corpus ({', '.join(CORPORA)})")
    lines, seed = CORPORA[name]
    rng = random.Random(seed)
    return "\n".join("".join(" " + w for w in example_words(rng)) for _ in range(lines)) + "\n"


@dataclass(frozen=True)
class AssocRecallOptions:
    corpus: str = option("assoc-recall-val", data="corpus")  # the synthetic corpus whose lines are scored (assoc-recall-val: held out)
    examples: int = option(256, low=1)  # the first lines of the corpus scored
    batch_size: int = option(32, low=1)  # lines per forward pass


def _encoded(tokenizer: Any, words: list[str]) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids of a line word by word, and the (start, end) token span of every value after the separator."""
    ids: list[int] = []
    spans: list[tuple[int, int]] = []
    after = False
    for i, word in enumerate(words):
        piece = encode(tokenizer, " " + word)
        if after and i % 2 == 0:  # after the separator (odd index), words alternate key (odd) / value (even)
            spans.append((len(ids), len(ids) + len(piece)))
        ids += piece
        after = after or word == SEPARATOR
    return ids, spans


class AssocRecall(Task):
    """Accuracy of recalling each query key's value from the pairs earlier in the line (see the module docstring)."""

    name = "assoc_recall"
    metrics = ("acc", "acc_stderr", "n_examples")
    options = AssocRecallOptions
    chance: ClassVar[dict[str, float]] = {"acc": 1 / len(VALUES)}  # a value guessed among the 26 letters

    def evaluate(self, subject: Subject, options: AssocRecallOptions, ctx: TrialContext) -> dict[str, float]:
        text, _ = load_corpus(options.corpus)
        lines = [line.split() for line in text.splitlines() if line.strip()][: options.examples]
        if not lines or any(SEPARATOR not in words or words.index(SEPARATOR) % 2 for words in lines):
            raise ConfigError(f"task.corpus: {options.corpus!r} is not an associative-recall corpus (lines of pairs, ' :', queries); "
                              f"use one of {', '.join(CORPORA)}")
        encoded = [_encoded(subject.tokenizer, words) for words in lines]
        scores: list[float] = []
        model = subject.model
        with torch.no_grad():
            for i in range(0, len(encoded), options.batch_size):
                group = encoded[i : i + options.batch_size]
                width = max(len(ids) for ids, _ in group)
                batch = torch.zeros((len(group), width), dtype=torch.long, device="cpu")
                for row, (ids, _) in enumerate(group):
                    batch[row, : len(ids)] = torch.tensor(ids, device="cpu")  # right padding: causal models never look at it
                predicted = model(input_ids=batch.to(subject.device), use_cache=False).logits.argmax(-1).cpu()
                for row, (ids, spans) in enumerate(group):
                    hits = [all(int(predicted[row, t - 1]) == ids[t] for t in range(s, e)) for s, e in spans]
                    scores.append(sum(hits) / len(hits))
        ctx.add_artifact(ARTIFACT, per_example_json("example", {"acc": scores}))
        return {**mean_with_stderr("acc", scores), "n_examples": float(len(scores))}


@hookimpl
def register_tasks(register: Callable[[Task], None]) -> None:
    register(AssocRecall())

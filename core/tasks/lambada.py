"""LAMBADA: predict a passage's final word from its context (greedy generation, token-exact).

Rows have a ``context`` and its final word, the ``continuation``. Scoring: the context (its
trailing whitespace removed) is continued greedily through :func:`paretolab.generation.generate`,
the subject's generator (where a prompt-compression method hooks in), for exactly as many tokens
as ``" " + continuation`` has; the example is correct when the generated ids equal those ids
(token-exact, the standard LAMBADA metric: "he" for "hello" is wrong, no normalisation).

Sources (``source:``):

- ``lambada``: ``mc/lambada_openai.jsonl`` (the OpenAI LAMBADA test set as llm-foundry ships it,
  5,153 rows) in a data dir (``$PARETOLAB_DATA_DIR``; see :func:`paretolab.data.data_dirs`);
- ``builtin``: LAMBADA-like rows made here, deterministically, from the built-in pydoc prose:
  passages of 60-100 words that end on an alphabetic word of at least 4 letters which already
  occurred (same spelling) earlier in the passage, roughly LAMBADA's own construction filter
  (no human-guessability filter). For tests and machines without the data folder.

Splits are fixed and disjoint, defined here only (:data:`SPLITS`): ``eval`` is what the task
scores (its first ``limit`` rows), ``train`` what a method may learn from (:func:`split_rows`).
Reported: ``acc`` with ``acc_stderr`` over ``n_examples``, ``prefill_ms`` (median per example,
one prompt per generate call), and every stat the generator returns (one prompt per call, so
per example), averaged over the examples; the per-example hits and stats are kept as
``per_example.json`` so claims carry the example noise. ``context_kept_frac`` and
``prefill_flops_ratio`` are 1 for the unmodified generator (the whole prompt is prefilled, nothing
is spent choosing); a prompt-compressing generator (``omnisift_text``) returns its own.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from paretolab.data import DATA_ENV, data_dirs, encode, find_data_file, pydoc_text, read_jsonl
from paretolab.errors import ConfigError
from paretolab.generation import generate
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.hookspec import hookimpl
from paretolab.plugin_api.metrics import Metric
from paretolab.plugin_api.options import option
from paretolab.plugin_api.subject import Subject
from paretolab.stats import ARTIFACT, mean_with_stderr, per_example_json
from paretolab.tasks.base import Task

FILE = "mc/lambada_openai.jsonl"
SOURCES = ("lambada", "builtin")
# The one definition of the splits: source -> split -> [first, end) rows (None: to the last row).
SPLITS: dict[str, dict[str, tuple[int, int | None]]] = {
    "lambada": {"eval": (0, 2000), "train": (2000, None)},
    "builtin": {"eval": (0, 200), "train": (200, None)},
}
BUILTIN_WORDS = (60, 100)  # passage length in words, both ends included
_WORD = re.compile(r"^[A-Za-z]{4,}$")
# What a prompt-compressing generator returns per prompt; the default generator prefills the whole prompt: 1 each.
PREFILL_STATS = ("context_kept_frac", "prefill_flops_ratio")


@dataclass(frozen=True)
class LambadaOptions:
    source: str = option("lambada", one_of=SOURCES)  # lambada: mc/lambada_openai.jsonl in a data dir; builtin: generated from pydoc
    limit: int = option(200, low=0)  # the first `limit` rows of the eval split (0 = the whole split)


class Lambada(Task):
    """Accuracy of greedily generating a passage's final word (token-exact), and prefill time."""

    name = "lambada"
    metrics = ("acc", "acc_stderr", "n_examples", "prefill_ms", *PREFILL_STATS)
    options = LambadaOptions

    def evaluate(self, subject: Subject, options: LambadaOptions, ctx: TrialContext) -> dict[str, float]:
        rows = split_rows(options.source, "eval")
        rows = rows[: options.limit] if options.limit else rows
        tok = subject.tokenizer
        hits: list[float] = []
        prefill_s: list[float] = []
        per_prompt: list[dict[str, float]] = []
        for row in rows:
            target = target_ids(tok, row["continuation"])
            out = generate(subject, [encode(tok, row["context"].rstrip())], max_new_tokens=len(target), ctx=ctx)
            hits.append(float(is_correct(out.sequences[0], target)))
            prefill_s.append(out.prefill_s)
            whole = dict.fromkeys(PREFILL_STATS, 1.0) if subject.generator is None else {}
            per_prompt.append({**whole, **{k: float(v) for k, v in out.stats.items()}})
        keys = sorted({k for one in per_prompt for k in one})
        if any(sorted(one) != keys for one in per_prompt):
            raise ValueError(f"task lambada: the generator returned its stats {keys} for some prompts only")
        stats = {k: [one[k] for one in per_prompt] for k in keys}
        ctx.add_artifact(ARTIFACT, per_example_json("example", {"acc": hits, **stats}))
        return {**mean_with_stderr("acc", hits), "n_examples": float(len(hits)),
                "prefill_ms": statistics.median(prefill_s) * 1000, **{k: statistics.fmean(v) for k, v in stats.items()}}


def target_ids(tokenizer: Any, word: str) -> list[int]:
    """The ids the model must generate: the final word after a space (the context ends without one)."""
    return encode(tokenizer, " " + word.strip())


def is_correct(generated: list[int], target: list[int]) -> bool:
    """Token-exact: the generated ids are the target's ids, no more and no fewer."""
    return list(generated) == list(target)


def split_rows(source: str, split: str) -> list[dict[str, str]]:
    """The rows of ``split`` (``eval`` or ``train``) of ``source``: dicts with ``context`` and ``continuation``."""
    if source not in SPLITS:
        raise ConfigError(f"lambada source {source!r} is not known; use one of {', '.join(SOURCES)}")
    if split not in SPLITS[source]:
        raise ConfigError(f"lambada split {split!r} is not known; use one of {', '.join(SPLITS[source])}")
    first, end = SPLITS[source][split]
    rows = _file_rows() if source == "lambada" else builtin_rows()
    return list(rows[first:end])


@lru_cache(maxsize=1)
def builtin_rows() -> tuple[dict[str, str], ...]:
    """LAMBADA-like rows from the pydoc prose, the same on every run of this Python (see the module docstring)."""
    words = pydoc_text().split()
    shortest, longest = BUILTIN_WORDS
    rows, seen = [], set()
    start = 0
    while start + longest <= len(words):
        for end in range(start + shortest, start + longest + 1):  # the target is words[end - 1]
            target = words[end - 1].rstrip(".,;:!?\"')")
            if _WORD.match(target) and target in {w.strip(".,;:!?\"'()") for w in words[start : end - 1]}:
                context = " ".join(words[start : end - 1])
                if context not in seen:  # the manual repeats some passages: each row once, so the splits share none
                    seen.add(context)
                    rows.append({"context": context, "continuation": target})
                start = end
                break
        else:
            start += longest
    return tuple(rows)


def data_path() -> str:
    """The LAMBADA file in the first data dir that has it, or a ConfigError naming the file and the fix."""
    try:
        return str(find_data_file(FILE))
    except ConfigError:
        searched = ", ".join(str(d) for d in data_dirs()) or "no data dir"
        raise ConfigError(f"task lambada: data file {FILE!r} not found in {searched}; set {DATA_ENV} to a folder that has it "
                          "(the shared data folder; the file is llm-foundry's local_data/language_understanding/lambada_openai.jsonl), "
                          "or use source: builtin") from None


@lru_cache(maxsize=2)
def _cached_file_rows(path: str) -> tuple[dict[str, str], ...]:
    rows = []
    for line_no, row in enumerate(read_jsonl(path), 1):
        if not isinstance(row.get("context"), str) or not isinstance(row.get("continuation"), str):
            raise ConfigError(f"{path}: row {line_no} has keys {sorted(row)}; lambada needs context and continuation (text)")
        rows.append({"context": row["context"], "continuation": row["continuation"]})
    return tuple(rows)


def _file_rows() -> tuple[dict[str, str], ...]:
    return _cached_file_rows(data_path())


@hookimpl
def register_tasks(register: Callable[[Task], None]) -> None:
    register(Lambada())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    register(Metric("context_kept_frac", "fraction", "minimize",
                    "prompt tokens that entered prefill ÷ prompt tokens, mean over prompts (1 for the unmodified generator)"))
    register(Metric("prefill_flops_ratio", "ratio", "minimize",
                    "(FLOPs choosing the kept tokens + prefill FLOPs of the kept tokens) ÷ prefill FLOPs of the whole prompt, "
                    "mean over prompts (1 for the unmodified generator)"))

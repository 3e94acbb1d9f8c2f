"""Key-value retrieval: find one key's value in a long JSON object (greedy generation, exact match).

The data are llm-foundry's synthetic long-context sets, ``longctx/kv_pairs_{position}_len_2048.jsonl``
under a data dir (``$PARETOLAB_DATA_DIR``): each row has a ``context`` (an instruction, a JSON
object of UUID keys and values, then ``Key: "<key>"`` and ``Corresponding Value:``) and the
``answer`` (llm-foundry's name; ``continuation`` is accepted too). ``position`` says where in the
object the asked key sits. Any jsonl with ``context`` and ``answer``/``continuation`` works
through ``path``.

Scoring, as llm-foundry scores this set (``InContextLearningGenerationExactMatchAccuracy``): the
context (its trailing whitespace removed, so the model writes the space itself) is continued
greedily with :func:`paretolab.generation.generate`, the subject's generator, for the answer's
token count + 8 tokens unless ``max_new_tokens`` says otherwise; continuation and answer are
normalised (lower case, punctuation and the articles a/an/the removed, whitespace collapsed) and
the example is correct when the normalised continuation starts with the normalised answer — so
a model that writes ``"<value>"`` or opens a JSON object with the value is not penalised for the
quotes, but every character of the value must be right.
``prefill_ms`` is the median prefill time per example (one prompt per generate call), the
number a prefill method such as token sparse attention changes. ``acc_stderr`` is the standard
error over the ``n_examples`` rows; the per-example hits are kept as ``per_example.json``.
"""

from __future__ import annotations

import re
import statistics
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paretolab.data import DATA_ENV, data_dirs, encode, read_jsonl
from paretolab.errors import ConfigError
from paretolab.generation import generate
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.hookspec import hookimpl
from paretolab.plugin_api.options import option
from paretolab.plugin_api.subject import Subject
from paretolab.stats import ARTIFACT, mean_with_stderr, per_example_json
from paretolab.tasks.base import Task

POSITIONS = ("beginning", "middle", "end")
PUNCTUATION = frozenset(string.punctuation)
FOLDER = "longctx"


def data_file(position: str) -> str:
    """The file of ``position`` relative to a data dir."""
    return f"{FOLDER}/kv_pairs_{position}_len_2048.jsonl"


@dataclass(frozen=True)
class KVRetrievalOptions:
    positions: list[str] | str = option("beginning,middle,end", check=lambda v: positions_of(v))  # where the asked key sits: names, comma-separated or a list
    limit: int = option(20, low=0)  # the first `limit` examples of each position (0 = all 300)
    max_new_tokens: int = option(0, low=0)  # greedy budget; 0 = the answer's own token count + 8
    path: str = option("", data="file")  # a jsonl with context/answer rows instead of the named positions


def normalise(text: str) -> str:
    """llm-foundry's answer normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def is_correct(continuation: str, answer: str) -> bool:
    """True when the normalised continuation starts with the normalised (non-empty) answer."""
    want = normalise(answer)
    return bool(want) and normalise(continuation).startswith(want)


class KVRetrieval(Task):
    """Accuracy of retrieving a value from ~2k tokens of key-value pairs, and prefill time."""

    name = "kv_retrieval"
    metrics = ("acc", "acc_stderr", "n_examples", "prefill_ms")
    options = KVRetrievalOptions

    def evaluate(self, subject: Subject, options: KVRetrievalOptions, ctx: TrialContext) -> dict[str, float]:
        if options.limit < 0:
            raise ConfigError(f"task.limit must be >= 0 (0 = all rows), got {options.limit}")
        if options.max_new_tokens < 0:
            raise ConfigError(f"task.max_new_tokens must be >= 0 (0 = the answer's length + 8), got {options.max_new_tokens}")
        rows = load_rows(options)
        tok = subject.tokenizer
        stop_ids = [i for i in (getattr(tok, "eos_token_id", None),) if i is not None]
        hits: list[float] = []
        prefill_s: list[float] = []
        for row in rows:
            answer = str(row["answer"])
            budget = options.max_new_tokens or len(encode(tok, " " + answer.strip())) + 8
            prompt = encode(tok, str(row["context"]).rstrip())
            out = generate(subject, [prompt], max_new_tokens=budget, stop_ids=stop_ids, ctx=ctx)
            text = tok.decode(out.sequences[0], skip_special_tokens=True)
            hits.append(float(is_correct(text, answer)))
            prefill_s.append(out.prefill_s)
        ctx.add_artifact(ARTIFACT, per_example_json("example", {"acc": hits}))
        return {**mean_with_stderr("acc", hits), "n_examples": float(len(hits)),
                "prefill_ms": statistics.median(prefill_s) * 1000}


def positions_of(value: list[str] | str) -> list[str]:
    """The position names from a list or a comma-separated string, checked."""
    if not isinstance(value, (str, list)):
        raise ConfigError(f"task.positions: expected names like 'beginning,end' or a list, got {value!r}")
    names = [p.strip() for p in value.split(",")] if isinstance(value, str) else [str(p).strip() for p in value]
    names = [p for p in names if p]
    bad = [p for p in names if p not in POSITIONS]
    if bad or not names:
        raise ConfigError(f"task.positions: {bad or value!r} not known; use any of {', '.join(POSITIONS)}")
    return names


def load_rows(options: KVRetrievalOptions) -> list[dict[str, Any]]:
    """Rows with ``context`` and ``answer``: the first ``limit`` of each position, or of ``path``."""
    if options.path:
        if not Path(options.path).expanduser().is_file():
            raise ConfigError(f"task.path {options.path!r} is not a file; give a jsonl with context and answer fields")
        sources = [options.path]
    else:
        sources = [_find(position) for position in positions_of(options.positions)]
    rows: list[dict[str, Any]] = []
    for source in sources:
        part = read_jsonl(source)
        if options.limit:
            part = part[: options.limit]
        for line_no, row in enumerate(part, 1):
            if "answer" not in row and "continuation" in row:
                row = {**row, "answer": row["continuation"]}
            if "context" not in row or "answer" not in row:
                raise ConfigError(f"{source}: row {line_no} has keys {sorted(row)}; kv_retrieval needs context and answer (or continuation)")
            rows.append(row)
    if not rows:
        raise ConfigError(f"task kv_retrieval: no rows in {', '.join(sources)}")
    return rows


def _find(position: str) -> str:
    relative = data_file(position)
    for folder in data_dirs():
        if (folder / relative).is_file():
            return str(folder / relative)
    raise ConfigError(
        f"task kv_retrieval: data file {relative!r} not found in {', '.join(str(d) for d in data_dirs())}; "
        f"set {DATA_ENV} to a folder that has it (llm-foundry's scripts/eval/local_data/long_context/"
        f"kv_pairs_{position}_len_2048.jsonl under {FOLDER}/), or give task.path"
    )


@hookimpl
def register_tasks(register: Callable[[Task], None]) -> None:
    register(KVRetrieval())

"""Branch traces: N sampled branches per question, probed every ``grid`` tokens, recorded once and cached.

Recording decodes the N branches of several questions as one batch (one prefill per question,
its KV cache repeated N times) with seeded sampling, one random stream per branch. Every
``grid`` tokens each live branch is probed: the cue ("... The answer is") is appended, a short
answer is decoded greedily, and the cache is rolled back so the branch continues as if it had
never been asked. Finished branches leave the batch.

A recording is keyed by everything that changes it: the model's weights and config (a hash of
every parameter), the prompt ids, the stop ids and token budget, N, the sampling settings and
seed, the probe grid, cue ids and answer length, the questions per batch (batched float
rounding), and the torch / transformers versions. Any change records anew. The store is
:mod:`paretolab.recorded`, shared with the routing studies' recorded answers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from paretolab.data import recorded
from paretolab.data.recorded import model_fingerprint, record_key, record_path  # noqa: F401  (model_fingerprint re-exported)
from paretolab.errors import ConfigError
from paretolab.generation.decoding import BatchDecoder, Sampling, TokenChooser

TRACE_FORMAT = 2  # bump when the recording procedure changes what a trace holds (2: decode_s keeps probe overhead)


@dataclass(frozen=True)
class RecordSettings:
    """How branches are produced and probed (every field is part of the cache key)."""

    n_branches: int = 8
    temperature: float = 0.7
    top_p: float = 0.95
    seed: int = 0
    probe_grid: int = 8  # tokens between recorded probes; the controller's Δ is a multiple of it
    cue: str = "\nThe answer is"
    answer_tokens: int = 8  # greedy tokens decoded after the cue
    questions_per_batch: int = 4  # questions decoded together (rows = questions x branches)

    def __post_init__(self) -> None:
        for name in ("n_branches", "probe_grid", "answer_tokens", "questions_per_batch"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        Sampling(self.temperature, self.top_p, self.seed)  # validates


@dataclass
class BranchTrace:
    tokens: list[int]
    stopped: bool  # ended on a stop id (False: ran out of budget)
    probes: list[list[int]]  # probes[i]: answer ids decoded after the cue at grid * (i + 1) tokens


@dataclass
class QuestionTrace:
    branches: list[BranchTrace]


@dataclass
class Recording:
    questions: list[QuestionTrace]
    cue_ids: list[int]
    prefill_s: float
    decode_s: float  # branch decoding only
    probe_s: float
    tokens: int  # branch tokens decoded while recording

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Recording:
        questions = [QuestionTrace([BranchTrace(**b) for b in q["branches"]]) for q in data["questions"]]
        return cls(questions, data["cue_ids"], data["prefill_s"], data["decode_s"], data["probe_s"], data["tokens"])


def trace_key(model: torch.nn.Module, prompts: Sequence[Sequence[int]], *, stop_ids: Sequence[int],
              probe_stop_ids: Sequence[int], cue_ids: Sequence[int], max_new_tokens: int, settings: RecordSettings) -> str:
    """The cache key of a recording: a hash over everything that changes the traces."""
    material = {
        "model": model_fingerprint(model),
        "prompts": [list(p) for p in prompts],
        "stop_ids": sorted(stop_ids),
        "probe_stop_ids": sorted(probe_stop_ids),
        "cue_ids": list(cue_ids),
        "max_new_tokens": max_new_tokens,
        "settings": asdict(settings),
        "device": str(next(model.parameters()).device.type),
    }
    return record_key(material, code=TRACE_FORMAT)


def trace_path(key: str) -> Path:
    return record_path("traces", key)


def load_or_record(model: torch.nn.Module, prompts: Sequence[Sequence[int]], *, key: str, **kwargs: Any) -> tuple[Recording, bool]:
    """The recording under ``key`` from the cache, else recorded now and stored; (recording, was_cached)."""
    data, cached = recorded.load_or_record("traces", key, lambda: record(model, prompts, **kwargs).to_json())
    return Recording.from_json(data), cached


@torch.no_grad()
def record(model: torch.nn.Module, prompts: Sequence[Sequence[int]], *, stop_ids: Sequence[int], probe_stop_ids: Sequence[int],
           cue_ids: Sequence[int], max_new_tokens: int, settings: RecordSettings) -> Recording:
    """Decode ``settings.n_branches`` sampled branches per prompt, probing each every ``probe_grid`` tokens."""
    if not cue_ids:
        raise ConfigError("the probe cue must encode to at least one token")
    n = settings.n_branches
    chooser = TokenChooser(Sampling(settings.temperature, settings.top_p, settings.seed), len(prompts) * n)
    questions: list[QuestionTrace] = []
    totals = {"prefill_s": 0.0, "decode_s": 0.0, "probe_s": 0.0, "tokens": 0}
    for first in range(0, len(prompts), settings.questions_per_batch):
        chunk = prompts[first : first + settings.questions_per_batch]
        branches = [BranchTrace([], False, []) for _ in range(len(chunk) * n)]
        _record_chunk(model, chunk, branches, first * n, chooser, set(stop_ids), set(probe_stop_ids), list(cue_ids),
                      max_new_tokens, settings, totals)
        questions += [QuestionTrace(branches[q * n : (q + 1) * n]) for q in range(len(chunk))]
    return Recording(questions, list(cue_ids), totals["prefill_s"], totals["decode_s"], totals["probe_s"], int(totals["tokens"]))


def _record_chunk(model: torch.nn.Module, chunk: Sequence[Sequence[int]], branches: list[BranchTrace], stream0: int,
                  chooser: TokenChooser, stop: set[int], probe_stop: set[int], cue: list[int], max_new_tokens: int,
                  settings: RecordSettings, totals: dict[str, float]) -> None:
    decoder = BatchDecoder(model)
    logits = decoder.prefill(chunk).repeat_interleave(settings.n_branches, dim=0)
    decoder.repeat(settings.n_branches)  # one prefill per question, shared by its branches
    live = list(range(len(branches)))  # batch row -> branch index (stream stream0 + index)
    step = 0
    while True:
        next_ids = chooser.choose(logits, [stream0 + b for b in live])
        step += 1
        keep = []
        for row, (b, token) in enumerate(zip(live, next_ids.tolist())):
            branches[b].tokens.append(token)
            if token in stop:
                branches[b].stopped = True
            elif step < max_new_tokens:
                keep.append(row)
        if not keep:
            break
        if len(keep) < len(live):
            decoder.select(keep)
            next_ids = next_ids[keep]
            live = [live[row] for row in keep]
        logits = decoder.extend(next_ids)
        if step % settings.probe_grid == 0:  # every live branch has `step` tokens and goes on
            start, branch_decode_s = time.perf_counter(), decoder.decode_s
            answers = _probe(decoder, cue, settings.answer_tokens, probe_stop)
            for b, ids in zip(live, answers):
                branches[b].probes.append(ids)
            totals["probe_s"] += time.perf_counter() - start
            decoder.decode_s = branch_decode_s  # the probe's forwards are counted apart (in probe_s), nothing else
    totals["prefill_s"] += decoder.prefill_s
    totals["decode_s"] += decoder.decode_s
    totals["tokens"] += sum(len(b.tokens) for b in branches)


def _probe(decoder: BatchDecoder, cue: list[int], answer_tokens: int, stop: set[int]) -> list[list[int]]:
    """Greedy short answers of every row after ``cue``; the cache is rolled back afterwards."""
    mark = decoder.length
    logits = decoder.extend(torch.tensor([cue] * decoder.rows, dtype=torch.long, device=decoder.device))
    answers: list[list[int]] = [[] for _ in range(decoder.rows)]
    done = [False] * decoder.rows
    for i in range(answer_tokens):
        next_ids = logits.argmax(-1)
        for row, token in enumerate(next_ids.tolist()):
            if not done[row]:
                answers[row].append(token)
                done[row] = token in stop
        if all(done) or i == answer_tokens - 1:
            break
        logits = decoder.extend(next_ids)
    decoder.rollback(mark)
    return answers

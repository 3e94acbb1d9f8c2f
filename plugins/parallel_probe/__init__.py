"""Parallel-Probe (early-stopped, pruned parallel reasoning) and its baseline, self-consistency.

Zheng et al., "Parallel-Probe: Towards Efficient Parallel Thinking via 2D Probing" (ICML 2026,
code: zhengkid/Parallel-Probe). Baseline: self-consistency, the majority vote over N sampled
branches (Wang et al., ICLR 2023), with the same N and the very same branches.

The paper's: N branches; every Δ tokens every branch is probed for an intermediate answer; the
winner is the majority over live branches; after a warm-up a branch that disagrees with the
winner ``patience`` probes in a row is pruned; decoding stops once the winner has stayed the
same for T probes; the paper's costs are the branch tokens (probe tokens excluded), sequential =
the longest branch, total = the sum; the search is run by replaying recorded traces offline (their SCOUT
simulator). The controller follows their released ``ParallelESTPruningBurstMajorityOnActiveBranches``.

Ours: the probe cue is plain text (default "\\nThe answer is"; SmolLM2 has no end-of-thinking
token) followed by up to ``answer_tokens`` greedy tokens, stopped at a newline; answers are
read with the task's own rule (``paretolab.tasks.generation``); an unreadable answer never wins
a vote (it still counts as disagreeing for pruning); traces are recorded once per (model
weights, prompts, budget, N, sampling, seed, probe grid, cue) with our batched loop and cached
under ``$PARETOLAB_CACHE/traces``; a trial of either method replays them, so both methods see
the same N branches and a study over (Δ, T, patience, warm-up) costs seconds per trial once
recorded. Δ must be a multiple of the recorded ``probe_grid``. The text a trial returns for a
question is the winning branch as far as it was decoded, plus the cue and its probed answer.

Our costs count the probes: ``tokens_total`` adds every probe's cue and answer tokens, and
``tokens_sequential`` adds, per probe round, the cue plus the longest answer of that round (the
branches are probed together). The paper's counts stay as ``tokens_total_no_probe`` and
``tokens_sequential_no_probe`` (equal to the others for self-consistency, which has no probes).

``parallel_probe`` is marked ``simulated``: its tokens are counted by replaying the controller
over branches that were decoded in full, not saved by stopping a live decode (the decisions and
counts are those an online run over the same branches would make). Its ``decode_tok_s`` is the
throughput measured while recording, applied to the replayed token count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from optuna.distributions import CategoricalDistribution, IntDistribution

from paretolab import Method, Metric, Paper, hookimpl
from paretolab.data import encode
from paretolab.errors import ConfigError
from paretolab.generation import Generation
from paretolab.plugins.parallel_probe.controller import (
    Branch,
    Outcome,
    ProbeParams,
    parallel_probe,
    self_consistency,
)
from paretolab.plugins.parallel_probe.traces import (
    BranchTrace,
    RecordSettings,
    load_or_record,
    trace_key,
)
from paretolab.tasks.generation import answer_parser, tokens_containing

if TYPE_CHECKING:
    from paretolab.plugin_api.context import TrialContext
    from paretolab.plugin_api.subject import Subject

PAPER = Paper("Parallel-Probe: Towards Efficient Parallel Thinking via 2D Probing", "ICML 2026", "https://github.com/zhengkid/Parallel-Probe")
SC_PAPER = Paper("Self-Consistency Improves Chain of Thought Reasoning in Language Models", "ICLR 2023", "https://arxiv.org/abs/2203.11171")
RECORD_DEFAULTS = {f.name: f.default for f in fields(RecordSettings)}
PROBE_DEFAULTS = {f.name: f.default for f in fields(ProbeParams)}


@dataclass
class BranchVoteGenerator:
    """N recorded branches per prompt; ``control`` None is self-consistency, else Parallel-Probe."""

    settings: RecordSettings
    control: ProbeParams | None = None

    def generate(self, subject: Subject, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                 stop_ids: Sequence[int] = (), ctx: TrialContext | None = None) -> Generation:
        tok = subject.tokenizer
        parse = answer_parser(ctx)
        cue_ids = encode(tok, self.settings.cue)
        probe_stop = sorted(set(stop_ids) | tokens_containing(tok, "\n"))
        recording_args = {"stop_ids": list(stop_ids), "probe_stop_ids": probe_stop, "cue_ids": cue_ids,
                          "max_new_tokens": max_new_tokens, "settings": self.settings}
        key = trace_key(subject.model, prompts, **recording_args)
        recording, cached = load_or_record(subject.model, prompts, key=key, **recording_args)
        sequences, outcomes, baselines = [], [], []
        for question in recording.questions:
            branches = [_as_branch(b, tok, parse, self.settings) for b in question.branches]
            baseline = self_consistency(branches)
            outcome = parallel_probe(branches, self.control) if self.control else baseline
            sequences.append(_answer_text(question.branches, outcome, cue_ids, self.control, self.settings.probe_grid))
            outcomes.append(outcome)
            baselines.append(baseline)
        branch_total = sum(o.tokens_total for o in outcomes)
        branch_sequential = sum(o.tokens_sequential for o in outcomes)
        probe_total = probe_sequential = 0
        if self.control:
            for q, o in zip(recording.questions, outcomes):
                per_round = _probe_rounds(q.branches, o, len(cue_ids), self.control, self.settings.probe_grid)
                probe_total += sum(sum(r) for r in per_round)
                probe_sequential += sum(max(r) for r in per_round)
        rate = recording.tokens / recording.decode_s if recording.decode_s > 0 else 0.0
        probe_rate = _recorded_probe_tokens(recording, len(cue_ids)) / recording.probe_s if recording.probe_s > 0 else 0.0
        n = max(len(outcomes), 1)
        stats = {"traces_cached": float(cached), "tokens_total_no_probe": branch_total / n, "tokens_sequential_no_probe": branch_sequential / n}
        if self.control:
            sc_total = max(sum(b.tokens_total for b in baselines), 1)
            sc_sequential = max(sum(b.tokens_sequential for b in baselines), 1)
            stats |= {
                "probe_tokens": probe_total / n,
                "branches_pruned": sum(sum(o.pruned) for o in outcomes) / n,
                "early_stopped": sum(o.early_stop for o in outcomes) / n,
                "agree_with_sc": sum(o.answer == b.answer for o, b in zip(outcomes, baselines)) / n,
                "tokens_total_vs_sc": (branch_total + probe_total) / sc_total,
                "tokens_sequential_vs_sc": (branch_sequential + probe_sequential) / sc_sequential,
                "tokens_total_vs_sc_no_probe": branch_total / sc_total,
                "tokens_sequential_vs_sc_no_probe": branch_sequential / sc_sequential,
            }
        decode_s = branch_total / rate if rate > 0 else recording.decode_s
        if probe_total and probe_rate > 0:  # the probes' share of the recorded probe time
            decode_s += probe_total / probe_rate
        return Generation(
            sequences=sequences,
            tokens_total=branch_total + probe_total,
            tokens_sequential=branch_sequential + probe_sequential,
            prefill_s=recording.prefill_s,
            decode_s=decode_s,
            stats=stats,
        )


def _as_branch(trace: BranchTrace, tok: Any, parse: Callable[[str], str | None], settings: RecordSettings) -> Branch:
    probes = tuple(parse(settings.cue + tok.decode(ids, skip_special_tokens=True)) for ids in trace.probes)
    final = parse(tok.decode(trace.tokens, skip_special_tokens=True))
    return Branch(len(trace.tokens), settings.probe_grid, probes, final)


def _answer_text(traces: list[BranchTrace], outcome: Outcome, cue_ids: list[int], control: ProbeParams | None, grid: int) -> list[int]:
    """The winning branch as decoded when the controller stopped, plus the cue and its probed answer."""
    i = outcome.chosen()
    hold = outcome.holds[i]
    if hold is None or control is None:
        return list(traces[i].tokens)
    position = (hold + 1) * control.probe_every
    return traces[i].tokens[:position] + cue_ids + traces[i].probes[position // grid - 1]


def _probe_rounds(traces: list[BranchTrace], outcome: Outcome, cue_len: int, control: ProbeParams, grid: int) -> list[list[int]]:
    """Per probe round, the tokens (cue + answer) of each branch the controller probed in it."""
    step = control.probe_every // grid
    rounds: list[list[int]] = [[] for _ in range(max(outcome.probes_taken, default=0))]
    for trace, taken in zip(traces, outcome.probes_taken):
        for j in range(taken):
            rounds[j].append(cue_len + len(trace.probes[(j + 1) * step - 1]))
    return rounds


def _recorded_probe_tokens(recording: Any, cue_len: int) -> int:
    """Cue + answer tokens of every probe made while recording (what ``recording.probe_s`` paid for)."""
    return sum(cue_len + len(p) for q in recording.questions for b in q.branches for p in b.probes)


def _record_settings(params: dict[str, Any]) -> RecordSettings:
    p = {**RECORD_DEFAULTS, **params}
    return RecordSettings(**{name: type(RECORD_DEFAULTS[name])(p[name]) for name in RECORD_DEFAULTS})


class SelfConsistency(Method):
    """Majority vote over N sampled branches, each decoded to its end (the Parallel-Probe baseline)."""

    name = "self_consistency"
    metrics = ("traces_cached",)
    kind = "decoding"
    paper = SC_PAPER
    cost_is = "real"

    def search_space(self) -> dict[str, Any]:
        return {"n_branches": CategoricalDistribution([4, 8, 16])}

    def defaults(self) -> dict[str, Any]:
        return dict(RECORD_DEFAULTS)

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        subject.generator = BranchVoteGenerator(_record_settings(params))
        return subject


class ParallelProbe(Method):
    """N branches probed every Δ tokens; deviants pruned after a warm-up; stop on a stable majority."""

    name = "parallel_probe"
    metrics = ("traces_cached", "probe_tokens", "branches_pruned", "early_stopped", "agree_with_sc", "tokens_total_vs_sc", "tokens_sequential_vs_sc")
    kind = "decoding"
    paper = PAPER
    cost_is = "simulated"

    def search_space(self) -> dict[str, Any]:
        return {
            "n_branches": CategoricalDistribution([4, 8, 16]),
            "probe_every": CategoricalDistribution([8, 16, 32]),
            "consensus": IntDistribution(1, 8),
            "patience": IntDistribution(1, 8),
            "warmup": IntDistribution(0, 8),
        }

    def defaults(self) -> dict[str, Any]:
        return {**RECORD_DEFAULTS, **PROBE_DEFAULTS}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        control = ProbeParams(**{name: int(p[name]) for name in PROBE_DEFAULTS})
        settings = _record_settings({k: v for k, v in p.items() if k in RECORD_DEFAULTS})
        if control.probe_every % settings.probe_grid:
            raise ConfigError(f"parallel_probe.probe_every must be a multiple of probe_grid={settings.probe_grid}, got {control.probe_every}")
        subject.generator = BranchVoteGenerator(settings, control)
        return subject


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(ParallelProbe())
    register(SelfConsistency())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    register(Metric("probe_tokens", "tokens", "minimize", "parallel_probe: cue + answer tokens its probes cost per example (included in tokens_total)"))
    register(Metric("branches_pruned", "branches", "minimize", "parallel_probe: branches pruned per example"))
    register(Metric("early_stopped", "fraction", "maximize", "parallel_probe: examples stopped by consensus before every branch ended"))
    register(Metric("agree_with_sc", "fraction", "maximize", "parallel_probe: examples whose answer equals self-consistency's over the same branches"))
    register(Metric("tokens_total_vs_sc", "ratio", "minimize", "parallel_probe: tokens_total (probes counted) / self-consistency's over the same branches"))
    register(Metric("tokens_total_vs_sc_no_probe", "ratio", "minimize", "parallel_probe: branch tokens only (probes excluded, as in the paper) / self-consistency's"))
    register(Metric("tokens_total_no_probe", "tokens", "minimize", "branch methods: tokens_total without probe tokens (the paper's count; = tokens_total for self-consistency)"))
    register(Metric("tokens_sequential_no_probe", "tokens", "minimize", "branch methods: tokens_sequential without probe rounds (the paper's count)"))
    register(Metric("tokens_sequential_vs_sc", "ratio", "minimize", "parallel_probe: tokens_sequential (probe rounds counted) / self-consistency's over the same branches"))
    register(Metric("tokens_sequential_vs_sc_no_probe", "ratio", "minimize", "parallel_probe: longest-branch tokens only (probes excluded, as in the paper) / self-consistency's"))
    register(Metric("traces_cached", "flag", "maximize", "branch methods: 1 when the branch traces came from the cache, 0 when recorded in this trial"))

"""Speculative decoding with exact greedy verification: an EAGLE-style draft or the target with layers skipped.

EAGLE-3 (Li, Wei, Zhang, Zhang, "EAGLE-3: Scaling up Inference Acceleration of Large Language
Models via Training-Time Test", 2025; training code: sgl-project/SpecForge) and self-speculative
decoding (Zhang et al., "Draft & Verify: Lossless Large Language Model Acceleration via
Self-Speculative Decoding", ACL 2024). The papers': draft k tokens, verify them in one target
forward, keep the longest prefix the target agrees with plus the target's own next token, so the
output is exactly the target's greedy output. Ours: a chain of k drafts, or (``tree``) EAGLE-2's
dynamic draft tree verified in one forward with a tree attention mask (``tree.py``), optionally
with a prompt-lookup branch (``lookup``: the tokens that followed the last occurrence of the
current suffix, ``lookup.py``; ``draft: lookup`` uses it alone); batch 1 per prompt, greedy only
(no sampling); the self draft's layers are chosen by the layerdrop plugin's block influence /
representation shift; details of each draft in ``eagle.py`` and ``self_draft.py``.

``transform`` installs the generator (generation tasks then decode with it); ``measure`` decodes
held-out prompts with plain greedy decoding and with the speculative generator in the same run,
and reports the accepted length, both throughputs and their ratio, and whether the outputs match.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from optuna.distributions import CategoricalDistribution, IntDistribution

from paretolab import Method, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.generation import Generation, generate
from paretolab.kernels.dense_cpu import dense_cpu_kernel, fast_linears
from paretolab.plugin_api.metrics import Metric
from paretolab.plugin_api.subject import Subject
from paretolab.plugins._layerwise import CALIB_DEFAULTS, calibration_ids, decoder_layers
from paretolab.plugins.layerdrop import layers_to_drop
from paretolab.plugins.speculative.choose_k import choose_k, measure_costs
from paretolab.plugins.speculative.corpus import prompt_set
from paretolab.plugins.speculative.eagle import EagleDrafter
from paretolab.plugins.speculative.generator import Drafter, SpeculativeGenerator
from paretolab.plugins.speculative.lookup import LookupOnly
from paretolab.plugins.speculative.self_draft import LayerSkipDrafter
from paretolab.plugins.speculative.train import load_draft
from paretolab.plugins.speculative.tree import TreeShape

DRAFTS = ("eagle", "self", "lookup")
TREES = ("none", "nodes=4,depth=3,width=2,topk=2", "nodes=3,depth=3,width=1,topk=2", "nodes=6,depth=4,width=2,topk=3")
SKIP_SCORES = ("block_influence", "shift")
PAPER = Paper("EAGLE-3: Scaling up Inference Acceleration of Large Language Models via Training-Time Test", "arXiv 2025", "https://arxiv.org/abs/2503.01840")

METRICS = (
    Metric("mean_accepted_len", "tokens", "maximize", "tokens emitted per target verification forward (accepted drafts + the target's own), speculative decoding"),
    Metric("spec_decode_tok_s", "tokens/s", "maximize", "decode throughput of the subject's speculative generator on held-out prompts, batch 1"),
    Metric("greedy_decode_tok_s", "tokens/s", "maximize", "decode throughput of plain greedy decoding on the same prompts in the same run (the baseline)"),
    Metric("greedy_kernel_decode_tok_s", "tokens/s", "maximize", "plain greedy decoding with the linears through the dense CPU kernel speculative decoding uses, same prompts, same run"),
    Metric("speedup_vs_greedy", "ratio", "maximize", "spec_decode_tok_s / the faster of greedy_decode_tok_s and greedy_kernel_decode_tok_s, measured in the same run"),
    Metric("spec_matches_greedy", "fraction", "maximize", "prompts whose speculative output equals the greedy output token for token (must be 1)"),
    Metric("draft_tokens", "tokens", "minimize", "draft tokens proposed for verification while a generation task decoded with the speculative generator"),
)


class Speculative(Method):
    """Install a speculative generator (EAGLE draft or layer-skipping self draft) with exact greedy verification."""

    name = "speculative"
    metrics = tuple(m.name for m in METRICS)
    kind = "decoding"
    paper = PAPER
    cost_is = "real"

    def search_space(self) -> dict[str, Any]:
        return {
            "draft": CategoricalDistribution(list(DRAFTS)),
            "k": CategoricalDistribution([*range(1, 9), "auto"]),  # auto: by the draft's measured acceptance and this machine's costs
            "tree": CategoricalDistribution(list(TREES)),  # EAGLE only (other drafts ignore it); "none": a chain of k
            "lookup": CategoricalDistribution([0, 2, 4, 6]),
            "lookup_max": CategoricalDistribution([0, 8, 16]),  # 0: the lookup never grows
            "skip": IntDistribution(1, 24),
        }

    def defaults(self) -> dict[str, Any]:
        return {
            "draft": "eagle", "k": 4, "tree": "nodes=4,depth=3,width=2,topk=2", "lookup": 4, "lookup_max": 16, "skip": 10, "skip_score": "block_influence",
            "prompts": 3, "prompt_tokens": 64, "new_tokens": 32, "prompt_corpus": "pydoc",
            **CALIB_DEFAULTS,
        }

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        draft, auto = str(p["draft"]), p["k"] == "auto"
        if draft not in DRAFTS:
            raise ConfigError(f"speculative.draft must be one of {', '.join(DRAFTS)}; got {draft!r}")
        k = 0 if auto else _int_k(p["k"])
        # the default tree (EAGLE's) and lookup hold where k is not given: a k asks for a chain of k drafts, as before trees
        chain = "k" in params
        tree = _tree(params.get("tree", "none" if chain or draft != "eagle" else p["tree"]), draft)
        lookup = _lookup(params.get("lookup", 0 if chain and draft != "lookup" else p["lookup"]), draft)
        lookup_max = _lookup_max(p["lookup_max"], lookup)
        info: dict[str, Any] = {"draft": draft, "tree": None if tree is None else str(p["tree"]), "lookup": lookup, "lookup_max": lookup_max}
        drafter: Drafter
        if draft == "lookup":
            drafter, auto, k = LookupOnly(), False, 1
        elif draft == "eagle":
            loaded = load_draft(subject.model_name, subject.model)
            drafter = EagleDrafter(loaded)
            info["draft_steps"] = loaded.meta.get("steps")
        else:
            skipped = self._layers_to_skip(subject, p, ctx)
            drafter = LayerSkipDrafter(skipped)
            info["skipped_layers"] = skipped
        if auto and tree is not None:  # a tree's size is its shape: no k to choose
            auto, k = False, 1
        if auto:
            accepted = loaded.meta.get("heldout_accepted_len") if draft == "eagle" else None
            if not accepted:
                raise ConfigError("speculative.k: 'auto' picks k from the accepted lengths the EAGLE draft's training measured; "
                                  f"this {'draft has none (retrain it with `paretolab draft train`)' if draft == 'eagle' else 'self draft has none'}; give k as a number")
            prompt = prompt_set(subject.tokenizer, str(p["prompt_corpus"]), "eval", 1, length=int(p["prompt_tokens"]))[0]
            costs = measure_costs(subject.model, drafter, prompt, len(accepted))
            k, rates = choose_k(accepted, costs)
            info["k_auto"] = {"predicted_tok_s": {str(n): round(r, 2) for n, r in rates.items()}, "greedy_tok_s": round(1 / costs["verify_s"][1], 2),
                              "verify_ms": {str(t): round(v * 1e3, 2) for t, v in costs["verify_s"].items()},
                              "draft_step_ms": round(costs["draft_step_s"] * 1e3, 3), "draft_first_ms": round(costs["draft_first_s"] * 1e3, 3)}
        info["k"] = k
        subject.generator = SpeculativeGenerator(drafter, k, tree, lookup=lookup, lookup_max=lookup_max)
        subject.info["speculative"] = {**info, "measure": {key: p[key] for key in ("prompts", "prompt_tokens", "new_tokens", "prompt_corpus")}}
        return subject

    def _layers_to_skip(self, subject: Subject, p: dict[str, Any], ctx: TrialContext) -> list[int]:
        n = len(decoder_layers(subject.model))
        skip, score = int(p["skip"]), str(p["skip_score"])
        if score not in SKIP_SCORES:
            raise ConfigError(f"speculative.skip_score must be one of {', '.join(SKIP_SCORES)}; got {score!r}")
        skip = min(skip, n - 1)  # the search space is sized for SmolLM2's 30 layers; a smaller model keeps one layer
        if skip < 0:
            raise ConfigError(f"speculative.skip (layers the self draft skips) must be >= 0, got {p['skip']}")
        if skip == 0:
            return []
        ids = calibration_ids(subject, ctx, p, method=self.name)
        return layers_to_drop(subject.model, ids, skip, score, ctx.generator(offset=71))

    def measure(self, subject: Subject, ctx: TrialContext) -> dict[str, float]:
        if not isinstance(subject.generator, SpeculativeGenerator):
            return {}
        options = subject.info.get("speculative", {}).get("measure", {})
        defaults = self.defaults()
        n, length, new = (int(options.get(key, defaults[key])) for key in ("prompts", "prompt_tokens", "new_tokens"))
        prompts = prompt_set(subject.tokenizer, str(options.get("prompt_corpus", "pydoc")), "eval", n, length=length)
        return compare_with_greedy(subject, prompts, new, ctx=ctx)


def _tree(value: Any, draft: str) -> TreeShape | None:
    if value in (None, "none", "") or draft != "eagle":  # only the EAGLE draft proposes trees: a search may pair tree with any draft
        return None
    try:
        return TreeShape.parse(str(value))
    except ValueError as err:
        raise ConfigError(f"speculative.tree: {err}; e.g. {TREES[1]!r}, or 'none' for a chain of k") from None


def _lookup(value: Any, draft: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 16:
        raise ConfigError(f"speculative.lookup (prompt-lookup tokens a round adds) must be a whole number from 0 to 16, got {value!r}")
    if draft == "lookup" and value == 0:
        raise ConfigError("speculative.lookup must be >= 1 with draft 'lookup' (the lookup is the whole draft); e.g. lookup: 4")
    return value


def _lookup_max(value: Any, lookup: int) -> int:
    """How far the lookup may grow on a streak of whole acceptances; 0 (or anything up to ``lookup``): it never grows."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 64:
        raise ConfigError(f"speculative.lookup_max (the most lookup tokens a round may grow to) must be a whole number from 0 to 64, got {value!r}")
    return max(value, lookup) if lookup else 0


def _int_k(value: Any) -> int:
    try:
        k = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"speculative.k (draft tokens per step) must be a whole number or 'auto', got {value!r}") from None
    if not 1 <= k <= 16 or k != value:
        raise ConfigError(f"speculative.k (draft tokens per step) must be a whole number between 1 and 16 or 'auto', got {value!r}")
    return k


def compare_with_greedy(subject: Subject, prompts: list[list[int]], new_tokens: int, *, ctx: TrialContext | None = None) -> dict[str, float]:
    """Decode ``prompts`` greedily (torch's matmuls, and the CPU kernel) and with the subject's generator, interleaved, after a warm-up.

    The speculative generator runs its linears through the dense CPU kernel, so greedy decoding is
    also timed through that kernel: ``speedup_vs_greedy`` is against the faster of the two
    greedy loops, never against a baseline slowed by a worse matmul. ``spec_matches_greedy``
    compares with greedy through torch's matmuls, the unmodified model's own output. With ``ctx`` the trial also keeps the
    per-prompt figures (:func:`per_prompt_json`), so an interval over prompts can be drawn for the speedup and the acceptance.
    """
    speculative = subject.generator

    def greedy(batch: list[list[int]], n: int, kernels: bool = False) -> Generation:
        subject.generator = None  # the default decoding loop
        try:
            with fast_linears(subject.model) if kernels else nullcontext():
                return generate(subject, batch, max_new_tokens=n)
        finally:
            subject.generator = speculative

    def spec(batch: list[list[int]], n: int) -> Generation:
        return generate(subject, batch, max_new_tokens=n)

    runners: dict[str, Callable[[list[list[int]], int], Generation]] = {"greedy": greedy, "spec": spec}
    if dense_cpu_kernel() is not None and subject.device.type == "cpu":
        runners["greedy_kernel"] = lambda batch, n: greedy(batch, n, kernels=True)
    for run in runners.values():
        run(prompts[:1], 4)
    runs: dict[str, list[Generation]] = {name: [] for name in runners}
    names = list(runners)
    for i, prompt in enumerate(prompts):
        for name in names[i % len(names):] + names[: i % len(names)]:  # each loop goes first on some prompts
            runs[name].append(runners[name]([prompt], new_tokens))
    rate = {name: _decode_rate(out) for name, out in runs.items()}
    matches = [g.sequences == s.sequences for g, s in zip(runs["greedy"], runs["spec"], strict=True)]
    accepted = [r.stats["mean_accepted_len"] for r in runs["spec"]]
    best_greedy = max(rate["greedy"], rate.get("greedy_kernel", 0.0))
    out = {
        "mean_accepted_len": statistics.fmean(accepted),
        "spec_decode_tok_s": rate["spec"],
        "greedy_decode_tok_s": rate["greedy"],
        "speedup_vs_greedy": rate["spec"] / best_greedy,
        "spec_matches_greedy": sum(matches) / len(matches),
    }
    if "greedy_kernel" in rate:
        out["greedy_kernel_decode_tok_s"] = rate["greedy_kernel"]
    if ctx is not None:
        from paretolab.stats import ARTIFACT

        best = "greedy_kernel" if rate.get("greedy_kernel", 0.0) > rate["greedy"] else "greedy"
        for part in per_prompt_json(runs["spec"], runs[best]):
            ctx.add_artifact(ARTIFACT, part)
    return out


def per_prompt_json(spec: list[Generation], greedy: list[Generation]) -> list[str]:
    """Per prompt, as ``per_example.json`` parts: the speculative rate and the speedup over greedy weighted by the prompt's
    speculative decode seconds (so their weighted means are the trial's ratios of sums, ``spec_decode_tok_s`` and
    ``speedup_vs_greedy``), and the mean accepted length, unweighted (its trial figure is the plain mean over prompts)."""
    from paretolab.stats import per_example_json

    seconds = [max(s.decode_s, 1e-12) for s in spec]
    rates = [sum(len(q) - 1 for q in s.sequences) / t for s, t in zip(spec, seconds, strict=True)]
    greedy_rates = [sum(len(q) - 1 for q in g.sequences) / max(g.decode_s, 1e-12) for g in greedy]
    speedups = [r / g if g > 0 else 0.0 for r, g in zip(rates, greedy_rates, strict=True)]
    accepted = [float(s.stats["mean_accepted_len"]) for s in spec]
    return [per_example_json("prompt", {"spec_decode_tok_s": rates, "speedup_vs_greedy": speedups}, seconds),
            per_example_json("prompt", {"mean_accepted_len": accepted})]


def _decode_rate(outputs: list[Generation]) -> float:
    """Tokens after the first (which comes from prefill) per second of decoding, over all prompts."""
    tokens = sum(len(seq) - 1 for out in outputs for seq in out.sequences)
    seconds = sum(out.decode_s for out in outputs)
    return tokens / seconds if seconds > 0 else 0.0


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(Speculative())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    for metric in METRICS:
        register(metric)

"""Speculative decoding with exact greedy verification: an EAGLE-style draft or the target with layers skipped.

EAGLE-3 (Li, Wei, Zhang, Zhang, "EAGLE-3: Scaling up Inference Acceleration of Large Language
Models via Training-Time Test", 2025; training code: sgl-project/SpecForge) and self-speculative
decoding (Zhang et al., "Draft & Verify: Lossless Large Language Model Acceleration via
Self-Speculative Decoding", ACL 2024). The papers': draft k tokens, verify them in one target
forward, keep the longest prefix the target agrees with plus the target's own next token, so the
output is exactly the target's greedy output. Ours: chain drafts (no token tree), batch 1 per
prompt, greedy only (no sampling); the self draft's layers are chosen by the layerdrop plugin's
block influence / representation shift; details of each draft in ``eagle.py`` and ``self_draft.py``.

``transform`` installs the generator (generation tasks then decode with it); ``measure`` decodes
held-out prompts with plain greedy decoding and with the speculative generator in the same run,
and reports the accepted length, both throughputs and their ratio, and whether the outputs match.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from optuna.distributions import CategoricalDistribution, IntDistribution

from paretolab import Method, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.generation import Generation, generate
from paretolab.plugin_api.metrics import Metric
from paretolab.plugin_api.subject import Subject
from paretolab.plugins._layerwise import CALIB_DEFAULTS, calibration_ids, decoder_layers
from paretolab.plugins.layerdrop import layers_to_drop
from paretolab.plugins.speculative.corpus import heldout_prompts
from paretolab.plugins.speculative.eagle import EagleDrafter
from paretolab.plugins.speculative.generator import Drafter, SpeculativeGenerator
from paretolab.plugins.speculative.self_draft import LayerSkipDrafter
from paretolab.plugins.speculative.train import load_draft

DRAFTS = ("eagle", "self")
SKIP_SCORES = ("block_influence", "shift")
PAPER = Paper("EAGLE-3: Scaling up Inference Acceleration of Large Language Models via Training-Time Test", "arXiv 2025", "https://arxiv.org/abs/2503.01840")

METRICS = (
    Metric("mean_accepted_len", "tokens", "maximize", "tokens emitted per target verification forward (accepted drafts + the target's own), speculative decoding"),
    Metric("spec_decode_tok_s", "tokens/s", "maximize", "decode throughput of the subject's speculative generator on held-out prompts, batch 1"),
    Metric("greedy_decode_tok_s", "tokens/s", "maximize", "decode throughput of plain greedy decoding on the same prompts in the same run (the baseline)"),
    Metric("speedup_vs_greedy", "ratio", "maximize", "spec_decode_tok_s / greedy_decode_tok_s, measured in the same run"),
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
            "k": IntDistribution(1, 8),
            "skip": IntDistribution(1, 24),
        }

    def defaults(self) -> dict[str, Any]:
        return {
            "draft": "eagle", "k": 4, "skip": 10, "skip_score": "block_influence",
            "prompts": 3, "prompt_tokens": 64, "new_tokens": 32, "prompt_corpus": "pydoc",
            **CALIB_DEFAULTS,
        }

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        draft, k = str(p["draft"]), int(p["k"])
        if draft not in DRAFTS:
            raise ConfigError(f"speculative.draft must be one of {', '.join(DRAFTS)}; got {draft!r}")
        if not 1 <= k <= 16:
            raise ConfigError(f"speculative.k (draft tokens per step) must be between 1 and 16, got {k}")
        info: dict[str, Any] = {"draft": draft, "k": k}
        drafter: Drafter
        if draft == "eagle":
            loaded = load_draft(subject.model_name, subject.model)
            drafter = EagleDrafter(loaded)
            info["draft_steps"] = loaded.meta.get("steps")
        else:
            skipped = self._layers_to_skip(subject, p, ctx)
            drafter = LayerSkipDrafter(skipped)
            info["skipped_layers"] = skipped
        subject.generator = SpeculativeGenerator(drafter, k)
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
        prompts = heldout_prompts(subject.tokenizer, corpus=str(options.get("prompt_corpus", "pydoc")), n=n, length=length)
        return compare_with_greedy(subject, prompts, new)


def compare_with_greedy(subject: Subject, prompts: list[list[int]], new_tokens: int) -> dict[str, float]:
    """Decode ``prompts`` greedily and with the subject's generator, interleaved, after a warm-up of both."""
    speculative = subject.generator

    def greedy(batch: list[list[int]], n: int) -> Generation:
        subject.generator = None  # the default decoding loop
        try:
            return generate(subject, batch, max_new_tokens=n)
        finally:
            subject.generator = speculative

    def spec(batch: list[list[int]], n: int) -> Generation:
        return generate(subject, batch, max_new_tokens=n)

    greedy(prompts[:1], 4)
    spec(prompts[:1], 4)
    runs: dict[str, list[Generation]] = {"greedy": [], "spec": []}
    for i, prompt in enumerate(prompts):
        order = [("greedy", greedy), ("spec", spec)] if i % 2 == 0 else [("spec", spec), ("greedy", greedy)]
        for name, run in order:
            runs[name].append(run([prompt], new_tokens))
    rate = {name: _decode_rate(out) for name, out in runs.items()}
    matches = [g.sequences == s.sequences for g, s in zip(runs["greedy"], runs["spec"], strict=True)]
    accepted = [r.stats["mean_accepted_len"] for r in runs["spec"]]
    return {
        "mean_accepted_len": statistics.fmean(accepted),
        "spec_decode_tok_s": rate["spec"],
        "greedy_decode_tok_s": rate["greedy"],
        "speedup_vs_greedy": rate["spec"] / rate["greedy"],
        "spec_matches_greedy": sum(matches) / len(matches),
    }


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

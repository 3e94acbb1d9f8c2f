"""Speculative decoding: exact greedy output with any draft, the EAGLE draft's training and cache, the method."""

from __future__ import annotations

import pytest
import torch

from paretolab.errors import ConfigError
from paretolab.generation import generate
from paretolab.kernels.dense_cpu import dense_cpu_kernel
from paretolab.plugin_api.context import TrialContext
from paretolab.plugins.speculative import Speculative
from paretolab.plugins.speculative.eagle import (
    EagleConfig,
    EagleDraft,
    EagleDrafter,
    LoadedDraft,
)
from paretolab.plugins.speculative.generator import SpeculativeGenerator
from paretolab.plugins.speculative.self_draft import LayerSkipDrafter
from paretolab.plugins.speculative.tree import TreeShape
from paretolab.plugins.speculative.train import (
    TrainOptions,
    draft_path,
    load_draft,
    train_draft,
    ttt_forward,
)
from paretolab.testing import MethodContract
from tests.conftest import run_cli

PROMPTS = [[5, 9, 2, 7], [1, 2, 3, 4, 5, 6, 7, 8], [40, 41, 42]]


class ConstantDrafter:
    """A deliberately bad draft: always proposes the same token."""

    feature_layers = ()

    def __init__(self, token: int) -> None:
        self.token = token

    def start(self, target):
        pass

    def propose(self, ids, features, k):
        return [self.token] * k


class OracleDrafter:
    """Knows the greedy continuation but corrupts every ``every``-th draft: acceptances of every length."""

    feature_layers = ()

    def __init__(self, reference: dict[tuple[int, ...], list[int]], every: int) -> None:
        self.reference, self.every, self.calls = reference, every, 0

    def start(self, target):
        pass

    def propose(self, ids, features, k):
        for prompt, continuation in self.reference.items():
            if tuple(ids[: len(prompt)]) == prompt:
                done = len(ids) - len(prompt)
                draft = list(continuation[done : done + k])
                break
        self.calls += 1
        if draft and self.calls % self.every:
            draft[self.calls % len(draft)] = (draft[self.calls % len(draft)] + 1) % 256
        return draft


@pytest.mark.parametrize("k", [1, 3, 6])
def test_perfect_draft_is_all_accepted_and_output_is_greedy(tiny, k):
    reference = generate(tiny, PROMPTS, max_new_tokens=25)
    out = SpeculativeGenerator(LayerSkipDrafter(skip=()), k).generate(tiny, PROMPTS, max_new_tokens=25)
    assert out.sequences == reference.sequences
    rounds = out.tokens_sequential - len(PROMPTS)  # one prefill step per prompt
    assert rounds == sum(-(-24 // (k + 1)) for _ in PROMPTS)  # 24 tokens after the first, k + 1 per round
    assert out.stats["mean_accepted_len"] > k * 0.8 + 1


@pytest.mark.parametrize("k", [1, 4])
def test_bad_draft_still_gives_the_greedy_output(tiny, k):
    reference = generate(tiny, PROMPTS, max_new_tokens=20)
    never = next(t for t in range(256) if all(t not in s for s in reference.sequences))
    out = SpeculativeGenerator(ConstantDrafter(never), k).generate(tiny, PROMPTS, max_new_tokens=20)
    assert out.sequences == reference.sequences
    assert out.stats["mean_accepted_len"] == 1.0
    assert out.tokens_sequential == sum(len(s) for s in reference.sequences)


def test_partial_acceptance_rolls_the_cache_back(tiny):
    reference = generate(tiny, PROMPTS, max_new_tokens=30)
    oracle = OracleDrafter({tuple(p): s for p, s in zip(PROMPTS, reference.sequences)}, every=3)
    out = SpeculativeGenerator(oracle, 4).generate(tiny, PROMPTS, max_new_tokens=30)
    assert out.sequences == reference.sequences
    assert 1.5 < out.stats["mean_accepted_len"] < 5


def test_stop_ids_end_the_output_like_greedy(tiny):
    full = generate(tiny, PROMPTS[:1], max_new_tokens=20).sequences[0]
    stop = full[5]
    expected = generate(tiny, PROMPTS[:1], max_new_tokens=20, stop_ids=[stop]).sequences[0]
    out = SpeculativeGenerator(LayerSkipDrafter(skip=()), 4).generate(tiny, PROMPTS[:1], max_new_tokens=20, stop_ids=[stop])
    assert out.sequences[0] == expected == full[: full.index(stop) + 1]


def test_mean_accepted_len_counts_up_to_the_stop_token(tiny):
    """A perfect draft of 6 whose block holds the stop token at its 3rd place emits 3 tokens that round, not 7."""
    with torch.no_grad():  # louder layers, so the random model stops repeating its last token
        for p in tiny.model.model.layers.parameters():
            p.mul_(8)
    full = generate(tiny, PROMPTS[:1], max_new_tokens=20).sequences[0]
    stop = full[3]  # the prefill emits full[0]; the first round's block then holds full[1:8]
    assert stop not in full[:3]
    out = SpeculativeGenerator(LayerSkipDrafter(skip=()), 6).generate(tiny, PROMPTS[:1], max_new_tokens=20, stop_ids=[stop])
    assert out.sequences[0] == full[:4]
    assert out.stats["mean_accepted_len"] == 3.0  # full[1], full[2], the stop; what follows it is never output


def test_skipping_a_layer_changes_the_draft_not_the_output():
    from paretolab.models import TinyLlama

    subject = TinyLlama(layers=4, hidden=64, seed=3).load()
    reference = generate(subject, PROMPTS, max_new_tokens=20)
    out = SpeculativeGenerator(LayerSkipDrafter(skip=[1, 2]), 3).generate(subject, PROMPTS, max_new_tokens=20)
    assert out.sequences == reference.sequences
    assert len(subject.model.model.layers) == 4 and [a.self_attn.layer_idx for a in subject.model.model.layers] == [0, 1, 2, 3]


def test_training_rollout_sees_what_the_inference_chain_sees():
    """The training-time-test mask reproduces, step by step, the draft's KV-cached chain at inference."""
    torch.manual_seed(0)
    draft = EagleDraft(EagleConfig(hidden=32, heads=4, intermediate=64, feature_layers=(0, 1)))
    length, steps = 6, 3
    emb, g = torch.randn(length, 32), torch.randn(length, 32)
    rollout = ttt_forward(draft, emb[None], g[None], steps)
    drafter = EagleDrafter(LoadedDraft(draft, torch.arange(4), {}), bf16=False)  # the fp32 draft that was trained
    for step in range(steps):
        for t in range(step, length):
            drafter.keys = drafter.values = None
            real = t - step + 1  # positions 0..t-step carry real features
            hidden, _ = drafter._attend(draft.inputs(emb[:real], g[:real]), torch.arange(real))
            h = hidden[-1:]
            for r in range(1, step + 1):
                position = t - step + r
                h, _ = drafter._attend(draft.inputs(emb[position : position + 1], h), torch.tensor([position]))
            torch.testing.assert_close(h[0], rollout[step][0][0, t], rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def tiny_draft_cache(tmp_path_factory):
    """A tiny-llama EAGLE draft trained for a few seconds by the real command, in its own cache dir."""
    cache = tmp_path_factory.mktemp("cache")
    proc = run_cli("draft", "train", "--model", "tiny-llama", "--budget-min", "0.05", "--prompt-sets", "arithmetic,pydoc", "--prompts", "48",
                   "--new-tokens", "12", "--seq-len", "64", "--vocab", "128", "--no-progress", cwd=cache, env={"PARETOLAB_CACHE": str(cache)})
    assert "draft saved to" in proc.stdout and "held-out top-1 agreement" in proc.stdout and "held-out accepted length" in proc.stdout
    return cache


def test_draft_command_trains_resumes_and_the_draft_decodes_exactly(tiny_draft_cache, monkeypatch, tiny):
    monkeypatch.setenv("PARETOLAB_CACHE", str(tiny_draft_cache))
    first = load_draft("tiny-llama", tiny.model)
    assert first.meta["steps"] >= 1 and 0 < first.vocab.numel() <= 128  # the most frequent target tokens, at most --vocab
    lines: list[str] = []
    options = TrainOptions(budget_min=0.02, prompt_sets=("arithmetic", "pydoc"), prompts=48, new_tokens=12, seq_len=64, vocab=128)
    train_draft(tiny, options, log=lines.append, show_progress=False)
    assert any("continuing the draft" in line for line in lines)  # data was cached, the checkpoint resumed
    second = load_draft("tiny-llama", tiny.model)
    assert second.meta["steps"] > first.meta["steps"]
    assert [point["tokens"] for point in second.meta["curve"]] == [first.meta["tokens"], second.meta["tokens"]]  # one point a run
    assert all(1.0 <= tau <= k + 1 for k, tau in enumerate(second.meta["heldout_accepted_len"], start=1))
    prompts = [list(range(30, 50)), [7, 8, 9]]
    reference = generate(tiny, prompts, max_new_tokens=24)
    for k in (1, 4):
        out = SpeculativeGenerator(EagleDrafter(load_draft("tiny-llama", tiny.model)), k).generate(tiny, prompts, max_new_tokens=24)
        assert out.sequences == reference.sequences
        assert out.stats["mean_accepted_len"] >= 1.0


def test_missing_draft_says_what_to_run(tmp_path, monkeypatch, tiny):
    monkeypatch.setenv("PARETOLAB_CACHE", str(tmp_path))
    ctx = TrialContext(seed=0, workdir=tmp_path / "trial")
    with pytest.raises(ConfigError, match="paretolab draft train --model tiny-llama"):
        Speculative().transform(tiny, {"draft": "eagle"}, ctx)
    assert not draft_path("tiny-llama").exists()


def test_method_measures_against_greedy_in_the_same_run(tiny, tmp_path):
    ctx = TrialContext(seed=0, workdir=tmp_path / "trial")
    method = Speculative()
    subject = method.transform(tiny, {"draft": "self", "k": 3, "skip": 1, "prompts": 2, "new_tokens": 12}, ctx)
    assert isinstance(subject.generator, SpeculativeGenerator)
    metrics = method.measure(subject, ctx)
    assert metrics["spec_matches_greedy"] == 1.0
    assert metrics["greedy_decode_tok_s"] > 0 and metrics["spec_decode_tok_s"] > 0
    # against the faster greedy loop: torch's matmuls, or the dense CPU kernel the speculative generator itself uses
    assert ("greedy_kernel_decode_tok_s" in metrics) == (dense_cpu_kernel() is not None)
    best = max(metrics["greedy_decode_tok_s"], metrics.get("greedy_kernel_decode_tok_s", 0.0))
    assert metrics["speedup_vs_greedy"] == pytest.approx(metrics["spec_decode_tok_s"] / best)
    assert 1.0 <= metrics["mean_accepted_len"] <= 4.0
    assert len(subject.info["speculative"]["skipped_layers"]) == 1
    import json

    from paretolab.stats import ARTIFACT, samples

    kept = json.loads((tmp_path / "trial" / ARTIFACT).read_text())  # per prompt, for intervals over prompts
    assert samples(kept, "speedup_vs_greedy").n == 2 and samples(kept, "mean_accepted_len").n == 2
    assert samples(kept, "spec_decode_tok_s").value() == pytest.approx(metrics["spec_decode_tok_s"], rel=1e-6)
    assert samples(kept, "mean_accepted_len").value() == pytest.approx(metrics["mean_accepted_len"])


def test_bad_params_name_the_field(tiny, tmp_path):
    ctx = TrialContext(seed=0, workdir=tmp_path / "trial")
    with pytest.raises(ConfigError, match="speculative.draft"):
        Speculative().transform(tiny, {"draft": "medusa"}, ctx)
    with pytest.raises(ConfigError, match="speculative.k"):
        Speculative().transform(tiny, {"draft": "self", "k": 0}, ctx)


class TestSpeculativeSelfContract(MethodContract):
    @pytest.fixture
    def method(self):
        return Speculative()

    @pytest.fixture
    def params(self):
        return {"draft": "self", "k": 3, "skip": 1, "prompts": 2, "new_tokens": 8}


class TestSpeculativeEagleContract(MethodContract):
    @pytest.fixture(autouse=True)
    def _cache(self, tiny_draft_cache, monkeypatch):
        monkeypatch.setenv("PARETOLAB_CACHE", str(tiny_draft_cache))

    @pytest.fixture
    def method(self):
        return Speculative()

    @pytest.fixture
    def params(self):
        return {"draft": "eagle", "k": 3, "prompts": 2, "new_tokens": 8}


@pytest.mark.slow
def test_smollm2_speculative_output_is_greedy_token_for_token():
    """On the real model, over prompts and lengths, both drafts reproduce greedy decoding exactly."""
    from paretolab.models import load_subject
    from paretolab.plugins.speculative.corpus import heldout_prompts

    subject = load_subject("smollm2-135m")
    text = heldout_prompts(subject.tokenizer, n=3, length=80)
    cases = [(text[0][:16], 30), (text[1][:48], 20), (text[2], 12)]
    torch.manual_seed(0)
    untrained = EagleDraft(EagleConfig.for_target(subject.model))
    loaded = LoadedDraft(untrained, torch.arange(4096), {})
    generators = [
        SpeculativeGenerator(LayerSkipDrafter(skip=range(8, 20)), 3),
        SpeculativeGenerator(EagleDrafter(loaded), 4),
        SpeculativeGenerator(EagleDrafter(loaded), 1, TreeShape(6, 4, 2, 3), lookup=4),  # a draft tree with a lookup branch
        SpeculativeGenerator(LayerSkipDrafter(skip=range(8, 20)), 2, lookup=3),  # a chain drafter with a lookup branch: a tree
    ]
    for prompt, n in cases:
        reference = generate(subject, [prompt], max_new_tokens=n).sequences
        for generator in generators:
            assert generator.generate(subject, [prompt], max_new_tokens=n).sequences == reference


def test_copying_a_subject_does_not_copy_the_target_through_its_generator(tiny, tmp_path):
    reference = generate(tiny, PROMPTS[:1], max_new_tokens=6).sequences
    ctx = TrialContext(seed=0, workdir=tmp_path / "trial")
    subject = Speculative().transform(tiny, {"draft": "self", "k": 2, "skip": 1}, ctx)
    generate(subject, PROMPTS[:1], max_new_tokens=6)  # the drafter now holds the target
    copy = subject.copy()
    assert copy.generator.drafter.model is None and copy.generator.drafter.skip == subject.generator.drafter.skip
    assert generate(copy, PROMPTS[:1], max_new_tokens=6).sequences == reference


def test_chain_scores_count_a_chain_until_its_first_wrong_draft(monkeypatch):
    """Accepted length from planted hits: chains start at every trained row and stop at their first miss."""
    import paretolab.plugins.speculative.train as train

    vocab = 8
    target = torch.tensor([[1, 2, 3, 4, 5, 6, -100]])  # the last row is not trained on

    def logits_hitting(rows: set[int]) -> torch.Tensor:
        wrong = (target.clamp_min(0) + 1) % vocab
        picks = torch.tensor([[int(target[0, t]) if t in rows else int(wrong[0, t]) for t in range(target.shape[1])]])
        return torch.nn.functional.one_hot(picks, vocab).float()

    # step 0 (a chain's first draft) right at rows 0, 1, 2, 4; step 1 (its second, one row on) right at rows 1, 2, 4, 5
    # (at row 4 the chain from row 3 had already failed: that second draft is never verified)
    planted = [(None, logits_hitting({0, 1, 2, 4}), target), (None, logits_hitting({1, 2, 4, 5}), target)]
    monkeypatch.setattr(train, "_rollout", lambda *args, **kwargs: planted)
    scores = train.chain_scores(None, None, None, None, {}, steps=2)
    # chains from rows 0..4 (row 5's second draft would land on the untrained row 6): 2, 2, 1, 0, 2 drafts accepted
    assert scores["accepted_len"] == [pytest.approx(1 + 4 / 5), pytest.approx(1 + 4 / 5 + 3 / 5)]
    assert scores["step_top1"] == [pytest.approx(4 / 6, abs=1e-4), pytest.approx(4 / 6, abs=1e-4)]  # rows right, chain or not


def test_choose_k_maximises_accepted_tokens_per_measured_second():
    from paretolab.plugins.speculative.choose_k import choose_k

    costs = {"verify_s": {1: 0.025, 2: 0.028, 3: 0.033, 4: 0.038, 5: 0.042}, "draft_step_s": 0.002, "draft_first_s": 0.003}
    k, rates = choose_k([1.8, 2.4, 2.7, 2.8], costs)
    assert rates[2] == pytest.approx(2.4 / (0.033 + 0.003 + 0.002))
    assert k == max(rates, key=rates.get) == 2
    k, _ = choose_k([1.9, 2.0, 2.05, 2.1], costs)  # later drafts almost never land: one draft is best
    assert k == 1


def test_k_auto_measures_costs_and_picks_from_the_drafts_acceptance(tiny_draft_cache, monkeypatch, tiny, tmp_path):
    monkeypatch.setenv("PARETOLAB_CACHE", str(tiny_draft_cache))
    ctx = TrialContext(seed=0, workdir=tmp_path / "trial")
    subject = Speculative().transform(tiny, {"draft": "eagle", "k": "auto", "prompts": 2, "new_tokens": 8}, ctx)
    auto = subject.info["speculative"]["k_auto"]
    rates = {int(k): r for k, r in auto["predicted_tok_s"].items()}
    assert subject.generator.k == subject.info["speculative"]["k"] == max(rates, key=rates.get)
    assert set(rates) == set(range(1, len(load_draft("tiny-llama", tiny.model).meta["heldout_accepted_len"]) + 1))
    assert all(v > 0 for v in auto["verify_ms"].values()) and auto["draft_step_ms"] >= 0
    with pytest.raises(ConfigError, match="speculative.k"):
        Speculative().transform(tiny, {"draft": "self", "k": "auto", "skip": 1}, ctx)
    with pytest.raises(ConfigError, match="whole number"):
        Speculative().transform(tiny, {"draft": "self", "k": 2.5, "skip": 1}, ctx)


def test_a_draft_started_from_the_target_computes_its_last_layer(tiny):
    """init_from_target: fed the high feature h and a zero embedding, the draft's layer is the target's last layer on h."""
    from paretolab.plugins.speculative.eagle import init_from_target

    model = tiny.model
    draft = EagleDraft(EagleConfig.for_target(model))
    assert init_from_target(draft, model)
    torch.manual_seed(0)
    length, d = 5, model.config.hidden_size
    h = torch.randn(1, length, d)
    positions = torch.arange(length)[None]
    cos_sin = model.model.rotary_emb(h, positions)
    mask = torch.full((length, length), float("-inf")).triu(1)[None, None]
    out = model.model.layers[-1](h, attention_mask=mask, position_ids=positions, position_embeddings=cos_sin)
    expected = out[0] if isinstance(out, tuple) else out
    n = len(draft.config.feature_layers)
    features = torch.cat([torch.randn(1, length, d) for _ in range(n - 1)] + [h], dim=-1)  # only the high one is read
    with torch.no_grad():
        x = draft.inputs(torch.zeros(1, length, d), draft.fc(features))
        residual, q, k, v = draft.keys_values(x, positions[0])
        hidden, _ = draft.finish(residual, q, k, v, torch.ones(length, length, dtype=torch.bool).tril())
    torch.testing.assert_close(hidden, expected, rtol=1e-4, atol=1e-5)

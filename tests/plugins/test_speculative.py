"""Speculative decoding: exact greedy output with any draft, the EAGLE draft's training and cache, the method."""

from __future__ import annotations

import pytest
import torch

from paretolab.errors import ConfigError
from paretolab.generation import generate
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
    drafter = EagleDrafter(LoadedDraft(draft, torch.arange(4), {}))
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
    proc = run_cli("draft", "train", "--model", "tiny-llama", "--budget-min", "0.05", "--tokens", "1024", "--seq-len", "64",
                   "--vocab", "128", "--no-progress", cwd=cache, env={"PARETOLAB_CACHE": str(cache)})
    assert "draft saved to" in proc.stdout and "held-out top-1 agreement" in proc.stdout
    return cache


def test_draft_command_trains_resumes_and_the_draft_decodes_exactly(tiny_draft_cache, monkeypatch, tiny):
    monkeypatch.setenv("PARETOLAB_CACHE", str(tiny_draft_cache))
    first = load_draft("tiny-llama", tiny.model)
    assert first.meta["steps"] >= 1 and 0 < first.vocab.numel() <= 128  # the most frequent target tokens, at most --vocab
    lines: list[str] = []
    train_draft(tiny, TrainOptions(budget_min=0.02, max_tokens=1024, seq_len=64, vocab=128), log=lines.append, show_progress=False)
    assert any("continuing the draft" in line for line in lines)  # features were cached, the checkpoint resumed
    assert load_draft("tiny-llama", tiny.model).meta["steps"] > first.meta["steps"]
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
    assert metrics["speedup_vs_greedy"] == pytest.approx(metrics["spec_decode_tok_s"] / metrics["greedy_decode_tok_s"])
    assert 1.0 <= metrics["mean_accepted_len"] <= 4.0
    assert len(subject.info["speculative"]["skipped_layers"]) == 1


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
    drafters = [
        (LayerSkipDrafter(skip=range(8, 20)), 3),
        (EagleDrafter(LoadedDraft(untrained, torch.arange(4096), {})), 4),
    ]
    for prompt, n in cases:
        reference = generate(subject, [prompt], max_new_tokens=n).sequences
        for drafter, k in drafters:
            assert SpeculativeGenerator(drafter, k).generate(subject, [prompt], max_new_tokens=n).sequences == reference


def test_copying_a_subject_does_not_copy_the_target_through_its_generator(tiny, tmp_path):
    reference = generate(tiny, PROMPTS[:1], max_new_tokens=6).sequences
    ctx = TrialContext(seed=0, workdir=tmp_path / "trial")
    subject = Speculative().transform(tiny, {"draft": "self", "k": 2, "skip": 1}, ctx)
    generate(subject, PROMPTS[:1], max_new_tokens=6)  # the drafter now holds the target
    copy = subject.copy()
    assert copy.generator.drafter.model is None and copy.generator.drafter.skip == subject.generator.drafter.skip
    assert generate(copy, PROMPTS[:1], max_new_tokens=6).sequences == reference

"""omnisift_text (OmniSIFT's text analog) and the lambada task: the masked forward is the compressed prompt's forward,
each selector keeps what it says, training lowers the hard-mask loss, FLOPs add up, LAMBADA is scored token-exact."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from paretolab.errors import ConfigError
from paretolab.models import TinyLlama
from paretolab.plugin_api.context import TrialContext
from paretolab.plugins.omnisift_text import OmniSiftText
from paretolab.plugins.omnisift_text.flops import LMShape
from paretolab.plugins.omnisift_text.generator import CompressingGenerator
from paretolab.plugins.omnisift_text.masking import masked_hidden
from paretolab.plugins.omnisift_text.network import TokenSelector, token_features
from paretolab.plugins.omnisift_text.selection import Selection, budget, top_kept
from paretolab.plugins.omnisift_text.train import TrainSettings, _step_loss, train_selector, training_mask
from paretolab.testing import MethodContract
from paretolab.training.flops import ATTENTION_FORMULAS

_USER_CACHE = os.environ.get("PARETOLAB_CACHE")  # read before the autouse fixture points it at a temp dir
CHEAP = {"selector": "learned", "steps": 2, "batch": 2, "train_context": 32, "hidden": 8}


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PARETOLAB_CACHE", str(tmp_path / "cache"))  # no selector trained by another run is reused


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return TinyLlama(layers=2, hidden=64).load().model


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 250, (n,), generator=torch.Generator().manual_seed(seed))


def test_the_masked_forward_is_the_forward_of_the_compressed_prompt(model):
    """Hard mask values (the straight-through mask), positions renumbered: the answer logits equal those of the kept tokens + answer, run alone."""
    contexts, answers = [_ids(40, 1), _ids(27, 2)], [_ids(3, 3), _ids(2, 4)]
    width = 48
    ids = torch.zeros(2, width, dtype=torch.long)
    masks, hards, kept_of = [], [], []
    for row, (c, a) in enumerate(zip(contexts, answers)):
        ids[row, : len(c)], ids[row, len(c) : len(c) + len(a)] = c, a
        scores = torch.randn(len(c), generator=torch.Generator().manual_seed(row), requires_grad=True)
        mask, hard = training_mask(scores, budget(len(c), 0.25), 4, 0.5, "straight_through")
        kept_of.append(hard.nonzero()[:, 0].tolist())
        tail = torch.zeros(width - len(c))
        tail[: len(a)] = 1.0
        masks.append(torch.cat([mask, tail]))
        hards.append(torch.cat([hard, tail]))
    hidden = masked_hidden(model, ids, torch.stack(masks), torch.stack(hards))
    for row, (c, a) in enumerate(zip(contexts, answers)):
        kept = kept_of[row]
        assert len(kept) == budget(len(c), 0.25) and kept[-4:] == list(range(len(c) - 4, len(c)))
        masked = model.lm_head(hidden[row, len(c) - 1 : len(c) + len(a) - 1])
        with torch.no_grad():
            alone = model(input_ids=torch.cat([c[kept], a])[None]).logits[0, len(kept) - 1 : len(kept) + len(a) - 1]
        assert torch.allclose(masked, alone, atol=1e-5), (masked - alone).abs().max()
        with torch.no_grad():  # and it is not the full context's forward: the comparison can fail
            full = model(input_ids=torch.cat([c, a])[None]).logits[0, len(c) - 1 : len(c) + len(a) - 1]
        assert not torch.allclose(masked, full, atol=1e-3)


def test_the_budget_is_exact_protected_tokens_stay_and_order_is_kept():
    scores = torch.tensor([5.0, 0.0, 9.0, 1.0, 7.0, 2.0, 3.0, -1.0, 8.0, 0.5])
    assert budget(10, 0.25) == 2 and budget(3, 0.01) == 1 and budget(4, 1.0) == 4
    assert top_kept(scores, 5, 2) == [0, 2, 4, 8, 9]  # 8 and 9 protected, then the three best of 0..7 in order
    assert top_kept(scores, 2, 4) == [8, 9]  # protection never exceeds the budget
    for k in range(1, 11):
        kept = top_kept(scores, k, 3)
        assert len(kept) == k and kept == sorted(kept) and kept[-min(3, k):] == list(range(10 - min(3, k), 10))


def _selection(selector: str, **kw: Any) -> Selection:
    return Selection(selector, 0.25, 2, window=4, **kw)


def test_recent_keeps_the_last_k_and_random_follows_its_seed(model, tmp_path):
    prompt = _ids(40).tolist()
    kept, flops = _selection("recent").select(model, prompt)
    assert kept == list(range(30, 40)) and flops == 0.0

    def random_kept(seed: int) -> list[list[int]]:
        subject = TinyLlama(layers=2, hidden=64).load()
        out = OmniSiftText().transform(subject, {"selector": "random", "seed": seed, "protect_last": 2}, TrialContext(seed=0, workdir=tmp_path))
        return [out.generator.selection.select(subject.model, prompt)[0] for _ in range(2)]

    first = random_kept(3)
    assert first == random_kept(3) and first != random_kept(4)
    assert first[0] != first[1]  # one stream over the prompts, not one draw repeated
    assert all(len(k) == 10 and k[-2:] == [38, 39] for k in first)


def test_perplexity_keeps_the_highest_surprisal_tokens(model):
    ids = _ids(40, 5)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids[None]).logits[0], -1)
    surprisal = [float(-logp[i - 1, ids[i]]) for i in range(1, 40)]
    scores = torch.tensor([sum(surprisal) / len(surprisal), *surprisal])
    expected = sorted(torch.topk(scores[:38], 8).indices.tolist() + [38, 39])
    kept, flops = _selection("perplexity").select(model, ids.tolist())
    assert kept == expected
    shape = LMShape.of(model)
    assert flops == shape.layer_flops(40) + shape.head_flops(39)


def test_attention_keeps_the_tokens_the_last_queries_attend_to_most(model):
    ids = _ids(40, 6)
    eager = TinyLlama(layers=2, hidden=64).load().model
    eager.config._attn_implementation = "eager"
    with torch.no_grad():
        attentions = eager(input_ids=ids[None], output_attentions=True).attentions  # per layer (1, H, L, L)
    mass = torch.stack([a[0, :, -4:, :].mean(dim=(0, 1)) for a in attentions]).mean(0)
    expected = sorted(torch.topk(mass[:38], 8).indices.tolist() + [38, 39])
    kept, flops = _selection("attention").select(model, ids.tolist())
    assert kept == expected and flops == LMShape.of(model).layer_flops(40)


def test_the_flop_formulas_match_torchs_counter(model):
    shape = LMShape.of(model)
    ids = _ids(24)[None]
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=ATTENTION_FORMULAS) as counter:
        model(input_ids=ids, logits_to_keep=1)
    assert counter.get_total_flops() == shape.prefill_flops(24)
    net = TokenSelector(64, 8, seed=0, device=torch.device("cpu"))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        net(torch.zeros(1, 24, 64), token_features(ids[0])[None])
    assert counter.get_total_flops() == net.flops(24)


def test_the_generator_reports_kept_share_and_flop_ratio(tiny):
    shape = LMShape.of(tiny.model)
    prompts = [_ids(40, 7).tolist(), _ids(20, 8).tolist()]
    for selector, scoring in (("recent", lambda n: 0.0), ("attention", shape.layer_flops)):
        generator = CompressingGenerator(Selection(selector, 0.25, 2, window=4))
        tiny.generator = generator
        out = generator.generate(tiny, prompts, max_new_tokens=2)
        ratios = [(scoring(n) + shape.prefill_flops(budget(n, 0.25))) / shape.prefill_flops(n) for n in (40, 20)]
        assert out.stats["context_kept_frac"] == pytest.approx((10 / 40 + 5 / 20) / 2)
        assert out.stats["prefill_flops_ratio"] == pytest.approx(sum(ratios) / 2)
        assert generator.records == [pytest.approx((10 / 40, ratios[0])), pytest.approx((5 / 20, ratios[1]))]
        assert [len(s) for s in out.sequences] == [2, 2] and out.prefill_s > 0
    assert ratios[0] > 1.0  # the attention baseline's full scoring forward costs more than the prefill it saves


def test_training_lowers_the_inference_loss_of_held_out_contexts():
    """Planted: each target is the token the 4 *first* tokens (+ the 2 protected last ones) make likelier than the 4
    most recent do; the selector starts as keep-recent (none of the 4 kept). Training on 6 such contexts lowers the
    hard-mask NLL (what inference sees) of 6 *other* contexts by more than half a nat and brings planted tokens in."""
    lm = TinyLlama(layers=2, hidden=64).load().model
    with torch.no_grad():
        lm.model.norm.weight.mul_(4)  # sharper next-token distributions: the kept context matters more
    for p in lm.parameters():
        p.requires_grad_(False)
    length, k, planted, recent = 24, 6, [0, 1, 2, 3, 22, 23], list(range(18, 24))

    def planted_examples(first_seed: int) -> list[tuple[list[int], list[int]]]:
        out = []
        for i in range(6):
            c = _ids(length, first_seed + i)
            with torch.no_grad():
                gain = torch.log_softmax(lm(input_ids=c[planted][None]).logits[0, -1], -1) - torch.log_softmax(
                    lm(input_ids=c[recent][None]).logits[0, -1], -1)
            out.append((c.tolist(), [int(gain.argmax())]))
        return out

    train, held_out = planted_examples(100), planted_examples(200)
    settings = TrainSettings(k / length, 2, 0, 6, 0.05, 16, 0.5, 32, 60.0, "builtin", 0)
    net = TokenSelector(64, 16, seed=0, device=torch.device("cpu"))

    def inference_loss(examples: list[tuple[list[int], list[int]]]) -> float:
        with torch.no_grad():  # the straight-through mask's forward is the hard mask's: what inference computes
            hard = replace(settings, estimator="straight_through")
            return float(_step_loss(net, lm, examples, 32, hard, torch.device("cpu")))

    def found() -> int:
        with torch.no_grad():
            return sum(len(set(_selection_of(net, lm, c, k)) & set(planted[:4])) for c, _ in held_out)

    loss = _step_loss(net, lm, train, 32, settings, torch.device("cpu"))
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in net.parameters())
    before = inference_loss(held_out)
    assert found() == 0
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    for _ in range(20):
        opt.zero_grad()
        _step_loss(net, lm, train, 32, settings, torch.device("cpu")).backward()
        opt.step()
    after = inference_loss(held_out)
    assert after < before - 0.5, (before, after)  # measured 6.84 -> 5.94 nats
    assert found() >= 6, found()  # of the 24 planted tokens (4 in each of 6 held-out contexts), none kept at the start


@pytest.mark.slow
@pytest.mark.results
def test_on_smollm2_training_lowers_the_inference_loss_of_held_out_lambada_rows(monkeypatch, capsys):
    """The claim's recipe (80 steps of 4 LAMBADA train rows, Adam 0.02, seed 0) lowers the hard-mask NLL of 64 eval
    rows the study never scores (200..263) by more than a nat below the untrained, keep-recent-like selector (measured
    7.69 -> 5.65 nats; with estimator=straight_through it was 7.45, and this test fails)."""
    import torch.nn.functional as F

    from paretolab.data import encode
    from paretolab.models import SmolLM2
    from paretolab.plugins.omnisift_text.train import _train
    from paretolab.tasks.lambada import split_rows, target_ids

    _use_the_user_cache(monkeypatch)  # the converted SmolLM2 lives there; the selector trained here is not cached
    try:
        rows = split_rows("lambada", "eval")[200:264]
    except ConfigError as err:
        pytest.skip(f"needs LAMBADA's file (PARETOLAB_DATA_DIR with mc/lambada_openai.jsonl): {err}")
    subject = SmolLM2().load()
    lm, tokenizer = subject.model, subject.tokenizer
    net = TokenSelector(lm.get_input_embeddings().weight.shape[1], 64, seed=0, device=torch.device("cpu"))

    def held_out_nll() -> float:
        total = 0.0
        with torch.no_grad():
            for row in rows:
                c = torch.tensor(encode(tokenizer, row["context"].rstrip()), dtype=torch.long)
                t = torch.tensor(target_ids(tokenizer, row["continuation"]), dtype=torch.long)
                hard = torch.zeros(len(c))
                hard[top_kept(net(lm.get_input_embeddings()(c)[None], token_features(c)[None])[0], budget(len(c), 0.25), 4)] = 1.0
                keep = torch.cat([hard, torch.ones(len(t))])[None]
                hidden = masked_hidden(lm, torch.cat([c, t])[None], keep, keep)[0, len(c) - 1 : len(c) - 1 + len(t)]
                total += float(F.cross_entropy(lm.get_output_embeddings()(hidden).float(), t))
        return total / len(rows)

    before = held_out_nll()
    _train(net, lm, tokenizer, TrainSettings(0.25, 4, 80, 4, 0.02, 64, 0.5, 96, 600.0, "lambada", 0))
    after = held_out_nll()
    with capsys.disabled():
        print(f"\nomnisift_text on SmolLM2-135M: held-out hard-mask NLL {before:.3f} untrained -> {after:.3f} trained (relaxed)")
    assert after < before - 1.0, (before, after)


def _use_the_user_cache(monkeypatch) -> None:
    if _USER_CACHE is None:
        monkeypatch.delenv("PARETOLAB_CACHE", raising=False)
    else:
        monkeypatch.setenv("PARETOLAB_CACHE", _USER_CACHE)


def _selection_of(net: TokenSelector, lm: torch.nn.Module, context: list[int], k: int) -> list[int]:
    ids = torch.tensor(context)
    return top_kept(net(lm.get_input_embeddings()(ids)[None], token_features(ids)[None])[0], k, 2)


def test_the_trained_selector_is_cached_and_reported():
    subject = TinyLlama(layers=2, hidden=64).load()
    settings = TrainSettings(0.25, 4, 3, 2, 0.01, 8, 0.5, 32, 60.0, "builtin", 0)
    first = train_selector(subject.model, subject.tokenizer, settings, model_key="k")
    again = train_selector(subject.model, subject.tokenizer, settings, model_key="k")
    assert first.meta["cached"] == 0.0 and again.meta["cached"] == 1.0 and first.meta["steps"] == 3
    assert first.meta["train_flops"] > 0 and again.meta["train_flops"] == first.meta["train_flops"]
    assert all(torch.equal(a, b) for a, b in zip(first.net.state_dict().values(), again.net.state_dict().values()))


def test_the_lambada_trial_reports_accuracy_and_the_per_example_costs(tiny):
    from paretolab.records import StagePlan, TrialSettings
    from paretolab.study.trial import run_trial

    settings = TrialSettings("t", "lambada", {"source": "builtin", "limit": 3}, {}, seed=0)
    result = run_trial(tiny, [StagePlan("s0", "omnisift_text", {"selector": "recent"})], settings, number=0)
    assert not result.failed, result.traceback
    assert result.metrics["n_examples"] == 3 and 0.0 <= result.metrics["acc"] <= 1.0
    assert 0.2 < result.metrics["context_kept_frac"] < 0.3 and result.metrics["prefill_flops_ratio"] < 0.3
    assert result.metrics["prefill_speedup"] > 0  # paired against the unmodified model (measure)
    payload = json.loads(result.artifacts["per_example.json"])
    assert len(payload["scores"]["acc"]) == 3 and len(payload["scores"]["prefill_flops_ratio"]) == 3
    assert sum(payload["scores"]["prefill_flops_ratio"]) / 3 == pytest.approx(result.metrics["prefill_flops_ratio"])


def test_bad_settings_name_the_field_and_the_fix(tiny, ctx):
    for params, field in (({"selector": "oracle"}, "selector"), ({"keep": 0.0}, "keep"), ({"protect_last": 0}, "protect_last"),
                          ({"train_source": "wiki"}, "train_source"), ({"estimator": "gumbel"}, "estimator")):
        with pytest.raises(ConfigError, match=f"omnisift_text.{field}"):
            OmniSiftText().transform(tiny.copy(), params, ctx)


class TestOmniSiftTextContract(MethodContract):
    @pytest.fixture
    def method(self) -> OmniSiftText:
        return OmniSiftText()

    @pytest.fixture
    def params(self) -> dict[str, Any]:
        return dict(CHEAP)

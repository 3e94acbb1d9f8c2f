"""Quality tasks on the tiny model: perplexity arithmetic and multiple-choice scoring."""

from __future__ import annotations

import json
import math

import pytest
import torch

from paretolab.data import encode, load_corpus
from paretolab.data.corpora import PYDOC_SHA256
from paretolab.errors import ConfigError
from paretolab.tasks import (
    MultipleChoice,
    MultipleChoiceOptions,
    Perplexity,
    PerplexityOptions,
    corpus_ids,
)
from tests.conftest import needs_data


def direct_nll(model, ids):
    with torch.no_grad():
        logits = model(input_ids=ids.unsqueeze(0)).logits[0, :-1]
    return torch.nn.functional.cross_entropy(logits, ids[1:], reduction="sum").item(), ids.numel() - 1


def test_builtin_corpus_is_pinned():
    text, digest = load_corpus("pydoc")
    assert len(text) > 100_000
    import sys

    pinned = PYDOC_SHA256.get(f"{sys.version_info.major}.{sys.version_info.minor}")
    assert pinned is None or pinned == digest


def test_perplexity_equals_the_direct_computation(tiny, ctx):
    # one window covering the budget: the task must equal exp(sum NLL / count) computed by hand
    result = Perplexity().evaluate(tiny, PerplexityOptions(max_tokens=200, context=200, stride=200), ctx)
    nll, n = direct_nll(tiny.model, corpus_ids(tiny.tokenizer, "pydoc", 200))
    assert result["nll"] == pytest.approx(nll / n, rel=1e-5)
    assert result["ppl"] == pytest.approx(math.exp(nll / n), rel=1e-5)


def test_sliding_windows_score_each_token_once(tiny, ctx):
    ids = corpus_ids(tiny.tokenizer, "pydoc", 300)
    full = Perplexity().evaluate(tiny, PerplexityOptions(max_tokens=300, context=300, stride=300), ctx)
    sliding = Perplexity().evaluate(tiny, PerplexityOptions(max_tokens=300, context=128, stride=64), ctx)
    batched = Perplexity().evaluate(tiny, PerplexityOptions(max_tokens=300, context=100, stride=100, batch_size=2), ctx)
    assert ids.numel() == 300
    for r in (sliding, batched):
        assert math.isfinite(r["ppl"]) and abs(math.log(r["ppl"]) - math.log(full["ppl"])) < 0.2


def test_text_file_corpus_and_bad_stride(tiny, ctx, tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("hello world, " * 200, encoding="utf-8")
    r = Perplexity().evaluate(tiny, PerplexityOptions(corpus=str(path), max_tokens=256, context=64, stride=64), ctx)
    assert r["ppl"] > 1
    with pytest.raises(ConfigError, match="task.stride"):
        Perplexity().evaluate(tiny, PerplexityOptions(max_tokens=256, context=64, stride=65), ctx)
    with pytest.raises(ConfigError, match="neither a built-in corpus"):
        load_corpus(str(tmp_path / "missing.txt"))


def test_multiple_choice_picks_the_most_likely_choice(tiny, ctx, tmp_path):
    rows = [{"query": "Q: say a", "choices": ["a", "bbbbbbbbbbbbbbbbbbbb", "c"], "gold": i % 3} for i in range(6)]
    path = tmp_path / "mc.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    result = MultipleChoice().evaluate(tiny, MultipleChoiceOptions(dataset=str(path), limit=0), ctx)
    # all rows are the same question, so the model picks the same choice each time: exactly 1/3 right
    assert result["acc"] == pytest.approx(1 / 3) and result["acc_norm"] == pytest.approx(1 / 3)


def test_multiple_choice_formats_and_errors(tiny, ctx, tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text(json.dumps({"context_options": ["A went", "B went"], "continuation": "home.", "gold": 0}) + "\n"
                    + json.dumps({"context": "one two", "continuation": "three"}) + "\n")
    result = MultipleChoice().evaluate(tiny, MultipleChoiceOptions(dataset=str(path)), ctx)
    assert 0.0 <= result["acc"] <= 1.0
    path.write_text(json.dumps({"question": "x"}))
    with pytest.raises(ConfigError, match="expected query/choices/gold"):
        MultipleChoice().evaluate(tiny, MultipleChoiceOptions(dataset=str(path)), ctx)


def fake_scores(monkeypatch, scores: dict[str, float]) -> list[str]:
    """Score each continuation from ``scores`` (by its text) and record the contexts the task built."""
    import paretolab.tasks.multiple_choice as tasks

    contexts: list[str] = []

    def loglikelihoods(subject, pairs, batch_size):
        contexts.extend(c for c, _, _ in pairs)
        return [scores[cont] for _, cont, _ in pairs]

    monkeypatch.setattr(tasks, "_loglikelihoods", loglikelihoods)
    return contexts


def test_multiple_choice_uses_the_data_sets_continuation_delimiter(tiny, ctx, tmp_path, monkeypatch):
    contexts = fake_scores(monkeypatch, {" yes": -1.0, " no": -2.0})
    row = {"query": "Question: is it?\n", "choices": ["no", "yes"], "gold": 1}
    for name in ("arc_easy", "piqa", "copa"):
        (tmp_path / f"{name}.jsonl").write_text(json.dumps(row) + "\n")
        MultipleChoice().evaluate(tiny, MultipleChoiceOptions(dataset=str(tmp_path / f"{name}.jsonl")), ctx)
    # llm-foundry's task config gives ARC and PIQA "\nAnswer: "; COPA joins query and choice with a space
    assert contexts == ["Question: is it?\nAnswer:"] * 4 + ["Question: is it?\n"] * 2
    contexts.clear()
    MultipleChoice().evaluate(tiny, MultipleChoiceOptions(dataset=str(tmp_path / "copa.jsonl"), delimiter="\nA:"), ctx)
    assert contexts == ["Question: is it?\nA:"] * 2


def test_acc_norm_divides_by_the_choices_character_length(tiny, ctx, tmp_path, monkeypatch):
    # "é" is 1 character but 2 bytes: by characters "ab" wins (-1.25 > -1.5), by bytes of " "+choice "é" would
    fake_scores(monkeypatch, {" é": -1.5, " ab": -2.5})
    path = tmp_path / "mc.jsonl"
    path.write_text(json.dumps({"query": "Q", "choices": ["é", "ab"], "gold": 1}) + "\n")
    result = MultipleChoice().evaluate(tiny, MultipleChoiceOptions(dataset=str(path)), ctx)
    assert result["acc"] == 0.0 and result["acc_norm"] == 1.0


def test_multiple_choice_reports_stderr_and_keeps_per_example_scores(tiny, ctx, tmp_path, monkeypatch):
    fake_scores(monkeypatch, {" a": -1.0, " b": -2.0})
    path = tmp_path / "mc.jsonl"
    path.write_text("".join(json.dumps({"query": "Q", "choices": ["a", "b"], "gold": g}) + "\n" for g in (0, 0, 0, 1)))
    result = MultipleChoice().evaluate(tiny, MultipleChoiceOptions(dataset=str(path)), ctx)
    # hits 1, 1, 1, 0: sample std 0.5, over sqrt(4) = 0.25
    assert result["acc"] == 0.75 and result["acc_stderr"] == pytest.approx(0.25) and result["n_examples"] == 4
    stored = json.loads((ctx.workdir / "per_example.json").read_text())
    assert stored["n"] == 4 and stored["scores"]["acc"] == [1.0, 1.0, 1.0, 0.0]


def test_perplexity_gives_a_bootstrap_interval_over_its_windows(tiny, ctx):
    result = Perplexity().evaluate(tiny, PerplexityOptions(max_tokens=512, context=64, stride=64), ctx)
    assert result["n_windows"] == 8
    assert result["ppl_ci_low"] < result["ppl"] < result["ppl_ci_high"]
    stored = json.loads((ctx.workdir / "per_example.json").read_text())
    assert stored["unit"] == "window" and len(stored["scores"]["nll"]) == 8 and sum(stored["weights"]) == 8 * 63
    # the stored windows give back the task's own number
    nll = sum(v * w for v, w in zip(stored["scores"]["nll"], stored["weights"])) / sum(stored["weights"])
    assert math.exp(nll) == pytest.approx(result["ppl"], rel=1e-6)


@pytest.mark.slow
def test_smollm2_quality_on_the_builtin_corpus(ctx):
    """The real model, on the corpus that needs no files: a low perplexity."""
    from paretolab.models import SmolLM2

    subject = SmolLM2().load()
    ppl = Perplexity().evaluate(subject, PerplexityOptions(corpus="pydoc", max_tokens=2048), ctx)["ppl"]
    assert 5 < ppl < 30
    assert encode(subject.tokenizer, "Hello world") == [19556, 905]


@pytest.mark.slow
@pytest.mark.results
def test_smollm2_quality_on_real_data(ctx):
    """The real model is sane: low perplexity on WikiText-2 prose and above-chance ARC-Easy."""
    from paretolab.models import SmolLM2

    needs_data("wikitext2/wiki.test.raw", "mc/arc_easy.jsonl")
    subject = SmolLM2().load()
    ppl = Perplexity().evaluate(subject, PerplexityOptions(corpus="wikitext2", max_tokens=2048), ctx)["ppl"]
    assert 10 < ppl < 40
    acc = MultipleChoice().evaluate(subject, MultipleChoiceOptions(dataset="arc_easy", limit=60), ctx)["acc"]
    assert acc > 0.35  # 4 choices: chance is 0.25

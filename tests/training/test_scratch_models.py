"""The scratch-* presets: sizes as named, LLaMA-style, seeded, and usable by the existing tasks."""

from __future__ import annotations

import pytest
import torch

from paretolab.models import quality_note
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.manager import registries
from paretolab.plugin_api.storage import unique_parameters
from paretolab.tasks.perplexity import Perplexity, PerplexityOptions
from paretolab.training.models import PRESETS

NOMINAL = {"scratch-1m": 1e6, "scratch-5m": 5e6, "scratch-15m": 15e6}


@pytest.mark.parametrize("name", list(PRESETS))
def test_parameter_counts_match_the_description_and_the_name(name):
    source = registries().models.get(name)
    model = source.load().model
    count = sum(t.numel() for _, t in unique_parameters(model))
    assert count == PRESETS[name][1] and f"{count:,} parameters" in source.description
    if name in NOMINAL:
        assert abs(count / NOMINAL[name] - 1) < 0.1
    config = model.config
    assert type(model).__name__ == "LlamaForCausalLM" and config._attn_implementation == "sdpa"
    assert config.vocab_size == 4096 and model.lm_head.weight is model.model.embed_tokens.weight
    assert config.hidden_act == "silu" and {p.dtype for p in model.parameters()} == {torch.float32}
    assert source.weights == "random init" and "random weights" in quality_note(name)


def test_deep_preset_is_thin_and_16_layers():
    deep, small = PRESETS["scratch-deep"][0], PRESETS["scratch-1m"][0]
    assert deep.layers == 16 and deep.hidden == small.hidden


def test_loads_are_seeded_and_share_no_tokenizer():
    source = registries().models.get("scratch-1m")
    first, second = source.load(), source.load()
    assert all(torch.equal(x, y) for x, y in zip(first.model.parameters(), second.model.parameters()))
    first.tokenizer.add_tokens(["<added by a method>"])  # tokenizer methods change theirs in place
    assert len(second.tokenizer) == 4096 and len(source.load().tokenizer) == 4096


def test_perplexity_on_the_held_out_split(tmp_path):
    subject = registries().models.get("scratch-1m").load()
    ctx = TrialContext(seed=0, workdir=tmp_path, task={"name": "perplexity", "corpus": "pystdlib-val"}, cpus=1)
    metrics = Perplexity().evaluate(subject, PerplexityOptions(corpus="pystdlib-val", max_tokens=256, context=128, stride=128), ctx)
    assert 2000 < metrics["ppl"] < 8000  # random init: about the vocabulary size


@pytest.mark.slow  # loads SmolLM2-135M
def test_smol_student_shares_smollm2s_tokenizer_and_its_embedding_dominates():
    from paretolab.training.batches import tokenizer_fingerprint
    from paretolab.training.models import SMOL_PRESETS, SMOL_VOCAB_SIZE

    student = registries().models.get("scratch-smol").load()
    teacher = registries().models.get("smollm2-135m").load()
    count = sum(t.numel() for _, t in unique_parameters(student.model))
    assert count == SMOL_PRESETS["scratch-smol"][1]
    assert student.model.config.vocab_size == teacher.model.config.vocab_size == SMOL_VOCAB_SIZE
    assert tokenizer_fingerprint(student.tokenizer) == tokenizer_fingerprint(teacher.tokenizer)  # KD logits index the same ids
    assert SMOL_VOCAB_SIZE * student.model.config.hidden_size / count > 0.9  # the tied embedding is over 90 % of the student

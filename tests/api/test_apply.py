"""paretolab.apply: a method or a chain on a Hugging Face model from Python, outside any study."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import paretolab
from paretolab.errors import ConfigError

GUIDE = Path(__file__).parents[2] / "docs" / "guides" / "export.md"  # the Python API example of the documentation site


def linear_weights(model):
    return [m.weight for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and "lm_head" not in name]


def test_magnitude_prunes_a_copy_and_reports_the_smaller_size(tiny):
    before = [w.clone() for w in linear_weights(tiny.model)]
    out = paretolab.apply(tiny.model, "magnitude", tokenizer=tiny.tokenizer, sparsity=0.5)
    zeros = sum(int((w == 0).sum()) for w in linear_weights(out.model)) / sum(w.numel() for w in linear_weights(out.model))
    assert 0.45 < zeros < 0.55
    assert all(torch.equal(a, b) for a, b in zip(before, linear_weights(tiny.model))), "the caller's model changed"
    dense = paretolab.apply(tiny.model, "none", tokenizer=tiny.tokenizer)
    assert out.costs["size_bytes"] < dense.costs["size_bytes"]
    assert out.cost_is == {"magnitude": "simulated"} and out.stages[0].params["sparsity"] == 0.5
    assert out.costs["transform_s.magnitude"] == out.costs["transform_s"] > 0


def test_a_chain_calibrates_on_the_given_texts_and_lands_on_the_quantizer_grid(tiny):
    texts = ["def f(x):\n    return x * 2\n" * 40, "The quick brown fox jumps over the lazy dog. " * 60]
    out = paretolab.apply(tiny.model, ["wanda", ("rtn", {"bits": 4, "group_size": 32})], tokenizer=tiny.tokenizer,
                          calibration=texts, seed=3)
    assert [s.method for s in out.stages] == ["wanda", "rtn"] and {"transform_s.wanda", "transform_s.rtn"} <= set(out.costs)
    assert out.stages[0].params["calib_corpus"].endswith("calibration.txt")
    w = linear_weights(out.model)[0]
    groups = w.reshape(w.shape[0], -1, 32)
    scale = groups.abs().amax(-1, keepdim=True) / 7
    assert torch.allclose(torch.round(groups / scale) * scale, groups, atol=1e-6), "weights are not on the 4-bit grid"
    assert (w == 0).float().mean() >= 0.5  # wanda's zeros survive the quantizer
    again = paretolab.apply(tiny.model, ["wanda", ("rtn", {"bits": 4, "group_size": 32})], tokenizer=tiny.tokenizer,
                            calibration=texts, seed=3)
    assert torch.equal(linear_weights(again.model)[0], w), "the same seed must give the same model"


def test_a_model_given_by_name_is_loaded_and_changed(tmp_path):
    out = paretolab.apply("tiny-llama", "rtn", bits=8, group_size=64)
    assert out.subject.model_name == "tiny-llama" and out.costs["size_bytes"] > 0


@pytest.mark.parametrize(("call", "message"), [
    (lambda m, t: paretolab.apply(m, "magnitude", tokenizer=t, sparsty=0.5), r"no parameter 'sparsty'; did you mean 'sparsity'"),
    (lambda m, t: paretolab.apply(m, "rtn", tokenizer=t, bits="four"), r"\('rtn'\).bits: 'four' is not an integer; give an integer like 2, 3, 4, 8"),
    (lambda m, t: paretolab.apply(m, "rtm", tokenizer=t), r"rtm"),
    (lambda m, t: paretolab.apply(m, "rtn", tokenizer=t, calibration="pydoc"), r"none of rtn calibrates"),
    (lambda m, t: paretolab.apply(m, "wanda"), r"pass tokenizer="),
    (lambda m, t: paretolab.apply(m, ["wanda"], tokenizer=t, sparsity=0.5), r"each stage its own params"),
    (lambda m, t: paretolab.apply(m, "wanda", tokenizer=t, calibration="no-such-corpus.txt"), r"calibration='no-such-corpus.txt'"),
])
def test_bad_input_is_refused_with_the_field_and_the_fix(tiny, call, message):
    with pytest.raises(ConfigError, match=message):
        call(tiny.model, tiny.tokenizer)


def readme_example() -> str:
    text = GUIDE.read_text(encoding="utf-8")
    found = re.search(r"<!-- python-api-example -->\s*```python\n(.*?)```", text, re.S)
    assert found, "docs/guides/export.md lost its Python API example (the block after <!-- python-api-example -->)"
    return found.group(1)


def test_the_readme_example_runs_on_tiny_llama(capsys):
    code = readme_example()
    assert "smollm2-135m" in code
    exec(compile(code.replace("smollm2-135m", "tiny-llama"), "docs/guides/export.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "wanda" in printed and "rtn" in printed and "size_bytes" in printed

"""Trained checkpoints: save_trained -> model source round trip, provenance in `models list`, refused names, killed saves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from paretolab.cli import main
from paretolab.errors import SaveNameError
from paretolab.models import load_subject
from paretolab.plugin_api import manager as plugin_manager
from paretolab.training.checkpoints import save_trained, trained_dir
from paretolab.training.method import check_save_as
from paretolab.training.tokenizer import ensure_tokenizer
from tests.training.conftest import make_ctx


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty paretolab cache that shares this machine's trained tokenizer (no retraining per test)."""
    tokenizers = ensure_tokenizer().parent
    root = tmp_path / "cache"
    root.mkdir()
    (root / "tokenizers").symlink_to(tokenizers, target_is_directory=True)
    monkeypatch.setenv("PARETOLAB_CACHE", str(root))
    plugin_manager.reset()
    yield root
    plugin_manager.reset()


def _trained(seed: int = 0):
    subject = load_subject("scratch-1m")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # stands in for training: weights no random init reproduces
        for p in subject.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return subject


def test_round_trip_gives_identical_logits_and_is_listed_with_provenance(cache, capsys):
    subject = _trained()
    path = save_trained(subject, "rt-1m", {"tokens": 12345, "seed": 3, "val_loss": 5.25})
    assert path == trained_dir() / "rt-1m" and path.parent == cache / "models" / "trained"
    record = json.loads((path / "paretolab.json").read_text())
    assert record["base"] == "scratch-1m" and record["weights"] == "fp32 (trained here)" and record["code_version"]

    plugin_manager.reset()  # a fresh process: the source comes from the folder
    loaded = load_subject("rt-1m")
    ids = torch.randint(0, 4096, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(subject.model(ids).logits, loaded.model(ids).logits)
    text = "def f(x):\n    return x  # é"
    assert loaded.tokenizer.encode(text, add_special_tokens=False) == subject.tokenizer.encode(text, add_special_tokens=False)
    assert loaded.info["weights"] == "fp32 (trained here)"

    assert main(["models", "list"]) == 0
    listed = capsys.readouterr().out
    assert "rt-1m" in listed and "trained here from scratch-1m; 12,345 tokens; seed 3; val_loss 5.2500" in listed


def test_saving_again_replaces_the_checkpoint_in_this_process_too(cache):
    save_trained(_trained(0), "again", {"seed": 0})
    save_trained(_trained(1), "again", {"seed": 1})
    assert "seed 1" in plugin_manager.registries().models.get("again").description
    assert sorted(p.name for p in trained_dir().iterdir() if not p.name.startswith(".")) == ["again"]


@pytest.mark.parametrize("name", ["", "a/b", ".hidden", "has space", "x" * 65, "tiny-llama", "scratch-1m"])
def test_bad_names_are_refused_by_name(cache, name):
    with pytest.raises(SaveNameError, match=r"train\.save_as: "):
        save_trained(_trained(), name, {})
    assert not trained_dir().exists() or not any(p for p in trained_dir().iterdir() if not p.name.startswith("."))


def test_save_as_template_is_checked_before_training():
    check_save_as("run-{seed}-{trial}", where="stages.s2.train.params.save_as")
    with pytest.raises(SaveNameError, match="stages.s2.train.params.save_as: 'run 0'"):
        check_save_as("run {seed}", where="stages.s2.train.params.save_as")
    with pytest.raises(Exception, match="placeholder other than"):
        check_save_as("run-{lr}", where="stages.s2.train.params.save_as")


def test_a_model_its_class_would_not_rebuild_is_refused(cache):
    subject = _trained()
    subject.model.model.layers[0].input_layernorm = torch.nn.LayerNorm(128)  # surgery a plain Llama does not have
    with pytest.raises(SaveNameError, match="model.layers.0.input_layernorm.*LayerNorm"):
        save_trained(subject, "surgery", {})
    widened = _trained()
    widened.model.model.norm.weight = torch.nn.Parameter(torch.ones(256))  # widened without updating the config
    with pytest.raises(SaveNameError, match=r"'model.norm.weight' has shape \(256,\) here but \(128,\)"):
        save_trained(widened, "widened", {})


def test_a_killed_save_leaves_nothing_listed_and_a_later_save_works(cache, capsys):
    script = textwrap.dedent("""
        import sys, time, torch
        from paretolab.models import load_subject
        from paretolab.training.checkpoints import save_trained
        subject = load_subject("scratch-1m")
        def hang(*args, **kwargs):  # the model is written; die before the rest
            print("writing", flush=True)
            time.sleep(600)
        subject.tokenizer.save_pretrained = hang
        save_trained(subject, "killed", {})
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env={**os.environ})
    try:
        assert proc.stdout.readline().strip() == "writing"
        assert any(trained_dir().joinpath(".partial").iterdir())  # half a checkpoint exists, staged
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    plugin_manager.reset()
    assert "killed" not in plugin_manager.registries().models and not (trained_dir() / "killed").exists()
    assert main(["models", "list"]) == 0 and "killed" not in capsys.readouterr().out
    save_trained(_trained(), "killed", {})
    assert "killed" in plugin_manager.registries().models


def test_train_stage_save_as_makes_a_model_source(cache, train_text, tmp_path):
    subject = load_subject("scratch-1m")
    params = {"tokens": 1024, "seq_len": 32, "batch": 4, "eval_every": 4, "eval_tokens": 256, "corpus": train_text,
              "seed": 2, "save_as": "from-train-{seed}"}
    trained = plugin_manager.registries().methods.get("train").transform(subject, params, make_ctx(tmp_path))
    record = json.loads((trained_dir() / "from-train-2" / "paretolab.json").read_text())
    assert record["tokens"] == 1024 and record["seed"] == 2 and record["val_loss"] == trained.training.metrics["val_loss"]
    assert record["base"] == "scratch-1m"
    reloaded = load_subject("from-train-2")
    ids = torch.arange(16)[None]
    with torch.no_grad():
        assert torch.equal(trained.model(ids).logits, reloaded.model(ids).logits)

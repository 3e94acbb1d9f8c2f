"""Trained checkpoints as model sources: what the ``train`` stage's ``save_as`` writes, and how it comes back.

``save_trained`` writes a Hugging Face model directory, the tokenizer and ``paretolab.json``
(base model, tokens, seed, val_loss, code version, weights) under
``cache_dir()/models/trained/<name>``. The directory is built in ``.partial/`` beside it and
renamed into place, so a killed save leaves no checkpoint that lists or loads half-written.
Every complete directory there is a model source (``paretolab models list``, ``model: <name>``):
fp32 bases trained on this machine, for studies that compress or fine-tune them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from paretolab.data import cache_dir, python_version
from paretolab.errors import SaveNameError
from paretolab.models import ModelSource, load_pretrained
from paretolab.plugin_api.subject import Subject

RECORD = "paretolab.json"
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def trained_dir() -> Path:
    """The folder holding one subfolder per saved checkpoint."""
    return cache_dir() / "models" / "trained"


def check_save_name(name: str, *, where: str = "train.save_as") -> None:
    """Refuse a name that cannot be a model source: not a plain name, or one a built-in or plugin model has."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise SaveNameError(
            f"{where}: {name!r} is not a usable model name; give 1-64 letters, digits, '.', '_' or '-' "
            "starting with a letter or digit (e.g. 'scratch-5m-trained')"
        )
    from paretolab.plugin_api.manager import registries

    models = registries().models
    if name in models and not isinstance(models.get(name), TrainedModel):
        raise SaveNameError(f"{where}: {name!r} is the name of the model source from {models.owner(name)!r}; give the checkpoint another name")


def save_trained(subject: Subject, name: str, meta: dict[str, Any]) -> Path:
    """Save ``subject`` as the model source ``name`` (replacing an earlier save of that name); return its directory.

    ``meta`` is recorded as given (the train stage passes tokens, seed, val_loss, ...); ``base``,
    ``weights``, ``code_version``, ``python`` and ``saved_at`` are filled in when it lacks them.
    """
    from paretolab.version import code_version

    check_save_name(name)
    model = subject.model
    _check_loadable(model, name)
    target = trained_dir() / name
    staging = trained_dir() / ".partial"
    staging.mkdir(parents=True, exist_ok=True)
    tmp = staging / f"{name}.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)  # an earlier save of ours killed midway
    model.save_pretrained(tmp, safe_serialization=True)
    subject.tokenizer.save_pretrained(tmp)
    record = {
        "base": subject.model_name,
        "weights": _weights_label(model),
        "code_version": code_version(),
        "python": python_version(),
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **({"simulated_by": list(subject.simulated_by)} if subject.simulated_by else {}),
        **meta,
    }
    (tmp / RECORD).write_text(json.dumps(record, indent=1, default=str))  # written last: its presence marks a complete save
    old = staging / f"{name}.{os.getpid()}.old"
    if target.exists():
        target.rename(old)  # killed between the two renames: no checkpoint of this name, never a half one
    tmp.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    _register_now(name)
    return target


def _weights_label(model: torch.nn.Module) -> str:
    dtypes = {p.dtype for p in model.parameters()}
    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
    label = names.get(next(iter(dtypes)), str(next(iter(dtypes)))) if len(dtypes) == 1 else "mixed"
    return f"{label} (trained here)"


def _check_loadable(model: torch.nn.Module, name: str) -> None:
    """Refuse a model its own Hugging Face class would not rebuild (surgery added or replaced modules): it would load wrong."""
    if getattr(model, "config", None) is None or not hasattr(model, "save_pretrained"):
        raise SaveNameError(f"train.save_as: {name!r}: the model is not a Hugging Face model ({type(model).__name__}); it cannot be saved as a model source")
    problem = rebuild_mismatch(model)
    if problem:
        raise SaveNameError(f"train.save_as: {name!r}: {problem}; a checkpoint of it would load as a different model, so it is not saved "
                            "(update model.config to match if only shapes differ)")


def rebuild_mismatch(model: torch.nn.Module) -> str:
    """How ``model`` differs from a fresh model of its class built from its config ("" when it does not): the first
    module of another type (with the number that differ), else the first tensor of another shape."""
    with torch.device("meta"):
        fresh = type(model)(model.config)
    ours = {n: type(m) for n, m in model.named_modules()}
    theirs = {n: type(m) for n, m in fresh.named_modules()}
    differing = sorted(n for n in ours.keys() | theirs.keys() if ours.get(n) is not theirs.get(n))
    if differing:
        first = differing[0]
        here = ours.get(first)
        return (f"module {first!r} is {getattr(here, '__name__', 'missing')}{f' (from {here.__module__})' if here else ''} here but "
                f"{getattr(theirs.get(first), '__name__', 'missing')} in a fresh {type(model).__name__} ({len(differing)} module(s) differ)")
    ours_shapes = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    theirs_shapes = {n: tuple(t.shape) for n, t in fresh.state_dict().items()}
    if ours_shapes != theirs_shapes:
        first = sorted(n for n in ours_shapes.keys() | theirs_shapes.keys() if ours_shapes.get(n) != theirs_shapes.get(n))[0]
        return f"tensor {first!r} has shape {ours_shapes.get(first)} here but {theirs_shapes.get(first)} in a {type(model).__name__} built from the model's config"
    return ""


class TrainedModel(ModelSource):
    """A checkpoint ``save_trained`` wrote: loads from its directory; its description is its provenance."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = path.name
        self.refresh()

    def refresh(self) -> None:
        """Re-read ``paretolab.json`` (after the checkpoint was saved again under the same name)."""
        self.record: dict[str, Any] = json.loads((self.path / RECORD).read_text())
        self.weights = str(self.record.get("weights", "unknown"))
        self.description = describe(self.record)

    def check(self) -> None:
        from paretolab.errors import ConfigError

        if not (self.path / RECORD).is_file():
            raise ConfigError(f"model {self.name!r}: the checkpoint at {self.path} is gone; save it again (train.save_as) or pick another model")

    def pull(self) -> str:
        self.check()
        return str(self.path)

    def load(self) -> Subject:
        return load_pretrained(self.pull(), self.name)


def describe(record: dict[str, Any]) -> str:
    """One line of provenance: base, tokens, seed, val_loss, code version, when."""
    parts = [f"trained here from {record.get('base', '?')}"]
    if record.get("tokens") is not None:
        parts.append(f"{int(record['tokens']):,} tokens")
    if record.get("seed") is not None:
        parts.append(f"seed {record['seed']}")
    if record.get("val_loss") is not None:
        parts.append(f"val_loss {float(record['val_loss']):.4f}")
    parts.append(f"paretolab {record.get('code_version', '?')}, Python {record.get('python', '?')}, saved {record.get('saved_at', '?')}")
    if record.get("simulated_by"):
        parts.append(f"saved after simulated methods: {', '.join(record['simulated_by'])}")
    return "; ".join(parts)


def trained_sources() -> list[TrainedModel]:
    """A source for each complete checkpoint under ``trained_dir()`` (staging and unreadable ones left out)."""
    folder = trained_dir()
    if not folder.is_dir():
        return []
    sources = []
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or not (path / RECORD).is_file() or not NAME_PATTERN.fullmatch(path.name):
            continue
        try:
            sources.append(TrainedModel(path))
        except (OSError, ValueError):  # a record someone edited into nonsense: not a source, and not our crash
            continue
    return sources


def _register_now(name: str) -> None:
    """Make the new checkpoint a model source in this process too (registries are built once per process)."""
    from paretolab.plugin_api.manager import registries

    models = registries().models
    if name in models:
        source = models.get(name)
        if isinstance(source, TrainedModel):
            source.refresh()
        return
    models.register(TrainedModel(trained_dir() / name), owner="paretolab.training.models")

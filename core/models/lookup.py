"""Models by name: the registered sources (a built-in plugin), else a local directory or a hub id."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from paretolab.errors import ConfigError
from paretolab.models.gguf import Gemma3, SmolLM2
from paretolab.models.hub import HFModel
from paretolab.models.source import ModelSource, provenance
from paretolab.models.tiny import TinyLlama
from paretolab.plugin_api.hookspec import hookimpl
from paretolab.plugin_api.subject import Subject


@hookimpl
def register_models(register: Callable[[ModelSource], None]) -> None:
    register(SmolLM2())
    register(Gemma3())
    register(TinyLlama())


def resolve_model(name: str) -> ModelSource:
    """The registered source called ``name``, else a local path or hub id, else a helpful error."""
    from paretolab.plugin_api.manager import registries

    models = registries().models
    if name in models:
        return models.get(name)
    if Path(name).expanduser().is_dir() or is_hub_id(name):
        return HFModel(str(Path(name).expanduser()) if Path(name).expanduser().is_dir() else name)
    raise ConfigError(models.unknown_message(name) + "; or give a local model directory or a Hugging Face id (org/name)")


def check_model_name(name: str) -> None:
    """Refuse a `model:` that is neither registered, a path nor a hub id (the same on every machine; see check_model)."""
    from paretolab.plugin_api.manager import registries

    models = registries().models
    if name in models or is_hub_id(name) or name.startswith(("/", ".", "~")) or Path(name).expanduser().is_dir():
        return
    raise ConfigError(f"model: {models.unknown_message(name)}; or give a local model directory or a Hugging Face id (org/name)")


def check_model(name: str) -> None:
    """Refuse, before any trial starts, a model this machine cannot load (missing directory, files or download)."""
    try:
        resolve_model(name).check()
    except ConfigError as exc:
        message = str(exc)
        raise ConfigError(message if message.startswith("model") else f"model: {message}") from None


def model_is_cached(name: str) -> bool:
    """Whether loading ``name`` reads a cached copy (False: the first load downloads or converts it)."""
    try:
        return resolve_model(name).is_cached()
    except ConfigError:
        return True  # refused elsewhere, with its reason


def is_hub_id(name: str) -> bool:
    return name.count("/") == 1 and not name.startswith((".", "/", "~")) and all(name.split("/"))


def load_subject(name: str) -> Subject:
    """Load a model by name into a Subject (registered name, local path or hub id), its provenance in ``info``."""
    source = resolve_model(name)
    subject = source.load()
    subject.info.update(provenance(source, subject))
    return subject

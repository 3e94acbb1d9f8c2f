"""Loading the shipped pipelines, including those whose model is a checkpoint another pipeline saves."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from paretolab.study.spec import StudySpec, load_spec, parse_spec
from paretolab.study.yaml_read import read_yaml

ROOT = Path(__file__).resolve().parents[2] / "pipelines"


@lru_cache(maxsize=1)
def saved_models() -> dict[str, str]:
    """``train.save_as`` name -> the model it is trained from, over every shipped pipeline (read once per session)."""
    out = {}
    for path in ROOT.glob("*.yaml"):
        raw: Any = read_yaml(path.read_text(), str(path))
        for stage in raw.get("stages") or []:
            params = (stage.get("params") or {}) if isinstance(stage, dict) else {}
            if stage.get("method") == "train" and isinstance(params.get("save_as"), str):
                out[params["save_as"]] = raw["model"]
    return out


def load_as_shipped(path: Path) -> StudySpec:
    """``load_spec`` as on the machine that trained the checkpoints: a model name a shipped pipeline saves
    (``train.save_as``) counts as known, so the spec keeps it (and its pipeline hash) where ``load_shipped`` swaps it."""
    from unittest import mock

    from paretolab.models import check_model_name

    def known(name: str) -> None:
        if name not in saved_models():
            check_model_name(name)

    with mock.patch("paretolab.study.spec.check_model_name", known):
        return load_spec(path)


def load_shipped(path: Path) -> StudySpec:
    """``load_spec``; a pipeline on a checkpoint that a shipped pipeline saves (absent on a fresh machine) is
    checked on that checkpoint's own base model instead, everything else unchanged."""
    from paretolab.errors import ConfigError
    from paretolab.models import check_model_name

    raw: Any = read_yaml(path.read_text(), str(path))
    saved = saved_models()
    if raw.get("model") in saved:
        try:
            check_model_name(raw["model"])
        except ConfigError:
            return parse_spec({**raw, "model": saved[raw["model"]]}, source=str(path))
    return load_spec(path)

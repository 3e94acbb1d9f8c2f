"""Every trial's "Reproduce" pipeline passes `paretolab check`'s validation, for every shipped pipeline and arm."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dashboard.reproduce import reproduce_pipeline
from paretolab.errors import ConfigError
from paretolab.study.spec import parse_spec

PIPELINES = sorted((Path(__file__).resolve().parents[2] / "pipelines").glob("*.yaml"))


def _trials(pipeline: dict) -> list[dict]:
    """Optuna-like params for one trial per arm: each choice option in turn, each searched value at its first point."""
    stages = pipeline.get("stages") or []
    arms: list[dict] = [{}]
    for index, stage in enumerate(stages):
        stage_id = str(stage.get("id", f"stage{index}"))
        options = stage["choice"] if "choice" in stage else [stage]
        grown = []
        for params in arms:
            for option in options:
                p = dict(params)
                if "choice" in stage:
                    p[f"{stage_id}.method"] = option["method"]
                for name, value in (option.get("params") or {}).items():
                    if isinstance(value, list) and value:
                        p[f"{stage_id}.{option['method']}.{name}"] = value[0]
                    elif isinstance(value, dict) and "low" in value:
                        p[f"{stage_id}.{option['method']}.{name}"] = value["low"]
                grown.append(p)
        arms = grown[:12]
    return arms


@pytest.mark.parametrize("path", PIPELINES, ids=[p.stem for p in PIPELINES])
def test_every_arms_reproduce_pipeline_is_valid(path):
    pipeline = yaml.safe_load(path.read_text())
    try:
        parse_spec(pipeline)
        waiting = None
    except ConfigError as exc:  # a base another pipeline trains here (scratch-deep-fp32): the model check waits for it
        assert str(exc).startswith("model:"), exc
        waiting = str(exc)
    for number, params in enumerate(_trials(pipeline)):
        out = reproduce_pipeline(pipeline, params, study=pipeline["name"], number=number)
        assert "enqueue" not in out["search"] and "claim" not in out and "claims" not in out
        try:
            parse_spec(out, source=f"reproduce of {path.name} trial {number}")
        except ConfigError as exc:
            assert str(exc) == waiting, exc  # only the model the original also waits for

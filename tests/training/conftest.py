"""Small training fixtures: a training text that is not the tasks' pydoc corpus, a tiny random Llama, a trial context."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from paretolab.plugin_api.context import TrialContext

# A few stdlib modules' sources: offline, ~300 KB, and a different text from the pydoc corpus the test tasks score on.
_MODULES = ("argparse", "textwrap", "dataclasses", "json.decoder", "json.encoder", "string", "functools", "inspect")


@pytest.fixture(scope="session")
def train_text(tmp_path_factory) -> str:
    import importlib

    path = tmp_path_factory.mktemp("corpus") / "stdlib_train.txt"
    path.write_text("\n\n".join(inspect.getsource(importlib.import_module(m)) for m in _MODULES), encoding="utf-8")
    return str(path)


@pytest.fixture
def tiny():
    from paretolab.models import TinyLlama

    subject = TinyLlama().load()
    subject.info["weights"] = "random init"
    return subject


@pytest.fixture
def small(train_text) -> dict:
    """Train params for a ~1 s stage on tiny-llama."""
    return {"tokens": 4096, "seq_len": 32, "batch": 8, "eval_every": 4, "eval_tokens": 512, "corpus": train_text}


def make_ctx(tmp_path: Path, stage: str = "s1", **task) -> TrialContext:
    return TrialContext(seed=0, workdir=tmp_path / "trial", task={"name": "perplexity", "corpus": "pydoc", **task}, stage=stage, cpus=1)

"""The reliability battery (issue 57): what an adversarial user meets is one line and exit code 2, nothing lost or half-written."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import cli_here

ROOT = Path(__file__).resolve().parents[2]

TINY = """name: tiny
model: tiny-llama
task: {name: perplexity, corpus: pydoc, max_tokens: 512}
stages:
  - method: rtn
    params: {bits: [4, 8], group_size: 32}
objectives:
  - {metric: ppl, direction: minimize}
  - {metric: size_bytes, direction: minimize}
search: {sampler: random, trials: 2, seed: 0}
resources: {cpus: 1, gpus: 0}
"""


@pytest.fixture
def register(request):
    """Register a test's method for the test only; its owner is the module's ``PLUGIN_OWNER`` (default ``test``)."""
    from paretolab.plugin_api import manager
    from paretolab.plugin_api.manager import registries

    owner = getattr(request.module, "PLUGIN_OWNER", "test")

    def add(method):
        registries().methods.register(method, owner=owner)
        return method

    yield add
    manager.reset()


def one_line(proc: subprocess.CompletedProcess, *, lines: int = 1) -> str:
    """The error of a refused command: exit code 2, no traceback, ``lines`` lines on stderr (the first returned)."""
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-4000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    assert 1 <= len(err) <= lines, err
    return err[0]


def refused(*args: str, cwd: Path, env: dict | None = None, lines: int = 1) -> str:
    """``paretolab ARGS`` in this process, which must be refused: its one error line."""
    return one_line(cli_here(*args, cwd=cwd, env=env, check=False), lines=lines)


def leftovers(folder: Path, *patterns: str) -> list[str]:
    """Temporary files a failed write must not leave behind."""
    pats = patterns or ("*.part", "*.partial", "*.tmp", "*-journal", "*.lock.tmp")
    return sorted(str(p.relative_to(folder)) for pat in pats for p in folder.rglob(pat))


@pytest.fixture
def pipeline(tmp_path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path

"""The documentation site builds with `mkdocs build --strict`: no broken link or anchor, no page outside the
navigation, every registered method on a page of the methods catalog, the generated reference pages rendered.

What `make docs` runs, into a temp folder; CI's `make test` runs it (not marked slow: about 10-20 s).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def build(site: Path, config: Path = ROOT / "mkdocs.yml") -> subprocess.CompletedProcess:
    mkdocs = Path(sys.executable).parent / "mkdocs"
    return subprocess.run([str(mkdocs), "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = build(out)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return out


def text(site: Path, page: str) -> str:
    return re.sub(r"<[^>]+>", " ", (site / page / "index.html").read_text(encoding="utf-8"))


def test_the_site_builds_strict_and_every_page_is_in_the_navigation(site):
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = set(re.findall(r"^\s+-\s+(?:[^:\n]+:\s+)?([\w/.-]+\.md)\s*$", config, re.M))
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md") if "_hooks" not in p.parts}
    assert pages - nav == set(), "docs pages missing from mkdocs.yml's nav"


def test_the_reference_is_generated_from_the_code(site):
    from paretolab.cli.parser import build_parser
    from paretolab.plugin_api.manager import registries

    cli = text(site, "reference/cli")
    for action in build_parser()._subparsers._group_actions[0].choices:
        assert f"paretolab {action}" in cli, f"the CLI reference lacks `paretolab {action}`"
    regs = registries()
    metrics = text(site, "reference/metrics")
    assert all(m.name in metrics for m in regs.metrics)
    pipeline = text(site, "reference/pipeline")
    assert "trial_timeout_s" in pipeline and "max_ratio_to" in pipeline  # read from the parser's field checks
    assert all(t.name in pipeline for t in regs.tasks)
    catalog = text(site, "methods")
    assert all(m.name in catalog for m in regs.methods)
    assert "def apply" in text(site, "reference/api") or "apply(" in text(site, "reference/api")


def test_a_broken_link_fails_the_build(tmp_path):
    """--strict is what makes a broken link fail: a page with one does not build."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# x\n\n[gone](nowhere.md)\n", encoding="utf-8")
    (tmp_path / "mkdocs.yml").write_text("site_name: x\nstrict: true\nnav:\n  - index.md\n", encoding="utf-8")
    done = build(tmp_path / "site", tmp_path / "mkdocs.yml")
    assert done.returncode != 0 and "nowhere.md" in done.stdout + done.stderr

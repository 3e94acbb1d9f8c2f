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


def _hook():
    """docs/_hooks/reference.py, the site's hook, as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("paretolab_docs_hook", ROOT / "docs" / "_hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_results_pages_open_with_their_verdicts_and_show_the_pictures_github_shows(site):
    """Each results document's page: the summary table right under its title, every picture the document shows (its
    studies' frontiers, the SmolLM2 cross-study frontier, the sensitivity plots) an image whose file the site holds,
    and the collapsed every-measurement block a table, as on GitHub."""
    from paretolab.results.documents import LEGACY_BANNER

    pictures = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
    seen = {}
    for name, page in _hook().RESULTS.items():
        document = ROOT / "pipelines" / name
        if not document.is_file() or document.read_text(encoding="utf-8").startswith(LEGACY_BANNER):
            continue
        html = (site / "results" / page / "index.html").read_text(encoding="utf-8")
        body = html[html.index("<h1"):]
        assert re.match(r"<h1[^>]*>.*?</h1>\s*<table>\s*<thead>\s*<tr>\s*<th>study</th>", body, re.S), f"results/{page}: no summary first"
        images = re.findall(r'<img[^>]*src="([^"]+)"', body)
        assert len(images) == len(pictures.findall(document.read_text(encoding="utf-8"))), f"results/{page}: a picture became text"
        for src in images:
            assert (site / "results" / page / src).resolve().is_file(), f"results/{page} shows {src}, which the site does not hold"
        for block in re.findall(r"<details[^>]*>(.*?)</details>", body, re.S):
            assert "<summary>Every measurement</summary>" in block and "<table>" in block, f"results/{page}: a collapsed block is no table"
        seen[page] = " ".join(images)
    assert "smollm2_frontier.png" in seen["compression"] and "figures/wanda_vs_magnitude.png" in seen["compression"]
    assert "figures/engines_smollm2.png" in seen["engines"]
    assert "layers/sensitivity_rtn3_layers.png" in seen["layers"] and "layers/sensitivity_rtn3_bands.png" in seen["layers"]


def test_a_picture_that_does_not_exist_is_a_warning_which_fails_the_strict_build(caplog):
    """The hook copies a document's pictures into the site; one it cannot find is a warning of mkdocs' logger, which
    ``--strict`` turns into a failed build (the planted broken picture did fail `mkdocs build --strict`)."""
    import logging

    hook, pictures = _hook(), {}
    with caplog.at_level(logging.WARNING, logger="mkdocs.plugins.paretolab"):
        out = hook._relink("![a](../results/figures/gone.png) and ![b](../results/smollm2_frontier.png)",
                           ROOT / "pipelines" / "README.md", "results/compression.md", pictures)
    assert "shows a picture that does not exist: ../results/figures/gone.png" in caplog.text
    assert caplog.records[0].name.startswith("mkdocs.")  # counted by --strict
    assert out == "![a](../results/figures/gone.png) and ![b](../assets/results/smollm2_frontier.png)"
    assert pictures == {"assets/results/smollm2_frontier.png": ROOT / "results" / "smollm2_frontier.png"}

"""End to end: the committed bundle ``wanda_vs_magnitude`` imported by `paretolab bundle import` into a fresh home,
`paretolab dashboard` serving it, headless Chromium reading the Frontier's Claims panel; the verdicts expected are the
ones `paretolab report` prints for the same home (needs Chromium and Playwright, as tests/dashboard/test_browser.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from paretolab.dashboard.background import STORE_ENV, chromium_page, serve
from paretolab.results.verdicts import verdict_category

BUNDLE = Path(__file__).resolve().parents[2] / "results" / "bundles" / "wanda_vs_magnitude.jsonl.gz"
STUDY = "wanda_vs_magnitude"
CLAIM = "Wanda beats magnitude pruning at the same sparsity"


def cli(*args: str) -> str:
    """`paretolab ARGS` as a user runs it (no store variables: --home alone names the stores); its output."""
    env = {k: v for k, v in os.environ.items() if k not in STORE_ENV}
    done = subprocess.run([str(Path(sys.executable).parent / "paretolab"), *args], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def wanda_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("wanda_home")
    cli("bundle", "import", str(BUNDLE), "--home", str(home))
    return home


@pytest.mark.slow
def test_frontier_shows_the_claims_verdicts_the_report_gives(wanda_home, tmp_path):
    from playwright.sync_api import expect  # ImportError fails the test: pip install playwright

    report = cli("report", STUDY, "--home", str(wanda_home))
    expected = dict(re.findall(r"\*\*Verdict at (\S+): ([^*]+)\*\*", report))
    assert expected == {"sparsity=0.3": "held", "sparsity=0.5": "held", "sparsity=0.7": "held"}, report
    with serve(wanda_home, tmp_path / "dashboard.log") as url, chromium_page(1400, 1000) as page:
        page.goto(f"{url}/?page=Frontier&study={STUDY}", wait_until="domcontentloaded")
        expect(page.get_by_text(f"Frontier · {STUDY}")).to_be_visible(timeout=90_000)
        expect(page.get_by_role("heading", name="Claims")).to_be_visible(timeout=60_000)
        expect(page.get_by_text(CLAIM, exact=True)).to_be_visible()
        for setting, verdict in expected.items():
            line = page.locator('[data-testid="stMarkdownContainer"] p', has_text=f"{setting}:")
            expect(line).to_have_count(1)
            expect(line.locator(".stMarkdownBadge")).to_have_text(verdict_category(verdict))
            expect(line).to_contain_text("ppl wanda ÷ magnitude = ×")
        expect(page.locator(".stMarkdownBadge")).to_have_count(len(expected))  # no other verdict on the page
        # the compared trials ringed on the plot: the three wanda configurations (each its draws' mean) and the three
        # magnitude trials they are paired with
        page.wait_for_function("""() => { const gd = document.querySelector('.js-plotly-plot');
            const ring = gd && gd._fullData && gd._fullData.find(t => t.name === 'claim: held');
            return ring && ring.customdata.length === 6; }""", timeout=60_000)
        page.get_by_role("heading", name="Claims").scroll_into_view_if_needed()
        page.screenshot(path=str(tmp_path / "dashboard-claims.png"), full_page=False)

"""End to end: `paretolab dashboard` on the fixture stores, driven by headless Chromium (Playwright).

Needs Debian's chromium (`apt-get install -y chromium`) and the `playwright` package; it fails,
not skips, when either is missing. Playwright never downloads a browser here: it is pointed at
the system one. Screenshots go to the test's tmp folder; the documentation's pictures are taken
from the demo by `make screenshots` (docs/screenshots.py).
"""

from __future__ import annotations

import re
import time

import pytest

from paretolab.dashboard.background import chromium_page, serve


@pytest.fixture
def dashboard(fixture_home, tmp_path):
    """The real CLI serving the fixture stores on a free loopback port; stopped after the test."""
    with serve(fixture_home, tmp_path / "dashboard.log") as url:
        yield url


@pytest.fixture
def wide_dashboard(wide_home, tmp_path):
    """The same, serving study ``wide`` (ppl from 15 to 2e7)."""
    with serve(wide_home, tmp_path / "dashboard.log") as url:
        yield url


@pytest.mark.slow
def test_frontier_renders_and_a_click_opens_the_trial(dashboard, tmp_path):
    from playwright.sync_api import expect  # ImportError fails the test: pip install playwright

    with chromium_page(1400, 1000) as page:
        page.goto(f"{dashboard}/?page=Frontier&study=demo", wait_until="domcontentloaded")
        expect(page.get_by_text("Frontier · demo")).to_be_visible(timeout=60_000)
        plot = page.locator(".js-plotly-plot").first
        expect(plot).to_be_visible(timeout=60_000)
        # plotly drew the points: one marker per complete trial (10), plus the frontier's own markers
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot .scatterlayer .point').length >= 10", timeout=30_000)
        expect(page.locator(".js-plotly-plot .legendtext", has_text="Pareto frontier")).to_have_count(1)
        time.sleep(1.0)  # let the chart finish its transition before the picture
        shot = tmp_path / "dashboard.png"
        page.screenshot(path=str(shot), full_page=False)
        assert shot.stat().st_size > 10_000

        page.get_by_role("button", name="Trial 4", exact=True).click()
        expect(page.get_by_text("Trial · demo")).to_be_visible(timeout=30_000)
        expect(page.get_by_text("Reproduce")).to_be_visible(timeout=30_000)
        page.wait_for_url(lambda u: "page=Trial" in u and "trial=4" in u, timeout=30_000)  # the view is linkable
        page.screenshot(path=str(tmp_path / "dashboard-trial.png"), full_page=False)


@pytest.mark.slow
def test_curves_page_draws_a_line_per_group_with_its_band(dashboard, tmp_path):
    from playwright.sync_api import expect  # ImportError fails the test: pip install playwright

    with chromium_page(1400, 1000) as page:
        page.goto(f"{dashboard}/?page=Curves&study=training", wait_until="domcontentloaded")
        expect(page.get_by_text("Curves · training")).to_be_visible(timeout=60_000)
        expect(page.locator(".js-plotly-plot").first).to_be_visible(timeout=60_000)
        for name in ("bhyt (3 seeds)", "none (3 seeds)", "dyt (1 seed)"):
            expect(page.locator(".js-plotly-plot .legendtext", has_text=name)).to_have_count(1, timeout=30_000)
        # plotly drew the lines and the filled bands (a band is a filled path between min and max)
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot .scatterlayer .js-line').length >= 3", timeout=30_000)
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot .scatterlayer .js-fill').length >= 2", timeout=30_000)
        page.get_by_text("flops", exact=True).click()
        expect(page.locator(".js-plotly-plot .g-xtitle", has_text="training FLOPs")).to_have_count(1, timeout=30_000)
        page.screenshot(path=str(tmp_path / "dashboard-curves.png"), full_page=False)


# Screen positions from the page: each trace's SVG points (plotly draws SVG below WEBGL_ABOVE points), the axis types,
# and the reference lines as plotly drew them.
READ_PLOT = """() => {
  const gd = document.querySelector('.js-plotly-plot');
  const traces = [...gd.querySelectorAll('.scatterlayer .trace')];
  const xs = name => {
    const i = gd._fullData.findIndex(t => t.name === name);
    return [...traces[i].querySelectorAll('path.point')].map(p => {
      const m = /translate\\(([-\\d.e]+)[ ,]+([-\\d.e]+)\\)/.exec(p.getAttribute('transform'));
      return m ? parseFloat(m[1]) : null;
    });
  };
  const shapes = [...gd.querySelectorAll('.shapelayer path')];
  const pixels = name => {  // a trace's data x values as screen x (the frontier is a line: its points are the methods' markers)
    const t = gd._fullData.find(t => t.name === name), ax = gd._fullLayout.xaxis;
    return [...t.x].map(v => ax.l2p(ax.d2l(v)));
  };
  return {
    xtype: gd._fullLayout.xaxis.type, ytype: gd._fullLayout.yaxis.type,
    frontier: pixels('Pareto frontier'), star: xs('unmodified model'),
    shapes: (gd._fullLayout.shapes || []).map(s => s.name), drawn: shapes.length,
    vline: gd._fullLayout.xaxis.l2p(gd._fullLayout.xaxis.d2l(gd._fullLayout.shapes[0].x0)),
    labels: [...gd.querySelectorAll('.annotation-text')].map(a => a.textContent),
  };
}"""


def open_frontier(page, url: str, study: str, points: int) -> None:
    """The Frontier page of ``study``, once plotly has drawn at least ``points`` markers and finished its transition."""
    from playwright.sync_api import expect  # ImportError fails the test: pip install playwright

    page.goto(f"{url}/?page=Frontier&study={study}", wait_until="domcontentloaded")
    expect(page.get_by_text(f"Frontier · {study}")).to_be_visible(timeout=60_000)
    page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot .scatterlayer .point').length >= {points}", timeout=60_000)
    time.sleep(1.0)  # the chart's transition


@pytest.mark.slow
def test_wide_ppl_gets_a_log_axis_with_distinct_points_and_the_unmodified_model_marked(wide_dashboard, tmp_path):
    """ppl from 15 to 2e7: on a linear axis the frontier's first five points share about one pixel column."""
    with chromium_page(1400, 1000) as page:
        open_frontier(page, wide_dashboard, "wide", points=9)
        plot = page.evaluate(READ_PLOT)
        page.screenshot(path=str(tmp_path / "dashboard-wide.png"), full_page=False)
    assert (plot["xtype"], plot["ytype"]) == ("log", "linear")
    frontier = [round(x) for x in plot["frontier"] if x is not None]
    # linear: ppl 15 to 3,000 within a pixel of each other, 2 distinct columns in all; log: 15 and 15.2 may share one
    assert len(frontier) == 6 and len(set(frontier)) >= 5, f"frontier points at pixel x {frontier}"
    assert plot["shapes"] == ["unmodified model: ppl", "unmodified model: size_bytes"] and plot["drawn"] >= 2
    assert abs(plot["vline"] - plot["star"][0]) < 1.5, "the dashed line runs through the unmodified model's point"
    assert sum(label.startswith("unmodified model") for label in plot["labels"]) == 1, plot["labels"]


# Every text the plot's SVG shows (axis titles, tick labels, annotations, legend, title) with its box on the screen.
READ_TEXTS = """() => {
  const gd = document.querySelector('.js-plotly-plot');
  return [...gd.querySelectorAll('svg text')].filter(t => t.textContent.trim() && t.getBoundingClientRect().width > 0).map(t => {
    const r = t.getBoundingClientRect();
    return {text: t.textContent, cls: t.getAttribute('class') || '', box: [r.left, r.top, r.right, r.bottom]};
  });
}"""


def overlapping(texts: list[dict]) -> list[tuple[str, str]]:
    """Pairs of labels whose boxes overlap by more than a pixel each way."""
    pairs = []
    for i, a in enumerate(texts):
        for b in texts[i + 1:]:
            (l1, t1, r1, b1), (l2, t2, r2, b2) = a["box"], b["box"]
            if min(r1, r2) - max(l1, l2) > 1 and min(b1, b2) - max(t1, t2) > 1:
                pairs.append((a["text"], b["text"]))
    return pairs


def test_overlap_check_sees_two_labels_on_top_of_each_other():
    """The check the browser test relies on: two boxes that share area overlap, neighbours do not."""
    a = {"text": "unmodified model (ppl 20)", "box": [100, 100, 220, 112]}
    assert overlapping([a, {"text": "unmodified model (size_bytes 4e5)", "box": [110, 104, 250, 116]}])
    assert not overlapping([a, {"text": "next", "box": [221, 100, 260, 112]}])


@pytest.mark.slow
def test_frontier_axis_titles_carry_unit_and_direction_and_no_labels_overlap(dashboard, tmp_path):
    with chromium_page(1280, 900) as page:
        open_frontier(page, dashboard, "demo", points=10)
        titles = (page.locator(".js-plotly-plot .g-xtitle").text_content(), page.locator(".js-plotly-plot .g-ytitle").text_content())
        texts = page.evaluate(READ_TEXTS)
        page.screenshot(path=str(tmp_path / "frontier-labels.png"), full_page=False)
    assert set(titles) == {"ppl ↓", "size [MB] ↓"}, titles
    shown = [t["text"] for t in texts]
    assert [t["text"] for t in texts if "annotation" in t["cls"]] == ["unmodified model"], "one label beside the star (and its legend entry)"
    assert not any(re.search(r"\de[+-]?\d", t) for t in shown), f"no exponent notation on the plot: {shown}"
    assert not overlapping(texts), f"labels drawn on top of each other: {overlapping(texts)}"

"""Frontier axes that read: log scale chosen by one rule (page, figure, downloads), the unmodified model marked on both axes."""

from __future__ import annotations

import pytest

from paretolab.dashboard import data
from paretolab.dashboard.plots import (
    frontier_figure,
    frontier_points,
    wants_log,
)
from paretolab.dashboard.static_plot import frontier_image, static_figure
from paretolab.stores import resolve_stores

from .conftest import WIDE_FRONTIER
from .test_app import figure, open_app, texts


@pytest.mark.parametrize("values, log", [
    ([15.0, 21e6], True),                 # the demo's ppl: seven decades
    ([20.0, 400.0], False),               # a factor of 20
    ([1.0, 100.0], False),                # exactly two decades: still linear
    ([0.001, 0.2], True),                 # small numbers span decades too
    ([-5.0, 0.0, 1.0, 50.0], False),      # only the positive values count
    ([float("nan"), 3.0, float("inf"), 1e6], True),
    ([], False),
])
def test_log_scale_when_positive_values_span_more_than_two_decades(values, log):
    assert wants_log(values) is log


def wide_plot(home):
    table = data.load_trials(resolve_stores(home=str(home)).optuna_url, "wide")
    front = table.frontier(["ppl", "size_bytes"], ["minimize", "minimize"])
    assert list(front) == WIDE_FRONTIER
    return frontier_points(table.complete(), front, x="ppl", y="size_bytes", directions=("minimize", "minimize"), param_columns=table.param_columns)


def test_figure_picks_log_for_the_wide_axis_and_draws_the_unmodified_model_on_both(wide_home):
    plot = wide_plot(wide_home)
    fig = frontier_figure(plot)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "linear"  # ppl 15..2e7; size_bytes 30k..400k
    assert frontier_figure(plot, log_x=False).layout.xaxis.type == "linear", "a user's choice wins over the rule"
    lines = {s.name: s for s in fig.layout.shapes}
    x_line, y_line = lines["unmodified model: ppl"], lines["unmodified model: size_bytes"]
    assert (x_line.x0, x_line.x1, x_line.yref, x_line.line.dash) == (15.0, 15.0, "paper", "dash")  # trial 0's ppl, full height
    assert (y_line.y0, y_line.y1, y_line.xref, y_line.line.dash) == (0.4, 0.4, "paper", "dash")  # 400,000 bytes drawn in MB
    labels = [a for a in fig.layout.annotations if a.text.startswith("unmodified model")]
    assert len(labels) == 1, "one label for the unmodified model, beside its star"
    assert labels[0].x == pytest.approx(1.1760913), "an annotation on a log axis sits at log10 of the value"
    assert labels[0].y == pytest.approx(0.4)
    assert (fig.layout.xaxis.title.text, fig.layout.yaxis.title.text) == ("ppl ↓", "size [MB] ↓")


def test_image_export_uses_the_same_rule_and_lines(wide_home):
    plot = wide_plot(wide_home)
    ax = static_figure(plot).axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "linear"
    lines = {line.get_gid(): line for line in ax.get_lines() if line.get_gid()}
    assert list(lines["unmodified-model-x"].get_xdata()) == [15.0, 15.0] and lines["unmodified-model-x"].get_linestyle() == "--"
    assert list(lines["unmodified-model-y"].get_ydata()) == [0.4, 0.4]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("ppl ↓", "size [MB] ↓"), "the download's axis titles are the page's"
    assert not ax.yaxis.get_offset_text().get_text(), "no 1e8-style offset above an axis"
    assert static_figure(plot, log_x=False).axes[0].get_xscale() == "linear"
    # the download is the page: the same legend entries (only what is drawn) and the same tick labels on the log axis
    page = frontier_figure(plot)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [t.name for t in page.data if t.showlegend is not False]
    ticks = ax.xaxis.get_major_formatter().format_ticks(ax.xaxis.get_major_locator()())  # as matplotlib draws them: all at once
    # one notation on the axis: 100k beside 1M (it read 100000 beside 1M)
    assert ticks == list(page.layout.xaxis.ticktext) == ["10", "100", "1k", "10k", "100k", "1M", "10M", "100M"]
    svg = frontier_image(plot, "svg").decode()
    assert 'id="unmodified-model-x"' in svg and 'id="unmodified-model-y"' in svg


def test_page_defaults_to_log_x_and_keeps_a_flip_per_study_and_metric(wide_env):
    at = open_app("Frontier", "wide")
    assert at.toggle(key="flogx").value is True and at.toggle(key="flogy").value is False
    assert figure(at)["layout"]["xaxis"]["type"] == "log"
    assert "star and dashed lines: the unmodified model (trial 0)" in texts(at)
    at.toggle(key="flogx").set_value(False).run()
    assert figure(at)["layout"]["xaxis"]["type"] == "linear"
    at.selectbox(key="fx").set_value("prefill_ms").run()  # another metric on x: its own default (10..18 ms: linear)
    assert at.toggle(key="flogx").value is False
    at.selectbox(key="fx").set_value("ppl").run()
    at.run()
    assert at.toggle(key="flogx").value is False, "the flip of ppl's axis is kept"
    assert figure(at)["layout"]["xaxis"]["type"] == "linear"

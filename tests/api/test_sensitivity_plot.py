"""The sensitivity plot's title fits its figure: a long model name (a hub id, a local folder) or many parameters wrap."""

from __future__ import annotations

import pytest


def _result(model: str, groups: int):
    from paretolab.api.sensitivity import GroupCost, Sensitivity

    costs = [GroupCost(str(i), 7, 15.0 + i, 1.0 + i, 0.5 + i, 1.5 + i, 1e6) for i in range(groups)]
    return Sensitivity(model, "magnitude", {"sparsity": 0.7, "scope": "row", "calib_samples": 128, "calib_seed": 3},
                       "ppl", 14.0, 5.4e8, 16, {"name": "perplexity"}, costs)


@pytest.mark.parametrize("model, groups", [
    ("HuggingFaceTB/SmolLM2-360M-Instruct", 6),  # the narrowest figure: 6 inches
    ("/home/someone/checkpoints/smollm2-135m-distilled-from-smollm2-1.7b-at-step-120000", 30),  # wider, longer still
])
def test_the_title_lies_inside_the_figure(model, groups, tmp_path):
    import matplotlib.pyplot as plt

    from paretolab.api.sensitivity import figure, plot

    fig = figure(_result(model, groups))
    try:
        fig.canvas.draw()
        title = fig.axes[0].title
        box, page = title.get_window_extent(fig.canvas.get_renderer()), fig.bbox
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, (box, page)
        assert "\n" in title.get_text() and title.get_text().startswith(model[:20])  # wrapped, the model named first
    finally:
        plt.close(fig)
    assert [p.name for p in plot(_result(model, groups), tmp_path / "sensitivity")] == ["sensitivity.png", "sensitivity.svg"]

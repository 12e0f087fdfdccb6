"""kvlab.viz.layout on the Python side: what `fit` does to a finished layout (the browser
test, tests/test_browser.py with tests/text_fit.js, checks that the result can be read at
1280 px and on a 390 px phone), and the drop-down widths."""

import json
import shutil
import subprocess

import pytest
from bokeh.layouts import column, row
from bokeh.models import (
    CategoricalAxis,
    Column,
    CustomJSTicker,
    FixedTicker,
    Legend,
    LogAxis,
    NoOverlap,
    Paragraph,
    Plot,
    Row,
    Tabs,
    Title,
)

from kvlab.viz import layout, style
from kvlab.viz.layout import (
    MIN_SIDE_BY_SIDE_PX,
    MOST_CONTROL_PX,
    OPTION_PADDING_PX,
    control_width,
    fit,
    text_px,
)


def _figure(title="A title", legend="inside", **kw):
    fig = style.new_figure(title, "x", "y", **kw)
    fig.line([1, 2], [3, 4], legend_label="a line")
    if legend == "below":
        fig.add_layout(fig.legend[0], "below")
    return fig


def test_a_legend_inside_the_plot_moves_below_it_and_wraps():
    fig = _figure()
    assert any(isinstance(r, Legend) for r in fig.center)
    fit(fig)
    assert not any(isinstance(r, Legend) for r in fig.center)  # never over the data
    (legend,) = [r for r in fig.below if isinstance(r, Legend)]
    assert legend.border_line_alpha == 0 and legend.background_fill_alpha == 0
    assert any("flex-wrap: wrap" in s.css for s in legend.stylesheets)


def test_a_title_becomes_page_text_that_follows_the_plot_title():
    fig = _figure("Time per step (ceiling × 100%)")
    out = fit(column(fig))
    (text,) = out.select({"type": Paragraph})
    assert text.text == "Time per step (ceiling × 100%)"
    assert fig.title.visible is False  # drawn once, as text that wraps
    # a panel that retitles the figure (its Title model) retitles the text in the page
    links = fig.title.js_property_callbacks["change:text"]
    assert links and "text" in links[0].code


def test_the_plotting_area_keeps_its_height_and_everything_stretches():
    fig = _figure(height=320)
    tabs = Tabs(tabs=[])
    out = fit(column(row(_figure(width=330), _figure(width=330)), fig, tabs))
    assert fig.frame_height == 320 - layout.X_AXIS_PX
    for model in out.select({"type": Plot}):
        assert model.sizing_mode == "stretch_width"
    for kind in (Row, Column, Tabs):
        for model in out.select({"type": kind}):
            assert model.sizing_mode == "stretch_width"


def test_figures_side_by_side_wrap_when_the_column_is_narrow():
    out = fit(row(_figure(width=330), _figure(width=330)))
    (pair,) = out.select({"type": Row})
    assert pair.styles["flex-wrap"] == "wrap"
    # two fit a 688 px column, one a 358 px phone column
    assert 2 * MIN_SIDE_BY_SIDE_PX < 688 and 2 * MIN_SIDE_BY_SIDE_PX > 358
    assert all(child.min_width == MIN_SIDE_BY_SIDE_PX for child in pair.children)


def test_overlapping_numeric_tick_labels_are_dropped_but_never_category_names():
    numbers = _figure(y_axis_type="log")
    bars = style.new_figure("Bars", "", "", y_range=["memory", "compute"])
    fit(column(numbers, bars))
    assert isinstance(numbers.select_one({"type": LogAxis}).major_label_policy, NoOverlap)
    categories = bars.select_one({"type": CategoricalAxis})
    assert not isinstance(categories.major_label_policy, NoOverlap)


def test_text_width_counts_cjk_characters_about_twice():
    assert text_px("ab") == pytest.approx(2 * layout.OPTION_LATIN_PX)
    assert text_px("草稿") == pytest.approx(2 * layout.OPTION_WIDE_PX)
    assert text_px("草稿") > 1.8 * text_px("ab")


def test_a_drop_down_is_as_wide_as_its_longest_option_within_a_phone_column():
    assert control_width(["fp16", "bf16"], 216) == 216  # short labels: the house width
    long = "DeepSeek-V3 (fp8), 8 H200s (TP8), MTP head"  # 277 px in Chromium's 13 px sans
    width = control_width([long], 216)
    assert width >= 277 + 34 and width % 4 == 0  # 34 px: a select's padding and arrow
    assert width == 4 * -(-(text_px(long) + OPTION_PADDING_PX) // 4)
    assert control_width(["x" * 200], 216) == MOST_CONTROL_PX <= 358


def test_log_axes_are_ticked_at_one_two_five_of_each_decade():
    fig = _figure(y_axis_type="log")
    fit(fig)
    axis = fig.select_one({"type": LogAxis})
    assert isinstance(axis.ticker, CustomJSTicker)
    grid = fig.ygrid[0]  # its grid lines follow the labels: the axis's ticker, or none
    assert grid.ticker is axis.ticker or (grid.ticker is None and grid.axis is axis)


def test_a_log_axis_ticked_on_purpose_keeps_its_ticks():
    fig = _figure(x_axis_type="log")
    fig.xaxis.ticker = FixedTicker(ticks=[512, 1024, 2048])  # say, the measured contexts
    fit(fig)
    assert fig.xaxis[0].ticker.ticks == [512, 1024, 2048]


NODE = shutil.which("node")


@pytest.mark.skipif(NODE is None, reason="node (Node.js) is not installed")
@pytest.mark.parametrize(
    "start, end, ticks",
    [
        (0.0048, 0.142, [0.005, 0.01, 0.02, 0.05, 0.1]),  # 4.8 ms to 142 ms: the low end too
        (1, 1024, [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]),
        (0.5, 0.95, [0.5, 0.6, 0.7, 0.8, 0.9]),  # under a decade: 1 to 9
        (1e2, 1e16, [1e2, 1e4, 1e6, 1e8, 1e10, 1e12, 1e14, 1e16]),  # many: every other
    ],
)
def test_log_ticks_under_node(start, end, ticks):
    code = f"const f = new Function('cb_data', {json.dumps(layout.LOG_TICKS_JS)});\n"
    code += f"console.log(JSON.stringify(f({{start: {start}, end: {end}}})));"
    out = subprocess.run([NODE, "-e", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == pytest.approx(ticks, rel=1e-12)


def test_a_caption_below_the_plot_becomes_page_text_that_wraps():
    fig = _figure()
    fig.add_layout(Title(text="Data: a long source line", text_font_style="italic"), "below")
    out = fit(fig)
    first, plot, last = out.children  # the title above the plot, the caption below it
    assert (first.text, plot, last.text) == ("A title", fig, "Data: a long source line")
    assert not any(isinstance(r, Title) for r in fig.below)

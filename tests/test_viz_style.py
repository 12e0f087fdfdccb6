"""The figure recipes of kvlab.viz.style: each step does what the builders relied on when
they spelled it out (the figures' JSON was compared before and after the recipes)."""

from __future__ import annotations

import pytest

from kvlab.viz import style


def _models():
    from bokeh.models import ColumnDataSource, CustomJSTickFormatter, HoverTool

    return ColumnDataSource, CustomJSTickFormatter, HoverTool


def test_ticks_by_name_by_unit_or_as_given():
    assert "K.fixed(tick, 0)" in style.ticks("count").code
    assert "KVLAB.seconds" in style.ticks("seconds").code
    assert "KVLAB.percent" in style.ticks("percent").code
    assert style.ticks("B/s").code == "return window.KVLAB.si(tick, 'B/s', 2);"
    given = _models()[1](code="return tick;")
    assert style.ticks(given) is given


def test_chart_sets_the_log_axes_it_names():
    fig = style.chart("t", "x", "y", "xy")
    assert (fig.x_scale.__class__.__name__, fig.y_scale.__class__.__name__) == (
        "LogScale",
        "LogScale",
    )
    assert style.chart("t", "x", "y", "y").x_scale.__class__.__name__ == "LinearScale"


def test_line_house_width_and_shorthands():
    fig = style.new_figure("t", "x", "y")
    r = style.line(fig, "a", "b", dash="dashed", legend="curve")
    assert r.glyph.line_width == 2.5 and r.glyph.line_color == style.BLUE
    assert r.glyph.line_dash == [6]  # bokeh's "dashed"
    assert [item.label["value"] for item in fig.legend[0].items] == ["curve"]
    thin = style.line(fig, [1, 2], [3, 4], None, style.GREY, None)
    assert thin.glyph.line_width == 1  # bokeh's own


def test_finish_formats_places_the_legend_and_hovers_the_given_renderers():
    fig = style.new_figure("t", "x", "y")
    a = style.line(fig, "a", "b", legend="one")
    style.line(fig, "a", "c", legend="two")
    style.finish(
        fig, x="count", y="B", legend="top_left", legend_px="10px", tips=[("a", "@a")], on=[a]
    )
    assert fig.legend[0].location == "top_left"
    assert fig.legend[0].label_text_font_size == "10px"
    hovers = [t for t in fig.tools if isinstance(t, _models()[2])]
    assert len(hovers) == 1 and hovers[0].renderers == [a]
    assert "'B'" in fig.yaxis[0].formatter.code


def test_legend_below_grows_the_figure_a_row_per_two_entries():
    fig = style.new_figure("t", "x", "y", height=300)
    for i in range(5):
        style.line(fig, "a", "b", legend=f"series {i}")
    style.legend_below(fig)
    assert fig.height == 300 + 72  # 3 rows of two columns, 24 px each, in every chapter
    assert fig.legend[0] in fig.below and fig.legend[0] not in fig.center


def test_ticks_125_covers_the_range_at_1_2_5():
    assert style.ticks_125(1.0, 100.0).ticks == [1, 2, 5, 10, 20, 50, 100]
    assert style.ticks_125(3e-3, 3e-2).ticks == pytest.approx([5e-3, 1e-2, 2e-2])


def test_bars_start_at_zero_over_the_categories():
    source = _models()[0]({"kind": ["a", "b"], "value": [1, 2], "color": ["red", "blue"]})
    fig = style.bars("t", "y", ("a", "b"), "kind", "value", source, y="seconds")
    assert list(fig.x_range.factors) == ["a", "b"] and fig.y_range.start == 0
    assert "KVLAB.seconds" in fig.yaxis[0].formatter.code


def test_stacked_bars_one_legend_entry_per_column_and_a_hover_over_the_stack():
    stack = {"w": (style.WEIGHTS, "weights"), "kv": (style.KV_READ, "KV")}
    source = _models()[0]({"y": ["step"], "w": [1.0], "kv": [2.0]})
    fig = style.stacked_bars(
        "t", "bytes", ("step",), "y", stack, source, x="B", tips=[("w", "@w")], legend_side="below"
    )
    assert [item.label["value"] for item in fig.legend[0].items] == ["weights", "KV"]
    assert fig.legend[0] in fig.below and fig.legend[0].orientation == "horizontal"
    hover = next(t for t in fig.tools if isinstance(t, _models()[2]))
    assert len(hover.renderers) == 2

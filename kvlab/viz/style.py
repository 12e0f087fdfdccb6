"""House style for figures: a colour-blind-safe palette, readable axes, SI tick labels."""

from __future__ import annotations

from bokeh.models import CustomJSTickFormatter, DataRange1d, HoverTool
from bokeh.plotting import figure

# Okabe & Ito (2008), safe for the common colour-vision deficiencies.
BLUE, ORANGE, GREEN, VERMILION = "#0072B2", "#E69F00", "#009E73", "#D55E00"
SKY, PURPLE, YELLOW, GREY = "#56B4E9", "#CC79A7", "#F0E442", "#999999"
PALETTE = (BLUE, ORANGE, GREEN, VERMILION, SKY, PURPLE, YELLOW, GREY)
WEIGHTS, KV_READ, KV_WRITE = BLUE, ORANGE, GREEN  # one colour per kind of byte, every chapter

WIDTH = 680  # fits the book theme's article column
HEIGHT = 320


def new_figure(title: str, x_label: str, y_label: str, **kwargs):
    """A figure with labelled axes and a compact toolbar."""
    kwargs.setdefault("width", WIDTH)
    kwargs.setdefault("height", HEIGHT)
    kwargs.setdefault("tools", "pan,wheel_zoom,box_zoom,reset,save")
    kwargs.setdefault("toolbar_location", "right")
    fig = figure(title=title, **kwargs)
    fig.xaxis.axis_label = x_label
    fig.yaxis.axis_label = y_label
    fig.title.text_font_size = "13px"
    for axis in (fig.xaxis, fig.yaxis):
        axis.axis_label_text_font_size = "12px"
        axis.axis_label_text_font_style = "normal"
        axis.major_label_text_font_size = "11px"
    fig.toolbar.logo = None
    fig.background_fill_color = "#fbfbfb"
    return fig


def si_ticks(unit: str) -> CustomJSTickFormatter:
    """Tick labels such as '14 GB' or '4.8 TB/s' (kvlab.fmt.si in the browser)."""
    return CustomJSTickFormatter(code=f"return window.KVLAB.si(tick, {unit!r}, 2);")


def seconds_ticks() -> CustomJSTickFormatter:
    return CustomJSTickFormatter(code="return window.KVLAB.seconds(tick, 2);")


def count_ticks() -> CustomJSTickFormatter:
    """Whole-number ticks with separators: 1, 1,024, 131,072."""
    return CustomJSTickFormatter(
        code="const K = window.KVLAB; return tick >= 1 ? K.fixed(tick, 0) : K.sig(tick, 1);"
    )


def hover(fig, rows: list[tuple[str, str]], renderers=None, mode: str = "mouse") -> None:
    """Hover tooltips showing exact values (rows of (label, '@column{format}'))."""
    tool = HoverTool(tooltips=rows, mode=mode)
    if renderers is not None:
        tool.renderers = renderers
    fig.add_tools(tool)


def from_zero():
    """An auto range that always starts at zero (bars must not start elsewhere)."""
    return DataRange1d(start=0)


def percent_ticks() -> CustomJSTickFormatter:
    return CustomJSTickFormatter(
        code="return window.KVLAB ? window.KVLAB.percent(tick, 2) : (100 * tick) + '%';"
    )

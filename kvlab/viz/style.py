"""House style for figures: a colour-blind-safe palette, readable axes, SI tick labels."""

from __future__ import annotations

import numpy as np
from bokeh.models import CustomJSTickFormatter, DataRange1d, FixedTicker, HoverTool
from bokeh.plotting import figure

# Okabe & Ito (2008), safe for the common colour-vision deficiencies.
BLUE, ORANGE, GREEN, VERMILION = "#0072B2", "#E69F00", "#009E73", "#D55E00"
SKY, PURPLE, YELLOW, GREY = "#56B4E9", "#CC79A7", "#F0E442", "#999999"
PALETTE = (BLUE, ORANGE, GREEN, VERMILION, SKY, PURPLE, YELLOW, GREY)
WEIGHTS, KV_READ, KV_WRITE = BLUE, ORANGE, GREEN  # one colour per kind of byte, every chapter
#: One colour per serving design, in every chapter that compares them (4 and 6).
ARCH_COLORS = {"colocated": GREY, "disaggregated": ORANGE, "kv-centric": BLUE}

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


# --------------------------------------------------------------------- recipes
# Most figures are the same few steps: a new figure, its glyphs in the house widths and
# colours, tick formatters, the legend's place and size, a hover. The recipes below say
# each step once; a builder lists only what differs (kwargs pass through to bokeh as is).

#: Tick formatters by name; any other string is an SI unit ("B", "B/s", "FLOP/s").
TICKS = {"count": count_ticks, "seconds": seconds_ticks, "percent": percent_ticks}


def ticks(kind):
    """A tick formatter: by name (TICKS), by SI unit, or a formatter model as it is."""
    if not isinstance(kind, str):
        return kind
    return TICKS[kind]() if kind in TICKS else si_ticks(kind)


def chart(title: str, x_label: str, y_label: str, log: str = "", **kwargs):
    """new_figure with log axes named in `log` ("x", "y" or "xy")."""
    for axis in log:
        kwargs[f"{axis}_axis_type"] = "log"
    return new_figure(title, x_label, y_label, **kwargs)


def line(fig, x, y, source=None, color=BLUE, width: float | None = 2.5, **kwargs):
    """A curve in the house width (2.5 px; None: bokeh's own); `dash` for line_dash,
    `legend` for legend_label, `field` for legend_field."""
    for short, name in (
        ("dash", "line_dash"),
        ("legend", "legend_label"),
        ("field", "legend_field"),
    ):
        if short in kwargs:
            kwargs[name] = kwargs.pop(short)
    if source is not None:
        kwargs["source"] = source
    if width is not None:
        kwargs["width"] = width
    return fig.line(x, y, color=color, **kwargs)


def dot(fig, x, y, source, color=VERMILION, size=11, **kwargs):
    """A filled marker at one point (the knee, the budget's batch)."""
    return fig.scatter(x, y, source=source, size=size, color=color, **kwargs)


def ring(fig, x, y, source, size=12, color="black", width=2, **kwargs):
    """An open circle around one point: "this step", "the chosen batch"."""
    return fig.scatter(
        x,
        y,
        source=source,
        size=size,
        fill_color=None,
        line_color=color,
        line_width=width,
        **kwargs,
    )


def finish(  # noqa: PLR0913 - the steps a figure ends with, keyword-only
    fig,
    *,
    x=None,
    y=None,
    legend: str | None = None,
    legend_px: str | None = None,
    tips=None,
    on=None,
    mode: str = "mouse",
):
    """The last steps of most figures: tick formatters (`ticks`) for x and y, the legend's
    location and label size, a hover with `tips` over the renderers `on`."""
    if x is not None:
        fig.xaxis.formatter = ticks(x)
    if y is not None:
        fig.yaxis.formatter = ticks(y)
    if legend is not None:
        fig.legend.location = legend
    if legend_px is not None:
        fig.legend.label_text_font_size = legend_px
    if tips is not None:
        hover(fig, tips, on, mode=mode)
    return fig


#: A legend row under a plot: a 20 px glyph and its spacing (10 px labels); one height in
#: every chapter, so that a legend of n rows grows its figure alike everywhere.
LEGEND_ROW_PX = 24


def legend_below(fig, columns: int = 2, row_px: int = LEGEND_ROW_PX):
    """Many series: the legend under the plot in `columns` columns, never over the data;
    the figure grows by a row's height per row of entries."""
    legend = fig.legend[0]
    legend.ncols = columns
    legend.label_text_font_size = "10px"
    fig.center = [r for r in fig.center if r is not legend]
    fig.add_layout(legend, "below")
    fig.height += row_px * ((len(legend.items) + columns - 1) // columns)


def ticks_125(lo: float, hi: float):
    """Log-axis ticks at 1, 2 and 5 x 10^k inside [lo, hi]: bokeh's own label every minor
    tick of a range under two decades, and the labels run into each other."""
    decades = range(int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi))) + 1)
    return FixedTicker(
        ticks=[m * 10.0**e for e in decades for m in (1, 2, 5) if lo <= m * 10.0**e <= hi]
    )


def bars(  # noqa: PLR0913 - a bar chart's parts; the figure's own options pass through
    title: str,
    y_label: str,
    categories,
    x: str,
    top: str,
    source,
    color: str = "color",
    bar_width: float = 0.6,
    y=None,
    **kwargs,
):
    """Vertical bars over named categories (x) from zero: `top` of each from `source`,
    coloured by the column (or colour) `color`, y ticks `y` (see `ticks`)."""
    fig = new_figure(title, "", y_label, x_range=list(categories), y_range=from_zero(), **kwargs)
    fig.vbar(x=x, top=top, width=bar_width, color=color, source=source)
    return finish(fig, y=y)


def stacked_bars(  # noqa: PLR0913 - a stacked bar chart's parts; figure options pass through
    title: str,
    x_label: str,
    categories,
    y: str,
    stack: dict,
    source,
    x=None,
    legend_side: str = "above",
    bar_height: float = 0.6,
    tips=None,
    **kwargs,
):
    """Horizontal bars from zero, one per category (y), each a stack of `stack`'s columns
    ({column: (colour, legend label)}), the legend one row above or below the plot, a
    hover with `tips` over the stack."""
    fig = new_figure(title, x_label, "", y_range=list(categories), x_range=from_zero(), **kwargs)
    renderers = fig.hbar_stack(
        list(stack),
        y=y,
        height=bar_height,
        source=source,
        color=[color for color, _ in stack.values()],
        legend_label=[label for _, label in stack.values()],
    )
    finish(fig, x=x, tips=tips, on=renderers)
    fig.legend.orientation = "horizontal"
    fig.add_layout(fig.legend[0], legend_side)
    return fig

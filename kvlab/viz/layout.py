"""Figures and panels that fit the page's text column at the widths readers use: the book
theme's column at 1280 px (688 px) down to a 390 px phone (358 px).

Why one pass over finished layouts rather than rules in every figure: a dozen modules
draw figures, and the same rules hold for all of them.

- every figure, row, column and tab stretches to the column's width; the plotting area
  keeps the height its figure asked for (a legend's rows add to the figure's height);
- figures side by side wrap below one another when the column has no room for both;
- a figure's title is a line of page text above it (not canvas text), so it wraps at any
  width and in either language; a panel that retitles a figure still sets its bokeh
  Title, which the text follows (js_link);
- legends sit below the plot, never over the data, and wrap their entries to its width;
- tick labels that would overlap are dropped (category names are never dropped);
- a drop-down is as wide as its longest option (`control_width`).

tests/test_browser.py checks the result in Chromium at both widths (tests/text_fit.js).
"""

from __future__ import annotations

import math

#: The narrowest a figure side by side may get before its row wraps.
MIN_SIDE_BY_SIDE_PX = 300
#: A drop-down's option text (13 px regular): advance of a Latin and of a CJK (or
#: full-width) character, room taken by the select's padding and arrow, and the widest
#: control a phone's column (358 px) takes.
OPTION_LATIN_PX, OPTION_WIDE_PX, OPTION_PADDING_PX, MOST_CONTROL_PX = 7.2, 13.5, 40, 350
#: Height of a plot's x axis (ticks and label), of a legend's row beside the plot and of a
#: caption line (a Title below it), as the figures were drawn: what the plotting area
#: had around it.
X_AXIS_PX, LEGEND_ROW_PX, CAPTION_PX = 50, 22, 14
#: Legend entries flow left to right and wrap at the plot's width, a long label (or title)
#: within its line; no box is drawn around a legend outside the plot.
LEGEND_CSS = """
:host { max-width: 100%; }
.bk-grid { display: flex; flex-wrap: wrap; width: auto; column-gap: 12px; row-gap: 2px; }
.bk-item { max-width: 100%; }
.bk-item .bk-label { white-space: normal; flex: 0 1 auto; }
.bk-title { white-space: normal; }
"""
#: A figure's title as page text: the house style's 13 px bold (kvlab.viz.style).
TITLE_STYLES = {
    "font-size": "13px",
    "font-weight": "bold",
    "color": "#444444",
    "margin": "4px 0 0 0",
    "line-height": "1.3",
}


ROW_STYLES = {"flex-wrap": "wrap", "column-gap": "8px", "row-gap": "8px"}
#: Log-axis ticks at 1, 2 and 5 of every decade the range covers (1 to 9 where that gives
#: fewer than three, every decade's 1 where there are many): bokeh's LogTicker turns
#: linear on ranges under two decades and leaves the low end of such an axis unlabelled.
LOG_TICKS_JS = """
const lo = Math.min(cb_data.start, cb_data.end), hi = Math.max(cb_data.start, cb_data.end);
if (!(lo > 0) || !isFinite(hi)) return [];
function ticks(mantissas, every) {
  const out = [];
  for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e += 1) {
    if (e % every !== 0) continue;
    for (const m of mantissas) {
      const t = m * Math.pow(10, e);
      if (t >= lo * (1 - 1e-9) && t <= hi * (1 + 1e-9)) out.push(t);
    }
  }
  return out;
}
let out = ticks([1, 2, 5], 1);
if (out.length < 3) out = ticks([1, 2, 3, 4, 5, 6, 7, 8, 9], 1);
for (let every = 1; out.length > 10; every += 1) out = ticks([1], every);
return out;
"""
LOG_MINOR_TICKS_JS = """
const lo = Math.min(cb_data.start, cb_data.end), hi = Math.max(cb_data.start, cb_data.end);
if (!(lo > 0) || !isFinite(hi) || Math.log10(hi / lo) > 8) return [];
const out = [];
for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e += 1) {
  for (let m = 1; m < 10; m += 1) {
    const t = m * Math.pow(10, e);
    if (t >= lo && t <= hi) out.push(t);
  }
}
return out;
"""


def _wide(ch: str) -> bool:
    return "\u2e80" <= ch <= "\u9fff" or "\uac00" <= ch <= "\ud7af" or "\uff00" <= ch <= "\uffef"


def text_px(text: str) -> float:
    """Estimated width of `text` in a 13 px drop-down (CJK characters about twice Latin)."""
    return sum(OPTION_WIDE_PX if _wide(ch) else OPTION_LATIN_PX for ch in text)


def control_width(labels, least_px: int, most_px: int = MOST_CONTROL_PX) -> int:
    """Width of a drop-down whose every option label shows whole (estimated generously,
    plus padding and arrow), at least `least_px`, at most `most_px` (a phone's column)."""
    need = max((text_px(label) for label in labels), default=0.0)
    return int(min(max(least_px, 4 * math.ceil((need + OPTION_PADDING_PX) / 4)), most_px))


def fit(layout):
    """`layout` made to fit any text column (see the module docstring); returns the layout
    to embed, which may be a new column around `layout`. Run it after the layout's texts
    are in the edition's language (i18n.localize). The models it adds (ticker, label
    policy, legend style) are shared by every plot of the layout: a page carries each once."""
    from bokeh.models import (
        CategoricalAxis,
        Column,
        CustomJSTicker,
        InlineStyleSheet,
        LogAxis,
        LogTicker,
        NoOverlap,
        Plot,
        Row,
        Tabs,
    )

    no_overlap, legend_css = NoOverlap(), InlineStyleSheet(css=LEGEND_CSS)
    log_ticks = CustomJSTicker(major_code=LOG_TICKS_JS, minor_code=LOG_MINOR_TICKS_JS)
    for plot in layout.select({"type": Plot}):
        _fit_plot(plot, legend_css)
        for axis in (*plot.below, *plot.above, *plot.left, *plot.right):
            if hasattr(axis, "major_label_policy") and not isinstance(axis, CategoricalAxis):
                axis.major_label_policy = no_overlap
            if isinstance(axis, LogAxis) and type(axis.ticker) is LogTicker:  # not one chosen
                _retick(plot, axis, log_ticks)
    layout = _titled(layout)
    for model in layout.select({"type": Row}):
        model.sizing_mode = "stretch_width"
        model.styles = {**ROW_STYLES, **dict(model.styles or {})}
        for child in model.children:
            if isinstance(child, (Plot, Column)):
                child.min_width = MIN_SIDE_BY_SIDE_PX
    for kind in (Column, Tabs):
        for model in layout.select({"type": kind}):
            model.sizing_mode = "stretch_width"
    return layout


def _retick(plot, axis, ticker) -> None:
    """The axis, and grid lines that follow its ticker, ticked by `ticker`."""
    from bokeh.models import Grid

    old, axis.ticker = axis.ticker, ticker
    for grid in plot.select({"type": Grid}):
        if grid.ticker is old:
            grid.ticker = ticker


def _fit_plot(plot, legend_css) -> None:
    from bokeh.models import Legend, Title

    # the plotting area the figure had: its height less the x axis and what sat beside it
    beside = sum(
        _legend_rows(r) * LEGEND_ROW_PX for r in (*plot.below, *plot.above) if isinstance(r, Legend)
    )
    beside += CAPTION_PX * sum(isinstance(r, Title) for r in (*plot.below, *plot.above))
    for legend in [r for r in plot.center if isinstance(r, Legend)]:
        plot.center = [r for r in plot.center if r is not legend]
        plot.add_layout(legend, "below")
    for legend in [r for r in (*plot.below, *plot.above) if isinstance(r, Legend)]:
        legend.orientation = "horizontal"
        legend.location = "left"
        legend.border_line_alpha = 0
        legend.background_fill_alpha = 0
        legend.label_text_font_size = "11px"
        legend.stylesheets = [*legend.stylesheets, legend_css]
    if plot.height and plot.frame_height is None:
        # fixed (its title, now page text, makes room for it): a legend adds its rows
        plot.frame_height = max(60, plot.height - X_AXIS_PX - beside)
    plot.sizing_mode = "stretch_width"


def _legend_rows(legend) -> int:
    """Rows a legend beside the plot took as its figure was drawn (an estimate)."""
    items = max(len(legend.items), 1)
    if isinstance(legend.ncols, int):
        return -(-items // legend.ncols)
    return 1 if legend.orientation == "horizontal" else items


def _titled(model):
    """Each titled plot in `model` as column(its title, the plot, its captions), the title
    and the captions (Titles below the plot) as page text."""
    from bokeh.layouts import column
    from bokeh.models import Column, Paragraph, Plot, Row, Tabs, Title

    if isinstance(model, Plot):
        parts = [model]
        title = model.title
        if title is not None and getattr(title, "text", "") and title.visible:
            text = Paragraph(text=title.text, styles=TITLE_STYLES, sizing_mode="stretch_width")
            title.js_link("text", text, "text")  # a panel that retitles the plot retitles this
            title.visible = False
            parts.insert(0, text)
        for caption in [r for r in model.below if isinstance(r, Title)]:
            model.below = [r for r in model.below if r is not caption]
            parts.append(
                Paragraph(
                    text=caption.text, styles=_caption_styles(caption), sizing_mode="stretch_width"
                )
            )
        return column(*parts, spacing=0) if len(parts) > 1 else model
    if isinstance(model, (Row, Column)):
        model.children = [_titled(child) for child in model.children]
    elif isinstance(model, Tabs):
        for tab in model.tabs:
            tab.child = _titled(tab.child)
    return model


def _caption_styles(title) -> dict:
    """A caption's look as page text: its Title's size, slant and colour."""
    return {
        "font-size": str(title.text_font_size),
        "font-style": str(title.text_font_style),
        "color": str(title.text_color),
        "margin": "2px 0 0 0",
        "line-height": "1.3",
    }

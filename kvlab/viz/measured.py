"""Figures of published GPU kernel measurements (the measured chapter): what real kernels
reach on each GPU, and the ledger against them. Pure: each takes the data that
kvlab.book.gpu_tables computed; every figure names its source in a note under the plot."""

from __future__ import annotations

import numpy as np

from . import style

#: The share of peak bandwidth the article says real code reaches (section 2.1).
BAND = (0.60, 0.85)
DASHES = ("solid", "dashed", "dotted", "dotdash")


def _legend_below(fig, columns: int = 2):
    """The legend under the plot, never over the data."""
    legend = fig.legend[0]
    legend.ncols = columns
    legend.label_text_font_size = "10px"
    fig.center = [r for r in fig.center if r is not legend]
    fig.add_layout(legend, "below")
    fig.height += 22 * ((len(legend.items) + columns - 1) // columns)


def _source_note(fig, sources: list[str]):
    """Name the tables behind the figure, under it, one line per source (never cut short)."""
    from bokeh.models import Title

    for i, line in enumerate(sources):
        fig.add_layout(
            Title(
                text=("Data: " if i == 0 else "") + line,
                text_font_size="10px",
                text_font_style="italic",
                text_color=style.GREY,
            ),
            "below",
        )
    fig.height += 14 * len(sources)


def _ticks_125(lo: float, hi: float):
    """Log-axis ticks at 1, 2 and 5 x 10^k inside [lo, hi] (bokeh's own leave gaps)."""
    from bokeh.models import FixedTicker

    decades = range(int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi))) + 1)
    return FixedTicker(
        ticks=[m * 10.0**e for e in decades for m in (1, 2, 5) if lo <= m * 10.0**e <= hi]
    )


def _band(fig, x_range):
    from bokeh.models import BoxAnnotation

    fig.add_layout(
        BoxAnnotation(bottom=BAND[0], top=BAND[1], fill_color=style.GREY, fill_alpha=0.12)
    )
    fig.line(
        list(x_range),
        [BAND[0]] * 2,
        color=style.GREY,
        line_dash="dashed",
        legend_label=f"the article's {BAND[0]:.0%}–{BAND[1]:.0%} of peak",
    )


def gemv_band_figure(bands: list[dict], names: dict, sources: list[str]):
    """Achieved bandwidth of one-token GEMMs (m = 1) against their weight bytes, per GPU,
    as a share of the data-sheet bandwidth."""
    lo = min(float(b["weight_bytes"].min()) for b in bands)
    hi = max(float(b["weight_bytes"].max()) for b in bands)
    top = max(1.5, 1.05 * max(float(b["fraction_of_sheet"].max()) for b in bands))
    fig = style.new_figure(
        "One token through a weight matrix: share of the sheet bandwidth",
        "weight bytes of the matrix",
        "achieved / sheet bandwidth",
        x_axis_type="log",
        y_range=(0, top),
        height=360,
    )
    _band(fig, (lo, hi))
    fig.line([lo, hi], [1.0, 1.0], color="black", width=1, legend_label="the data sheet")
    for i, b in enumerate(bands):
        color = style.PALETTE[i % len(style.PALETTE)]
        fig.scatter(
            b["weight_bytes"],
            b["fraction_of_sheet"],
            size=6,
            color=color,
            alpha=0.8,
            legend_label=names[b["device"]],
        )
    fig.xaxis.formatter = style.si_ticks("B")
    fig.xaxis.ticker = _ticks_125(lo, hi)
    fig.yaxis.formatter = style.percent_ticks()
    _legend_below(fig)
    _source_note(fig, sources)
    return fig


def gemm_batch_figure(curves: list[dict], names: dict, sources: list[str], nk: tuple[int, int]):
    """One projection GEMM over the tokens it multiplies: the ledger's ceiling time over
    the measured time (1 = the ceiling), per GPU."""
    fig = style.new_figure(
        f"A {nk[1]:,} x {nk[0]:,} weight matrix over the batch: ceiling / measured",
        "tokens multiplied at once (m)",
        "ceiling time / measured time",
        x_axis_type="log",
        y_range=(0, 1.1),
        height=340,
    )
    for i, c in enumerate(curves):
        fig.line(
            c["m"],
            c["efficiency"],
            color=style.PALETTE[i % len(style.PALETTE)],
            width=2.5,
            legend_label=names[c["device"]],
        )
    fig.xaxis.formatter = style.count_ticks()
    fig.yaxis.formatter = style.percent_ticks()
    _legend_below(fig)
    _source_note(fig, sources)
    return fig


def attention_figure(
    curves: list[dict], names: dict, sources: list[str], layout: tuple[int, int, int]
):
    """Decode attention of one layer: KV bytes read per second over the tokens in the cache,
    as a share of the sheet bandwidth, per GPU and batch (line style)."""
    heads, kv, dim = layout
    top = max(float(np.max(c["fraction_of_sheet"])) for c in curves)
    fig = style.new_figure(
        f"Decode attention ({heads} query heads, {kv} K/V heads of {dim}): KV read per second",
        "tokens in the cache per sequence",
        "KV bytes per second / sheet bandwidth",
        x_axis_type="log",
        y_range=(0, max(1.2, 1.05 * top)),
        height=380,
    )
    x = [
        min(float(c["tokens"].min()) for c in curves),
        max(float(c["tokens"].max()) for c in curves),
    ]
    fig.line(x, [1.0, 1.0], color="black", width=1, legend_label="the data sheet")
    devices = list(dict.fromkeys(c["device"] for c in curves))
    batches = list(dict.fromkeys(c["batch"] for c in curves))
    for c in curves:
        color = style.PALETTE[devices.index(c["device"]) % len(style.PALETTE)]
        fig.line(
            c["tokens"],
            c["fraction_of_sheet"],
            color=color,
            width=2,
            line_dash=DASHES[batches.index(c["batch"]) % len(DASHES)],
            legend_label=f"{names[c['device']]}, batch {c['batch']}",
        )
    fig.xaxis.formatter = style.count_ticks()
    fig.yaxis.formatter = style.percent_ticks()
    _legend_below(fig)
    _source_note(fig, sources)
    return fig


def ledger_figure(curves: list[dict], names: dict, sources: list[str], model_name: str):
    """A decode step in measured mode over its ceiling, against the batch, per GPU."""
    first = curves[0]
    fig = style.new_figure(
        f"Decode step of {model_name} at {first['context']:,} tokens: measured / ceiling",
        "batch (sequences)",
        "measured step time / ceiling",
        x_axis_type="log",
        y_range=(0.9, max(2.0, 1.05 * max(float(np.max(c["ratio"])) for c in curves))),
        height=340,
    )
    for i, c in enumerate(curves):
        color = style.PALETTE[i % len(style.PALETTE)]
        fig.line(c["batch"], c["ratio"], color=color, width=2.5, legend_label=names[c["device"]])
        fig.scatter(c["batch"], c["ratio"], color=color, size=6)
    from bokeh.models import FixedTicker

    fig.xaxis.formatter = style.count_ticks()
    fig.xaxis.ticker = FixedTicker(ticks=sorted({int(b) for c in curves for b in c["batch"]}))
    _legend_below(fig)
    _source_note(fig, sources)
    return fig

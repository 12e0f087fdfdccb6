"""Figures of published GPU kernel measurements (the measured chapter): what real kernels
reach on each GPU, and the ledger against them. Pure: each takes the data that
kvlab.book.gpu_tables computed; every figure names its source in a note under the plot."""

from __future__ import annotations

import numpy as np

from . import style

#: The share of peak bandwidth the article says real code reaches (section 2.1).
BAND = (0.60, 0.85)
DASHES = ("solid", "dashed", "dotted", "dotdash")


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


def _end(fig, sources: list[str], x="count", y="percent"):
    """Every figure here ends alike: its tick formats, the legend under the plot, the
    tables it draws named below."""
    style.finish(fig, x=x, y=y)
    style.legend_below(fig)
    _source_note(fig, sources)
    return fig


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
    fig = style.chart(
        "One token through a weight matrix: share of the sheet bandwidth",
        "weight bytes of the matrix",
        "achieved / sheet bandwidth",
        log="x",
        y_range=(0, top),
        height=360,
    )
    _band(fig, (lo, hi))
    style.line(fig, [lo, hi], [1.0, 1.0], None, "black", 1, legend="the data sheet")
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
    fig.xaxis.ticker = style.ticks_125(lo, hi)
    return _end(fig, sources, x="B")


def gemm_batch_figure(curves: list[dict], names: dict, sources: list[str], nk: tuple[int, int]):
    """One projection GEMM over the tokens it multiplies: the ledger's ceiling time over
    the measured time (1 = the ceiling), per GPU."""
    fig = style.chart(
        f"A {nk[1]:,} x {nk[0]:,} weight matrix over the batch: ceiling / measured",
        "tokens multiplied at once (m)",
        "ceiling time / measured time",
        log="x",
        y_range=(0, 1.1),
        height=340,
    )
    for i, c in enumerate(curves):
        color = style.PALETTE[i % len(style.PALETTE)]
        style.line(fig, c["m"], c["efficiency"], None, color, legend=names[c["device"]])
    return _end(fig, sources)


def attention_figure(
    curves: list[dict], names: dict, sources: list[str], layout: tuple[int, int, int]
):
    """Decode attention of one layer: KV bytes read per second over the tokens in the cache,
    as a share of the sheet bandwidth, per GPU and batch (line style)."""
    heads, kv, dim = layout
    top = max(float(np.max(c["fraction_of_sheet"])) for c in curves)
    fig = style.chart(
        f"Decode attention ({heads} query heads, {kv} K/V heads of {dim}): KV read per second",
        "tokens in the cache per sequence",
        "KV bytes per second / sheet bandwidth",
        log="x",
        y_range=(0, max(1.2, 1.05 * top)),
        height=380,
    )
    x = [
        min(float(c["tokens"].min()) for c in curves),
        max(float(c["tokens"].max()) for c in curves),
    ]
    style.line(fig, x, [1.0, 1.0], None, "black", 1, legend="the data sheet")
    devices = list(dict.fromkeys(c["device"] for c in curves))
    batches = list(dict.fromkeys(c["batch"] for c in curves))
    for c in curves:
        color = style.PALETTE[devices.index(c["device"]) % len(style.PALETTE)]
        dash = DASHES[batches.index(c["batch"]) % len(DASHES)]
        label = f"{names[c['device']]}, batch {c['batch']}"
        style.line(
            fig, c["tokens"], c["fraction_of_sheet"], None, color, 2, dash=dash, legend=label
        )
    return _end(fig, sources)


def ledger_figure(curves: list[dict], names: dict, sources: list[str], model_name: str):
    """A decode step in measured mode over its ceiling, against the batch, per GPU."""
    first = curves[0]
    fig = style.chart(
        f"Decode step of {model_name} at {first['context']:,} tokens: measured / ceiling",
        "batch (sequences)",
        "measured step time / ceiling",
        log="x",
        y_range=(0.9, max(2.0, 1.05 * max(float(np.max(c["ratio"])) for c in curves))),
        height=340,
    )
    for i, c in enumerate(curves):
        color = style.PALETTE[i % len(style.PALETTE)]
        style.line(fig, c["batch"], c["ratio"], None, color, legend=names[c["device"]])
        fig.scatter(c["batch"], c["ratio"], color=color, size=6)
    from bokeh.models import FixedTicker

    fig.xaxis.ticker = FixedTicker(ticks=sorted({int(b) for c in curves for b in c["batch"]}))
    return _end(fig, sources, y=None)

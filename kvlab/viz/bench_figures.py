"""Measured against predicted: figures over every machine's recorded benchmark results
(results/<machine>/*.json, read through kvlab.bench.report)."""

from __future__ import annotations

import numpy as np

from ..bench import report
from . import style

KERNEL_LEGEND = {"native": "kvlab kernels", "torch": "PyTorch kernels"}
MARKERS = ("circle", "triangle", "square", "diamond", "inverted_triangle", "star")


def _note(fig, text: str):
    from bokeh.models import Label

    fig.add_layout(
        Label(
            x=10,
            y=10,
            x_units="screen",
            y_units="screen",
            text=text,
            text_font_size="12px",
            text_color=style.GREY,
        )
    )
    return fig


def _context_ticks(contexts):
    """Ticks at the measured contexts (powers of two), not bokeh's crowded log ticks."""
    from bokeh.models import FixedTicker

    return FixedTicker(ticks=sorted({float(c) for c in contexts}))


def decode_figure():
    """Each decode point: measured step time against the ledger's prediction (with the
    measured bandwidth), per machine, placement and KV dtype; the diagonal is 'exact'."""
    from bokeh.models import ColumnDataSource

    fig = style.chart(
        "Decode step: measured against the ledger",
        "predicted step time (ledger, measured bandwidth)",
        "measured step time",
        log="xy",
        height=420,
    )
    entries = report.decode_comparison()
    lo, hi = np.inf, 0.0
    k = 0
    renderers = []
    for entry in entries:
        p = entry["points"]
        if not len(p["batch"]):
            continue
        for placement in sorted(set(p["placement"].tolist())):
            for kv in sorted(set(p["kv_dtype"].tolist())):
                sel = (
                    (p["placement"] == placement)
                    & (p["kv_dtype"] == kv)
                    & ~p["prefetch"].astype(bool)
                )
                if not sel.any():
                    continue
                src = ColumnDataSource(
                    {
                        c: p[c][sel]
                        for c in (
                            "batch",
                            "context",
                            "measured_step_s",
                            "predicted_step_s",
                            "error",
                            "fraction_of_bandwidth",
                        )
                    }
                )
                color = style.PALETTE[k % len(style.PALETTE)]
                renderers.append(
                    fig.scatter(
                        "predicted_step_s",
                        "measured_step_s",
                        source=src,
                        size=8,
                        color=color,
                        marker=MARKERS[k % len(MARKERS)],
                        alpha=0.85,
                        legend_label=f"{entry['device_name']}: KV {placement}, {kv}",
                    )
                )
                lo = min(
                    lo,
                    float(np.nanmin(p["predicted_step_s"][sel])),
                    float(np.nanmin(p["measured_step_s"][sel])),
                )
                hi = max(
                    hi,
                    float(np.nanmax(p["predicted_step_s"][sel])),
                    float(np.nanmax(p["measured_step_s"][sel])),
                )
                k += 1
    if not renderers:
        return _note(
            fig, "no decode results recorded yet: run `make bench` (CPU) or `make bench-gpu`"
        )
    _decode_axes(fig, renderers, lo, hi)
    return fig


def _decode_axes(fig, renderers, lo: float, hi: float) -> None:
    """The decode figure's diagonal and ±10% lines, log ticks, legend and hover."""
    line = np.array([lo / 1.2, hi * 1.2])
    fig.line(line, line, color="black", width=1.5, legend_label="measured = predicted")
    fig.line(line, line * 1.1, color=style.GREY, line_dash="dashed", legend_label="±10%")
    fig.line(line, line / 1.1, color=style.GREY, line_dash="dashed")
    fig.xaxis.ticker = fig.yaxis.ticker = style.ticks_125(lo / 1.2, hi * 1.2)
    style.finish(
        fig,
        x="seconds",
        y="seconds",
        legend="top_left",
        legend_px="10px",
        tips=[
            ("batch", "@batch"),
            ("context", "@context{0,0}"),
            ("measured", "@measured_step_s{0.000000} s"),
            ("predicted", "@predicted_step_s{0.000000} s"),
            ("error", "@error{+0.0%}"),
            ("share of copy bandwidth", "@fraction_of_bandwidth{0%}"),
        ],
        on=renderers,
    )


def bandwidth_figure():
    """Achieved bytes/s of decode (bytes the ledger says a step moves / measured time) as a
    share of the machine's measured copy bandwidth, against context: solid with the
    decoder's own kernels, dashed with PyTorch's CPU kernels where that run was recorded."""
    from bokeh.models import ColumnDataSource

    fig = style.chart(
        "How much of the memory bandwidth decode uses",
        "context (tokens)",
        "share of measured copy bandwidth",
        log="x",
        height=360,
    )
    colors: dict[tuple, str] = {}
    drawn, contexts = 0, set()
    for kernels, dash in (("default", "solid"), ("torch", "dashed")):
        for entry in report.decode_comparison("device", kernels=kernels):
            p = entry["points"]
            who = KERNEL_LEGEND.get(entry["kernels"], entry["kernels"])
            for kv in sorted(set(p["kv_dtype"].tolist())):
                for batch in sorted(set(p["batch"].tolist())):
                    sel = (p["kv_dtype"] == kv) & (p["batch"] == batch) & (p["prefetch"] == False)  # noqa: E712
                    if not sel.any():
                        continue
                    key = (entry["machine"], kv, int(batch))
                    color = colors.setdefault(key, style.PALETTE[len(colors) % len(style.PALETTE)])
                    src = ColumnDataSource(
                        {"context": p["context"][sel], "share": p["fraction_of_bandwidth"][sel]}
                    )
                    contexts.update(p["context"][sel].tolist())
                    label = f"{entry['device_name']}: batch {int(batch)}, KV {kv}, {who}"
                    style.line(fig, "context", "share", src, color, 2, dash=dash, legend=label)
                    fig.scatter(
                        "context",
                        "share",
                        source=src,
                        color=color,
                        size=6,
                        fill_color=color if dash == "solid" else "white",
                    )
                    drawn += 1
    if drawn == 0:
        return _note(fig, "no decode results recorded yet")
    fig.xaxis.ticker = _context_ticks(contexts)
    style.finish(fig, x="count", y="percent")
    style.legend_below(fig)
    return fig


#: The columns each pace point carries (axes and hover).
PACE_COLUMNS = (
    "bandwidth_bytes_per_s",
    "achieved_bytes_per_s",
    "context",
    "batch",
    "fraction_of_bandwidth",
)


def pace_figure():
    """Achieved bytes/s of each device-placement decode step against the copy bandwidth measured
    around it. On the diagonal the memory sets the pace; where the points level off, the cores
    do. A shared machine's bandwidth drifts, which makes this a free experiment."""
    from bokeh.models import ColumnDataSource

    fig = style.new_figure(
        "Who sets the pace: memory or cores",
        "copy bandwidth measured around the step",
        "achieved (ledger bytes / step time)",
        height=380,
    )
    colors: dict[tuple, str] = {}
    hi = 0.0
    renderers = []
    for kernels in ("default", "torch"):
        for entry in report.decode_comparison("device", kernels=kernels):
            p = entry["points"]
            who = KERNEL_LEGEND.get(entry["kernels"], entry["kernels"])
            for kv in sorted(set(p["kv_dtype"].tolist())):
                for batch in sorted(set(p["batch"].tolist())):
                    sel = (
                        (p["kv_dtype"] == kv)
                        & (p["batch"] == batch)
                        & np.isfinite(p["bandwidth_bytes_per_s"])
                    )
                    if not sel.any():  # results older than per-point bandwidths have none to plot
                        continue
                    color = colors.setdefault(
                        (entry["machine"], kv, int(batch)),
                        style.PALETTE[len(colors) % len(style.PALETTE)],
                    )
                    src = ColumnDataSource({c: p[c][sel] for c in PACE_COLUMNS})
                    renderers.append(
                        fig.scatter(
                            "bandwidth_bytes_per_s",
                            "achieved_bytes_per_s",
                            source=src,
                            size=8,
                            color=color,
                            fill_color=color if kernels == "default" else "white",
                            marker="circle" if kernels == "default" else "square",
                            legend_label=(
                                f"{entry['device_name']}: batch {int(batch)}, KV {kv}, {who}"
                            ),
                        )
                    )
                    hi = max(hi, float(p["bandwidth_bytes_per_s"][sel].max()))
    if not renderers:
        return _note(fig, "no decode results recorded yet")
    diagonal = [0, hi * 1.05]
    style.line(fig, diagonal, diagonal, None, "black", 1.5, legend="achieved = copy bandwidth")
    style.finish(fig, x="B/s", y="B/s")
    style.legend_below(fig)
    style.hover(
        fig,
        [
            ("batch", "@batch"),
            ("context", "@context{0,0}"),
            ("share of copy bandwidth", "@fraction_of_bandwidth{0%}"),
        ],
        renderers,
    )
    return fig


def recompute_figure():
    """Prefill N tokens (recompute) against bringing their KV from host memory (fetch)."""
    fig = style.chart(
        "A hit can be slower than a miss: recompute against fetch",
        "tokens",
        "seconds",
        log="xy",
        height=380,
    )
    k, lengths = 0, set()
    for curve in report.recompute_curves():
        if curve["tokens"] is None:
            continue
        lengths.update(curve["tokens"].tolist())
        name = f"{curve['device_name']} ({curve['preset']})"
        c1, c2 = style.PALETTE[(2 * k) % 8], style.PALETTE[(2 * k + 1) % 8]
        tokens = curve["tokens"]
        style.line(fig, tokens, curve["recompute_s"], None, c1, legend=f"recompute, {name}")
        style.line(fig, tokens, curve["fetch_s"], None, c2, legend=f"fetch from host, {name}")
        if curve["predicted_recompute_s"] is not None:
            predicted = curve["predicted_recompute_s"]
            style.line(
                fig, tokens, predicted, None, c1, None, dash="dashed", legend="ledger's prediction"
            )
            style.line(fig, tokens, curve["predicted_fetch_s"], None, c2, None, dash="dashed")
        if curve["crossover_tokens"]:
            fig.scatter(
                [curve["crossover_tokens"]],
                [np.interp(curve["crossover_tokens"], curve["tokens"], curve["recompute_s"])],
                size=12,
                color="black",
                marker="x",
                legend_label="measured crossover",
            )
        k += 1
    if k == 0:
        return _note(fig, "no recompute-vs-fetch results recorded yet")
    fig.xaxis.ticker = _context_ticks(lengths)  # bokeh's log ticks leave most lengths unlabelled
    return style.finish(fig, x="count", y="seconds", legend="top_left", legend_px="10px")


def memory_figure():
    """Copy/read/write bandwidth against array size: the caches, then main memory."""
    fig = style.chart(
        "Memory bandwidth against working-set size",
        "array size",
        "bytes per second",
        log="xy",
        height=340,
    )
    k = 0
    for m in report.memory_bandwidth():
        for kernel, data in m["kernels"].items():
            x, y = data["size_bytes"], data["bandwidth_bytes_per_s"]
            label = f"{m['device_name']}: {kernel}"
            style.line(fig, x, y, None, style.PALETTE[k % 8], 2, legend=label)
            k += 1
        if m.get("last_level_cache_bytes"):
            from bokeh.models import Span

            fig.add_layout(
                Span(
                    location=m["last_level_cache_bytes"],
                    dimension="height",
                    line_dash="dotted",
                    line_color=style.GREY,
                )
            )
    if k == 0:
        return _note(fig, "no memory results recorded yet")
    return style.finish(fig, x="B", y="B/s", legend="bottom_left", legend_px="10px")

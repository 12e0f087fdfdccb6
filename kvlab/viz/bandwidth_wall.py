"""Chapter 2's figures and panels. The decode-step panel: one control bar (model, device,
batch, context, dtypes, efficiency, speed) drives every figure of the bandwidth ledger at
once: the bytes one step moves and its time, the batch and context sweeps through that
step, and where it sits on the roofline.

Speed: the ceiling (the sheet's peaks x the efficiency) or the kernels measured in
published tables (`kvlab.viz.speed`). In measured mode the sweeps draw the measured times
where the tables cover them and the ceiling beside them in grey; a state the tables do not
cover shows the ceiling, and the readout says why. The readout shows the step at the chosen
speed; every other number the prose quotes is a `glue` value of the same compute. The
twin is KVLAB.panels["decode-step"] (js/bandwidth_wall.js), checked under node.

Also the bandwidth of each tier, the roofline's axis and points (drawn by the decode-step
panel), and quantization at long context (weight-only vs KV), whose twin is
KVLAB.panels.quantization.
"""

from __future__ import annotations

import math

import numpy as np

from .. import cost
from ..deployment import Deployment, KernelTables
from ..fmt import percent, seconds
from ..grids import BATCH_GRID, CONTEXT_GRID
from ..hardware import devices, tiers
from ..models import models
from . import speed, style
from .controls import (
    batch_control,
    context_control,
    deployment,
    dtype_control,
    efficiency_control,
    hardware_control,
    model_control,
)
from .panel import Panel
from .terms import ledger_terms

ACHIEVABLE_BAND = (0.60, 0.85)  # fraction of peak real kernels reach (the article, section 2.1)


def tiers_figure():
    """Peak bandwidth of each memory and link tier on a log axis, with the achievable band."""
    from bokeh.models import ColumnDataSource

    items = list(tiers().values())[::-1]  # fastest on top
    names = [t.name for t in items]
    peak = np.array([t.bandwidth_bytes_per_s for t in items])
    src = ColumnDataSource(
        {
            "tier": names,
            "peak": peak,
            "low": peak * ACHIEVABLE_BAND[0],
            "high": peak * ACHIEVABLE_BAND[1],
            "kind": [t.kind for t in items],
            "color": [style.BLUE if t.kind == "memory" else style.ORANGE for t in items],
            "derivation": [t.derivation for t in items],
            "example": [t.example for t in items],
        }
    )
    fig = style.new_figure(
        "Peak bandwidth of each tier (per direction)",
        "bytes per second (log scale)",
        "",
        x_axis_type="log",
        y_range=names,
        height=380,
        x_range=(5e8, 1e13),
    )
    bars = fig.hbar(
        y="tier",
        left=5e8,
        right="peak",
        height=0.65,
        color="color",
        alpha=0.35,
        source=src,
        legend_field="kind",
    )
    fig.hbar(y="tier", left="low", right="high", height=0.65, color="color", source=src)
    fig.legend.title = "light: peak · solid: the 60–85% real code reaches"
    return style.finish(
        fig,
        x="B/s",
        legend="bottom_right",
        tips=[
            ("tier", "@tier"),
            ("peak", "@peak{0.000a}B/s"),
            ("from", "@derivation"),
            ("e.g.", "@example"),
        ],
        on=[bars],
    )


# ------------------------------------------------------- the decode-step panel's roofline
ROOF_X = np.logspace(-1, 4, 61)  # arithmetic intensities the roof is drawn over (FLOP/B)
POINTS = (
    ("decode step, KV cached", style.BLUE, "circle"),
    ("decode with no KV cache (recompute)", style.VERMILION, "triangle"),
    ("prefill, naive attention", style.PURPLE, "square"),
    ("prefill, FlashAttention", style.GREEN, "diamond"),
)


# ---------------------------------------------------------------- quantization
QUANT_CONFIGS = (
    ("fp16", "fp16"),
    ("int4", "fp16"),
    ("fp16", "fp8"),
    ("int4", "fp8"),
    ("int4", "int4"),
)
QUANT_READOUT = (
    ("fp16_tokens_per_s", "fp16 weights, fp16 KV: tokens/s per sequence", "rate"),
    ("weight_only_speedup", "int4 weights only: speed-up", "ratio"),
    ("both_speedup", "int4 weights + fp8 KV: speed-up", "ratio"),
    ("kv_share_weight_only", "KV share of bytes, int4 weights + fp16 KV", "percent"),
)


def quantization_panel() -> Panel:
    """Tokens/s for weight-only vs KV quantization at a long context (the article's 16K case)."""

    def compute(state):
        rows = [
            cost.decode_step(
                Deployment(state["model"], state["hardware"], w, k),
                state["batch"],
                state["context"],
            )
            for w, k in QUANT_CONFIGS
        ]
        speeds = [r.tokens_per_s_per_sequence for r in rows]
        return {
            "sources": {
                "bars": _quant_bars(speeds, [r.kv_read_bytes / r.step_bytes for r in rows])
            },
            "values": {
                "fp16_tokens_per_s": speeds[0],
                "weight_only_speedup": speeds[1] / speeds[0],
                "both_speedup": speeds[3] / speeds[0],
                "kv_share_weight_only": rows[1].kv_read_bytes / rows[1].step_bytes,
            },
        }

    def figures(src):
        fig = style.bars(
            "Quantize what dominates the bytes",
            "tokens per second, each sequence",
            [label for label, _ in _quant_labels()],
            "config",
            "tokens_per_s",
            src["bars"],
            bar_width=0.65,
            height=330,
        )
        fig.xaxis.major_label_text_font_size = "10px"
        tips = [
            ("", "@config"),
            ("tokens/s", "@tokens_per_s{0,0.0}"),
            ("KV share of bytes", "@kv_share{0.0%}"),
        ]
        return style.finish(fig, tips=tips, on=fig.renderers)

    controls = (model_control(), hardware_control(), batch_control(8), context_control(16384))
    labels = _quant_labels()
    terms = {
        **ledger_terms(models(), devices()),
        "configs": [list(c) for c in QUANT_CONFIGS],
        "labels": [lbl for lbl, _ in labels],
        "colors": [c for _, c in labels],
    }
    return Panel("quantization", controls, compute, figures, "quantization", terms, QUANT_READOUT)


def _quant_labels():
    colors = (style.GREY, style.BLUE, style.ORANGE, style.GREEN, style.PURPLE)
    return [(f"W {w} · KV {k}", c) for (w, k), c in zip(QUANT_CONFIGS, colors, strict=True)]


def _quant_bars(speeds, kv_shares) -> dict:
    labels = _quant_labels()
    return {
        "config": [lbl for lbl, _ in labels],
        "color": [c for _, c in labels],
        "tokens_per_s": speeds,
        "kv_share": kv_shares,
    }


READOUT = (
    ("weight_read_bytes", "Weights read per step", "bytes"),
    ("kv_read_bytes", "KV history read per step", "bytes"),
    ("step_time_s", "Time per step (TPOT)", "seconds"),
    ("tokens_per_s", "Tokens/s, whole batch", "rate"),
    ("tokens_per_s_per_sequence", "Tokens/s, each sequence", "rate"),
    ("bound", "Bound by", "text"),
    ("arithmetic_intensity", "FLOPs per byte moved", "intensity"),
    ("ridge_flops_per_byte", "Ridge point of the device", "intensity"),
    ("knee_batch", "Knee: batch where KV reads match weights", "count"),
    ("kv_equals_weights_context", "Context where KV reads match weights", "count"),
    ("max_batch", "Largest batch that fits", "count"),
    ("speed", "Speed from", "text"),
)
#: Values the prose quotes beside the readout's (at the chosen speed where they are times).
GLUE = (
    ("step_bytes", "bytes"),
    ("kv_cache_bytes", "bytes"),
    ("fits", "yesno"),
    ("memory_time_s", "seconds"),
    ("compute_time_s", "seconds"),
    ("knee_tokens_per_s", "rate"),
    ("knee_tpot_s", "seconds"),
    ("batch1_tokens_per_s", "rate"),
    ("max_tokens_per_s", "rate"),
    ("at_4k", "rate"),
    ("at_32k", "rate"),
    ("slowdown", "ratio"),
    ("peak_compute_used", "percent"),
    ("no_cache_time_s", "seconds"),
    ("prefill_naive_intensity", "intensity"),
    ("prefill_flash_intensity", "intensity"),
)
BYTES_Y = ("per step",)  # the bytes bar's one category
SHORT_CONTEXT, LONG_CONTEXT = 4096, 32768  # the two contexts the context values compare
TIME_KINDS = ("memory", "compute", "step (TPOT)")  # the time bars, top to bottom
TIME_COLORS = (style.BLUE, style.GREY, style.GREEN, style.VERMILION)  # ..., step measured
TIME_TITLE = "Time per step"
MEASURED_POINT = ("decode step, measured", style.VERMILION, "star")
BATCHES, CONTEXTS = np.array(BATCH_GRID, dtype=float), np.array(CONTEXT_GRID, dtype=float)


def _measured_times(state: dict, batches, contexts) -> list[float]:
    """Measured seconds at each (batch, context) pair (NaN where the tables have none)."""
    args = (state["model"], state["hardware"], state["weight_dtype"], state["kv_dtype"])
    return [
        speed.measured_time(*args, int(b), int(c))[0]
        for b, c in zip(batches, contexts, strict=True)
    ]


def _main(state: dict, ceiling_s, batches, contexts) -> tuple[list[float], bool]:
    """The times a sweep draws: measured (NaN where not covered) when the speed is measured
    and the tables cover some point of it, else the ceiling."""
    if state["speed"] == "measured":
        times = _measured_times(state, batches, contexts)
        if any(t == t for t in times):
            return times, True
    return [float(t) for t in ceiling_s], False


def _rows(columns: dict, keep: list[bool]) -> dict:
    return {k: [v for v, ok in zip(col, keep, strict=True) if ok] for k, col in columns.items()}


def _empty(*names) -> dict:
    return {n: [] for n in names}


def _nan_ratio(a: float, b: float) -> float:
    return a / b if a == a and b == b else math.nan


# ------------------------------------------------------------------ the compute
def _point(state: dict):
    """The deployment and step the readout shows: measured where the tables cover it, else
    the ceiling; and the readout's phrase for where its speed comes from."""
    m, hw, b, c = state["model"], state["hardware"], state["batch"], state["context"]
    measured = state["speed"] == "measured"
    why = ""
    if measured:
        _t, why = speed.measured_time(m, hw, state["weight_dtype"], state["kv_dtype"], b, c)
    d = deployment(state)
    if measured and not why:
        d = d.replace(speed=KernelTables())
    return d, cost.decode_step(d, b, c), speed.speed_text(measured, why, state["efficiency"], hw)


def _batch_part(state: dict, short: str) -> tuple[dict, dict, int]:
    s = cost.decode_step(deployment(state), BATCHES, state["context"])
    k = cost.batch_knee(s)
    times, measured = _main(state, s.step_time_s, BATCHES, [state["context"]] * len(BATCHES))
    keep = [t == t for t in times]
    b = BATCHES.tolist()
    tps = [x / t for x, t in zip(b, times, strict=True)]
    label = f" ({short})" if measured else ""
    main = {
        "batch": b,
        "tokens_per_s": tps,
        "per_sequence": [1.0 / t for t in times],
        "tpot_s": times,
        "total_label": [f"whole batch{label}"] * len(b),
        "each_label": [f"each sequence{label}"] * len(b),
    }
    ref = _empty("batch", "tokens_per_s", "per_sequence", "tpot_s", "ref_label")
    if measured:
        ceiling = f"ceiling × {percent(state['efficiency'])}"
        ref = {
            "batch": b,
            "tokens_per_s": s.tokens_per_s.tolist(),
            "per_sequence": s.tokens_per_s_per_sequence.tolist(),
            "tpot_s": s.step_time_s.tolist(),
            "ref_label": [ceiling] * len(b),
        }
    knee = _empty("batch", "tokens_per_s", "tpot_s", "knee_label")
    if keep[k]:
        knee = {
            "batch": [b[k]],
            "tokens_per_s": [tps[k]],
            "tpot_s": [times[k]],
            "knee_label": ["knee"],
        }
    values = {
        "knee_batch": b[k],
        "knee_tokens_per_s": tps[k],
        "knee_tpot_s": times[k],
        "batch1_tokens_per_s": tps[0],
        "max_tokens_per_s": tps[-1],
    }
    return {"batch": _rows(main, keep), "batch_ref": ref, "knee": knee}, values, k


def _context_part(state: dict, short: str) -> tuple[dict, dict]:
    s = cost.decode_step(deployment(state), state["batch"], CONTEXTS)
    times, measured = _main(state, s.step_time_s, [state["batch"]] * len(CONTEXTS), CONTEXTS)
    keep = [t == t for t in times]
    c = CONTEXTS.tolist()
    each = [1.0 / t for t in times]
    main = {
        "context": c,
        "per_sequence": each,
        "label": [f"each sequence ({short})" if measured else "each sequence"] * len(c),
    }
    ref = _empty("context", "per_sequence", "ref_label")
    if measured:
        ref = {
            "context": c,
            "per_sequence": s.tokens_per_s_per_sequence.tolist(),
            "ref_label": [f"ceiling × {percent(state['efficiency'])}"] * len(c),
        }
    near, far = each[CONTEXT_GRID.index(SHORT_CONTEXT)], each[CONTEXT_GRID.index(LONG_CONTEXT)]
    crossover = s.weight_read_bytes / (state["batch"] * s.kv_bytes_per_token)
    sources = {
        "context": _rows(main, keep),
        "context_ref": ref,
        "context_bytes": {
            "context": c,
            "weights": np.broadcast_to(s.weight_read_bytes, CONTEXTS.shape).tolist(),
            "kv_read": s.kv_read_bytes.tolist(),
        },
    }
    values = {
        "at_4k": near,
        "at_32k": far,
        "slowdown": _nan_ratio(near, far),
        "kv_equals_weights_context": float(np.floor(crossover)),
    }
    return sources, values


def _roofline_part(state: dict, point, measured: bool, short: str) -> tuple[dict, dict]:
    d, eff = deployment(state), state["efficiency"]
    ceiling = cost.decode_step(d, state["batch"], state["context"])
    no_cache = cost.prefill(d, state["context"] + 1)
    flash = cost.prefill(d, state["context"])
    naive = cost.prefill(d, state["context"], flash_attention=False)
    rows = [
        (ceiling.flops, ceiling.step_bytes, ceiling.step_time_s),
        (no_cache.flops, no_cache.bytes_moved, no_cache.time_s),
        (naive.flops, naive.bytes_moved, naive.time_s),
        (flash.flops, flash.bytes_moved, flash.time_s),
    ]
    styles = list(POINTS)
    if measured:
        rows.append((point.flops, point.step_bytes, point.step_time_s))
        styles.append((f"{MEASURED_POINT[0]} ({short})", *MEASURED_POINT[1:]))
    peak = point.ridge_flops_per_byte * point.bandwidth_bytes_per_s
    sources = {
        "roof": roof_source(ceiling, ROOF_X, eff),
        "points": {
            "label": [p[0] for p in styles],
            "color": [p[1] for p in styles],
            "marker": [p[2] for p in styles],
            "intensity": [f / b for f, b, _ in rows],
            "flops_per_s": [f / t for f, _, t in rows],
        },
    }
    values = {
        "peak_compute_used": point.flops / point.step_time_s / peak,
        "no_cache_time_s": no_cache.time_s,
        "prefill_naive_intensity": naive.flops / naive.bytes_moved,
        "prefill_flash_intensity": flash.flops / flash.bytes_moved,
    }
    return sources, values


def _compute(state: dict) -> dict:
    d, point, phrase = _point(state)
    measured, hw = d.kernel_tables, state["hardware"]
    short = (
        speed.short_source(hw)
        if state["speed"] == "measured"
        and not speed.why_not(state["model"], hw, state["weight_dtype"], state["kv_dtype"])
        else ""
    )
    batch_sources, batch_values, _k = _batch_part(state, short)
    context_sources, context_values = _context_part(state, short)
    roof_sources, roof_values = _roofline_part(state, point, measured, short)
    times = [point.memory_time_s, point.compute_time_s, point.step_time_s]
    sources = {
        "bytes": bytes_source(point),
        "time": {
            "kind": list(TIME_KINDS),
            "seconds": times,
            "color": list(TIME_COLORS[:2]) + [TIME_COLORS[2 + measured]],
            "label": [seconds(t) for t in times],
        },
        **batch_sources,
        "batch_here": {
            "batch": [point.batch],
            "tokens_per_s": [point.tokens_per_s],
            "tpot_s": [point.step_time_s],
        },
        **context_sources,
        "context_here": {
            "context": [point.context],
            "per_sequence": [point.tokens_per_s_per_sequence],
        },
        **roof_sources,
    }
    values = {**point.to_dict(), "speed": phrase, **batch_values, **context_values, **roof_values}
    where = (
        f"measured: {speed.table_title(hw)}"
        if measured
        else f"ceiling × {percent(state['efficiency'])}"
    )
    return {"sources": sources, "values": values, "titles": {"time": f"{TIME_TITLE} ({where})"}}


def _budget(state: dict) -> dict:
    """The `kvlab budget` arguments of the readout's step (tests compare the two)."""
    keys = ("model", "hardware", "batch", "context", "weight_dtype", "kv_dtype", "efficiency")
    out = {k: state[k] for k in keys}
    if _point(state)[0].kernel_tables:
        out["efficiency"] = "measured"
    return out


# ------------------------------------------------------------------ the figures
def _figures(src):
    from bokeh.layouts import column
    from bokeh.models import TabPanel, Tabs

    tabs = Tabs(
        tabs=[
            TabPanel(child=_batch_figures(src), title="Batch"),
            TabPanel(child=_context_figures(src), title="Context"),
            TabPanel(child=_roofline_figure(src), title="Roofline"),
        ]
    )
    return column(_step_figures(src), tabs)


def bytes_figure(source, **figure_kw):
    """The bytes one step moves, stacked: weights, KV read, KV written (this panel's and
    the live dashboard's)."""
    return style.stacked_bars(
        "Bytes one decode step moves",
        "bytes per step",
        BYTES_Y,
        "y",
        {
            "weights": (style.WEIGHTS, "weights"),
            "kv_read": (style.KV_READ, "KV history read"),
            "kv_write": (style.KV_WRITE, "KV written"),
        },
        source,
        x="B",
        height=150,
        tips=[
            ("weights", "@weights{0.000a}B"),
            ("KV read", "@kv_read{0.000a}B"),
            ("KV written", "@kv_write{0.000a}B"),
        ],
        **figure_kw,
    )


def bytes_source(step) -> dict:
    """`bytes_figure`'s columns for one decode step."""
    return {
        "y": list(BYTES_Y),
        "weights": [step.weight_read_bytes],
        "kv_read": [step.kv_read_bytes],
        "kv_write": [step.kv_write_bytes],
    }


def roof_source(step, x, efficiency: float) -> dict:
    """The roof at intensities `x` (FLOP/B): the step's device peaks x the efficiency."""
    peak = step.ridge_flops_per_byte * step.bandwidth_bytes_per_s
    return {
        "x": x.tolist(),
        "y": (np.minimum(peak, x * step.bandwidth_bytes_per_s) * efficiency).tolist(),
    }


def _step_figures(src):
    from bokeh.layouts import column

    fig = bytes_figure(src["bytes"])
    # the title names the step's source
    times = style.new_figure(
        TIME_TITLE,
        "seconds",
        "",
        height=170,
        y_range=list(TIME_KINDS[::-1]),
        x_range=style.from_zero(),
        name="time",
    )
    times.hbar(y="kind", right="seconds", height=0.6, color="color", source=src["time"])
    style.finish(times, x="seconds", tips=[("", "@kind"), ("time", "@label")])
    return column(fig, times)


def _batch_figures(src):
    from bokeh.layouts import column

    tps = _batch_throughput_figure(src)
    return column(tps, _batch_tpot_figure(src, tps.x_range))


def _batch_throughput_figure(src):
    tps = style.chart(
        "Throughput against batch", "batch (sequences)", "tokens per second", "xy", height=330
    )
    ref, main = src["batch_ref"], src["batch"]
    style.line(tps, "batch", "tokens_per_s", ref, style.GREY, 1.5, field="ref_label")
    style.line(tps, "batch", "per_sequence", ref, style.GREY, 1.5, dash="dashed")
    a = style.line(tps, "batch", "tokens_per_s", main, field="total_label")
    b = style.line(
        tps, "batch", "per_sequence", main, style.ORANGE, dash="dashed", field="each_label"
    )
    style.dot(tps, "batch", "tokens_per_s", src["knee"], legend_field="knee_label")
    here = src["batch_here"]
    style.ring(tps, "batch", "tokens_per_s", here, marker="circle", legend_label="this step")
    tps.legend.ncols = 2
    tps.add_layout(tps.legend[0], "below")  # clear of the curves, which fill the plot
    tips = [
        ("batch", "@batch{0,0}"),
        ("tokens/s (batch)", "@tokens_per_s{0,0.0}"),
        ("tokens/s (each)", "@per_sequence{0,0.0}"),
    ]
    return style.finish(
        tps, x="count", y="count", legend_px="10px", tips=tips, on=[a, b], mode="vline"
    )


def _batch_tpot_figure(src, x_range):
    tpot = style.chart(
        "Time per output token against batch",
        "batch (sequences)",
        "TPOT",
        "x",
        height=220,
        x_range=x_range,
    )
    style.line(tpot, "batch", "tpot_s", src["batch_ref"], style.GREY, 1.5)
    c = style.line(tpot, "batch", "tpot_s", src["batch"], style.GREEN)
    style.dot(tpot, "batch", "tpot_s", src["knee"])
    style.ring(tpot, "batch", "tpot_s", src["batch_here"])
    tips = [("batch", "@batch{0,0}"), ("TPOT", "@tpot_s{0.000000} s")]
    return style.finish(tpot, x="count", y="seconds", tips=tips, on=[c], mode="vline")


def _context_figures(src):
    from bokeh.layouts import column

    speed_fig = style.chart(
        "Decode speed against context",
        "context (tokens)",
        "tokens per second, each sequence",
        "x",
        height=280,
    )
    style.line(
        speed_fig, "context", "per_sequence", src["context_ref"], style.GREY, 1.5, field="ref_label"
    )
    line = style.line(speed_fig, "context", "per_sequence", src["context"], field="label")
    style.ring(speed_fig, "context", "per_sequence", src["context_here"], legend_label="this step")
    style.finish(
        speed_fig,
        x="count",
        legend="top_right",
        legend_px="10px",
        tips=[("context", "@context{0,0}"), ("tokens/s", "@per_sequence{0,0.0}")],
        on=[line],
        mode="vline",
    )
    split = style.chart(
        "Bytes per step: weights vs KV history",
        "context (tokens)",
        "bytes per step",
        "xy",
        height=220,
        x_range=speed_fig.x_range,
    )
    bytes_src = src["context_bytes"]
    style.line(split, "context", "weights", bytes_src, style.WEIGHTS, legend="weights")
    style.line(split, "context", "kv_read", bytes_src, style.KV_READ, legend="KV history")
    style.finish(split, x="count", y="B", legend="top_left")
    return column(speed_fig, split)


def _roofline_figure(src):
    fig = style.chart(
        "Roofline: attainable FLOP/s against arithmetic intensity",
        "arithmetic intensity (FLOPs per byte moved)",
        "FLOP/s",
        "xy",
        height=400,
    )
    style.line(fig, "x", "y", src["roof"], style.GREY, 3, legend="roof (peak × efficiency)")
    pts = fig.scatter(
        "intensity",
        "flops_per_s",
        source=src["points"],
        size=13,
        color="color",
        marker="marker",
        legend_field="label",
    )
    tips = [
        ("", "@label"),
        ("intensity", "@intensity{0,0.00} FLOP/B"),
        ("attained", "@flops_per_s{0.000a}FLOP/s"),
    ]
    return style.finish(
        fig, x="count", y="FLOP/s", legend="bottom_right", legend_px="10px", tips=tips, on=[pts]
    )


def decode_step_panel() -> Panel:
    """One decode step, its sweeps over batch and context, and its place on the roofline."""
    controls = (
        model_control(),
        hardware_control(),
        batch_control(),
        context_control(),
        dtype_control("weight_dtype", "Weights"),
        dtype_control("kv_dtype", "KV cache"),
        efficiency_control(),
        speed.speed_control(),
    )
    names = (models(), devices())
    terms = {
        **ledger_terms(*names),
        "bytes_y": list(BYTES_Y),
        "time_kinds": list(TIME_KINDS),
        "time_colors": list(TIME_COLORS),
        "time_title": TIME_TITLE,
        "batches": list(BATCH_GRID),
        "contexts": list(CONTEXT_GRID),
        "short": CONTEXT_GRID.index(SHORT_CONTEXT),
        "long": CONTEXT_GRID.index(LONG_CONTEXT),
        "roof_x": ROOF_X.tolist(),
        "points": [list(p) for p in POINTS],
        "measured_point": list(MEASURED_POINT),
        "measured": speed.measured_terms(*names, BATCH_GRID, CONTEXT_GRID),
    }
    return Panel(
        "ledger", controls, _compute, _figures, "decode-step", terms, READOUT, _budget, GLUE
    )

"""Chapter 2 figures: the bandwidth of each tier, the roofline, and quantization at long
context (weight-only vs KV)."""

from __future__ import annotations

import numpy as np

from .. import cost
from ..hardware import devices, tiers
from ..models import models
from . import style
from .controls import (
    batch_control,
    context_control,
    dtype_control,
    efficiency_control,
    hardware_control,
    ledger_state,
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
    fig.xaxis.formatter = style.si_ticks("B/s")
    fig.legend.location = "bottom_right"
    fig.legend.title = "light: peak · solid: the 60–85% real code reaches"
    style.hover(
        fig,
        [
            ("tier", "@tier"),
            ("peak", "@peak{0.000a}B/s"),
            ("from", "@derivation"),
            ("e.g.", "@example"),
        ],
        [bars],
    )
    return fig


# -------------------------------------------------------------------- roofline
ROOFLINE_READOUT = (
    ("arithmetic_intensity", "Decode step: FLOPs per byte", "intensity"),
    ("ridge_flops_per_byte", "Ridge point of the device", "intensity"),
    ("bound", "Decode step is bound by", "text"),
    ("peak_compute_used", "Share of peak FLOP/s used", "percent"),
    ("no_cache_time_s", "One token with no KV cache (recompute)", "seconds"),
    ("step_time_s", "One token with the KV cache", "seconds"),
    ("prefill_naive_intensity", "Prefill, naive attention", "intensity"),
    ("prefill_flash_intensity", "Prefill, FlashAttention", "intensity"),
)
ROOF_X = np.logspace(-1, 4, 61)


def _roofline_compute(state):
    step = cost.decode_step(state["model"], state["hardware"], **ledger_state(state))
    kw = dict(
        weight_dtype=state["weight_dtype"],
        kv_dtype=state["kv_dtype"],
        efficiency=state["efficiency"],
    )
    context = state["context"]
    no_cache = cost.prefill(state["model"], state["hardware"], context + 1, **kw)
    flash = cost.prefill(state["model"], state["hardware"], context, **kw)
    naive = cost.prefill(state["model"], state["hardware"], context, flash_attention=False, **kw)
    peak = step.ridge_flops_per_byte * step.bandwidth_bytes_per_s
    return {
        "sources": _roofline_sources(
            peak,
            step.bandwidth_bytes_per_s,
            state["efficiency"],
            [
                (step.flops, step.step_bytes, step.step_time_s),
                (no_cache.flops, no_cache.bytes_moved, no_cache.time_s),
                (naive.flops, naive.bytes_moved, naive.time_s),
                (flash.flops, flash.bytes_moved, flash.time_s),
            ],
        ),
        "values": {
            "arithmetic_intensity": step.arithmetic_intensity,
            "ridge_flops_per_byte": step.ridge_flops_per_byte,
            "bound": step.bound,
            "peak_compute_used": step.flops / step.step_time_s / peak,
            "no_cache_time_s": no_cache.time_s,
            "step_time_s": step.step_time_s,
            "prefill_naive_intensity": naive.flops / naive.bytes_moved,
            "prefill_flash_intensity": flash.flops / flash.bytes_moved,
        },
    }


def _roofline_figures(src):
    fig = style.new_figure(
        "Roofline: attainable FLOP/s against arithmetic intensity",
        "arithmetic intensity (FLOPs per byte moved)",
        "FLOP/s",
        x_axis_type="log",
        y_axis_type="log",
        height=400,
    )
    fig.line(
        "x",
        "y",
        source=src["roof"],
        color=style.GREY,
        width=3,
        legend_label="roof (peak × efficiency)",
    )
    pts = fig.scatter(
        "intensity",
        "flops_per_s",
        source=src["points"],
        size=13,
        color="color",
        marker="marker",
        legend_field="label",
    )
    fig.yaxis.formatter = style.si_ticks("FLOP/s")
    fig.xaxis.formatter = style.count_ticks()
    fig.legend.location = "bottom_right"
    style.hover(
        fig,
        [
            ("", "@label"),
            ("intensity", "@intensity{0,0.00} FLOP/B"),
            ("attained", "@flops_per_s{0.000a}FLOP/s"),
        ],
        [pts],
    )
    return fig


def roofline_panel() -> Panel:
    """Where the decode step sits on the roofline, next to no-cache decode and prefill."""

    controls = (
        model_control(),
        hardware_control(),
        batch_control(),
        context_control(),
        dtype_control("weight_dtype", "Weights"),
        dtype_control("kv_dtype", "KV cache"),
        efficiency_control(),
    )
    terms = {
        **ledger_terms(models(), devices()),
        "roof_x": ROOF_X.tolist(),
        "points": _point_styles(),
    }
    return Panel(
        "roofline",
        controls,
        _roofline_compute,
        _roofline_figures,
        "roofline",
        terms,
        ROOFLINE_READOUT,
    )


POINTS = (
    ("decode step, KV cached", style.BLUE, "circle"),
    ("decode with no KV cache (recompute)", style.VERMILION, "triangle"),
    ("prefill, naive attention", style.PURPLE, "square"),
    ("prefill, FlashAttention", style.GREEN, "diamond"),
)


def _point_styles() -> dict:
    return {
        "label": [p[0] for p in POINTS],
        "color": [p[1] for p in POINTS],
        "marker": [p[2] for p in POINTS],
    }


def _roofline_sources(peak, bandwidth, efficiency, points) -> dict:
    """The roof and the four points, each (FLOPs, bytes, seconds); js/roofline.js is the twin."""
    return {
        "roof": {
            "x": ROOF_X.tolist(),
            "y": (np.minimum(peak, ROOF_X * bandwidth) * efficiency).tolist(),
        },
        "points": {
            **_point_styles(),
            "intensity": [f / b for f, b, _ in points],
            "flops_per_s": [f / t for f, _, t in points],
        },
    }


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
                state["model"], state["hardware"], state["batch"], state["context"], w, k
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
        fig = style.new_figure(
            "Quantize what dominates the bytes",
            "",
            "tokens per second, each sequence",
            x_range=[label for label, _ in _quant_labels()],
            y_range=style.from_zero(),
            height=330,
        )
        bars = fig.vbar(
            x="config", top="tokens_per_s", width=0.65, color="color", source=src["bars"]
        )
        fig.xaxis.major_label_text_font_size = "10px"
        style.hover(
            fig,
            [
                ("", "@config"),
                ("tokens/s", "@tokens_per_s{0,0.0}"),
                ("KV share of bytes", "@kv_share{0.0%}"),
            ],
            [bars],
        )
        return fig

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

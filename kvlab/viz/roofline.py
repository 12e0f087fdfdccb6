"""Chapter 2 figures: the bandwidth of each tier, the roofline's axis and points (drawn by
the decode-step panel), and quantization at long context (weight-only vs KV)."""

from __future__ import annotations

import numpy as np

from .. import cost
from ..deployment import Deployment
from ..hardware import devices, tiers
from ..models import models
from . import style
from .controls import (
    batch_control,
    context_control,
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

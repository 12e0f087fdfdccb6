"""Chapter 2 panels: the bandwidth ledger (kvlab.viz.decode_step: one control bar for the
step, its batch and context sweeps and its roofline point), and the batch knee and context
panels the chapter showed before it (kept while its notebook still shows them; the
decode-step panel draws both).

Each factory returns a `Panel`: `compute` asks kvlab.cost (any value), its twin in
js/ledger.js recombines the build-time terms through KVLAB.step (grid values), `figures`
draws from the sources.
"""

from __future__ import annotations

import numpy as np

from .. import cost
from ..hardware import devices
from ..models import models
from . import style
from .controls import (
    BATCH_GRID,
    CONTEXT_GRID,
    batch_control,
    context_control,
    dtype_control,
    efficiency_control,
    hardware_control,
    ledger_state,
    model_control,
)
from .decode_step import BYTES_Y, LONG_CONTEXT, SHORT_CONTEXT, decode_step_panel
from .panel import Panel
from .terms import ledger_terms


def _terms() -> dict:
    return ledger_terms(models(), devices())


def _step(state: dict, **override):
    return cost.decode_step(state["model"], state["hardware"], **ledger_state(state, **override))


# ------------------------------------------------------------------ the ledger
def ledger_panel() -> Panel:
    """The ledger of one decode step: since chapter 2's one control bar drives every figure of
    the ledger, this is kvlab.viz.decode_step's panel (key "ledger")."""
    return decode_step_panel()


TIME_KINDS = ("memory", "compute")  # the time bars, in the order of TIME_COLORS
TIME_COLORS = (style.BLUE, style.GREY)


def _ledger_sources(weights, kv_read, kv_write, memory_s, compute_s) -> dict:
    """The ledger's bytes and time bars (the live dashboard draws them)."""
    from ..fmt import seconds

    return {
        "bytes": {
            "y": list(BYTES_Y),
            "weights": [weights],
            "kv_read": [kv_read],
            "kv_write": [kv_write],
        },
        "time": {
            "kind": list(TIME_KINDS),
            "seconds": [memory_s, compute_s],
            "color": list(TIME_COLORS),
            "label": [seconds(memory_s), seconds(compute_s)],
        },
    }


# ----------------------------------------------------------------- the knee
KNEE_READOUT = (
    ("knee_batch", "Knee: batch where KV reads match weights", "count"),
    ("knee_tokens_per_s", "Tokens/s at the knee", "rate"),
    ("knee_tpot_s", "TPOT at the knee", "seconds"),
    ("batch1_tokens_per_s", "Tokens/s at batch 1", "rate"),
    ("max_tokens_per_s", "Tokens/s at the largest batch shown", "rate"),
    ("max_batch", "Largest batch that fits", "count"),
)


def _knee_compute(state):
    grid = np.array(BATCH_GRID, dtype=float)
    s = _step({**state, "batch": grid})
    k = cost.batch_knee(s)
    return {
        "sources": {
            "curve": {
                "batch": grid.tolist(),
                "tokens_per_s": s.tokens_per_s.tolist(),
                "per_sequence": s.tokens_per_s_per_sequence.tolist(),
                "tpot_s": s.step_time_s.tolist(),
                "fits": [bool(f) for f in s.fits],
            },
            "knee": {
                "batch": [grid[k]],
                "tokens_per_s": [s.tokens_per_s[k]],
                "tpot_s": [s.step_time_s[k]],
            },
        },
        "values": {
            "knee_batch": float(grid[k]),
            "knee_tokens_per_s": float(s.tokens_per_s[k]),
            "knee_tpot_s": float(s.step_time_s[k]),
            "batch1_tokens_per_s": float(s.tokens_per_s[0]),
            "max_tokens_per_s": float(s.tokens_per_s[-1]),
            "max_batch": int(np.ravel(s.max_batch)[0]),
        },
    }


def _knee_figures(src):
    from bokeh.layouts import column

    tps = style.new_figure(
        "Throughput against batch",
        "batch (sequences)",
        "tokens per second",
        x_axis_type="log",
        y_axis_type="log",
    )
    a = tps.line(
        "batch",
        "tokens_per_s",
        source=src["curve"],
        color=style.BLUE,
        width=2.5,
        legend_label="whole batch",
    )
    b = tps.line(
        "batch",
        "per_sequence",
        source=src["curve"],
        color=style.ORANGE,
        width=2.5,
        line_dash="dashed",
        legend_label="each sequence",
    )
    tps.scatter(
        "batch",
        "tokens_per_s",
        source=src["knee"],
        size=11,
        color=style.VERMILION,
        legend_label="knee",
    )
    tps.xaxis.formatter = style.count_ticks()
    tps.yaxis.formatter = style.count_ticks()
    tps.legend.location = "top_left"
    style.hover(
        tps,
        [
            ("batch", "@batch{0,0}"),
            ("tokens/s (batch)", "@tokens_per_s{0,0.0}"),
            ("tokens/s (each)", "@per_sequence{0,0.0}"),
        ],
        [a, b],
        mode="vline",
    )
    tpot = style.new_figure(
        "Time per output token against batch",
        "batch (sequences)",
        "TPOT",
        x_axis_type="log",
        height=240,
        x_range=tps.x_range,
    )
    c = tpot.line("batch", "tpot_s", source=src["curve"], color=style.GREEN, width=2.5)
    tpot.scatter("batch", "tpot_s", source=src["knee"], size=11, color=style.VERMILION)
    tpot.xaxis.formatter = style.count_ticks()
    tpot.yaxis.formatter = style.seconds_ticks()
    style.hover(
        tpot, [("batch", "@batch{0,0}"), ("TPOT", "@tpot_s{0.000000} s")], [c], mode="vline"
    )
    return column(tps, tpot)


def batch_panel() -> Panel:
    """Throughput and TPOT against batch: where amortising the weights stops paying."""

    controls = (
        model_control(),
        hardware_control(),
        context_control(),
        dtype_control("weight_dtype", "Weights"),
        dtype_control("kv_dtype", "KV cache"),
        efficiency_control(),
    )
    terms = {**_terms(), "batches": list(BATCH_GRID)}
    return Panel("knee", controls, _knee_compute, _knee_figures, "knee", terms, KNEE_READOUT)


# ---------------------------------------------------------------- context
CONTEXT_READOUT = (
    ("at_4k", "Tokens/s per sequence at 4K", "rate"),
    ("at_32k", "Tokens/s per sequence at 32K", "rate"),
    ("slowdown", "4K is faster than 32K by", "ratio"),
    ("kv_equals_weights_context", "Context where KV reads equal weights", "count"),
)


def _context_compute(state):
    grid = np.array(CONTEXT_GRID, dtype=float)
    s = _step({**state, "context": grid})
    four, thirty_two = CONTEXT_GRID.index(SHORT_CONTEXT), CONTEXT_GRID.index(LONG_CONTEXT)
    crossover = s.weight_read_bytes / (state["batch"] * s.kv_bytes_per_token)
    return {
        "sources": {
            "curve": {
                "context": grid.tolist(),
                "per_sequence": s.tokens_per_s_per_sequence.tolist(),
                "weights": np.broadcast_to(s.weight_read_bytes, grid.shape).tolist(),
                "kv_read": s.kv_read_bytes.tolist(),
            }
        },
        "values": {
            "at_4k": float(s.tokens_per_s_per_sequence[four]),
            "at_32k": float(s.tokens_per_s_per_sequence[thirty_two]),
            "slowdown": float(
                s.tokens_per_s_per_sequence[four] / s.tokens_per_s_per_sequence[thirty_two]
            ),
            "kv_equals_weights_context": float(np.floor(crossover)),
        },
    }


def _context_figures(src):
    from bokeh.layouts import column

    speed = style.new_figure(
        "Decode speed against context",
        "context (tokens)",
        "tokens per second, each sequence",
        x_axis_type="log",
    )
    line = speed.line("context", "per_sequence", source=src["curve"], color=style.BLUE, width=2.5)
    speed.xaxis.formatter = style.count_ticks()
    style.hover(
        speed,
        [("context", "@context{0,0}"), ("tokens/s", "@per_sequence{0,0.0}")],
        [line],
        mode="vline",
    )
    split = style.new_figure(
        "Bytes per step: weights vs KV history",
        "context (tokens)",
        "bytes per step",
        x_axis_type="log",
        y_axis_type="log",
        height=240,
        x_range=speed.x_range,
    )
    split.line(
        "context",
        "weights",
        source=src["curve"],
        color=style.WEIGHTS,
        width=2.5,
        legend_label="weights",
    )
    split.line(
        "context",
        "kv_read",
        source=src["curve"],
        color=style.KV_READ,
        width=2.5,
        legend_label="KV history",
    )
    split.xaxis.formatter = style.count_ticks()
    split.yaxis.formatter = style.si_ticks("B")
    split.legend.location = "top_left"
    return column(speed, split)


def context_panel() -> Panel:
    """Per-sequence speed against context: KV reads catch up with the weights."""

    controls = (
        model_control(),
        hardware_control(),
        batch_control(),
        dtype_control("weight_dtype", "Weights"),
        dtype_control("kv_dtype", "KV cache"),
        efficiency_control(),
    )
    terms = {
        **_terms(),
        "contexts": list(CONTEXT_GRID),
        "short": CONTEXT_GRID.index(SHORT_CONTEXT),
        "long": CONTEXT_GRID.index(LONG_CONTEXT),
    }
    return Panel(
        "context", controls, _context_compute, _context_figures, "context", terms, CONTEXT_READOUT
    )

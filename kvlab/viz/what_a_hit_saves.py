"""Chapter 1 panel: what a prefix/KV-cache hit saves (prefill compute) and what it does
not (the bytes every decode step moves)."""

from __future__ import annotations

import math

import numpy as np

from .. import cost
from ..deployment import Deployment
from ..hardware import devices
from ..models import models
from ..prompt import served_tokens
from . import style
from .controls import (
    HIT_GRID,
    batch_control,
    context_control,
    hardware_control,
    hit_control,
    model_control,
)
from .panel import Panel
from .terms import ledger_terms

DTYPES_USED = {"weight_dtype": "fp16", "kv_dtype": "fp16"}  # the panel has no dtype controls
HIT_READOUT = (
    ("cached_tokens", "Prompt tokens served by the cache", "count"),
    ("ttft_s", "Time to first token (TTFT)", "seconds"),
    ("ttft_miss_s", "TTFT with no hit", "seconds"),
    ("prefill_flops_saved", "Prefill FLOPs the hit skipped", "percent"),
    ("step_bytes", "Bytes each decode step still moves", "bytes"),
    ("step_time_s", "Time per output token (TPOT)", "seconds"),
    ("tokens_per_s", "Tokens/s, whole batch", "rate"),
)


def cached_tokens(hit: float, prompt_tokens: int) -> int:
    """Tokens of a prompt that a hit fraction serves from the prefix cache. Even a full hit
    computes the last prompt token, whose logits give the first output token. The browser's
    twin is `cachedTokens` in js/what_a_hit_saves.js (on KVLAB.servedTokens, kvlab.prompt's
    twin)."""
    return served_tokens(math.floor(hit * prompt_tokens), int(prompt_tokens))


def _hit_compute(state):
    hits = np.array(HIT_GRID)
    prompt, batch = state["context"], state["batch"]
    d = Deployment(state["model"], state["hardware"], **DTYPES_USED)
    cached = served_tokens(np.floor(hits * prompt), prompt)
    curve = cost.prefill(d, prompt, cached_tokens=cached)
    miss = cost.prefill(d, prompt)
    here = cost.prefill(d, prompt, cached_tokens=cached_tokens(state["hit"], prompt))
    step = cost.decode_step(d, batch, prompt)
    tpot = np.full(hits.shape, step.step_time_s)
    return {
        "sources": {
            "curve": {
                "hit": (100 * hits).tolist(),
                "ttft_s": np.asarray(curve.ttft_s).tolist(),
                "tpot_s": tpot.tolist(),
            },
            "here": {
                "hit": [100 * state["hit"]],
                "ttft_s": [here.ttft_s],
                "tpot_s": [step.step_time_s],
            },
            "work": _work_sources(
                miss.flops, here.flops, step.weight_read_bytes, step.kv_read_bytes
            ),
        },
        "values": {
            "cached_tokens": here.cached_tokens,
            "ttft_s": here.ttft_s,
            "ttft_miss_s": miss.ttft_s,
            "prefill_flops_saved": 1.0 - here.flops / miss.flops,
            "step_bytes": step.step_bytes,
            "step_time_s": step.step_time_s,
            "tokens_per_s": step.tokens_per_s,
        },
    }


def _hit_figures(src):
    from bokeh.layouts import column, row

    fig = style.chart(
        "A hit moves TTFT, not TPOT",
        "prefix-cache hit (% of the prompt)",
        "seconds",
        "y",
        height=300,
    )
    curve, here = src["curve"], src["here"]
    a = style.line(fig, "hit", "ttft_s", curve, style.VERMILION, legend="time to first token")
    b = style.line(fig, "hit", "tpot_s", curve, dash="dashed", legend="time per output token")
    fig.scatter("hit", "ttft_s", source=here, size=10, color=style.VERMILION)
    fig.scatter("hit", "tpot_s", source=here, size=10, color=style.BLUE)
    style.finish(
        fig,
        y="seconds",
        legend="bottom_left",
        tips=[
            ("hit", "@hit{0}%"),
            ("TTFT", "@ttft_s{0.000000} s"),
            ("TPOT", "@tpot_s{0.000000} s"),
        ],
        on=[a, b],
        mode="vline",
    )
    bars = [
        style.bars(
            title,
            y_label,
            WORK_LABELS[x],
            x,
            top,
            src["work"],
            color,
            y=unit,
            width=330,
            height=260,
        )
        for title, y_label, x, top, color, unit in WORK_BARS
    ]
    return column(fig, row(*bars))


def _hit_budget(state):
    return {
        "model": state["model"],
        "hardware": state["hardware"],
        "batch": state["batch"],
        "context": state["context"],
        "cached": cached_tokens(state["hit"], state["context"]),
    }


def hit_panel() -> Panel:
    """TTFT and TPOT against the prefix-cache hit fraction."""

    controls = (
        model_control(),
        hardware_control(),
        context_control(8192, "Prompt (tokens)"),
        hit_control(),
        batch_control(),
    )

    terms = {
        **ledger_terms(models(), devices()),
        "hits": list(HIT_GRID),
        "dtypes_used": DTYPES_USED,
        "work": WORK_LABELS,
    }
    return Panel(
        "hits", controls, _hit_compute, _hit_figures, "hits", terms, HIT_READOUT, _hit_budget
    )


#: The work bars' categories and colors: prefill FLOPs (computed, skipped), decode bytes by kind.
WORK_LABELS = {
    "kind": ("computed", "skipped"),
    "color": (style.VERMILION, style.GREY),
    "part": ("weights", "KV history"),
    "part_color": (style.WEIGHTS, style.KV_READ),
}
#: The two work figures: (title, y label, category column, value column, colour column, unit).
WORK_BARS = (
    ("Prefill FLOPs", "FLOPs", "kind", "flops", "color", "FLOP"),
    ("Bytes per decode step", "bytes", "part", "bytes", "part_color", "B"),
)


def _work_sources(miss_flops, here_flops, weight_bytes, kv_bytes) -> dict:
    """The work bars: prefill FLOPs computed and skipped, decode bytes by kind."""
    return {
        **{k: list(v) for k, v in WORK_LABELS.items()},
        "flops": [here_flops, miss_flops - here_flops],
        "bytes": [weight_bytes, kv_bytes],
    }

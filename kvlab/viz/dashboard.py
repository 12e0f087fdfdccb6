"""The dashboard: every control on one page, the whole ledger updating live (Voila).

Live only: it combines the ledger, memory fit, the roofline position, where the KV is
read from, the value of a cache hit and a prefill-to-decode transfer, all from kvlab.
"""

from __future__ import annotations

import numpy as np

from .. import cost, tiers
from ..hardware import get_tier
from ..sim import SimConfig
from . import style
from .controls import (
    batch_control,
    context_control,
    deployment,
    dtype_control,
    efficiency_control,
    hardware_control,
    hit_control,
    model_control,
)
from .decode_step import BYTES_Y, bytes_figure
from .panel import Control, Panel

PLACEMENTS = (
    "hbm",
    "peer-nvlink4",
    "host-pcie5",
    "host-pcie4",
    "remote-ib-400g",
    "remote-ib-200g",
    "remote-10gbe",
)
LINKS = ("nvlink4", "ib-400g", "ib-200g", "ethernet-10g")

DASHBOARD_READOUT = (
    ("weight_read_bytes", "Weights read per step", "bytes"),
    ("kv_read_bytes", "KV history read per step", "bytes"),
    ("step_time_s", "TPOT, KV in HBM", "seconds"),
    ("tokens_per_s", "Ceiling, tokens/s (whole batch)", "rate"),
    ("tokens_per_s_per_sequence", "Ceiling, tokens/s per sequence", "rate"),
    ("bound", "Bound by", "text"),
    ("arithmetic_intensity", "Arithmetic intensity", "intensity"),
    ("ridge_flops_per_byte", "Ridge point", "intensity"),
    ("memory_needed_bytes", "Memory needed (weights + KV)", "bytes"),
    ("fits", "Fits in device memory", "yesno"),
    ("max_batch", "Largest batch that fits", "count"),
    ("tier_tokens_per_s", "Tokens/s with KV read from the tier", "rate"),
    ("tier_slowdown", "Slowdown against HBM", "ratio"),
    ("hit_value_s", "Value of a hit (saved - fetch)", "seconds"),
    ("hit_ttft_s", "TTFT with the hit", "seconds"),
    ("miss_ttft_s", "TTFT without it", "seconds"),
    ("transfer_s", "One request's KV over the link", "seconds"),
    ("transfer_steps", "... in decode steps", "ratio"),
)


def _dashboard_compute(state):
    d = deployment(state)
    step = cost.decode_step(d, state["batch"], state["context"])
    tier = state["kv_tier"]
    placed = (
        step
        if tier == "hbm"
        else tiers.tiered_decode_step(d, state["batch"], state["context"], tier)
    )
    hit_tier = "host-pcie5" if tier == "hbm" else tier
    hit = tiers.hit_value(d, state["context"], hit_tier, state["hit"])
    transfer = step.kv_cache_bytes / state["batch"] / get_tier(state["link"]).bandwidth_bytes_per_s
    peak = step.ridge_flops_per_byte * step.bandwidth_bytes_per_s
    x = np.logspace(-1, 4, 41)
    values = {
        **step.to_dict(),
        "tier_tokens_per_s": placed.tokens_per_s,
        "tier_slowdown": 1.0 if tier == "hbm" else placed.slowdown,
        "hit_value_s": hit.value_s,
        "hit_ttft_s": hit.hit_time_s,
        "miss_ttft_s": hit.miss_time_s,
        "transfer_s": transfer,
        "transfer_steps": transfer / step.step_time_s,
    }
    return {
        "sources": {
            "bytes": {
                "y": list(BYTES_Y),
                "weights": [step.weight_read_bytes],
                "kv_read": [step.kv_read_bytes],
                "kv_write": [step.kv_write_bytes],
            },
            "roof": {
                "x": x.tolist(),
                "y": (
                    np.minimum(peak, x * step.bandwidth_bytes_per_s) * state["efficiency"]
                ).tolist(),
            },
            "point": {"x": [step.arithmetic_intensity], "y": [step.flops / step.step_time_s]},
        },
        "values": values,
    }


def _dashboard_figures(src):
    from bokeh.layouts import column

    bytes_fig = bytes_figure(src["bytes"], width=560)
    roof = style.new_figure(
        "Roofline position",
        "FLOPs per byte",
        "FLOP/s",
        x_axis_type="log",
        y_axis_type="log",
        height=280,
        width=560,
    )
    roof.line("x", "y", source=src["roof"], color=style.GREY, width=3)
    roof.scatter("x", "y", source=src["point"], size=13, color=style.BLUE)
    roof.yaxis.formatter = style.si_ticks("FLOP/s")
    roof.xaxis.formatter = style.count_ticks()
    return column(bytes_fig, roof)


def dashboard_panel() -> Panel:
    """All controls, the ledger, fit, roofline, tier, cache value and transfer."""

    controls = (
        model_control(),
        hardware_control(),
        batch_control(),
        context_control(),
        dtype_control("weight_dtype", "Weights"),
        dtype_control("kv_dtype", "KV cache"),
        efficiency_control(),
        Control("kv_tier", "KV read from", PLACEMENTS, "hbm"),
        # one 400 Gb/s NIC per GPU, as in current nodes and the simulator's default
        Control("link", "Prefill→decode link", LINKS, SimConfig().link),
        hit_control(0.9),
    )
    return Panel(
        "dashboard",
        controls,
        _dashboard_compute,
        _dashboard_figures,
        js="",
        readout=DASHBOARD_READOUT,
    )

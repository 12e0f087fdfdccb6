"""Chapter 5b, "Prefix caching on real traffic": what the Mooncake traces share, hit
ratio against capacity and policy, what it buys in TTFT, and why granularity matters."""
from __future__ import annotations

import functools
import math

import numpy as np

from .. import fmt, prefix
from ..traces import trace_or_generated, trace_stats


@functools.cache
def panels() -> dict:
    from ..viz import prefix_panels

    return {"capacity": prefix_panels.capacity_panel(), "latency": prefix_panels.latency_panel(),
            "granularity": prefix_panels.granularity_panel()}


def suffix_where_ttft_halves(values) -> float:
    """The unique-message length at which token-granular caching halves the whole-request
    cache's TTFT, interpolated (in log length) on the sweep `values`; NaN if not monotonic."""
    s = prefix.granularity_sweep("first_message_tokens", values)
    ratio, logs = s["ttft_ratio"], np.log(np.asarray(values, dtype=float))
    return float(np.exp(np.interp(0.5, ratio, logs))) if np.all(np.diff(ratio) > 0) else math.nan


def numbers() -> dict[str, str]:
    from ..viz.prefix_panels import SWEEP_VALUES

    conv = trace_or_generated("conversation")
    stats = trace_stats(conv)
    out = {
        "conv_label": conv.label,
        "conv_requests": fmt.fixed(stats.requests, 0),
        "conv_hours": fmt.sig(stats.duration_s / 3600, 2),
        "conv_mean_input": fmt.fixed(stats.mean_input_tokens, 0),
        "conv_shared": fmt.percent(stats.shared_prefix_share),
        "block_tokens": fmt.fixed(conv.block_tokens, 0),
        "conv_reusable": fmt.percent(stats.reusable_token_share),
    }
    p = panels()
    for panel in p.values():
        out.update(panel.readout_texts())
    gran = p["granularity"]
    out.update(gran.readout_texts("gran_big", suffix=SWEEP_VALUES[-1]))
    out.update(gran.readout_texts("gran_small", suffix=SWEEP_VALUES[0]))
    out.update({
        "gran_suffix": fmt.fixed(gran.default_state["suffix"], 0),
        "gran_big_suffix": fmt.fixed(SWEEP_VALUES[-1], 0),
        "gran_small_suffix": fmt.fixed(SWEEP_VALUES[0], 0),
        "gran_half_suffix": fmt.fixed(suffix_where_ttft_halves(SWEEP_VALUES), 0),
    })
    return out

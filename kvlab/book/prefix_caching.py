"""Chapter 5b, "Prefix caching on real traffic": what the Mooncake traces share, hit
ratio against capacity and policy, what it buys in TTFT, and why granularity matters."""

from __future__ import annotations

import functools
import math

import numpy as np

from .. import fmt, prefix
from ..traces import trace_or_generated, trace_stats
from ..viz.i18n import t
from .lang import pick


@functools.cache
def panels() -> dict:
    from ..viz import prefix_panels

    return {
        "capacity": prefix_panels.capacity_panel(),
        "latency": prefix_panels.latency_panel(),
        "granularity": prefix_panels.granularity_panel(),
    }


@functools.cache
def capacity_curve(trace_name: str = "conversation") -> dict:
    """Hit ratios against capacity for every policy (kvlab.prefix.hit_ratio_curve)."""
    return prefix.hit_ratio_curve(trace_or_generated(trace_name), model="llama-3.1-8b")


def definitions_disagree(curve: dict, policy: str = "lru") -> tuple[float, float]:
    """(least, most): how many times the request-level hit rate exceeds the token hit ratio
    over the curve's cache sizes."""
    p = curve["policies"][policy]
    ratio = p["request_hit_rate"] / p["token_hit_ratio"]
    return float(ratio.min()), float(ratio.max())


def widest_policy_gap(curve: dict, better: str = "lru", worse: str = "length-aware") -> dict:
    """The cache size at which `worse` trails `better` most: its share of the trace's distinct
    blocks and the two token hit ratios there."""
    a, b = curve["policies"][better]["token_hit_ratio"], curve["policies"][worse]["token_hit_ratio"]
    i = int(np.argmax(a - b))
    caps = curve["capacity_blocks"]
    return {"share_of_blocks": float(caps[i] / caps.max()), better: float(a[i]), worse: float(b[i])}


def suffix_where_ttft_halves(values) -> float:
    """The unique-message length at which token-granular caching halves the whole-request
    cache's TTFT, interpolated (in log length) on the sweep `values`; NaN if not monotonic."""
    s = prefix.granularity_sweep("first_message_tokens", values)
    ratio, logs = s["ttft_ratio"], np.log(np.asarray(values, dtype=float))
    return float(np.exp(np.interp(0.5, ratio, logs))) if np.all(np.diff(ratio) > 0) else math.nan


def shared_requests_words(shared: int, requests: int) -> str:
    """How many requests begin with a block seen before, said exactly where a percentage
    would round to 100%: 'all but one of its 12,031 requests'."""
    n, total = requests - shared, fmt.fixed(requests, 0)
    if n == 0:
        return pick(f"all {total} of its requests", f"全部 {total} 个请求")
    if n < 10:
        # in words in both editions, as the English says "one": the numbers match
        few = pick(
            ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine")[n - 1],
            "一二三四五六七八九"[n - 1],
        )
        return pick(
            f"all but {few} of its {total} requests",
            f"{total} 个请求中除{few}个以外的所有请求",
        )
    return pick(
        f"{fmt.percent(shared / requests)} of its requests",
        f"{fmt.percent(shared / requests)} 的请求",
    )


def numbers() -> dict[str, str]:
    from ..viz.prefix_panels import SWEEP_VALUES

    conv = trace_or_generated("conversation")
    stats = trace_stats(conv)
    out = {
        "conv_label": t(conv.label),  # 'conversation (generated)' where the trace is absent
        "conv_requests": fmt.fixed(stats.requests, 0),
        "conv_hours": fmt.sig(stats.duration_s / 3600, 2),
        "conv_mean_input": fmt.fixed(stats.mean_input_tokens, 0),
        "conv_shared": fmt.percent(stats.shared_prefix_share),
        "conv_shared_requests": shared_requests_words(stats.shared_prefix_requests, stats.requests),
        "block_tokens": fmt.fixed(conv.block_tokens, 0),
        "conv_reusable": fmt.percent(stats.reusable_token_share),
    }
    unlimited = prefix.replay(conv, math.inf)
    out["capacity_hit_requests"] = shared_requests_words(
        round(unlimited.request_hit_rate * unlimited.requests), unlimited.requests
    )
    curve = capacity_curve()
    least, most = definitions_disagree(curve)
    gap = widest_policy_gap(curve)
    out.update(
        {
            "defs_least": fmt.sig(least, 2),
            "defs_most": fmt.sig(most, 2),
            "gap_share": fmt.percent(gap["share_of_blocks"]),
            "gap_lru": fmt.percent(gap["lru"]),
            "gap_length_aware": fmt.percent(gap["length-aware"]),
        }
    )
    p = panels()
    for panel in p.values():
        out.update(panel.readout_texts())
    gran = p["granularity"]
    out.update(gran.readout_texts("gran_big", suffix=SWEEP_VALUES[-1]))
    out.update(gran.readout_texts("gran_small", suffix=SWEEP_VALUES[0]))
    out.update(
        {
            "gran_suffix": fmt.fixed(gran.default_state["suffix"], 0),
            "gran_big_suffix": fmt.fixed(SWEEP_VALUES[-1], 0),
            "gran_small_suffix": fmt.fixed(SWEEP_VALUES[0], 0),
            "gran_half_suffix": fmt.fixed(suffix_where_ttft_halves(SWEEP_VALUES), 0),
        }
    )
    return out

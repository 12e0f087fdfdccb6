"""Chapter 5 (hit rate) panels: prefix caching on the real traces and pitfall 3.

Trace replays are too heavy to redo in the browser, so these are lookup panels: kvlab
replays every grid state at build time and the page looks results up.
"""

from __future__ import annotations

import numpy as np

from .. import prefix
from ..traces import trace_or_generated, trace_stats
from . import style
from .controls import log_slider
from .panel import Control, lookup_panel

TRACES = ("conversation", "synthetic")
POLICY_COLORS = {"lru": style.BLUE, "lfu": style.ORANGE, "length-aware": style.GREEN}
SWEEP_VALUES = (250, 500, 1000, 2000, 4000, 8000)


def trace_control() -> Control:
    return Control("trace", "Trace", TRACES, "conversation")


# ------------------------------------------------------------ capacity curves
CAPACITY_READOUT = (
    ("requests_sharing", "Requests whose first block was seen before", "percent"),
    ("unlimited_token_hit_ratio", "Token hit ratio, unlimited cache", "percent"),
    ("unlimited_request_hit_rate", "Request-level hit rate, unlimited cache", "percent"),
    ("half_capacity_lru", "Token hit ratio, LRU at half the trace's blocks", "percent"),
)


def capacity_panel(curve_of):
    """Token hit ratio against cache capacity for each eviction policy, on a trace.
    `curve_of(trace name)`: that trace's kvlab.prefix.hit_ratio_curve (the book's stored
    curves, kvlab.book.prefix_caching.capacity_curve, which the prose reads too)."""

    def compute(state):
        trace = trace_or_generated(state["trace"])
        curve = curve_of(state["trace"])
        caps = curve["capacity_tokens"].astype(float)
        half = int(
            np.argmin(np.abs(curve["capacity_blocks"] / curve["capacity_blocks"].max() - 0.5))
        )
        stats = trace_stats(trace)
        sources = {
            p: {
                "tokens": caps.tolist(),
                "gb": (curve["capacity_bytes"] / 1e9).tolist(),
                "token_hit": v["token_hit_ratio"].tolist(),
                "request_hit": v["request_hit_rate"].tolist(),
            }
            for p, v in curve["policies"].items()
        }
        return {
            "sources": sources,
            "values": {
                "trace": trace.label,
                "requests_sharing": stats.shared_prefix_share,
                "unlimited_token_hit_ratio": curve["infinite"]["token_hit_ratio"],
                "unlimited_request_hit_rate": curve["infinite"]["request_hit_rate"],
                "half_capacity_lru": float(curve["policies"]["lru"]["token_hit_ratio"][half]),
            },
        }

    def figures(src):
        fig = style.chart(
            "Prefix-cache hit ratio against capacity",
            "cache capacity (tokens of KV)",
            "share of prompt tokens served",
            "x",
            y_range=(0, 1),
            height=340,
        )
        renderers = [
            style.line(fig, "tokens", "token_hit", src[p], c, legend=f"{p}: token hit ratio")
            for p, c in POLICY_COLORS.items()
        ]
        request = "lru: request-level hit rate"
        style.line(
            fig, "tokens", "request_hit", src["lru"], style.GREY, 2, dash="dashed", legend=request
        )
        tips = [
            ("capacity", "@tokens{0,0} tokens (@gb{0.0} GB for Llama 3.1 8B)"),
            ("token hit ratio", "@token_hit{0.0%}"),
            ("request hit rate", "@request_hit{0.0%}"),
        ]
        return style.finish(
            fig, x="count", y="percent", legend="top_left", tips=tips, on=renderers, mode="vline"
        )

    readout = (("trace", "Trace", "text"),) + CAPACITY_READOUT
    return lookup_panel("capacity", (trace_control(),), compute, figures, readout)


# ------------------------------------------------------------ TTFT and TPOT
LATENCY_READOUT = (
    ("no_cache_ttft_s", "Mean TTFT, no prefix cache", "seconds"),
    ("hbm_ttft_s", "Mean TTFT, unlimited cache in HBM", "seconds"),
    ("remote_ttft_s", "... cache on a remote node (400G)", "seconds"),
    ("tpot_s", "TPOT at any hit ratio", "seconds"),
)


def latency_panel():
    """Mean TTFT and TPOT against the token hit ratio, for where the cache lives."""

    def compute(state):
        trace = trace_or_generated(state["trace"])
        out = prefix.latency_vs_hit_ratio(trace)
        hit = out["token_hit_ratio"]
        sources = {
            f"tier{i}": {"hit": hit.tolist(), "ttft": v.tolist()}
            for i, v in enumerate(out["mean_ttft_s"].values())
        }
        sources["tpot"] = {"hit": hit.tolist(), "tpot": out["mean_tpot_s"].tolist()}
        ttfts = list(out["mean_ttft_s"].values())
        return {
            "sources": sources,
            "values": {
                "no_cache_ttft_s": out["no_cache_mean_ttft_s"],
                "hbm_ttft_s": float(ttfts[0][-1]),
                "remote_ttft_s": float(ttfts[-1][-1]),
                "tpot_s": float(out["mean_tpot_s"][0]),
            },
        }

    labels = list(prefix.KV_TIERS)

    def figures(src):
        fig = style.chart(
            "The hit ratio moves TTFT, never TPOT", "token hit ratio", "seconds", "y", height=330
        )
        colors = (style.VERMILION, style.PURPLE, style.SKY)
        for i, (label, color) in enumerate(zip(labels, colors, strict=True)):
            tier = src[f"tier{i}"]
            style.line(fig, "hit", "ttft", tier, color, legend=f"mean TTFT, {label}")
            fig.scatter("hit", "ttft", source=tier, color=color, size=6)
        style.line(fig, "hit", "tpot", src["tpot"], dash="dashed", legend="TPOT")
        return style.finish(fig, x="percent", y="seconds", legend="bottom_left")

    return lookup_panel("latency", (trace_control(),), compute, figures, LATENCY_READOUT)


# --------------------------------------------------------------- pitfall 3
GRANULARITY_READOUT = (
    ("whole_request_hit_rate", "Whole-request cache: request-level hit rate", "percent"),
    ("whole_token_hit_ratio", "... prompt tokens actually skipped", "percent"),
    ("token_request_hit_rate", "Token-granular cache: request-level hit rate", "percent"),
    ("token_token_hit_ratio", "... prompt tokens actually skipped", "percent"),
    ("whole_ttft_s", "Mean TTFT, whole-request cache", "seconds"),
    ("token_ttft_s", "Mean TTFT, token-granular cache", "seconds"),
    ("ttft_ratio", "TTFT, token-granular / whole-request", "ratio"),
)


def _granularity_figures(src):
    from bokeh.layouts import row
    from bokeh.transform import dodge

    hits = style.new_figure(
        "Two hit rates",
        "",
        "share",
        x_range=["request-level hit rate", "tokens skipped"],
        y_range=(0, 1.05),
        width=340,
        height=300,
    )
    hits.vbar(
        x=dodge("metric", -0.17, range=hits.x_range),
        top="whole",
        width=0.3,
        source=src["hits"],
        color=style.ORANGE,
        legend_label="whole-request",
    )
    hits.vbar(
        x=dodge("metric", 0.17, range=hits.x_range),
        top="token",
        width=0.3,
        source=src["hits"],
        color=style.BLUE,
        legend_label="token-granular",
    )
    style.finish(hits, y="percent")
    hits.legend.orientation = "horizontal"
    hits.add_layout(hits.legend[0], "below")
    caches = ["no cache", "whole-request", "token-granular"]
    ttft = style.bars(
        "Mean time to first token",
        "seconds",
        caches,
        "cache",
        "ttft",
        src["ttft"],
        y="seconds",
        width=340,
        height=300,
    )
    return row(hits, ttft)


def granularity_panel():
    """Whole-request vs token-granular caching as requests' unique suffixes grow."""
    sweep_cache = {}

    def sweep():
        if "s" not in sweep_cache:
            sweep_cache["s"] = prefix.granularity_sweep("first_message_tokens", SWEEP_VALUES)
        return sweep_cache["s"]

    def compute(state):
        s = (
            sweep()
            if state["suffix"] in SWEEP_VALUES
            else prefix.granularity_sweep("first_message_tokens", (state["suffix"],))
        )
        i = list(s["values"]).index(state["suffix"])
        whole, token = s["caches"]["whole-request"], s["caches"]["token"]
        metrics = ["request-level hit rate", "tokens skipped"]
        return {
            "sources": {
                "hits": {
                    "metric": metrics,
                    "whole": [whole["request_hit_rate"][i], whole["token_hit_ratio"][i]],
                    "token": [token["request_hit_rate"][i], token["token_hit_ratio"][i]],
                },
                "ttft": {
                    "cache": ["no cache", "whole-request", "token-granular"],
                    "ttft": [
                        s["no_cache_mean_ttft_s"][i],
                        whole["mean_ttft_s"][i],
                        token["mean_ttft_s"][i],
                    ],
                    "color": [style.GREY, style.ORANGE, style.BLUE],
                },
            },
            "values": {
                "whole_request_hit_rate": whole["request_hit_rate"][i],
                "whole_token_hit_ratio": whole["token_hit_ratio"][i],
                "token_request_hit_rate": token["request_hit_rate"][i],
                "token_token_hit_ratio": token["token_hit_ratio"][i],
                "whole_ttft_s": whole["mean_ttft_s"][i],
                "token_ttft_s": token["mean_ttft_s"][i],
                "ttft_ratio": s["ttft_ratio"][i],
            },
        }

    control = log_slider(
        "suffix", "Unique first message (tokens)", SWEEP_VALUES, 1000, (100, 16000)
    )
    return lookup_panel(
        "granularity", (control,), compute, _granularity_figures, GRANULARITY_READOUT
    )

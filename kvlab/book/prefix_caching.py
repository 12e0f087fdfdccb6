"""Chapter 5b, "Prefix caching on real traffic": what the Mooncake traces share, hit
ratio against capacity and policy, what it buys in TTFT, and why granularity matters."""

from __future__ import annotations

import functools
import math

import numpy as np

from .. import fmt, prefix
from ..deployment import Deployment, KernelTables
from ..hardware import get_device
from ..models import get_model
from ..prefix import latency
from ..traces import trace_or_generated, trace_stats
from ..viz.i18n import t
from . import run_cache
from .lang import pick

#: The model whose KV the capacity curves are sized in (bytes on the figure's hover).
CURVE_MODEL = "llama-3.1-8b"


@functools.cache
def panels() -> dict:
    from ..viz import prefix_caching as figures  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    return {
        "capacity": figures.capacity_panel(capacity_curve),
        "latency": figures.latency_panel(),
        "granularity": figures.granularity_panel(),
    }


@functools.cache
def capacity_curve(trace_name: str = "conversation") -> dict:
    """Hit ratios against capacity for every policy (kvlab.prefix.hit_ratio_curve): ~10 s of
    replays per trace, so stored once per build (kvlab.book.run_cache, warmed by
    kvlab.book.warm) and read by the prose's numbers, the figure, both editions and the tests
    that run the chapter. Keyed by the trace that will be used (real or generated)."""
    trace = trace_or_generated(trace_name)
    key = (trace.label, trace.generated, len(trace), CURVE_MODEL)
    return run_cache.cached(
        f"ch5b-capacity-{trace_name}",
        key,
        lambda: prefix.hit_ratio_curve(trace, model=CURVE_MODEL),
    )


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


#: The decode batch the latency figure's TPOT is priced at (kvlab.prefix.latency's default).
LATENCY_BATCH = 16


def latency_conditions(trace=None) -> dict:
    """What the TTFT/TPOT figure assumes, and the same figure's numbers with step times from
    measured kernels instead of the ceiling. The kernel tables cover prompts and decode
    contexts up to a length, so both speeds are given on the requests they cover (an
    unlimited LRU cache, KV resident in HBM, each request alone, no queueing)."""
    trace = trace_or_generated("conversation") if trace is None else trace
    inputs, outputs = trace.input_tokens, trace.output_tokens
    hits = prefix.replay(trace, math.inf).hit_tokens_per_request
    context = latency.mean_decode_context(inputs, outputs)
    ceiling = latency.default_deployment()
    measured = Deployment(ceiling.model, ceiling.hardware, speed=KernelTables())
    out = {}
    for name, d in (("ceiling", ceiling), ("measured", measured)):
        out[name] = {
            "no_cache": latency.ttft_s(d, inputs, 0),
            "hbm": latency.ttft_s(d, inputs, hits),
            "tpot": latency.tpot_s(d, context, LATENCY_BATCH),
        }
    m = out["measured"]
    covered = ~(np.isnan(m["no_cache"]) | np.isnan(m["hbm"]) | np.isnan(m["tpot"]))
    return {
        "model": get_model(latency.DEFAULT_MODEL).display_name,
        "device": get_device(latency.DEFAULT_HARDWARE).display_name,
        "covered_share": float(covered.mean()),
        "covered_max_prompt": int(inputs[covered].max()),
        **{
            f"{name}_{k}_s": float(v[covered].mean())
            for name, runs in out.items()
            for k, v in runs.items()
        },
    }


def numbers() -> dict[str, str]:
    from ..viz.prefix_caching import SWEEP_VALUES  # noqa: PLC0415 - bokeh loads only when a figure is drawn

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
    lc = latency_conditions(conv)
    out.update(
        {
            "lat_setup": pick(
                f"{lc['model']} on one {lc['device']}", f"单块 {lc['device']} 上的 {lc['model']}"
            ),
            "lat_batch": fmt.fixed(LATENCY_BATCH, 0),
            "lat_covered": fmt.percent(lc["covered_share"]),
            "lat_covered_max": fmt.fixed(lc["covered_max_prompt"], 0),
            **{
                f"lat_{name}_{k}": fmt.seconds(lc[f"{name}_{k}_s"])
                for name in ("ceiling", "measured")
                for k in ("no_cache", "hbm", "tpot")
            },
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

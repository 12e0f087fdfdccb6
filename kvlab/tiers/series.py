"""Plot-ready series of the tier model: one decode speed or prefill time per placement,
over a grid of contexts, hit rates or links. Plain numpy arrays in dicts, no plotting
library; the book's figures draw them (kvlab.viz.beyond_hbm).
"""

from __future__ import annotations

import numpy as np

from ..cost import decode_step
from ..deployment import Deployment
from ..hardware import get_tier
from .capacity import kv_footprint
from .decode import tiered_decode_step
from .hit import hit_value, mean_prefill_time_s
from .placement import PLACEMENT_NAMES, TierPath, get_placement, kv_fetch_time_s

CONTEXTS = 2 ** np.arange(9, 18)  # 512 .. 131072 tokens


def tier_throughput_series(
    d: Deployment,
    batch,
    contexts=CONTEXTS,
    placements=PLACEMENT_NAMES,
    tier_efficiency=1.0,
    overlap=False,
) -> dict:
    """Tokens/s when every sequence's KV is read from each placement every step."""
    c = np.asarray(contexts, dtype=np.int64)
    fits = np.asarray(kv_footprint(d, batch, c).fits)
    out = {
        "model": d.model.name,
        "hardware": d.hardware.name,
        "batch": batch,
        "contexts": c,
        "fits_in_hbm": fits,
        "placements": {},
    }
    for name in placements:
        p = get_placement(name)
        step = tiered_decode_step(d, batch, c, TierPath(p, tier_efficiency), overlap=overlap)
        out["placements"][name] = {
            "description": p.description,
            "bottleneck": p.bottleneck,
            "bandwidth_bytes_per_s": p.bandwidth_bytes_per_s(d.hardware),
            "tokens_per_s": np.asarray(step.tokens_per_s),
            "step_time_s": np.asarray(step.step_time_s),
            "slowdown": np.asarray(step.slowdown),
            "bound": np.asarray(step.bound),
        }
    return out


def hit_rate_series(
    d: Deployment, prompt_tokens, hit_rates, placements=PLACEMENT_NAMES, tier_efficiency=1.0
) -> dict:
    """Mean prefill time against hit rate: falls for a cache worth having, rises for a liability."""
    rates = np.asarray(hit_rates, dtype=float)
    out = {
        "model": d.model.name,
        "hardware": d.hardware.name,
        "prompt_tokens": prompt_tokens,
        "hit_rates": rates,
        "placements": {},
    }
    for name in placements:
        h = hit_value(d, prompt_tokens, TierPath(name, tier_efficiency))
        out["miss_time_s"] = h.miss_time_s
        out["placements"][name] = {
            "mean_prefill_time_s": np.asarray(mean_prefill_time_s(h, rates)),
            "hit_time_s": h.hit_time_s,
            "value_s": h.value_s,
            "liability": h.liability,
        }
    return out


def pd_series(d: Deployment, context, batch, links, tier_efficiency=1.0) -> dict:
    """PD disaggregation: a batch's KV over each link against one decode step, and the
    remote-KV-every-step disaster (tokens/s if decode read that KV over the link each step).

    `links`: {name: (where, bandwidth_bytes_per_s or None)}, `where` a catalogue tier or
    placement name, a `Tier` or a `Placement`; a bandwidth overrides the path's own (a
    figure quoted somewhere, for instance) while its per-fetch latency stays.
    """
    step = decode_step(d, batch, context)
    kv = batch * context * d.kv_bytes_per_token
    out = {
        "model": d.model.name,
        "hardware": d.hardware.name,
        "context": context,
        "batch": batch,
        "kv_bytes": kv,
        "decode_step_s": step.step_time_s,
        "local_tokens_per_s": step.tokens_per_s,
        "links": {},
    }
    for name, (where, bw) in links.items():
        where = (
            get_tier(where) if isinstance(where, str) and where not in PLACEMENT_NAMES else where
        )
        path = TierPath(where, tier_efficiency, bw)
        transfer = kv_fetch_time_s(d, batch * context, path)
        remote = tiered_decode_step(d, batch, context, path)
        out["links"][name] = {
            "bandwidth_bytes_per_s": bw or get_placement(where).bandwidth_bytes_per_s(d.hardware),
            "transfer_s": transfer,
            "decode_steps_per_transfer": transfer / step.step_time_s,
            "every_step_time_s": remote.step_time_s,
            "every_step_tokens_per_s": remote.tokens_per_s,
            "every_step_slowdown": remote.slowdown,
        }
    return out

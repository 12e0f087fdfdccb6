"""The value of a prefix-cache hit: recompute time saved minus fetch time.

A hit served from a slow placement can cost more than recomputing the prefix from
HBM-resident weights; then a higher hit rate makes prefill slower (the article's
"99% hit rate, slower than a miss").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from .. import cost
from ..cost import Num, Result, _out, prefill
from ..deployment import Deployment
from ..errors import check_number
from ..prompt import served_tokens
from .placement import TierPath, as_path, transfer_time_s

# ------------------------------------------------------------- the value of a hit


@dataclass(frozen=True)
class HitValue(Result):
    """A prefix-cache hit served from a placement, against recomputing the prefix in HBM."""

    placement: str
    prompt_tokens: Num
    cached_tokens: Num  # tokens whose KV the hit supplies
    fetch_bytes: Num
    tier_bandwidth_bytes_per_s: Num
    miss_time_s: Num  # prefill of the whole prompt
    hit_compute_time_s: Num  # prefill of the uncached rest
    fetch_time_s: Num  # bringing the cached KV over the placement's path
    hit_time_s: Num  # fetch + rest (serial: the rest attends to the fetched KV)
    saved_s: Num  # recompute time the hit removes
    value_s: Num  # saved - fetch: < 0 means the cache is a liability
    liability: Num
    speedup: Num  # miss / hit
    breakeven_bandwidth_bytes_per_s: Num  # peak bandwidth where value = 0 (inf: never)


def hit_value(d: Deployment, prompt_tokens, path: TierPath | str, hit_fraction=1.0) -> HitValue:
    """Value of a cache hit = recompute time saved - fetch time (the article's formula).

    The hit supplies `hit_fraction` of the prompt's KV, never the last token: the first
    output token needs one forward pass (vLLM recomputes the last token of a full hit
    for the same reason; kvlab.prompt). The miss recomputes everything in HBM.
    """
    prompt = check_number(
        "prompt_tokens",
        prompt_tokens,
        minimum=1,
        allow_equal_min=True,
        maximum=cost.MAX_CONTEXT_TOKENS,
        integer=True,
    )
    frac = check_number("hit_fraction", hit_fraction, minimum=0, allow_equal_min=True, maximum=1.0)
    p_arr = np.asarray(prompt, dtype=float)
    cached = served_tokens(np.floor(np.asarray(frac) * p_arr), p_arr)
    cached, p_arr = np.broadcast_arrays(cached, p_arr)
    path = as_path(path)
    miss, rest = prefill(d, p_arr, 0), prefill(d, p_arr, cached)
    p, bandwidth, latency = path.resolve(d.hardware)
    fetch_bytes = cached * d.kv_bytes_per_token
    fetch = np.where(
        cached > 0, transfer_time_s(fetch_bytes, bandwidth, path.efficiency, latency), 0.0
    )
    miss_t, rest_t = np.asarray(miss.time_s, dtype=float), np.asarray(rest.time_s, dtype=float)
    saved = miss_t - rest_t
    value = saved - fetch
    with np.errstate(divide="ignore", invalid="ignore"):
        room = saved - latency
        breakeven = np.where(
            (room > 0) & (fetch_bytes > 0),
            fetch_bytes / (np.where(room > 0, room, 1.0) * np.asarray(path.efficiency)),
            np.inf,
        )
    return HitValue(
        placement=p.name,
        prompt_tokens=prompt,
        cached_tokens=_out(cached),
        fetch_bytes=_out(fetch_bytes),
        tier_bandwidth_bytes_per_s=_out(np.asarray(bandwidth, dtype=float)),
        miss_time_s=_out(miss_t),
        hit_compute_time_s=_out(rest_t),
        fetch_time_s=_out(fetch),
        hit_time_s=_out(fetch + rest_t),
        saved_s=_out(saved),
        value_s=_out(value),
        liability=_out(value < 0),
        speedup=_out(miss_t / (fetch + rest_t)),
        breakeven_bandwidth_bytes_per_s=_out(breakeven),
    )


def mean_prefill_time_s(hit: HitValue, hit_rate):
    """Mean prefill time at a hit rate: rate x hit time + (1 - rate) x miss time.

    With a liability cache (value < 0) this rises with the hit rate: the article's
    "99% hit rate, slower than a miss".
    """
    rate = check_number("hit_rate", hit_rate, minimum=0, allow_equal_min=True, maximum=1.0)
    r = np.asarray(rate, dtype=float)
    return _out(r * np.asarray(hit.hit_time_s) + (1 - r) * np.asarray(hit.miss_time_s))


def breakeven_prompt_tokens(d: Deployment, path: TierPath | str, hit_fraction=1.0, max_tokens=None):
    """The shortest prompt from which a hit pays (value > 0), or inf if none up to
    `max_tokens` (default: the model's max_position_embeddings, else 1M tokens).

    Vectorised over the path's bandwidth override. The first sign change on a log grid
    is bisected to the exact token, so value(result - 1) <= 0 < value(result). Short
    prompts never pay at batch 1: their prefill is weight-bound, so recomputing them
    costs the same single pass over the weights that the uncached last token needs.
    """
    path = as_path(path)
    m, tier_bandwidth_bytes_per_s = d.model, path.bandwidth_bytes_per_s
    limit = max_tokens or m.max_position_embeddings or 1 << 20
    limit = int(
        check_number(
            "max_tokens",
            limit,
            minimum=1,
            allow_equal_min=True,
            maximum=cost.MAX_CONTEXT_TOKENS,
            integer=True,
        )
    )
    bw = (
        None
        if tier_bandwidth_bytes_per_s is None
        else np.atleast_1d(
            check_number(
                "tier bandwidth (bytes/s)",
                tier_bandwidth_bytes_per_s,
                maximum=cost.MAX_BANDWIDTH_BYTES_PER_S,
            )
        )
    )
    columns = 1 if bw is None else bw.size

    def value(tokens):  # tokens: (rows, columns)
        at = path if bw is None else dataclasses.replace(path, bandwidth_bytes_per_s=bw)
        return np.asarray(hit_value(d, tokens, at, hit_fraction).value_s, dtype=float).reshape(
            tokens.shape
        )

    grid = np.unique(np.geomspace(1, limit, 200).astype(np.int64))
    vals = value(np.broadcast_to(grid[:, None], (grid.size, columns)).astype(float))
    ok = vals > 0
    first = np.where(ok.any(axis=0), ok.argmax(axis=0), -1)
    lo = np.where(first > 0, grid[np.maximum(first - 1, 0)], 0).astype(float)  # value(lo) <= 0
    hi = np.where(first >= 0, grid[np.maximum(first, 0)], np.inf)  # value(hi) > 0
    active = first > 0
    while True:
        step = active & (hi - lo > 1)
        if not step.any():
            break
        mid = np.where(step, np.floor((lo + np.where(step, hi, lo)) / 2), 1.0)
        good = value(mid[None, :])[0] > 0
        hi = np.where(step & good, mid, hi)
        lo = np.where(step & ~good, mid, lo)
    result = np.where(first == 0, 1.0, hi)
    if bw is None or np.ndim(tier_bandwidth_bytes_per_s) == 0:
        return result[0].item()
    return result.reshape(np.shape(tier_bandwidth_bytes_per_s))

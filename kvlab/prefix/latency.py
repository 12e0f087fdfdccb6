"""What a prefix hit buys in time, from the ledger: TTFT moves with the hit ratio, TPOT does not.

TTFT of one request (no queueing) = prefill of the tokens the cache missed
(`kvlab.cost.prefill` with `cached_tokens`) + fetching the hit tokens' KV from the tier where
it is cached (`kvlab.tiers.kv_fetch_time_s`). KV already resident in this GPU's HBM needs no
fetch: reading it is part of the prefill's bytes. The last prompt token is always computed,
because its logits give the first output token, so at most input - 1 tokens are skipped.

TPOT = one decode step of a batch at the request's context (`kvlab.cost.decode_step`): it
reads all weights and every sequence's whole KV history whether that KV was a hit or not.
"""

from __future__ import annotations

import math

import numpy as np

from ..cost import decode_step, prefill
from ..deployment import Deployment
from ..errors import check_number
from ..prompt import served_tokens
from ..tiers import TierPath, kv_fetch_time_s
from ..traces import load_trace
from .blocks import default_capacities, replay

#: Where cached KV lives and the link it crosses to reach the GPU (the bottleneck of the path).
KV_TIERS = {
    "HBM (resident)": None,
    "host memory over PCIe 5.0 x16": "pcie5-x16",
    "remote node over 400G InfiniBand": "ib-400g",
}
DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_HARDWARE = "h100-sxm"
#: Tier names that mean "already in this GPU's memory".
RESIDENT = ("hbm", "resident", "local")


def default_deployment() -> Deployment:
    """The deployment the prefix-cache figures price when given none."""
    return Deployment(DEFAULT_MODEL, DEFAULT_HARDWARE)


def ttft_s(d: Deployment, input_tokens, cached_tokens, tier: TierPath | str | None = None):
    """TTFT per request (seconds, vectorised): prefill of the missed tokens + fetch of the hit ones.

    `tier` None (or "hbm") means the KV is already in this GPU's memory; otherwise a
    `TierPath`, or a tier name from `kvlab.hardware.tiers()` (e.g. "pcie5-x16" for host
    memory, "ib-400g" remote) at its peak with no per-fetch latency.
    """
    inputs = np.asarray(input_tokens, dtype=np.int64)
    cached = served_tokens(np.asarray(cached_tokens, dtype=np.int64), inputs)
    compute = np.asarray(prefill(d, inputs, cached).time_s, dtype=float)
    if tier is None or (isinstance(tier, str) and tier.lower() in RESIDENT):
        return compute
    path = tier if isinstance(tier, TierPath) else TierPath(tier, latency_s=0.0)
    fetch = kv_fetch_time_s(d, cached, path)
    return compute + np.where(cached > 0, fetch, 0.0)


def tpot_s(d: Deployment, context_tokens, batch=1):
    """TPOT in seconds: one decode step of `batch` sequences at `context_tokens` (vectorised)."""
    return np.asarray(decode_step(d, batch, context_tokens).step_time_s, dtype=float)


def mean_decode_context(input_tokens, output_tokens) -> np.ndarray:
    """Mean KV history over a request's decode: the prompt plus half the response."""
    return np.asarray(input_tokens, dtype=np.int64) + np.asarray(output_tokens, dtype=np.int64) // 2


def latency_vs_hit_ratio(
    trace,
    capacities_blocks=None,
    policy: str = "lru",
    d: Deployment | None = None,
    tiers: dict | None = None,
    batch: int = 16,
) -> dict:
    """Plot-ready: as the cache grows, the hit ratio rises, mean TTFT falls, TPOT stays flat.

    Returns {"trace", "generated", "policy", "model", "hardware", "batch", "capacity_blocks",
    "block_hit_ratio", "token_hit_ratio", "request_hit_rate", "mean_ttft_s": {tier label:
    array}, "p90_ttft_s": {...}, "mean_tpot_s": array, "no_cache_mean_ttft_s", "tiers"},
    arrays aligned with capacity_blocks (ending with an unlimited cache, capacity inf).
    """
    d = default_deployment() if d is None else d
    trace = load_trace(trace)
    batch = check_number("batch", batch, minimum=1, allow_equal_min=True, maximum=1e6, integer=True)
    tiers = KV_TIERS if tiers is None else tiers
    caps = list(default_capacities(trace) if capacities_blocks is None else capacities_blocks)
    if math.inf not in caps:
        caps.append(math.inf)
    inputs, outputs = trace.input_tokens, trace.output_tokens
    tpot = float(tpot_s(d, mean_decode_context(inputs, outputs), batch).mean())
    runs = [replay(trace, c, policy) for c in caps]
    out = {
        "trace": trace.label,
        "generated": trace.generated,
        "policy": policy,
        "model": d.model.name,
        "hardware": d.hardware.name,
        "batch": batch,
        "capacity_blocks": np.array(caps, dtype=float),
        "block_hit_ratio": np.array([r.block_hit_ratio for r in runs]),
        "token_hit_ratio": np.array([r.token_hit_ratio for r in runs]),
        "request_hit_rate": np.array([r.request_hit_rate for r in runs]),
        "mean_ttft_s": {},
        "p90_ttft_s": {},
        "tiers": dict(tiers),
        "mean_tpot_s": np.full(len(runs), tpot),  # the same at every hit ratio: that is the point
        "no_cache_mean_ttft_s": float(ttft_s(d, inputs, 0).mean()),
    }
    for label, tier in tiers.items():
        per_run = [ttft_s(d, inputs, r.hit_tokens_per_request, tier) for r in runs]
        out["mean_ttft_s"][label] = np.array([t.mean() for t in per_run])
        out["p90_ttft_s"][label] = np.array([np.percentile(t, 90) for t in per_run])
    return out

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

from ..errors import check_number
from ..prompt import served_tokens

#: Where cached KV lives and the link it crosses to reach the GPU (the bottleneck of the path).
KV_TIERS = {
    "HBM (resident)": None,
    "host memory over PCIe 5.0 x16": "pcie5-x16",
    "remote node over 400G InfiniBand": "ib-400g",
}
DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_HARDWARE = "h100-sxm"


def ttft_s(
    model,
    hardware,
    input_tokens,
    cached_tokens,
    tier=None,
    *,
    weight_dtype="fp16",
    kv_dtype="fp16",
    efficiency=1.0,
    fetch_efficiency=1.0,
    fetch_latency_s=0.0,
):
    """TTFT per request (seconds, vectorised): prefill of the missed tokens + fetch of the hit ones.

    `tier` None (or "hbm") means the KV is already in this GPU's memory; otherwise a tier
    name from `kvlab.hardware.tiers()` (e.g. "pcie5-x16" for host memory, "ib-400g" remote).
    """
    from ..cost import prefill
    from ..tiers import kv_fetch_time_s

    inputs = np.asarray(input_tokens, dtype=np.int64)
    cached = served_tokens(np.asarray(cached_tokens, dtype=np.int64), inputs)
    compute = np.asarray(
        prefill(
            model,
            hardware,
            inputs,
            cached,
            weight_dtype=weight_dtype,
            kv_dtype=kv_dtype,
            efficiency=efficiency,
        ).time_s,
        dtype=float,
    )
    if tier is None or str(tier).lower() in ("hbm", "resident", "local"):
        return compute
    fetch = kv_fetch_time_s(model, cached, tier, kv_dtype, fetch_efficiency, fetch_latency_s)
    return compute + np.where(cached > 0, fetch, 0.0)


def tpot_s(
    model,
    hardware,
    context_tokens,
    batch=1,
    *,
    weight_dtype="fp16",
    kv_dtype="fp16",
    efficiency=1.0,
):
    """TPOT in seconds: one decode step of `batch` sequences at `context_tokens` (vectorised)."""
    from ..cost import decode_step

    return np.asarray(
        decode_step(
            model,
            hardware,
            batch=batch,
            context=context_tokens,
            weight_dtype=weight_dtype,
            kv_dtype=kv_dtype,
            efficiency=efficiency,
        ).step_time_s,
        dtype=float,
    )


def mean_decode_context(input_tokens, output_tokens) -> np.ndarray:
    """Mean KV history over a request's decode: the prompt plus half the response."""
    return np.asarray(input_tokens, dtype=np.int64) + np.asarray(output_tokens, dtype=np.int64) // 2


def latency_vs_hit_ratio(
    trace,
    capacities_blocks=None,
    policy: str = "lru",
    model=DEFAULT_MODEL,
    hardware=DEFAULT_HARDWARE,
    tiers: dict | None = None,
    batch: int = 16,
    kv_dtype="fp16",
    weight_dtype="fp16",
    efficiency=1.0,
) -> dict:
    """Plot-ready: as the cache grows, the hit ratio rises, mean TTFT falls, TPOT stays flat.

    Returns {"trace", "generated", "policy", "model", "hardware", "batch", "capacity_blocks",
    "block_hit_ratio", "token_hit_ratio", "request_hit_rate", "mean_ttft_s": {tier label:
    array}, "p90_ttft_s": {...}, "mean_tpot_s": array, "no_cache_mean_ttft_s", "tiers"},
    arrays aligned with capacity_blocks (ending with an unlimited cache, capacity inf).
    """
    from ..traces import load_trace
    from .blocks import default_capacities, replay

    trace = load_trace(trace)
    batch = check_number("batch", batch, minimum=1, allow_equal_min=True, maximum=1e6, integer=True)
    tiers = KV_TIERS if tiers is None else tiers
    caps = list(default_capacities(trace) if capacities_blocks is None else capacities_blocks)
    if math.inf not in caps:
        caps.append(math.inf)
    inputs, outputs = trace.input_tokens, trace.output_tokens
    kw = dict(weight_dtype=weight_dtype, kv_dtype=kv_dtype, efficiency=efficiency)
    tpot = float(tpot_s(model, hardware, mean_decode_context(inputs, outputs), batch, **kw).mean())
    runs = [replay(trace, c, policy) for c in caps]
    out = {
        "trace": trace.label,
        "generated": trace.generated,
        "policy": policy,
        "model": str(model),
        "hardware": str(hardware),
        "batch": batch,
        "capacity_blocks": np.array(caps, dtype=float),
        "block_hit_ratio": np.array([r.block_hit_ratio for r in runs]),
        "token_hit_ratio": np.array([r.token_hit_ratio for r in runs]),
        "request_hit_rate": np.array([r.request_hit_rate for r in runs]),
        "mean_ttft_s": {},
        "p90_ttft_s": {},
        "tiers": dict(tiers),
        "mean_tpot_s": np.full(len(runs), tpot),  # the same at every hit ratio: that is the point
        "no_cache_mean_ttft_s": float(ttft_s(model, hardware, inputs, 0, **kw).mean()),
    }
    for label, tier in tiers.items():
        per_run = [
            ttft_s(model, hardware, inputs, r.hit_tokens_per_request, tier, **kw) for r in runs
        ]
        out["mean_ttft_s"][label] = np.array([t.mean() for t in per_run])
        out["p90_ttft_s"][label] = np.array([np.percentile(t, 90) for t in per_run])
    return out

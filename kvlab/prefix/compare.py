"""Whole-request vs token-granular prefix caching on one generated workload (pitfall 3).

Both caches see the same requests in arrival order: each request looks its prompt up, then
the cache stores the request's KV (prompt + response). Two hit rates are reported for each
cache, side by side:

  request_hit_rate  share of requests for which the lookup found cached KV agreeing with
                    the prompt's first `key_tokens` tokens (or reused something): a "hit"
                    in the sense of "the cache had an entry for this request";
  token_hit_ratio   share of prompt tokens whose prefill was actually skipped.

Whole-request caching finds an entry for nearly every request that shares a system prompt,
but can reuse an entry only whole, so little prefill is skipped; a radix tree reuses every
shared token. TTFT follows the second number (kvlab.prefix.latency).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from ..deployment import Deployment
from ..errors import check_number, unknown_name
from ..prompt import served_tokens
from ..traces.generate import WorkloadSpec, generate_workload
from .latency import default_deployment, mean_decode_context, tpot_s, ttft_s
from .radix import RadixCache, WholeRequestCache

CACHES = ("whole-request", "token")


@dataclass(frozen=True)
class GranularityResult:
    """One cache on one workload; times from the ledger (no queueing)."""

    cache: str  # "whole-request", "token", or "page-N" (token radix rounded to N-token pages)
    requests: int
    input_tokens: int
    request_hit_rate: float
    token_hit_ratio: float
    prefill_tokens_saved: int
    mean_ttft_s: float
    p50_ttft_s: float
    p90_ttft_s: float
    mean_tpot_s: float
    stored_tokens: int  # KV tokens held at the end (whole-request keeps a copy per entry)
    reused_tokens_per_request: np.ndarray = dataclasses.field(repr=False, compare=False)

    def to_dict(self) -> dict:
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name != "reused_tokens_per_request"
        }


def _make(kind: str, capacity_tokens):
    if kind == "whole-request":
        return WholeRequestCache(capacity_tokens)
    if kind == "token":
        return RadixCache(capacity_tokens)
    if kind.startswith("page-") and kind[5:].isdigit():
        return RadixCache(capacity_tokens, page_tokens=int(kind[5:]))
    raise unknown_name("cache kind", kind, CACHES, also="'page-N' (radix rounded to N-token pages)")


def compare_granularity(  # noqa: PLR0913 - one keyword per `kvlab prefix-cache --compare` option
    workload=None,
    *,
    caches=CACHES,
    capacity_tokens=math.inf,
    key_tokens: int = 512,
    preset: str = "shared-prefix",
    seed: int = 0,
    d: Deployment | None = None,
    tier=None,
    batch: int = 16,
    **workload_overrides,
) -> dict:
    """Run each cache over the same workload; returns plot- and table-ready results.

    `workload` is a `kvlab.traces.generate.Workload`; without one, `generate_workload(preset,
    seed, **workload_overrides)` makes it. Returns {"workload", "generated": True,
    "key_tokens", "capacity_tokens", "model", "hardware", "tier", "no_cache_mean_ttft_s",
    "caches": {kind: GranularityResult}}.
    """
    d = default_deployment() if d is None else d
    if workload is None:
        workload = generate_workload(preset, seed=seed, **workload_overrides)
    key_tokens = check_number(
        "key_tokens", key_tokens, minimum=1, allow_equal_min=True, maximum=1e9, integer=True
    )
    n = len(workload)
    inputs = np.fromiter((r.input_tokens for r in workload.requests), np.int64, n)
    outputs = np.fromiter((r.output_tokens for r in workload.requests), np.int64, n)
    instances = {kind: _make(kind, capacity_tokens) for kind in caches}
    found = {kind: np.zeros(n, np.int64) for kind in caches}
    reused = {kind: np.zeros(n, np.int64) for kind in caches}
    segments: dict = {}
    for i in range(n):
        prompt = workload.prompt_tokens(i, segments)
        full = np.concatenate([prompt, workload.output_token_ids(i, segments)])
        for kind, cache in instances.items():
            found[kind][i], matched = cache.lookup(prompt)
            reused[kind][i] = served_tokens(matched, prompt.size)
            cache.insert(full)
    tpot = float(tpot_s(d, mean_decode_context(inputs, outputs), batch).mean())
    results = {}
    for kind, cache in instances.items():
        ttft = ttft_s(d, inputs, reused[kind], tier)
        hit = (found[kind] >= np.minimum(key_tokens, inputs)) | (reused[kind] > 0)
        results[cache.kind] = GranularityResult(
            cache=cache.kind,
            requests=n,
            input_tokens=int(inputs.sum()),
            request_hit_rate=float(hit.mean()),
            token_hit_ratio=float(reused[kind].sum() / inputs.sum()),
            prefill_tokens_saved=int(reused[kind].sum()),
            mean_ttft_s=float(ttft.mean()),
            p50_ttft_s=float(np.median(ttft)),
            p90_ttft_s=float(np.percentile(ttft, 90)),
            mean_tpot_s=tpot,
            stored_tokens=int(cache.stored_tokens),
            reused_tokens_per_request=reused[kind],
        )
    return {
        "workload": f"{workload.source} (generated)",
        "generated": True,
        "requests": n,
        "key_tokens": key_tokens,
        "capacity_tokens": capacity_tokens,
        "model": d.model.name,
        "hardware": d.hardware.name,
        "tier": tier,
        "no_cache_mean_ttft_s": float(ttft_s(d, inputs, 0).mean()),
        "caches": results,
    }


def granularity_sweep(
    param: str = "first_message_tokens",
    values=(250, 500, 1000, 2000, 4000, 8000),
    *,
    preset: str = "shared-prefix",
    seed: int = 0,
    requests: int = 600,
    **kwargs,
) -> dict:
    """The comparison over one workload knob, for a slider: one run per value.

    `param` is any `WorkloadSpec` field (default: the mean length of the unique user
    message that follows the shared system prompt and template). Returns {"param",
    "values", "caches": {kind: {"request_hit_rate", "token_hit_ratio", "mean_ttft_s",
    "p90_ttft_s", "mean_tpot_s"}}, "no_cache_mean_ttft_s", "ttft_ratio" (token / whole-request),
    "mean_input_tokens", "workload"}, arrays aligned with values.
    """
    if param not in {f.name for f in dataclasses.fields(WorkloadSpec)}:
        raise unknown_name(
            "workload knob", param, [f.name for f in dataclasses.fields(WorkloadSpec)]
        )
    keys = ("request_hit_rate", "token_hit_ratio", "mean_ttft_s", "p90_ttft_s", "mean_tpot_s")
    wl_keys = {f.name for f in dataclasses.fields(WorkloadSpec)}
    overrides = {k: kwargs.pop(k) for k in list(kwargs) if k in wl_keys}
    runs = [
        compare_granularity(
            preset=preset, seed=seed, requests=requests, **{param: v}, **overrides, **kwargs
        )
        for v in values
    ]
    kinds = list(runs[0]["caches"])
    out = {
        "param": param,
        "values": np.asarray(values),
        "workload": runs[0]["workload"],
        "generated": True,
        "caches": {
            k: {m: np.array([getattr(r["caches"][k], m) for r in runs]) for m in keys}
            for k in kinds
        },
        "no_cache_mean_ttft_s": np.array([r["no_cache_mean_ttft_s"] for r in runs]),
        "mean_input_tokens": np.array(
            [r["caches"][kinds[0]].input_tokens / r["requests"] for r in runs]
        ),
    }
    if "token" in out["caches"] and "whole-request" in out["caches"]:
        out["ttft_ratio"] = (
            out["caches"]["token"]["mean_ttft_s"] / out["caches"]["whole-request"]["mean_ttft_s"]
        )
    return out

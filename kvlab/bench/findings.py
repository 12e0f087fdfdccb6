"""The figures a GPU run is judged by, read from its result files (pure: dicts in, dicts out).

- the decode step's share of the copy bandwidth at batch 1 (gpt-fast reaches ~82% of an
  A100's; the target here is >= 85%), against the bandwidth measured around each point
  and against the memory benchmark's copy bandwidth;
- the ledger's error, measured / predicted - 1, over batch and context (target: median
  |error| <= 10%), per KV dtype;
- host-placed KV: measured serial and prefetched steps against the ledger's serial and
  overlapped predictions, and the share of the predicted saving that prefetching achieved;
- recompute against fetch: where the curves cross, measured and predicted.
"""

from __future__ import annotations

import statistics

#: The targets of the GPU run (issue 18): batch-1 share of copy bandwidth, ledger error.
TARGET_BATCH1_SHARE = 0.85
TARGET_MEDIAN_ABS_ERROR = 0.10


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def decode_batch1(decode: dict, copy_bytes_per_s: float | None) -> dict:
    """Batch-1 device-placement steps of the first KV dtype measured: share of copy bandwidth."""
    device = [p for p in decode.get("points", []) if p["placement"] == "device" and p["batch"] == 1]
    if not device:
        return {}
    kv = device[0]["kv_dtype"]
    rows = [
        {
            "context": p["context"],
            "share_of_bracket_copy": p["fraction_of_bandwidth"],
            "share_of_memory_copy": (
                p["achieved_bytes_per_s"] / copy_bytes_per_s if copy_bytes_per_s else None
            ),
            "achieved_bytes_per_s": p["achieved_bytes_per_s"],
        }
        for p in device
        if p["kv_dtype"] == kv
    ]
    shares = [r["share_of_bracket_copy"] for r in rows]
    return {
        "kv_dtype": kv,
        "points": rows,
        "share_min": min(shares),
        "share_median": _median(shares),
        "meets_target": min(shares) >= TARGET_BATCH1_SHARE,
        "target": TARGET_BATCH1_SHARE,
    }


def ledger_error(decode: dict) -> dict:
    """|measured / predicted - 1| over the device-placement points, overall and per KV dtype."""
    device = [p for p in decode.get("points", []) if p["placement"] == "device"]
    if not device:
        return {}
    by_kv: dict[str, list[float]] = {}
    for p in device:
        by_kv.setdefault(p["kv_dtype"], []).append(abs(p["error"]))
    errors = [abs(p["error"]) for p in device]
    median = _median(errors)
    return {
        "points": len(errors),
        "median_abs_error": median,
        "max_abs_error": max(errors),
        "mean_signed_error": sum(p["error"] for p in device) / len(device),
        "by_kv_dtype": {
            kv: {"median_abs_error": _median(v), "max_abs_error": max(v), "points": len(v)}
            for kv, v in by_kv.items()
        },
        "meets_target": median <= TARGET_MEDIAN_ABS_ERROR,
        "target": TARGET_MEDIAN_ABS_ERROR,
    }


def host_overlap(decode: dict) -> list[dict]:
    """Per (KV dtype, batch, context) measured with and without prefetch: both measurements,
    the ledger's serial and overlapped predictions, and the share of the predicted saving
    that prefetching achieved (1 = the ledger's full overlap, 0 = none)."""
    host = {
        (p["kv_dtype"], p["batch"], p["context"], p["prefetch"]): p
        for p in decode.get("points", [])
        if p["placement"] == "host"
    }
    out = []
    for (kv, batch, ctx, pre), serial in sorted(host.items()):
        overlapped = host.get((kv, batch, ctx, True))
        if pre or overlapped is None:
            continue
        saving = serial["predicted_step_s"] - overlapped["predicted_step_s"]
        achieved = serial["measured_step_s"] - overlapped["measured_step_s"]
        out.append(
            {
                "kv_dtype": kv,
                "batch": batch,
                "context": ctx,
                "measured_serial_s": serial["measured_step_s"],
                "measured_prefetch_s": overlapped["measured_step_s"],
                "predicted_serial_s": serial["predicted_step_s"],
                "predicted_overlapped_s": overlapped["predicted_step_s"],
                "share_of_predicted_saving": achieved / saving if saving > 0 else None,
            }
        )
    return out


def crossovers(recompute: dict) -> list[dict]:
    """Per decoder preset: where fetching N tokens of KV stops beating recomputing them."""
    return [
        {
            "preset": c["preset"],
            "crossover_tokens": c.get("crossover_tokens"),
            "predicted_crossover_tokens": c.get("predicted_crossover_tokens"),
            "pageable_crossover_tokens": c.get("pageable_crossover_tokens"),
        }
        for c in recompute.get("curves", [])
    ]


def findings(results: dict[str, dict]) -> dict:
    """Everything above from {benchmark kind: result} (missing benchmarks are left out)."""
    out: dict = {}
    memory, decode = results.get("memory"), results.get("decode")
    copy_bw = (memory or {}).get("bandwidth_bytes_per_s")
    if copy_bw:
        out["copy_bandwidth_bytes_per_s"] = copy_bw
    if results.get("transfer"):
        out["link_bytes_per_s"] = results["transfer"].get("bandwidth_bytes_per_s")
    if decode:
        out["decode_batch1"] = decode_batch1(decode, copy_bw)
        out["ledger_error"] = ledger_error(decode)
        out["host_overlap"] = host_overlap(decode)
        out["decode_skipped"] = len(decode.get("skipped", []))
    if results.get("recompute-vs-fetch"):
        out["crossovers"] = crossovers(results["recompute-vs-fetch"])
    return out

"""Plot-ready data from every machine's recorded results (results/<machine>/*.json).

Pure functions: they read JSON and return plain dicts of numpy arrays, so a chapter (or
a test) can plot measured against predicted for this CPU and every GPU that ran
`make bench-gpu` without knowing the file format. Quick (CI-sized) results are left out
unless asked for.
"""

from __future__ import annotations

import numpy as np

from .results import load_results

#: The last, bandwidth_bytes_per_s: the copy bandwidth measured around each point.
DECODE_COLUMNS = (
    "batch",
    "context",
    "measured_step_s",
    "predicted_step_s",
    "error",
    "achieved_bytes_per_s",
    "fraction_of_bandwidth",
    "step_bytes",
    "weight_read_bytes",
    "kv_read_bytes",
    "tokens_per_s",
    "spread",
    "bandwidth_bytes_per_s",
)
DECODE_LABELS = ("placement", "kv_dtype", "prefetch")


def _load(kind: str, include_quick: bool) -> dict[str, dict]:
    found = dict(load_results(kind))
    if include_quick:
        for machine, result in load_results(f"{kind}-quick").items():
            found.setdefault(machine, result)
    return found


def machines(include_quick: bool = False) -> dict[str, dict]:
    """Every machine with results: {folder: {device_name, device, benchmarks: [...]}}."""
    out: dict[str, dict] = {}
    for kind in ("memory", "transfer", "decode", "recompute-vs-fetch"):
        for machine, r in _load(kind, include_quick).items():
            env = r.get("environment", {})
            entry = out.setdefault(
                machine,
                {
                    "device_name": env.get("device_name"),
                    "device": env.get("device"),
                    "benchmarks": [],
                },
            )
            entry["benchmarks"].append(kind)
    return out


#: Result files of the decode sweep: with the decoder's default kernels (kvlab's native C
#: kernels on CPUs that build them) and the comparison run with PyTorch's CPU kernels.
DECODE_KINDS = {"default": "decode", "torch": "decode-torch-kernels"}


def decode_comparison(
    placement: str | None = None,
    kv_dtype: str | None = None,
    include_quick: bool = False,
    kernels: str = "default",
) -> list[dict]:
    """Measured vs predicted decode steps, one entry per machine.

    Each entry: machine, device_name, preset, weight_dtype, bandwidth_bytes_per_s (the
    measured copy bandwidth the ledger used) and `points`: a dict of equal-length arrays
    (batch, context, measured_step_s, predicted_step_s, error, achieved_bytes_per_s,
    fraction_of_bandwidth, step_bytes, bandwidth_bytes_per_s (the copy bandwidth measured
    around that point, which its prediction used), ..., placement, kv_dtype, prefetch), filtered by
    `placement` / `kv_dtype` when given, sorted by (placement, kv_dtype, batch, context).
    `kernels`: "default" (the decoder's own choice, recorded as `kernels`) or "torch" (the
    comparison run with PyTorch's CPU kernels, `kvlab bench decode --kernels torch`).
    """
    if kernels not in DECODE_KINDS:
        raise ValueError(f"kernels must be one of {sorted(DECODE_KINDS)}, got {kernels!r}")
    out = []
    for machine, r in sorted(_load(DECODE_KINDS[kernels], include_quick).items()):
        pts = [
            p
            for p in r.get("points", [])
            if placement in (None, p["placement"]) and kv_dtype in (None, p["kv_dtype"])
        ]
        pts.sort(
            key=lambda p: (p["placement"], p["prefetch"], p["kv_dtype"], p["batch"], p["context"])
        )
        columns = {
            c: np.array([p.get(c, np.nan) for p in pts], dtype=float) for c in DECODE_COLUMNS
        }
        columns.update({c: np.array([p[c] for p in pts]) for c in DECODE_LABELS})
        out.append(
            {
                "machine": machine,
                "device_name": r["environment"].get("device_name"),
                "preset": r.get("model", {}).get("preset"),
                "weight_dtype": r.get("model", {}).get("weight_dtype"),
                "bandwidth_bytes_per_s": r.get("bandwidth_bytes_per_s"),
                "flops_per_s": r.get("machine", {}).get("flops_per_s"),
                "quick": r.get("quick", False),
                "kernels": r["environment"].get("kernels", "torch"),
                "kernels_note": r["environment"].get("kernels_note", "PyTorch kernels"),
                "points": columns,
            }
        )
    return out


def recompute_curves(include_quick: bool = False) -> list[dict]:
    """Recompute (prefill N tokens) against fetch (their KV from host memory), per machine
    and decoder preset: tokens, recompute_s, fetch_s, fetch_pageable_s (CUDA; else None),
    predicted_recompute_s, predicted_fetch_s (arrays), crossover_tokens and
    predicted_crossover_tokens (None: the curves do not cross in the measured range)."""
    out = []
    for machine, r in sorted(_load("recompute-vs-fetch", include_quick).items()):
        for c in r.get("curves", []):

            def col(key, pts=c["points"]):
                values = [p.get(key) for p in pts]
                return (
                    None
                    if all(v is None for v in values)
                    else np.array([np.nan if v is None else v for v in values], dtype=float)
                )

            out.append(
                {
                    "machine": machine,
                    "device_name": r["environment"].get("device_name"),
                    "preset": c["preset"],
                    "kv_bytes_per_token": c.get("kv_bytes_per_token"),
                    "streamed_weight_bytes": c.get("streamed_weight_bytes"),
                    "tokens": col("tokens"),
                    "recompute_s": col("recompute_s"),
                    "fetch_s": col("fetch_s"),
                    "fetch_pageable_s": col("fetch_pageable_s"),
                    "predicted_recompute_s": col("predicted_recompute_s"),
                    "predicted_fetch_s": col("predicted_fetch_s"),
                    "crossover_tokens": c.get("crossover_tokens"),
                    "predicted_crossover_tokens": c.get("predicted_crossover_tokens"),
                    "link_bytes_per_s": r.get("machine", {}).get("link_bytes_per_s"),
                    "flops_per_s": r.get("machine", {}).get("flops_per_s"),
                    "quick": r.get("quick", False),
                }
            )
    return out


def memory_bandwidth(include_quick: bool = False) -> list[dict]:
    """Per machine: bandwidth against array size for each kernel (copy/read/write), the
    headline copy bandwidth, matmul FLOP/s and last-level cache size."""
    out = []
    for machine, r in sorted(_load("memory", include_quick).items()):
        kernels = {}
        for p in r.get("points", []):
            sizes, bws = kernels.setdefault(p["kernel"], ([], []))
            sizes.append(p["size_bytes"])
            bws.append(p["bandwidth_bytes_per_s"])
        out.append(
            {
                "machine": machine,
                "device_name": r["environment"].get("device_name"),
                "bandwidth_bytes_per_s": r.get("bandwidth_bytes_per_s"),
                "read_bandwidth_bytes_per_s": r.get("read_bandwidth_bytes_per_s"),
                "matmul_flops_per_s": r.get("matmul_flops_per_s", {}),
                "last_level_cache_bytes": r.get("last_level_cache_bytes"),
                "kernels": {
                    k: {
                        "size_bytes": np.array(s, dtype=float),
                        "bandwidth_bytes_per_s": np.array(b, dtype=float),
                    }
                    for k, (s, b) in kernels.items()
                },
            }
        )
    return out


def targets(
    include_quick: bool = False,
    min_context: int = 1024,
    max_context: int = 32768,
    kernels: str = "default",
) -> list[dict]:
    """The issue's targets, per machine, from the device-placement points at the weight
    dtype of the run: per (kv dtype, batch) the lowest fraction of copy bandwidth reached
    and the largest |measured / predicted - 1| over contexts in [min_context, max_context]."""
    out = []
    for entry in decode_comparison("device", include_quick=include_quick, kernels=kernels):
        p = entry["points"]
        rows = []
        for kv in sorted(set(p["kv_dtype"].tolist())):
            for batch in sorted(set(p["batch"].tolist())):
                sel = (
                    (p["kv_dtype"] == kv)
                    & (p["batch"] == batch)
                    & (p["context"] >= min_context)
                    & (p["context"] <= max_context)
                )
                if sel.any():
                    share = p["fraction_of_bandwidth"][sel]
                    rows.append(
                        {
                            "kv_dtype": kv,
                            "batch": int(batch),
                            "points": int(sel.sum()),
                            "fraction_of_bandwidth_min": float(share.min()),
                            "fraction_of_bandwidth_median": float(np.median(share)),
                            "max_abs_error": float(np.abs(p["error"][sel]).max()),
                        }
                    )
        out.append(
            {
                "machine": entry["machine"],
                "device_name": entry["device_name"],
                "kernels": entry["kernels"],
                "rows": rows,
            }
        )
    return out


def kv_transfer_series(kind: str = "kv_transfer") -> dict:
    """Every recorded results/<machine>/kv_transfer.json as per-layout arrays for plotting:
    {machine: {"environment", "engines": {engine: {"layouts": {layout: {"bytes",
    "time_s_<q>", "bandwidth_bytes_per_s_<q>"}}, "summary", "environment", "command"}}}}
    for q in median, p10, p90, rows sorted by size."""
    out = {}
    for machine, payload in load_results(kind).items():
        engines = {}
        for label, entry in payload.get("engines", {}).items():
            layouts = {}
            for layout in ("contiguous", "paged"):
                rows = sorted(
                    (r for r in entry.get("rows", []) if r["layout"] == layout),
                    key=lambda r: r["bytes"],
                )
                if rows:
                    layouts[layout] = {
                        "bytes": np.array([r["bytes"] for r in rows], dtype=float),
                        **{
                            f"time_s_{q}": np.array([r["time_s"][q] for r in rows])
                            for q in ("median", "p10", "p90")
                        },
                        **{
                            f"bandwidth_bytes_per_s_{q}": np.array(
                                [r["bandwidth_bytes_per_s"][q] for r in rows]
                            )
                            for q in ("median", "p10", "p90")
                        },
                    }
            engines[label] = {
                "layouts": layouts,
                "summary": entry.get("summary", {}),
                "environment": entry.get("environment", payload.get("environment", {})),
                "command": entry.get("command", ""),
            }
        out[machine] = {"environment": payload.get("environment", {}), "engines": engines}
    return out

"""Serving metrics from per-token timestamps: TTFT, TPOT, ITL, throughput, SLOs, goodput.

Everything here starts from what a client can record: each request's arrival time and
the time every output token reached it. Nothing needs the simulator, so measured runs
(a benchmark client's log) go through the same functions.

    TTFT   first token - arrival: queueing, prefill, prefix-cache fetch, KV transfer.
    TPOT   (last token - first token) / (tokens - 1): one request's mean decode pace.
    ITL    every gap between consecutive tokens of a request (pooled over requests).

TPOT is a mean, so a request that decodes at 10 ms/token but stalls once for 300 ms
still shows a good TPOT; its ITL tail shows the stall. That is why both are reported.

Token timestamps come either as a list of 1-D arrays (one per request) or as a flat
array plus `offsets` (CSR: request i owns flat[offsets[i]:offsets[i+1]]).
"""

from __future__ import annotations

import math

import numpy as np

from .errors import KvlabError, check_number, unknown_name

PERCENTILES = (50, 90, 99)
#: Mooncake's evaluation on its real traces: a TTFT limit and TBT limits of 100/200/300 ms.
MOONCAKE_TBT_SLOS_S = (0.1, 0.2, 0.3)
DEFAULT_TTFT_SLO_S = 30.0
DEFAULT_TBT_SLO_S = 0.1
#: Which per-request statistic of its token gaps is held to the TBT limit.
TBT_STATS = ("mean", "p90", "p99", "max")
DEFAULT_TBT_STAT = "p90"

REQUEST_DTYPE = np.dtype(
    [
        ("arrival_s", "f8"),
        ("first_token_s", "f8"),
        ("finish_s", "f8"),
        ("tokens", "i8"),
        ("ttft_s", "f8"),
        ("tpot_s", "f8"),
        ("e2e_s", "f8"),
        ("itl_p90_s", "f8"),
        ("itl_p99_s", "f8"),
        ("itl_max_s", "f8"),
    ]
)


def token_csr(token_times, offsets=None) -> tuple[np.ndarray, np.ndarray]:
    """(flat timestamps, offsets) from a list of per-request arrays, or a flat array + offsets."""
    if offsets is None:
        arrays = [np.asarray(t, dtype=float).ravel() for t in token_times]
        lengths = np.fromiter((a.size for a in arrays), np.int64, len(arrays))
        offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.concatenate(arrays) if arrays else np.zeros(0)
        return flat, offsets
    flat = np.asarray(token_times, dtype=float).ravel()
    offsets = np.asarray(offsets, dtype=np.int64).ravel()
    if (
        offsets.size < 1
        or offsets[0] != 0
        or offsets[-1] != flat.size
        or np.any(np.diff(offsets) < 0)
    ):
        raise KvlabError(
            "offsets must start at 0, never decrease and end at the number of timestamps"
        )
    return flat, offsets


def _segment_ids(offsets: np.ndarray) -> np.ndarray:
    """Request index of every flat element."""
    return np.repeat(np.arange(offsets.size - 1), np.diff(offsets))


def _gaps(flat, offsets):
    """(gaps, request index of each gap, gap offsets) within requests."""
    seg = _segment_ids(offsets)
    same = seg[1:] == seg[:-1]
    gaps = np.diff(flat)[same]
    gap_seg = seg[1:][same]
    gap_offsets = np.zeros(offsets.size, dtype=np.int64)
    np.cumsum(np.maximum(np.diff(offsets) - 1, 0), out=gap_offsets[1:])
    return gaps, gap_seg, gap_offsets


def itl_s(token_times, offsets=None) -> np.ndarray:
    """Every inter-token gap (seconds) of every request, pooled, in request order."""
    flat, offsets = token_csr(token_times, offsets)
    gaps, _, _ = _gaps(flat, offsets)
    if np.any(gaps < 0):
        raise KvlabError("token timestamps go back in time within a request")
    return gaps


def _sort_segments(values, offsets) -> np.ndarray:
    """Values grouped by segment, sorted within each segment (one sort for all)."""
    seg = _segment_ids(offsets)
    return values[np.lexsort((values, seg))]


def _segment_percentile(s, offsets, q: float) -> np.ndarray:
    """Per-segment percentile (numpy's linear interpolation) of values grouped by segment and
    sorted within it (`_sort_segments`); NaN for empty segments."""
    n = np.diff(offsets)
    out = np.full(n.size, np.nan)
    has = n > 0
    pos = (n[has] - 1) * (q / 100.0)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, n[has] - 1)
    base = offsets[:-1][has]
    frac = pos - lo
    out[has] = s[base + lo] * (1 - frac) + s[base + hi] * frac
    return out


def request_metrics(arrival_s, token_times, offsets=None) -> np.ndarray:
    """Per-request TTFT, TPOT, end-to-end latency and ITL tail, as a structured array.

    Requests with no token get NaN everywhere; TPOT and the ITL figures are NaN for a
    request with a single token (it has no gap).
    """
    flat, offsets = token_csr(token_times, offsets)
    arrival = np.asarray(arrival_s, dtype=float).ravel()
    n = np.diff(offsets)
    if arrival.size != n.size:
        raise KvlabError(f"{arrival.size} arrival times for {n.size} requests' token timestamps")
    gaps, _, gap_offsets = _gaps(flat, offsets)
    if np.any(gaps < 0):
        raise KvlabError("token timestamps go back in time within a request")
    out = np.zeros(n.size, dtype=REQUEST_DTYPE)
    has = n > 0
    first = np.full(n.size, np.nan)
    last = np.full(n.size, np.nan)
    first[has] = flat[offsets[:-1][has]]
    last[has] = flat[offsets[1:][has] - 1]
    if np.any(first[has] < arrival[has]):
        raise KvlabError("a request's first token is timestamped before its arrival")
    out["arrival_s"] = arrival
    out["first_token_s"] = first
    out["finish_s"] = last
    out["tokens"] = n
    out["ttft_s"] = first - arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        out["tpot_s"] = np.where(n > 1, (last - first) / (n - 1), np.nan)
    out["e2e_s"] = last - arrival
    ordered = _sort_segments(gaps, gap_offsets)
    out["itl_p90_s"] = _segment_percentile(ordered, gap_offsets, 90)
    out["itl_p99_s"] = _segment_percentile(ordered, gap_offsets, 99)
    out["itl_max_s"] = _segment_percentile(ordered, gap_offsets, 100)
    return out


def percentiles(values, qs=PERCENTILES, prefix: str = "", suffix: str = "_s") -> dict:
    """{f"{prefix}p50{suffix}": ..., ..., f"{prefix}mean{suffix}": ...}.

    NaN ignored; None if no value.
    """
    v = np.asarray(values, dtype=float).ravel()
    v = v[~np.isnan(v)]
    out = {}
    if v.size == 0:
        for q in qs:
            out[f"{prefix}p{q:g}{suffix}"] = None
        out[f"{prefix}mean{suffix}"] = None
        return out
    for q, value in zip(qs, np.percentile(v, qs), strict=True):
        out[f"{prefix}p{q:g}{suffix}"] = float(value)
    out[f"{prefix}mean{suffix}"] = float(v.mean())
    return out


def _tbt_value(records: np.ndarray, tbt_stat: str) -> np.ndarray:
    if tbt_stat not in TBT_STATS:
        raise unknown_name("TBT statistic", tbt_stat, TBT_STATS)
    column = {"mean": "tpot_s", "p90": "itl_p90_s", "p99": "itl_p99_s", "max": "itl_max_s"}[
        tbt_stat
    ]
    return records[column]


def slo_met(
    records: np.ndarray,
    ttft_slo_s=DEFAULT_TTFT_SLO_S,
    tbt_slo_s=DEFAULT_TBT_SLO_S,
    tbt_stat: str = DEFAULT_TBT_STAT,
) -> np.ndarray:
    """Per request: did it meet both SLOs? TTFT <= ttft_slo_s, and its `tbt_stat` of token
    gaps <= tbt_slo_s (`mean` is TPOT, DistServe's rule; `p90` lets a tenth of the gaps
    stall; `max` holds every gap). A request with one token has no gap and passes TBT.
    A request with no token (not finished) fails. None for a limit means no limit."""
    ttft_ok = np.isfinite(records["ttft_s"])
    if ttft_slo_s is not None:
        check_number("ttft_slo_s", ttft_slo_s)
        ttft_ok &= records["ttft_s"] <= ttft_slo_s
    tbt = _tbt_value(records, tbt_stat)
    tbt_ok = np.ones(records.size, dtype=bool)
    if tbt_slo_s is not None:
        check_number("tbt_slo_s", tbt_slo_s)
        tbt_ok = np.isnan(tbt) | (tbt <= tbt_slo_s)
    return ttft_ok & tbt_ok


def summarize(
    arrival_s,
    token_times,
    offsets=None,
    *,
    ttft_slo_s=DEFAULT_TTFT_SLO_S,
    tbt_slo_s=DEFAULT_TBT_SLO_S,
    tbt_stat: str = DEFAULT_TBT_STAT,
    duration_s=None,
    records: np.ndarray | None = None,
) -> dict:
    """Headline figures of a run: TTFT/TPOT/ITL/E2E percentiles (p50, p90, p99, mean),
    throughput, SLO attainment and goodput.

    TTFT, TPOT and E2E percentiles are over requests; ITL percentiles pool every gap of
    every request (as serving benchmarks report them). Throughput and goodput divide by
    `duration_s`, by default first arrival to last token (the run's makespan). Goodput
    counts only requests that met both SLOs.
    """
    flat, offsets = token_csr(token_times, offsets)
    if records is None:
        records = request_metrics(arrival_s, flat, offsets)
    done = records["tokens"] > 0
    tokens = int(records["tokens"].sum())
    if duration_s is None:
        if done.any():
            duration_s = float(np.nanmax(records["finish_s"]) - np.min(records["arrival_s"]))
        else:
            duration_s = 0.0
    met = slo_met(records, ttft_slo_s, tbt_slo_s, tbt_stat)
    ttft_only = slo_met(records, ttft_slo_s, None, tbt_stat)
    tbt_only = slo_met(records, None, tbt_slo_s, tbt_stat) & done
    n = records.size

    def per_s(x):
        return float(x / duration_s) if duration_s > 0 else None

    out = {
        "requests": int(n),
        "requests_completed": int(done.sum()),
        "tokens_generated": tokens,
        "duration_s": float(duration_s),
        "throughput_tokens_per_s": per_s(tokens),
        "requests_per_s": per_s(int(done.sum())),
    }
    out.update(percentiles(records["ttft_s"][done], prefix="ttft_"))
    out.update(percentiles(records["tpot_s"][done], prefix="tpot_"))
    gaps, _, _ = _gaps(flat, offsets)
    out.update(percentiles(gaps, prefix="itl_"))
    out.update(percentiles(records["e2e_s"][done], prefix="e2e_"))
    out.update(
        {
            "ttft_slo_s": ttft_slo_s,
            "tbt_slo_s": tbt_slo_s,
            "tbt_stat": tbt_stat,
            "slo_attainment": float(met.mean()) if n else None,
            "ttft_slo_attainment": float(ttft_only.mean()) if n else None,
            "tbt_slo_attainment": float(tbt_only.mean()) if n else None,
            "goodput_requests_per_s": per_s(int(met.sum())),
            "goodput_tokens_per_s": per_s(int(records["tokens"][met].sum())),
        }
    )
    return out


def slo_curve(
    records: np.ndarray,
    ttft_slo_s=DEFAULT_TTFT_SLO_S,
    tbt_slos_s=MOONCAKE_TBT_SLOS_S,
    tbt_stat: str = DEFAULT_TBT_STAT,
) -> dict:
    """SLO attainment at several TBT limits (Mooncake plots 100/200/300 ms):
    {"tbt_slo_s": array, "attainment": array}."""
    limits = np.asarray(tbt_slos_s, dtype=float)
    return {
        "tbt_slo_s": limits,
        "attainment": np.array(
            [
                slo_met(records, ttft_slo_s, t, tbt_stat).mean() if records.size else math.nan
                for t in limits
            ]
        ),
    }


def records_table(records: np.ndarray) -> list[dict]:
    """A structured array as a list of plain dicts (JSON-ready: NaN becomes None)."""
    names = records.dtype.names
    rows = []
    for row in records.tolist():
        rows.append(
            {
                k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in zip(names, row, strict=True)
            }
        )
    return rows

"""Serving metrics from per-token timestamps: TTFT, TPOT, ITL, throughput, SLOs, goodput.

Everything here starts from what a client can record: each request's arrival time and
the time every output token reached it. Nothing needs the simulator, so measured runs
(a benchmark client's log) go through the same functions.

    TTFT   first token - arrival: queueing, prefill, prefix-cache fetch, KV transfer.
    TPOT   (last token - first token) / (tokens - 1): one request's mean decode pace.
    ITL    every gap between consecutive tokens of a request (pooled over requests).

TPOT is a mean, so a request that decodes at 10 ms/token but stalls once for 300 ms
still shows a good TPOT; its ITL tail shows the stall. That is why both are reported.

Each paper holds a different statistic of the token gaps to its TBT limit (`TBT_STATS`):

    mean            TPOT, DistServe's rule (Zhong et al., OSDI'24, section 2: a request meets
                    its SLOs when TTFT and TPOT are under their limits).
    p90             the 90th percentile of a request's gaps; the Mooncake arXiv report
                    (arXiv:2407.00079 v3, section 8.1 "Metric") holds the P90 of TTFT and of
                    TBT over a run to the limits, which at a 90% attainment target comes to
                    this rule.
    p99, max        stricter per-request tails.
    slowest10-mean  the mean of the slowest 10% of a request's gaps, Mooncake FAST'25's TBT
                    (Qin et al., FAST'25, section 5.1 "Metric": "the average of the longest
                    10% of the token arrival intervals").
    pooled-p99      the p99 of every gap of every request pooled, a property of the run, as
                    Sarathi-Serve's capacity search holds it (Agrawal et al., OSDI'24; its
                    sarathi/benchmark/capacity_search/main.py, Apache-2.0: TBT quantile 0.99,
                    and a median scheduling delay of at most 2 s).

Effective request capacity and goodput are each paper's own (see
`effective_request_capacity` and `summarize`; DistServe's goodput, a rate, is found by
`kvlab.sim.saturation`).

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
#: Statistics of one request's own token gaps, held to the TBT limit request by request.
REQUEST_TBT_STATS = ("mean", "p90", "p99", "max", "slowest10-mean")
#: Statistics of the whole run's pooled gaps: every request passes or fails TBT together.
POOLED_TBT_STATS = ("pooled-p99",)
#: Which statistic of the token gaps is held to the TBT limit (see the module docstring).
TBT_STATS = REQUEST_TBT_STATS + POOLED_TBT_STATS
DEFAULT_TBT_STAT = "p90"
#: Mooncake FAST'25's TBT: the mean of this share of a request's gaps, the longest ones.
SLOWEST_SHARE = 0.1
#: Sarathi-Serve's capacity search also bounds the median scheduling delay (arrival to the
#: first time the request is scheduled) by 2 s (sarathi/benchmark/capacity_search/main.py:
#: --scheduling-delay-slo-value 2.0, --scheduling-delay-slo-quantile 0.5; Apache-2.0).
DEFAULT_SCHEDULING_DELAY_SLO_S = 2.0
POOLED_QUANTILE = {"pooled-p99": 99.0}

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
        ("itl_slowest10_mean_s", "f8"),
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
    """Values grouped by segment, sorted within each segment: each segment's slice sorted
    on its own (a few hundred gaps a request), ten times faster than one lexsort over all
    of them, and the same array."""
    out = np.empty_like(values)
    bounds = offsets.tolist()
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        out[lo:hi] = np.sort(values[lo:hi])
    return out


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
    out["itl_slowest10_mean_s"] = _segment_top_mean(ordered, gap_offsets, SLOWEST_SHARE)
    return out


def _segment_top_mean(s, offsets, share: float) -> np.ndarray:
    """Per segment of sorted values: the mean of its largest ceil(share x n) values (at least
    one); NaN for empty segments. With 25 gaps and share 0.1: the mean of the 3 longest."""
    n = np.diff(offsets)
    out = np.full(n.size, np.nan)
    has = n > 0
    k = np.maximum(1, np.ceil(n[has] * share - 1e-9).astype(np.int64))
    csum = np.concatenate(([0.0], np.cumsum(s)))
    end = offsets[1:][has]
    out[has] = (csum[end] - csum[end - k]) / k
    return out


def slowest_share_mean_s(gaps, share: float = SLOWEST_SHARE) -> float:
    """Mooncake FAST'25's TBT of one request: the mean of its slowest `share` of gaps."""
    g = np.sort(np.asarray(gaps, dtype=float).ravel())
    if not g.size:
        return math.nan
    k = max(1, math.ceil(g.size * share - 1e-9))
    return float(g[-k:].mean())


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


#: Per-request TBT statistic -> its column of REQUEST_DTYPE.
TBT_COLUMNS = {
    "mean": "tpot_s",
    "p90": "itl_p90_s",
    "p99": "itl_p99_s",
    "max": "itl_max_s",
    "slowest10-mean": "itl_slowest10_mean_s",
}


def _check_stat(tbt_stat: str) -> None:
    if tbt_stat not in TBT_STATS:
        raise unknown_name("TBT statistic", tbt_stat, TBT_STATS)


def slo_met(
    records: np.ndarray,
    ttft_slo_s=DEFAULT_TTFT_SLO_S,
    tbt_slo_s=DEFAULT_TBT_SLO_S,
    tbt_stat: str = DEFAULT_TBT_STAT,
    *,
    pooled_itl_s: float | None = None,
    scheduling_ok: bool = True,
) -> np.ndarray:
    """Per request: did it meet both SLOs? TTFT <= ttft_slo_s, and its `tbt_stat` of token
    gaps <= tbt_slo_s (`mean` is TPOT, DistServe's rule; `p90` lets a tenth of the gaps
    stall; `slowest10-mean` is Mooncake FAST'25's; `max` holds every gap). A request with
    one token has no gap and passes TBT. A request with no token (not finished) fails.
    None for a limit means no limit.

    A pooled statistic (`pooled-p99`, Sarathi-Serve's) belongs to the run: pass its value
    as `pooled_itl_s` (`summarize` does), and whether the run's median scheduling delay met
    its limit as `scheduling_ok`; every finished request then passes or fails TBT with it."""
    _check_stat(tbt_stat)
    ttft_ok = np.isfinite(records["ttft_s"])
    if ttft_slo_s is not None:
        check_number("ttft_slo_s", ttft_slo_s)
        ttft_ok &= records["ttft_s"] <= ttft_slo_s
    tbt_ok = np.ones(records.size, dtype=bool)
    if tbt_stat in POOLED_TBT_STATS:
        if tbt_slo_s is not None:
            check_number("tbt_slo_s", tbt_slo_s)
            if pooled_itl_s is None:
                raise KvlabError(
                    f"TBT statistic {tbt_stat!r} pools the gaps of a whole run: pass the run's "
                    "value as pooled_itl_s (kvlab.metrics.summarize does)"
                )
            tbt_ok[:] = not pooled_itl_s > tbt_slo_s  # no gap at all (NaN) passes
        tbt_ok &= bool(scheduling_ok)
    elif tbt_slo_s is not None:
        check_number("tbt_slo_s", tbt_slo_s)
        tbt = records[TBT_COLUMNS[tbt_stat]]
        tbt_ok = np.isnan(tbt) | (tbt <= tbt_slo_s)
    return ttft_ok & tbt_ok


def pooled_itl_s(gaps, tbt_stat: str) -> float:
    """The run-level statistic `tbt_stat` (pooled-p99) of every gap pooled; NaN without gaps."""
    g = np.asarray(gaps, dtype=float).ravel()
    return float(np.percentile(g, POOLED_QUANTILE[tbt_stat])) if g.size else math.nan


def effective_request_capacity(
    records: np.ndarray,
    ttft_slo_s=DEFAULT_TTFT_SLO_S,
    tbt_slo_s=DEFAULT_TBT_SLO_S,
) -> float:
    """Mooncake FAST'25's effective request capacity of one replay (section 5.1 "Metric"):
    the share of all requests, rejected and unfinished ones included, whose TTFT and TBT are
    under their limits, TBT being the mean of the slowest 10% of the request's token gaps
    (Mooncake: TTFT <= 30 s, TBT <= 100, 200 or 300 ms). Mooncake replays a trace at its own
    timestamps and compares this share between systems (`capacity_gain`); the rate at which a
    design keeps a share is `kvlab.sim.saturation`. NaN for no request."""
    if not records.size:
        return math.nan
    return float(slo_met(records, ttft_slo_s, tbt_slo_s, "slowest10-mean").mean())


def capacity_gain(capacity: float, baseline: float) -> float:
    """How much more a design serves than a baseline, as the papers quote it: Mooncake's
    "+498%" is capacity_gain = 4.98 (capacity / baseline - 1); inf for a zero baseline."""
    if baseline == 0:
        return math.inf if capacity > 0 else math.nan
    return capacity / baseline - 1.0


def summarize(  # noqa: PLR0913 - the SLOs and statistics of `kvlab simulate`, keyword-only
    arrival_s,
    token_times,
    offsets=None,
    *,
    ttft_slo_s=DEFAULT_TTFT_SLO_S,
    tbt_slo_s=DEFAULT_TBT_SLO_S,
    tbt_stat: str = DEFAULT_TBT_STAT,
    duration_s=None,
    records: np.ndarray | None = None,
    scheduling_delay_s=None,
    scheduling_delay_slo_s=DEFAULT_SCHEDULING_DELAY_SLO_S,
) -> dict:
    """Headline figures of a run: TTFT/TPOT/ITL/E2E percentiles (p50, p90, p99, mean),
    throughput, SLO attainment, goodput and effective request capacity.

    TTFT, TPOT and E2E percentiles are over requests; ITL percentiles pool every gap of
    every request (as serving benchmarks report them). Throughput and goodput divide by
    `duration_s`, by default first arrival to last token (the run's makespan).

    `goodput_*_per_s` is this run's rate of requests (tokens) that met both SLOs, the
    throughput-under-SLO that Mooncake calls goodput (FAST'25 section 2.1). DistServe's
    goodput (OSDI'24, section 2) is a different quantity: the highest request rate at which
    the attainment target (90%) is still met, found by `kvlab.sim.saturation`.
    `effective_request_capacity` is Mooncake FAST'25's (see `effective_request_capacity`)
    at the same limits whatever `tbt_stat` is.

    `scheduling_delay_s` (per request: arrival to first scheduled; a client log lacks it)
    is checked only with a pooled statistic: Sarathi-Serve's capacity rule also needs the
    median scheduling delay <= `scheduling_delay_slo_s` (None: not checked).
    """
    _check_stat(tbt_stat)
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
    gaps, _, _ = _gaps(flat, offsets)
    pooled, sched_p50, sched_ok = None, None, True
    if tbt_stat in POOLED_TBT_STATS:
        pooled = pooled_itl_s(gaps, tbt_stat)
        if scheduling_delay_s is not None:
            delays = np.asarray(scheduling_delay_s, dtype=float).ravel()
            delays = delays[~np.isnan(delays)]
            sched_p50 = float(np.median(delays)) if delays.size else None
            if scheduling_delay_slo_s is not None and sched_p50 is not None:
                sched_ok = sched_p50 <= scheduling_delay_slo_s
    kw = dict(pooled_itl_s=pooled, scheduling_ok=sched_ok)
    met = slo_met(records, ttft_slo_s, tbt_slo_s, tbt_stat, **kw)
    ttft_only = slo_met(records, ttft_slo_s, None, tbt_stat)
    tbt_only = slo_met(records, None, tbt_slo_s, tbt_stat, **kw) & done
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
    out.update(percentiles(gaps, prefix="itl_"))
    out.update(percentiles(records["e2e_s"][done], prefix="e2e_"))
    out.update(percentiles(records["itl_slowest10_mean_s"][done], prefix="tbt_slowest10_mean_"))
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
            "effective_request_capacity": (
                effective_request_capacity(records, ttft_slo_s, tbt_slo_s) if n else None
            ),
        }
    )
    if tbt_stat in POOLED_TBT_STATS:
        out["pooled_itl_s"] = None if pooled is None or math.isnan(pooled) else pooled
        out["scheduling_delay_p50_s"] = sched_p50
        out["scheduling_delay_slo_s"] = scheduling_delay_slo_s
    return out


def slo_curve(
    records: np.ndarray,
    ttft_slo_s=DEFAULT_TTFT_SLO_S,
    tbt_slos_s=MOONCAKE_TBT_SLOS_S,
    tbt_stat: str = DEFAULT_TBT_STAT,
) -> dict:
    """SLO attainment at several TBT limits (Mooncake plots 100/200/300 ms):
    {"tbt_slo_s": array, "attainment": array}. Per-request statistics only."""
    if tbt_stat in POOLED_TBT_STATS:
        raise KvlabError(f"slo_curve takes a per-request TBT statistic, not {tbt_stat!r}")
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

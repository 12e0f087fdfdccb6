"""From evaluated designs to a plan: the ranked table, the Pareto front, and why the best
design beats the runner-up.

Designs rank by capacity per GPU (requests/s at saturation / GPUs), or per dollar when
every GPU type has a price (requests served per dollar of GPU time); ties go to fewer
GPUs, then to the design key, so the order never depends on which evaluation finished
first. The Pareto front is the designs that no other beats on capacity and on both
latencies at its saturation rate (the TTFT and the TBT statistic at the attainment
quantile): the price of a faster first token or a smoother stream in capacity.
"""

from __future__ import annotations

import dataclasses
import math

from ..fmt import percent, seconds, sig
from .evaluate import SUMMARY_KEYS
from .space import Design, gpu_hours_usd

#: What each design entry carries from its saturation run (None past a design that never
#: met the SLOs).
LATENCY_KEYS = ("ttft_s", "tbt_s", *SUMMARY_KEYS, "busy_share")
#: The axes of the design space, in the order of Design's fields.
AXES = tuple(f.name for f in dataclasses.fields(Design))


def entry(design: Design, result: dict, prices: dict) -> dict:
    """One row of the table: the design's axes, its capacity, latencies at it, its limit."""
    rate = result["saturation_requests_per_s"]
    row = {"key": design.key, **design.to_dict()}
    row["saturation_requests_per_s"] = rate
    row["saturation_spread_requests_per_s"] = result["saturation_spread_requests_per_s"]
    row["saturation_by_slice"] = result["saturation_by_slice"]
    row["requests_per_s_per_gpu"] = rate / design.gpus
    if prices:
        usd = gpu_hours_usd(design, prices)
        row["usd_per_hour"] = usd
        row["requests_per_dollar"] = rate * 3600.0 / usd
    at = result.get("at_saturation") or {}
    for key in LATENCY_KEYS:
        row[key] = at.get(key)
    row["limit"] = result.get("limit")
    row["ledger_capacity_requests_per_s"] = result.get("ledger_capacity_requests_per_s")
    row["probes"] = result["probes"]
    row["simulations"] = result["simulations"]
    return row


def metric_of(prices: dict) -> str:
    return "requests_per_dollar" if prices else "requests_per_s_per_gpu"


def ranked(rows: list[dict], metric: str) -> list[dict]:
    """Best first: highest metric, then fewer GPUs, then key; each row gains `rank`."""
    out = sorted(rows, key=lambda r: (-r[metric], r["gpus"], r["key"]))
    for i, row in enumerate(out, start=1):
        row["rank"] = i
    return out


def _late(x) -> float:
    return math.inf if x is None else x


def pareto(rows: list[dict], metric: str) -> list[str]:
    """Keys of the designs on the front (capacity up, TTFT and TBT at saturation down),
    in rank order; designs that never met the SLOs are not on it. Each row gains `pareto`."""
    live = [r for r in rows if r["saturation_requests_per_s"] > 0]
    front = []
    for r in live:
        mine = (r[metric], -_late(r["ttft_s"]), -_late(r["tbt_s"]))
        dominated = False
        for o in live:
            theirs = (o[metric], -_late(o["ttft_s"]), -_late(o["tbt_s"]))
            if o is not r and all(t >= m for t, m in zip(theirs, mine, strict=True)):
                if theirs != mine:
                    dominated = True
                    break
        if not dominated:
            front.append(r["key"])
    keep = set(front)
    for r in rows:
        r["pareto"] = r["key"] in keep
    return [r["key"] for r in rows if r["key"] in keep]


def _limit_text(row: dict) -> str:
    lim = row.get("limit")
    if not lim:
        return "it met the SLOs at every rate tried"
    rate = sig(lim["rate_requests_per_s"], 3)
    busy = ""
    if lim.get("busiest"):
        busy = f"; its {lim['busiest']} GPUs {percent(lim['busy_share'])} busy"
        if lim["stopped_early"]:
            busy += f" at {sig(lim['busy_rate_requests_per_s'], 3)} requests/s"
    if lim["stopped_early"]:
        return (
            f"TTFT binds: at {rate} requests/s more requests missed their TTFT or were turned "
            f"away than the attainment target allows (the run stopped there){busy}"
        )
    parts = []
    if lim["ttft_misses"]:
        parts.append(f"TTFT met by {percent(lim['ttft_slo_attainment'])}")
    if lim["tbt_misses"]:
        parts.append(f"TBT met by {percent(lim['tbt_slo_attainment'])}")
    if not parts:
        parts.append(f"both SLOs met by {percent(lim['slo_attainment'])} together")
    binds = {"ttft": "TTFT", "tbt": "TBT", "ttft and tbt": "TTFT and TBT"}[lim["binds"]]
    return f"{binds} binds: at {rate} requests/s {' and '.join(parts)}{busy}"


def _show(value) -> str:
    if value is None:
        return "-"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _differences(a: dict, b: dict) -> str:
    diffs = []
    for axis in AXES:
        if axis == "chunk_tokens" and a["scheduler"] != b["scheduler"]:
            continue  # a budget means something else under another scheduler
        if a[axis] != b[axis]:
            diffs.append(f"{axis.replace('_', ' ')} {_show(a[axis])} vs {_show(b[axis])}")
    return "; ".join(diffs) if diffs else "nothing but the tie-break"


def _capacity_text(row: dict, metric: str) -> str:
    if metric == "requests_per_dollar":
        head = f"{sig(row[metric], 3)} requests per dollar"
    else:
        head = f"{sig(row[metric], 3)} requests/s per GPU"
    return (
        f"{head} ({sig(row['saturation_requests_per_s'], 3)} requests/s on "
        f"{row['gpus']} GPUs; TTFT {seconds(row['ttft_s'])}, TBT {seconds(row['tbt_s'])} "
        f"at the attainment quantile)"
    )


def why(rows: list[dict], metric: str) -> str:
    """Why the best design beats the runner-up, in one paragraph of plain text."""
    if not rows or rows[0]["saturation_requests_per_s"] <= 0:
        return "No design met the SLOs at any rate tried: loosen the SLOs or offer more memory."
    best = rows[0]
    text = (
        f"Best: {best['key']}: {_capacity_text(best, metric)}. "
        f"Past its saturation {_limit_text(best)}."
    )
    if len(rows) == 1:
        return text
    second = rows[1]
    gap = 1 - second[metric] / best[metric] if best[metric] else 0.0
    text += (
        f" Runner-up: {second['key']}: {_capacity_text(second, metric)}, "
        f"{percent(gap)} less; past its saturation {_limit_text(second)}. "
        f"They differ in {_differences(best, second)}."
    )
    return text

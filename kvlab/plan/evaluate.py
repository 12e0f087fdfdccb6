"""One design's capacity: the highest request rate at which it still meets the SLOs.

`saturation_of(design, job, traces)` bisects the arrival rate of each workload slice
(`kvlab.sim.trace_at_rate`) for the highest rate whose SLO attainment (the share of all
requests meeting both the TTFT and the TBT limit; rejected ones miss) reaches the target:
DistServe's goodput, Vidur-Search's capacity. It starts from an optimistic capacity of the
ledger's (every GPU busy with no queueing or interference), doubles while the design
keeps up, then halves the bracket until it is `tolerance` of its top wide.

THE SWAP POINT: this bisection is kvlab.plan's own until the simulator's saturation search
(`kvlab.sim.saturation`, rate scale, seeds or slices, spread) lands; `saturation_of` is the
only function the search calls, so switching means calling that one here.

Tensor parallelism: a design's instance is `tensor_parallel` GPUs, which the simulator
runs as one engine instance (`SimConfig.tensor_parallel`: the ledger's tensor-parallel
step, N GPUs' memory, N NICs).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from .. import metrics
from ..deployment import Deployment, parse_speed
from ..errors import KvlabError, check_number
from ..hardware import USABLE_MEMORY_FRACTION, get_device
from ..models import get_model
from ..sim import DONE, SimConfig, simulate, trace_at_rate
from ..sim.costs import LedgerCost
from ..sim.kernel_cost import KernelCost

#: The bracket is closed when its width is this share of its top.
DEFAULT_TOLERANCE = 0.05
#: Simulations one slice's bisection may spend.
DEFAULT_MAX_RUNS = 14
#: A design that misses the target at this fraction of its ledger capacity is called
#: unable to meet the SLOs (saturation 0) rather than bisected further down.
FLOOR_FRACTION = 1 / 64
#: The column of kvlab.metrics' request records each TBT statistic reads (None: a
#: property of the whole run, not of each request).
TBT_COLUMNS = {
    "mean": "tpot_s",
    "p90": "itl_p90_s",
    "p99": "itl_p99_s",
    "max": "itl_max_s",
    "slowest10-mean": "itl_slowest10_mean_s",
}


@dataclass(frozen=True)
class Slo:
    """TTFT and TBT limits (seconds), which statistic of a request's token gaps the TBT
    limit holds, and the share of requests that must meet both."""

    ttft_s: float
    tbt_s: float
    tbt_stat: str = metrics.DEFAULT_TBT_STAT
    attainment: float = 0.9

    def __post_init__(self):
        check_number("TTFT SLO (s)", self.ttft_s, maximum=1e6)
        check_number("TBT SLO (s)", self.tbt_s, maximum=1e6)
        check_number("attainment", self.attainment, maximum=1.0)
        if self.tbt_stat not in metrics.TBT_STATS:
            valid = ", ".join(metrics.TBT_STATS)
            raise KvlabError(f"unknown TBT statistic {self.tbt_stat!r}; valid: {valid}")


@dataclass(frozen=True)
class Job:
    """What every design of one search is evaluated with, besides the design itself."""

    model: str
    slo: Slo
    weight_dtype: str = "fp16"
    kv_dtype: str = "fp16"
    efficiency: float | str = 1.0
    seed: int = 0
    tolerance: float = DEFAULT_TOLERANCE
    max_runs: int = DEFAULT_MAX_RUNS

    def __post_init__(self):
        get_model(self.model)
        parse_speed(self.efficiency)
        check_number("tolerance", self.tolerance, minimum=1e-4, maximum=0.5)
        runs = check_number(
            "max runs", self.max_runs, minimum=2, allow_equal_min=True, maximum=1000, integer=True
        )
        object.__setattr__(self, "max_runs", runs)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def sim_setup(design, job: Job) -> tuple[SimConfig, object]:
    """The simulator's config for `design` (and a step-time model to pass it, None for the
    config's own): see the module docstring on tensor parallelism."""
    fields = dict(
        arch=design.arch,
        model=job.model,
        hardware=design.hardware,
        weight_dtype=job.weight_dtype,
        kv_dtype=job.kv_dtype,
        efficiency=job.efficiency,
        prefill_workers=design.prefill_workers,
        decode_workers=design.decode_workers,
        max_batch=design.max_batch,
        prefix_cache=design.prefix_cache,
        pool_bytes_per_node=design.pool_bytes_per_node,
        ttft_slo_s=job.slo.ttft_s,
        tbt_slo_s=job.slo.tbt_s,
        tbt_stat=job.slo.tbt_stat,
        seed=job.seed,
    )
    if design.scheduler is not None:
        fields.update(scheduler=design.scheduler, chunk_tokens=design.chunk_tokens)
    return SimConfig(**fields, tensor_parallel=design.tensor_parallel), None


def deployment(design, job: Job) -> Deployment:
    """The ledger's view of one GPU of the design's instances."""
    return Deployment(
        job.model,
        design.hardware,
        job.weight_dtype,
        job.kv_dtype,
        parse_speed(job.efficiency),
        design.tensor_parallel,
    )


def ledger_capacity_per_s(design, job: Job, trace) -> float:
    """An optimistic capacity (requests/s) from the ledger alone: every instance busy, mean
    prompts prefilled from scratch, decodes batched as deep as memory and the batch cap
    allow, no queueing and no interference. The bisection starts here."""
    d = deployment(design, job)
    c = (KernelCost if d.kernel_tables else LedgerCost)(d, max_batch=design.max_batch)
    prompt = float(np.mean(trace.input_tokens))
    output = max(float(np.mean(trace.output_tokens)), 1.0)
    prefill_s = float(np.asarray(c.prefill_times_s(prompt, 0.0)[0]))
    context = prompt + output / 2
    room = get_device(design.hardware).capacity_bytes * USABLE_MEMORY_FRACTION - d.weight_bytes
    batch = int(max(1, min(design.max_batch, room // (d.kv_bytes_per_token * (prompt + output)))))
    decode_s = output * float(np.asarray(c.decode_times_s(batch, context))) / batch
    if design.arch == "colocated":
        return design.prefill_workers / (prefill_s + decode_s)
    return min(design.prefill_workers / prefill_s, design.decode_workers / decode_s)


def _quantile(values: np.ndarray, q: float) -> float | None:
    """The q-quantile of per-request values (missing ones count as infinitely late)."""
    v = np.where(np.isnan(values), np.inf, values)
    out = float(np.quantile(v, q, method="higher")) if v.size else math.nan
    return out if math.isfinite(out) else None


def run_at(design, job: Job, trace, rate_per_s: float, setup=None) -> dict:
    """Simulate `trace` played at `rate_per_s` on `design`: what the search keeps of it."""
    config, cost = setup or sim_setup(design, job)
    result = simulate(trace_at_rate(trace, rate_per_s), config, cost=cost)
    s = result.summary()
    rec = result.records
    slo = job.slo
    out = {"rate_requests_per_s": rate_per_s}
    for key in (
        "slo_attainment",
        "ttft_slo_attainment",
        "tbt_slo_attainment",
        "ttft_p50_s",
        "ttft_p90_s",
        "ttft_p99_s",
        "tpot_p50_s",
        "tpot_p90_s",
        "itl_p99_s",
        "prefix_hit_ratio",
        "requests_rejected",
        "preemptions",
    ):
        out[key] = s.get(key)
    done = rec["status"] == DONE
    ttft = np.where(done, rec["ttft_s"], np.nan)
    out["ttft_s"] = _quantile(ttft, slo.attainment)
    column = TBT_COLUMNS.get(slo.tbt_stat)
    if column is not None and column in rec.dtype.names:
        tbt = np.where(done, rec[column], np.nan)
        tbt = np.where(done & np.isnan(tbt), 0.0, tbt)  # one token: no gap
        out["tbt_s"] = _quantile(tbt, slo.attainment)
    else:
        out["tbt_s"] = None
    busy: dict[str, list] = {}
    for w in result.workers:
        busy.setdefault(w["role"], []).append(w["busy_share"])
    out["busy_share"] = {role: float(np.mean(v)) for role, v in sorted(busy.items())}
    return out


def _bisect(design, job: Job, trace, setup) -> dict:
    """One slice's saturation rate: see the module docstring."""
    target, tol = job.slo.attainment, job.tolerance
    start = ledger_capacity_per_s(design, job, trace)
    probes: list[dict] = []
    lo, lo_p, hi, hi_p = 0.0, None, math.inf, None
    rate = start
    while len(probes) < job.max_runs:
        p = run_at(design, job, trace, rate, setup)
        probes.append(p)
        if (p["slo_attainment"] or 0.0) >= target:
            lo, lo_p = rate, p
        else:
            hi, hi_p = rate, p
        if math.isinf(hi):
            rate = 2 * rate
            continue
        if lo == 0.0 and hi <= start * FLOOR_FRACTION:
            break
        if lo > 0.0 and hi - lo <= tol * hi:
            break
        rate = (lo + hi) / 2
    return {
        "saturation_requests_per_s": lo,
        "start_requests_per_s": start,
        "at_saturation": lo_p,
        "past_saturation": hi_p,
        "probes": [[p["rate_requests_per_s"], p["slo_attainment"]] for p in probes],
    }


def limit_of(past: dict | None, target: float) -> dict | None:
    """Which limit binds just past saturation: the SLO met by fewer requests, and which
    pool of GPUs was busiest."""
    if past is None:
        return None
    ttft, tbt = past["ttft_slo_attainment"] or 0.0, past["tbt_slo_attainment"] or 0.0
    busy = past["busy_share"]
    role = max(busy, key=lambda r: (busy[r], r)) if busy else None
    ttft_misses, tbt_misses = ttft < target, tbt < target
    if ttft_misses != tbt_misses:
        binds = "ttft" if ttft_misses else "tbt"
    elif ttft_misses:  # both miss: the one fewer requests meet
        binds = "ttft" if ttft < tbt else "tbt" if tbt < ttft else "ttft and tbt"
    else:  # each alone is met, not both together
        binds = "ttft and tbt"
    return {
        "binds": binds,
        "rate_requests_per_s": past["rate_requests_per_s"],
        "slo_attainment": past["slo_attainment"],
        "ttft_slo_attainment": ttft,
        "tbt_slo_attainment": tbt,
        "ttft_misses": ttft_misses,
        "tbt_misses": tbt_misses,
        "busiest": role,
        "busy_share": busy.get(role) if role else None,
    }


def saturation_of(design, job: Job, traces) -> dict:
    """The design's saturation rate over the workload's slices: the median slice's, with
    the spread (max - min) and each slice's; the latencies at it and the limit that binds
    past it come from the median slice. Deterministic for a given job and traces."""
    setup = sim_setup(design, job)
    runs = [_bisect(design, job, t, setup) for t in traces]
    rates = [r["saturation_requests_per_s"] for r in runs]
    order = sorted(range(len(runs)), key=lambda i: (rates[i], i))
    mid = runs[order[(len(runs) - 1) // 2]]
    return {
        "saturation_requests_per_s": mid["saturation_requests_per_s"],
        "saturation_spread_requests_per_s": max(rates) - min(rates),
        "saturation_by_slice": rates,
        "ledger_capacity_requests_per_s": mid["start_requests_per_s"],
        "at_saturation": mid["at_saturation"],
        "limit": limit_of(mid["past_saturation"], job.slo.attainment),
        "probes": mid["probes"],
        "simulations": sum(len(r["probes"]) for r in runs),
    }

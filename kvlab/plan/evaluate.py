"""One design's capacity: the highest request rate at which it still meets the SLOs.

`saturation_of(design, job, traces)` is the simulator's saturation search
(`kvlab.sim.saturation`: the same requests replayed with their gaps scaled, the rate
bracketed by doubling or halving, then bisected geometrically until the bracket is
`tolerance` of its top wide; a run past saturation stops as soon as too many requests
missed their TTFT) on the design's SimConfig, summarised over the workload's slices as the
simulator summarises samples: their mean and the largest distance of one from it. The
planner starts each design's search from an optimistic capacity of the ledger's (every
GPU busy, no queueing or interference) and calls a design that misses the target at
FLOOR_FRACTION of it unable to meet the SLOs (saturation 0). It watches every run
(`observe`) to keep what the saturation rate alone does not say: the latencies at
saturation (the attainment quantile of TTFT and of the TBT statistic), and which limit
binds just past it, in the first slice.

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
from ..deployment import Ceiling, Deployment, Speed, parse_speed
from ..errors import KvlabError, check_number
from ..hardware import USABLE_MEMORY_FRACTION, get_device
from ..models import get_model
from ..sim import DONE, SimConfig
from ..sim.costs import LedgerCost
from ..sim.kernel_cost import KernelCost
from ..sim.saturation import MAX_RATE_PER_S, MIN_RATE_PER_S, saturation

#: The bracket is closed when its width is this share of its top: twice the simulator's
#: 2.5% (Sarathi-Serve's step), as a search over many designs ranks them, it does not
#: quote one to the percent.
DEFAULT_TOLERANCE = 0.05
#: A design that misses the target at this fraction of its ledger capacity is called
#: unable to meet the SLOs (saturation 0) rather than bisected further down.
FLOOR_FRACTION = 1 / 64
#: What the search keeps of a run's summary (kvlab.plan.rank shows them at saturation).
SUMMARY_KEYS = (
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p90_s",
    "itl_p99_s",
    "slo_attainment",
    "ttft_slo_attainment",
    "tbt_slo_attainment",
    "prefix_hit_ratio",
    "preemptions",
    "requests_rejected",
)


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
    efficiency: Speed = Ceiling(1.0)  # a number is read as Ceiling(number)
    seed: int = 0
    tolerance: float = DEFAULT_TOLERANCE

    def __post_init__(self):
        get_model(self.model)
        object.__setattr__(self, "efficiency", parse_speed(self.efficiency))
        check_number("tolerance", self.tolerance, minimum=1e-4, maximum=0.5)

    def to_dict(self) -> dict:
        """The job as JSON values (the speed as its label: a number or "measured")."""
        return dataclasses.asdict(self) | {"efficiency": self.efficiency.label}


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
        job.efficiency,
        design.tensor_parallel,
    )


def ledger_capacity_per_s(design, job: Job, trace) -> float:
    """An optimistic capacity (requests/s) from the ledger alone: every instance busy, mean
    prompts prefilled from scratch, decodes batched as deep as memory and the batch cap
    allow, no queueing and no interference. The rate search starts here."""
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


def observed(result, slo: Slo) -> dict:
    """What the search keeps of one run (a SimResult): the summary's attainments and
    latencies, TTFT and the TBT statistic at the attainment quantile (requests that did not
    finish count as infinitely late), and how busy each pool of GPUs was."""
    s = result.summary()
    rec = result.records
    out = {key: s.get(key) for key in SUMMARY_KEYS}
    done = rec["status"] == DONE
    ttft = np.where(done, rec["ttft_s"], np.nan)
    out["ttft_s"] = _quantile(ttft, slo.attainment)
    column = metrics.TBT_COLUMNS.get(slo.tbt_stat)  # None: a statistic of the whole run
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


def limit_of(
    past_rate: float | None, past: dict | None, at_rate: float | None, at: dict | None, target
) -> dict | None:
    """Which limit binds just past saturation (the run at the bracket's top, `past`): the
    SLO met by fewer requests; and which pool of GPUs was busiest, in that run, or in the
    run at saturation where the run past it stopped early. A run that stopped early
    (`past` None at a `past_rate`) had more than 1 - target of its requests miss their TTFT
    or be turned away: TTFT (or admission) binds by construction, and its attainments are
    not known. None when no rate was seen to miss."""
    if past_rate is None:
        return None
    stopped = past is None
    ran = at if stopped else past
    busy = (ran or {}).get("busy_share") or {}
    role = max(busy, key=lambda r: (busy[r], r)) if busy else None
    out = {
        "rate_requests_per_s": past_rate,
        "stopped_early": stopped,
        "busiest": role,
        "busy_share": busy.get(role) if role else None,
        "busy_rate_requests_per_s": (at_rate if stopped else past_rate) if role else None,
    }
    if stopped:
        return {
            "binds": "ttft",
            "slo_attainment": None,
            "ttft_slo_attainment": None,
            "tbt_slo_attainment": None,
            "ttft_misses": True,
            "tbt_misses": None,
            **out,
        }
    ttft, tbt = past["ttft_slo_attainment"] or 0.0, past["tbt_slo_attainment"] or 0.0
    ttft_misses, tbt_misses = ttft < target, tbt < target
    if ttft_misses != tbt_misses:
        binds = "ttft" if ttft_misses else "tbt"
    elif ttft_misses:  # both miss: the one fewer requests meet
        binds = "ttft" if ttft < tbt else "tbt" if tbt < ttft else "ttft and tbt"
    else:  # each alone is met, not both together
        binds = "ttft and tbt"
    return {
        "binds": binds,
        "slo_attainment": past["slo_attainment"],
        "ttft_slo_attainment": ttft,
        "tbt_slo_attainment": tbt,
        "ttft_misses": ttft_misses,
        "tbt_misses": tbt_misses,
        **out,
    }


def saturation_of(design, job: Job, traces) -> dict:
    """The design's saturation rate over the workload's slices (the module docstring):
    their mean, the spread (largest distance of a slice from it) and each slice's; the
    latencies at it, the limit that binds past it and the probes (rate, attainment; None
    for a run stopped early) come from the first slice. Deterministic for a given job and
    traces."""
    config, cost = sim_setup(design, job)
    start = min(max(ledger_capacity_per_s(design, job, traces[0]), MIN_RATE_PER_S), MAX_RATE_PER_S)
    runs: list[dict] = [{} for _ in traces]  # per slice: {rate: observed dict or None}

    def observe(index, rate, result):
        runs[index][rate] = None if result is None else observed(result, job.slo)

    found = saturation(
        config,
        traces,
        attainment=job.slo.attainment,
        rel_tol=job.tolerance,
        start_rate_per_s=start,
        cost=cost,
        min_rate_per_s=max(start * FLOOR_FRACTION, MIN_RATE_PER_S),
        observe=observe,
    )
    lo, hi = found.brackets[0]
    first = runs[0]
    at = first.get(lo) if lo is not None else None
    return {
        "saturation_requests_per_s": found.requests_per_s,
        "saturation_spread_requests_per_s": found.spread_requests_per_s,
        "saturation_by_slice": list(found.samples_requests_per_s),
        "saturation_status": list(found.status),
        "ledger_capacity_requests_per_s": start,
        "at_saturation": at,
        "limit": limit_of(hi, first.get(hi), lo, at, job.slo.attainment),
        "probes": [[r, p["slo_attainment"] if p else None] for r, p in first.items()],
        "simulations": found.runs,
    }

"""The highest request rate a design serves within its SLOs: bracket, then bisect.

    saturation(config, samples, attainment=0.9, rel_tol=0.025) -> Saturation

A sample is a trace: one seed of a generated workload, or one slice of a real trace
(`samples`). For each, the rate scale is searched (`trace_at_rate`: the same requests, in
the same order, their gaps scaled) for the highest mean rate at which at least
`attainment` of the measured requests meet both SLOs (the config's TTFT and TBT limits and
TBT statistic; a rejected request misses): the rate is doubled (or halved) from a start
until the verdict flips, then bisected geometrically until the bracket is within `rel_tol`
of its top; the answer is the bracket's bottom, a rate that was seen to meet the target.
Samples are then summarised as their mean and the largest distance of one from it.

This is DistServe's goodput (Zhong et al., OSDI'24, section 2: "the maximum request rate
that can be served adhering to the SLO attainment goal", 90% there; per GPU, divide by
`gpus`), Sarathi-Serve's capacity with `tbt_stat="pooled-p99"` (its capacity search
bisects the rate to 2.5% with the pooled p99 TBT and the median scheduling delay held to
their limits), the Mooncake arXiv report's throughput at P90 SLOs with the default p90
statistic, and the rate behind Mooncake FAST'25's effective request capacity with
`tbt_stat="slowest10-mean"` (FAST'25 replays the trace at its own rate and compares the
share of requests that meet the SLOs instead; kvlab.metrics.effective_request_capacity).

Attainment is not exactly monotone in the rate (bursts fall differently), so the search
finds a crossing, not necessarily the last one. It is deterministic: the same config and
samples give the same answer. A run past saturation stops as soon as enough requests have
missed their TTFT or been rejected (`Simulation.meets`), and every run shares one step-cost
object, so a search costs a few full replays.

A caller that needs more of each run than the verdict (kvlab.plan keeps the latencies at
saturation and what binds just past it) passes `observe(sample_index, rate, result)`,
called once per run with its SimResult, or None for a run stopped early: more than
1 - attainment of the measured requests missed their TTFT or were rejected, so the TTFT
limit (or admission) alone sank it. `min_rate_per_s` raises the floor below which a
sample is called "below" (a caller with an estimate of capacity need not halve down to
MIN_RATE_PER_S to learn that a design never meets its SLOs).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from dataclasses import dataclass

from ..errors import KvlabError, check_number
from ..traces import GENERATED, POISSON, load_trace
from ..traces.generate import parse_poisson, poisson_trace
from .cluster import Simulation
from .config import SimConfig
from .cost_model import make_cost
from .workload import measured_rate_per_s, trace_at_rate, trace_slice, trace_window

DEFAULT_ATTAINMENT = 0.9  # DistServe's goal, the chapters' saturation level
#: The bracket's final width relative to its top: Sarathi-Serve's capacity search stops at
#: 2.5% (--min-search-granularity 2.5 in sarathi/benchmark/capacity_search/main.py).
DEFAULT_REL_TOL = 0.025
MIN_RATE_PER_S = 1e-4
MAX_RATE_PER_S = 1e5


@dataclass(frozen=True)
class Saturation:
    """The highest rate meeting the attainment target, per sample and summarised.

    `requests_per_s` is the samples' mean and `spread_requests_per_s` the largest distance
    of a sample from it (each sample lies within mean +- spread). A sample's `status` is
    "crossed" (bracketed, then bisected), "above" (met the target even at MAX_RATE_PER_S:
    the answer is that rate) or "below" (missed it even at MIN_RATE_PER_S: the answer is
    0). `at_saturation` is the summary of the first sample's run at its answer."""

    requests_per_s: float
    spread_requests_per_s: float
    samples_requests_per_s: tuple
    #: per sample (highest rate seen to meet the target, lowest seen to miss it): None for
    #: an end the search never reached ("above": no miss; "below": no meet)
    brackets: tuple
    status: tuple
    samples: tuple  # each sample's trace label
    attainment: float
    rel_tol: float
    runs: int
    gpus: int
    config: SimConfig
    at_saturation: dict = dataclasses.field(repr=False)
    wall_s: float = dataclasses.field(default=0.0, compare=False)

    @property
    def requests_per_s_per_gpu(self) -> float:
        return self.requests_per_s / self.gpus

    def to_dict(self) -> dict:
        """JSON-ready (no wall time: identical searches print identical bytes)."""
        c = self.config
        return {
            "saturation_requests_per_s": self.requests_per_s,
            "saturation_spread_requests_per_s": self.spread_requests_per_s,
            "saturation_requests_per_s_per_gpu": self.requests_per_s_per_gpu,
            "saturation_samples_requests_per_s": list(self.samples_requests_per_s),
            "saturation_status": list(self.status),
            "saturation_brackets_requests_per_s": [list(b) for b in self.brackets],
            "samples": list(self.samples),
            "attainment_target": self.attainment,
            "tolerance": self.rel_tol,
            "runs": self.runs,
            "arch": c.arch,
            "model": c.model,
            "hardware": c.hardware,
            "gpus": self.gpus,
            "ttft_slo_s": c.ttft_slo_s,
            "tbt_slo_s": c.tbt_slo_s,
            "tbt_stat": c.tbt_stat,
            "at_saturation": self.at_saturation,
            "config": c.to_dict(),
        }


def saturation(  # noqa: PLR0913 - the search's knobs, keyword-only
    config: SimConfig,
    samples,
    *,
    attainment: float = DEFAULT_ATTAINMENT,
    rel_tol: float = DEFAULT_REL_TOL,
    start_rate_per_s: float | None = None,
    cost=None,
    min_rate_per_s: float = MIN_RATE_PER_S,
    observe=None,
) -> Saturation:
    """The highest request rate at which `config` meets the attainment target, found for
    each sample (a Trace or trace name, or a sequence of them; see `seed_samples`,
    `slice_samples`) and summarised as their mean and spread (see the module docstring).

    `start_rate_per_s` starts the first sample's search (default: its own mean rate); each
    later sample starts from the answer before. `cost` is the step-cost object shared by
    every run (default `make_cost(config)`). `min_rate_per_s` is the lowest rate tried
    (default MIN_RATE_PER_S); `observe(sample_index, rate, result)` sees every run (the
    module docstring). Bad arguments raise KvlabError."""
    check_number("attainment", attainment, maximum=1.0)
    check_number("rel_tol", rel_tol, maximum=1.0)
    check_number(
        "min_rate_per_s",
        min_rate_per_s,
        minimum=MIN_RATE_PER_S,
        allow_equal_min=True,
        maximum=MAX_RATE_PER_S,
    )
    if start_rate_per_s is not None:
        check_number(
            "start_rate_per_s", start_rate_per_s, minimum=MIN_RATE_PER_S, maximum=MAX_RATE_PER_S
        )
    if observe is not None and not callable(observe):
        raise KvlabError("observe must be a function (sample_index, rate, result)")
    traces = _samples(samples)
    resolved = config.resolved()
    cost = cost or make_cost(resolved)
    wall = time.perf_counter()
    rates, brackets, statuses, runs, first_summary = [], [], [], 0, None
    start = start_rate_per_s
    for index, trace in enumerate(traces):
        seen = None if observe is None else functools.partial(observe, index)
        found = _search(config, trace, attainment, rel_tol, start, cost, min_rate_per_s, seen)
        rates.append(found.rate)
        brackets.append((found.lo, found.hi))
        statuses.append(found.status)
        runs += found.runs
        if first_summary is None:
            first_summary = found.summary
        if found.rate > 0:
            start = found.rate
    mean = sum(rates) / len(rates)
    spread = max(abs(r - mean) for r in rates)
    return Saturation(
        requests_per_s=mean,
        spread_requests_per_s=spread,
        samples_requests_per_s=tuple(rates),
        brackets=tuple(brackets),
        status=tuple(statuses),
        samples=tuple(t.label for t in traces),
        attainment=attainment,
        rel_tol=rel_tol,
        runs=runs,
        gpus=resolved.gpus,
        config=resolved,
        at_saturation=first_summary or {},
        wall_s=time.perf_counter() - wall,
    )


@dataclass
class _Found:
    rate: float
    status: str
    runs: int
    summary: dict
    lo: float | None
    hi: float | None


def _search(config, trace, attainment, rel_tol, start, cost, floor, observe) -> _Found:  # noqa: PLR0913 - saturation()'s knobs, for one sample
    """Bracket, then bisect, one sample's rate (module docstring)."""
    native = measured_rate_per_s(trace)
    if not math.isfinite(native):
        raise KvlabError(
            f"trace {trace.label!r} has no rate to scale: its measured requests "
            + ("arrive at once" if native == math.inf else "are fewer than two")
        )
    rate = start if start is not None else min(max(native, floor), MAX_RATE_PER_S)
    verdicts: dict = {}

    def meets(r: float) -> bool:
        if r not in verdicts:
            result = Simulation(trace_at_rate(trace, r), config, cost).meets(attainment)
            summary = result.summary() if result is not None else None
            verdicts[r] = summary if summary and _attained(summary, attainment) else None
            if observe is not None:
                observe(r, result)
        return verdicts[r] is not None

    if meets(rate):
        lo = rate
        while True:
            if lo >= MAX_RATE_PER_S:
                return _Found(lo, "above", len(verdicts), verdicts[lo], lo, None)
            hi = min(lo * 2.0, MAX_RATE_PER_S)
            if not meets(hi):
                break
            lo = hi
    else:
        hi = rate
        while True:
            if hi <= floor:
                return _Found(0.0, "below", len(verdicts), {}, None, hi)
            lo = max(hi / 2.0, floor)
            if meets(lo):
                break
            hi = lo
    while hi - lo > rel_tol * hi:
        mid = math.sqrt(lo * hi)
        if meets(mid):
            lo = mid
        else:
            hi = mid
    return _Found(lo, "crossed", len(verdicts), verdicts[lo], lo, hi)


def _attained(summary: dict, attainment: float) -> bool:
    got = summary["slo_attainment"]
    return got is not None and got >= attainment - 1e-12


def _samples(samples) -> list:
    if isinstance(samples, (str, bytes)) or not hasattr(samples, "__iter__"):
        samples = [samples]
    traces = [load_trace(s) for s in samples]
    if not traces:
        raise KvlabError("saturation needs at least one sample (a trace)")
    return traces


def is_generated_spec(text) -> bool:
    """Whether a trace argument names a generated workload (seeded), not a recorded trace."""
    text = str(text)
    return text == GENERATED or text.startswith((GENERATED + ":", POISSON + ":"))


def seed_samples(spec: str, seeds: int) -> list:
    """`seeds` traces of a generated workload (`generated[:PRESET][:SEED]` or
    `poisson:...`), its seed and the next seeds - 1."""

    seeds = _count("seeds", seeds)
    text = str(spec)
    if text.startswith(POISSON + ":"):
        base = parse_poisson(text)
        return [poisson_trace(dataclasses.replace(base, seed=base.seed + k)) for k in range(seeds)]
    if text == GENERATED or text.startswith(GENERATED + ":"):
        parts = text.split(":")[1:]
        digits = [p for p in parts if p.isdigit()]
        seed = int(digits[0]) if digits else 0
        preset = [p for p in parts if not p.isdigit()]
        head = ":".join([GENERATED, *preset])
        return [load_trace(f"{head}:{seed + k}") for k in range(seeds)]
    raise KvlabError(f"{_clip(text)!r} is not a generated workload: it has no seeds")


def slice_samples(
    trace,
    slices: int,
    start_s: float = 0.0,
    duration_s: float | None = None,
    limit: int | None = None,
    warmup_s: float = 0.0,
) -> list:
    """`slices` consecutive slices of a recorded trace, each led in by `warmup_s` seconds:
    with `duration_s`, windows of that length from `start_s`; with only `limit`, runs of
    that many requests; with neither, the trace from `start_s` cut into equal windows."""
    slices = _count("slices", slices)
    trace = load_trace(trace)
    if duration_s is None and limit is not None:  # runs of `limit` requests, by index
        check_number("start_s", start_s, minimum=0, allow_equal_min=True, maximum=1e9)
        t0 = trace.requests[0].arrival_s + start_s
        index = next((i for i, r in enumerate(trace.requests) if r.arrival_s >= t0), len(trace))
        index = max(index, trace.lead_in)
        if index + (slices - 1) * limit >= len(trace):
            raise KvlabError(
                f"trace {trace.name!r} holds fewer than {slices} runs of {limit} requests "
                f"from {start_s:g} s"
            )
        return [trace_window(trace, index + k * limit, limit, warmup_s) for k in range(slices)]
    if duration_s is None:
        begin = trace.requests[0].arrival_s
        span = trace.requests[-1].arrival_s - begin - start_s
        if span <= 0:
            raise KvlabError(f"trace {trace.name!r} has no span from {start_s:g} s to slice")
        duration_s = span / slices * (1 + 1e-9)
    return [
        trace_slice(trace, start_s + k * duration_s, duration_s, None, warmup_s)
        for k in range(slices)
    ]


def _count(name: str, k) -> int:
    return check_number(name, k, minimum=1, allow_equal_min=True, maximum=1000, integer=True)


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."

"""The simulator's view of a trace: a slice of it, and the mutable state of each request."""

from __future__ import annotations

import bisect
import dataclasses

import numpy as np

from ..errors import KvlabError, check_number
from ..traces import Trace, load_trace
from ..traces.generate import MAX_ARRIVAL_S

DONE, REJECTED, UNFINISHED = 0, 1, 2
STATUS = {DONE: "done", REJECTED: "rejected", UNFINISHED: "unfinished"}
#: Output tokens one replay may make in all: each becomes a float64 timestamp, handled a few
#: times over by the metrics (~0.1 KB per token at the peak: 2 GB here). The public
#: conversation trace makes 4.1e6; 1e5 requests of 1,000 tokens (1e8) would not fit.
MAX_REPLAY_TOKENS = 20_000_000


def check_replayable(trace) -> None:
    """Refuse, before anything runs, a trace whose replay would not fit in memory or whose
    arrivals lie where a float64 clock in seconds no longer resolves token gaps."""
    tokens = int(sum(r.output_tokens for r in trace.requests))
    if tokens > MAX_REPLAY_TOKENS:
        raise KvlabError(
            f"trace {trace.name!r} asks for {tokens:,} output tokens ({len(trace):,} requests), "
            f"beyond {MAX_REPLAY_TOKENS:,} per replay (each is a timestamp kept in memory); "
            "replay a slice (--limit, --duration) or fewer or shorter answers"
        )
    if trace.requests and trace.requests[-1].arrival_s > MAX_ARRIVAL_S:
        raise KvlabError(
            f"trace {trace.name!r} has arrivals up to {trace.requests[-1].arrival_s:.3g} s, "
            f"beyond {MAX_ARRIVAL_S:.3g} s where the simulator's clock stops resolving token "
            "gaps; slice it (--start/--duration shift the slice to start at 0)"
        )
    if not 0 <= trace.lead_in < max(len(trace), 1):
        raise KvlabError(f"trace {trace.name!r}: its lead-in leaves no request to measure")


def trace_slice(
    trace,
    start_s: float = 0.0,
    duration_s: float | None = None,
    limit: int | None = None,
    warmup_s: float = 0.0,
) -> Trace:
    """Requests arriving in [start_s, start_s + duration_s) (at most `limit` of them), led in
    by those of the `warmup_s` seconds before it, with arrivals shifted so that the replay
    starts at 0. The lead-in (`Trace.lead_in` requests) runs as any other (caches fill, the
    cluster loads up) but is not measured: Mooncake's and vLLM's benchmarks warm up before
    they measure, and a cold cache understates what a prefix cache serves. A lead-in is
    clipped at the trace's first request. The name says which slice it is."""
    trace = load_trace(trace)
    check_number("start_s", start_s, minimum=0, allow_equal_min=True, maximum=1e9)
    check_number("warmup_s", warmup_s, minimum=0, allow_equal_min=True, maximum=1e9)
    if duration_s is not None:
        check_number("duration_s", duration_s, maximum=1e9)
    if limit is not None:
        check_number("limit", limit, minimum=1, allow_equal_min=True, maximum=1e9, integer=True)
    if start_s == 0 and duration_s is None and limit is None and warmup_s == 0:
        return trace
    first = trace.requests[0].arrival_s
    t0 = first + start_s
    end = t0 + duration_s if duration_s is not None else float("inf")
    arrivals = [r.arrival_s for r in trace.requests]
    lo = max(bisect.bisect_left(arrivals, t0), trace.lead_in)
    hi = bisect.bisect_left(arrivals, end)
    if limit is not None:
        hi = min(hi, lo + int(limit))
    if hi <= lo:
        raise KvlabError(
            f"no request of trace {trace.name!r} arrives in the slice starting at {start_s:g} s"
            + (f" lasting {duration_s:g} s" if duration_s is not None else "")
        )
    where = (
        f"{start_s:g}-{start_s + duration_s:g} s"
        if duration_s is not None
        else f"from {start_s:g} s"
    )
    if limit is not None:
        where += f", first {hi - lo}"
    return _window(trace, lo, hi, t0, warmup_s, where)


def trace_window(trace, first: int, count: int, warmup_s: float = 0.0) -> Trace:
    """Requests first .. first + count - 1 of a trace (by index), led in by those of the
    `warmup_s` seconds before the first, shifted to start at 0 (see `trace_slice`)."""
    trace = load_trace(trace)
    check_number("warmup_s", warmup_s, minimum=0, allow_equal_min=True, maximum=1e9)
    n = len(trace)
    if not trace.lead_in <= first < n or count < 1:
        raise KvlabError(f"trace {trace.name!r} has no request {first} to start a window at")
    hi = min(n, first + int(count))
    t0 = trace.requests[first].arrival_s
    return _window(trace, first, hi, t0, warmup_s, f"requests {first}-{hi - 1}")


def _window(trace, lo: int, hi: int, t0: float, warmup_s: float, where: str) -> Trace:
    """Requests lo..hi-1 led in by those of the `warmup_s` seconds before time t0 (the
    window's start), shifted so that the replay starts at 0."""
    reqs = trace.requests
    lead_from = max(reqs[trace.lead_in].arrival_s, t0 - warmup_s) if warmup_s else t0
    start = lo
    while start > trace.lead_in and reqs[start - 1].arrival_s >= lead_from:
        start -= 1
    origin = reqs[start].arrival_s
    shifted = tuple(dataclasses.replace(r, arrival_s=r.arrival_s - origin) for r in reqs[start:hi])
    if warmup_s:
        where += f", warm-up {t0 - lead_from:g} s ({lo - start} requests)"
    return dataclasses.replace(
        trace, name=f"{trace.name} [{where}]", requests=shifted, lead_in=lo - start
    )


def measured_rate_per_s(trace) -> float:
    """Mean arrival rate of the measured requests: (requests - 1) over their first-to-last
    span; inf when they all arrive at once, nan for a single one."""
    measured = trace.requests[trace.lead_in :]
    if len(measured) < 2:
        return float("nan")
    span = measured[-1].arrival_s - measured[0].arrival_s
    return (len(measured) - 1) / span if span > 0 else float("inf")


def scale_arrivals(trace, scale: float) -> Trace:
    """The same requests in the same order arriving `scale` times as fast (gaps divided by
    `scale`, the first request still at the trace's first arrival): a real trace's
    burstiness and prefix sharing at `scale` times its load. The lead-in scales with it."""
    trace = load_trace(trace)
    check_number("rate scale", scale, maximum=1e9)
    if scale == 1:
        return trace
    t0 = trace.requests[0].arrival_s
    requests = tuple(
        dataclasses.replace(r, arrival_s=t0 + (r.arrival_s - t0) / scale) for r in trace.requests
    )
    return dataclasses.replace(trace, name=f"{trace.name} x{scale:g}", requests=requests)


def trace_at_rate(trace, rate_per_s: float) -> Trace:
    """The same requests in the same order with their gaps scaled so that the measured ones
    arrive at a mean `rate_per_s` (requests - 1 over the span from the first measured
    arrival to the last): a real trace's burstiness and prefix sharing at a chosen load."""
    trace = load_trace(trace)
    check_number("rate_per_s", rate_per_s, maximum=1e9)
    if len(trace) - trace.lead_in < 2:
        raise KvlabError("a trace needs two requests or more to be played at a rate")
    native = measured_rate_per_s(trace)
    if native == float("inf"):
        raise KvlabError(f"every request of trace {trace.name!r} arrives at once: it has no rate")
    t0 = trace.requests[0].arrival_s
    scale = native / rate_per_s
    requests = tuple(
        dataclasses.replace(r, arrival_s=(r.arrival_s - t0) * scale) for r in trace.requests
    )
    return dataclasses.replace(
        trace, name=f"{trace.name} at {rate_per_s:g} requests/s", requests=requests
    )


class SimRequest:
    """One request as it moves through the cluster (times in seconds from the slice start)."""

    __slots__ = (
        "id",
        "arrival_s",
        "input_tokens",
        "output_tokens",
        "hash_ids",
        "status",
        "reason",
        "reject_kind",
        "transfer_bytes",
        "est_s",
        "prefill_worker",
        "decode_worker",
        "cached_tokens",
        "done_tokens",
        "target_tokens",
        "produced",
        "blocks",
        "offset",
        "fetch_due",
        "deadline_step",
        "segments",
        "token_times",
        "preemptions",
        "swapped_bytes",
        "prefill_start_s",
        "prefill_end_s",
        "dispatch_s",
        "first_token_s",
        "decode_start_s",
        "finish_s",
        "join_s",
        "fetch_s",
        "fetch_local",
        "fetch_remote",
        "fetch_exposed_s",
        "transfer_wire_s",
        "transfer_exposed_s",
        "decode_wait_s",
        "join_step",
        "finish_step",
        "missed",
    )

    def __init__(self, i: int, r, transfer_bytes: float):
        self.id = i
        self.arrival_s = r.arrival_s
        self.input_tokens = r.input_tokens
        self.output_tokens = r.output_tokens
        self.hash_ids = r.hash_ids
        self.status = UNFINISHED
        self.reason = self.reject_kind = ""
        self.transfer_bytes = transfer_bytes  # the prompt's KV, moved prefill -> decode
        self.est_s = 0.0
        self.prefill_worker = self.decode_worker = -1
        self.cached_tokens = self.done_tokens = 0
        # tokens in KV before the next token (grows on a recompute)
        self.target_tokens = r.input_tokens
        self.produced = 0  # output tokens made so far
        self.blocks = 0  # HBM KV blocks held while not decoding (prefilling, joining, on the way)
        self.offset = 0
        self.fetch_due = False
        self.deadline_step = 0
        self.segments: list = []  # (worker, first step, end step) of each stretch of decoding
        self.token_times: list = []  # tokens made outside decode steps (a prefill's, on landing)
        self.preemptions = 0
        self.swapped_bytes = 0.0
        nan = float("nan")
        self.prefill_start_s = self.prefill_end_s = self.dispatch_s = nan
        self.first_token_s = self.decode_start_s = self.finish_s = self.join_s = nan
        self.fetch_s = self.fetch_exposed_s = 0.0
        self.fetch_local = self.fetch_remote = (0.0, 0.0)  # (bytes, wire seconds)
        self.transfer_wire_s = self.transfer_exposed_s = self.decode_wait_s = 0.0
        self.join_step = self.finish_step = 0
        self.missed = False  # known to miss its SLOs (Simulation._failed)

    @property
    def history_tokens(self) -> int:
        """KV tokens a decoding sequence holds before its next step (its latest token's KV
        is written by that step)."""
        return self.input_tokens + self.produced - 1

    def tokens_s(self) -> np.ndarray:
        """Every token's time: those made outside decode steps and the decode steps it was in."""
        parts = [np.asarray(self.token_times, dtype=float)]
        parts += [w.log.view()[a:b] for w, a, b in self.segments]
        return np.sort(np.concatenate(parts))

"""The simulator's view of a trace: a slice of it, and the mutable state of each request."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import KvlabError, check_number
from ..traces import Trace, load_trace

DONE, REJECTED, UNFINISHED = 0, 1, 2
STATUS = {DONE: "done", REJECTED: "rejected", UNFINISHED: "unfinished"}


def trace_slice(
    trace, start_s: float = 0.0, duration_s: float | None = None, limit: int | None = None
) -> Trace:
    """Requests arriving in [start_s, start_s + duration_s) (at most `limit` of them), with
    arrivals shifted so the slice starts at 0. The name says which slice it is."""
    trace = load_trace(trace)
    check_number("start_s", start_s, minimum=0, allow_equal_min=True, maximum=1e9)
    if duration_s is not None:
        check_number("duration_s", duration_s, maximum=1e9)
    if limit is not None:
        check_number("limit", limit, minimum=1, allow_equal_min=True, maximum=1e9, integer=True)
    if start_s == 0 and duration_s is None and limit is None:
        return trace
    t0 = trace.requests[0].arrival_s + start_s
    end = t0 + duration_s if duration_s is not None else float("inf")
    picked = [r for r in trace.requests if t0 <= r.arrival_s < end]
    if limit is not None:
        picked = picked[: int(limit)]
    if not picked:
        raise KvlabError(
            f"no request of trace {trace.name!r} arrives in the slice starting at {start_s:g} s"
            + (f" lasting {duration_s:g} s" if duration_s is not None else "")
        )
    shifted = tuple(dataclasses.replace(r, arrival_s=r.arrival_s - t0) for r in picked)
    where = (
        f"{start_s:g}-{start_s + duration_s:g} s"
        if duration_s is not None
        else f"from {start_s:g} s"
    )
    if limit is not None:
        where += f", first {len(picked)}"
    return dataclasses.replace(trace, name=f"{trace.name} [{where}]", requests=shifted)


def trace_at_rate(trace, rate_per_s: float) -> Trace:
    """The same requests in the same order with their gaps scaled so that they arrive at a
    mean `rate_per_s` (requests - 1 over the span from the first arrival to the last):
    a real trace's burstiness and prefix sharing at a chosen load."""
    trace = load_trace(trace)
    check_number("rate_per_s", rate_per_s, maximum=1e9)
    if len(trace) < 2:
        raise KvlabError("a trace needs two requests or more to be played at a rate")
    t0 = trace.requests[0].arrival_s
    span = trace.requests[-1].arrival_s - t0
    if span <= 0:
        raise KvlabError(f"every request of trace {trace.name!r} arrives at once: it has no rate")
    scale = (len(trace) - 1) / span / rate_per_s
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
        "token_worker",
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
        self.token_worker = None
        self.cached_tokens = self.done_tokens = 0
        self.target_tokens = (
            r.input_tokens
        )  # tokens in KV before the next token (grows on a recompute)
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

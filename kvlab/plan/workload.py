"""The traffic a plan is made for: a trace (or a generated workload), cut into one or more
slices of consecutive requests, each replayed at whatever rate the saturation search asks
(`kvlab.sim.trace_at_rate`: the slice's burstiness and prefix sharing kept).

Several slices give the saturation rate a spread (the same design on different stretches
of traffic), as the simulator's own saturation search reports it over seeds or slices
(the slices are `kvlab.sim.saturation.slice_samples`' runs of requests). A warm-up leads
each slice in with the requests of the seconds before it: they run (the prefix caches
fill, the cluster loads up) but are not measured, and they play at the slice's rate.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

import numpy as np

from ..errors import KvlabError, check_number
from ..sim import trace_slice
from ..sim.saturation import slice_samples
from ..traces import load_trace

#: Requests per slice unless told: enough for the queues of a small cluster to build up
#: and drain, few enough that one design's bisection takes seconds.
DEFAULT_REQUESTS = 1000
MAX_SLICES = 64


@dataclass(frozen=True)
class Workload:
    """`slices` consecutive slices of `requests` requests each, from `start_s` seconds into
    `trace` (a name, `generated...`, `poisson:...` or a .jsonl path), each led in by the
    requests of the `warmup_s` seconds before it (clipped at the trace's start)."""

    trace: str
    start_s: float = 0.0
    requests: int = DEFAULT_REQUESTS
    slices: int = 1
    warmup_s: float = 0.0

    def __post_init__(self):
        check_number("start", self.start_s, minimum=0, allow_equal_min=True, maximum=1e9)
        check_number("warm-up", self.warmup_s, minimum=0, allow_equal_min=True, maximum=1e9)
        n = check_number(
            "requests per slice",
            self.requests,
            minimum=2,
            allow_equal_min=True,
            maximum=1e7,
            integer=True,
        )
        k = check_number(
            "slices",
            self.slices,
            minimum=1,
            allow_equal_min=True,
            maximum=MAX_SLICES,
            integer=True,
        )
        object.__setattr__(self, "requests", n)
        object.__setattr__(self, "slices", k)

    def traces(self) -> tuple:
        """The slices as traces, each starting at 0 (the rate search rescales them)."""
        trace = load_trace(self.trace)
        need = self.requests * self.slices
        sliced = trace_slice(trace, self.start_s)
        left = len(sliced) - sliced.lead_in
        if left < need:
            raise KvlabError(
                f"trace {trace.name!r} has {left:,} requests from {self.start_s:g} s, "
                f"fewer than {self.slices} slice(s) of {self.requests:,}: ask for fewer"
            )
        out = slice_samples(
            trace, self.slices, self.start_s, limit=self.requests, warmup_s=self.warmup_s
        )
        for i, t in enumerate(out):
            measured = t.requests[t.lead_in :]
            if measured[-1].arrival_s <= measured[0].arrival_s:
                raise KvlabError(
                    f"slice {i + 1} of trace {trace.name!r}: all its requests arrive at once, "
                    "so it has no rate to scale"
                )
        return tuple(out)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def digest(traces) -> str:
    """A fingerprint of the requests themselves (arrivals, lengths, prefix blocks): a resume
    file written for other traffic is refused even when the trace keeps its name."""
    h = hashlib.sha256()
    for t in traces:
        h.update(np.ascontiguousarray(t.arrival_s).tobytes())
        h.update(np.ascontiguousarray(t.input_tokens).tobytes())
        h.update(np.ascontiguousarray(t.output_tokens).tobytes())
        for r in t.requests:
            h.update(np.asarray(r.hash_ids, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


def native_rate_per_s(trace) -> float:
    """A slice's own mean arrival rate: (requests - 1) over its first-to-last span."""
    a = trace.arrival_s
    return (len(a) - 1) / float(a[-1] - a[0])

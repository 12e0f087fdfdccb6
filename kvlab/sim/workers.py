"""The GPUs of a simulated cluster: decode-only, colocated (prefill and decode), prefill-only.

Decode and colocated GPUs are engines (kvlab.sim.engine): continuous batching, paged KV,
preemption, and an iteration scheduler (kvlab.sim.schedulers). A prefill GPU runs one
prompt at a time, first come first served, and hands the KV to a decode GPU.
"""

from __future__ import annotations

from collections import deque

from .engine import Engine, StepLog  # noqa: F401 - StepLog re-exported for callers of this module


class DecodeWorker(Engine):
    """A decode GPU: sequences arrive with their prompt's KV (or read it remotely) and decode.
    Its waiting queue only ever holds its own preempted sequences, recomputed here."""

    role = "decode"


class ColocatedWorker(Engine):
    """One GPU that prefills and decodes, like a vLLM engine serving on its own.

    Its scheduler decides how prompts and decode steps share iterations; an iteration that
    carries prompt tokens is one forward pass over them and the decode tokens, so every
    running sequence waits for the whole iteration: a long prompt stretches its
    neighbours' inter-token gaps unless it is cut into chunks.
    """

    role = "colocated"

    def enqueue(self, now: float, req):
        """A new prompt queues here (prefix load and prefill happen when it is admitted)."""
        req.target_tokens = req.input_tokens
        req.deadline_step = self.step_now(now) + self.patience
        self.waiting.append(req)
        self.queued_est_s += req.est_s
        if self.plan is None:
            return self._boundary(now)
        if (
            len(self.waiting) == 1 and not self.prefilling
        ):  # a decode plan: the prompt joins at a boundary
            return self.poke(now, req.deadline_step)
        return None

    def wait_estimate_s(self, now: float) -> float:
        return self.queued_est_s


class PrefillWorker:
    """A prefill-only GPU: one prompt at a time, first come first served."""

    role = "prefill"

    def __init__(self, sim, index: int, node: int, name: str, capacity_bytes: float, rng=None):
        self.sim, self.index, self.node, self.name = sim, index, node, name
        self.capacity_bytes, self.rng = capacity_bytes, rng
        self.waiting: deque = deque()
        self.queued_est_s = 0.0
        self.current = None
        self.free_at_s = 0.0
        self.busy_s = 0.0

    def wait_estimate_s(self, now: float) -> float:
        return max(0.0, self.free_at_s - now) + self.queued_est_s

    def enqueue(self, now: float, req):
        self.waiting.append(req)
        self.queued_est_s += req.est_s
        if self.current is None:
            return self._start(now)
        return None

    def _start(self, now: float):
        req = self.waiting.popleft()
        self.queued_est_s -= req.est_s
        self.current = req
        duration, events = self.sim.start_prefill(now, self, req)
        self.free_at_s = now + duration
        self.busy_s += duration
        # done first: a KV stream lands after it
        return [
            (self.free_at_s, self._on_done, (req,)),
            *events,
        ]

    def _on_done(self, now: float, req):
        self.current = None
        events = self.sim.end_prefill(now, self, req) or []
        if self.waiting:
            events += self._start(now)
        return events

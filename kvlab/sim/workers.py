"""GPU workers: decode with continuous batching, prefill FIFO, and both on one GPU (colocated).

A decode worker runs iterations: every running sequence gets one token per step, new
sequences join and finished ones leave only at step boundaries. Between two changes of
the batch the steps are known in advance (each sequence's history grows by one token per
step), so a worker plans all of them at once as numpy arrays ("a plan") and schedules one
event at its end: the earliest finish. A request that arrives mid-plan cuts the plan at
the first step boundary after its arrival. Token timestamps are the step log: request r
gets steps join_step..finish_step-1 of its worker.

Memory: a request reserves its whole KV (prompt + output tokens) when a worker accepts
it, and frees it when it finishes; nothing is preempted. `max_batch` caps sequences.
"""
from __future__ import annotations

import heapq
from collections import deque

import numpy as np

from .costs import pipeline_time_s

MAX_PLAN_STEPS = 4096  # steps planned at once (bounds the arrays; a long plan is simply re-planned)


class StepLog:
    """End times of a worker's steps, in a growing float64 buffer."""

    def __init__(self):
        self.buf = np.empty(4096)
        self.n = 0

    def extend(self, ends: np.ndarray) -> None:
        need = self.n + ends.size
        if need > self.buf.size:
            grown = np.empty(max(need, 2 * self.buf.size))
            grown[: self.n] = self.buf[: self.n]
            self.buf = grown
        self.buf[self.n: need] = ends
        self.n = need

    def view(self) -> np.ndarray:
        return self.buf[: self.n]


class DecodeWorker:
    """A GPU that decodes a continuous batch. `remote` prices steps with KV read over the network."""

    role = "decode"

    def __init__(self, sim, index: int, node: int, name: str, capacity_bytes: float, max_batch: int,
                 rng=None, remote: bool = False):
        self.sim, self.index, self.node, self.name = sim, index, node, name
        self.capacity_bytes, self.max_batch = capacity_bytes, max_batch
        self.rng, self.remote = rng, remote
        self.reserved_bytes = 0.0
        self.slots = 0  # sequences accepted (running, joining, or being prefilled here)
        self.running: dict = {}
        self._finish: list = []  # heap of (finish_step, request id)
        self._base = 0  # sum over running of (history at join - join step): history sum = base + b * step
        self._offsets: dict = {}  # request id -> (history at join - join step), for sliding windows
        self.incoming: list = []
        self.log = StepLog()
        self.n = 0  # committed steps
        self.plan = None  # (step end times, history sums (remote KV) or None, start time) of planned steps
        self.version = 0
        self.busy_s = 0.0

    # ------------------------------------------------------------------ capacity
    def fits(self, req) -> bool:
        return self.slots < self.max_batch and self.reserved_bytes + req.decode_bytes <= self.capacity_bytes

    def accept(self, req) -> None:
        self.reserved_bytes += req.decode_bytes
        self.slots += 1

    def release(self, req) -> None:
        self.reserved_bytes -= req.decode_bytes
        self.slots -= 1

    @property
    def free_bytes(self) -> float:
        return self.capacity_bytes - self.reserved_bytes

    # ------------------------------------------------------------------ arrivals
    def arrive(self, now: float, req):
        """A sequence with its first token and its KV here joins at the next step boundary."""
        self.incoming.append(req)
        return self.poke(now)

    def poke(self, now: float):
        """Something changed: start now if idle, else cut the plan at the next boundary."""
        if self.plan is None:
            return self._boundary(now)
        ends = self.plan[0]
        j = int(np.searchsorted(ends, now, side="left"))
        if j + 1 < ends.size:
            sums = self.plan[1]
            self.plan = (ends[: j + 1], None if sums is None else sums[: j + 1], self.plan[2])
            self.version += 1
            return [(float(ends[j]), self._on_plan_end, (self.version,))]
        return None

    # ------------------------------------------------------------------ stepping
    def _admit(self, now: float) -> None:
        n, window = self.n, self.sim.window
        for req in self.incoming:
            req.join_step = n
            req.decode_start_s = now
            req.finish_step = n + req.output_tokens - 1
            off = req.input_tokens - n
            self._base += off
            if window:
                self._offsets[req.id] = off
            self.running[req.id] = req
            heapq.heappush(self._finish, (req.finish_step, req.id))
        self.incoming.clear()

    def _history_sums(self, steps: np.ndarray) -> np.ndarray:
        """Sum over running sequences of the KV history each step attends to."""
        window = self.sim.window
        if not window:
            return self._base + len(self.running) * steps
        offs = np.fromiter(self._offsets.values(), np.int64, len(self._offsets))
        return np.minimum(offs[:, None] + steps[None, :], window).sum(axis=0)

    def _jitter(self, times: np.ndarray) -> np.ndarray:
        sim = self.sim
        if sim.jitter_sigma == 0.0:
            return times
        return times * self.rng.lognormal(sim.jitter_mu, sim.jitter_sigma, times.size)

    def _plan_decode(self, now: float):
        b = len(self.running)
        k = min(self._finish[0][0] - self.n, MAX_PLAN_STEPS)
        steps = np.arange(self.n, self.n + k)
        sums = self._history_sums(steps)
        if self.remote:
            times, _ = self.sim.cost.remote_decode_times_s(b, sums / b)
        else:
            times = self.sim.cost.decode_times_s(b, sums / b)
        ends = now + np.cumsum(self._jitter(times))
        self.plan = (ends, sums if self.remote else None, now)
        self.version += 1
        return [(float(ends[-1]), self._on_plan_end, (self.version,))]

    def _boundary(self, now: float):
        """At a step boundary: admit joiners, plan the next steps (or go idle)."""
        if self.incoming:
            self._admit(now)
        if self.running:
            return self._plan_decode(now)
        return None

    def _commit(self, now: float):
        """Book the planned steps as done; return the requests that finished."""
        ends, sums, start = self.plan
        self.plan = None
        if self.remote:
            b = len(self.running)
            _, tier = self.sim.cost.remote_decode_times_s(b, sums / b)
            self.sim.book_remote_decode(float(sums.sum()), float(tier.sum()))
        self.busy_s += float(ends[-1]) - start
        self.log.extend(ends)
        self.n += ends.size
        done = []
        finish, running, n = self._finish, self.running, self.n
        while finish and finish[0][0] <= n:
            _, rid = heapq.heappop(finish)
            req = running.pop(rid)
            self._base -= req.input_tokens - req.join_step
            if self.sim.window:
                del self._offsets[rid]
            done.append(req)
        return done

    def _on_plan_end(self, now: float, version: int):
        if version != self.version:
            return None  # a plan that was cut short
        done = self._commit(now)
        events = self.sim.decode_finished(now, self, done) if done else []
        if self.plan is None:  # finishing may have let a waiting request arrive here and start a plan
            events += self._boundary(now) or []
        return events


class ColocatedWorker(DecodeWorker):
    """One GPU that prefills and decodes, like a vLLM engine with chunked prefill.

    An iteration that carries a prefill chunk is one forward pass over the chunk and the
    decode tokens: every running sequence waits for the whole iteration, so a long prompt
    stretches its neighbours' inter-token gaps. `chunk_tokens` = 0 prefills a prompt in one
    iteration (no chunking).
    """

    role = "colocated"

    def __init__(self, sim, index, node, name, capacity_bytes, max_batch, rng=None, chunk_tokens: int = 8192):
        super().__init__(sim, index, node, name, capacity_bytes, max_batch, rng)
        self.chunk_tokens = chunk_tokens
        self.waiting: deque = deque()
        self.queued_est_s = 0.0
        self.prefilling = None  # the request being prefilled
        self._chunk = None  # (tokens done before this iteration, tokens after it) of the planned chunk

    def enqueue(self, now: float, req):
        self.waiting.append(req)
        self.queued_est_s += req.est_s
        if self.plan is None:
            return self._boundary(now)
        if self._chunk is None and self.prefilling is None and self.fits(self.waiting[0]):
            return self.poke(now)  # a decode-only plan: prefill joins at the next boundary
        return None

    def wait_estimate_s(self, now: float) -> float:
        return self.queued_est_s

    def _start_prefill(self, now: float):
        req = self.waiting.popleft()
        self.accept(req)
        self.sim.start_prefill(now, self, req)
        req.done_tokens = req.cached_tokens
        self.prefilling = req

    def _boundary(self, now: float):
        if self.incoming:
            self._admit(now)
        if self.prefilling is None and self.waiting and self.fits(self.waiting[0]):
            self._start_prefill(now)
        if self.prefilling is not None:
            return self._plan_fused(now)
        if self.running:
            self._chunk = None
            return self._plan_decode(now)
        return None

    def _plan_fused(self, now: float):
        req, sim = self.prefilling, self.sim
        done = req.done_tokens
        left = req.input_tokens - done
        chunk = left if self.chunk_tokens == 0 else min(left, self.chunk_tokens)
        b = len(self.running)
        mean = float(self._history_sums(np.array([self.n]))[0]) / b if b else 0.0
        t = sim.cost.fused_time_s(b, mean, done + chunk, done)
        if done == req.cached_tokens and req.fetch_s > 0:  # the first chunk waits for the prefix's KV
            t_all = pipeline_time_s(req.fetch_s, t, sim.layers) if sim.overlap else req.fetch_s + t
            sim.book_fetch(req, exposed_s=t_all - t)
            t = t_all
        t = float(self._jitter(np.array([t]))[0])
        self._chunk = (done, done + chunk)
        ends = np.array([now + t])
        self.plan = (ends, None, now)
        self.version += 1
        return [(float(ends[0]), self._on_plan_end, (self.version,))]

    def _on_plan_end(self, now: float, version: int):
        if version != self.version:
            return None
        chunk = self._chunk
        self._chunk = None
        done = self._commit(now)
        events = []
        if chunk is not None:
            req = self.prefilling
            req.done_tokens = chunk[1]
            if chunk[1] >= req.input_tokens:
                self.prefilling = None
                self.queued_est_s -= req.est_s
                events += self.sim.end_prefill(now, self, req) or []
        if done:
            events += self.sim.decode_finished(now, self, done)
        if self.plan is None:
            events += self._boundary(now) or []
        return events


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
        return [(self.free_at_s, self._on_done, (req,)), *events]  # done first: a KV stream lands after it

    def _on_done(self, now: float, req):
        self.current = None
        events = self.sim.end_prefill(now, self, req) or []
        if self.waiting:
            events += self._start(now)
        return events

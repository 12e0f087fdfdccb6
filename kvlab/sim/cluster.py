"""The cluster and a request's life in it, for the three architectures.

    colocated       arrive -> GPU (queue, prefix load, chunked prefill inside decode
                    iterations) -> first token -> decode on the same GPU.
    disaggregated   arrive -> prefill GPU (queue, load, prefill) -> pick a decode GPU with
                    room -> move the prompt's KV over the network (on the critical path)
                    -> first token -> decode.
    kv-centric      arrive -> prefill GPU chosen for the shortest estimated TTFT over a
                    global prefix pool -> decode GPU chosen by free HBM when the prefill
                    starts -> KV streams layer by layer while the prefill computes ->
                    first token when the last layer lands -> decode.

The first token reaches the user from the GPU that decodes (as in vLLM's disaggregated
proxy), so TTFT includes the KV move. With `remote_kv` nothing moves: the decode GPU
reads the prompt's KV over the network at every step.

A request longer than the model's trained context, or whose KV cannot fit on an empty GPU,
is rejected at arrival and reported, so a run always ends: every request ends done or
rejected. With `early_reject`, a request predicted to miss its SLOs is rejected at arrival
too (kvlab.sim.admission), counted apart. A prefix load from another node's DRAM (the
global pool) occupies the NICs of both nodes.
KV lives in paged HBM on every decoding GPU; the newest sequence is preempted when a step
finds no free block (kvlab.sim.engine).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque

import numpy as np

from ..errors import KvlabError
from ..fmt import si
from ..hardware import get_device
from ..models import get_model
from ..prompt import served_from_blocks
from ..traces import load_trace
from .admission import early_reject_reason, predict, too_large_reason, too_long_reason
from .caches import make_caches
from .config import SimConfig
from .cost_model import make_cost
from .costs import pipeline_time_s
from .loop import EventLoop
from .network import Link, Network
from .results import build_result
from .routers import route_decode, route_prefill
from .workers import ColocatedWorker, DecodeWorker, PrefillWorker
from .workload import DONE, REJECTED, UNFINISHED, SimRequest, check_replayable


class TargetMissed(Exception):
    """Raised inside a run given a failure budget once more measured requests have failed
    than the budget allows (`Simulation.meets`)."""


class Simulation:
    """One run of one trace on one cluster. The constructor only stores; `run()` simulates."""

    def __init__(self, trace, config: SimConfig | None = None, cost=None, progress=None):
        self.trace = trace
        self.config = config or SimConfig()
        self._cost = cost
        self.progress = progress  # callable(done_requests, total) or None
        self.fail_budget = None  # with meets(): measured failures allowed before stopping
        self.failures = 0

    # ------------------------------------------------------------------ set-up
    def _build(self):
        c = self.config = self.config.resolved()
        self.trace = load_trace(self.trace)
        check_replayable(self.trace)
        model, device = get_model(c.model), get_device(c.hardware)
        self.model = model
        self.cost = self._cost or make_cost(c)
        counts = getattr(self.cost, "counts", None)
        self.cost_counts_start = counts() if counts else (0, 0)
        # an instance of tp GPUs: each holds its share of the weights and of every
        # token's KV (`kvlab.operators`), so the instance's KV per token and room are tp x
        # one GPU's (replicated K/V heads and MLA latents counted on every GPU that holds them)
        d, tp = c.deployment, c.tensor_parallel
        self.kv_bytes_per_token = d.kv_bytes_per_token * tp
        self.window = model.sliding_window or 0
        self.max_context_tokens = model.max_position_embeddings or 0
        self.layers = model.num_layers
        self.overlap = bool(c.overlap)
        self.block_tokens = self.trace.block_tokens
        weights = d.weight_bytes
        self.kv_room_bytes = (device.capacity_bytes * c.memory_fraction - weights) * tp
        if self.kv_room_bytes < c.kv_block_tokens * self.kv_bytes_per_token:
            per_gpu = f" per GPU at tensor parallel {tp}" if tp > 1 else ""
            raise KvlabError(
                f"{model.name} weights ({si(weights, 'B')}{per_gpu}) do not fit in "
                f"{c.memory_fraction:g} of {device.name}'s {si(device.capacity_bytes, 'B')} "
                "with room for KV: pick a larger GPU, a smaller dtype or more tensor parallelism"
            )
        sigma2 = math.log1p(c.step_jitter**2)
        self.jitter_sigma, self.jitter_mu = math.sqrt(sigma2), -sigma2 / 2
        self.loop = EventLoop()
        self._build_workers(c)
        block_bytes = self.block_tokens * self.kv_bytes_per_token
        self.caches = make_caches(
            c.prefix_cache,
            len(self.front),
            math.floor(c.pool_bytes_per_node / block_bytes),
            c.cache_policy,
        )
        kv = self.kv_bytes_per_token
        held = (lambda n: min(n, self.window)) if self.window else (lambda n: n)
        self.requests = [
            SimRequest(i, r, kv * held(r.input_tokens)) for i, r in enumerate(self.trace.requests)
        ]
        self.pending: deque = deque()  # prefilled, waiting for a decode GPU with room
        self.timeline: list = []
        self.finished = 0
        self.swapped_bytes = 0.0

    def _build_workers(self, c) -> None:
        colocated = c.arch == "colocated"
        n_front = c.instances if colocated else c.prefill_workers
        nodes = n_front if colocated else c.instances
        rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(c.seed).spawn(nodes)]
        room = self.kv_room_bytes
        if colocated:
            self.front = [
                ColocatedWorker(self, i, i, f"gpu-{i}", room, c.max_batch, rngs[i])
                for i in range(n_front)
            ]
            self.decoders = self.front
        else:
            self.front = [
                PrefillWorker(self, i, i, f"prefill-{i}", room, rngs[i]) for i in range(n_front)
            ]
            self.decoders = [
                DecodeWorker(
                    self,
                    j,
                    n_front + j,
                    f"decode-{j}",
                    room,
                    c.max_batch,
                    rngs[n_front + j],
                    remote=c.remote_kv,
                )
                for j in range(c.decode_workers)
            ]
        tp = c.tensor_parallel
        self.network = Network(
            Link(c.link, c.link_efficiency, tp), Link(c.host_link, c.link_efficiency, tp), nodes
        )

    # ------------------------------------------------------------------ running
    def run(self):
        """Simulate the whole trace; returns a `SimResult`."""

        wall = time.perf_counter()
        self._build()
        if self.requests:
            self.loop.schedule(self.requests[0].arrival_s, self._on_arrival, 0)
        self.loop.run()
        return build_result(self, time.perf_counter() - wall)

    def meets(self, attainment: float):
        """Whether at least `attainment` of the measured requests meet both SLOs: the run's
        SimResult, or None as soon as more have missed their TTFT (or been rejected) than
        that allows: a run past saturation stops early, its verdict known."""

        self._build()
        measured = len(self.requests) - self.trace.lead_in
        self.fail_budget = math.floor(measured * (1.0 - attainment) + 1e-9)
        self._awaiting = deque()  # measured, admitted, no first token yet: by arrival
        if self.requests:
            self.loop.schedule(self.requests[0].arrival_s, self._on_arrival, 0)
        try:
            self.loop.run()
        except TargetMissed:
            return None
        return build_result(self, 0.0)

    def _failed(self, req) -> None:
        """A measured request is known to miss its SLOs (with a budget: maybe stop)."""
        if req.id < self.trace.lead_in or req.missed:
            return
        req.missed = True
        self.failures += 1
        if self.fail_budget is not None and self.failures > self.fail_budget:
            raise TargetMissed

    def _past_deadline(self, now: float) -> None:
        """With a failure budget: count the admitted requests still without a first token
        whose TTFT limit has passed (deadlines come in arrival order)."""
        awaiting, slo = self._awaiting, self.config.ttft_slo_s
        while awaiting:
            head = awaiting[0]
            if head.status == UNFINISHED and math.isnan(head.first_token_s):
                if now - head.arrival_s <= slo:
                    return
                self._failed(head)
            awaiting.popleft()

    def first_token_made(self, now: float, req) -> None:
        """The first token of `req` reached the user at `now`."""
        req.first_token_s = now
        if now - req.arrival_s > self.config.ttft_slo_s:
            self._failed(req)

    def _on_arrival(self, now: float, i: int):
        reqs = self.requests
        events = [(reqs[i + 1].arrival_s, self._on_arrival, (i + 1,))] if i + 1 < len(reqs) else []
        req = reqs[i]
        reason = too_long_reason(self, req)
        if reason:
            return events + self._reject(req, "too-long", reason)
        reason = too_large_reason(self, req)
        if reason:
            return events + self._reject(req, "too-large", reason)
        worker, req.est_s, wait_s = route_prefill(self, now, req, self.front)
        if self.config.early_reject:
            prediction = predict(self, now, req, worker, wait_s, req.est_s)
            reason = early_reject_reason(self, req, prediction)
            if reason:
                return events + self._reject(req, "early", reason)
        if self.fail_budget is not None:
            self._past_deadline(now)
            if i >= self.trace.lead_in:
                self._awaiting.append(req)
        events += worker.enqueue(now, req) or []
        return events

    def _reject(self, req, kind: str, reason: str) -> list:
        req.status, req.reject_kind, req.reason = REJECTED, kind, reason
        self._count(req)
        self._failed(req)
        return []

    def _count(self, req) -> None:
        self.finished += 1
        if self.progress is not None and self.finished % 1000 == 0:
            self.progress(self.finished, len(self.requests))

    # ------------------------------------------------------------------ prefill
    def start_prefill(self, now: float, worker, req):
        """Look the prefix up, book its load; for a prefill GPU return (seconds busy, events)."""
        bt, kv = self.block_tokens, self.kv_bytes_per_token
        k, local_k = self.caches.lookup(worker.index, req.hash_ids)
        cached = served_from_blocks(k, bt, req.input_tokens)
        local_tok = min(local_k * bt, cached)
        remote_tok = cached - local_tok
        t_local = self.network.host_link.time_s(local_tok * kv)
        t_remote = 0.0
        if remote_tok:  # from each block's home node: both ends' NICs carry the bytes
            sources = self.caches.remote_sources(worker.index, req.hash_ids, k)
            blocks = sum(sources.values())
            wire_total = 0.0
            for src, n in sorted(sources.items()):
                nbytes = remote_tok * kv * n / blocks
                _, end, wire = self.network.reserve(self.front[src].node, worker.node, nbytes, now)
                t_remote = max(t_remote, end - now)
                wire_total += wire
            req.fetch_remote = (remote_tok * kv, wire_total)
        req.fetch_local = (local_tok * kv, t_local)
        req.fetch_s = max(t_local, t_remote)
        req.cached_tokens = cached
        req.prefill_start_s = now
        req.prefill_worker = worker.index
        if worker.role == "colocated":
            return None  # the load is booked with the first prefill iteration (ColocatedWorker)
        compute = self.cost.prefill_times_s(req.input_tokens, cached)[0]
        if self.jitter_sigma:
            compute *= float(worker.rng.lognormal(self.jitter_mu, self.jitter_sigma))
        busy = (
            pipeline_time_s(req.fetch_s, compute, self.layers)
            if self.overlap
            else req.fetch_s + compute
        )
        self.book_fetch(req, busy - compute)
        end = now + busy
        if req.fetch_s > 0:
            self.timeline.append((worker.name, now, now + req.fetch_s, "fetch", req.id))
        self.timeline.append((worker.name, now, end, "prefill", req.id))
        events = []
        if self.overlap and not self.config.remote_kv:
            target = route_decode(self, req, self.decoders)
            if target is not None:  # stream the KV layer by layer as the prefill makes it
                events = self._send(now, req, worker, target, producer_end_s=end)
        return busy, events

    def book_fetch(self, req, exposed_s: float) -> None:
        """Book the prefix load of `req`; `exposed_s` of it delayed the prefill."""
        req.fetch_exposed_s = max(0.0, exposed_s)
        net = self.network
        (lb, lt), (rb, rt) = req.fetch_local, req.fetch_remote
        if lb:
            net.book("prefix-load-local", lb, lt, min(lt, req.fetch_exposed_s))
        if rb:
            net.book("prefix-load-remote", rb, rt, min(req.fetch_s, req.fetch_exposed_s))

    def end_prefill(self, now: float, worker, req):
        """The prompt is prefilled: cache its blocks, then hand it to decode."""
        req.prefill_end_s = now
        new_blocks = self.caches.insert(worker.index, req.hash_ids)
        if new_blocks:
            stored = min(new_blocks * self.block_tokens, req.input_tokens) * self.kv_bytes_per_token
            self.network.book("cache-store", stored, self.network.host_link.time_s(stored), 0.0)
        if worker.role == "colocated":  # the engine makes the token and lets it decode
            self.timeline.append((worker.name, req.prefill_start_s, now, "prefill", req.id))
            if req.fetch_s > 0:
                self.timeline.append(
                    (
                        worker.name,
                        req.prefill_start_s,
                        req.prefill_start_s + req.fetch_s,
                        "fetch",
                        req.id,
                    )
                )
            req.decode_worker = worker.index
            return None
        if req.decode_worker >= 0:
            return None  # streamed during the prefill: its landing is already scheduled
        self.pending.append(req)
        return self._dispatch_pending(now)

    # ------------------------------------------------------------------ KV to decode
    def _send(self, now: float, req, src_worker, target, producer_end_s=None):
        events = target.accept(now, req) or []
        req.decode_worker = target.index
        req.dispatch_s = now
        start, end, wire = self.network.reserve(
            src_worker.node, target.node, req.transfer_bytes, now, producer_end_s, self.layers
        )
        req.transfer_wire_s = wire
        self.timeline.append((target.name, start, end, "transfer", req.id))
        return [(end, self._on_land, (req,)), *events]

    def _on_land(self, now: float, req):
        req.transfer_exposed_s = now - max(req.prefill_end_s, req.dispatch_s)
        self.network.book(
            "kv-transfer", req.transfer_bytes, req.transfer_wire_s, req.transfer_exposed_s
        )
        return self._first_token(now, req, self.decoders[req.decode_worker])

    def _first_token(self, now: float, req, worker):
        """The first token reaches the user from the decode GPU; the request decodes there."""
        self.first_token_made(now, req)
        req.token_times.append(now)
        req.produced = 1
        if req.output_tokens == 1:
            return self.finish(now, req, worker)
        return worker.arrive(now, req) or []

    def _dispatch_pending(self, now: float):
        """Hand waiting prefilled requests (first come, first served) to decode GPUs with room."""
        events = []
        pending = self.pending
        while pending:
            req = pending[0]
            target = route_decode(self, req, self.decoders)
            if target is None:
                break
            pending.popleft()
            req.decode_wait_s = now - req.prefill_end_s
            if self.config.remote_kv:  # nothing moves; the decode GPU reads the KV where it is
                events += target.accept(now, req) or []
                req.decode_worker, req.dispatch_s = target.index, now
                events += self._first_token(now, req, target)
            else:
                events += self._send(now, req, self.front[req.prefill_worker], target)
        return events

    # ------------------------------------------------------------------ decode
    def decode_finished(self, now: float, worker, done):
        events = []
        for req in done:
            events += self.finish(now, req, worker)
        return events

    def finish(self, now: float, req, worker):
        """`req` made its last token: it leaves `worker`, whose room may let a waiting one in."""
        req.finish_s = now
        req.status = DONE
        worker.release(req)
        self._count(req)
        if self.pending:
            return self._dispatch_pending(now)
        return []

    def book_swap(self, req, nbytes: float) -> float:
        """A preempted sequence's KV crosses the host link (out or back in); returns the bytes."""
        req.swapped_bytes += nbytes
        self.swapped_bytes += nbytes
        wire = self.network.host_link.time_s(nbytes)
        self.network.book("preempt-swap", nbytes, wire, wire)
        return nbytes

    def book_remote_decode(self, history_tokens: float, network_s: float) -> None:
        """Decode steps that read `history_tokens` of KV over the network, waiting network_s."""
        self.network.book(
            "remote-decode", history_tokens * self.kv_bytes_per_token, network_s, network_s
        )


def simulate(trace, config: SimConfig | None = None, cost=None, progress=None, **overrides):
    """Simulate `trace` (a Trace, name or path) on a cluster; keyword overrides go into the
    config (`simulate("generated", arch="colocated", decode_workers=4)`). Returns a SimResult."""

    config = (
        dataclasses.replace(config or SimConfig(), **overrides)
        if overrides
        else (config or SimConfig())
    )
    return Simulation(trace, config, cost, progress).run()

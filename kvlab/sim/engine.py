"""One GPU running an engine loop as vLLM does: iterations, paged KV, preemption.

A GPU runs iterations. In each, its running sequences may decode one token (continuous
batching: sequences join and leave only at step boundaries) and prompt chunks may be
prefilled; a scheduler (kvlab.sim.schedulers) picks which. Between two changes of the
batch the decode steps are known in advance (each sequence's history grows by one token
per step), so a GPU plans all of them at once as numpy arrays ("a plan") and schedules
one event at its end. Something that arrives mid-plan cuts the plan at a later step
boundary. A request's token timestamps are its prefill's token(s) plus the steps of the
worker's step log it was decoding in.

Memory is paged, as in vLLM: the KV lives in blocks of `kv_block_tokens` tokens within the
GPU's share of HBM. A prompt gets the blocks of its whole KV when it is admitted (and only
if `WATERMARK` of the blocks stay free, vLLM v0's rule), a decoding sequence one more
block whenever its history crosses a block boundary. When the next decode step cannot
get its blocks, the newest sequence (the last to arrive) is preempted: with `recompute`
its KV is dropped and it later prefills its prompt plus the tokens it has generated (the
prefill yields its next token); with `swap` its KV crosses the host link to host memory
and back when blocks are free again, and both moves stall the GPU's iteration. Preempted
requests go before new prompts. The oldest request always progresses, so a run ends.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque

import numpy as np

from .costs import pipeline_time_s
from .schedulers import SCHEDULERS, Iteration

MAX_PLAN_STEPS = 4096  # steps planned at once (bounds the arrays; a long plan is simply re-planned)
WATERMARK = 0.01  # share of a GPU's KV blocks a prompt admission leaves free (vLLM v0's default)


class StepLog:
    """End times of a worker's decode steps, in a growing float64 buffer."""

    def __init__(self):
        self.buf = np.empty(4096)
        self.n = 0

    def extend(self, ends: np.ndarray) -> None:
        need = self.n + ends.size
        if need > self.buf.size:
            grown = np.empty(max(need, 2 * self.buf.size))
            grown[: self.n] = self.buf[: self.n]
            self.buf = grown
        self.buf[self.n : need] = ends
        self.n = need

    def view(self) -> np.ndarray:
        return self.buf[: self.n]


class Plan:
    """Planned iterations: their end times, history sums (remote KV) and whether they step."""

    __slots__ = ("ends", "sums", "start", "steps", "iteration")

    def __init__(self, ends, sums, start, steps, iteration=None):
        self.ends, self.sums, self.start, self.steps, self.iteration = (
            ends,
            sums,
            start,
            steps,
            iteration,
        )


class Engine:
    """A GPU that decodes a continuous batch and prefills prompt chunks, KV in paged HBM.
    `remote` prices decode steps with the KV read over the network (and holds none)."""

    role = "decode"

    def __init__(  # noqa: PLR0913 - the object's wiring, keyword-only
        self,
        sim,
        index: int,
        node: int,
        name: str,
        capacity_bytes: float,
        max_batch: int,
        rng=None,
        remote: bool = False,
    ):
        c = sim.config
        self.sim, self.index, self.node, self.name = sim, index, node, name
        self.capacity_bytes, self.max_batch, self.rng, self.remote = (
            capacity_bytes,
            max_batch,
            rng,
            remote,
        )
        self.paged = not remote
        self.block_tokens = c.kv_block_tokens
        self.block_bytes = self.block_tokens * sim.kv_bytes_per_token
        self.capacity_blocks = math.floor(capacity_bytes / self.block_bytes)
        self.watermark_blocks = math.ceil(WATERMARK * self.capacity_blocks)
        self.scheduler = SCHEDULERS[c.scheduler]
        self.chunk_tokens, self.patience, self.swap = (
            c.chunk_tokens,
            self.scheduler.patience(c),
            c.preemption == "swap",
        )
        self.slots = (
            0  # sequences admitted here: decoding, prefilling, joining, or with KV on the way
        )
        self.other_blocks = 0  # KV blocks of admitted sequences that are not decoding
        self.running_blocks = 0  # KV blocks of the decoding sequences at the last boundary
        self._free_after_step = 0
        self.running: dict = {}
        self._finish: list = []  # heap of (finish_step, request id)
        self._base = (
            0  # sum over running of (history at join - join step): history sum = base + b * step
        )
        self._offsets: dict = {}  # request id -> history at join - join step
        # the offsets split for _blocks_at: offset + block_tokens - 1 = q x block_tokens + r
        self._q_sum = 0  # sum of the q
        self._remainders: list = []  # the r, sorted
        self._offs = None  # the offsets as an array (windowed models; rebuilt after a change)
        self._blocks_memo: dict = {}  # step -> _blocks_at(step) for these offsets (windowed)
        self.incoming: list = []  # with their KV here and a token made: join at the next boundary
        self.prefilling: list = []  # admitted prompts, oldest first
        self.waiting: deque = deque()  # prompts (new, or preempted to recompute) not yet admitted
        self.swapped: list = []  # preempted to host memory, oldest first
        self.log = StepLog()
        self.n = 0  # committed decode steps
        self.plan: Plan | None = None
        self.version = 0
        self.busy_s = 0.0
        self.queued_est_s = 0.0
        self.now = 0.0
        self._swap_bytes = 0.0  # swap moves the next iteration waits for
        self.preemptions = 0

    # ------------------------------------------------------------------ memory
    def blocks_for(self, tokens: int) -> int:
        if not self.paged:
            return 0
        window = self.sim.window
        return -(-(min(tokens, window) if window else tokens) // self.block_tokens)

    def _blocks_at(self, step: int) -> int:
        """KV blocks the decoding sequences hold at step boundary `step`: the sum over them
        of ceil((offset + step) / block_tokens). With offset + block_tokens - 1 = q B + r
        and step = a B + t (B = block_tokens, 0 <= r, t < B) each term is q + a, plus 1 where
        r + t >= B, so the sum is exact from the q's sum and the sorted r's: a boundary asks
        several times, and the batch changes between boundaries."""
        if not self.paged or not self._offsets:
            return 0
        if self.sim.window:
            return self._windowed_blocks(step)
        a, t = divmod(int(step), self.block_tokens)
        n = len(self._remainders)
        return self._q_sum + n * a + n - bisect.bisect_left(self._remainders, self.block_tokens - t)

    def _windowed_blocks(self, step: int) -> int:
        """`_blocks_at` under a sliding window (each sequence holds at most the window)."""
        held = self._blocks_memo.get(step)
        if held is None:
            if self._offs is None:
                self._offs = np.fromiter(self._offsets.values(), np.int64, len(self._offsets))
            tokens = np.minimum(self._offs + step, self.sim.window)
            bt = self.block_tokens
            held = self._blocks_memo[step] = int(((tokens + bt - 1) // bt).sum())
        return held

    def _track_offset(self, offset: int, sign: int) -> None:
        """Add (sign 1) or remove (-1) a running sequence's offset in `_blocks_at`'s sums."""
        q, r = divmod(offset + self.block_tokens - 1, self.block_tokens)
        self._q_sum += sign * q
        if sign > 0:
            bisect.insort(self._remainders, r)
        else:
            del self._remainders[bisect.bisect_left(self._remainders, r)]

    @property
    def free_bytes(self) -> float:
        if not self.paged:
            return self.capacity_bytes
        return (self.capacity_blocks - self.other_blocks - self.running_blocks) * self.block_bytes

    def fits(self, req) -> bool:
        """Room for a prompt's KV arriving from a prefill GPU (and a batch slot)."""
        free = self.capacity_blocks - self.other_blocks - self.running_blocks
        return (
            self.slots < self.max_batch
            and self.blocks_for(req.input_tokens) + self.watermark_blocks <= free
        )

    def accept(self, now: float, req):
        """Reserve a slot and the blocks of a prompt's KV that is on its way here."""
        self.slots += 1
        req.blocks = self.blocks_for(req.input_tokens)
        self.other_blocks += req.blocks
        # a plan made before may not leave room for it
        return self.poke(now) if self.paged else None

    def release(self, req) -> None:
        """A request leaves (finished): its slot, and its blocks unless it was decoding."""
        self.slots -= 1
        self.other_blocks -= req.blocks
        req.blocks = 0

    def admit_prompt(self, req) -> bool:
        """Admit the first waiting prompt if its KV blocks and a slot are free."""
        need = self.blocks_for(req.target_tokens)
        if self.slots >= self.max_batch or (
            self.paged and need + self.watermark_blocks > self._free_after_step
        ):
            return False
        self.waiting.popleft()
        self.slots += 1
        req.blocks = need
        self.other_blocks += need
        self._free_after_step -= need
        if math.isnan(req.prefill_start_s):  # a new prompt: look its prefix up, book its load
            self.sim.start_prefill(self.now, self, req)
            req.done_tokens = req.cached_tokens
            req.fetch_due = req.fetch_s > 0
        else:  # preempted to recompute: everything it held is computed again
            req.done_tokens = 0
        self.prefilling.append(req)
        return True

    # ------------------------------------------------------------------ preemption
    def _make_room(self, now: float) -> None:
        """Preempt the newest sequences until the next decode step finds its blocks; then
        bring swapped sequences back while they fit."""
        self.running_blocks = self._blocks_at(self.n)
        while (
            self.running and self._blocks_at(self.n + 1) > self.capacity_blocks - self.other_blocks
        ):
            self._preempt(now, max((*self.running.values(), *self.prefilling), key=lambda r: r.id))
            self.running_blocks = self._blocks_at(self.n)
        while self.swapped and self.slots < self.max_batch:
            req = self.swapped[0]
            free = self.capacity_blocks - self.other_blocks - self._blocks_at(self.n + 1)
            if self.blocks_for(req.history_tokens + 1) + self.watermark_blocks > free:
                break
            self.swapped.pop(0)
            self.slots += 1
            self._swap_bytes += self.sim.book_swap(
                req, self.blocks_for(req.history_tokens) * self.block_bytes
            )
            self._join(now, req)
        self.running_blocks = self._blocks_at(self.n)
        step = self.n + 1 if self.running else self.n
        self._free_after_step = self.capacity_blocks - self.other_blocks - self._blocks_at(step)

    def _preempt(self, now: float, req) -> None:
        self.preemptions += 1
        req.preemptions += 1
        self.slots -= 1
        if req.id in self.running:
            self._leave(now, req, self.n)
            if self.swap:
                self._swap_bytes += self.sim.book_swap(
                    req, self.blocks_for(req.history_tokens) * self.block_bytes
                )
                bisect.insort(self.swapped, req, key=lambda r: r.id)
                return
        else:  # a prompt being prefilled: always recomputed
            self.prefilling.remove(req)
            self.other_blocks -= req.blocks
            req.blocks = 0
        req.target_tokens = req.input_tokens + req.produced
        self.waiting.appendleft(req)

    # ------------------------------------------------------------------ joining and leaving
    def _join(self, now: float, req) -> None:
        """`req` starts decoding at this boundary (its KV here, its latest token made)."""
        n = self.n
        self.other_blocks -= req.blocks
        req.blocks = 0
        req.join_step = n
        req.join_s = now
        if math.isnan(req.decode_start_s):
            req.decode_start_s = now
        req.finish_step = n + req.output_tokens - req.produced
        req.offset = req.history_tokens - n
        self._base += req.offset
        self._offsets[req.id] = req.offset
        self._offs, self._blocks_memo = None, {}
        self._track_offset(req.offset, 1)
        self.running[req.id] = req
        heapq.heappush(self._finish, (req.finish_step, req.id))

    def _leave(self, now: float, req, step: int) -> None:
        """`req` stops decoding at boundary `step` (finished, or preempted)."""
        req.segments.append((self, req.join_step, step))
        req.produced += step - req.join_step
        del self.running[req.id]
        del self._offsets[req.id]
        self._offs, self._blocks_memo = None, {}
        self._track_offset(req.offset, -1)
        self._base -= req.offset
        if step < req.finish_step:  # preempted: drop its heap entry
            self._finish = [e for e in self._finish if e[1] != req.id]
            heapq.heapify(self._finish)
        self.sim.timeline.append((self.name, req.join_s, now, "decode", req.id))

    # ------------------------------------------------------------------ arrivals
    def arrive(self, now: float, req):
        """A sequence with its first token and its KV here joins at the next step boundary."""
        self.incoming.append(req)
        return self.poke(now)

    def step_now(self, now: float) -> int:
        """The decode steps done by `now` (committed and planned)."""
        if self.plan is None or not self.plan.steps:
            return self.n
        return self.n + int(np.searchsorted(self.plan.ends, now, side="right"))

    def poke(self, now: float, at_step: int | None = None):
        """Something changed: start now if idle, else cut a decode plan at the next step
        boundary (or at boundary `at_step`, if that is later)."""
        if self.plan is None:
            return self._boundary(now)
        plan = self.plan
        if plan.iteration is not None:
            return None  # one iteration, whose end is a boundary anyway
        j = int(np.searchsorted(plan.ends, now, side="left"))
        keep = j + 1 if at_step is None else max(j + 1, at_step - self.n)
        if keep < plan.ends.size:
            self.plan = Plan(
                plan.ends[:keep], None if plan.sums is None else plan.sums[:keep], plan.start, True
            )
            self.version += 1
            return [(float(plan.ends[keep - 1]), self._on_plan_end, (self.version,))]
        return None

    # ------------------------------------------------------------------ stepping
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

    def _boundary(self, now: float):
        """At a step boundary: admit joiners, make room, let the scheduler pick what runs."""
        self.now = now
        for req in self.incoming:
            self._join(now, req)
        self.incoming.clear()
        self._make_room(now)
        iteration = self.scheduler.pick(self)
        if iteration is None:
            if (
                self._swap_bytes
            ):  # preempted to swap with nothing left to run: the move still happens
                return self._start(now, Iteration())
            return None
        if iteration.decode and not iteration.chunks and not self._swap_bytes:
            return self._plan_decode(now, iteration.max_steps)
        return self._start(now, iteration)

    def _steps_that_fit(self, k: int) -> int:
        """The most of the next k decode steps whose KV blocks are free (>= 1: see _make_room)."""
        room = self.capacity_blocks - self.other_blocks
        if self._blocks_at(self.n + k) <= room:
            return k
        lo, hi = 1, k  # the step count that fits lies in [lo, hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self._blocks_at(self.n + mid) <= room else (lo, mid)
        return lo

    def _plan_decode(self, now: float, max_steps: int | None = None):
        b = len(self.running)
        k = min(self._finish[0][0] - self.n, MAX_PLAN_STEPS, max_steps or MAX_PLAN_STEPS)
        if self.paged:
            k = self._steps_that_fit(k)
        steps = np.arange(self.n, self.n + k)
        sums = self._history_sums(steps)
        if self.remote:
            times, _ = self.sim.cost.remote_decode_times_s(b, sums / b)
        else:
            times = self.sim.cost.decode_times_s(b, sums / b)
        ends = now + np.cumsum(self._jitter(times))
        self.plan = Plan(ends, sums if self.remote else None, now, True)
        self.version += 1
        return [(float(ends[-1]), self._on_plan_end, (self.version,))]

    def _start(self, now: float, it: Iteration):
        """One iteration of prompt chunks, with or without a decode step, plus any swap moves."""
        sim = self.sim
        b = len(self.running) if it.decode else 0
        mean = float(self._history_sums(np.array([self.n]))[0]) / b if b else 0.0
        chunks = [(end, start) for _, start, end in it.chunks]
        t = sim.cost.iteration_time_s(b, mean, chunks) if chunks or b else 0.0
        due = [req for req, _, _ in it.chunks if req.fetch_due]
        if due:  # a new prompt's first chunk waits for its prefix's KV (one host link: loads queue)
            fetch = sum(req.fetch_s for req in due)
            t_all = pipeline_time_s(fetch, t, sim.layers) if sim.overlap else fetch + t
            for req in due:
                sim.book_fetch(req, exposed_s=t_all - t)
                req.fetch_due = False
            t = t_all
        if self._swap_bytes:  # the GPU waits for its swap moves
            t += sim.network.host_link.time_s(self._swap_bytes)
            self._swap_bytes = 0.0
        t = float(self._jitter(np.array([t]))[0])
        self.plan = Plan(np.array([now + t]), None, now, b > 0, it)
        self.version += 1
        return [(now + t, self._on_plan_end, (self.version,))]

    def _commit(self, now: float):
        """Book the planned steps as done; return the requests that finished decoding."""
        plan = self.plan
        self.plan = None
        if self.remote:
            b = len(self.running)
            _, tier = self.sim.cost.remote_decode_times_s(b, plan.sums / b)
            self.sim.book_remote_decode(float(plan.sums.sum()), float(tier.sum()))
        self.busy_s += float(plan.ends[-1]) - plan.start
        if plan.steps:
            self.log.extend(plan.ends)
            self.n += plan.ends.size
        done = []
        while self._finish and self._finish[0][0] <= self.n:
            _, rid = heapq.heappop(self._finish)
            req = self.running[rid]
            self._leave(now, req, req.finish_step)
            done.append(req)
        if done:
            self.running_blocks = self._blocks_at(self.n)  # freed before anyone asks for room
        return done

    def _on_plan_end(self, now: float, version: int):
        if version != self.version:
            return None  # a plan that was cut short
        it = self.plan.iteration
        done = self._commit(now)
        events = []
        for req, _, end in it.chunks if it is not None else ():
            req.done_tokens = end
            if end >= req.target_tokens:
                events += self._prompt_done(now, req) or []
        if done:
            events += self.sim.decode_finished(now, self, done)
        if (
            self.plan is None
        ):  # finishing may have let a waiting request arrive here and start a plan
            events += self._boundary(now) or []
        return events

    def _prompt_done(self, now: float, req):
        """A prompt (or a recomputed one) is in KV: it yields a token, then decodes here."""
        self.prefilling.remove(req)
        events = []
        if math.isnan(req.first_token_s):
            self.queued_est_s -= req.est_s
            events += self.sim.end_prefill(now, self, req) or []
            self.sim.first_token_made(now, req)
        req.token_times.append(now)
        req.produced += 1
        if req.produced >= req.output_tokens:
            return events + self.sim.finish(now, req, self)
        self.incoming.append(req)  # the worker is at a step boundary and plans next
        return events

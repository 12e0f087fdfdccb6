"""Who is turned away at arrival, and why: requests the model or the GPUs can never serve,
and (with `early_reject`) requests predicted to miss their SLOs given the current queues.

Mooncake rejects a request at arrival when the cluster, as loaded now, would serve it too
late, instead of spending prefill compute on it and then missing its SLO anyway ("early
rejection", the arXiv report arXiv:2407.00079 v3, section 7.2), and predicts the decode
side's load for when the request would reach it rather than reading today's ("early
rejection based on prediction", section 7.4), which keeps the load from oscillating. Its
scheduler (FAST'25 Algorithm 1; the report's Algorithm 1) picks the prefill instance with
the shortest predicted TTFT = T_transfer + T_queue + T_prefill, then a decoding instance
and its TBT, and rejects when either passes its SLO. The prediction here (`predict`):

    TTFT  queue_s        the chosen prefill GPU's queue (the router's estimate)
        + prefill_s      the request's own prefill and prefix load, a remote load waiting
                         for both NICs (the router's estimate)
        + decode_wait_s  the wait for decode memory: a batch slot and the KV blocks of every
                         request ahead of this one (prefilled and waiting, or due to finish
                         its prefill first) plus its own, freed as running sequences finish
                         (their remaining steps at the current step time; the simulator
                         knows each output length, as the report's request-level prediction
                         assumes); on a colocated GPU the prompt waits for them before its
                         prefill, elsewhere the first token waits after it
        + transfer_s     the KV move to the decode GPU when it is not overlapped
    TBT   one decode step of the least-loaded decode GPU's batch once every request already
          queued for prefill (and not yet given a decode GPU) has joined the decode GPUs
          (spread evenly), plus this one, at the mean history they will hold.

On a colocated GPU the batch is its own plus its waiting prompts, and while it has a
backlog of prompt tokens each iteration is predicted to carry as many of them as the token
budget leaves (all of them without a budget): the interference the decodes will see.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..fmt import seconds, si


def too_long_reason(sim, req) -> str:
    """Why `req` asks for more context than the model was trained for ('' if it does not).

    An engine serves a model up to its trained context (vLLM's max_model_len defaults to
    config.json's max_position_embeddings) and refuses a request whose prompt plus
    requested output exceeds it, as vLLM does, rather than serving it past the positions
    the model knows (with a trace's output length as the request's max_tokens)."""
    limit = sim.max_context_tokens
    total = req.input_tokens + req.output_tokens
    if not limit or total <= limit:
        return ""
    return (
        f"prompt + output ({req.input_tokens:,} + {req.output_tokens:,} tokens) exceeds "
        f"{sim.model.name}'s trained context of {limit:,} tokens (max_position_embeddings)"
    )


def too_large_reason(sim, req) -> str:
    """Why `req` can never run on this cluster ('' if it can)."""
    room = sim.kv_room_bytes
    if req.transfer_bytes > room:
        return (
            f"the prompt's KV ({req.input_tokens:,} tokens, {si(req.transfer_bytes, 'B')}) "
            "exceeds any GPU's "
            f"room for KV ({si(room, 'B')})"
        )
    engine = sim.decoders[0]
    need = engine.blocks_for(req.input_tokens + req.output_tokens)
    if need + engine.watermark_blocks > engine.capacity_blocks:
        held = need * engine.block_bytes
        return (
            f"the KV of prompt + output ({req.input_tokens + req.output_tokens:,} tokens, "
            f"{si(held, 'B')} in "
            f"{need:,} blocks) exceeds any GPU's room for KV ({si(room, 'B')}, "
            f"{engine.capacity_blocks - engine.watermark_blocks:,} blocks usable)"
        )
    return ""


@dataclass(frozen=True)
class Prediction:
    """What admitting a request now is predicted to cost it (seconds; see the module doc)."""

    queue_s: float
    prefill_s: float
    decode_wait_s: float
    transfer_s: float
    tbt_s: float

    @property
    def ttft_s(self) -> float:
        return self.queue_s + self.prefill_s + self.decode_wait_s + self.transfer_s


def predict(sim, now: float, req, worker, wait_s: float, job_s: float) -> Prediction:
    """The predicted TTFT terms and TBT of `req` if admitted now on prefill GPU `worker`
    (`wait_s`, `job_s`: the router's queue and own-prefill estimates there)."""
    c = sim.config
    colocated = c.arch == "colocated"
    if colocated:
        start_s = now + wait_s  # the prompt needs its KV blocks before its prefill
        free_s = memory_free_at_s(sim, now, [worker], _waiting_demand(worker, req))
        decode_wait = max(0.0, free_s - start_s)
    else:
        ready_s = now + wait_s + job_s  # the prefill's end: the KV then needs a decode GPU
        demand = _decode_demand(sim, now, req, ready_s)
        decode_wait = max(0.0, memory_free_at_s(sim, now, sim.decoders, demand) - ready_s)
    transfer = 0.0
    if not colocated and not c.overlap and not c.remote_kv:
        transfer = sim.network.link.time_s(req.transfer_bytes)
    return Prediction(wait_s, job_s, decode_wait, transfer, predicted_tbt_s(sim, req))


def _waiting_demand(worker, req) -> tuple[int, int]:
    """(KV blocks, batch slots) a colocated GPU must find before `req`'s prefill can start:
    its waiting prompts' and this one's."""
    blocks = sum(worker.blocks_for(q.target_tokens) for q in worker.waiting)
    return blocks + worker.blocks_for(req.input_tokens), len(worker.waiting) + 1


def _decode_demand(sim, now: float, req, ready_s: float) -> tuple[int, int]:
    """(KV blocks, batch slots) the decode GPUs must find for `req` and every request that
    reaches them first: prefilled ones waiting for memory, prefills under way without a
    decode GPU, and queued prompts whose prefill is predicted to end by `ready_s`."""
    blocks_for = sim.decoders[0].blocks_for
    ahead = list(sim.pending)
    for w in sim.front:
        current = getattr(w, "current", None)
        if current is not None and current.decode_worker < 0:
            ahead.append(current)
        end_s = max(now, getattr(w, "free_at_s", now))
        for q in w.waiting:
            end_s += q.est_s
            if end_s > ready_s:
                break
            ahead.append(q)
    blocks = sum(blocks_for(q.input_tokens) for q in ahead) + blocks_for(req.input_tokens)
    return blocks, len(ahead) + 1


def memory_free_at_s(sim, now: float, engines, demand: tuple[int, int]) -> float:
    """When `engines` together have `demand` = (KV blocks, batch slots) free: now if they
    have, else the predicted end of the running sequence whose finish frees the last of it
    (sequences finish in their remaining steps at each GPU's current step time). Pooled over
    the engines (a request needs its blocks on one GPU: an optimistic bound), growth of the
    survivors left out; if even every running sequence's end is not enough, the last end."""
    need_blocks, need_slots = demand
    free_blocks = free_slots = 0
    for e in engines:
        free_blocks += max(0, e.capacity_blocks - e.other_blocks - e.running_blocks)
        free_blocks -= e.watermark_blocks
        free_slots += max(0, e.max_batch - e.slots)
    if free_blocks >= need_blocks and free_slots >= need_slots:
        return now
    ends = []
    for e in engines:
        if not e.running:
            continue
        step = e.step_now(now)
        step_s = _step_time_s(sim, e)
        window, bt = sim.window, e.block_tokens
        for finish_step, rid in e._finish:
            held = e.running[rid].offset + finish_step
            if window:
                held = min(held, window)
            blocks = -(-held // bt) if e.paged else 0
            ends.append((now + max(0, finish_step - step) * step_s, blocks))
    ends.sort()
    t = now
    for t, blocks in ends:
        free_blocks += blocks
        free_slots += 1
        if free_blocks >= need_blocks and free_slots >= need_slots:
            return t
    return t


def _step_time_s(sim, engine) -> float:
    """One decode step of `engine` now: its current plan's mean step, else the ledger's."""
    plan = engine.plan
    if plan is not None and plan.steps and plan.ends.size:
        return float(plan.ends[-1] - plan.start) / plan.ends.size
    b = len(engine.running)
    mean = float(engine._history_sums(np.array([engine.n]))[0]) / b
    if engine.remote:
        return float(sim.cost.remote_decode_times_s(b, mean)[0])
    return float(sim.cost.decode_times_s(b, mean))


def predicted_tbt_s(sim, req) -> float:
    """One decode step of the batch `req` is predicted to join (see the module docstring).
    A prefill under way that already holds a decode GPU's slot (KV-centric streaming) is
    counted there, in the GPU's slots, and not again as queued."""
    c = sim.config
    decoders = sim.decoders
    queued = 0
    for w in sim.front:
        current = getattr(w, "current", None)
        queued += len(w.waiting) + (current is not None and current.decode_worker < 0)
    if c.arch != "colocated":
        queued += len(sim.pending)
    target = min(decoders, key=lambda w: (w.slots, w.index))
    batch = min(c.max_batch, target.slots + 1 + math.ceil(queued / len(decoders)))
    held = float(target._history_sums(np.array([target.n]))[0]) if target.running else 0.0
    mean = (
        held + (batch - len(target.running)) * req.input_tokens
    ) / batch  # newcomers: this one's prompt
    if target.remote:
        return float(sim.cost.remote_decode_times_s(batch, mean)[0])
    if c.arch != "colocated":
        return float(sim.cost.decode_times_s(batch, mean))
    # a colocated GPU with a prompt backlog keeps putting prompt tokens into its iterations
    backlog = sum(q.target_tokens - q.done_tokens for q in target.prefilling)
    backlog += sum(q.target_tokens for q in target.waiting)
    budget = target.chunk_tokens - batch if target.chunk_tokens else backlog
    chunk = int(min(backlog, max(budget, 0)))
    return sim.cost.iteration_time_s(batch, mean, [(chunk, 0)] if chunk else [])


def early_reject_reason(sim, req, p: Prediction) -> str:
    """Why `req` is predicted to miss an SLO if admitted now ('' if it is not)."""
    c = sim.config
    if p.ttft_s > c.ttft_slo_s:
        waited = (
            f", {seconds(p.decode_wait_s)} of it waiting for decode memory"
            if p.decode_wait_s > 0
            else ""
        )
        return (
            f"predicted TTFT {seconds(p.ttft_s)} exceeds the {seconds(c.ttft_slo_s)} SLO"
            f"{waited} (early rejection)"
        )
    if p.tbt_s > c.tbt_slo_s:
        return (
            f"predicted time between tokens {seconds(p.tbt_s)} exceeds the "
            f"{seconds(c.tbt_slo_s)} SLO (early rejection)"
        )
    return ""

"""Who is turned away at arrival, and why: requests that can never fit, and (with
`early_reject`) requests predicted to miss their SLOs given the current queues.

Mooncake (FAST'25, section 7) rejects a request at arrival when the cluster, as loaded now,
would serve it too late, instead of spending prefill compute on it and then missing its
SLO anyway ("early rejection"), and predicts the decode side's load for when the request
would reach it rather than reading today's ("prediction-based"), which keeps the load from
oscillating. The prediction here:

    TTFT  the chosen prefill GPU's queue + the request's own prefill and prefix load (the
          router's estimates) + the KV move to a decode GPU when it is not overlapped;
    TBT   one decode step of the least-loaded decode GPU's batch once every request already
          queued for prefill has joined the decode GPUs (spread evenly), plus this one,
          at the mean history they will hold.

On a colocated GPU the batch is its own plus its waiting prompts, and while it has a
backlog of prompt tokens each iteration is predicted to carry as many of them as the token
budget leaves (all of them without a budget): the interference the decodes will see.
"""

from __future__ import annotations

import math

import numpy as np

from ..fmt import seconds, si


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


def predicted_tbt_s(sim, req) -> float:
    """One decode step of the batch `req` is predicted to join (see the module docstring)."""
    c = sim.config
    decoders = sim.decoders
    queued = sum(len(w.waiting) + (getattr(w, "current", None) is not None) for w in sim.front)
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


def early_reject_reason(sim, req, wait_s: float, job_s: float) -> str:
    """Why `req` is predicted to miss an SLO if admitted now ('' if it is not)."""
    c = sim.config
    ttft = wait_s + job_s
    if c.arch != "colocated" and not c.overlap and not c.remote_kv:
        ttft += sim.network.link.time_s(req.transfer_bytes)
    if ttft > c.ttft_slo_s:
        return (
            f"predicted TTFT {seconds(ttft)} exceeds the {seconds(c.ttft_slo_s)} SLO "
            "(early rejection)"
        )
    tbt = predicted_tbt_s(sim, req)
    if tbt > c.tbt_slo_s:
        return (
            f"predicted time between tokens {seconds(tbt)} exceeds the {seconds(c.tbt_slo_s)} SLO "
            "(early rejection)"
        )
    return ""

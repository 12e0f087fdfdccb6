"""What one GPU runs in its next iteration: a registry of engine schedulers.

At every step boundary a GPU (kvlab.sim.workers.Engine) has already admitted the
sequences whose KV landed, swapped back the preempted ones it has room for and preempted
the newest sequences if the next decode step would find no free KV block. The scheduler
then picks the iteration: prompt chunks to prefill (admitting waiting prompts when their
KV blocks and a batch slot are free) and whether the running sequences decode in it.

    prefill-first  vLLM v0's default: a waiting prompt runs as its own iteration, as
                   many whole prompts as the token budget holds (at least one); the
                   running sequences wait, so every new prompt stalls every stream.
    chunked        vLLM v1 / Sarathi-Serve: every iteration decodes the running
                   sequences and fills the rest of the token budget (`chunk_tokens`,
                   decode tokens count against it) with chunks of waiting prompts.
    decode-first   TGI-style: the running sequences keep decoding; a waiting prompt runs
                   (as in prefill-first) once `max_waiting_steps` decode steps have
                   passed since it arrived, or when nothing is decoding.

A scheduler is a function pick(engine) -> Iteration | None, plus the number of decode
steps a newly queued prompt lets pass before it interrupts a decode plan (`patience`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

PREEMPTION_MODES = ("recompute", "swap")


@dataclass
class Iteration:
    """One engine iteration: prompt chunks (request, first token, end token) and a decode
    step of the running sequences (`decode`); decode-only iterations may repeat up to
    `max_steps` steps."""

    chunks: list = field(default_factory=list)
    decode: bool = False
    max_steps: int | None = None


def _budget(engine) -> float:
    return engine.chunk_tokens if engine.chunk_tokens > 0 else float("inf")


def _whole_prompts(engine) -> Iteration | None:
    """A prefill-only iteration of whole waiting prompts, as many as the budget holds."""
    budget, chunks, used = _budget(engine), [], 0
    while engine.waiting:
        req = engine.waiting[0]
        size = req.target_tokens  # before the prefix lookup: the whole prompt counts
        if chunks and used + size > budget:
            break
        if not engine.admit_prompt(req):
            break
        chunks.append((req, req.done_tokens, req.target_tokens))
        used += size
    return Iteration(chunks=chunks) if chunks else None


def prefill_first(engine) -> Iteration | None:
    if not engine.swapped:  # vLLM v0: no new prompt while a swapped sequence waits to come back
        it = _whole_prompts(engine)
        if it is not None:
            return it
    return Iteration(decode=True) if engine.running else None


def chunked(engine) -> Iteration | None:
    budget = _budget(engine) - len(engine.running)
    chunks = []
    for req in engine.prefilling:  # prompts already under way go first
        if budget <= 0:
            break
        take = min(req.target_tokens - req.done_tokens, budget)
        chunks.append((req, req.done_tokens, req.done_tokens + take))
        budget -= take
    while (
        budget > 0
        and engine.waiting
        and not engine.swapped
        and engine.admit_prompt(engine.waiting[0])
    ):
        req = engine.prefilling[-1]
        take = min(req.target_tokens - req.done_tokens, budget)
        chunks.append((req, req.done_tokens, req.done_tokens + take))
        budget -= take
    if not chunks and not engine.running:
        return None
    return Iteration(chunks=chunks, decode=bool(engine.running))


def decode_first(engine) -> Iteration | None:
    if engine.running and engine.waiting:
        wait_left = engine.waiting[0].deadline_step - engine.n
        if wait_left > 0:
            return Iteration(decode=True, max_steps=wait_left)
    return prefill_first(engine)


@dataclass(frozen=True)
class Scheduler:
    pick: Callable  # engine -> Iteration | None
    patience: Callable  # SimConfig -> decode steps a newly queued prompt lets pass


SCHEDULERS = {
    "prefill-first": Scheduler(prefill_first, lambda config: 0),
    "chunked": Scheduler(chunked, lambda config: 0),
    "decode-first": Scheduler(decode_first, lambda config: config.max_waiting_steps),
}

"""The searches behind the capstone chapter, "Plan a deployment": `kvlab plan` over two
models, three kinds of traffic and three TBT targets, run once when the book is built and
kept on disk for the other edition's build (and the tests).

    searches() -> {Search: plan dict}   every search of the chapter (cached)
    SEARCHES                            what they are

A search is `kvlab.plan.plan` on one model, GPUs and tensor-parallel degrees, one workload
and one pair of SLOs, over the planner's default space otherwise (the three
architectures, prefill:decode splits at 1/4, 1/2 and 3/4, chunked and prefill-first
scheduling, the architecture's prefix cache). The searches run side by side on every core
(each search in one process), and their results are kept by `kvlab.book.run_cache` (as
chapter 4's simulations are), keyed by what a result depends on: each search's job,
workload and requests (the planner's own fingerprint of them:
`kvlab.plan.search.job_fingerprint`), its GPUs and space, and kvlab's code and data. The
second edition's build finds them and runs nothing; a change to the simulator runs them
again.
"""

from __future__ import annotations

import functools
import hashlib
import json
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from ..plan import Job, Slo, Space, Workload, plan
from ..plan.runners import cores, start_method
from ..plan.search import job_fingerprint
from ..traces import find_trace
from . import run_cache

#: GPUs on offer and the tensor-parallel degrees tried, per model: the 8B fits one H100
#: with room for KV; the 70B's 141 GB of fp16 weights need an instance of 2 GPUs at least.
OFFERS = {
    "llama-3.1-8b": ({"h100-sxm": 8}, (1,)),
    "llama-3.1-70b": ({"h100-sxm": 16}, (2, 4, 8)),
}
MODELS = tuple(OFFERS)
#: Where the slices start in the conversation trace (seconds), and how many requests each
#: search measures: the same 600 requests for the cold and the warm searches.
START_S = 900.0
REQUESTS = 600
#: The warm searches lead the slice in with the requests of this many seconds before it
#: (replayed, not measured): the prefix caches hold what those conversations said.
WARMUP_S = 150.0
#: Long prompts: Poisson arrivals, prompts of 32,768 tokens on average (lognormal), outputs
#: as the conversation trace's (mean 343 tokens), nothing shared between prompts.
LONG_PROMPTS = (
    "poisson:rate=1,prompt=lognormal(32768,0.5),output=lognormal(350,0.9),requests=1000,seed=0"
)
TRAFFIC = ("cold", "warm", "long")
#: The SLOs: TTFT at most 10 s and each request's p90 token gap at most the TBT target, for
#: 90% of requests (DistServe's attainment). The chapter's headline TBT target is the
#: loosest, 30 ms: past it no design's TBT binds on this traffic (decode steps of a full
#: batch take about 21 ms), so looser targets change nothing and are not searched.
TTFT_SLO_S = 10.0
TBT_TARGETS_S = (0.015, 0.02, 0.03)
TBT_SLO_S = 0.03
TBT_STAT = "p90"
ATTAINMENT = 0.9
#: A tighter TTFT target the chapter tries once, on the 70B: the trace's bursts.
TIGHT_TTFT_SLO_S = 5.0


@dataclass(frozen=True, order=True)
class Search:
    """One search of the chapter: a model, a kind of traffic, a TTFT and a TBT target."""

    model: str
    traffic: str
    ttft_s: float = TTFT_SLO_S
    tbt_s: float = TBT_SLO_S

    @property
    def name(self) -> str:
        return f"{self.model} {self.traffic} ttft={self.ttft_s:g} tbt={self.tbt_s:g}"


SEARCHES = tuple(
    Search(m, t, TTFT_SLO_S, b) for m in MODELS for t in TRAFFIC for b in TBT_TARGETS_S
)
EXTRA = (Search("llama-3.1-70b", "cold", TIGHT_TTFT_SLO_S, TBT_SLO_S),)


def conversation() -> str:
    """The conversation trace when this machine has it, else its generated stand-in."""
    return "conversation" if find_trace("conversation") is not None else "generated:conversation"


def workload(traffic: str) -> Workload:
    if traffic == "long":
        return Workload(LONG_PROMPTS, requests=REQUESTS)
    warmup = WARMUP_S if traffic == "warm" else 0.0
    return Workload(conversation(), start_s=START_S, requests=REQUESTS, warmup_s=warmup)


def job(search: Search) -> Job:
    return Job(search.model, Slo(search.ttft_s, search.tbt_s, TBT_STAT, ATTAINMENT))


def space(model: str) -> Space:
    return Space(tensor_parallel=OFFERS[model][1])


def offers(model: str) -> dict:
    return dict(OFFERS[model][0])


def run(search: Search) -> dict:
    """One search, in this process (the unit the pool runs)."""
    return plan(
        job(search),
        workload(search.traffic),
        offers(search.model),
        space(search.model),
        runner="serial",
    )


def cache_key(searches) -> str:
    """What the results depend on besides kvlab's code, hashed (the module docstring)."""
    h = hashlib.sha256()
    for s in searches:
        w = workload(s.traffic)
        what = {
            "search": s.name,
            "fingerprint": job_fingerprint(job(s), w, w.traces()),
            "offers": offers(s.model),
            "space": space(s.model).to_dict(),
        }
        h.update(json.dumps(what, sort_keys=True).encode())
    return h.hexdigest()[:20]


def run_all(searches, workers: int | None = None) -> list[dict]:
    """Every search, side by side on `workers` processes (default: every core), in order."""

    searches = list(searches)
    workers = min(workers or cores(), len(searches))
    if workers <= 1:
        return [run(s) for s in searches]
    with ProcessPoolExecutor(max_workers=workers, mp_context=start_method()) as pool:
        return list(pool.map(run, searches))


@functools.cache
def searches() -> dict:
    """{Search: the plan `kvlab plan --json` would print} for SEARCHES and EXTRA, from the
    run cache when it holds them, else run (and stored)."""
    wanted = SEARCHES + EXTRA

    def run_named() -> dict:
        return {s.name: r for s, r in zip(wanted, run_all(wanted), strict=True)}

    stored = run_cache.cached("ch6-plan", cache_key(wanted), run_named)
    return {s: stored[s.name] for s in wanted}

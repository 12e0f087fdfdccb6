"""Where a request goes: the prefill (or colocated) worker, then the decode worker (registries).

Prefill routers see, for every candidate, the queue ahead of the request (estimated
seconds) and what the request itself would cost there: its prefix hit on that node's view
of the cache, the time to load the hit KV (local DRAM over PCIe, another node's over the
network) and the prefill of the rest.

    least-loaded   the shortest queue; cache hits are taken where they fall.
    cache-aware    the smallest estimated time to first token: queue + load + prefill,
                   Mooncake's Conductor rule (it trades a longer queue for a longer hit).

Decode routers pick among decode workers with room (free HBM for the request's KV and a
batch slot):

    least-loaded   the fewest sequences;
    free-hbm       the most free HBM (the KV-centric scheduler's input).

Equal prefill scores go to the GPU holding the fewest sequences (colocated GPUs also
decode), then to the lowest index, so routing is deterministic.
"""

from __future__ import annotations

from ..prompt import served_from_blocks
from .costs import pipeline_time_s


def prefill_estimates(sim, now: float, req, workers) -> tuple[list, list]:
    """(seconds queued ahead, seconds of this request's own prefill incl. KV loads) per worker."""
    k, local = sim.caches.match_all(req.hash_ids)
    bt, kv, prompt = sim.block_tokens, sim.kv_bytes_per_token, req.input_tokens
    host, link, nic_free = sim.network.host_link, sim.network.link, sim.network.nic_free_s
    prefill, overlap, layers = sim.cost.prefill_times_s, sim.overlap, sim.layers
    waits, jobs = [], []
    homes = local.tolist()
    # a remote load waits for the fetching node's NIC and for those of the blocks' homes
    # (kvlab.sim.caches: with a global pool, `local` counts each node's blocks of the prefix)
    sources = [j for j, n in enumerate(homes) if n] if sim.caches.kind == "global" else []
    for w, kw, lw in zip(workers, k.tolist(), homes, strict=True):
        cached = served_from_blocks(kw, bt, prompt)
        local_tok = min(lw * bt, cached)
        remote_tok = cached - local_tok
        fetch = host.time_s(local_tok * kv)
        if remote_tok:
            busy = max([nic_free[w.node]] + [nic_free[workers[j].node] for j in sources])
            fetch = max(fetch, link.time_s(remote_tok * kv) + max(0.0, busy - now))
        compute = float(prefill(req.input_tokens, cached)[0])
        jobs.append(pipeline_time_s(fetch, compute, layers) if overlap else fetch + compute)
        waits.append(w.wait_estimate_s(now))
    return waits, jobs


def least_loaded_score(wait_s: float, job_s: float) -> float:
    """The shortest queue; cache hits are taken where they fall."""
    return wait_s


def cache_aware_score(wait_s: float, job_s: float) -> float:
    """The smallest estimated time to first token (Mooncake's Conductor)."""
    return wait_s + job_s


def fewest_sequences_key(worker) -> tuple:
    return (worker.slots, -worker.free_bytes)


def most_free_hbm_key(worker) -> tuple:
    return (-worker.free_bytes, worker.slots)


#: name -> score(seconds queued ahead, seconds of the request's own prefill); lowest wins.
PREFILL_ROUTERS = {"least-loaded": least_loaded_score, "cache-aware": cache_aware_score}
#: name -> sort key of a decode worker with room; lowest wins.
DECODE_ROUTERS = {"least-loaded": fewest_sequences_key, "free-hbm": most_free_hbm_key}


def route_prefill(sim, now: float, req, workers):
    """(worker, its estimated job seconds, its estimated wait seconds) for a new request."""
    wait, job = prefill_estimates(sim, now, req, workers)
    score = PREFILL_ROUTERS[sim.config.prefill_router]
    scores = [score(w, j) for w, j in zip(wait, job, strict=True)]
    # equal scores (idle queues) go to the GPU holding the fewest sequences, then the lowest index
    i = min(range(len(scores)), key=lambda i: (scores[i], getattr(workers[i], "slots", 0), i))
    return workers[i], job[i], wait[i]


def route_decode(sim, req, workers):
    """The decode worker with room for `req` under the configured router, or None."""
    key = DECODE_ROUTERS[sim.config.decode_router]
    fitting = [w for w in workers if w.fits(req)]
    return min(fitting, key=key) if fitting else None

"""How fast a trace replays: kvlab's LRU replay against a plain-Python OrderedDict replay.

The reference is the shortest correct LRU prefix replay one would write by hand; kvlab's
replay must be no slower (it also pins a request's own blocks and keeps counters). Run:

    flock /tmp/kvlab-cpu.lock kvlab bench prefix-replay [TRACE] [--repeats N] [--json]

It prints: per capacity, the median and spread of both replays' seconds, and the hits
(which must agree: pinning changes which blocks are evicted mid-request, not LRU's hits).
"""

from __future__ import annotations

import statistics
import time
from collections import OrderedDict

from ..prefix.blocks import replay
from ..traces import load_trace


def ordered_dict_replay(trace, capacity_blocks: int) -> list[int]:
    """Hit blocks per request under LRU, the plain way: look up, then touch the chain tail first."""
    od: OrderedDict = OrderedDict()
    hits = []
    for r in trace.requests:
        ids = r.hash_ids
        k = 0
        for h in ids:
            if h in od:
                k += 1
            else:
                break
        hits.append(k)
        for h in reversed(ids):
            if h in od:
                od.move_to_end(h)
            else:
                od[h] = None
                if len(od) > capacity_blocks:
                    od.popitem(last=False)
    return hits


def replay_speed(trace="conversation", capacities=(1000, 10000, 100000), repeats: int = 5) -> dict:
    """Median seconds of kvlab's replay and of the OrderedDict reference, interleaved."""
    trace = load_trace(trace)
    out = {"trace": trace.label, "requests": len(trace), "repeats": repeats, "capacities": {}}
    for cap in capacities:
        ours, ref = [], []
        for _ in range(repeats):
            t = time.perf_counter()
            result = replay(trace, cap, "lru")
            ours.append(time.perf_counter() - t)
            t = time.perf_counter()
            hits = ordered_dict_replay(trace, cap)
            ref.append(time.perf_counter() - t)
        out["capacities"][str(cap)] = {
            "kvlab_s": statistics.median(ours),
            "kvlab_spread_s": max(ours) - min(ours),
            "ordered_dict_s": statistics.median(ref),
            "ordered_dict_spread_s": max(ref) - min(ref),
            "hits_agree": result.hit_blocks_per_request.tolist() == hits,
            "block_hit_ratio": result.block_hit_ratio,
        }
    return out

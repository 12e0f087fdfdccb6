"""How fast a trace replays: kvlab's LRU replay against a plain-Python OrderedDict replay.

The reference is the shortest correct LRU prefix replay one would write by hand; kvlab's
replay must be no slower (it also pins a request's own blocks and keeps counters). Run:

    flock /tmp/kvlab-cpu.lock .venv/bin/python -m kvlab.prefix.bench [TRACE] [--repeats N]

It prints JSON: per capacity, the median and spread of both replays' seconds, and the hits
(which must agree: pinning changes which blocks are evicted mid-request, not LRU's hits).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import OrderedDict

from ..traces import load_trace
from .blocks import replay


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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvlab.prefix.bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("trace", nargs="?", default="conversation")
    parser.add_argument("--capacities", default="1000,10000,100000")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    caps = [int(c) for c in args.capacities.split(",")]
    json.dump(replay_speed(args.trace, caps, args.repeats), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

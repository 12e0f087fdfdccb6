"""One global prefix pool against separate per-node caches of the same total size.

A pure cache replay, no timing: request i looks its block chain up and caches it, in the
pool or on node i % nodes (a load balancer that ignores caches). Each node of the
separate design sees only its share of the traffic and keeps its own copies of shared
prefixes, so at the same total capacity it serves fewer prompt tokens from cache.
"""

from __future__ import annotations

import math

import numpy as np

from ..prompt import served_from_blocks
from .blocks import BlockPrefixCache


def global_vs_local(trace, nodes: int, capacity_blocks_per_node, policy: str = "lru") -> dict:
    """Token hit ratios per capacity: {"global_token_hit_ratio", "local_token_hit_ratio"}
    (arrays over `capacity_blocks_per_node`) and "infinite_token_hit_ratio" (no eviction)."""
    bt, inputs = trace.block_tokens, trace.input_tokens
    total = int(inputs.sum())

    def served(hits) -> float:
        return int(served_from_blocks(np.asarray(hits), bt, inputs).sum()) / total

    glob, local = [], []
    for cap in np.asarray(capacity_blocks_per_node, dtype=float):
        pool = BlockPrefixCache(cap * nodes, policy)
        glob.append(served([pool.access(r.hash_ids) for r in trace.requests]))
        caches = [BlockPrefixCache(cap, policy) for _ in range(nodes)]
        local.append(
            served([caches[i % nodes].access(r.hash_ids) for i, r in enumerate(trace.requests)])
        )
    infinite = BlockPrefixCache(math.inf)
    return {
        "global_token_hit_ratio": np.array(glob),
        "local_token_hit_ratio": np.array(local),
        "infinite_token_hit_ratio": served([infinite.access(r.hash_ids) for r in trace.requests]),
    }

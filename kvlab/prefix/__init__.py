"""Prefix-cache simulation: block chains over trace hash_ids, token-granular radix trees,
whole-request caching, eviction policies, and the TTFT/TPOT each hit rate buys.

Two hit-rate definitions run through everything here, always side by side:
  request-level hit rate   share of requests for which the cache found an entry;
  token hit ratio          share of prompt tokens whose prefill was actually skipped.
Only the second moves TTFT; neither moves TPOT (decode reads all weights and all KV anyway).
"""

from .blocks import (
    POLICIES,
    BlockPrefixCache,
    ReplayResult,
    capacity_in_blocks,
    default_capacities,
    hit_ratio_curve,
    replay,
)
from .compare import CACHES, GranularityResult, compare_granularity, granularity_sweep
from .latency import KV_TIERS, latency_vs_hit_ratio, tpot_s, ttft_s
from .pools import global_vs_local
from .radix import RadixCache, WholeRequestCache

__all__ = [
    "POLICIES",
    "global_vs_local",
    "BlockPrefixCache",
    "ReplayResult",
    "capacity_in_blocks",
    "default_capacities",
    "hit_ratio_curve",
    "replay",
    "CACHES",
    "GranularityResult",
    "compare_granularity",
    "granularity_sweep",
    "KV_TIERS",
    "latency_vs_hit_ratio",
    "tpot_s",
    "ttft_s",
    "RadixCache",
    "WholeRequestCache",
]

"""Prefix caches of the simulated cluster, in host DRAM: none, one per node, or one global pool.

All are `kvlab.prefix.BlockPrefixCache` chains over the trace's hash_ids. A view answers,
for a request about to be prefilled on node p: how many leading blocks are cached, and how
many of those sit in p's own DRAM (loaded over PCIe) rather than another node's (loaded
over the network). `match_all` asks that for every node at once, for a cache-aware router.
"""

from __future__ import annotations

import math

import numpy as np

from ..prefix.blocks import BlockPrefixCache


class NoCache:
    kind = "none"

    def __init__(self, nodes: int):
        self.nodes = nodes
        self.lookups = self.lookup_blocks = self.hit_blocks = 0
        self.inserted_blocks = self.evicted_blocks = 0

    def match_all(self, hash_ids):
        z = np.zeros(self.nodes, dtype=np.int64)
        return z, z

    def lookup(self, node: int, hash_ids):
        self.lookups += 1
        self.lookup_blocks += len(hash_ids)
        return 0, 0

    def insert(self, node: int, hash_ids) -> int:
        return 0

    def remote_sources(self, node: int, hash_ids, k: int) -> dict:
        """{home node: blocks} of the first k blocks that live on other nodes than `node`."""
        return {}

    def stats(self) -> dict:
        return {
            "kind": self.kind,
            "capacity_blocks": 0,
            "lookups": self.lookups,
            "lookup_blocks": self.lookup_blocks,
            "hit_blocks": self.hit_blocks,
            "block_hit_ratio": 0.0,
            "inserted_blocks": 0,
            "evicted_blocks": 0,
            "resident_blocks": 0,
        }


class LocalCaches(NoCache):
    """One cache per node; a node sees only its own blocks (all local)."""

    kind = "local"

    def __init__(self, nodes: int, capacity_blocks_per_node: float, policy: str = "lru"):
        super().__init__(nodes)
        self.capacity_blocks = capacity_blocks_per_node * nodes
        self.caches = [BlockPrefixCache(capacity_blocks_per_node, policy) for _ in range(nodes)]

    def match_all(self, hash_ids):
        k = np.fromiter((c.match(hash_ids) for c in self.caches), np.int64, self.nodes)
        return k, k

    def lookup(self, node: int, hash_ids):
        k = self.caches[node].lookup(hash_ids)
        self.lookups += 1
        self.lookup_blocks += len(hash_ids)
        self.hit_blocks += k
        return k, k

    def insert(self, node: int, hash_ids) -> int:
        c = self.caches[node]
        before = c.inserted_blocks
        c.insert(hash_ids)
        return c.inserted_blocks - before

    def _resident(self):
        return sum(len(c) for c in self.caches)

    def stats(self) -> dict:
        return {
            "kind": self.kind,
            "capacity_blocks": _finite(self.capacity_blocks),
            "lookups": self.lookups,
            "lookup_blocks": self.lookup_blocks,
            "hit_blocks": self.hit_blocks,
            "block_hit_ratio": self.hit_blocks / self.lookup_blocks if self.lookup_blocks else 0.0,
            "inserted_blocks": sum(c.inserted_blocks for c in self.caches),
            "evicted_blocks": sum(c.evicted_blocks for c in self.caches),
            "resident_blocks": self._resident(),
        }


class GlobalPool(LocalCaches):
    """One cache over all nodes' DRAM; each block lives where it was prefilled (its home)."""

    kind = "global"

    def __init__(self, nodes: int, capacity_blocks_per_node: float, policy: str = "lru"):
        NoCache.__init__(self, nodes)
        self.capacity_blocks = capacity_blocks_per_node * nodes
        self.home: dict[int, int] = {}
        self.cache = BlockPrefixCache(self.capacity_blocks, policy, on_evict=self._evicted)
        self.caches = [self.cache]

    def _evicted(self, block_id) -> None:
        self.home.pop(block_id, None)

    def _homes(self, hash_ids, k: int) -> np.ndarray:
        home = self.home
        return np.bincount(
            np.fromiter((home[h] for h in hash_ids[:k]), np.int64, k), minlength=self.nodes
        )

    def match_all(self, hash_ids):
        k = self.cache.match(hash_ids)
        local = self._homes(hash_ids, k) if k else np.zeros(self.nodes, dtype=np.int64)
        return np.full(self.nodes, k, dtype=np.int64), local

    def lookup(self, node: int, hash_ids):
        k = self.cache.lookup(hash_ids)
        self.lookups += 1
        self.lookup_blocks += len(hash_ids)
        self.hit_blocks += k
        local = int(self._homes(hash_ids, k)[node]) if k else 0
        return k, local

    def remote_sources(self, node: int, hash_ids, k: int) -> dict:
        homes = self._homes(hash_ids, k) if k else np.zeros(self.nodes, dtype=np.int64)
        return {int(j): int(n) for j, n in enumerate(homes.tolist()) if n and j != node}

    def insert(self, node: int, hash_ids) -> int:
        cache, home = self.cache, self.home
        new = [h for h in hash_ids if h not in cache]
        before = cache.inserted_blocks
        cache.insert(hash_ids)
        for h in new:
            if h in cache:
                home[h] = node
        return cache.inserted_blocks - before


def _finite(x):
    return None if x == math.inf else x


def make_caches(kind: str, nodes: int, capacity_blocks_per_node: float, policy: str):
    if kind == "none" or capacity_blocks_per_node < 1:
        return NoCache(nodes)
    if kind == "local":
        return LocalCaches(nodes, capacity_blocks_per_node, policy)
    return GlobalPool(nodes, capacity_blocks_per_node, policy)

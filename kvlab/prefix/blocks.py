"""A block-chain prefix cache over Mooncake hash_ids, its eviction policies, and trace replay.

A request's prompt is a chain of block ids, each naming a block *and its whole prefix*, so
a request can reuse only the leading run of its blocks that are cached: the first missing
block ends the hit even if later ones are present. After its prefill a request holds KV for
all its blocks, and `insert` caches them (prefix blocks most recently used, so that an
eviction takes the tail of a chain before its head, as vLLM does).

Policies (eviction order, first evicted first):
  lru           least recently used.
  lfu           fewest uses since the block entered the cache, then least recently used.
  length-aware  Mooncake's one-line description is "similar to LFU but prioritising blocks
                that occur later in requests"; kvlab reads it as LFU whose ties go to the
                block deepest in its chain (a later block is useless without the earlier
                ones), then least recently used.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from ..cost import kv_bytes_per_token
from ..errors import KvlabError, check_number, unknown_name
from ..prompt import served_from_blocks
from ..traces import load_trace

POLICIES = ("lru", "lfu", "length-aware")


def capacity_in_blocks(
    capacity_blocks=None, capacity_tokens=None, block_tokens: int = 512
) -> float:
    """Capacity as a number of blocks (math.inf for unlimited). Tokens round down to whole
    blocks: a paged KV store reserves a full block for a partial one."""
    if (capacity_blocks is None) == (capacity_tokens is None):
        raise KvlabError("give exactly one of capacity_blocks and capacity_tokens")
    if capacity_tokens is not None:
        if capacity_tokens == math.inf:
            return math.inf
        tokens = check_number(
            "capacity_tokens", capacity_tokens, minimum=0, allow_equal_min=True, maximum=1e15
        )
        return float(int(tokens // block_tokens))
    if capacity_blocks == math.inf:
        return math.inf
    return float(
        check_number(
            "capacity_blocks",
            capacity_blocks,
            minimum=0,
            allow_equal_min=True,
            maximum=1e12,
            integer=True,
        )
    )


class BlockPrefixCache:
    """A prefix cache of KV blocks keyed by hash id, with a fixed capacity in blocks.

    Incremental, for simulators (a node's HBM cache, a global pool): `match` peeks,
    `lookup` peeks and counts, `insert` caches a chain after its prefill, `access` does
    both, as one request would. `on_evict(block_id)` is called for every evicted block
    (a simulator can demote it to a slower tier).
    """

    def __init__(
        self,
        capacity_blocks=math.inf,
        policy: str = "lru",
        on_evict: Callable[[int], None] | None = None,
    ):
        if policy not in POLICIES:
            raise unknown_name("cache policy", policy, POLICIES)
        self.capacity_blocks = capacity_in_blocks(capacity_blocks=capacity_blocks)
        self.policy = policy
        self.on_evict = on_evict
        self.lookups = self.lookup_blocks = self.hit_blocks = 0
        self.inserted_blocks = self.evicted_blocks = 0
        if self.capacity_blocks == math.inf:
            self._blocks: dict = {}
            self._insert = self._insert_unbounded
        elif self.capacity_blocks < 1:
            self._blocks = {}
            self._insert = lambda hash_ids: None  # a cache of size 0 holds nothing
        elif policy == "lru":
            self._cap = int(self.capacity_blocks)
            self._blocks = OrderedDict()
            self._insert = self._insert_lru
        else:
            self._cap = int(self.capacity_blocks)
            self._blocks = {}  # id -> bucket key (see _insert_counted)
            self._buckets: dict[int, OrderedDict] = {}  # key -> ids in least-recently-used order
            self._keys: list[int] = []  # heap of bucket keys (empty buckets dropped lazily)
            self._insert = self._insert_counted

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_id) -> bool:
        return block_id in self._blocks

    def match(self, hash_ids: Sequence[int]) -> int:
        """Leading blocks of the chain that are cached now (no side effects)."""
        blocks = self._blocks
        k = 0
        for h in hash_ids:
            if h not in blocks:
                break
            k += 1
        return k

    def lookup(self, hash_ids: Sequence[int]) -> int:
        """`match`, counted in the hit statistics."""
        k = self.match(hash_ids)
        self.lookups += 1
        self.lookup_blocks += len(hash_ids)
        self.hit_blocks += k
        return k

    def insert(self, hash_ids: Sequence[int]) -> None:
        """Cache every block of the chain (after its prefill) and mark it used now."""
        self._insert(hash_ids)

    def access(self, hash_ids: Sequence[int]) -> int:
        """One request: look its chain up, then cache all of it. Returns the hit blocks."""
        blocks = self._blocks
        k = 0
        for h in hash_ids:  # `lookup`, inlined: replay calls this once per request
            if h not in blocks:
                break
            k += 1
        self.lookups += 1
        self.lookup_blocks += len(hash_ids)
        self.hit_blocks += k
        self._insert(hash_ids)
        return k

    @property
    def block_hit_ratio(self) -> float:
        return self.hit_blocks / self.lookup_blocks if self.lookup_blocks else 0.0

    # ------------------------------------------------------------------ policies
    # A request's own blocks are pinned while it is cached (an engine holds references to
    # the blocks a running request uses): room is made first, from blocks of other chains,
    # then the chain is touched tail first so that its head ends most recently used. A chain
    # longer than the cache keeps its head.
    def _insert_unbounded(self, hash_ids):
        before = len(self._blocks)
        self._blocks.update(dict.fromkeys(hash_ids))
        self.inserted_blocks += len(self._blocks) - before

    def _room(self, hash_ids):
        """(chain to cache, blocks to evict) for a chain about to be inserted."""
        if len(hash_ids) > self._cap:
            hash_ids = hash_ids[: self._cap]
        blocks = self._blocks
        new = 0
        for h in hash_ids:
            if h not in blocks:
                new += 1
        return hash_ids, len(blocks) + new - self._cap

    def _insert_lru(self, hash_ids):
        # Touch or add the whole chain first, then trim the least recently used end: the
        # chain is then the most recently used run, so trimming never takes its blocks
        # (the same state as making room first from other chains).
        od, cap = self._blocks, self._cap
        if len(hash_ids) > cap:
            hash_ids = hash_ids[:cap]
        move, new = od.move_to_end, 0
        for h in reversed(hash_ids):
            if h in od:
                move(h)
            else:
                od[h] = None
                new += 1
        self.inserted_blocks += new
        excess = len(od) - cap
        if excess > 0:
            pop = od.popitem
            if self.on_evict is None:
                for _ in range(excess):
                    pop(False)
                self.evicted_blocks += excess
            else:
                self._evicted([pop(False)[0] for _ in range(excess)])

    def _evicted(self, victims):
        self.evicted_blocks += len(victims)
        if self.on_evict is not None:
            for h in victims:
                self.on_evict(h)

    def _insert_counted(self, hash_ids):
        """LFU and length-aware. Each cached id sits in a bucket keyed by its eviction rank,
        uses << 20 (LFU) or uses << 20 | (2**20 - 1 - depth) (length-aware, deeper first);
        inside a bucket ids are in least-recently-used order; a heap finds the lowest key."""
        hash_ids, need = self._room(hash_ids)
        if need > 0:
            self._evict_counted(need, set(hash_ids))
        where, buckets, keys, push = self._blocks, self._buckets, self._keys, heapq.heappush
        depth_rank = self.policy == "length-aware"
        new = 0
        for depth in range(len(hash_ids) - 1, -1, -1):
            h = hash_ids[depth]
            key = where.get(h)
            if key is None:
                key = _ONE_USE
                new += 1
            else:
                del buckets[key][h]
                key = (key | _DEPTH_MASK) + 1  # one more use, depth bits cleared
            if depth_rank:
                key |= _DEPTH_MASK - depth
            bucket = buckets.get(key)
            if bucket is None:
                bucket = buckets[key] = OrderedDict()
                push(keys, key)
            bucket[h] = None
            where[h] = key
        self.inserted_blocks += new

    def _evict_counted(self, need: int, pinned: set):
        where, buckets, keys = self._blocks, self._buckets, self._keys
        victims, skipped = [], []
        while need:
            bucket = buckets.get(keys[0])
            if not bucket:
                top = heapq.heappop(keys)
                if bucket is not None:
                    del buckets[top]
                continue
            held, pop = [], bucket.popitem
            while need and bucket:
                h = pop(False)[0]
                if h in pinned:
                    held.append(h)
                else:
                    del where[h]
                    victims.append(h)
                    need -= 1
            if held:  # blocks of the request being cached stay, in their order
                for h in reversed(held):
                    bucket[h] = None
                    bucket.move_to_end(h, last=False)
                if need:  # only pinned blocks left at this rank: look one rank up
                    skipped.append(heapq.heappop(keys))
        for key in skipped:
            heapq.heappush(keys, key)
        self._evicted(victims)


_DEPTH_MASK = (1 << 20) - 1  # depth < 2**20 blocks = 512M tokens per prompt
_ONE_USE = 1 << 20


# ---------------------------------------------------------------------- replay


@dataclass(frozen=True)
class ReplayResult:
    """Hit statistics of one trace replayed through one cache. Both hit-rate definitions:

    block_hit_ratio   hit blocks / block references
    token_hit_ratio   prompt tokens whose prefill was skipped / prompt tokens
    request_hit_rate  share of requests that hit at least one block (what a "hit rate"
                      counting requests reports; on a shared system prompt it is ~100%)
    """

    trace: str  # the trace's label ("... (generated)" for generated data)
    generated: bool
    policy: str
    capacity_blocks: float  # math.inf = unlimited
    block_tokens: int
    requests: int
    block_refs: int
    hit_blocks: int
    block_hit_ratio: float
    input_tokens: int
    prefill_tokens_saved: int
    token_hit_ratio: float
    request_hit_rate: float
    evicted_blocks: int
    hit_blocks_per_request: np.ndarray = dataclasses.field(repr=False, compare=False)
    hit_tokens_per_request: np.ndarray = dataclasses.field(repr=False, compare=False)

    def to_dict(self) -> dict:
        d = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if not f.name.endswith("_per_request")
        }
        d["capacity_blocks"] = (
            None if d["capacity_blocks"] == math.inf else int(d["capacity_blocks"])
        )
        return d


def replay(trace, capacity_blocks=None, policy: str = "lru", capacity_tokens=None) -> ReplayResult:
    """Replay a trace (a Trace, a name or a path) through a fresh BlockPrefixCache.

    Give capacity in blocks or in tokens (tokens round down to whole blocks); with neither,
    the cache is unlimited. Each request looks up its chain, then caches all of it.
    """
    trace = load_trace(trace)
    if capacity_blocks is None and capacity_tokens is None:
        capacity_blocks = math.inf
    cap = capacity_in_blocks(capacity_blocks, capacity_tokens, trace.block_tokens)
    cache = BlockPrefixCache(cap, policy)
    access = cache.access
    hits = [access(r.hash_ids) for r in trace.requests]
    return _result(trace, cache, np.array(hits, dtype=np.int64))


def _result(trace, cache: BlockPrefixCache, hit_blocks: np.ndarray) -> ReplayResult:
    inputs = trace.input_tokens
    hit_tokens = served_from_blocks(hit_blocks, trace.block_tokens, inputs)
    saved, total = int(hit_tokens.sum()), int(inputs.sum())
    return ReplayResult(
        trace=trace.label,
        generated=trace.generated,
        policy=cache.policy,
        capacity_blocks=cache.capacity_blocks,
        block_tokens=trace.block_tokens,
        requests=len(trace),
        block_refs=cache.lookup_blocks,
        hit_blocks=cache.hit_blocks,
        block_hit_ratio=cache.block_hit_ratio,
        input_tokens=total,
        prefill_tokens_saved=saved,
        token_hit_ratio=saved / total,
        request_hit_rate=float(np.count_nonzero(hit_blocks)) / len(trace),
        evicted_blocks=cache.evicted_blocks,
        hit_blocks_per_request=hit_blocks,
        hit_tokens_per_request=hit_tokens,
    )


def default_capacities(
    trace, fractions: Iterable[float] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0)
) -> np.ndarray:
    """Capacities (blocks) as fractions of the trace's distinct blocks: a cache as large as
    all distinct blocks never evicts, so the curve ends at the infinite-cache hit ratio."""
    unique = len({h for r in trace.requests for h in r.hash_ids})
    return np.unique(np.maximum(1, np.round(np.asarray(list(fractions)) * unique))).astype(np.int64)


def hit_ratio_curve(
    trace,
    capacities_blocks=None,
    policies: Iterable[str] = POLICIES,
    model=None,
    kv_dtype: str = "fp16",
) -> dict:
    """Plot-ready hit ratio against cache capacity, one curve per policy.

    Returns {"trace", "generated", "capacity_blocks", "capacity_tokens", ["capacity_bytes"],
    "policies": {policy: {"block_hit_ratio", "token_hit_ratio", "request_hit_rate"}},
    "infinite": {...the same three for an unlimited cache}}, arrays aligned with capacity_blocks.
    With a model, capacity_bytes is what those blocks of KV weigh (kvlab.cost.kv_bytes_per_token).
    """
    trace = load_trace(trace)
    caps = (
        default_capacities(trace)
        if capacities_blocks is None
        else np.asarray(capacities_blocks, dtype=np.int64)
    )
    policies = tuple(policies)
    for p in policies:
        if p not in POLICIES:
            raise unknown_name("cache policy", p, POLICIES)
    out = {
        "trace": trace.label,
        "generated": trace.generated,
        "capacity_blocks": caps,
        "capacity_tokens": caps * trace.block_tokens,
        "policies": {},
    }
    if model is not None:
        out["capacity_bytes"] = caps * trace.block_tokens * kv_bytes_per_token(model, kv_dtype)
    keys = ("block_hit_ratio", "token_hit_ratio", "request_hit_rate")
    for p in policies:
        runs = [replay(trace, int(c), p) for c in caps]
        out["policies"][p] = {k: np.array([getattr(r, k) for r in runs]) for k in keys}
    inf = replay(trace, math.inf)
    out["infinite"] = {k: getattr(inf, k) for k in keys}
    return out

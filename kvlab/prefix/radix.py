"""Token-level prefix caches over real token ids: a radix tree, and whole-request caching.

`RadixCache` reuses the longest cached prefix of a prompt at token granularity (SGLang's
RadixAttention; `page_tokens` > 1 rounds to pages, as vLLM's 16-token blocks or Mooncake's
512-token blocks do). Shared prefixes are stored once; eviction removes least recently used
leaves, so a prefix outlives its suffixes.

`WholeRequestCache` stores each finished request's KV (prompt + response) as one entry and
can reuse an entry only whole: only when the entire cached sequence is a prefix of the new
prompt. It looks entries up by the prompt's leading tokens, so it "finds" an entry for
almost every request that shares a system prompt, yet skips prefill only for follow-up
turns and exact repeats. Each entry holds its own copy of any shared prefix.

Both answer `lookup(prompt) -> (found_tokens, reused_tokens)`: how many leading prompt
tokens agree with something cached (what a request-level "hit" counts), and how many
tokens' prefill the cache actually lets the engine skip.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict

import numpy as np

from ..errors import check_number


class _Node:
    __slots__ = ("tokens", "children", "parent", "last_access", "is_end")

    def __init__(self, tokens: np.ndarray, parent: "_Node | None"):
        self.tokens = tokens  # edge label: the token ids this node adds to its parent's sequence
        self.children: dict[int, _Node] = {}
        self.parent = parent
        self.last_access = 0
        self.is_end = False  # WholeRequestCache: an entry ends exactly here


def _common_length(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two token arrays."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


class _RadixIndex:
    """A radix tree of token sequences (numpy int32 edges, children keyed by first token)."""

    def __init__(self):
        self.root = _Node(np.zeros(0, np.int32), None)
        self.nodes = 0

    def walk(self, tokens: np.ndarray) -> tuple[int, list[_Node], int]:
        """(matched tokens, fully matched nodes on the path, tokens matched in the next node)."""
        node, pos, path = self.root, 0, []
        while pos < len(tokens):
            child = node.children.get(int(tokens[pos]))
            if child is None:
                return pos, path, 0
            k = _common_length(child.tokens, tokens[pos:])
            if k < len(child.tokens):
                return pos + k, path, k
            path.append(child)
            pos += k
            node = child
        return pos, path, 0

    def insert(self, tokens: np.ndarray) -> tuple[_Node, list[_Node], int]:
        """Add a sequence; returns (its end node, nodes on its path, tokens newly stored)."""
        node, pos, path = self.root, 0, []
        while pos < len(tokens):
            first = int(tokens[pos])
            child = node.children.get(first)
            if child is None:
                leaf = _Node(np.array(tokens[pos:], dtype=np.int32), node)
                node.children[first] = leaf
                self.nodes += 1
                path.append(leaf)
                return leaf, path, len(tokens) - pos
            k = _common_length(child.tokens, tokens[pos:])
            if k < len(child.tokens):
                child = self._split(child, k)
            path.append(child)
            pos += k
            node = child
        return node, path, 0

    def _split(self, node: _Node, k: int) -> _Node:
        """Cut node's edge after k tokens; the new upper node is returned."""
        parent = node.parent
        upper = _Node(node.tokens[:k], parent)
        upper.last_access = node.last_access
        parent.children[int(node.tokens[0])] = upper
        node.tokens = node.tokens[k:]
        node.parent = upper
        upper.children[int(node.tokens[0])] = node
        self.nodes += 1
        return upper

    def remove_leaf(self, node: _Node) -> None:
        del node.parent.children[int(node.tokens[0])]
        node.parent = None
        self.nodes -= 1


def _capacity(capacity_tokens) -> float:
    if capacity_tokens is None or capacity_tokens == math.inf:
        return math.inf
    return float(
        check_number(
            "capacity_tokens", capacity_tokens, minimum=0, allow_equal_min=True, maximum=1e15
        )
    )


class RadixCache:
    """Token-granular prefix cache (a radix tree over token ids), LRU leaf eviction."""

    kind = "token"

    def __init__(self, capacity_tokens=math.inf, page_tokens: int = 1):
        self.capacity_tokens = _capacity(capacity_tokens)
        self.page_tokens = check_number(
            "page_tokens",
            page_tokens,
            minimum=1,
            allow_equal_min=True,
            maximum=1 << 20,
            integer=True,
        )
        self.index = _RadixIndex()
        self.stored_tokens = 0
        self.evicted_tokens = 0
        self._tick = 0
        self._seq = 0  # tie-breaker so the heap never compares nodes
        self._leaf_heap: list[tuple[int, int, _Node]] = []
        if self.page_tokens > 1:
            self.kind = f"page-{self.page_tokens}"

    def lookup(self, prompt: np.ndarray) -> tuple[int, int]:
        """(found, reused): matched tokens, and matched tokens rounded down to whole pages."""
        matched, path, _ = self.index.walk(prompt)
        self._tick += 1
        for node in path:
            node.last_access = self._tick
        return matched, matched - matched % self.page_tokens

    def insert(self, tokens: np.ndarray) -> None:
        """Cache a finished request's KV (prompt + response); only whole pages are kept."""
        tokens = tokens[: len(tokens) - len(tokens) % self.page_tokens]
        if not len(tokens) or self.capacity_tokens < 1:
            return
        end, path, added = self.index.insert(tokens)
        self._tick += 1
        for node in path:
            node.last_access = self._tick
        self.stored_tokens += added
        if not end.children:
            self._push(end)
        if self.stored_tokens > self.capacity_tokens:
            self._evict()

    def _evict(self) -> None:
        """Drop least recently used leaves (a parent left childless becomes a candidate)."""
        heap = self._leaf_heap
        while self.stored_tokens > self.capacity_tokens and heap:
            stamp, _, node = heapq.heappop(heap)
            if node.parent is None or node.children or node.last_access != stamp:
                if (
                    node.parent is not None and not node.children
                ):  # stale stamp: requeue at its real age
                    self._push(node)
                continue
            parent = node.parent
            self.index.remove_leaf(node)
            self.stored_tokens -= len(node.tokens)
            self.evicted_tokens += len(node.tokens)
            if parent is not self.index.root and not parent.children:
                self._push(parent)

    def _push(self, node: _Node) -> None:
        self._seq += 1
        heapq.heappush(self._leaf_heap, (node.last_access, self._seq, node))


class WholeRequestCache:
    """Whole-request caching: one entry per finished request, reusable only in full, LRU entries."""

    kind = "whole-request"

    def __init__(self, capacity_tokens=math.inf):
        self.capacity_tokens = _capacity(capacity_tokens)
        self.index = _RadixIndex()  # finds entries by leading tokens; stores no KV itself
        self.entries: OrderedDict[_Node, int] = OrderedDict()  # end node -> entry length, LRU first
        self.stored_tokens = 0  # sum of entry lengths: every entry keeps its own copy
        self.evicted_tokens = 0

    def lookup(self, prompt: np.ndarray) -> tuple[int, int]:
        """(found, reused): tokens that agree with some entry, and the longest entry that is a
        whole prefix of the prompt (0 when none is)."""
        matched, path, _ = self.index.walk(prompt)
        reused, depth, best = 0, 0, None
        for node in path:
            depth += len(node.tokens)
            if node.is_end:
                reused, best = depth, node
        if best is not None:
            self.entries.move_to_end(best)
        return matched, reused

    def insert(self, tokens: np.ndarray) -> None:
        """Store a finished request's KV (prompt + response) as one entry."""
        if not len(tokens) or self.capacity_tokens < len(tokens):
            return  # an entry larger than the whole cache is never stored
        end, _, _ = self.index.insert(tokens)
        if end.is_end:
            self.entries.move_to_end(end)
            return
        end.is_end = True
        self.entries[end] = len(tokens)
        self.stored_tokens += len(tokens)
        while self.stored_tokens > self.capacity_tokens:
            node, length = self.entries.popitem(last=False)
            self.stored_tokens -= length
            self.evicted_tokens += length
            self._drop(node)

    def _drop(self, node: _Node) -> None:
        node.is_end = False
        while node is not self.index.root and not node.children and not node.is_end:
            parent = node.parent
            self.index.remove_leaf(node)
            node = parent

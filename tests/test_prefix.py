"""Prefix caches: hand-checked replays per policy, properties, radix and whole-request caching,
the granularity comparison and the latency each hit rate buys."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.bench.prefix_replay import ordered_dict_replay
from kvlab.cli import main
from kvlab.cost import decode_step, prefill
from kvlab.deployment import Deployment
from kvlab.errors import KvlabError
from kvlab.prefix import BlockPrefixCache, hit_ratio_curve, replay
from kvlab.prefix.compare import compare_granularity, granularity_sweep
from kvlab.prefix.latency import latency_vs_hit_ratio, tpot_s, ttft_s
from kvlab.prefix.radix import RadixCache, WholeRequestCache
from kvlab.tiers import TierPath, kv_fetch_time_s
from kvlab.traces import Request, Trace
from kvlab.traces.generate import generate_trace

BT = 512


def trace_of(*chains, name="hand"):
    """A trace whose request i has chain i; prompts end in a partial block (100 tokens short)."""
    reqs = tuple(Request(float(i), BT * len(c) - 100, 10, tuple(c)) for i, c in enumerate(chains))
    return Trace(name, reqs, source="test")


def hits(trace, cap, policy):
    return replay(trace, cap, policy).hit_blocks_per_request.tolist()


# ------------------------------------------------------------------ hand-checked replays


def test_lru_by_hand():
    t = trace_of([1, 2], [3], [1, 2, 4], [3], [1, 2, 4])
    # cap 3: [2,1] -> [2,1,3] -> r3 hits 1,2; adds 4, trims 3 -> [4,2,1] -> r4 misses 3, trims 4
    # -> [2,1,3] -> r5 hits 1,2 (4 is gone), adds 4, trims 3
    r = replay(t, 3, "lru")
    assert r.hit_blocks_per_request.tolist() == [0, 0, 2, 0, 2]
    assert (r.block_refs, r.hit_blocks, r.evicted_blocks) == (10, 4, 3)
    assert r.block_hit_ratio == 0.4
    # tokens: each hit is 2 full blocks; prompts are 924, 412, 1436, 412, 1436 tokens
    assert r.prefill_tokens_saved == 4 * BT and r.token_hit_ratio == 4 * BT / (
        924 + 412 + 1436 + 412 + 1436
    )
    assert r.request_hit_rate == 2 / 5


def test_lfu_keeps_the_frequent_block_lru_drops_it():
    t = trace_of([1], [1], [2], [3], [1])
    assert hits(t, 2, "lru") == [0, 1, 0, 0, 0]  # [1,2] + 3 -> 1 is least recent
    assert hits(t, 2, "lfu") == [0, 1, 0, 0, 1]  # 1 was used twice; 2 (once) goes
    assert hits(t, 2, "length-aware") == [0, 1, 0, 0, 1]


def test_length_aware_evicts_the_deepest_block_first():
    t = trace_of([20], [10, 11], [30], [20], [10, 11])
    # cap 3, all used once when 30 arrives: LRU/LFU evict 20 (oldest); length-aware evicts 11
    # (depth 1). Then 20 hits only under length-aware.
    assert hits(t, 3, "lru") == [0, 0, 0, 0, 1]
    assert hits(t, 3, "lfu") == [0, 0, 0, 0, 1]
    evicted = []
    cache = BlockPrefixCache(3, "length-aware", on_evict=evicted.append)
    assert [cache.access(r.hash_ids) for r in t.requests] == [0, 0, 0, 1, 1]
    # in the last request 10 is the oldest depth-0 block but pinned (this request uses it): 30 goes
    assert evicted == [11, 30] and set(cache._blocks) == {20, 10, 11}


def test_a_request_never_evicts_its_own_prefix():
    cache = BlockPrefixCache(3, "lfu")
    cache.access((1, 2))  # 1, 2 used once
    cache.access((5,))  # 5 used once
    assert cache.access((1, 7)) == 1  # room for 7 is made from 2 or 5, never from 1
    assert 1 in cache and 7 in cache and len(cache) == 3


def test_a_chain_longer_than_the_cache_keeps_its_head():
    for policy in ("lru", "lfu", "length-aware"):
        cache = BlockPrefixCache(2, policy)
        cache.access((1, 2, 3, 4))
        assert set(cache._blocks) == {1, 2}, policy
        assert cache.access((1, 2, 3, 4)) == 2


def test_capacity_in_tokens_rounds_down_to_blocks_and_zero_caches_nothing():
    t = trace_of([1, 2], [1, 2])
    assert replay(t, capacity_tokens=3 * BT - 1).capacity_blocks == 2
    assert replay(t, capacity_tokens=0).hit_blocks == 0
    assert replay(t).capacity_blocks == math.inf and replay(t).hit_blocks == 2
    with pytest.raises(KvlabError, match="exactly one of"):
        replay(t, capacity_blocks=1, capacity_tokens=512)
    with pytest.raises(KvlabError, match="unknown cache policy 'fifo'"):
        BlockPrefixCache(1, "fifo")
    with pytest.raises(KvlabError, match="capacity_blocks must be a whole number"):
        BlockPrefixCache(1.5)


def test_lookup_peeks_and_counts():
    cache = BlockPrefixCache(10)
    cache.insert((1, 2, 3))
    assert cache.match((1, 2, 9)) == 2 and cache.lookups == 0
    assert cache.lookup((1, 9, 3)) == 1  # 3 is cached but 9 breaks the chain
    assert (cache.lookups, cache.lookup_blocks, cache.hit_blocks) == (1, 3, 1)


# ------------------------------------------------------------------ properties


@st.composite
def chains(draw):
    """Requests whose ids obey prefix semantics: a kept prefix of an earlier chain + fresh ids."""
    out, fresh = [], 0
    for _ in range(draw(st.integers(1, 40))):
        head = ()
        if out and draw(st.booleans()):
            base = out[draw(st.integers(0, len(out) - 1))]
            head = base[: draw(st.integers(0, len(base)))]
        extra = draw(st.integers(0 if head else 1, 5))
        out.append(head + tuple(range(fresh, fresh + extra)))
        fresh += extra
    return out


@settings(max_examples=150, deadline=None)
@given(chains(), st.integers(1, 30), st.integers(0, 30))
def test_a_larger_lru_cache_never_hits_less(cs, small, more):
    t = trace_of(*cs)
    a, b = np.array(hits(t, small, "lru")), np.array(hits(t, small + more, "lru"))
    assert np.all(b >= a)  # LRU's inclusion property holds request by request
    assert a.tolist() == ordered_dict_replay(t, small)  # and matches the plain OrderedDict replay


def test_bench_prefix_replay_times_both_replays_and_they_agree(capsys):
    """`kvlab bench prefix-replay`: both replays timed per capacity, the same hits (pinning
    changes which blocks go mid-request, not LRU's hits); a bad capacity is exit 2."""
    argv = ["bench", "prefix-replay", "generated", "--repeats", "1", "--capacities", "64,1k"]
    assert main([*argv, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert list(r["capacities"]) == ["64", "1024"] and r["repeats"] == 1
    for c in r["capacities"].values():
        assert c["hits_agree"] and c["kvlab_s"] > 0 and c["ordered_dict_s"] > 0
    small, large = (c["block_hit_ratio"] for c in r["capacities"].values())
    assert 0 < small < large < 1  # more room, more hits
    assert main(argv) == 0 and "hits agree" in capsys.readouterr().out
    assert main(["bench", "prefix-replay", "--capacities", "0"]) == 2


@settings(max_examples=100, deadline=None)
@given(chains(), st.integers(1, 30), st.sampled_from(["lru", "lfu", "length-aware"]))
def test_every_policy_is_bounded_by_the_unlimited_cache(cs, cap, policy):
    t = trace_of(*cs)
    cache = BlockPrefixCache(cap, policy)
    got = [cache.access(r.hash_ids) for r in t.requests]
    assert np.all(np.array(got) <= np.array(hits(t, math.inf, "lru")))
    assert len(cache) <= cap and cache.inserted_blocks - cache.evicted_blocks == len(cache)
    unique = len({h for c in cs for h in c})
    # room for all: no policy matters
    assert hits(t, max(unique, 1), policy) == hits(t, math.inf, policy)


def test_hit_ratio_curve_is_plot_ready():
    t = generate_trace("shared-prefix", seed=2, requests=400)
    curve = hit_ratio_curve(t, [10, 100, 1000, 100000], model="llama-3.1-8b")
    assert curve["generated"] and curve["trace"].endswith("(generated)")
    lru = curve["policies"]["lru"]["block_hit_ratio"]
    assert np.all(np.diff(lru) >= 0) and lru[-1] == curve["infinite"]["block_hit_ratio"]
    assert set(curve["policies"]) == {"lru", "lfu", "length-aware"}
    assert curve["capacity_bytes"][0] == 10 * BT * 131072  # 128 KiB of fp16 KV per token
    assert np.all(
        curve["policies"]["lfu"]["token_hit_ratio"] <= curve["infinite"]["token_hit_ratio"] + 1e-12
    )


# ------------------------------------------------------------------ radix and whole-request caches


def arr(*xs):
    return np.array(xs, dtype=np.int32)


def test_radix_reuses_the_longest_shared_prefix_at_token_granularity():
    c = RadixCache()
    c.insert(arr(1, 2, 3, 4))
    c.insert(arr(1, 2, 5))
    assert c.stored_tokens == 5  # the shared [1, 2] is stored once
    assert c.lookup(arr(1, 2, 3, 9)) == (3, 3)
    assert c.lookup(arr(1, 2, 5, 6, 7)) == (3, 3)
    assert c.lookup(arr(8, 1)) == (0, 0)
    paged = RadixCache(page_tokens=2)
    paged.insert(arr(1, 2, 3, 4, 5))  # only whole pages are kept: [1, 2, 3, 4]
    assert paged.stored_tokens == 4
    assert paged.lookup(arr(1, 2, 3, 9)) == (3, 2)
    assert paged.kind == "page-2"


def test_radix_evicts_least_recently_used_leaves():
    c = RadixCache(capacity_tokens=6)
    a, b = arr(1, 2, 3, 4), arr(1, 2, 5, 6)
    c.insert(a)
    c.insert(b)  # splits [1,2,3,4]: stored [1,2] + [3,4] + [5,6] = 6
    c.lookup(a)  # a's leaf is now more recent than b's
    c.insert(arr(7, 8))  # 8 tokens: the least recent leaf, [5, 6], goes
    assert c.stored_tokens == 6 and c.evicted_tokens == 2
    assert c.lookup(b) == (2, 2) and c.lookup(a) == (4, 4) and c.lookup(arr(7, 8)) == (2, 2)


def test_whole_request_cache_reuses_only_whole_entries():
    c = WholeRequestCache()
    first = np.arange(1, 11, dtype=np.int32)  # a request's prompt + response, 10 tokens
    c.insert(first)
    sibling = np.concatenate([first[:5], arr(99, 98, 97)])
    assert c.lookup(sibling) == (5, 0)  # an entry shares 5 tokens, yet none can be reused
    follow_up = np.concatenate([first, arr(11, 12)])
    assert c.lookup(follow_up) == (10, 10)  # the whole entry is a prefix: all of it is reused
    c.insert(first)
    assert c.stored_tokens == 10  # the same entry is not stored twice
    c.insert(sibling)
    assert c.stored_tokens == 18  # each entry keeps its own copy of the shared 5 tokens


def test_whole_request_cache_evicts_whole_entries_and_prunes_its_index():
    c = WholeRequestCache(capacity_tokens=15)
    first = np.arange(1, 11, dtype=np.int32)
    second = np.concatenate([first[:5], np.arange(20, 25, dtype=np.int32)])
    c.insert(first)
    c.insert(second)  # 20 tokens > 15: the older entry goes
    assert c.stored_tokens == 10 and c.evicted_tokens == 10
    assert c.lookup(np.concatenate([first, arr(11)])) == (5, 0)
    assert c.lookup(np.concatenate([second, arr(7)])) == (10, 10)
    c.insert(np.arange(100, 120, dtype=np.int32))  # larger than the cache: never stored
    assert c.stored_tokens == 10


# ------------------------------------------------------------------ granularity comparison


@pytest.fixture(scope="module")
def comparison():
    return compare_granularity(requests=300, caches=("whole-request", "page-512", "token"), seed=1)


def test_whole_request_hits_as_often_but_skips_far_less_prefill(comparison):
    c = comparison["caches"]
    whole, paged, token = c["whole-request"], c["page-512"], c["token"]
    assert whole.request_hit_rate > 0.95 and whole.request_hit_rate == token.request_hit_rate
    assert token.token_hit_ratio > 2.5 * whole.token_hit_ratio
    assert whole.token_hit_ratio <= paged.token_hit_ratio <= token.token_hit_ratio
    assert (
        comparison["no_cache_mean_ttft_s"]
        > whole.mean_ttft_s
        > paged.mean_ttft_s
        >= token.mean_ttft_s
    )
    assert token.mean_ttft_s < 0.5 * whole.mean_ttft_s
    assert whole.mean_tpot_s == token.mean_tpot_s  # decode reads the same bytes either way
    assert whole.stored_tokens > token.stored_tokens  # entries duplicate shared prefixes
    for r in c.values():
        assert 0 <= r.prefill_tokens_saved <= r.input_tokens
        assert r.token_hit_ratio == r.reused_tokens_per_request.sum() / r.input_tokens


def test_the_sweep_moves_token_hits_not_request_hits():
    s = granularity_sweep(values=(250, 1000, 4000), requests=200)
    token, whole = s["caches"]["token"], s["caches"]["whole-request"]
    assert np.all(np.diff(token["token_hit_ratio"]) < 0)  # longer unique suffixes: less to reuse
    assert np.ptp(whole["request_hit_rate"]) == 0 and np.ptp(token["request_hit_rate"]) == 0
    assert np.all(s["ttft_ratio"] < 1) and np.all(np.diff(s["ttft_ratio"]) > 0)
    assert np.all(np.diff(s["mean_input_tokens"]) > 0)
    with pytest.raises(KvlabError, match="unknown workload knob"):
        granularity_sweep(param="suffix", values=(1,))


# ------------------------------------------------------------------ latency


def test_ttft_is_prefill_of_the_miss_plus_the_fetch_of_the_hit():
    d = Deployment("llama-3.1-8b", "h100-sxm")
    inputs, cached = np.array([4096, 4096, 4096]), np.array([0, 2048, 4096])
    resident = ttft_s(d, inputs, cached)
    assert resident[0] == prefill(d, 4096).time_s
    assert resident[2] == prefill(d, 4096, 4095).time_s  # the last token is always computed
    assert np.all(np.diff(resident) < 0)
    host = ttft_s(d, inputs, cached, "pcie5-x16")  # a tier name: its bandwidth alone
    assert host[0] == resident[0]  # nothing cached, nothing fetched
    fetch = kv_fetch_time_s(d, 2048, TierPath("pcie5-x16", latency_s=0.0))
    assert host[1] == pytest.approx(resident[1] + fetch)
    assert np.all(ttft_s(d, inputs, cached, "ethernet-10g") >= host)
    assert tpot_s(d, 4096, 16) == pytest.approx(decode_step(d, 16, 4096).step_time_s)


def test_hit_ratio_moves_ttft_but_not_tpot():
    t = generate_trace("shared-prefix", seed=4, requests=300)
    r = latency_vs_hit_ratio(t, [5, 50, 500])
    assert r["capacity_blocks"][-1] == math.inf
    assert np.all(np.diff(r["token_hit_ratio"]) >= 0)
    for label in r["tiers"]:
        assert np.all(np.diff(r["mean_ttft_s"][label]) <= 0)
        assert r["mean_ttft_s"][label][0] <= r["no_cache_mean_ttft_s"]
    assert np.ptp(r["mean_tpot_s"]) == 0


# ------------------------------------------------------------------ CLI

PREFIX_KEYS = {"block_hit_ratio", "token_hit_ratio", "prefill_tokens_saved"}


def test_prefix_cache_cli(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    rows = [([1, 2], 924), ([3], 412), ([1, 2, 4], 1436), ([3], 412), ([1, 2, 4], 1436)]
    path.write_text(
        "".join(
            json.dumps({"timestamp": i, "input_length": n, "output_length": 5, "hash_ids": ids})
            + "\n"
            for i, (ids, n) in enumerate(rows)
        )
    )
    assert (
        main(["prefix-cache", str(path), "--policy", "lru", "--capacity-blocks", "3", "--json"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert (
        PREFIX_KEYS <= set(out)
        and out["block_hit_ratio"] == 0.4
        and out["prefill_tokens_saved"] == 2048
    )
    assert main(["prefix-cache", str(path), "--capacity-tokens", "1536", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["capacity_blocks"] == 3
    assert (
        main(
            [
                "prefix-cache",
                str(path),
                "--capacity-blocks",
                "inf",
                "--model",
                "llama-3.1-8b",
                "--tier",
                "pcie5-x16",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["capacity_blocks"] is None and out["mean_ttft_s"] < out["no_cache_mean_ttft_s"]
    assert main(["prefix-cache", str(path), "--capacity-blocks", "3"]) == 0
    assert "token hit ratio" in capsys.readouterr().out
    assert main(["prefix-cache", str(path), "--capacity-blocks", "-3"]) == 2
    assert "capacity_blocks must be >= 0" in capsys.readouterr().err
    assert main(["prefix-cache", str(path)]) == 2  # a capacity is required
    assert main(["prefix-cache", str(path), "--capacity-blocks", "3", "--model", "gpt-9"]) == 2
    assert "unknown model" in capsys.readouterr().err


def test_prefix_cache_cli_does_not_import_heavy_modules():
    code = (
        "import sys; from kvlab.cli import main; main(['prefix-cache', 'generated:shared-prefix', "
        "'--capacity-blocks', '100', '--model', 'llama-3.1-8b']); "
        "sys.stderr.write(repr([m for m in ('torch', 'bokeh', 'ipywidgets') if m in sys.modules]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stderr.endswith("[]")

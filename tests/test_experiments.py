"""kvlab.sim.experiments: Mooncake's published experiments as kvlab runs (the clusters, the
workloads, the yardsticks), hand-checked on small inputs; the full runs are
bench/peers/mooncake_repro.py's."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from kvlab import metrics
from kvlab.deployment import Deployment
from kvlab.errors import KvlabError
from kvlab.prefix.pools import global_vs_local
from kvlab.published import mooncake
from kvlab.sim import SimConfig, simulate
from kvlab.sim import experiments as ex
from kvlab.traces.generate import generate_trace, poisson_trace

KV_70B = 80 * 8 * 128 * 2 * 2  # layers x KV heads x head dim x (K, V) x fp16 bytes


def test_published_values_carry_their_sources():
    for key in ("fast25_testbed", "fast25_conversation", "report_l_eval"):
        assert "FAST'25" in mooncake(key)["source"] or "arXiv" in mooncake(key)["source"]
    assert mooncake("fast25_conversation")["gains"] == [4.98, 1.57, 0.59]
    assert mooncake("report_arxiv_summarization")["cache_ratio"] == 0.0  # "~0%", Table 2
    with pytest.raises(KvlabError, match="published Mooncake experiment"):
        mooncake("fast26")


def test_fast25_systems_as_the_paper_sets_them_up():
    s = ex.fast25_systems()
    m, v = s["mooncake"], s["vllm"]
    assert (m.arch, m.prefill_workers, m.decode_workers) == ("kv-centric", 8, 8)
    assert (v.arch, v.instances, v.scheduler, v.prefix_cache) == (
        "colocated",
        16,
        "prefill-first",
        "none",
    )
    for c in s.values():
        assert c.gpus == 128 and c.tensor_parallel == 8 and c.hardware == "a800-80gb"
        assert c.ttft_slo_s == 30.0 and c.tbt_stat == "slowest10-mean"
        assert c.link == "ib-200g" and c.link_efficiency == 0.5  # 4 x 200 Gb/s per 8 GPUs
    # 3M tokens of LLaMA3-70B KV per node: 327,680 B a token, ~0.98 TB (the paper's ~1 TB)
    assert ex.kv_bytes_per_token(m) == KV_70B == 327_680
    assert m.pool_bytes_per_node == 3e6 * KV_70B
    # vLLM's prefix cache lives in the instance's free HBM: 8 x (0.9 x 80 GB - an eighth of 70B)
    d = Deployment("llama-3.1-70b", "a800-80gb", tensor_parallel=8)
    hbm = s["vllm-prefix-caching"]
    assert hbm.prefix_cache == "local"
    assert hbm.pool_bytes_per_node == pytest.approx(8 * (0.9 * 80e9 - d.weight_bytes))
    assert s["vllm-chunked-prefill"].chunk_tokens == 512  # vLLM 0.5's chunked budget
    half = ex.fast25_systems(nodes=8)
    assert (half["mooncake"].prefill_workers, half["vllm"].instances) == (4, 8)
    with pytest.raises(KvlabError, match="prefill nodes"):
        ex.fast25_systems(nodes=4, prefill_nodes=4)


def _small(**kw) -> SimConfig:
    return SimConfig(prefill_workers=1, decode_workers=1, **kw)


@pytest.fixture(scope="module")
def gen():
    return generate_trace("conversation", seed=0, requests=60)


def test_capacities_are_mooncakes_share_per_limit(gen):
    r = simulate(gen, _small(arch="colocated"))
    caps = ex.capacities(r, 30.0, (0.01, 0.1, 10.0))
    assert caps == sorted(caps)  # a looser limit never lowers the share
    rec = r.records
    slowest = rec["itl_slowest10_mean_s"]
    want = np.mean((rec["ttft_s"] <= 30.0) & (np.isnan(slowest) | (slowest <= 0.1)))
    assert caps[1] == pytest.approx(want)
    tbt = ex.tbt_per_request_s(r)
    assert np.all(np.diff(tbt) >= 0) and ex.median_tbt_s(r) == pytest.approx(np.median(tbt))
    assert metrics.TBT_COLUMNS["slowest10-mean"] == "itl_slowest10_mean_s"


def test_fit_step_overhead_matches_a_median(gen):
    cfg = _small(arch="disaggregated", tbt_stat="slowest10-mean")
    base = ex.median_tbt_s(simulate(gen, cfg))
    fit = ex.fit_step_overhead(gen, cfg, base + 0.03)
    assert fit.median_tbt_s == pytest.approx(base + 0.03, rel=0.02)
    # one decode node: each gap grows by about the overhead
    assert fit.step_overhead_s == pytest.approx(0.03, rel=0.2) and fit.runs <= 5
    again = simulate(gen, dataclasses.replace(cfg, step_overhead_s=fit.step_overhead_s))
    assert ex.median_tbt_s(again) == pytest.approx(fit.median_tbt_s, rel=1e-12)
    slow = ex.fit_step_overhead(gen, cfg, base / 2)  # already slower: nothing to add
    assert slow.step_overhead_s == 0.0 and slow.runs == 1


def test_global_pool_hits_more_than_local_caches(gen):
    one = ex.one_token_outputs(gen)
    assert [r.output_tokens for r in one.requests] == [1] * len(gen)
    assert [r.input_tokens for r in one.requests] == [r.input_tokens for r in gen.requests]
    systems = ex.pool_systems(
        prefill_nodes=4, model="llama-3.1-8b", hardware="h100-sxm", tensor_parallel=1
    )
    assert systems["global"].pool_bytes_per_node == 3e6 * ex.kv_bytes_per_token(systems["global"])
    hits = {k: simulate(one, c).summary()["prefix_hit_ratio"] for k, c in systems.items()}
    assert hits["global"] >= hits["local"] >= hits["local-least-loaded"]
    assert hits["global"] > hits["local-least-loaded"]


def test_report_workloads_and_slos():
    arxiv = ex.report_workload("arxiv-summarization", 1.0, requests=50)
    leval = ex.report_workload("l-eval", 1.0, requests=200)
    assert {r.input_tokens for r in arxiv.requests} == {8088}
    assert {r.output_tokens for r in leval.requests} == {72}

    bound = lambda t: global_vs_local(t, 1, [0])["infinite_token_hit_ratio"]  # noqa: E731
    assert bound(arxiv) == 0.0
    # 16,384 of 19,019 tokens from one of 20 documents, after each document's first use
    assert bound(leval) > 0.75
    assert bound(leval) == pytest.approx(16384 / 19019 * (1 - 20 / 200), abs=0.01)
    light = {
        "a": {"ttft_p90_s": 1.0, "tpot_p90_s": 0.02},
        "b": {"ttft_p90_s": 2.0, "tpot_p90_s": 0.01},
    }
    assert ex.report_slos(light) == (pytest.approx(10.0), pytest.approx(0.05))
    with pytest.raises(KvlabError, match="unknown report workload"):
        ex.report_workload("sharegpt", 1.0)
    s = ex.report_systems()
    assert (s["mooncake-3p1d"].prefill_workers, s["mooncake-3p1d"].decode_workers) == (3, 1)
    assert s["vllm-4m"].instances == 4 and s["vllm-4m"].prefix_cache == "none"


def test_p90_throughput_brackets_the_limit():
    cfg = SimConfig(
        arch="colocated", prefill_workers=1, decode_workers=0, scheduler="prefill-first"
    )
    spec = "poisson:rate={r:g},prompt=2048,output=64,requests=80,seed=1"

    def at(rate):
        return poisson_trace(spec.format(r=rate))

    ttft, tbt = ex.p90s(simulate(at(0.5), cfg).summary())
    found = ex.p90_throughput(cfg, at, 10 * ttft, 5 * tbt, 0.5)
    assert 0.5 <= found.rate_per_s < found.missed_at_per_s <= found.rate_per_s / 0.975 + 1e-9
    ok = ex.p90s(simulate(at(found.rate_per_s), cfg).summary())
    miss = ex.p90s(simulate(at(found.missed_at_per_s), cfg).summary())
    assert ok[0] <= 10 * ttft and ok[1] <= 5 * tbt
    assert miss[0] > 10 * ttft or miss[1] > 5 * tbt
    with pytest.raises(KvlabError, match="misses the P90 limits"):
        ex.p90_throughput(cfg, at, ttft / 10, tbt, 0.5)
    assert math.isfinite(found.rate_per_s)

"""kvlab.sim: conservation, determinism, direction of effect, the ledger behind the step
times, rejection instead of hanging, a golden run, the CLI and the chapter data."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab import cost, metrics
from kvlab.cli import build_parser, main
from kvlab.deployment import Ceiling, Deployment, KernelTables
from kvlab.errors import KvlabError
from kvlab.prefix import replay
from kvlab.prompt import served_from_blocks, served_tokens
from kvlab.sim import (
    ARCHS,
    DECODE_ROUTERS,
    DONE,
    PREFILL_ROUTERS,
    REJECTED,
    SCHEDULERS,
    BenchCost,
    EventLoop,
    LedgerCost,
    SimConfig,
    Simulation,
    SimulationError,
    engine_chunk_tokens,
    measured_rate_per_s,
    pipeline_time_s,
    scale_arrivals,
    simulate,
    trace_slice,
)
from kvlab.sim.engine import Engine
from kvlab.sim.kernel_cost import KernelCost
from kvlab.sim.network import Link
from kvlab.tiers import tiered_decode_step, transfer_time_s
from kvlab.traces import Request, Trace
from kvlab.traces.generate import generate_trace

H100 = Deployment("llama-3.1-8b", "h100-sxm")
H100_TABLES = H100.replace(speed=KernelTables())

GOLDEN = Path(__file__).parent / "golden" / "sim_tiny.json"


def _ids(start: int, n: int) -> tuple:
    return tuple(range(start, start + n))


def tiny_trace() -> Trace:
    """Ten hand-made requests: a shared 2-block system prompt (ids 1, 2), conversations that
    extend earlier prompts, and a few unrelated ones. Input lengths match their block counts."""
    sys_prompt = (1, 2)
    reqs = [
        Request(0.00, 1500, 40, sys_prompt + (3,)),
        Request(0.05, 1100, 25, sys_prompt + (4,)),
        Request(0.10, 3000, 60, sys_prompt + (3, 5, 6, 7)),
        Request(0.20, 700, 10, (8, 9)),
        Request(0.40, 2600, 80, sys_prompt + (4, 10, 11, 12)),
        Request(0.45, 5000, 30, sys_prompt + (3, 5, 6, 7) + _ids(13, 4)),
        Request(0.50, 300, 1, (17,)),
        Request(0.90, 4100, 120, sys_prompt + (3, 5, 6, 7) + _ids(13, 3)),
        Request(1.20, 9000, 50, _ids(20, 18)),
        Request(1.25, 9100, 70, _ids(20, 17) + (40,)),
    ]
    return Trace("tiny", tuple(reqs), source="hand-made (tests/test_sim.py)", generated=True)


@pytest.fixture(scope="module")
def gen():
    """A generated conversation workload: 250 requests over ~105 s, long prompts, shared
    prefixes."""
    return generate_trace("conversation", seed=0, requests=250)


# ------------------------------------------------------------------ invariants


def check_run(result, trace):
    """Every request done exactly once with exactly its output tokens, in time order."""
    rec = result.records
    n = len(trace)
    assert rec.size == n
    assert (rec["status"] == DONE).all(), result.rejected
    assert rec["tokens"].tolist() == [r.output_tokens for r in trace.requests]
    assert int(rec["tokens"].sum()) == result.token_times_s.size
    for i in range(n):
        t = result.tokens(i)
        assert np.all(np.diff(t) >= 0), f"request {i}: a token before its predecessor"
        assert t[0] == rec["first_token_s"][i] and t[-1] == rec["finish_s"][i]
    arrival = rec["arrival_s"]
    assert np.all(rec["prefill_start_s"] >= arrival)
    assert np.all(rec["prefill_end_s"] > rec["prefill_start_s"])
    assert np.all(rec["first_token_s"] >= rec["prefill_end_s"])
    # the last prompt token is always computed
    assert np.all(rec["cached_tokens"] < rec["input_tokens"])
    assert result.sim_end_s >= rec["finish_s"].max()
    for _worker, start, end, kind, req in result.timeline:
        assert end >= start and kind in ("fetch", "prefill", "transfer", "decode") and 0 <= req < n
    s = result.summary()
    assert s["requests_completed"] == n and s["tokens_generated"] == sum(
        r.output_tokens for r in trace.requests
    )
    json.dumps(result.to_dict(), allow_nan=False)  # JSON-ready


CONFIGS = [
    dict(arch="colocated"),
    dict(arch="colocated", chunk_tokens=0),
    dict(arch="colocated", prefix_cache="global", prefill_router="cache-aware", overlap=True),
    dict(arch="disaggregated"),
    dict(arch="disaggregated", overlap=True, decode_router="free-hbm"),
    dict(arch="kv-centric"),
    dict(arch="kv-centric", remote_kv=True),
    dict(arch="kv-centric", overlap=False, prefix_cache="local", cache_policy="length-aware"),
    dict(arch="kv-centric", step_jitter=0.3, seed=7),
    dict(arch="disaggregated", max_batch=1),  # decode admission queues
    dict(arch="colocated", max_batch=2, prefill_workers=1, decode_workers=0),
]


@pytest.mark.parametrize(
    "overrides", CONFIGS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items())
)
def test_conservation(gen, overrides):
    trace = trace_slice(gen, 0, 40)
    r = simulate(trace, **overrides)
    check_run(r, trace)
    if overrides["arch"] != "colocated" and not overrides.get("remote_kv"):
        kv = r.network["by_purpose"]["kv-transfer"]
        assert kv["moves"] == len(trace)
        assert kv["bytes"] == pytest.approx(
            sum(r.input_tokens for r in trace.requests) * cost.kv_bytes_per_token("llama-3.1-8b")
        )
        assert kv["wire_s"] == pytest.approx(kv["exposed_s"] + kv["hidden_s"])


def test_memory_pressure_queues_then_drains(gen):
    """On an L4 (24 GB: ~5.6 GB of KV room beside 16 GB of weights) long requests wait for
    decode memory, the too-large ones are rejected, and the run still ends."""
    trace = trace_slice(gen, 0, 60)
    r = simulate(trace, arch="disaggregated", hardware="l4", decode_workers=1)
    rec = r.records
    rejected = rec["status"] == REJECTED
    room = 24e9 * 0.9 - cost.weight_bytes("llama-3.1-8b")
    blocks = math.floor(room / (16 * cost.kv_bytes_per_token("llama-3.1-8b")))  # 16-token KV blocks
    need = -(-(rec["input_tokens"] + rec["output_tokens"]) // 16)
    # vLLM's watermark: 1% of the blocks stay free
    too_big = need + math.ceil(0.01 * blocks) > blocks
    assert rejected.tolist() == too_big.tolist() and rejected.any() and not rejected.all()
    assert (rec["status"][~rejected] == DONE).all()
    assert rec["decode_wait_s"][~rejected].max() > 0  # someone waited for HBM
    assert all("exceeds" in why and kind == "too-large" for _, why, kind in r.rejected)
    assert r.summary()["requests_rejected_too_large"] == rejected.sum()


def test_request_larger_than_any_gpu_is_reported_not_hung():
    """On an L4 (~5.6 GB of KV room: ~42,000 tokens) a 100,000-token prompt, within the
    model's trained context, can never run: rejected as too large, the run still ends."""
    reqs = (
        Request(0.0, 1000, 5, (1, 2)),
        Request(0.1, 100_000, 5, _ids(100, 196)),
        Request(0.2, 800, 3, (1, 3)),
    )
    trace = Trace("big", reqs, source="test", generated=True)
    for arch in ARCHS:
        r = simulate(trace, arch=arch, hardware="l4")
        assert r.records["status"].tolist() == [DONE, REJECTED, DONE]
        assert r.rejected[0] == (1, r.rejected[0][1], "too-large")
        assert "room for KV" in r.rejected[0][1]
        s = r.summary()
        assert s["requests_rejected"] == s["requests_rejected_too_large"] == 1
        assert s["requests_completed"] == 2
        assert s["slo_attainment"] <= 2 / 3  # a rejected request missed its SLO
    only_big = Trace("only-big", (reqs[1],), source="test", generated=True)
    s = simulate(only_big, arch="kv-centric", hardware="l4").summary()
    assert s["requests_completed"] == 0 and s["throughput_tokens_per_s"] is None


def test_context_past_the_trained_length_is_refused_per_request():
    """Llama 3.1 8B is trained for 131,072 tokens (max_position_embeddings): a request whose
    prompt plus output passes that is refused at arrival, as vLLM refuses it, even where
    its KV would fit (an H100 holds ~430,000 tokens of it); one token less is served."""
    limit = 131_072
    reqs = (
        Request(0.0, 1000, 5, (1, 2)),
        Request(0.1, limit - 4, 5, _ids(100, 256)),  # 131,073 tokens: one too many
        Request(0.2, limit - 5, 5, _ids(1000, 256)),  # exactly the trained context
    )
    trace = Trace("long", reqs, source="test", generated=True)
    for arch in ARCHS:
        r = simulate(trace, arch=arch)
        check_conserved(r, trace)
        assert r.records["status"].tolist() == [DONE, REJECTED, DONE]
        assert r.rejected == ((1, r.rejected[0][1], "too-long"),)
        assert "131,072" in r.rejected[0][1] and "trained context" in r.rejected[0][1]
        s = r.summary()
        assert s["requests_rejected_too_long"] == 1 and s["requests_rejected_too_large"] == 0


def test_weights_that_do_not_fit_are_bad_input():
    with pytest.raises(KvlabError, match="do not fit"):
        simulate(tiny_trace(), arch="colocated", model="llama-3.1-70b", hardware="h100-sxm")


@pytest.mark.parametrize(
    "bad",
    [
        dict(arch="pd"),
        dict(prefill_workers=0),
        dict(efficiency=1.5),
        dict(arch="colocated", remote_kv=True),
        dict(prefix_cache="nope"),
        dict(link="carrier-pigeon"),
    ],
)
def test_bad_config_is_one_clear_error(bad):
    with pytest.raises(KvlabError):
        simulate(tiny_trace(), **bad)


# ------------------------------------------------------------------ determinism


def _same(a, b):
    for name in a.records.dtype.names:
        np.testing.assert_array_equal(a.records[name], b.records[name])
    np.testing.assert_array_equal(a.token_times_s, b.token_times_s)
    assert a.timeline == b.timeline and a.network == b.network


def test_deterministic_without_randomness(gen):
    trace = trace_slice(gen, 0, 30)
    for arch in ARCHS:
        _same(simulate(trace, arch=arch), simulate(trace, arch=arch))


def test_seed_stability(gen):
    trace = trace_slice(gen, 0, 30)
    a = simulate(trace, arch="colocated", step_jitter=0.25, seed=3)
    b = simulate(trace, arch="colocated", step_jitter=0.25, seed=3)
    c = simulate(trace, arch="colocated", step_jitter=0.25, seed=4)
    _same(a, b)
    assert not np.array_equal(a.token_times_s, c.token_times_s)
    # jitter has mean 1: the seeds agree on the mean decode pace within a few percent
    assert a.summary()["tpot_mean_s"] == pytest.approx(c.summary()["tpot_mean_s"], rel=0.1)


# ------------------------------------------------------------------ direction of effect


def test_more_decode_workers_lower_tpot(gen):
    tpot = [
        simulate(gen, arch="disaggregated", decode_workers=d).summary()["tpot_p50_s"]
        for d in (1, 2, 4)
    ]
    assert tpot[0] > tpot[1] > tpot[2]


def test_faster_link_lower_ttft_in_disaggregated(gen):
    links = ("ethernet-10g", "ib-200g", "ib-400g", "nvlink4")  # 1.25, 25, 50, 450 GB/s
    ttft = [
        simulate(gen, arch="disaggregated", link=link).summary()["ttft_mean_s"] for link in links
    ]
    assert ttft == sorted(ttft, reverse=True) and len(set(ttft)) == len(ttft)


def test_more_prefill_workers_lower_ttft(gen):
    # without a prefix cache: with per-node caches, spreading the requests over more nodes
    # also lowers the hit ratio (24% -> 17% from 2 to 4 nodes here), which can cost more TTFT
    # than an already short queue gives back
    ttft = [
        simulate(gen, arch="disaggregated", prefill_workers=p, prefix_cache="none").summary()[
            "ttft_mean_s"
        ]
        for p in (1, 2, 4)
    ]
    assert ttft[0] > ttft[1] > ttft[2]


def test_overlap_never_slower_on_a_trace(gen):
    for arch in ("disaggregated", "kv-centric"):
        on = simulate(gen, arch=arch, overlap=True).summary()
        off = simulate(gen, arch=arch, overlap=False).summary()
        assert on["ttft_mean_s"] < off["ttft_mean_s"]
        assert on["move_hidden_s"] > off["move_hidden_s"]


requests_strategy = st.lists(
    st.tuples(st.floats(0.0, 0.5), st.integers(1, 20_000), st.integers(1, 60), st.booleans()),
    min_size=1,
    max_size=12,
)


@settings(max_examples=25, deadline=None)
@given(requests_strategy)
def test_overlap_never_slower_per_request(spec):
    """One prefill and one decode GPU: streaming KV during the prefill never delays any
    request's first token (the pipeline is never longer than load-then-compute)."""
    t, reqs, next_id = 0.0, [], 1000
    for gap, n_in, n_out, shares in spec:
        t += gap
        blocks = -(-n_in // 512)
        ids = (1,) + _ids(next_id, blocks - 1) if shares else _ids(next_id, blocks)
        next_id += blocks
        reqs.append(Request(t, n_in, n_out, ids))
    trace = Trace("random", tuple(reqs), source="hypothesis", generated=True)
    kw = dict(arch="disaggregated", prefill_workers=1, decode_workers=1)
    on, off = simulate(trace, overlap=True, **kw), simulate(trace, overlap=False, **kw)
    assert np.all(on.records["ttft_s"] <= off.records["ttft_s"] + 1e-12)


def test_remote_kv_decode_is_a_disaster(gen):
    trace = trace_slice(gen, 0, 30)
    local = simulate(trace, arch="kv-centric").summary()
    remote = simulate(trace, arch="kv-centric", remote_kv=True).summary()
    assert remote["tpot_p50_s"] > 10 * local["tpot_p50_s"]
    assert remote["throughput_tokens_per_s"] < local["throughput_tokens_per_s"] / 5


def test_chunked_prefill_bounds_the_decode_stall(gen):
    r_whole = simulate(gen, arch="colocated", chunk_tokens=0)
    r_chunk = simulate(gen, arch="colocated", chunk_tokens=1024)
    assert r_chunk.records["itl_max_s"].max() < r_whole.records["itl_max_s"].max() / 2


def test_disaggregation_removes_prefill_interference(gen):
    co = simulate(gen, arch="colocated")
    pd = simulate(gen, arch="disaggregated")
    # decode GPUs never run a prefill chunk: their worst gap is a decode step, colocated's a chunk
    assert pd.records["itl_max_s"].max() < co.records["itl_max_s"].max() / 3
    assert (metrics.itl_s(pd.token_times_s, pd.token_offsets) > 0.05).sum() == 0
    assert (metrics.itl_s(co.token_times_s, co.token_offsets) > 0.05).sum() > 100


def test_prefix_pool_saves_prefill(gen):
    none = simulate(gen, arch="kv-centric", pool_bytes_per_node=0)
    some = simulate(gen, arch="kv-centric")
    assert none.prefix_hit_ratio == 0.0 and some.prefix_hit_ratio > 0.1
    busy = lambda r: sum(w["busy_s"] for w in r.workers if w["role"] == "prefill")  # noqa: E731
    assert busy(some) < busy(none)


# ------------------------------------------------------------------ step times from the ledger


@pytest.mark.parametrize("model", ["llama-3.1-8b", "mixtral-8x7b"])
def test_ledger_cost_reproduces_the_ledger(model):
    lc = LedgerCost(Deployment(model, "h200"), max_batch=64)
    for b in (1, 7, 64):
        for ctx in (1, 100, 4096, 32768):
            want = cost.decode_step(lc.deployment, b, ctx).step_time_s
            assert lc.decode_times_s(b, ctx) == pytest.approx(want, rel=1e-12)
    got = lc.decode_times_s(8, np.array([10.0, 5000.0]))
    assert got == pytest.approx(
        [cost.decode_step(lc.deployment, 8, c).step_time_s for c in (10, 5000)], rel=1e-12
    )


def test_remote_steps_reproduce_tiered_decode_step():
    lc = LedgerCost(H100, remote_link="ib-200g", max_batch=32)
    for b, ctx in ((1, 4096), (16, 12000), (32, 100)):
        step, network = lc.remote_decode_times_s(b, ctx)
        want = tiered_decode_step(H100, b, ctx, "ib-200g")
        assert step == pytest.approx(want.step_time_s, rel=1e-12)
        assert network == pytest.approx(want.tier_time_s, rel=1e-12)
    with pytest.raises(KvlabError):
        LedgerCost(H100).remote_decode_times_s(1, 100)


@pytest.mark.parametrize("model", ["llama-3.1-8b", "mixtral-8x7b", "llama-2-7b"])
def test_prefill_times_are_the_ledgers(model):
    """LedgerCost reads the prefill's terms off the ledger once; it must stay the ledger."""
    lc = LedgerCost(Deployment(model, "h100-sxm"))
    for prompt, cached in ((1, 0), (100, 0), (4096, 2048), (50_000, 1_000), (8192, 8191)):
        want = cost.prefill(lc.deployment, prompt, cached)
        got = lc.prefill_times_s(prompt, cached)
        assert got == pytest.approx(
            (want.time_s, want.compute_time_s, want.memory_time_s), rel=1e-9
        )
    cached = np.array([0, 10, 4000])
    got, _, _ = lc.prefill_times_s(4096, cached)
    assert got == pytest.approx(cost.prefill(lc.deployment, 4096, cached).time_s, rel=1e-9)


def test_an_iteration_of_several_chunks_reads_the_weights_once():
    lc = LedgerCost(H100)
    chunks = [(512, 0), (3000, 2500), (100, 0)]
    alone = [float(lc.prefill_times_s(end, start)[0]) for end, start in chunks]
    together = lc.iteration_time_s(0, 0.0, chunks)
    assert max(alone) <= together < sum(alone)
    assert lc.iteration_time_s(0, 0.0, chunks[:1]) == pytest.approx(alone[0])
    assert lc.iteration_time_s(0, 0.0, []) == 0.0


def test_fused_iteration_shares_one_weight_read():
    lc = LedgerCost(H100)
    prefill = cost.prefill(H100, 4096, 2048).time_s
    assert lc.iteration_time_s(0, 0.0, [(4096, 2048)]) == pytest.approx(prefill)
    decode = cost.decode_step(H100, 32, 8000).step_time_s
    fused = lc.iteration_time_s(32, 8000.0, [(4096, 2048)])
    assert max(prefill, decode) <= fused < prefill + decode


def test_link_time_is_the_tiers_fetch_formula():
    link = Link("ib-400g")
    for nbytes in (1.0, 4096.0, 1.6e9):
        assert link.time_s(nbytes) == pytest.approx(
            transfer_time_s(nbytes, 50e9, 1.0, 5e-6), rel=1e-12
        )
    assert link.time_s(0) == 0.0


def test_pipeline_time_hand_checked():
    assert pipeline_time_s(4.0, 2.0, 2) == 5.0  # the longer + one of two pieces of the shorter
    assert pipeline_time_s(0.0, 3.0, 32) == 3.0


@given(st.floats(0, 10), st.floats(0, 10), st.integers(1, 128))
def test_pipeline_between_max_and_sum(a, b, stages):
    t = pipeline_time_s(a, b, stages)
    assert max(a, b) - 1e-12 <= t <= a + b + 1e-12


def test_measured_step_times_plug_in():
    table = BenchCost([1, 64], [0, 100_000], [[0.02, 0.02], [0.02, 0.02]], H100)
    assert float(table.decode_times_s(5, 1234.0)) == pytest.approx(0.02)
    r = simulate(tiny_trace(), SimConfig(arch="disaggregated"), cost=table)
    steps = np.concatenate([np.diff(r.tokens(i)[1:]) for i in range(len(r.records))])
    assert steps.size and np.allclose(steps, 0.02)  # every decode step took the measured 20 ms
    first = np.array(
        [np.diff(r.tokens(i)[:2]) for i in range(len(r.records)) if r.records["tokens"][i] > 1]
    )
    # a joiner waits at most one step
    assert np.all((first >= 0.02 - 1e-12) & (first <= 0.04 + 1e-12))
    lin = BenchCost([1, 3], [0, 1000], [[1.0, 2.0], [3.0, 4.0]], H100)
    assert float(lin.decode_times_s(2, 500.0)) == pytest.approx(2.5)


# ------------------------------------------------- step times from measured kernels


def test_kernel_cost_reproduces_measured_decode_steps():
    """Pure decode steps are kvlab.cost's measured mode (scalar and vectorised paths)."""
    kc = KernelCost(H100_TABLES)
    points = [(1, 1), (1, 4096), (7, 333), (16, 4096), (64, 8000), (200, 1000)]
    for b, ctx in points:
        want = cost.decode_step(H100_TABLES, b, ctx)
        assert float(kc.decode_times_s(b, ctx)) == pytest.approx(want.step_time_s, rel=1e-12)
        assert want.step_time_s > cost.decode_step(H100, b, ctx).step_time_s
    many = np.arange(1000.0, 5000.0, 13.0)  # the vectorised path
    want = [cost.decode_step(H100_TABLES, 8, c).step_time_s for c in many[::50]]
    assert kc.decode_times_s(8, many)[::50] == pytest.approx(want, rel=1e-12)
    assert kc.iteration_time_s(16, 4096.0, []) == pytest.approx(float(kc.decode_times_s(16, 4096)))


def test_kernel_cost_prefill_and_fused_passes():
    kc = KernelCost(H100_TABLES)
    for prompt, cached in ((512, 0), (8192, 0), (4096, 2048), (8192, 8191)):
        want = cost.prefill(H100_TABLES, prompt, cached)
        assert kc.prefill_times_s(prompt, cached)[0] == pytest.approx(want.time_s, rel=1e-12)
        assert kc.iteration_time_s(0, 0.0, [(prompt, cached)]) == pytest.approx(want.time_s)
    prefill = kc.prefill_times_s(4096, 2048)[0]
    decode = float(kc.decode_times_s(32, 8000.0))
    fused = kc.iteration_time_s(32, 8000.0, [(4096, 2048)])
    assert max(prefill, decode) < fused < prefill + decode  # one read of the weights
    chunks = [(512, 0), (3000, 2500), (100, 0)]
    alone = [kc.prefill_times_s(end, start)[0] for end, start in chunks]
    assert max(alone) < kc.iteration_time_s(0, 0.0, chunks) < sum(alone)


def test_kernel_cost_beyond_the_tables_is_continuous_and_counted():
    kc = KernelCost(H100_TABLES)
    edge, _, _ = kc._edge(64)
    contexts = np.array([edge - 1.0, edge, edge + 1.0, 2 * edge, 4 * edge])
    priced, outside = kc.counts()
    steps = kc.decode_times_s(64, contexts)
    assert kc.counts() == (priced + 5, outside + 3)
    assert np.all(np.diff(steps) > 0)
    assert steps[2] == pytest.approx(steps[1], rel=1e-3)  # no jump at the table's edge
    ledger = LedgerCost(H100).decode_times_s(64, contexts)
    assert np.all(steps > ledger)  # held at a measured efficiency, never above the ceiling
    longest = kc._reference_prompt()
    at, past = kc.prefill_times_s(longest, 0)[0], kc.prefill_times_s(longest + 1, 0)[0]
    assert past == pytest.approx(at, rel=1e-3) and past > at
    assert (
        kc.prefill_times_s(4 * longest, 0)[0] > LedgerCost(H100).prefill_times_s(4 * longest, 0)[0]
    )


def test_measured_runs_conserve_requests_and_are_slower(gen):
    for arch in ARCHS:
        ceiling = simulate(gen, arch=arch, prefix_cache="none")
        measured = simulate(gen, arch=arch, prefix_cache="none", efficiency="measured")
        check_run(measured, gen)
        s, c = measured.summary(), ceiling.summary()
        assert s["efficiency"] == "measured" and s["efficiency_source"].startswith("measured")
        assert s["ttft_mean_s"] > c["ttft_mean_s"] and s["tpot_p50_s"] > c["tpot_p50_s"]
        assert 0 < s["steps_priced"] and c["steps_priced"] == 0


def test_measured_single_request_hand_checked():
    """One request on a prefill and a decode GPU: every time is a measured-mode ledger call."""
    m, hw, n_in = "llama-3.1-8b", "h100-sxm", 2048
    trace = Trace("one", (Request(0.0, n_in, 4, _ids(1, 4)),), source="test", generated=True)
    tables = Deployment(m, hw, speed=KernelTables())
    prefill = cost.prefill(tables, n_in).time_s
    wire = transfer_time_s(n_in * cost.kv_bytes_per_token(m), 50e9, 1.0, 5e-6)
    steps = np.cumsum([cost.decode_step(tables, 1, n_in + j).step_time_s for j in range(3)])
    pd = simulate(
        trace,
        arch="disaggregated",
        prefill_workers=1,
        decode_workers=1,
        prefix_cache="none",
        efficiency="measured",
    )
    assert pd.tokens(0) == pytest.approx(prefill + wire + np.concatenate([[0.0], steps]), rel=1e-12)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--hardware", "l4"], "devices with data: a100-80gb, b200, h100-sxm, h200, l40s"),
        (["--kv-dtype", "int8"], "no measured generation attention KV for int8"),
        (["--model", "deepseek-v2-lite"], "MLA"),
    ],
)
def test_cli_measured_without_tables_exit_2(tmp_path, capsys, argv, says):
    path = _write(tiny_trace(), tmp_path / "tiny.jsonl")
    argv = ["simulate", str(path), "--arch", "kv-centric", "--efficiency", "measured", *argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and says in err


def test_efficiency_is_a_fraction_or_measured():
    assert SimConfig(efficiency=" Measured ").efficiency == KernelTables()
    assert SimConfig(efficiency=0.5).efficiency == Ceiling(0.5)
    for bad in ("fast", 0.0, 1.5):
        with pytest.raises(KvlabError):
            SimConfig(efficiency=bad)


# ------------------------------------------------------------------ event loop


def test_event_loop_order_and_time():
    loop, seen = EventLoop(), []

    def record(now, tag):
        seen.append((now, tag))
        if tag == "a":
            return [(now, record, ("a-child",)), (now + 1, record, ("later",))]
        return None

    loop.schedule(1.0, record, "a")
    loop.schedule(1.0, record, "b")  # same time: scheduled order
    loop.schedule(0.5, record, "first")
    assert loop.run() == 2.0
    assert seen == [(0.5, "first"), (1.0, "a"), (1.0, "b"), (1.0, "a-child"), (2.0, "later")]
    with pytest.raises(SimulationError):
        loop.schedule(1.5, record, "past")

    bad = EventLoop()
    bad.schedule(1.0, lambda now: [(now - 0.1, record, ("x",))])
    with pytest.raises(SimulationError, match="in the past"):
        bad.run()


# ------------------------------------------------------------------ golden run


def golden_runs() -> dict:
    trace = tiny_trace()
    variants = {
        "colocated": dict(arch="colocated"),
        "colocated-chunk-1024": dict(arch="colocated", chunk_tokens=1024),
        "disaggregated": dict(arch="disaggregated"),
        "kv-centric": dict(arch="kv-centric"),
        "kv-centric-remote-kv": dict(arch="kv-centric", remote_kv=True),
        # added with the schedulers and paged KV: one GPU, KV room for 166 blocks (2,656 tokens):
        # requests 0 and 1 fit side by side, then outgrow it (a preemption); 6 are too large
        "colocated-prefill-first-tight": dict(
            arch="colocated",
            prefill_workers=1,
            decode_workers=0,
            scheduler="prefill-first",
            memory_fraction=_tight(166.5),
        ),
        "colocated-chunked-tight-swap": dict(
            arch="colocated",
            prefill_workers=1,
            decode_workers=0,
            chunk_tokens=512,
            preemption="swap",
            memory_fraction=_tight(166.5),
        ),
    }
    out = {}
    for name, kw in variants.items():
        r = simulate(trace, **kw)
        s = r.summary()
        out[name] = {
            "summary": {
                k: s[k]
                for k in (
                    "ttft_p50_s",
                    "ttft_p90_s",
                    "tpot_p50_s",
                    "itl_p99_s",
                    "throughput_tokens_per_s",
                    "requests_completed",
                    "prefix_hit_ratio",
                    "move_exposed_s",
                    "move_hidden_s",
                )
            },
            "first_token_s": r.records["first_token_s"].tolist(),
            "finish_s": r.records["finish_s"].tolist(),
            "cached_tokens": r.records["cached_tokens"].tolist(),
            "decode_worker": r.records["decode_worker"].tolist(),
            "bytes": {p: v["bytes"] for p, v in r.network["by_purpose"].items()},
            "preemptions": r.records["preemptions"].tolist(),
        }
    return out


def test_golden_tiny_run():
    got = golden_runs()
    if os.environ.get("KVLAB_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(GOLDEN.read_text())
    assert sorted(got) == sorted(want)
    for name in want:
        for key, value in want[name].items():
            if isinstance(value, dict):
                for k, v in value.items():
                    assert got[name][key][k] == pytest.approx(
                        v, rel=1e-9, abs=1e-12, nan_ok=True
                    ), (name, key, k)
            else:
                assert got[name][key] == pytest.approx(value, rel=1e-9, abs=1e-12, nan_ok=True), (
                    name,
                    key,
                )


# ------------------------------------------------------------------ CLI


def _write(trace: Trace, path: Path) -> Path:
    with path.open("w") as f:
        for r in trace.requests:
            f.write(
                json.dumps(
                    {
                        "timestamp": round(r.arrival_s * 1000),
                        "input_length": r.input_tokens,
                        "output_length": r.output_tokens,
                        "hash_ids": list(r.hash_ids),
                    }
                )
                + "\n"
            )
    return path


def test_cli_json_contract(tmp_path, capsys):
    path = _write(tiny_trace(), tmp_path / "tiny.jsonl")
    assert main(["simulate", str(path), "--arch", "kv-centric", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in (
        "ttft_p50_s",
        "ttft_p90_s",
        "tpot_p50_s",
        "itl_p99_s",
        "throughput_tokens_per_s",
        "requests_completed",
        "prefix_hit_ratio",
    ):
        assert key in out
    assert out["requests_completed"] == 10 and out["arch"] == "kv-centric"
    records = tmp_path / "records.csv"
    assert (
        main(
            [
                "simulate",
                str(path),
                "--arch",
                "colocated",
                "--prefill-workers",
                "1",
                "--decode-workers",
                "1",
                "--limit",
                "4",
                "--records",
                str(records),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "TTFT" in text and "colocated" in text
    lines = records.read_text().splitlines()
    assert lines[0].startswith("request,status") and len(lines) == 5


@pytest.mark.parametrize(
    "argv",
    [
        ["--arch", "colocated", "--remote-kv"],
        ["--arch", "disaggregated", "--decode-workers", "0"],
        ["--arch", "kv-centric", "--link", "wifi"],
        ["--arch", "kv-centric", "--duration", "-3"],
        ["--arch", "kv-centric", "--records", "out.txt"],
    ],
)
def test_cli_bad_input_exit_2(tmp_path, capsys, argv):
    path = _write(tiny_trace(), tmp_path / "tiny.jsonl")
    assert main(["simulate", str(path), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "error" in err


def test_single_request_hand_checked():
    """One request, one prefill and one decode GPU, no prefix cache: every time is a ledger call."""
    m, hw, n_in = "llama-3.1-8b", "h100-sxm", 2048
    trace = Trace("one", (Request(0.0, n_in, 4, _ids(1, 4)),), source="test", generated=True)
    prefill = cost.prefill(Deployment(m, hw), n_in).time_s
    # the default link, ib-400g: 400 Gb/s = 50 GB/s, 5 us a message
    wire = transfer_time_s(n_in * cost.kv_bytes_per_token(m), 50e9, 1.0, 5e-6)
    steps = np.cumsum([cost.decode_step(H100, 1, n_in + j).step_time_s for j in range(3)])
    kw = dict(prefill_workers=1, decode_workers=1, prefix_cache="none")

    pd = simulate(trace, arch="disaggregated", **kw)
    assert pd.tokens(0) == pytest.approx(prefill + wire + np.concatenate([[0.0], steps]), rel=1e-12)
    assert pd.records["transfer_exposed_s"][0] == pytest.approx(wire)

    # the KV streams out layer by layer: one layer is left
    kv = simulate(trace, arch="kv-centric", **kw)
    assert wire < prefill
    assert kv.records["ttft_s"][0] == pytest.approx(prefill + wire / 32, rel=1e-12)
    assert kv.network["by_purpose"]["kv-transfer"]["hidden_s"] == pytest.approx(wire - wire / 32)

    co = simulate(trace, arch="colocated", chunk_tokens=0, **kw)
    assert co.tokens(0) == pytest.approx(prefill + np.concatenate([[0.0], steps]), rel=1e-12)


def test_host_overhead_per_iteration_hand_checked():
    """--step-overhead adds its seconds to every engine iteration: the prefill (one pass)
    and each decode step, disaggregated and colocated (chunked and unchunked); the CLI
    reads the flag and the summary names the source."""
    m, hw, n_in, o = "llama-3.1-8b", "h100-sxm", 2048, 0.03
    trace = Trace("one", (Request(0.0, n_in, 4, _ids(1, 4)),), source="test", generated=True)
    prefill = cost.prefill(Deployment(m, hw), n_in).time_s
    wire = transfer_time_s(n_in * cost.kv_bytes_per_token(m), 50e9, 1.0, 5e-6)
    steps = np.cumsum([cost.decode_step(H100, 1, n_in + j).step_time_s + o for j in range(3)])
    kw = dict(prefill_workers=1, decode_workers=1, prefix_cache="none", step_overhead_s=o)
    pd = simulate(trace, arch="disaggregated", **kw)
    first = prefill + o + wire
    assert pd.tokens(0) == pytest.approx(first + np.concatenate([[0.0], steps]), rel=1e-12)
    assert "30 ms of host time" in pd.summary()["efficiency_source"]
    co = simulate(trace, arch="colocated", chunk_tokens=0, **kw)
    assert co.tokens(0) == pytest.approx(prefill + o + np.concatenate([[0.0], steps]), rel=1e-12)
    chunked = simulate(trace, arch="colocated", chunk_tokens=1024, **kw)  # two passes
    plain = simulate(trace, arch="colocated", chunk_tokens=1024, **{**kw, "step_overhead_s": 0})
    assert np.diff(chunked.tokens(0)) == pytest.approx(np.diff(plain.tokens(0)) + o, rel=1e-9)
    assert chunked.tokens(0)[0] == pytest.approx(plain.tokens(0)[0] + 2 * o, rel=1e-9)
    with pytest.raises(KvlabError, match="step_overhead_s"):
        SimConfig(step_overhead_s=-1.0)


def test_tensor_parallel_instance_hand_checked():
    """Llama 3.1 70B on A800s at tensor parallel 4, as engines run it: every step is the
    ledger's tensor-parallel step (all-reduces included), and the KV moves over the
    instance's four NICs at once."""
    m, hw, n_in, tp = "llama-3.1-70b", "a800-80gb", 2048, 4
    d = Deployment(m, hw, tensor_parallel=tp)
    trace = Trace("one", (Request(0.0, n_in, 4, _ids(1, 4)),), source="test", generated=True)
    prefill = cost.prefill(d, n_in).time_s
    # every GPU sends its share of the KV (its K/V heads) over its own 400 Gb/s NIC
    wire = transfer_time_s(n_in * tp * d.kv_bytes_per_token, tp * 50e9, 1.0, 5e-6)
    steps = np.cumsum([cost.decode_step(d, 1, n_in + j).step_time_s for j in range(3)])
    kw = dict(prefill_workers=1, decode_workers=1, prefix_cache="none", tensor_parallel=tp)
    pd = simulate(trace, arch="disaggregated", model=m, hardware=hw, **kw)
    assert pd.tokens(0) == pytest.approx(prefill + wire + np.concatenate([[0.0], steps]), rel=1e-12)
    assert pd.summary()["gpus"] == 2 * tp
    assert steps[0] > 0 and cost.decode_step(d, 1, n_in).allreduce_time_s > 0


def test_measured_prompt_past_the_all_reduce_table():
    """A 70B prompt of ~87k tokens at TP8 sends all-reduce messages past the largest one the
    tables measured (64k tokens x 8192): it keeps that message's bandwidth, with no NaN and
    no jump (it was NaN, and the replay stopped with an event 'at nan')."""
    d = Deployment("llama-3.1-70b", "a800-80gb", speed=KernelTables(), tensor_parallel=8)
    kc = KernelCost(d)
    edge = 65536
    at, past, far = (kc.prefill_times_s(n, 0)[0] for n in (edge, edge + 1, 2 * edge))
    assert np.isfinite(far) and far > past > at
    assert past == pytest.approx(at, rel=1e-3)
    ar = kc.kernels.allreduce_s(np.array([edge, 2.0 * edge]))[0]
    assert ar[1] == pytest.approx(2 * ar[0], rel=1e-3)  # bandwidth-bound: twice the message
    r = simulate(
        Trace("long", (Request(0.0, 87_169, 4, _ids(1, 171)),), source="test", generated=True),
        arch="colocated",
        model="llama-3.1-70b",
        hardware="a800-80gb",
        tensor_parallel=8,
        efficiency="measured",
        scheduler="prefill-first",
        prefill_workers=1,
        decode_workers=0,
    )
    assert r.summary()["requests_completed"] == 1 and r.summary()["steps_priced_outside_tables"]


@pytest.mark.parametrize("arch", ARCHS)
def test_tensor_parallel_instances_conserve_requests(gen, arch):
    r = simulate(gen, arch=arch, tensor_parallel=2, prefill_workers=1, decode_workers=1)
    check_run(r, gen)
    one = simulate(gen, arch=arch, prefill_workers=1, decode_workers=1)
    assert r.summary()["gpus"] == 2 * one.summary()["gpus"]
    assert r.summary()["tpot_p50_s"] < one.summary()["tpot_p50_s"]  # each step split two ways


def test_an_instance_holds_its_gpus_memory():
    """70B in fp16 leaves no room for KV on one 80 GB GPU; four of them hold it and 4 x the
    room each GPU keeps beside its quarter of the weights."""
    small = tiny_trace()
    with pytest.raises(KvlabError, match="more tensor parallelism"):
        simulate(small, arch="colocated", model="llama-3.1-70b", hardware="h100-sxm")
    r = simulate(
        small, arch="colocated", model="llama-3.1-70b", hardware="h100-sxm", tensor_parallel=4
    )
    check_run(r, small)
    d = Deployment("llama-3.1-70b", "h100-sxm", tensor_parallel=4)
    sim = Simulation(small, SimConfig(model="llama-3.1-70b", tensor_parallel=4))
    sim._build()
    assert sim.kv_room_bytes == pytest.approx(4 * (0.9 * 80e9 - d.weight_bytes))
    assert sim.kv_bytes_per_token == 4 * d.kv_bytes_per_token
    with pytest.raises(KvlabError, match="tensor_parallel must be <= 8|one of"):
        SimConfig(tensor_parallel=16)


# ------------------------------------------------- one rule for the tokens a hit serves


def _spaced(trace: Trace, gap_s: float = 1000.0) -> Trace:
    """The same requests, far enough apart that each prefill ends before the next arrives
    (so the simulator's cache holds exactly what a sequential replay's does)."""
    reqs = tuple(
        Request(i * gap_s, r.input_tokens, r.output_tokens, r.hash_ids)
        for i, r in enumerate(trace.requests)
    )
    return Trace(trace.name, reqs, source=trace.source, generated=trace.generated)


@pytest.mark.parametrize(
    "trace",
    [
        Trace(
            "repeat",
            (Request(0.0, 1024, 4, (1, 2)), Request(1.0, 1024, 4, (1, 2))),
            source="test",
            generated=True,
        ),
        tiny_trace(),
    ],
)
def test_replay_and_simulator_agree_on_hit_ratio(trace):
    """replay() and simulate() count served prompt tokens with one rule (kvlab.prompt): a
    prompt seen before in full still computes its last token."""

    spaced = _spaced(trace)
    replayed = replay(spaced, math.inf).token_hit_ratio
    simulated = simulate(
        spaced, arch="kv-centric", prefill_workers=1, decode_workers=1, pool_bytes_per_node=1e15
    ).summary()["prefix_hit_ratio"]
    assert simulated == pytest.approx(replayed, rel=1e-12)
    if trace.name == "repeat":  # the second request serves 1023 of its 1024 tokens
        assert replayed == pytest.approx(1023 / 2048)


def test_served_tokens_rule():
    assert served_tokens(4096, 4096) == 4095
    assert served_tokens(0, 1) == 0 and served_tokens(5, 1) == 0
    assert served_from_blocks(3, 512, 1100) == 1099
    np.testing.assert_array_equal(
        served_tokens(np.array([0, 100, 500]), np.array([10, 200, 300])), [0, 100, 299]
    )


# --------------------------------------------------------- schedulers, paged KV, preemption

LONG = "poisson:rate=4,prompt=lognormal(3000,0.6),output=lognormal(400,0.6),requests=120,seed=1"


def _tight(blocks: int, model: str = "llama-3.1-8b", hbm_bytes: float = 80e9) -> float:
    """The memory_fraction of an H100 that leaves room for `blocks` 16-token KV blocks."""
    return (cost.weight_bytes(model) + blocks * 16 * cost.kv_bytes_per_token(model)) / hbm_bytes


def check_conserved(result, trace) -> None:
    """Every request completes or is rejected exactly once; a completed one got exactly its
    output tokens, in time order, whatever preemptions it went through."""
    rec = result.records
    assert rec.size == len(trace)
    assert np.isin(rec["status"], (DONE, REJECTED)).all()
    done = rec["status"] == DONE
    assert rec["tokens"][done].tolist() == [
        r.output_tokens for r, d in zip(trace.requests, done, strict=True) if d
    ]
    assert (rec["tokens"][~done] == 0).all()
    assert sorted(i for i, _, _ in result.rejected) == np.flatnonzero(~done).tolist()
    for i in np.flatnonzero(done):
        assert np.all(np.diff(result.tokens(i)) >= 0)
    s = result.summary()  # over the measured requests: all but the lead-in
    assert s["requests_completed"] + s["requests_rejected"] == len(trace) - trace.lead_in
    assert s["requests_rejected"] == (
        s["requests_rejected_early"]
        + s["requests_rejected_too_large"]
        + s["requests_rejected_too_long"]
    )
    assert (
        s["preemptions"]
        == rec["preemptions"].sum()
        == sum(w["preemptions"] for w in result.workers)
    )


@pytest.mark.parametrize("arch", ["colocated", "disaggregated"])
@pytest.mark.parametrize("scheduler", ["prefill-first", "chunked", "decode-first"])
@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_conservation_with_preemption(arch, scheduler, preemption):
    trace = trace_slice(LONG, 0)
    kw = (
        dict(prefill_workers=1, decode_workers=1)
        if arch == "disaggregated"
        else dict(prefill_workers=1, decode_workers=0)
    )
    r = simulate(
        trace,
        arch=arch,
        scheduler=scheduler,
        preemption=preemption,
        memory_fraction=_tight(2000),
        **kw,
    )
    check_conserved(r, trace)
    s = r.summary()
    assert s["preemptions"] > 0 and s["requests_completed"] == len(trace)
    swap = r.network["by_purpose"]["preempt-swap"]
    if preemption == "swap":  # out and back in, over PCIe, every byte counted
        assert s["swapped_bytes"] > 0 and swap["bytes"] == pytest.approx(s["swapped_bytes"])
        assert swap["link"] == "pcie5-x16" and swap["moves"] == 2 * s["preemptions"]
    else:
        assert s["swapped_bytes"] == 0 and swap["moves"] == 0


def test_preemption_shows_in_the_token_gap_tails():
    """A preempted request waits for its recompute (or its swap back): its worst token gap
    is longer than any never-preempted request's, and roomier memory preempts nobody."""
    trace = trace_slice(LONG, 0)
    kw = dict(arch="colocated", prefill_workers=1, decode_workers=0, chunk_tokens=512)
    tight = simulate(trace, memory_fraction=_tight(2000), **kw)
    roomy = simulate(trace, **kw)
    hit = tight.records["preemptions"] > 0
    assert hit.any() and roomy.summary()["preemptions"] == 0
    worst = tight.records["itl_max_s"]
    assert np.nanmedian(worst[hit]) > np.nanmax(worst[~hit])
    assert tight.summary()["itl_max_s"] > roomy.summary()["itl_max_s"]


#: Two requests whose KV fits side by side at first (2 x 32 of 100 blocks) but not once both
#: have grown to 900 tokens (2 x 57 blocks); either alone fits.
TWO = Trace(
    "two",
    (Request(0.0, 500, 400, (1,)), Request(0.01, 500, 400, (2,))),
    source="test",
    generated=True,
)


def test_recompute_pays_a_prefill_of_prompt_plus_generated_tokens():
    """Two requests on one GPU whose KV cannot both grow: the newer one is preempted, and
    its token gap across the preemption holds a ledger prefill of everything it held."""
    m = "llama-3.1-8b"
    # 100 blocks: 1,600 tokens
    r = simulate(
        TWO,
        arch="colocated",
        prefill_workers=1,
        decode_workers=0,
        prefix_cache="none",
        scheduler="prefill-first",
        memory_fraction=_tight(100.5),
    )
    check_conserved(r, TWO)
    assert r.records["preemptions"].tolist() == [0, 1]
    gaps = np.diff(r.tokens(1))
    produced = int(np.argmax(gaps)) + 1  # tokens made before the preemption
    # 2 x 32 blocks at first; both grow a block every 16 steps until 2 x 50 = 100 blocks are held
    assert 16 * 49 - 500 < produced <= 16 * 50 - 500
    recompute = cost.prefill(Deployment(m, "h100-sxm"), 500 + produced).time_s
    assert gaps.max() >= recompute
    assert r.records["finish_s"][0] < r.records["finish_s"][1]  # the older request never waited


def test_swap_moves_the_kv_over_the_host_link():
    r = simulate(
        TWO,
        arch="colocated",
        prefill_workers=1,
        decode_workers=0,
        prefix_cache="none",
        scheduler="prefill-first",
        preemption="swap",
        memory_fraction=_tight(100.5),
    )
    check_conserved(r, TWO)
    assert r.records["preemptions"].tolist() == [0, 1]
    swap = r.network["by_purpose"]["preempt-swap"]
    kv = cost.kv_bytes_per_token("llama-3.1-8b")
    per_move = swap["bytes"] / 2
    assert per_move % (16 * kv) == 0  # whole blocks
    assert swap["bytes"] == r.records["swapped_bytes"][1] and r.records["swapped_bytes"][0] == 0
    gaps = np.diff(r.tokens(1))
    assert gaps.max() >= 2 * Link("pcie5-x16").time_s(per_move)  # out, then back in


def test_schedulers_trade_ttft_for_token_gaps():
    """prefill-first stalls every stream for each new prompt; decode-first makes prompts
    wait instead; chunked keeps the worst gap near one budget-sized iteration."""
    trace = trace_slice(
        "poisson:rate=3,prompt=lognormal(6000,0.5),output=200,requests=80,seed=3", 0
    )
    run = {
        s: simulate(
            trace,
            arch="colocated",
            prefill_workers=1,
            decode_workers=0,
            scheduler=s,
            chunk_tokens=2048 if s == "chunked" else None,
        ).summary()
        for s in ("prefill-first", "chunked", "decode-first")
    }
    assert run["chunked"]["itl_max_s"] < run["prefill-first"]["itl_max_s"]
    assert run["decode-first"]["ttft_mean_s"] > run["prefill-first"]["ttft_mean_s"]
    assert run["decode-first"]["itl_p90_s"] <= run["prefill-first"]["itl_p90_s"]
    for s in run.values():
        assert s["requests_completed"] == 80


def test_smaller_chunk_shortens_the_worst_token_gaps_on_long_prompts():
    trace = trace_slice(
        "poisson:rate=1,prompt=lognormal(16000,0.3),output=300,requests=40,seed=4", 0
    )
    worst = [
        simulate(
            trace, arch="colocated", prefill_workers=1, decode_workers=0, chunk_tokens=c
        ).summary()["itl_max_s"]
        for c in (8192, 2048, 512)
    ]
    assert worst[0] > worst[1] > worst[2]


def test_engine_chunk_default_follows_vllm():
    assert [engine_chunk_tokens(h) for h in ("h100-sxm", "h200", "mi300x")] == [8192] * 3
    assert [engine_chunk_tokens(h) for h in ("a100-80gb", "l40s", "l4")] == [2048] * 3
    assert SimConfig(arch="colocated").resolved().chunk_tokens == 8192
    assert SimConfig(arch="colocated", hardware="a100-80gb").resolved().chunk_tokens == 2048
    assert SimConfig(arch="colocated", scheduler="prefill-first").resolved().chunk_tokens == 0
    assert SimConfig(arch="colocated", chunk_tokens=512).resolved().chunk_tokens == 512


def test_attainment_falls_as_load_rises():
    att, goodput = [], []
    for rate in (4, 16, 64):
        trace = trace_slice(
            f"poisson:rate={rate},prompt=lognormal(2048,0.5),output=lognormal(256,0.5),"
            "requests=400,seed=2",
            0,
        )
        s = simulate(
            trace, arch="disaggregated", prefill_workers=1, decode_workers=1, ttft_slo_s=2.0
        ).summary()
        att.append(s["slo_attainment"])
        goodput.append(s["goodput_requests_per_s"])
    assert att[0] >= att[1] > att[2] and att[0] == 1.0
    assert goodput[1] > goodput[2]  # past saturation the queue eats the goodput


def test_early_rejection_keeps_goodput_under_overload():
    trace = trace_slice(
        "poisson:rate=64,prompt=lognormal(2048,0.5),output=lognormal(256,0.5),requests=400,seed=2",
        0,
    )
    kw = dict(
        arch="disaggregated", prefill_workers=1, decode_workers=1, ttft_slo_s=2.0, tbt_slo_s=0.1
    )
    plain = simulate(trace, **kw)
    early = simulate(trace, early_reject=True, **kw)
    check_conserved(early, trace)
    p, e = plain.summary(), early.summary()
    assert p["requests_rejected"] == 0 and e["requests_rejected_early"] > 0
    assert e["requests_rejected_too_large"] == 0
    assert all(kind == "early" and "predicted" in why for _, why, kind in early.rejected)
    assert e["goodput_requests_per_s"] > 2 * p["goodput_requests_per_s"]
    light = trace_slice(
        "poisson:rate=2,prompt=lognormal(2048,0.5),output=lognormal(256,0.5),requests=100,seed=2", 0
    )
    # nobody turned away
    assert simulate(light, early_reject=True, **kw).summary()["requests_rejected"] == 0


def test_early_rejection_and_too_large_are_counted_apart():
    reqs = tuple(Request(0.001 * i, 4000, 50, _ids(10 * i, 8)) for i in range(1, 60))
    big = Request(0.0, 100_000, 5, _ids(10_000, 196))
    trace = Trace("mixed", (big, *reqs), source="test", generated=True)
    r = simulate(
        trace,
        arch="colocated",
        hardware="l4",
        prefill_workers=1,
        decode_workers=0,
        early_reject=True,
        ttft_slo_s=0.5,
    )
    s = r.summary()
    assert s["requests_rejected_too_large"] == 1 and s["requests_rejected_early"] > 0
    assert r.rejected[0] == (0, r.rejected[0][1], "too-large")
    check_conserved(r, trace)


def test_routers_and_schedulers_are_registries():
    assert set(SCHEDULERS) == {"prefill-first", "chunked", "decode-first"}
    assert (
        PREFILL_ROUTERS["cache-aware"](1.0, 2.0) == 3.0
        and PREFILL_ROUTERS["least-loaded"](1.0, 2.0) == 1.0
    )
    assert set(DECODE_ROUTERS) == {"least-loaded", "free-hbm"}
    with pytest.raises(KvlabError, match="scheduler"):
        SimConfig(scheduler="fifo")


# ------------------------------------------------- CLI: schedulers, workloads, hostile input

POISSON_CLI = (
    "poisson:rate=20,prompt=lognormal(2048,0.5),output=lognormal(128,0.5),requests=200,seed=5"
)


@pytest.mark.parametrize("scheduler", ["prefill-first", "chunked", "decode-first"])
def test_cli_schedulers_and_early_rejection(capsys, scheduler):
    argv = [
        "simulate",
        POISSON_CLI,
        "--arch",
        "colocated",
        "--prefill-workers",
        "1",
        "--decode-workers",
        "0",
        "--scheduler",
        scheduler,
        "--early-reject",
        "--ttft-slo",
        "0.5",
        "--tbt-slo",
        "0.05",
        "--memory-fraction",
        str(_tight(3000)),
        "--json",
    ]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scheduler"] == out["config"]["scheduler"] == scheduler
    assert out["requests_completed"] + out["requests_rejected"] == 200
    assert out["requests_rejected"] == out["requests_rejected_early"] > 0
    assert out["early_reject"] and out["config"]["ttft_slo_s"] == 0.5 and out["ttft_slo_s"] == 0.5
    assert out["trace"].startswith("poisson:rate=20,") and out["generated"]
    assert main(argv[:-1]) == 0  # the text report says the same
    text = capsys.readouterr().out
    assert f"{scheduler} scheduler" in text and "rejected early" in text


def test_cli_defaults_come_from_simconfig(capsys):
    args = build_parser().parse_args(["simulate", "x.jsonl", "--arch", "colocated"])
    names = {f.name for f in dataclasses.fields(SimConfig)}
    assert names & set(vars(args)) == {"arch"}  # unset flags leave SimConfig's defaults alone
    assert main(["simulate", POISSON_CLI, "--arch", "colocated", "--json"]) == 0
    config = json.loads(capsys.readouterr().out)["config"]
    assert config == SimConfig(arch="colocated").resolved().to_dict()


def test_cli_json_is_the_same_bytes_every_run(capsys):
    argv = ["simulate", POISSON_CLI, "--arch", "kv-centric", "--json"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert main(argv) == 0
    assert capsys.readouterr().out == first and "wall_s" not in first
    assert main([*argv, "--timing"]) == 0
    assert json.loads(capsys.readouterr().out)["wall_s"] > 0


@pytest.mark.parametrize("bad", ["nan", "inf", "1e400", "-1", "2.5", "lots"])
def test_cli_chunk_tokens_hostile_numbers(capsys, bad):
    assert main(["simulate", POISSON_CLI, "--arch", "colocated", "--chunk-tokens", bad]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "chunk" in err


def test_cli_records_paths(tmp_path, capsys):
    argv = ["simulate", POISSON_CLI, "--arch", "colocated", "--limit", "5", "--records"]
    folder = tmp_path / "out.csv"
    folder.mkdir()
    for path in (
        str(folder),
        str(tmp_path / "missing" / "r.csv"),
        "/proc/kvlab-cannot/r.jsonl",
        str(tmp_path),
    ):
        assert main([*argv, path]) == 2, path
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "--records" in err
    good = tmp_path / "r.jsonl"
    old = os.umask(0o022)
    try:
        assert main([*argv, str(good)]) == 0
    finally:
        os.umask(old)
    assert good.stat().st_mode & 0o777 == 0o644
    rows = [json.loads(line) for line in good.read_text().splitlines()]
    assert len(rows) == 5 and {"preemptions", "swapped_bytes"} <= set(rows[0])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file left


# ------------------------------------------------- warm-up, rate scale, flags that do nothing


def test_warmup_raises_the_hit_ratio_of_the_same_requests(gen):
    """The same measured window, cold and led in by 60 s of the trace: the lead-in fills
    the prefix caches, so more of the measured prompts are served from them; the lead-in
    runs (conservation) but is left out of every figure."""
    cold = trace_slice(gen, 60, 40)
    warm = trace_slice(gen, 60, 40, warmup_s=60)
    assert warm.lead_in > 0 and len(warm) - warm.lead_in == len(cold)
    assert [r.input_tokens for r in warm.requests[warm.lead_in :]] == [
        r.input_tokens for r in cold.requests
    ]
    for arch in ("colocated", "kv-centric"):
        c, w = simulate(cold, arch=arch), simulate(warm, arch=arch)
        check_conserved(w, warm)
        assert w.prefix_hit_ratio > c.prefix_hit_ratio + 0.03
        s = w.summary()
        assert s["requests"] == len(cold) and s["requests_warmup"] == warm.lead_in
        assert s["requests_completed"] == len(cold)
        assert s["tokens_generated"] == sum(r.output_tokens for r in cold.requests)
        assert int(w.records["measured"].sum()) == len(cold)


def test_warmup_slices_are_clipped_at_the_trace_start(gen):
    t = trace_slice(gen, 10, 20, warmup_s=100)
    assert t.requests[0].arrival_s == 0.0 and "warm-up 10 s" in t.name
    assert trace_slice(gen, 0, 20, warmup_s=50).lead_in == 0


def test_rate_scale_replays_the_same_requests_faster(gen):
    sliced = trace_slice(gen, 0, 60)
    fast = scale_arrivals(sliced, 2.0)
    assert measured_rate_per_s(fast) == pytest.approx(2 * measured_rate_per_s(sliced))
    assert [r.hash_ids for r in fast.requests] == [r.hash_ids for r in sliced.requests]
    slow, quick = simulate(sliced, arch="colocated"), simulate(fast, arch="colocated")
    assert quick.summary()["duration_s"] < slow.summary()["duration_s"]
    with pytest.raises(KvlabError):
        scale_arrivals(sliced, 0.0)


def test_cli_warmup_and_rate_scale(capsys):
    base = ["simulate", POISSON_CLI, "--arch", "colocated", "--json"]
    assert main([*base, "--warmup", "2", "--limit", "20"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["requests"] == 20 and out["requests_warmup"] > 0 and "warm-up 2 s" in out["trace"]
    assert main([*base, "--limit", "20", "--rate-scale", "0.5"]) == 0
    slow = json.loads(capsys.readouterr().out)
    assert main([*base, "--limit", "20"]) == 0
    assert slow["duration_s"] > json.loads(capsys.readouterr().out)["duration_s"]
    for bad in (["--warmup", "-1"], ["--rate-scale", "0"], ["--warmup", "nan"]):
        assert main([*base, *bad]) == 2
        assert capsys.readouterr().err.count("\n") == 1


def test_the_scheduler_says_what_it_acts_on(capsys):
    """Apart from a colocated cluster, the scheduler and its budget only order a decode
    GPU's recomputes of preempted sequences; the JSON and the report say so."""
    for arch, scope in (("colocated", "every GPU"), ("kv-centric", "recomputes")):
        assert main(["simulate", POISSON_CLI, "--arch", arch, "--limit", "5", "--json"]) == 0
        assert scope in json.loads(capsys.readouterr().out)["scheduler_scope"]
    assert main(["simulate", POISSON_CLI, "--arch", "disaggregated", "--limit", "5"]) == 0
    assert "on decode GPUs' recomputes of preempted sequences only" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--link", "hbm3"], "--link 'hbm3' is a memory tier, not a link"),
        (["--host-link", "hbm3e"], "--host-link 'hbm3e' is a memory tier, not a link"),
        (["--link", "ib-800g"], "unknown link 'ib-800g'"),
    ],
)
def test_memory_tiers_are_not_links(capsys, argv, says):
    assert main(["simulate", POISSON_CLI, "--arch", "disaggregated", *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1
    with pytest.raises(KvlabError, match="not a link"):
        SimConfig(link="ddr5")


def test_cli_records_path_checked_before_the_run(tmp_path, capsys):
    argv = ["simulate", POISSON_CLI, "--arch", "colocated", "--limit", "5", "--records"]
    a_file = tmp_path / "data"
    a_file.write_text("x")
    for path, says in (
        (str(a_file / "x.jsonl"), "is a file, not a folder"),
        (str(a_file / "deeper" / "x.csv"), "is a file, not a folder"),
        (str(tmp_path / ("z" * 300 + ".csv")), "too long"),
    ):
        assert main([*argv, path]) == 2, path
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1
    assert not [p for p in tmp_path.iterdir() if p.name != "data"]


@pytest.mark.parametrize(
    "trace, says",
    [
        ("poisson:rate=1e-15,prompt=100,output=5,requests=3", "beyond 4.29e+09 s"),
        ("poisson:rate=1e-308,prompt=100,output=5,requests=2", "beyond 4.29e+09 s"),
        ("poisson:rate=10,prompt=100,output=1000,requests=1e5", "output tokens"),
        ("poisson:rate=10,prompt=1e7,output=5,requests=1e4", "blocks of 512 tokens"),
    ],
)
def test_workloads_that_cannot_run_are_refused_before_they_start(capsys, trace, says):
    """Arrivals past the clock's resolution, or more tokens than memory holds: one line,
    exit 2, before any work (formerly TTFT of 0.0, numpy warnings, or memory exhausted)."""
    assert main(["simulate", trace, "--arch", "colocated", "--json"]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


def test_a_lone_request_at_a_tiny_rate_is_timed_right():
    r = simulate("poisson:rate=1e-300,prompt=1000,output=20,requests=1", arch="colocated")
    s = r.summary()
    assert s["ttft_p50_s"] > 0 and s["itl_p50_s"] > 0


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(
    st.integers(1, 64),
    st.lists(st.integers(-300, 5000), min_size=1, max_size=12),
    st.lists(st.integers(0, 4000), min_size=1, max_size=6),
    st.integers(0, 11),
)
def test_blocks_held_by_decoding_sequences_is_the_sum_of_ceilings(block, offsets, steps, gone):
    """The engine's block count (kept as sums, updated as sequences join and leave) is
    sum(ceil((offset + step) / block_tokens)) over the sequences decoding, at every step."""
    engine = object.__new__(Engine)
    engine.paged, engine.block_tokens, engine.sim = True, block, SimpleNamespace(window=0)
    engine._offsets, engine._q_sum, engine._remainders = {}, 0, []
    for i, offset in enumerate(offsets):
        engine._offsets[i] = offset
        engine._track_offset(offset, 1)
    if gone < len(offsets) - 1:  # one leaves (the engine removes its offset as it goes)
        engine._track_offset(engine._offsets.pop(gone), -1)
    for step in steps:
        held = [o + step for o in engine._offsets.values()]
        assert engine._blocks_at(step) == sum(-(-h // block) for h in held)

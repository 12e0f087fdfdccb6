"""kvlab.book: the chapters' figure data and the numbers their prose states.

The notebooks (nbval) run every chapter's `numbers()` on the real traces; these tests
check the data behind them on small inputs, by hand where the article gives a number."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from kvlab import cost, fmt, kernel_tables, tiers, traces
from kvlab.book import bandwidth_wall as ch2
from kvlab.book import (
    beyond_hbm,
    gpu_tables,
    kv_centric,
    measured,
    metrics_and_diagnosis,
    past_the_ceiling,
    prefix_caching,
    sim_runs,
    what_a_hit_saves,
)
from kvlab.book import past_the_ceiling as ch
from kvlab.book.bandwidth_wall import NIC, flash_attention_effect, tier_step_ratios
from kvlab.book.beyond_hbm import hit_conditions
from kvlab.book.catalog import panels
from kvlab.book.prefix_caching import shared_requests_words
from kvlab.deployment import Deployment
from kvlab.grids import BATCH_GRID
from kvlab.jsonsafe import jsonable
from kvlab.operators import operator_work, pass_counts
from kvlab.sim import ARCHS, trace_at_rate, trace_slice
from kvlab.speculative import speculative_step
from kvlab.tiers import series
from kvlab.traces.generate import generate_trace
from kvlab.viz import Panel, i18n

LLAMA_8B = Deployment("llama-3.1-8b", "h100-sxm")

MiB, GiB = 2**20, 2**30


@pytest.fixture(scope="module")
def gen():
    """A generated conversation workload: 250 requests over ~105 s, long prompts, shared prefix."""
    return generate_trace("conversation", seed=0, requests=250)


# ------------------------------------------------------------------ chapter 3


def test_article_numbers_are_book_ready():
    a = beyond_hbm.article_numbers()
    assert a["kv_bytes_4k_request"] == 512 * MiB and a["kv_bytes_32_requests"] == 16 * GiB
    assert a["transfer_s"]["ethernet-10g"] == pytest.approx(0.4295, abs=1e-4)
    assert a["transfer_s"]["200 GB/s"] == pytest.approx(2.684e-3, rel=1e-3)
    assert a["transfer_s"]["ib-200g (200 Gb/s)"] == pytest.approx(21.47e-3, rel=1e-3)
    # one decode step at the article's 2 TB/s: 14.54 GB / 2e12 = 7.27 ms, the same order as 2.7 ms
    assert a["decode_step_s"] == pytest.approx(7.2685e-3, rel=1e-4)
    json.dumps(jsonable(a), allow_nan=False)


def test_tier_series_are_plot_ready():
    from kvlab.viz.beyond_hbm import PD_LINKS  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    article = Deployment("article-7b", "h100-sxm")
    t = series.tier_throughput_series(article, 32)
    hr = series.hit_rate_series(Deployment("llama-2-7b", "h100-sxm"), 4096, np.linspace(0, 1, 11))
    pd = series.pd_series(article, 4096, 1, PD_LINKS)
    for data in (t, hr, pd):
        json.dumps(jsonable(data), allow_nan=False)
    hbm = t["placements"]["hbm"]["tokens_per_s"]
    for name, p in t["placements"].items():
        assert np.all(p["tokens_per_s"] <= hbm * (1 + 1e-12)), name
    assert pd["links"]["ethernet-10g"]["decode_steps_per_transfer"] > 90
    assert pd["links"]["ib-200g"]["transfer_s"] == pytest.approx(
        8 * pd["links"]["article-200GB/s"]["transfer_s"], rel=1e-2
    )
    # a cache worth having gets faster with the hit rate; a liability slower
    mean = {k: v["mean_prefill_time_s"] for k, v in hr["placements"].items()}
    assert mean["hbm"][-1] < mean["hbm"][0] and mean["remote-10gbe"][-1] > mean["remote-10gbe"][0]


# --------------------------------------------------------- chapters 4 and 5


def test_sweep_shapes(gen):
    s = sim_runs.sweep(
        gen,
        duration_s=30,
        links=("ib-200g", "nvlink4"),
        pool_bytes_per_node=(0, 1e11),
        prefill_workers=(1,),
        decode_workers=(1, 2),
    )
    for arch in ARCHS:
        grid = s["metrics"][arch]["ttft_p50_s"]
        assert grid.shape == (2, 2, 1, 2) and np.isfinite(grid).all()
    co = s["metrics"]["colocated"]["ttft_p50_s"]
    np.testing.assert_array_equal(co[0], co[1])  # no KV crosses the network
    pd = s["metrics"]["disaggregated"]["ttft_p50_s"]
    assert np.all(pd[1] <= pd[0])  # NVLink moves the KV faster than one 200G NIC
    hits = s["metrics"]["kv-centric"]["prefix_hit_ratio"]
    assert np.all(hits[:, 0] == 0) and np.all(hits[:, 1] > 0)


def test_compare_and_bytes(gen):
    c = sim_runs.compare_architectures(gen, duration_s=30)
    assert c["archs"] == list(ARCHS) and c["generated"]
    for arch in ARCHS:
        assert c["ttft_s"][arch].shape == c["quantiles"].shape
        assert np.all(np.diff(c["itl_s"][arch]) >= 0)
    b = sim_runs.bytes_vs_critical_path(gen, duration_s=30)
    names = b["variants"]
    same = {b[v]["bytes"]["kv-transfer"] for v in names}
    assert len(same) == 1  # the same bytes cross the network ...
    assert b["disaggregated"]["hidden_s"]["kv-transfer"] == 0.0
    assert (
        b["disaggregated + overlap"]["exposed_s"]["kv-transfer"]
        < b["disaggregated"]["exposed_s"]["kv-transfer"]
    )


def test_hit_rates_timeline_streams(gen):
    h = sim_runs.hit_rate_global_vs_local(gen, nodes=4, pool_bytes_per_node=[0, 1e11, 1e15])
    assert h["global_token_hit_ratio"][0] == 0 and h["local_token_hit_ratio"][0] == 0
    assert h["global_token_hit_ratio"][-1] == pytest.approx(h["infinite_token_hit_ratio"])
    assert np.all(h["global_token_hit_ratio"] >= h["local_token_hit_ratio"] - 1e-12)
    t = sim_runs.timeline(gen, arch="kv-centric", duration_s=10)
    kinds = {row[3] for row in t["rows"]}
    assert {"prefill", "transfer", "decode"} <= kinds and set(t["workers"]) >= {
        row[0] for row in t["rows"]
    }
    s = sim_runs.token_streams(gen, duration_s=40, requests=3, min_tokens=50)
    assert len(s["requests"]) == 3
    for row in s["colocated"]:
        assert row["token_times_s"][0] == pytest.approx(row["ttft_s"])
        assert row["itl_s"].mean() == pytest.approx(row["tpot_s"])
        assert row["itl_max_s"] >= row["tpot_s"]


def test_remote_kv_disaster(gen):
    d = sim_runs.remote_kv_disaster(gen, duration_s=20)
    assert d["remote"]["tpot_p50_s"] > 10 * d["local"]["tpot_p50_s"]
    # HBM (3.35 TB/s) over one 400 Gb/s NIC (50 GB/s); a step also reads the weights from HBM
    assert d["link"] == "ib-400g" and d["bandwidth_ratio"] == pytest.approx(67.0)
    assert 1 < d["step_ratio"] < d["bandwidth_ratio"]
    # one request at a time, the TPOT ratio is about one step's; under load it outgrows both
    assert d["light_tpot_ratio"] == pytest.approx(d["step_ratio"], rel=0.25)
    assert d["tpot_ratio"] > d["light_tpot_ratio"]
    slow = sim_runs.remote_kv_disaster(gen, duration_s=20, link="ib-200g")
    assert slow["bandwidth_ratio"] == pytest.approx(134.0) and slow["tpot_ratio"] > d["tpot_ratio"]


# ------------------------------------------------------------------- catalog


def test_catalog_builds_every_embedded_panel():
    built = {key: make() for key, make in panels().items()}
    assert all(isinstance(p, Panel) and p.key == key for key, p in built.items())


# ------------------------------------------------------------------ chapter 2


def test_batching_levels_off_below_the_ridge_at_4k():
    """GQA decode at 4K: the intensity a huge batch reaches is ~32 FLOP/B (Llama 3.1 8B),
    far below an H100's ridge (~295); only contexts of a few hundred tokens get there."""
    limit = ch2.large_batch_intensity(LLAMA_8B, 4096)
    assert 31 < limit < 33
    huge = cost.decode_step(LLAMA_8B, 1_000_000, 4096)
    assert huge.arithmetic_intensity == pytest.approx(limit, rel=1e-3) and huge.bound == "memory"
    longest = ch2.longest_compute_bound_context(LLAMA_8B)
    ridge = huge.ridge_flops_per_byte
    assert ch2.large_batch_intensity(LLAMA_8B, longest) >= ridge
    assert ch2.large_batch_intensity(LLAMA_8B, longest + 1) < ridge
    assert 300 < longest < 500
    assert cost.decode_step(LLAMA_8B, 1_000_000, longest // 2).bound == "compute"


def test_tier_steps_are_not_all_orders_of_magnitude():
    """HBM3e 4.8 TB/s, DDR5 307 GB/s, PCIe 5.0 x16 63 GB/s, and the book's NIC, one
    400 Gb/s card per GPU: 50 GB/s (an older 200 Gb/s card: 25 GB/s)."""
    assert NIC == "ib-400g"
    r = tier_step_ratios()
    assert r["hbm_over_ddr"] == pytest.approx(15.6, rel=0.01)
    assert r["ddr_over_pcie"] == pytest.approx(4.9, rel=0.01)
    assert r["pcie_over_nic"] == pytest.approx(63 / 50, rel=0.01)
    assert r["hbm_over_nic"] == pytest.approx(
        r["hbm_over_ddr"] * r["ddr_over_pcie"] * r["pcie_over_nic"]
    )
    assert tier_step_ratios("ib-200g")["pcie_over_nic"] == pytest.approx(2.52, rel=0.01)


def test_one_definition_of_a_step_the_sum_over_operators():
    """Chapter 2 states it once: the sum over operators of max(bytes/bw, FLOPs/peak); it
    equals one max over the whole step where every operator is memory-bound (batch 1), and
    exceeds it where the GEMMs are compute-bound and attention is not (batch 1024, 256
    tokens), never by more than the two times added."""
    d = Deployment("llama-3.1-8b", "h100-sxm")
    start = ch2.step_definitions(d, 1, 4096)
    assert start["sum_s"] == pytest.approx(start["whole_max_s"], rel=1e-9)
    mixed = ch2.step_definitions(d, ch2.MIXED_BATCH, ch2.MIXED_CONTEXT)
    step = cost.decode_step(d, ch2.MIXED_BATCH, ch2.MIXED_CONTEXT)
    assert 1.3 * mixed["whole_max_s"] < mixed["sum_s"] < step.memory_time_s + step.compute_time_s
    bw, peak = d.memory_bandwidth_bytes_per_s, d.peak_flops_per_s
    counts = pass_counts(float(ch2.MIXED_BATCH), 1, float(ch2.MIXED_CONTEXT))
    work = {op.kind: operator_work(op, d.table, counts) for op in d.table.operators}
    by_hand = sum(
        max(b / bw, f / peak)
        for op in d.table.operators
        for b, f in [operator_work(op, d.table, counts)]
    )
    assert mixed["sum_s"] == pytest.approx(float(by_hand), rel=1e-9)
    kinds = {k: work[k][1] / peak > work[k][0] / bw for k in ("gemm", "attention")}
    assert kinds == {"gemm": True, "attention": False}


def test_flops_per_kv_byte_all_of_a_sequence_against_attention_alone():
    """Hand-checked: Llama 3.1 8B attention does 4 x 32 heads x 128 FLOPs per cached token
    and layer against 2 x 8 x 128 x 2 bytes: 4 FLOP/B. DeepSeek-V3's absorbed MLA does
    2 x 128 heads x (2 x 512 + 64) FLOPs against (512 + 64) x 2 bytes: 241.8 FLOP/B, just
    under an H100's ridge; with each sequence's pass through the weights, 32 and 496."""
    gqa = Deployment("llama-3.1-8b", "h100-sxm")
    assert ch2.attention_intensity(gqa) == pytest.approx(4.0, rel=1e-12)
    v3 = ch2.attention_intensity(Deployment("deepseek-v3", "h100-sxm"))
    assert v3 == pytest.approx(2 * 128 * (2 * 512 + 64) / ((512 + 64) * 2), rel=1e-12)
    assert 241 < v3 < 295.3
    n = beyond_hbm.mla_numbers()
    assert (n["mla_gqa_attention"], n["mla_v3_attention"]) == ("4.0", "242")
    assert (n["mla_gqa_intensity"], n["mla_v3_intensity"]) == ("32", "496")
    assert ch2.large_batch_intensity(gqa, 4096) > 7 * 4.0


def test_chapter_2_glues_its_former_typed_numbers():
    """'a sixteenth' and 'the 4x' were typed beside glued numbers: now computed."""

    n = ch2.numbers()
    assert n["kvw_batch"] == "16"
    assert (
        int(n["kvw_context_batch"].replace(",", ""))
        == int(n["ledger_kv_equals_weights_context"].replace(",", "")) // 16
    )
    assert 3.5 < float(n["int4_bytes_speedup"].rstrip("×")) < 4.0  # scales cost a little
    assert n["nic_sold"] == "400 Gb/s" and "= 50 GB/s" in n["nic_derivation"]


# ------------------------------------------------------------ measured chapter


def test_gpu_tables_behind_the_measured_chapter():
    assert set(gpu_tables.gpus()) >= {"h100-sxm", "a100-80gb"}
    band = gpu_tables.gemv_band("h100-sxm")
    assert np.all(np.diff(band["weight_bytes"]) >= 0) and 0.6 < band["median_large_fraction"] < 0.85
    gemm = gpu_tables.gemm_over_batch("h100-sxm")
    assert np.all(gemm["efficiency"] <= 1.0)  # no kernel beats the ceiling on an H100
    h100 = gpu_tables.attention_over_context("h100-sxm", 64)
    assert h100["fraction_of_sheet"].max() < 1.0
    # the A100 table reads KV faster than its HBM allows: the chapter must say so
    assert gpu_tables.attention_over_context("a100-80gb", 64)["fraction_of_sheet"].max() > 1.0
    assert "A100" in measured.gpu_numbers()["attn_impossible"]
    ledger = gpu_tables.ledger_against_kernels("h100-sxm")
    assert np.all(ledger["ratio"] > 1.0) and ledger["ratio"][-1] < ledger["ratio"][0]
    for make in (
        measured.gemv_figure,
        measured.gemm_batch_figure,
        measured.attention_figure,
        measured.ledger_figure,
    ):
        fig = make()
        assert any("kernel tables" in getattr(t, "text", "") for t in fig.below)  # names its source


def test_flash_attention_shows_per_operator():
    """One roofline for the whole prefill hides FlashAttention; per operator the naive
    attention is memory-bound (64 FLOP/B: 4 x head_dim FLOPs per score, 4 fp16 round trips)."""
    e = flash_attention_effect(LLAMA_8B, 4096)
    assert e["attention_intensity_naive"] == pytest.approx(64.0, rel=0.02)  # + the KV it reads
    assert e["attention_intensity_flash"] > 295 > e["attention_intensity_naive"]
    assert 1.1 < e["time_ratio"] < flash_attention_effect(LLAMA_8B, 32768)["time_ratio"]


def test_the_hit_slower_than_a_miss_needs_all_its_conditions():
    c = hit_conditions()
    assert not c["anecdote"]["pays"]
    for changed in ("pcie5", "gqa", "realistic", "realistic_both"):
        assert c[changed]["pays"], changed
    assert not c["overlap"]["pays"]  # a full hit leaves nothing to overlap with
    assert not c["remote_10gbe"]["pays"] and not c["block_copies"]["pays"]
    assert c["block_copies"]["copies"] == 4096 // 16 * 32 * 2
    assert 100 < c["short_prompt_tokens"] < 1000


# ------------------------------------------------- chapter 4: capacity under load


def test_saturation_rate_hand_checked():
    rates = [1.0, 2.0, 3.0]
    crossed = sim_runs.saturation_rate(rates, [1.0, 0.95, 0.8])
    assert crossed == (pytest.approx(2 + 0.05 / 0.15), "crossed")
    assert sim_runs.saturation_rate(rates, [0.99, 0.98, 0.97]) == (3.0, "above")
    assert sim_runs.saturation_rate(rates, [0.5, 0.4, 0.1]) == (1.0, "below")


@pytest.fixture(scope="module")
def load(gen):
    variants = {
        k: sim_runs.LOAD_VARIANTS[k]
        for k in (
            "colocated",
            "colocated-512",
            "colocated-2048",
            "disaggregated",
            "disaggregated+er",
            "kv-centric",
            "kv-centric+er",
        )
    }
    return sim_runs.load_sweep(gen, requests=150, rates=(0.5, 4.0, 100.0), variants=variants)


def test_load_sweep_attainment_falls_and_rejection_holds_goodput(gen, load):
    rates = load["rates"]
    # the TTFT limit: ten idle prefills of the slice's p90 prompt (the ledger's ceiling)
    p90 = int(np.percentile(trace_slice(gen, 0, None, 150).input_tokens, 90))
    idle = cost.prefill(LLAMA_8B, p90).time_s
    assert load["ttft_slo_s"] == pytest.approx(10 * idle)
    assert load["settings"]["colocated"]["chunk_tokens"] == 8192  # vLLM's on an H100
    assert load["settings"]["colocated-512"]["chunk_tokens"] == 512
    for name, m in load["metrics"].items():
        att, good = m["slo_attainment"], m["goodput_requests_per_s"]
        assert att[0] > 0.9 > att[-1], name  # light load is served, 100 requests/s is not
        assert np.all(good <= rates * 1.05), name  # nothing serves more than arrives
        assert (m["requests_rejected_early"] > 0).any() == name.endswith("+er")
        rate, status = load["saturation"][name]
        assert status == "crossed" and rates[0] < rate < rates[-1]
    on, off = load["metrics"]["kv-centric+er"], load["metrics"]["kv-centric"]
    assert on["goodput_requests_per_s"][-1] > off["goodput_requests_per_s"][-1]
    small, engine = load["metrics"]["colocated-512"], load["metrics"]["colocated"]
    assert small["itl_p99_s"][-1] < engine["itl_p99_s"][-1] / 3  # smaller chunks, shorter gaps
    json.dumps(jsonable(load), allow_nan=False)


def test_capacity_panel_and_numbers(load):
    from kvlab.viz.kv_centric import capacity_panel  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    panel = capacity_panel(load, sim_runs.SATURATION_ATTAINMENT)
    assert [c.key for c in panel.controls] == ["rate", "chunk", "early_reject"]
    assert panel.controls[1].options == (512, 2048, 8192) and panel.controls[1].default == 8192
    v = panel.values(rate=100.0, chunk=512, early_reject="off")
    m = load["metrics"]
    assert v["colocated_slo_attainment"] == m["colocated-512"]["slo_attainment"][-1]
    assert v["kv_centric_goodput_requests_per_s"] == m["kv-centric"]["goodput_requests_per_s"][-1]
    assert v["disaggregated_itl_p99_s"] == m["disaggregated"]["itl_p99_s"][-1]
    on = panel.values(rate=100.0, early_reject="on")  # both separated designs reject
    assert on["kv_centric_itl_p99_s"] == m["kv-centric+er"]["itl_p99_s"][-1]
    assert on["disaggregated_itl_p99_s"] == m["disaggregated+er"]["itl_p99_s"][-1]
    assert on["colocated_itl_p99_s"] == m["colocated"]["itl_p99_s"][-1]
    numbers = kv_centric.capacity_numbers(load, panel)
    assert numbers["load_requests"] == "150" and numbers["load_tbt_stat"] == "p90"
    assert numbers["sat_kv_centric_er"].endswith("requests/s")
    # by default no design rejects early: the three are compared alike
    assert numbers["capacity_kv_centric_saturation"] == numbers["sat_kv_centric"]
    assert numbers["capacity_disaggregated_saturation"] == numbers["sat_disaggregated"]
    assert numbers["capacity_colocated_saturation"] == numbers["sat_colocated"]  # vLLM's budget


def test_trace_at_rate_keeps_order_and_bursts(gen):
    fast = trace_at_rate(gen, 10.0)
    a, b = gen.arrival_s, fast.arrival_s
    assert (len(fast) - 1) / (b[-1] - b[0]) == pytest.approx(10.0)
    assert np.all(np.diff(b) >= 0) and b[0] == 0.0
    scale = b[-1] / (a[-1] - a[0])
    np.testing.assert_allclose(np.diff(b), np.diff(a) * scale, rtol=1e-9, atol=1e-12)
    assert [r.input_tokens for r in fast.requests] == [r.input_tokens for r in gen.requests]


# ------------------------------------------------- chapter 2c: past the per-user ceiling


@pytest.fixture(scope="module")
def ceiling_numbers():
    return past_the_ceiling.numbers()


def test_speculation_pays_less_as_the_batch_grows_at_short_contexts():
    """At 256 tokens the verify pass turns compute-bound: the speedup falls with the batch and
    crosses 1 where the readout says; at 4K the KV reads keep it paying (MagicDec)."""
    panel = ch.panels()["speculative"]
    short = panel.compute({**panel.default_state, "context": 256})
    speedup = np.array(short["sources"]["curve"]["speedup"])
    batches = np.array(BATCH_GRID)
    assert speedup[0] > 1.9 and np.all(np.diff(speedup[batches >= 48]) <= 1e-6)  # terms: 7 digits
    assert speedup[-1] < 0.8 * speedup[0]  # beyond the ridge every rejected row is paid for
    breakeven = short["values"]["breakeven_batch"]
    assert (
        breakeven
        == 180
        == ch.breakeven_batch(Deployment("llama-3.1-8b", "h100-sxm", "bf16", "bf16"), 256, 4, 0.7)
    )
    assert np.all(speedup[batches < breakeven] > 1) and np.all(speedup[batches >= breakeven] <= 1)
    long_ = panel.values()  # 4K: pays at every batch that fits
    assert long_["breakeven_batch"] is None and long_["max_batch"] == 100
    assert ch.spec(batch=100).speculative_speedup > 1.9
    # at batch 1 the verify pass of K + 1 = 5 positions costs one decode step (memory-bound)
    assert long_["verify_over_decode"] == pytest.approx(1.0, abs=0.01)
    assert long_["tokens_per_verify_step"] == pytest.approx((1 - 0.7**5) / 0.3)
    # more acceptance, more speed; a draft model costs more than a draft head
    speedup_at = {a: panel.values(acceptance=a)["speedup"] for a in (0.5, 0.9)}
    assert speedup_at[0.9] > long_["speedup"] > speedup_at[0.5]
    by_model = panel.values(setup="70b-8xh100-8b")
    assert by_model["speedup"] < panel.values(setup="70b-8xh100-head")["speedup"]
    assert by_model["breakeven_batch"] == 112


def test_speculative_panel_terms_are_the_ledger_and_live_states_work():
    panel = ch.panels()["speculative"]
    for setup in ("8b-h100-head", "v3-8xh200-mtp"):
        v = panel.values(setup=setup, batch=64, context=1024, speculative_tokens=3, acceptance=0.8)
        s = levers_setup_step(setup, 64, 1024, 3, 0.8)
        assert v["spec_each"] == pytest.approx(s.tokens_per_s_per_sequence, rel=1e-6)
        assert v["speedup"] == pytest.approx(s.speculative_speedup, rel=1e-6)
    off_grid = panel.values(acceptance=0.72, batch=100)  # the live face: any value
    s = levers_setup_step("8b-h100-head", 100, 4096, 4, 0.72)
    assert off_grid["speedup"] == pytest.approx(s.speculative_speedup, rel=1e-12)
    assert (
        panel.values(acceptance=0.7, batch=100)["speedup"]
        < off_grid["speedup"]
        < panel.values(acceptance=0.75, batch=100)["speedup"]
    )


def levers_setup_step(setup, batch, context, k, a):
    from kvlab.viz.past_the_ceiling import SPEC_SETUPS  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    s = SPEC_SETUPS[setup]
    return speculative_step(s.deployment, batch, context, k, a, s.draft_model)


def test_tensor_parallel_eight_gpus_fit_the_70b_and_run_it_faster_but_not_eight_times():
    steps = ch.tp_steps()
    one, eight = steps[1], steps[8]
    assert not one.fits and eight.fits  # 141 GB of bf16 weights: no single H100 holds them
    assert one.weight_bytes == pytest.approx(141.1e9, rel=1e-3)
    assert eight.weight_bytes == pytest.approx(one.weight_bytes / 8, rel=1e-3)  # norms stay whole
    assert eight.tokens_per_s_per_sequence > one.tokens_per_s_per_sequence
    assert eight.tokens_per_s_per_sequence < 8 * one.tokens_per_s_per_sequence
    # 160 all-reduces of a 16 kB message: latency, not bandwidth, sets their time at batch 1
    assert eight.allreduce_latency_s / eight.allreduce_time_s > 0.95
    assert eight.allreduce_time_s == pytest.approx(
        160 * 3.2298e-6 + (eight.allreduce_time_s - eight.allreduce_latency_s)
    )
    # the all-reduces' share grows with the batch, more so as measured
    big = ch.tp_steps(64)[8]
    assert big.allreduce_time_s / big.step_time_s > eight.allreduce_time_s / eight.step_time_s
    ar = ch.allreduce_at_batch(64)
    assert ar["measured_s"] > 5 * ar["sheet_s"] and ar["measured_s"] > ar["ceiling_s"]
    panel = ch.panels()["tensor_parallel"]
    v8, v1 = panel.values(), panel.values(tensor_parallel=1)
    assert v8["fits"] and not v1["fits"] and v1["max_batch"] == 0
    assert v8["step_time_s"] == pytest.approx(eight.step_time_s, rel=1e-6)
    assert v8["max_batch"] == eight.max_batch and v8["speedup"] == pytest.approx(
        one.step_time_s / eight.step_time_s, rel=1e-6
    )
    assert 0 < v8["share_of_ideal"] < 1
    assert v8["measured_step_time_s"] > v8["step_time_s"]
    deepseek = panel.values(model="deepseek-v3", hardware="h200")
    assert deepseek["fits"] and deepseek["measured_step_time_s"] is None  # no MLA tables
    assert not panel.values(model="deepseek-v3")["fits"]  # 84.8 GB per GPU > an H100's 80 GB
    off_grid = panel.values(batch=100)  # the live face
    assert off_grid["step_time_s"] == pytest.approx(
        ch._step("llama-3.1-70b", "h100-sxm", 100, tensor_parallel=8).step_time_s, rel=1e-12
    )


def test_deepseek_v3_reads_more_experts_as_the_batch_grows_and_mtp_pays_more():
    reads = [cost.weight_read_bytes("deepseek-v3", b, "fp8") for b in (1, 64, 256)]
    assert reads[0] == pytest.approx(36.6e9, rel=1e-2) and reads[0] < reads[1] < reads[2]
    assert reads[2] < cost.weight_bytes("deepseek-v3", "fp8")
    tp8 = ch._step("deepseek-v3", "h200", 1, tensor_parallel=8, weight_dtype="fp8")
    assert tp8.fits and tp8.kv_bytes_per_token == 70272  # the latent is not split
    assert tp8.weight_read_bytes > reads[0] / 8  # the latent down-projections stay whole
    v3 = Deployment("deepseek-v3", "h200", "fp8", "bf16", tensor_parallel=8)
    mtp = ch.speculative_step(v3, np.array([1, 64, 256]), 4096, 1, 0.85)
    speedup = np.asarray(mtp.speculative_speedup)
    assert 1 < speedup[0] < speedup[1] < speedup[2] < 1.85  # the verify pass touches ~16 experts


def test_past_the_ceiling_numbers_glue_every_role(ceiling_numbers):
    notebook = Path(__file__).resolve().parents[1] / "notebooks" / "02c_past_the_ceiling.ipynb"
    text = notebook.read_text()
    roles = set(re.findall(r"\{glue:text\}`([\w-]+)`", text))
    assert roles and roles <= set(ceiling_numbers), roles - set(ceiling_numbers)
    assert all(isinstance(v, str) and v for v in ceiling_numbers.values())
    assert ceiling_numbers["tp1_fits"] == "no" and ceiling_numbers["v3_h100_fits"] == "no"
    assert ceiling_numbers["spec_short_breakeven_batch"] == "180"
    assert ceiling_numbers["speculative_breakeven_batch"] == "never"


def _token_gaps_jump_when_colocated(summary: dict) -> None:
    co, dis = summary["colocated"], summary["disaggregated"]
    assert co["itl_p99_s"] > 3 * co["itl_p50_s"]  # prefill chunks stall decode
    assert dis["itl_p99_s"] < 3 * dis["itl_p50_s"]  # separated, the tail stays near the median
    assert co["itl_p99_s"] > 3 * dis["itl_p99_s"]


def test_chapter_5_token_gaps_show_what_the_prose_says():
    """Chapter 5's example of jumpy token gaps: colocated, the p99 gap is more than 3x its
    median; with prefill and decode separated it is not. The glued ratio is the runs'."""
    summary = metrics_and_diagnosis.token_streams()["summary"]
    _token_gaps_jump_when_colocated(summary)
    co = summary["colocated"]
    ratio = metrics_and_diagnosis.numbers()["ts_colocated_ratio"]
    assert float(ratio.rstrip("×")) == pytest.approx(co["itl_p99_s"] / co["itl_p50_s"], rel=0.05)


def test_chapter_5_token_gap_example_holds_on_the_generated_stand_in(monkeypatch):
    """A book built without the Mooncake traces replays the generated conversation trace
    over the same window: the example must show the same thing there."""

    monkeypatch.setattr(traces, "find_trace", lambda name: None)
    stand_in = traces.trace_or_generated("conversation")
    assert stand_in.generated
    s = sim_runs.token_streams(
        stand_in,
        start_s=metrics_and_diagnosis.STREAMS_START_S,
        duration_s=metrics_and_diagnosis.STREAMS_S,
        config=kv_centric.CONFIG,
    )
    _token_gaps_jump_when_colocated(s["summary"])


def test_pitfall_one_prose_names_the_limit_that_binds():
    """Chapter 5's pitfall 1 says memory binds at the panel's starting budget and the TPOT
    budget binds at the tightest one; the panel must agree, or the prose must change."""
    n = metrics_and_diagnosis.numbers()
    assert n["tpot-budget_limited_by"] == "device memory"
    assert n["tpot-budget-tight_limited_by"] == "TPOT budget"
    assert int(n["tpot-budget_tpot_batch"]) > int(n["tpot-budget_max_batch"])
    assert int(n["tpot-budget-tight_allowed_batch"]) < int(n["tpot-budget_max_batch"])
    assert int(n["tpot-budget_knee_batch"]) < int(n["tpot-budget-tight_allowed_batch"])


def test_chapter_3_measured_tier_gap_narrows_but_stays_large():
    """The prose: with measured kernels HBM slows, the link-bound tiers (at line rate) change
    little, and the gap to host memory narrows but stays about an order of magnitude."""
    n = beyond_hbm.numbers()
    ratio = lambda k: float(n[k].rstrip("×"))  # noqa: E731
    assert 5 < ratio("tier-read-measured_host_slowdown") < ratio("tier-read_host_slowdown")


def test_chapter_3_measured_mode_with_links_at_a_share():
    """The measured mode adds each tier's trip at line rate to the measured kernels (the
    panel's numbers, reproduced); at 80% of line rate the slow tiers slow by up to 1/0.8
    and the gap to host memory widens again."""

    n = beyond_hbm.numbers()
    line = beyond_hbm.measured_tier_reads(1.0)
    assert fmt_rate(line["hbm"]) == n["tier-read-measured_hbm_4k"]
    assert fmt_rate(line["host"]) == n["tier-read-measured_host_4k"]
    assert fmt_rate(line["remote"]) == n["tier-read-measured_remote_400g_4k"]
    shared = beyond_hbm.measured_tier_reads(0.8)
    assert shared["hbm"] == line["hbm"]
    for tier in ("host", "remote"):
        assert 0.8 * line[tier] < shared[tier] < line[tier]
    assert line["host_slowdown"] < shared["host_slowdown"] < line["host_slowdown"] / 0.8
    assert n["tm_link_share"] == "80%" and n["tm_host_share"] == fmt_rate(shared["host"])


def fmt_rate(x):
    return fmt.rate(x)


def test_the_hit_never_pays_only_inside_llama_2s_window():
    """Llama 2 7B, a full hit over PCIe 4.0: no prompt up to its 4,096-token window pays;
    with the window raised it pays from ~14K tokens, where the miss's quadratic attention
    outgrows the linear copy."""

    b = beyond_hbm.breakeven_beyond_the_window()
    assert b["window"] == 4096 and b["inside_window"] == float("inf")
    assert 13_000 < b["uncapped"] < 15_000
    d = Deployment("llama-2-7b", "h100-sxm")
    below = tiers.hit_value(d, b["uncapped"] - 1, "host-pcie4")
    above = tiers.hit_value(d, b["uncapped"], "host-pcie4")
    assert float(below.value_s) <= 0 < float(above.value_s)
    n = beyond_hbm.numbers()
    assert n["hc_window"] == "4,096" and n["hc_breakeven_uncapped"] == "14,018"


def test_chapter_3_and_5_name_the_400g_nic_per_gpu():
    n = beyond_hbm.numbers()
    assert n["nic_400g_sold"] == "400 Gb/s"
    assert float(n["pd_remote_slowdown_400g"].rstrip("×")) < float(
        n["pd_remote_slowdown_200g"].rstrip("×")
    )
    cases = metrics_and_diagnosis.diagnosis_cases()
    net = cases["disaggregated, KV over one 400 Gb/s NIC"].findings[4]
    assert net.numbers["network_bytes_per_s"] == 50e9


def test_deepseek_v3_fixed_costs_beside_its_ceiling():
    """The ledger's own fixed-cost estimate: its operator list's kernels per GPU (all but
    the all-reduces) at the H200 tables' smallest-kernel latency, ~2.7 us."""

    f = ch.v3_fixed_costs()
    # 61 layers: attention + its projections + 2 norms each; 58 MoE layers: router, top-k,
    # shared gate/up and down, experts; 3 dense layers: gate/up, down, act; plus the
    # final norm, LM head, embedding, sampling
    assert f["kernels"] == 61 * 4 + 58 * 5 + 3 * 3 + 4
    assert f["allreduces"] == 2 * 61
    assert f["kernel_floor_s"] == kernel_tables.load("h200").kernel_floor_s
    assert 2e-6 < f["kernel_floor_s"] < 3.5e-6
    assert f["fixed_s"] == pytest.approx(f["kernels"] * f["kernel_floor_s"])
    assert 0.5 < f["fixed_s"] / f["ceiling_step_s"] < 1.5  # as large as the ceiling itself
    assert f["with_fixed_tokens_per_s"] == pytest.approx(1 / (f["ceiling_step_s"] + f["fixed_s"]))
    n = ch.v3_fixed_cost_numbers()
    assert n["v3_kernels"] == "547" and n["v3_step_b1"] == "1.58 ms"


def test_mtp_pays_more_with_the_batch_only_until_every_expert_is_read():
    peak = ch.mtp_peak()
    assert peak["batch"] == 128 and peak["experts_touched"] > 0.98 * 256
    assert peak["speedup_at_max"] < peak["speedup"]
    n = ch.mtp_numbers()
    assert n["mtp_peak_batch"] == "128" and n["mtp_experts_2"] == "15.8"


def test_magicdec_is_quoted_with_its_version():
    p = ch.PUBLISHED["magicdec"]
    assert (p["speedup"], p["iclr_speedup"]) == (1.84, 2.51)
    n = ch.speculative_numbers()
    assert "v1" in n["magicdec_source"] and "ICLR 2025" in n["magicdec_iclr_source"]
    assert "v4" in n["magicdec_iclr_source"]


def test_shared_requests_said_exactly_where_a_percentage_rounds_to_100():
    assert shared_requests_words(12030, 12031) == "all but one of its 12,031 requests"
    assert shared_requests_words(12031, 12031) == "all 12,031 of its requests"
    assert shared_requests_words(6000, 12031) == "49.9% of its requests"


def test_the_chinese_says_all_but_one_in_words_too(monkeypatch):
    """The Chinese edition states the same numbers as the English: a word, not a digit."""

    monkeypatch.setenv(i18n.LANG_ENV, i18n.CHINESE)
    assert shared_requests_words(12030, 12031) == "12,031 个请求中除一个以外的所有请求"


def test_chapter_5b_says_all_but_one_where_a_percentage_says_100():
    n = prefix_caching.numbers()
    if n["conv_requests"] == "12,031":  # the real trace (the generated one differs)
        assert n["conv_shared_requests"] == "all but one of its 12,031 requests"
        assert n["capacity_hit_requests"] == "all but one of its 12,031 requests"
    assert "100.0%" not in n["conv_shared_requests"] + n["capacity_hit_requests"]


def test_chapter_1_says_128_kib_is_131_kb_once():
    """The article's "128 KB" per token is 128 KiB = 131,072 bytes, which kvlab writes as
    131 kB (SI units)."""

    n = what_a_hit_saves.numbers()
    assert (n["kv_per_token_kib"], n["kv_per_token"]) == ("128", "131 kB")


def test_chapter_5b_latency_conditions_measured_kernels_are_slower(gen):
    """Chapter 5b states the TTFT/TPOT figure's conditions and its numbers again with measured
    kernels, on the requests the tables reach: slower everywhere, the hit moving TTFT alone."""

    c = prefix_caching.latency_conditions(gen)
    assert 0 < c["covered_share"] <= 1 and c["covered_max_prompt"] <= int(gen.input_tokens.max())
    for name in ("ceiling", "measured"):
        assert c[f"{name}_hbm_s"] < c[f"{name}_no_cache_s"]  # a hit shortens TTFT
    for k in ("no_cache", "hbm", "tpot"):
        assert c[f"measured_{k}_s"] > c[f"ceiling_{k}_s"]  # kernels below the ceiling
    n = prefix_caching.numbers()
    assert n["lat_batch"] == "16" and n["lat_setup"].startswith("Llama 3.1 8B")


def test_a_share_short_of_all_never_reads_100_percent():
    """12,030 of 12,031 requests (chapter 5b's panel) is 99.99%, not 100%."""
    assert fmt.percent(12_030 / 12_031) == "99.99%"
    assert fmt.percent(0.9995) == "99.95%"
    assert fmt.percent(1 - 1e-7) == "99.99999%"
    assert fmt.percent(1.0) == "100%"
    assert fmt.percent(0.953) == "95.3%"

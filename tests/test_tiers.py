"""kvlab.tiers: the article's section-3 numbers by hand, break-even equalities, properties."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab import cost, tiers
from kvlab.bench.report import kv_transfer_series
from kvlab.deployment import Deployment
from kvlab.errors import KvlabError
from kvlab.hardware import Tier
from kvlab.tiers import TierPath, link_model

MiB, GiB = 2**20, 2**30
REQUEST_4K = 4096 * 131072  # tokens x 128 KiB per token of the article's 7B
ARTICLE = Deployment("article-7b", "h100-sxm")
LLAMA = Deployment("llama-3.1-8b", "h100-sxm")


def bare(where, efficiency=1.0, bandwidth_bytes_per_s=None):
    """A path at its bandwidth alone, no per-fetch latency (the article's arithmetic)."""
    return TierPath(where, efficiency, bandwidth_bytes_per_s, latency_s=0.0)


# ------------------------------------------------------------ the article, by hand


def test_one_4k_request_is_512_mib_and_32_of_them_16_gib():
    one = tiers.kv_footprint(ARTICLE, batch=1, context=4096)
    assert one.kv_bytes_per_request == one.kv_cache_bytes == 512 * MiB == REQUEST_4K
    many = tiers.kv_footprint(ARTICLE, batch=32, context=4096)
    assert many.kv_cache_bytes == 16 * GiB  # 17.18e9 bytes: "close to the 14 GB of weights"
    assert many.weight_bytes == 14e9 and many.fits


def test_10_gbe_moves_a_4k_request_in_0_43_s_not_seconds():
    # 10 Gb/s / 8 = 1.25 GB/s; 536,870,912 B / 1.25e9 B/s = 0.4295 s at line rate.
    # The article says "measured in seconds": true as an order of magnitude, ~100 steps.
    assert tiers.kv_fetch_time_s(ARTICLE, 4096, bare("ethernet-10g")) == pytest.approx(
        0.4294967296, rel=1e-12
    )
    assert tiers.kv_fetch_time_s(ARTICLE, 4096, bare("ethernet-10g", 0.6)) == pytest.approx(
        0.7158, abs=1e-4
    )
    # a name alone pays the placement's per-fetch latency (30 us of kernel TCP)
    assert tiers.kv_fetch_time_s(ARTICLE, 4096, "ethernet-10g") == pytest.approx(
        0.4294967296 + 30e-6, rel=1e-12
    )


def test_200_gb_per_s_is_2_7_ms_but_a_200_gbit_nic_is_8x_slower():
    article = tiers.kv_fetch_time_s(ARTICLE, 4096, bare("ib-200g", bandwidth_bytes_per_s=200e9))
    # "~2.5 ms"
    assert article == pytest.approx(REQUEST_4K / 200e9) == pytest.approx(2.684e-3, rel=1e-3)
    nic = tiers.kv_fetch_time_s(ARTICLE, 4096, bare("ib-200g"))  # 200 Gb/s = 25 GB/s
    assert nic == pytest.approx(REQUEST_4K / 25e9) == pytest.approx(21.47e-3, rel=1e-3)
    assert nic / article == pytest.approx(8.0)


def test_slowest_hop_sets_the_pace():
    host = tiers.get_placement("host-pcie5")
    assert host.bottleneck == "pcie5-x16"  # DDR5 (307 GB/s) is faster than the PCIe link (63 GB/s)
    assert host.bandwidth_bytes_per_s() == pytest.approx(63.0e9, rel=1e-3)
    assert tiers.get_placement("remote-ib-400g").bandwidth_bytes_per_s() == 50e9
    assert tiers.get_placement("hbm").bandwidth_bytes_per_s("h200") == 4.8e12
    with pytest.raises(KvlabError, match="hardware="):
        tiers.get_placement("hbm").bandwidth_bytes_per_s()
    with pytest.raises(KvlabError, match="remote-10gbe"):
        tiers.get_placement("remote-10g")


def test_a_tier_of_your_own_needs_no_catalogue_entry():
    cxl = Tier("cxl-type3", "memory", 64e9, "64 GB/s", "a CXL memory expander", "hypothetical")
    p = tiers.get_placement(cxl)
    assert p.bandwidth_bytes_per_s() == 64e9 and p.bottleneck == "cxl-type3"
    # a Tier that borrows a catalogue name still keeps its own bandwidth
    slow_pcie = Tier("pcie5-x16", "link", 8e9, "8 GB/s", "a throttled link", "hypothetical")
    assert tiers.get_placement(slow_pcie).bandwidth_bytes_per_s() == 8e9


def test_transfer_time_adds_latency_and_broadcasts():
    t = tiers.transfer_time_s(np.array([0, 1e9]), 1e9, efficiency=0.5, latency_s=1e-3)
    np.testing.assert_allclose(t, [1e-3, 2.001])
    with pytest.raises(KvlabError, match="bandwidth"):
        tiers.transfer_time_s(1, 0)


# -------------------------------------------------------- read every step vs once


def test_kv_in_hbm_is_the_ledger_and_slower_tiers_collapse():
    step = tiers.tiered_decode_step(ARTICLE, 32, 4096, "hbm")
    ledger = cost.decode_step(ARTICLE, 32, 4096)
    assert step.step_time_s == pytest.approx(ledger.step_time_s) and step.slowdown == pytest.approx(
        1.0
    )
    host = tiers.tiered_decode_step(ARTICLE, 32, 4096, "host-pcie5")
    # 16 GiB over 63 GB/s = 273 ms per step, against 9.3 ms with the KV in HBM
    assert host.tier_time_s == pytest.approx(17179869184 / 63.0e9 + 10e-6, rel=1e-3)
    assert host.slowdown > 25 and host.bound == "tier"
    none = tiers.tiered_decode_step(ARTICLE, 32, 4096, "host-pcie5", tier_fraction=0.0)
    assert none.step_time_s == pytest.approx(ledger.step_time_s)


@settings(max_examples=40, deadline=None)
@given(
    bw=st.floats(1e8, 1e12),
    factor=st.floats(1.01, 100),
    batch=st.integers(1, 256),
    context=st.integers(1, 65536),
    frac=st.floats(0.01, 1.0),
)
def test_more_tier_bandwidth_never_lowers_tokens_per_s(bw, factor, batch, context, frac):
    path, faster = (TierPath("remote-ib-400g", bandwidth_bytes_per_s=b) for b in (bw, bw * factor))
    slow = tiers.tiered_decode_step(LLAMA, batch, context, path, frac)
    fast = tiers.tiered_decode_step(LLAMA, batch, context, faster, frac)
    over = tiers.tiered_decode_step(LLAMA, batch, context, path, frac, overlap=True)
    assert fast.tokens_per_s >= slow.tokens_per_s
    assert over.step_time_s <= slow.step_time_s  # overlapping can only help
    assert slow.tokens_per_s <= slow.hbm_tokens_per_s * (1 + 1e-12)  # nothing beats all-in-HBM


def test_remote_kv_every_step_is_the_disaster_moving_once_is_the_fix():
    m = tiers.move_once_vs_every_step(ARTICLE, 1, 4096, "remote-10gbe", output_tokens=256)
    assert m.fetch_once_s == pytest.approx(REQUEST_4K / 1.25e9 + 30e-6)
    assert m.every_step_time_s > 90 * m.hbm_step_time_s  # each token waits for 0.43 s of network
    assert m.breakeven_tokens <= 2 and m.speedup > 50
    assert m.total_move_once_s == pytest.approx(m.fetch_once_s + 256 * m.hbm_step_time_s)


# ------------------------------------------------------------- the value of a hit


def test_value_is_saved_minus_fetch_and_full_hits_keep_one_token():
    h = tiers.hit_value(ARTICLE, 4096, "host-pcie5")
    assert h.cached_tokens == 4095  # the last token is always computed
    assert h.value_s == pytest.approx(h.saved_s - h.fetch_time_s)
    assert h.saved_s == pytest.approx(h.miss_time_s - h.hit_compute_time_s)
    assert h.hit_time_s == pytest.approx(h.fetch_time_s + h.hit_compute_time_s)
    assert not h.liability and h.speedup > 1


@pytest.mark.parametrize(
    "model,prompt", [("article-7b", 4096), ("llama-2-7b", 1024), ("llama-3.1-70b", 16384)]
)
def test_at_the_breakeven_bandwidth_fetch_equals_recompute_saved(model, prompt):
    d = Deployment(model, "h100-sxm")
    h = tiers.hit_value(d, prompt, "host-pcie5")
    bw = h.breakeven_bandwidth_bytes_per_s

    def at(bandwidth):
        return tiers.hit_value(d, prompt, TierPath("host-pcie5", bandwidth_bytes_per_s=bandwidth))

    assert at(bw).fetch_time_s == pytest.approx(at(bw).saved_s, rel=1e-9)
    assert at(bw).value_s == pytest.approx(0.0, abs=1e-12)
    assert at(bw * 1.01).value_s > 0
    assert at(bw * 0.99).value_s < 0


@pytest.mark.parametrize("tier", ["hbm", "host-pcie5", "host-pcie4", "remote-ib-200g"])
def test_breakeven_prompt_is_the_sign_change(tier):
    n = tiers.breakeven_prompt_tokens(ARTICLE, tier)
    assert np.isfinite(n)
    n = int(n)
    assert tiers.hit_value(ARTICLE, n - 1, tier).value_s <= 0
    assert tiers.hit_value(ARTICLE, n, tier).value_s > 0


def test_breakeven_prompt_vectorises_over_bandwidth_and_can_be_never():
    bws = np.array([1e9, 1e10, 1e11])
    many = tiers.breakeven_prompt_tokens(ARTICLE, TierPath("host-pcie5", bandwidth_bytes_per_s=bws))
    one = [
        tiers.breakeven_prompt_tokens(ARTICLE, TierPath("host-pcie5", bandwidth_bytes_per_s=b))
        for b in bws
    ]
    np.testing.assert_array_equal(many, one)
    assert np.all(np.diff(many[np.isfinite(many)]) <= 0)  # faster link -> pays from shorter prompts
    # 10 GbE: within the article model's 32K window a hit never pays...
    assert tiers.breakeven_prompt_tokens(ARTICLE, "remote-10gbe") == np.inf
    # ...quadratic attention makes recompute dear enough only at ~340K tokens
    assert (
        300_000 < tiers.breakeven_prompt_tokens(ARTICLE, "remote-10gbe", max_tokens=2**20) < 400_000
    )


def test_99_percent_hit_rate_slower_than_a_miss():
    # llama-2-7b keeps all 32 KV heads: 512 KiB per token. Over PCIe 4 the 4K prefix costs
    # 67 ms to fetch, more than the 59 ms it takes to recompute from HBM-resident weights.
    llama2 = Deployment("llama-2-7b", "h100-sxm")
    h = tiers.hit_value(llama2, 4096, "host-pcie4")
    assert h.liability and h.fetch_time_s > h.saved_s
    assert tiers.mean_prefill_time_s(h, 0.99) > h.miss_time_s
    rates = np.linspace(0, 1, 11)
    assert np.all(np.diff(tiers.mean_prefill_time_s(h, rates)) > 0)  # more hits, slower
    good = tiers.hit_value(llama2, 4096, "hbm")
    assert np.all(np.diff(tiers.mean_prefill_time_s(good, rates)) < 0)


# --------------------------------------------------------- capacity and spilling


def test_overflow_starts_right_after_max_batch():
    fp = tiers.kv_footprint(ARTICLE, 1, 4096)
    limit = fp.max_batch  # (90% of 80e9 - 14e9) / 512 MiB = 108.03 -> 108
    assert limit == 108
    at, past = (tiers.kv_footprint(ARTICLE, b, 4096) for b in (limit, limit + 1))
    assert at.fits and at.overflow_bytes == 0
    assert not past.fits and past.overflow_bytes == pytest.approx((limit + 1) * REQUEST_4K - 58e9)
    assert 0 < past.overflow_fraction < 1


def test_spilling_costs_tokens_per_s_and_capping_does_not():
    s = tiers.spill_cost(ARTICLE, np.array([64, 108, 109, 116, 256]), 4096, "host-pcie5")
    # fits: no spill
    np.testing.assert_allclose(s.tokens_per_s_spilled[:2], s.tokens_per_s_unlimited[:2])
    # every sequence past capacity adds 512 MiB over PCIe (8.5 ms) to every step: 8 more
    # sequences than fit give fewer tokens/s than the 108 that fit
    assert s.tokens_per_s_spilled[2] < s.tokens_per_s_spilled[1]
    assert s.tokens_per_s_spilled[3] < s.tokens_per_s_spilled[1] / 2
    assert np.all(s.tokens_per_s_spilled <= s.tokens_per_s_unlimited + 1e-9)
    assert list(s.capped_batch) == [64, 108, 108, 108, 108]
    assert s.tokens_per_s_capped[4] > 10 * s.tokens_per_s_spilled[4]


def test_weights_that_do_not_fit_spill_everything():
    d = Deployment("llama-3.1-70b", "rtx-4090")
    fp = tiers.kv_footprint(d, 1, 4096)
    assert fp.kv_room_bytes == 0 and fp.overflow_fraction == 1.0 and fp.max_batch == 0
    assert tiers.spill_cost(d, 1, 4096, "host-pcie5").tokens_per_s_capped == 0


# ------------------------------------------------------------------ link model


def test_link_model_reaches_half_bandwidth_at_latency_times_bandwidth():
    m = link_model.link_model("ib-400g", [5e-6 * 50e9])  # 250 kB
    assert m["bandwidth_bytes_per_s"][0] == pytest.approx(25e9)
    assert m["half_bandwidth_bytes"] == pytest.approx(250e3)
    big = link_model.link_model("ethernet-10g", [REQUEST_4K])
    assert big["time_s"][0] == pytest.approx(30e-6 + REQUEST_4K / 1.25e9)
    curves = link_model.link_model_curves()
    assert set(curves["links"]) == {"ethernet-10g", "ib-200g", "ib-400g", "nvlink4"}
    for c in curves["links"].values():
        assert np.all(np.diff(c["bandwidth_bytes_per_s"]) > 0)
        assert np.all(c["bandwidth_bytes_per_s"] < c["peak_bandwidth_bytes_per_s"])


def test_fit_recovers_latency_and_bandwidth():
    sizes = 2.0 ** np.arange(12, 30)
    fit = link_model.fit_link_model(sizes, 40e-6 + sizes / 2.5e9)
    assert fit["latency_s"] == pytest.approx(40e-6, rel=1e-6)
    assert fit["bandwidth_bytes_per_s"] == pytest.approx(2.5e9, rel=1e-6)
    with pytest.raises(KvlabError):
        link_model.fit_link_model([1, 2], [1.0])


def test_measured_series_reads_recorded_results(tmp_path, monkeypatch):
    monkeypatch.setenv("KVLAB_RESULTS_DIR", str(tmp_path))
    (tmp_path / "box").mkdir()
    row = {
        "layout": "contiguous",
        "bytes": 4096,
        "time_s": {"median": 1e-4, "p10": 9e-5, "p90": 2e-4},
        "bandwidth_bytes_per_s": {"median": 4.1e7, "p10": 2e7, "p90": 4.5e7},
    }
    payload = {
        "kind": "kv_transfer",
        "environment": {"device": "cpu"},
        "engines": {"torch-gloo": {"rows": [row, {**row, "bytes": 8192}], "summary": {}}},
    }
    (tmp_path / "box" / "kv_transfer.json").write_text(json.dumps(payload))
    got = kv_transfer_series()
    series = got["box"]["engines"]["torch-gloo"]["layouts"]["contiguous"]
    np.testing.assert_array_equal(series["bytes"], [4096, 8192])
    assert "paged" not in got["box"]["engines"]["torch-gloo"]["layouts"]

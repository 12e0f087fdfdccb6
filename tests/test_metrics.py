"""kvlab.metrics: TTFT/TPOT/ITL/SLOs from per-token timestamps, hand-checked and by property."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab import metrics
from kvlab.errors import KvlabError

# Request 0 arrives at 0.5 s; tokens at 1.0, 1.1, 1.2, 1.5 s.
# Request 1 arrives at 0.0 s; one token at 2.0 s.
# Request 2 arrives at 1.0 s; tokens at 1.25, 1.30 s.
ARRIVALS = [0.5, 0.0, 1.0]
TOKENS = [[1.0, 1.1, 1.2, 1.5], [2.0], [1.25, 1.30]]


def test_request_metrics_hand_checked():
    r = metrics.request_metrics(ARRIVALS, TOKENS)
    assert r["tokens"].tolist() == [4, 1, 2]
    assert r["ttft_s"] == pytest.approx([0.5, 2.0, 0.25])
    assert r["tpot_s"][0] == pytest.approx(0.5 / 3)  # (1.5 - 1.0) / 3 gaps
    assert math.isnan(r["tpot_s"][1])  # one token: no gap
    assert r["tpot_s"][2] == pytest.approx(0.05)
    assert r["e2e_s"] == pytest.approx([1.0, 2.0, 0.30])
    assert r["itl_max_s"][0] == pytest.approx(0.3)
    assert r["itl_p90_s"][0] == pytest.approx(np.percentile([0.1, 0.1, 0.3], 90))  # 0.26
    assert r["itl_p90_s"][0] == pytest.approx(0.26)


def test_itl_pools_gaps_within_requests_only():
    gaps = metrics.itl_s(TOKENS)
    assert gaps == pytest.approx([0.1, 0.1, 0.3, 0.05])  # no gap across requests


def test_csr_and_list_inputs_agree():
    flat, offsets = metrics.token_csr(TOKENS)
    assert offsets.tolist() == [0, 4, 5, 7]
    a = metrics.request_metrics(ARRIVALS, TOKENS)
    b = metrics.request_metrics(ARRIVALS, flat, offsets)
    for name in a.dtype.names:
        np.testing.assert_array_equal(a[name], b[name])


def test_summarize_hand_checked():
    s = metrics.summarize(ARRIVALS, TOKENS, ttft_slo_s=1.0, tbt_slo_s=0.2, tbt_stat="mean")
    assert s["requests_completed"] == 3 and s["tokens_generated"] == 7
    assert s["duration_s"] == pytest.approx(2.0)  # first arrival 0.0 -> last token 2.0
    assert s["throughput_tokens_per_s"] == pytest.approx(3.5)
    assert s["ttft_p50_s"] == pytest.approx(0.5)
    assert s["tpot_p50_s"] == pytest.approx(np.median([0.5 / 3, 0.05]))
    assert s["itl_p99_s"] == pytest.approx(np.percentile([0.1, 0.1, 0.3, 0.05], 99))
    # TTFT <= 1 s: requests 0 and 2; mean gap <= 0.2 s: all -> 2 of 3 meet both
    assert s["slo_attainment"] == pytest.approx(2 / 3)
    assert s["goodput_requests_per_s"] == pytest.approx(1.0)
    assert s["goodput_tokens_per_s"] == pytest.approx(3.0)  # 4 + 2 tokens / 2 s


def test_tbt_statistic_changes_the_verdict():
    # Request 0's gaps are 0.1, 0.1, 0.3: mean 0.167 passes a 0.2 s limit, max 0.3 fails it.
    r = metrics.request_metrics(ARRIVALS, TOKENS)
    assert metrics.slo_met(r, None, 0.2, "mean").tolist() == [True, True, True]
    assert metrics.slo_met(r, None, 0.2, "max").tolist() == [False, True, True]
    curve = metrics.slo_curve(r, None, (0.1, 0.2, 0.35), "max")
    assert curve["attainment"] == pytest.approx([2 / 3, 2 / 3, 1.0])


def test_slowest10_mean_hand_checked():
    """Mooncake FAST'25's TBT: the mean of the longest 10% of a request's gaps (at least one)."""
    gaps = [0.01] * 17 + [0.2, 0.3, 0.5]  # 20 gaps: the slowest 2 are 0.5 and 0.3
    tokens = np.concatenate([[1.0], 1.0 + np.cumsum(gaps)])
    r = metrics.request_metrics([0.0, 0.5, 1.0], [tokens, [2.0], [1.25, 1.30]])
    assert r["itl_slowest10_mean_s"][0] == pytest.approx(0.4)
    assert math.isnan(r["itl_slowest10_mean_s"][1])  # one token, no gap
    assert r["itl_slowest10_mean_s"][2] == pytest.approx(0.05)  # one gap: itself
    assert metrics.slowest_share_mean_s(gaps) == pytest.approx(0.4)
    assert metrics.slowest_share_mean_s(gaps[:11]) == pytest.approx(0.01)  # ceil(1.1) = 2 gaps
    # the p90 of the gaps (0.22) passes a 0.25 s limit that the slowest-10% mean (0.4) fails
    assert r["itl_p90_s"][0] == pytest.approx(np.percentile(gaps, 90))
    assert metrics.slo_met(r, None, 0.25, "p90").tolist() == [True, True, True]
    assert metrics.slo_met(r, None, 0.25, "slowest10-mean").tolist() == [False, True, True]


def test_effective_request_capacity_is_mooncakes_share():
    """A share of all requests (unfinished ones fail), judged by the slowest-10% mean."""
    gaps = [0.01] * 18 + [0.25, 0.25]  # slowest 2: mean 0.25 s
    slow = np.concatenate([[1.0], 1.0 + np.cumsum(gaps)])
    fast = 2.0 + 0.02 * np.arange(30)
    r = metrics.request_metrics([0.0, 0.0, 0.0, 0.0], [slow, fast, [40.0], []])
    assert metrics.effective_request_capacity(r, 30.0, 0.2) == pytest.approx(1 / 4)
    assert metrics.effective_request_capacity(r, 30.0, 0.3) == pytest.approx(2 / 4)
    assert metrics.effective_request_capacity(r, 50.0, 0.3) == pytest.approx(3 / 4)
    s = metrics.summarize([0.0] * 4, [slow, fast, [40.0], []], ttft_slo_s=30, tbt_slo_s=0.2)
    assert s["effective_request_capacity"] == pytest.approx(1 / 4)
    assert metrics.capacity_gain(0.9, 0.15) == pytest.approx(5.0)  # Mooncake's "+500%"
    assert metrics.capacity_gain(0.5, 0.0) == math.inf


def test_pooled_p99_is_one_verdict_for_the_run_with_a_scheduling_delay_limit():
    """Sarathi-Serve: the p99 of every gap pooled, and the median scheduling delay <= 2 s."""
    steady = [1.0 + 0.01 * np.arange(101), 1.0 + 0.02 * np.arange(51)]
    stall = steady + [[1.0, 1.5]]  # one 0.5 s gap among 151: the pooled p99 stays small
    kw = dict(ttft_slo_s=None, tbt_slo_s=0.05, tbt_stat="pooled-p99")
    s = metrics.summarize([0.0, 0.0, 0.0], stall, **kw)
    gaps = metrics.itl_s(stall)
    assert s["pooled_itl_s"] == pytest.approx(np.percentile(gaps, 99)) and s["pooled_itl_s"] < 0.05
    assert s["slo_attainment"] == 1.0  # every request passes with the pool
    assert metrics.summarize([0.0] * 3, stall, **{**kw, "tbt_slo_s": 0.015})["slo_attainment"] == 0
    late = metrics.summarize([0.0] * 3, stall, scheduling_delay_s=[0.5, 3.0, 3.0], **kw)
    assert late["scheduling_delay_p50_s"] == 3.0 and late["slo_attainment"] == 0.0
    ok = metrics.summarize([0.0] * 3, stall, scheduling_delay_s=[0.5, 1.0, 3.0], **kw)
    assert ok["scheduling_delay_p50_s"] == 1.0 and ok["slo_attainment"] == 1.0
    r = metrics.request_metrics([0.0] * 3, stall)
    with pytest.raises(KvlabError, match="pooled_itl_s"):
        metrics.slo_met(r, None, 0.05, "pooled-p99")
    with pytest.raises(KvlabError, match="per-request"):
        metrics.slo_curve(r, None, (0.1,), "pooled-p99")


def test_unfinished_request_misses_slo_and_is_not_completed():
    s = metrics.summarize([0.0, 0.0], [[0.1, 0.2], []], ttft_slo_s=10, tbt_slo_s=10)
    assert s["requests"] == 2 and s["requests_completed"] == 1
    assert s["slo_attainment"] == pytest.approx(0.5)


def test_same_tpot_different_itl_under_jitter():
    """Two requests with identical TPOT; one has a stall. TPOT cannot tell them apart, ITL can."""
    steady = 0.02 * np.arange(11)
    jumpy = np.concatenate([0.011 * np.arange(10), [0.2]])  # nine 11 ms gaps, then one 101 ms stall
    r = metrics.request_metrics([0.0, 0.0], [steady, jumpy])
    assert r["tpot_s"][0] == pytest.approx(r["tpot_s"][1])
    assert r["itl_max_s"][1] > 4 * r["itl_max_s"][0]


def test_bad_input_is_one_clear_error():
    with pytest.raises(KvlabError, match="back in time"):
        metrics.itl_s([[1.0, 0.5]])
    with pytest.raises(KvlabError, match="before its arrival"):
        metrics.request_metrics([2.0], [[1.0]])
    with pytest.raises(KvlabError, match="offsets"):
        metrics.token_csr([1.0, 2.0], [0, 3])
    with pytest.raises(KvlabError, match="arrival times"):
        metrics.request_metrics([0.0], TOKENS)
    with pytest.raises(KvlabError, match="TBT statistic"):
        metrics.slo_met(metrics.request_metrics(ARRIVALS, TOKENS), 1.0, 0.1, "p50")


def test_records_table_is_json_ready():
    rows = metrics.records_table(metrics.request_metrics(ARRIVALS, TOKENS))
    assert rows[1]["tpot_s"] is None and rows[0]["tokens"] == 4


gap_lists = st.lists(
    st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=0, max_size=30), min_size=1, max_size=8
)


@settings(max_examples=60, deadline=None)
@given(gap_lists, st.lists(st.floats(0.0, 5.0), min_size=8, max_size=8))
def test_properties_against_numpy(gaps, ttfts):
    arrivals = np.arange(len(gaps), dtype=float)
    tokens = [
        arrivals[i] + ttfts[i] + np.concatenate([[0.0], np.cumsum(g)]) for i, g in enumerate(gaps)
    ]
    r = metrics.request_metrics(arrivals, tokens)
    for i, g in enumerate(gaps):
        assert r["ttft_s"][i] == pytest.approx(ttfts[i], abs=1e-9)
        if g:
            # TPOT is the mean gap; the per-request ITL tail is numpy's percentile of the gaps
            assert r["tpot_s"][i] == pytest.approx(np.mean(g), abs=1e-9)
            assert r["itl_p90_s"][i] == pytest.approx(np.percentile(g, 90), abs=1e-9)
            assert r["itl_max_s"][i] == pytest.approx(max(g), abs=1e-9)
            assert r["itl_p90_s"][i] <= r["itl_max_s"][i] + 1e-12
            assert r["itl_slowest10_mean_s"][i] == pytest.approx(
                metrics.slowest_share_mean_s(g), abs=1e-9
            )
            assert r["tpot_s"][i] - 1e-9 <= r["itl_slowest10_mean_s"][i]
            assert r["itl_slowest10_mean_s"][i] <= r["itl_max_s"][i] + 1e-9
        else:
            assert math.isnan(r["tpot_s"][i])
    s = metrics.summarize(arrivals, tokens, ttft_slo_s=2.5, tbt_slo_s=0.5)
    if s["duration_s"] > 0:
        assert s["goodput_tokens_per_s"] <= s["throughput_tokens_per_s"] + 1e-9
    else:  # every token at its arrival instant: no rate to report
        assert s["throughput_tokens_per_s"] is None
    assert 0.0 <= s["slo_attainment"] <= s["ttft_slo_attainment"] + 1e-12

"""kvlab.sim.admission: early rejection as Mooncake's Algorithm 1. Every term of the predicted
TTFT and the predicted TBT decides a case of its own here, so each test fails when its term
is dropped from the prediction; and the prediction is right: an admitted request of the
same case, early rejection off, misses the SLO the prediction said it would."""

from __future__ import annotations

import numpy as np
import pytest

from kvlab import cost
from kvlab.sim import DONE, REJECTED, SimConfig, Simulation, simulate
from kvlab.sim.admission import predict, predicted_tbt_s
from kvlab.traces import Request, Trace

MODEL = "llama-3.1-8b"
KV = cost.kv_bytes_per_token(MODEL)
ONE_EACH = dict(arch="disaggregated", prefill_workers=1, decode_workers=1, prefix_cache="none")


def _ids(start: int, tokens: int) -> tuple:
    return tuple(range(start, start + -(-tokens // 512)))


def _trace(*rows) -> Trace:
    """(arrival_s, prompt tokens, output tokens) rows, no prefix shared."""
    reqs, start = [], 0
    for t, prompt, out in rows:
        reqs.append(Request(t, prompt, out, _ids(start, prompt)))
        start += 1000
    return Trace("admission", tuple(reqs), source="test", generated=True)


def _tight(blocks: int) -> float:
    """memory_fraction of an H100 (80 GB) leaving room for `blocks` 16-token KV blocks."""
    return (cost.weight_bytes(MODEL) + blocks * 16 * KV) / 80e9


def _statuses(r) -> list:
    return ["done" if s == DONE else "rejected" for s in r.records["status"].tolist()]


def _reason(r, i: int) -> str:
    return next(why for j, why, _ in r.rejected if j == i)


def test_the_prefill_queue_ahead_rejects():
    """Two long prompts queue on the only prefill GPU; a third whose own prefill and KV
    move take 0.35 s would wait ~1.07 s behind them: predicted 1.42 s > 1.2 s."""
    trace = _trace((0.0, 32000, 10), (0.001, 16000, 10), (0.002, 16000, 10))
    kw = dict(ONE_EACH, ttft_slo_s=1.2, tbt_slo_s=1.0)
    r = simulate(trace, early_reject=True, **kw)
    assert _statuses(r) == ["done", "done", "rejected"]
    assert "predicted TTFT" in _reason(r, 2)
    plain = simulate(trace, **kw)
    assert plain.records["ttft_s"][2] > 1.2 and plain.records["ttft_s"][:2].max() < 1.2


def test_the_requests_own_prefill_rejects():
    """Alone on an idle cluster, a 64,000-token prompt prefills for ~2.1 s: over 1.5 s."""
    trace = _trace((0.0, 64000, 10), (5.0, 1000, 10))
    kw = dict(ONE_EACH, ttft_slo_s=1.5, tbt_slo_s=1.0)
    r = simulate(trace, early_reject=True, **kw)
    assert _statuses(r) == ["rejected", "done"]
    assert simulate(trace, **kw).records["ttft_s"][0] > 1.5


def test_the_kv_move_rejects_when_not_overlapped():
    """16,000 tokens prefill in 0.31 s, but their 2.1 GB of KV take 1.7 s over 10 GbE: the
    same request over a 400 Gb/s NIC is admitted."""
    trace = _trace((0.0, 16000, 10))
    kw = dict(ONE_EACH, ttft_slo_s=1.0, tbt_slo_s=1.0)
    slow = simulate(trace, early_reject=True, link="ethernet-10g", **kw)
    assert _statuses(slow) == ["rejected"] and "predicted TTFT" in _reason(slow, 0)
    assert _statuses(simulate(trace, early_reject=True, **kw)) == ["done"]
    assert simulate(trace, link="ethernet-10g", **kw).records["ttft_s"][0] > 1.0


def test_a_request_waiting_on_decode_memory_is_rejected():
    """The decode GPU holds 3,500 KV blocks. A 30,000-token request decoding 2,000 tokens
    holds ~1,900 of them for ~10 s; a second one's prompt needs 1,875 more + the 1%
    watermark, so its KV would wait there for the first to finish: predicted TTFT ~9 s,
    over 5 s, although its queue, prefill and move take < 1 s."""
    trace = _trace((0.0, 30000, 2000), (1.0, 30000, 10))
    kw = dict(ONE_EACH, ttft_slo_s=5.0, tbt_slo_s=1.0, memory_fraction=_tight(3500))
    r = simulate(trace, early_reject=True, **kw)
    assert _statuses(r) == ["done", "rejected"]
    why = _reason(r, 1)
    assert "predicted TTFT" in why and "waiting for decode memory" in why
    plain = simulate(trace, **kw)
    assert plain.records["decode_wait_s"][1] > 5.0 and plain.records["ttft_s"][1] > 5.0
    roomy = simulate(trace, early_reject=True, **{**kw, "memory_fraction": _tight(8000)})
    assert _statuses(roomy) == ["done", "done"]


def test_the_decode_memory_wait_is_predicted_from_the_running_sequences():
    """The predicted wait ends when the first request's last step frees its blocks: its
    remaining 2,000 - ~200 steps at its current step time, after the second's prefill."""
    trace = _trace((0.0, 30000, 2000), (1.0, 30000, 10))
    config = SimConfig(**ONE_EACH, memory_fraction=_tight(3500))
    sim = Simulation(trace, config)
    sim._build()
    sim.loop.schedule(0.0, sim._on_arrival, 0)
    sim.loop.run(until_s=0.999)
    decoder, req = sim.decoders[0], sim.requests[1]
    worker = sim.front[0]
    job = float(sim.cost.prefill_times_s(30000, 0)[0])
    p = predict(sim, 1.0, req, worker, 0.0, job)
    first = sim.requests[0]
    step_s = float(sim.cost.decode_times_s(1, 30000.0 + 100))
    left = first.finish_step - decoder.step_now(1.0)
    assert 1500 < left < 2000
    assert p.decode_wait_s == pytest.approx(left * step_s - job, rel=0.02)
    assert p.ttft_s == pytest.approx(p.queue_s + p.prefill_s + p.decode_wait_s + p.transfer_s)


def test_the_predicted_time_between_tokens_rejects():
    """Requests pile onto one decode GPU; once its batch would step slower than 10 ms, new
    requests are turned away by the TBT prediction alone (their TTFT would be met)."""
    rows = [(0.002 * i, 1000, 500) for i in range(300)]
    trace = _trace(*rows)
    kw = dict(ONE_EACH, ttft_slo_s=30.0)
    strict = simulate(trace, early_reject=True, tbt_slo_s=0.01, **kw)
    early = [why for _, why, kind in strict.rejected if kind == "early"]
    assert early and all("time between tokens" in why for why in early)
    assert (strict.records["status"] == DONE).sum() > 50
    lenient = simulate(trace, early_reject=True, tbt_slo_s=1.0, **kw)
    assert lenient.summary()["requests_rejected"] == 0
    plain = simulate(trace, tbt_slo_s=0.01, **kw).summary()
    assert plain["tbt_slo_attainment"] < 0.9 and plain["ttft_slo_attainment"] == 1.0


def test_a_streaming_prefill_is_counted_once_in_the_predicted_batch():
    """KV-centric: a prefill under way has its decode GPU already (its KV streams there), so
    it sits in that GPU's slots; the predicted batch for a newcomer is 2, not 3."""
    trace = _trace((0.0, 16000, 50), (0.01, 1000, 50))
    config = SimConfig(arch="kv-centric", prefill_workers=1, decode_workers=1)
    sim = Simulation(trace, config)
    sim._build()
    sim.loop.schedule(0.0, sim._on_arrival, 0)
    sim.loop.run(until_s=0.005)
    first = sim.front[0].current
    assert first is not None and first.decode_worker == 0 and sim.decoders[0].slots == 1
    got = predicted_tbt_s(sim, sim.requests[1])
    assert got == pytest.approx(float(sim.cost.decode_times_s(2, 1000.0)))


def test_a_remote_prefix_load_reserves_both_nics():
    """A global pool's block lives on the node that prefilled it; loading it elsewhere
    occupies that node's NIC as well as the loader's, so a busy source delays the load."""
    trace = _trace((0.0, 8000, 10), (10.0, 8000, 10))
    trace = Trace(
        "shared",
        (trace.requests[0], Request(10.0, 8000, 10, trace.requests[0].hash_ids)),
        source="test",
        generated=True,
    )
    config = SimConfig(arch="kv-centric", prefill_workers=2, decode_workers=1)
    sim = Simulation(trace, config)
    sim._build()
    sim.loop.schedule(0.0, sim._on_arrival, 0)
    sim.loop.run(until_s=0.5)  # request 0 prefilled on node 0; its blocks live there
    home = sim.requests[0].prefill_worker
    other = sim.front[1 - home]
    sim.network.nic_free_s[sim.front[home].node] = 5.0  # the source NIC is busy until 5 s
    req = sim.requests[1]
    sim.start_prefill(1.0, other, req)
    remote_bytes = req.fetch_remote[0]
    assert remote_bytes > 0 and req.cached_tokens == 8000 - 1
    wire = sim.network.link.time_s(remote_bytes)
    assert req.fetch_s == pytest.approx(5.0 - 1.0 + wire)
    assert sim.network.nic_free_s[sim.front[home].node] == pytest.approx(5.0 + wire)
    assert sim.network.nic_free_s[other.node] >= 5.0 + wire  # then its KV streams out


@pytest.mark.parametrize("arch", ["colocated", "disaggregated", "kv-centric"])
def test_early_rejection_conserves_requests_under_memory_pressure(arch):
    """Every request ends done or rejected exactly once, tokens in order, at overload with
    tight memory, in every architecture."""
    trace = _trace(*[(0.01 * i, 2000 + 500 * (i % 7), 300 + 50 * (i % 5)) for i in range(120)])
    shape = (
        dict(prefill_workers=1, decode_workers=0)
        if arch == "colocated"
        else dict(prefill_workers=1, decode_workers=1)
    )
    r = simulate(
        trace,
        arch=arch,
        early_reject=True,
        ttft_slo_s=2.0,
        tbt_slo_s=0.05,
        memory_fraction=_tight(4000),
        **shape,
    )
    rec = r.records
    assert np.isin(rec["status"], (DONE, REJECTED)).all()
    done = rec["status"] == DONE
    assert done.any() and (~done).any()
    assert rec["tokens"][done].tolist() == rec["output_tokens"][done].tolist()
    assert sorted(i for i, _, _ in r.rejected) == np.flatnonzero(~done).tolist()

"""kvlab.sim.saturation: the highest rate meeting an attainment target, bracketed then
bisected, over seeds or slices; the early stop of a run past saturation never changes a
verdict; the CLI's --saturation contract."""

from __future__ import annotations

import json

import pytest

from kvlab.cli import main
from kvlab.errors import KvlabError
from kvlab.sim import SimConfig, Simulation, simulate, trace_at_rate
from kvlab.sim.saturation import (
    DEFAULT_REL_TOL,
    Saturation,
    saturation,
    seed_samples,
    slice_samples,
)
from kvlab.traces.generate import generate_trace

WORKLOAD = "poisson:rate=8,prompt=lognormal(2048,0.5),output=lognormal(128,0.5),requests=200"
SMALL = SimConfig(arch="disaggregated", prefill_workers=1, decode_workers=1, ttft_slo_s=1.0)


@pytest.fixture(scope="module")
def found() -> Saturation:
    return saturation(SMALL, seed_samples(WORKLOAD, 2))


def test_the_answer_meets_the_target_and_the_bracket_top_misses_it(found):
    assert found.status == ("crossed", "crossed") and found.runs >= 4
    for sample, rate, (lo, hi) in zip(
        seed_samples(WORKLOAD, 2), found.samples_requests_per_s, found.brackets, strict=True
    ):
        assert lo == rate and hi > lo and hi - lo <= DEFAULT_REL_TOL * hi
        at = simulate(trace_at_rate(sample, lo), SMALL).summary()
        above = simulate(trace_at_rate(sample, hi), SMALL).summary()
        assert at["slo_attainment"] >= 0.9 > above["slo_attainment"]
    assert found.at_saturation["slo_attainment"] >= 0.9


def test_the_answer_is_a_brute_force_sweeps_crossing():
    """Replays at every rate of a fine grid, each to its end: the answer lies within the
    grid's step and the tolerance of the highest grid rate before the first miss."""
    sample = seed_samples(WORKLOAD, 1)[0]
    grid = [0.5 * k for k in range(1, 101)]
    first_miss = next(
        i
        for i, r in enumerate(grid)
        if simulate(trace_at_rate(sample, r), SMALL).summary()["slo_attainment"] < 0.9
    )
    brute = grid[first_miss - 1]
    found = saturation(SMALL, [sample]).requests_per_s
    assert brute - 0.5 - DEFAULT_REL_TOL * brute <= found <= brute + 0.5


def test_observe_sees_every_run_and_which_stopped_early():
    """observe(sample, rate, result) is called once per run: the SimResult of a run that
    went to its end (the same as a plain replay at that rate), None for one that stopped
    early, and those are runs that miss the target on their TTFT (or admission)."""
    samples = seed_samples(WORKLOAD, 2)
    seen = []
    out = saturation(SMALL, samples, observe=lambda i, rate, result: seen.append((i, rate, result)))
    assert len(seen) == out.runs and {i for i, _, _ in seen} == {0, 1}
    assert len({(i, rate) for i, rate, _ in seen}) == len(seen)  # never the same run twice
    stopped = [(i, rate) for i, rate, result in seen if result is None]
    assert stopped  # past saturation a run stops early here (TTFT binds at 1 s)
    for i, (lo, hi) in enumerate(out.brackets):
        rates = {rate for j, rate, _ in seen if j == i}
        assert lo in rates and hi in rates
    for i, rate, result in seen:
        full = simulate(trace_at_rate(samples[i], rate), SMALL).summary()
        if result is None:
            assert full["ttft_slo_attainment"] < 0.9
        else:
            assert result.summary()["slo_attainment"] == full["slo_attainment"]
    assert saturation(SMALL, samples).to_dict() == out.to_dict()  # watching changes nothing


def test_a_floor_ends_a_hopeless_search_early():
    """A TBT limit below any decode step is never met: the search halves down to the floor
    and says "below" (capacity 0), in fewer runs the higher the floor."""
    hopeless = SimConfig(arch="colocated", prefill_workers=1, decode_workers=0, tbt_slo_s=1e-5)
    sample = seed_samples(WORKLOAD, 1)
    low = saturation(hopeless, sample, start_rate_per_s=8.0)
    high = saturation(hopeless, sample, start_rate_per_s=8.0, min_rate_per_s=0.5)
    for out in (low, high):
        assert out.status == ("below",) and out.requests_per_s == 0.0
        assert out.brackets[0][0] is None
    assert high.brackets[0][1] == 0.5 and high.runs == 5  # 8, 4, 2, 1, 0.5
    assert low.runs > high.runs


def test_mean_and_spread_over_seeds(found):
    a, b = found.samples_requests_per_s
    assert a != b  # seeds move it
    assert found.requests_per_s == pytest.approx((a + b) / 2)
    assert found.spread_requests_per_s == pytest.approx(abs(a - b) / 2)
    assert found.requests_per_s_per_gpu == pytest.approx(found.requests_per_s / 2)
    d = found.to_dict()
    json.dumps(d, allow_nan=False)
    assert d["saturation_requests_per_s"] == found.requests_per_s
    assert d["saturation_spread_requests_per_s"] == found.spread_requests_per_s


def test_deterministic_and_the_early_stop_changes_no_verdict(found, monkeypatch):
    """The same search again gives the same bytes; with every run replayed to its end (no
    early stop past saturation) the answers are the same."""
    assert saturation(SMALL, seed_samples(WORKLOAD, 2)).to_dict() == found.to_dict()

    def full(self, attainment):
        return self.run()

    monkeypatch.setattr(Simulation, "meets", full)
    slow = saturation(SMALL, seed_samples(WORKLOAD, 2))
    assert slow.samples_requests_per_s == found.samples_requests_per_s


def test_a_run_past_saturation_stops_early_with_the_right_verdict():
    trace = trace_at_rate(seed_samples(WORKLOAD, 1)[0], 200.0)
    full = simulate(trace, SMALL).summary()
    assert full["slo_attainment"] < 0.9
    sim = Simulation(trace, SMALL)
    assert sim.meets(0.9) is None
    assert sim.loop.events < simulate(trace, SMALL).events / 2  # stopped well before the end
    light = trace_at_rate(trace, 1.0)
    assert Simulation(light, SMALL).meets(0.9) is not None


def test_direction_of_effect():
    """More GPUs serve more; a stricter TBT statistic (Mooncake's slowest-10% mean instead
    of TPOT) at a tight limit serves less; a laxer attainment target serves more."""
    samples = seed_samples(WORKLOAD, 1)
    base = dict(ttft_slo_s=1.0, tbt_slo_s=0.012)
    small = saturation(
        SimConfig(arch="colocated", prefill_workers=1, decode_workers=0, **base), samples
    )
    big = saturation(
        SimConfig(arch="colocated", prefill_workers=2, decode_workers=0, **base), samples
    )
    assert big.requests_per_s > 1.5 * small.requests_per_s
    kw = dict(arch="colocated", prefill_workers=1, decode_workers=0, ttft_slo_s=1.0)
    tpot = saturation(SimConfig(**kw, tbt_slo_s=0.012, tbt_stat="mean"), samples)
    slowest = saturation(SimConfig(**kw, tbt_slo_s=0.012, tbt_stat="slowest10-mean"), samples)
    assert slowest.requests_per_s < tpot.requests_per_s
    lax = saturation(SimConfig(**kw, tbt_slo_s=0.012), samples, attainment=0.5)
    assert lax.requests_per_s > small.requests_per_s


def test_samples_seeds_and_slices():
    seeds = seed_samples(WORKLOAD, 3)
    assert [t.name.split("seed=")[1][:1] for t in seeds] == ["0", "1", "2"]
    gen = seed_samples("generated:shared-prefix:5", 2)
    assert [t.source.split("seed ")[1][:1] for t in gen] == ["5", "6"]
    trace = generate_trace("conversation", seed=0, requests=300)
    by_time = slice_samples(trace, 3, duration_s=20.0, warmup_s=10.0)
    assert [t.name.split("[")[1].split(",")[0] for t in by_time] == ["0-20 s", "20-40 s", "40-60 s"]
    assert by_time[0].lead_in == 0 and by_time[1].lead_in > 0
    by_count = slice_samples(trace, 2, limit=50)
    assert [len(t) for t in by_count] == [50, 50]
    assert by_count[1].requests[0].input_tokens == trace.requests[50].input_tokens
    whole = slice_samples(trace, 2)
    assert sum(len(t) for t in whole) == len(trace)
    with pytest.raises(KvlabError, match="fewer than 9 runs"):
        slice_samples(trace, 9, limit=50)
    with pytest.raises(KvlabError, match="no seeds"):
        seed_samples("conversation", 2)


def test_bad_arguments_are_clear_errors():
    for kw in (dict(attainment=0.0), dict(attainment=1.5), dict(rel_tol=-1.0)):
        with pytest.raises(KvlabError):
            saturation(SMALL, seed_samples(WORKLOAD, 1), **kw)
    with pytest.raises(KvlabError, match="at least one"):
        saturation(SMALL, [])
    with pytest.raises(KvlabError, match="min_rate_per_s"):
        saturation(SMALL, seed_samples(WORKLOAD, 1), min_rate_per_s=0.0)
    with pytest.raises(KvlabError, match="observe"):
        saturation(SMALL, seed_samples(WORKLOAD, 1), observe="print")


def test_cli_saturation_contract(capsys):
    argv = [
        "simulate",
        WORKLOAD,
        "--arch",
        "disaggregated",
        "--prefill-workers",
        "1",
        "--decode-workers",
        "1",
        "--ttft-slo",
        "1",
        "--saturation",
        "--seeds",
        "2",
        "--json",
    ]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    want = saturation(SMALL, seed_samples(WORKLOAD, 2))
    assert out["saturation_requests_per_s"] == pytest.approx(want.requests_per_s)
    assert out["saturation_spread_requests_per_s"] == pytest.approx(want.spread_requests_per_s)
    assert out["attainment_target"] == 0.9 and len(out["samples"]) == 2
    assert out["at_saturation"]["slo_attainment"] >= 0.9 and "wall_s" not in out
    assert main(argv[:-1]) == 0
    text = capsys.readouterr().out
    assert "saturation" in text and "requests/s" in text and "2 samples" in text
    for extra, says in (
        (["--records", "x.csv"], "--records"),
        (["--attainment", "2"], "attainment"),
    ):
        assert main(argv + extra) == 2
        assert says in capsys.readouterr().err
    assert main(["simulate", WORKLOAD, "--arch", "colocated", "--seeds", "2"]) == 2
    assert "--saturation" in capsys.readouterr().err

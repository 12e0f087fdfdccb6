"""The capstone chapter, "Plan a deployment" (kvlab/book/plan_a_deployment.py and
plan_searches.py): the searches' results hold the properties the prose states, the panel
and the figure read them faithfully, and the cache hands both editions the same results.

The searches run once per checkout (about four minutes on two cores) and are kept in
the run cache (kvlab.book.run_cache); the book build usually has run them already."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest

from kvlab.book import plan_a_deployment as ch
from kvlab.book import plan_searches as ps
from kvlab.hardware import USABLE_MEMORY_FRACTION, get_device
from kvlab.viz import plan_a_deployment as pp

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "06_plan_a_deployment.ipynb"
MODEL_8B, MODEL_70B = ps.MODELS
SLACK = 1.06  # the bisection stops within 5% of the saturation rate


@pytest.fixture(scope="module")
def searches():
    return ps.searches()


def per_gpu(row) -> float:
    return row["requests_per_s_per_gpu"]


def test_every_search_of_the_chapter_ran_and_kept_its_slos(searches):
    assert set(searches) == set(ps.SEARCHES + ps.EXTRA)
    assert len(ps.SEARCHES) == len(ps.MODELS) * len(ps.TRAFFIC) * len(ps.TBT_TARGETS_S)
    for s, out in searches.items():
        assert out["model"] == s.model
        assert out["slo"] == {
            "ttft_s": s.ttft_s,
            "tbt_s": s.tbt_s,
            "tbt_stat": ps.TBT_STAT,
            "attainment": ps.ATTAINMENT,
        }
        assert out["workload"]["requests"] == ps.REQUESTS


def test_the_best_design_is_ranked_first_and_on_the_pareto_front(searches):
    for s, out in searches.items():
        best = out["best"]
        assert best["key"] == out["designs"][0]["key"]
        assert per_gpu(best) == max(per_gpu(r) for r in out["designs"]) > 0, s.name
        assert best["key"] in out["pareto"], s.name
        # no design on the front is beaten on capacity and both latencies by another
        for key in out["pareto"]:
            r = next(d for d in out["designs"] if d["key"] == key)
            assert r["saturation_requests_per_s"] > 0
        # capacity per GPU is the saturation rate over the GPUs the design uses
        assert per_gpu(best) == pytest.approx(best["saturation_requests_per_s"] / best["gpus"])
        assert best["gpus"] <= sum(out["gpus_offered"].values())


def test_a_looser_tbt_target_never_costs_a_design_capacity(searches):
    """Each design's capacity at a looser TBT target is at least its capacity at a tighter
    one (within the bisection's tolerance), so the front rises with the target."""
    for model in ps.MODELS:
        for traffic in ps.TRAFFIC:
            rates = [
                {r["key"]: per_gpu(r) for r in ch.search(model, traffic, t)["designs"]}
                for t in ps.TBT_TARGETS_S
            ]
            for tight, loose in zip(rates, rates[1:], strict=False):
                for key, value in tight.items():
                    assert loose[key] * SLACK >= value, (model, traffic, key)
            bests = [max(r.values()) for r in rates]
            assert bests == sorted(bests), (model, traffic)


def test_the_tighter_ttft_target_costs_the_70b_capacity(searches):
    tight = ch.search(MODEL_70B, ttft_s=ps.TIGHT_TTFT_SLO_S)["best"]
    assert ps.TIGHT_TTFT_SLO_S < ps.TTFT_SLO_S
    assert per_gpu(tight) < per_gpu(ch.search(MODEL_70B)["best"])


def test_the_premises_of_the_prose_hold(searches):
    """What the chapter explains: the 8B's winner separates decode at the tightest TBT
    target and is colocated at the loosest; the 70B's tightest target is won by instances
    at least as large; long prompts cut capacity by more than they grow; a warm cache
    raises the KV-centric pool's hit ratio more than the colocated instances'."""
    (_, tight8), *_, (_, loose8) = ch.winners(MODEL_8B)
    assert tight8["arch"] != "colocated" and loose8["arch"] == "colocated"
    (_, tight70), *_, (_, loose70) = ch.winners(MODEL_70B)
    assert tight70["tensor_parallel"] >= loose70["tensor_parallel"]
    n = ch.numbers()
    for model in ps.MODELS:
        name = model.split("-")[-1]
        assert float(n[f"long_{name}_times"]) > float(n["long_times_prompt"]) > 1
    cold, warm = ch.search(MODEL_8B), ch.search(MODEL_8B, "warm")
    gain = {
        arch: ch.best_of(warm, arch=arch)["prefix_hit_ratio"]
        - ch.best_of(cold, arch=arch)["prefix_hit_ratio"]
        for arch in ("colocated", "kv-centric")
    }
    assert gain["kv-centric"] > gain["colocated"] >= 0
    assert ch.best_of(warm, arch="kv-centric")["prefix_hit_ratio"] > 0
    # the long-prompt traffic shares nothing
    assert all(r["prefix_hit_ratio"] in (0, None) for r in ch.search(MODEL_8B, "long")["designs"])


def test_tp2_70b_is_pruned_on_h100_for_lack_of_kv_room(searches):
    """70.6B parameters in fp16 are 141 GB; at TP2 each 80 GB H100 (less the usable share)
    keeps 72 - 70.6 = 1.4 GB for KV, so every TP2 design is pruned, none simulated."""
    out = ch.search(MODEL_70B)
    assert {p["tensor_parallel"] for p in out["pruned"]} == {2}
    assert all(r["tensor_parallel"] != 2 for r in out["designs"])
    room = ch.kv_room_bytes(MODEL_70B, "h100-sxm", 2)
    usable = get_device("h100-sxm").capacity_bytes * USABLE_MEMORY_FRACTION
    assert room == pytest.approx(usable - 141.1e9 / 2, rel=0.02)
    assert 1.2e9 < room < 1.7e9
    # TP8 prefills faster than TP4, but less than twice as fast
    assert 1 < ch.prefill_speedup(MODEL_70B, "h100-sxm", 8000.0, 4, 8) < 2


def test_front_is_each_architectures_best_at_each_target(searches):
    terms = ch.terms()
    for model in ps.MODELS:
        for traffic in ps.TRAFFIC:
            line = pp.front(terms, model, traffic)
            assert line["target_ms"] == pytest.approx([1e3 * t for t in ps.TBT_TARGETS_S])
            for i, t in enumerate(ps.TBT_TARGETS_S):
                out = ch.search(model, traffic, t)
                for arch in pp.ARCHS:
                    mine = [per_gpu(r) for r in out["designs"] if r["arch"] == arch]
                    assert line[arch.replace("-", "_")][i] == max(mine, default=0.0)
                tops = [line[a.replace("-", "_")][i] for a in pp.ARCHS]
                assert max(tops) == per_gpu(out["best"])


def test_the_panel_reads_the_searches_as_the_planner_ranked_them(searches):
    terms = ch.terms()
    for model in ps.MODELS:
        for traffic in ps.TRAFFIC:
            for t in ps.TBT_TARGETS_S:
                out = ch.search(model, traffic, t)
                state = pp.plan_state(terms, {"model": model, "traffic": traffic, "tbt_s": t})
                v = state["values"]
                assert v["best"] == ch.words(out["best"])
                assert v["best_per_gpu"] == per_gpu(out["best"])
                assert v["designs"] == len(out["designs"])
                assert v["pruned"] == len(out["pruned"])
                assert state["sources"]["bars"]["per_gpu"] == [per_gpu(r) for r in out["designs"]]
                assert 0 <= v["gap"] < 1
    # the terms hold nothing but the rows: the page stays offline and small
    assert len(json.dumps(terms)) < 100_000


def test_describe_names_each_design():
    assert pp.describe("colocated", 1, 8, 0, "prefill-first", 0) == (
        "colocated, 8 × TP1, prefill-first"
    )
    assert pp.describe("colocated", 4, 4, 0, "chunked", 8192) == (
        "colocated, 4 × TP4, chunked (8,192 tokens per step)"
    )
    assert pp.describe("kv-centric", 1, 4, 4, None, None) == "KV-centric, 4P:4D × TP1"


def test_the_notebook_glues_every_number_it_states():
    numbers = ch.numbers()
    nb = nbformat.read(NOTEBOOK, as_version=4)
    prose = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    used = set(re.findall(r"\{glue:text\}`([^`]*)`", prose))
    assert used and used <= set(numbers), used - set(numbers)
    bare = re.sub(r"\{glue:text\}`[^`]*`", "", prose)
    bare = re.sub(
        r"chapters? \d\w?( and \d)?|MLSys'24|\*\*\d\w?\.|^\d\. |within 30%", "", bare, flags=re.M
    )
    assert not re.findall(r"\d", bare), re.findall(r".{20}\d.{10}", bare)


def test_the_cache_hands_the_other_edition_the_same_results(tmp_path, monkeypatch):
    """A second build finds the file and runs nothing; a different set of searches gets
    another file."""
    calls = []

    def fake_run_all(wanted, workers=None):
        calls.append(len(wanted))
        return [{"search": s.name, "x": 1.5} for s in wanted]

    monkeypatch.setenv("KVLAB_RUN_CACHE", str(tmp_path))
    monkeypatch.setattr(ps, "run_all", fake_run_all)
    first = ps.searches.__wrapped__()
    second = ps.searches.__wrapped__()
    assert calls == [len(ps.SEARCHES + ps.EXTRA)]  # the second read the file
    assert first == second and len(list(tmp_path.glob("ch6-plan-*.pickle"))) == 1
    assert ps.cache_key(ps.SEARCHES) != ps.cache_key(ps.SEARCHES + ps.EXTRA)
    monkeypatch.setenv("KVLAB_RUN_CACHE", "off")
    ps.searches.__wrapped__()
    assert calls == [len(ps.SEARCHES + ps.EXTRA)] * 2  # off: nothing kept, run again

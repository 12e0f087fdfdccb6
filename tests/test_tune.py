"""`--kernels auto`: the CPU decode kernels are chosen by timing them on this machine, once,
and the choice is remembered per machine (CPU model and flags, kernel source, torch, threads)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from kvlab import native  # noqa: E402
from kvlab.decoder import Decoder, tune  # noqa: E402
from kvlab.errors import KvlabError  # noqa: E402

needs_native = pytest.mark.skipif(
    not native.available(), reason=f"native kernels unavailable: {native.status()}"
)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A fresh native cache directory; the process's kernel variant restored afterwards."""
    monkeypatch.setenv("KVLAB_NATIVE_DIR", str(tmp_path))
    before = native.variant()
    yield tmp_path
    native.set_variant(**before)


def fake_timings(**totals_ms) -> dict:
    """A measurement in which each named candidate took `totals_ms` in all."""
    timings = {n.replace("_", "-"): {"total_s": ms / 1e3} for n, ms in totals_ms.items()}
    natives = {n: t for n, t in timings.items() if n.startswith("native")}
    best = min(timings, key=lambda n: timings[n]["total_s"])
    best_native = min(natives, key=lambda n: natives[n]["total_s"])
    parts = best_native.split("-")
    return {
        "kernels": "native" if best.startswith("native") else "torch",
        "best": best,
        "native": {"name": best_native, "prefetch": parts[1], "amx": parts[-1] == "amx"},
        "timings_s": timings,
        "working_set_bytes": 256 << 20,
    }


@needs_native
def test_measure_times_every_candidate_and_picks_the_fastest(cache_dir, monkeypatch):
    monkeypatch.setattr(tune, "MIN_WORKING_SET_BYTES", 8 << 20)
    monkeypatch.setattr(tune, "MAX_WORKING_SET_BYTES", 8 << 20)
    result = tune.measure(rounds=1)
    names = {c["name"] for c in tune.candidates()}
    assert set(result["timings_s"]) == names and "torch" in names
    assert {"native-nta", "native-l2"} <= names
    assert ("native-l2-amx" in names) == native.amx_available()
    totals = {n: t["total_s"] for n, t in result["timings_s"].items()}
    assert all(t > 0 for t in totals.values())
    assert result["best"] == min(totals, key=totals.get)
    assert result["kernels"] == ("torch" if result["best"] == "torch" else "native")
    native_totals = {n: t for n, t in totals.items() if n != "torch"}
    assert result["native"]["name"] == min(native_totals, key=native_totals.get)
    # each total is the sum of its four workloads (weights and KV at batch 1 and 8)
    for t in result["timings_s"].values():
        parts = [v for k, v in t.items() if k != "total_s"]
        assert len(parts) == 4 and sum(parts) == pytest.approx(t["total_s"])


@needs_native
def test_choice_is_measured_once_and_cached_per_machine(cache_dir, monkeypatch):
    calls = []

    def measure():
        calls.append(1)
        return fake_timings(native_nta=30, native_l2=20, torch=25)

    monkeypatch.setattr(tune, "measure", measure)
    first = tune.choice()
    assert not first["cached"] and first["best"] == "native-l2"
    second = tune.choice()
    assert second["cached"] and second["best"] == "native-l2" and len(calls) == 1
    saved = json.loads((cache_dir / f"kernel-choice-{tune.cache_key()}.json").read_text())
    assert saved["timings_s"]["torch"]["total_s"] == 0.025
    # another CPU (or other flags) is another machine: its own key, measured again
    monkeypatch.setattr(native, "_cpu", lambda: ("Another CPU", {"avx512f", "avx512_bf16"}))
    assert not tune.choice()["cached"] and len(calls) == 2
    # a damaged file is measured again, not trusted
    path = tune.cache_path()
    path.write_text("{not json")
    assert not tune.choice()["cached"] and len(calls) == 3
    assert tune.choice(refresh=True)["cached"] is False and len(calls) == 4


@needs_native
@pytest.mark.parametrize(
    "totals,auto,variant",
    [
        (dict(native_nta=40, native_l2=20, torch=30), "native", ("l2", False)),
        (dict(native_nta=20, native_l2=40, torch=30), "native", ("nta", False)),
        # slower native kernels are never picked by auto, but "native" gets its fastest variant
        (dict(native_nta=60, native_l2=45, torch=30), "torch", ("l2", False)),
    ],
)
def test_auto_takes_the_faster_kernel_set(cache_dir, monkeypatch, totals, auto, variant):
    monkeypatch.setattr(tune, "measure", lambda: fake_timings(**totals))
    m = Decoder("tiny", "bf16")
    assert m.kernels == auto
    assert m.kernels_note.startswith("native C kernels" if auto == "native" else "PyTorch")
    assert m.kernel_choice["best"] == min(totals, key=totals.get).replace("_", "-")
    forced = Decoder("tiny", "bf16", kernels="native")
    assert forced.kernels == "native"
    assert (native.variant()["prefetch"], native.variant()["amx"]) == variant
    assert Decoder("tiny", "bf16", kernels="torch").kernel_choice is None  # nothing timed


def test_no_native_kernels_means_only_torch_is_timed(monkeypatch):
    from kvlab.decoder import linear

    monkeypatch.setattr(native, "available", lambda: False)
    monkeypatch.setattr(linear, "onednn_layout", lambda w: None)  # and no oneDNN prepacking
    monkeypatch.setattr(tune, "MIN_WORKING_SET_BYTES", 4 << 20)
    monkeypatch.setattr(tune, "MAX_WORKING_SET_BYTES", 4 << 20)
    assert [c["name"] for c in tune.candidates()] == ["torch"]
    result = tune.measure(rounds=1)
    assert result["kernels"] == "torch" and result["native"] is None
    assert list(result["timings_s"]) == ["torch"]
    with pytest.raises(KvlabError, match="native kernels unavailable"):
        tune.require_native({"native": None})


def test_last_level_cache_bounds_the_working_set(monkeypatch):
    monkeypatch.setattr(tune, "last_level_cache_bytes", lambda: 32 << 20)
    assert tune.working_set_bytes() == tune.MIN_WORKING_SET_BYTES
    monkeypatch.setattr(tune, "last_level_cache_bytes", lambda: 480 << 20)
    assert tune.working_set_bytes() == tune.MAX_WORKING_SET_BYTES
    monkeypatch.setattr(tune, "last_level_cache_bytes", lambda: 200 << 20)
    assert tune.working_set_bytes() == 400 << 20

"""`--kernels auto`: the CPU decode kernels are chosen by timing them on this machine, once,
and the choice is remembered per machine (CPU model and flags, kernel source, torch, threads)."""

from __future__ import annotations

import json
import threading
import time

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


def fake_timings(**ms) -> dict:
    """A measurement in which candidate NAME took `ms[NAME] = (weights ms, attention ms)`, or
    (weights, attention, attention over int8 KV) ms."""
    timings = {
        n.replace("_", "-"): {
            "weights_s": t[0] / 1e3,
            "attention_s": t[1] / 1e3,
            "total_s": (t[0] + t[1]) / 1e3,
            **({"attention_int8_s": t[2] / 1e3} if len(t) > 2 else {}),
        }
        for n, t in ms.items()
    }
    by_name = {}
    for n in timings:
        parts = n.split("-")
        by_name[n] = (
            {"name": n, "kernels": "torch"}
            if n == "torch"
            else {"name": n, "kernels": "native", "prefetch": parts[1], "amx": parts[-1] == "amx"}
        )
    return {**tune.pick(timings, by_name), "timings_s": timings, "working_set_bytes": 256 << 20}


@needs_native
def test_measure_times_every_candidate_and_picks_the_fastest(cache_dir, monkeypatch):
    monkeypatch.setattr(tune, "MIN_WORKING_SET_BYTES", 8 << 20)
    monkeypatch.setattr(tune, "MAX_WORKING_SET_BYTES", 8 << 20)
    result = tune.measure(rounds=1)
    names = {c["name"] for c in tune.candidates()}
    assert set(result["timings_s"]) == names and "torch" in names
    assert {"native-nta", "native-l2"} <= names
    assert ("native-l2-amx" in names) == native.amx_available()
    t = result["timings_s"]
    natives = [n for n in t if n != "torch"]
    best_w = min(natives, key=lambda n: t[n]["weights_s"])
    best_a = min(natives, key=lambda n: t[n]["attention_s"])
    assert result["native"]["weights"]["name"] == best_w
    assert result["native"]["attention"]["name"] == best_a
    best_a8 = min(natives, key=lambda n: t[n]["attention_int8_s"])
    assert result["native"]["attention_int8"]["name"] == best_a8
    native_s = t[best_w]["weights_s"] + t[best_a]["attention_s"]
    assert result["native"]["total_s"] == pytest.approx(native_s)
    assert result["kernels"] == ("native" if native_s < t["torch"]["total_s"] else "torch")
    # each total is the sum of its four workloads (weights and bf16 KV at batch 1 and 8); the
    # native variants also time int8 KV at both batches, apart from the total
    for name, times in t.items():
        parts = [v for k, v in times.items() if k.endswith(" s") and not k.startswith("kv-int8")]
        assert len(parts) == 4 and all(v > 0 for v in parts)
        assert sum(parts) == pytest.approx(times["total_s"])
        assert times["weights_s"] + times["attention_s"] == pytest.approx(times["total_s"])
        int8 = [v for k, v in times.items() if k.startswith("kv-int8")]
        assert len(int8) == (0 if name == "torch" else 2) and all(v > 0 for v in int8)
        if int8:
            assert sum(int8) == pytest.approx(times["attention_int8_s"])


@needs_native
def test_choice_is_measured_once_and_cached_per_machine(cache_dir, monkeypatch):
    calls = []

    def measure():
        calls.append(1)
        return fake_timings(native_nta=(20, 10), native_l2=(10, 10), torch=(15, 10))

    monkeypatch.setattr(tune, "measure", measure)
    first = tune.choice()
    assert not first["cached"] and first["native"]["weights"]["name"] == "native-l2"
    second = tune.choice()
    assert second["cached"] and second["kernels"] == "native" and len(calls) == 1
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


def test_processes_that_start_together_time_the_kernels_once(cache_dir, monkeypatch):
    """Two runs that start at once (the workers of a test run, two benchmarks) do not time
    the kernels side by side, which would disturb both timings: one measures, the other
    waits for it and reads its choice. (flock excludes two open files of one process too,
    so threads stand in for the processes.)"""
    calls, inside, overlapped = [], [], []

    def measure():
        inside.append(1)
        overlapped.append(len(inside) > 1)
        calls.append(1)
        time.sleep(0.3)  # long enough for the other thread to arrive and wait
        inside.pop()
        return fake_timings(native_nta=(20, 10), native_l2=(10, 10), torch=(15, 10))

    monkeypatch.setattr(tune, "measure", measure)
    results = []
    threads = [threading.Thread(target=lambda: results.append(tune.choice())) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and overlapped == [False]
    assert sorted(r["cached"] for r in results) == [False, True]
    assert results[0]["native"] == results[1]["native"]


def test_the_library_is_built_once_by_processes_that_start_together(tmp_path, monkeypatch):
    built = []

    def compile_(cc, directory, target):
        built.append(target)
        time.sleep(0.3)
        target.write_bytes(b"library")

    monkeypatch.setattr(native, "_compile", compile_)
    paths = []
    threads = [
        threading.Thread(target=lambda: paths.append(native.build(tmp_path))) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 1 and paths == [built[0], built[0]]


@needs_native
@pytest.mark.parametrize(
    "ms,auto,weights,attention",
    [
        # one variant fastest for both
        (
            dict(native_nta=(30, 20), native_l2=(15, 10), torch=(20, 30)),
            "native",
            ("l2", False),
            ("l2", False),
        ),
        # int8 attention timed: its own fastest variant, which does not enter the choice
        (
            dict(native_l2=(15, 10, 30), native_l2_amx=(16, 12, 20), torch=(20, 30)),
            "native",
            ("l2", False),
            ("l2", False),
        ),
        # each operation its own variant: 10 + 8 beats PyTorch's 30 though no variant alone does
        (
            dict(native_nta=(20, 8), native_l2=(10, 30), torch=(15, 15)),
            "native",
            ("l2", False),
            ("nta", False),
        ),
        # slower native kernels are never picked by auto; "native" still gets its fastest
        (
            dict(native_nta=(60, 40), native_l2=(45, 30), torch=(20, 30)),
            "torch",
            ("l2", False),
            ("l2", False),
        ),
    ],
)
def test_auto_takes_the_faster_kernel_set(cache_dir, monkeypatch, ms, auto, weights, attention):
    monkeypatch.setattr(tune, "measure", lambda: fake_timings(**ms))
    m = Decoder("tiny", "bf16")
    assert m.kernels == auto
    assert m.kernels_note.startswith("native C kernels" if auto == "native" else "PyTorch")
    forced = Decoder("tiny", "bf16", kernels="native")
    assert forced.kernels == "native"
    v = native.variant()
    assert (v["weights"]["prefetch"], v["weights"]["amx"]) == weights
    assert (v["attention"]["prefetch"], v["attention"]["amx"]) == attention
    timed_int8 = all(len(t) > 2 for n, t in ms.items() if n != "torch")
    int8 = (v["attention_int8"]["prefetch"], v["attention_int8"]["amx"])
    assert int8 == (("l2", True) if timed_int8 else attention)  # untimed: the bf16 one's
    env = forced.kernels_environment()
    assert env["kernel_variant"] == v and "kvlab's" in env["kernel_timing"]["note"]
    assert Decoder("tiny", "bf16", kernels="torch").kernel_choice is None  # nothing timed


def test_no_native_kernels_means_only_torch_is_timed(monkeypatch):
    from kvlab.decoder import linear  # noqa: PLC0415 - torch loads only when used

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

"""Benchmarks run end to end in quick mode (into a temporary KVLAB_RESULTS_DIR), write
well-formed JSON, stay bounded, and feed the book's data functions. No speed is asserted:
the figures are measured and reported, not tested."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")

from kvlab.bench import report  # noqa: E402
from kvlab.bench.recompute import crossover  # noqa: E402
from kvlab.bench.results import machine_slug, write_result  # noqa: E402
from kvlab.bench.timing import Budget, time_call  # noqa: E402
from kvlab.cli import main  # noqa: E402

DECODE_KEYS = {"batch", "context", "placement", "kv_dtype", "measured_step_s", "predicted_step_s", "error",
               "achieved_bytes_per_s", "fraction_of_bandwidth", "step_bytes"}


@pytest.fixture()
def results(tmp_path, monkeypatch):
    monkeypatch.setenv("KVLAB_RESULTS_DIR", str(tmp_path))
    return tmp_path


def bench(capsys, *argv):
    code = main(["bench", *argv, "--device", "cpu", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "kvlab bench" in err  # progress went to stderr, not into the JSON
    return json.loads(out)


def test_memory_quick(results, capsys):
    r = bench(capsys, "memory", "--quick")
    assert r["bandwidth_bytes_per_s"] > 1e8 and r["matmul_flops_per_s"]["bf16"] > 1e8
    assert {p["kernel"] for p in r["points"]} == {"copy", "read", "write"}
    copy = [p for p in r["points"] if p["kernel"] == "copy"]
    assert all(p["bytes_moved"] == 2 * p["size_bytes"] for p in copy)  # STREAM: read + write
    assert all(p["min_s"] <= p["median_s"] <= p["max_s"] for p in r["points"])
    path = results / machine_slug("cpu") / "memory-quick.json"
    assert json.loads(path.read_text())["bandwidth_bytes_per_s"] == r["bandwidth_bytes_per_s"]
    assert r["environment"]["torch"] and r["environment"]["device_name"]


def test_transfer_quick(results, capsys):
    r = bench(capsys, "transfer", "--quick")
    assert r["bandwidth_bytes_per_s"] > 1e8
    assert {p["direction"] for p in r["points"]} == {"h2h"}  # no accelerator: host -> host


def test_decode_quick_points_carry_the_contract(results, capsys):
    r = bench(capsys, "decode", "--quick")
    assert r["points"] and not r["skipped"]
    for p in r["points"]:
        assert DECODE_KEYS <= set(p)
        assert p["measured_step_s"] > 0 and p["predicted_step_s"] > 0
        assert p["error"] == pytest.approx(p["measured_step_s"] / p["predicted_step_s"] - 1)
        assert p["achieved_bytes_per_s"] == pytest.approx(p["step_bytes"] / p["measured_step_s"])
    assert {p["placement"] for p in r["points"]} == {"device", "host"}
    assert {p["kv_dtype"] for p in r["points"]} == {"bf16", "int8"}
    # the ledger counts the bytes: more context, more bytes; int8 KV moves fewer than bf16
    by = {(p["placement"], p["kv_dtype"], p["batch"], p["context"]): p for p in r["points"]}
    assert by[("device", "bf16", 2, 1024)]["step_bytes"] > by[("device", "bf16", 2, 256)]["step_bytes"]
    assert by[("device", "int8", 2, 1024)]["step_bytes"] < by[("device", "bf16", 2, 1024)]["step_bytes"]
    host, dev = by[("host", "bf16", 2, 1024)], by[("device", "bf16", 2, 1024)]
    assert host["predicted_step_s"] > dev["predicted_step_s"] and host["fetch_bytes"] == dev["kv_read_bytes"]
    assert r["model"]["streamed_weight_bytes"] == pytest.approx(r["model"]["ledger_weight_read_bytes"])
    assert (results / machine_slug("cpu") / "decode-quick.json").exists()


def test_decode_compares_kernels_point_by_point(results, capsys):
    from kvlab import native

    if not native.available():
        pytest.skip(f"needs kvlab's native kernels: {native.status()}")
    r = bench(capsys, "decode", "--quick", "--batches", "1", "--contexts", "512", "--compare-kernels")
    assert {p["kernels"]["attention"] for p in r["points"]} == {"native"}
    written = results / machine_slug("cpu") / "decode-torch-kernels-quick.json"
    other = json.loads(written.read_text())
    # only device placement is compared, every such point once, with PyTorch's kernels
    assert [(p["placement"], p["kv_dtype"]) for p in other["points"]] == \
        [(p["placement"], p["kv_dtype"]) for p in r["points"] if p["placement"] == "device"]
    assert {p["kernels"]["attention"] for p in other["points"]} == {"torch"}
    assert other["environment"]["kernels"] == "torch" and r["comparison_summary"] == other["summary"]
    # same shapes, same bytes: the ledger's prediction differs only by the bandwidth around each point
    for a, b in zip([p for p in r["points"] if p["placement"] == "device"], other["points"]):
        assert a["step_bytes"] == b["step_bytes"]


def test_decode_time_budget_skips_points(results, capsys):
    r = bench(capsys, "decode", "--quick", "--preset", "tiny", "--budget", "0.01", "--no-write")
    assert not r["points"] and r["skipped"] and all(s["reason"] == "time budget exhausted" for s in r["skipped"])
    assert not (results / machine_slug("cpu")).exists()


def test_recompute_vs_fetch_quick(results, capsys):
    r = bench(capsys, "recompute-vs-fetch", "--quick")
    (curve,) = r["curves"]
    assert [p["tokens"] for p in curve["points"]] == [16, 64, 256]
    for p in curve["points"]:
        assert p["recompute_s"] > 0 and p["fetch_s"] > 0 and p["predicted_fetch_s"] > 0
        assert p["kv_bytes"] == p["tokens"] * curve["kv_bytes_per_token"]


@pytest.mark.slow
def test_all_quick_writes_every_benchmark(results, capsys):
    code = main(["bench", "all", "--device", "cpu", "--quick", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and set(out) == {"memory", "transfer", "recompute-vs-fetch", "decode"}
    folder = results / machine_slug("cpu")
    from kvlab import native

    expected = ["decode-quick.json", "memory-quick.json", "recompute-vs-fetch-quick.json", "transfer-quick.json"]
    if native.available():  # the decode points timed again with PyTorch's kernels
        expected.insert(1, "decode-torch-kernels-quick.json")
    assert sorted(p.name for p in folder.glob("*.json")) == expected
    assert report.machines() == {}  # quick results stay out of the book by default
    assert machine_slug("cpu") in report.machines(include_quick=True)


@pytest.mark.parametrize("argv,fragment", [
    (["decode", "--contexts", "0"], "whole numbers >= 1"),
    (["decode", "--kv-dtypes", "int3"], "unknown kv dtype"),
    (["decode", "--preset", "huge"], "unknown decoder preset"),
    (["memory", "--budget", "-1"], "--budget must be > 0"),
    (["memory", "--device", "tpu"], "not a torch device"),
])
def test_bad_input_is_one_line(results, capsys, argv, fragment):
    code = main(["bench", *argv, "--quick", "--no-write"] + ([] if "--device" in argv else ["--device", "cpu"]))
    err = capsys.readouterr().err.strip()
    assert code == 2 and fragment in err and len(err.splitlines()) == 1


def test_gpu_suite_without_cuda_says_what_to_do(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["bench", "gpu-suite"]) == 2
    assert "kvlab bench all" in capsys.readouterr().err


# ----------------------------------------------------------------- pure pieces

def test_crossover_hand_checked():
    # fetch = 10 x N us, recompute = 1000 us flat: equal at N = 100
    n = [1, 10, 1000, 10000]
    assert crossover(n, [1e-3] * 4, [1e-5 * x for x in n]) == pytest.approx(100)
    assert crossover(n, [1.0] * 4, [1e-3] * 4) is None  # fetch always cheaper
    assert crossover([1, 4], [1.0, 1.0], [1.0, 2.0]) == 1.0  # equal at the first point


def test_time_call_statistics():
    calls = []
    t = time_call(lambda: calls.append(1), "cpu", repeats=5, warmup=2, inner=3)
    assert len(calls) == 2 + 5 * 3 and t.repeats == 5 and t.min_s <= t.p25_s <= t.median_s <= t.p75_s <= t.max_s
    assert Budget(None).allows(1e9) and not Budget(1.0).allows(2.0)


def _fake_decode(machine_dir, device_name, error):
    points = []
    for placement in ("device", "host"):
        for batch in (1, 8):
            for ctx in (1024, 4096):
                measured = 0.01 * (1 + error) * batch
                points.append({"batch": batch, "context": ctx, "placement": placement, "prefetch": False,
                               "kv_dtype": "bf16", "measured_step_s": measured, "predicted_step_s": 0.01 * batch,
                               "error": error, "achieved_bytes_per_s": 1e9, "fraction_of_bandwidth": 0.8 - error,
                               "step_bytes": 1e7, "spread": 0.01, "bandwidth_bytes_per_s": 2e9})
    return {"benchmark": "decode", "environment": {"device_name": device_name, "device": "cpu"},
            "model": {"preset": "cpu-bench", "weight_dtype": "bf16"}, "bandwidth_bytes_per_s": 2e9,
            "machine": {"flops_per_s": 1e12}, "points": points}


def test_report_reads_every_machine(results):
    write_result("decode", _fake_decode("a", "CPU A", 0.05), machine="cpu-a")
    write_result("decode", _fake_decode("b", "GPU B", 0.20), machine="gpu-b")
    write_result("decode-quick", _fake_decode("c", "CPU C", 0.0), machine="cpu-c")
    data = report.decode_comparison(placement="device")
    assert [d["machine"] for d in data] == ["cpu-a", "gpu-b"]
    pts = data[1]["points"]
    assert set(pts["placement"]) == {"device"} and len(pts["context"]) == 4
    np.testing.assert_allclose(pts["measured_step_s"] / pts["predicted_step_s"] - 1, 0.20)
    rows = {t["machine"]: t["rows"] for t in report.targets()}
    assert rows["cpu-a"][0]["max_abs_error"] == pytest.approx(0.05)
    assert rows["gpu-b"][1]["fraction_of_bandwidth_min"] == pytest.approx(0.6)
    assert len(report.decode_comparison(include_quick=True)) == 3


def test_report_keeps_the_pytorch_kernel_run_apart(results):
    native_run = _fake_decode("a", "CPU A", 0.05)
    native_run["environment"].update(kernels="native", kernels_note="native C kernels")
    write_result("decode", native_run, machine="cpu-a")
    write_result("decode-torch-kernels", _fake_decode("a", "CPU A", 0.5), machine="cpu-a")
    [default] = report.decode_comparison("device")
    [torch_run] = report.decode_comparison("device", kernels="torch")
    assert default["kernels"] == "native" and torch_run["kernels"] == "torch"  # older files: PyTorch
    np.testing.assert_allclose(torch_run["points"]["error"], 0.5)
    assert report.targets(kernels="torch")[0]["rows"][0]["max_abs_error"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="kernels"):
        report.decode_comparison(kernels="fast")
    from kvlab.book import measured as chapter
    from kvlab.viz import measured

    assert chapter.decode_summary() == (
        "On CPU A with kvlab's kernels (bf16 KV): at batch 1 the steps used at least 75.0% of the copy bandwidth "
        "and the ledger was within 5.00%; at batch 8 the steps used at least 75.0% of the copy bandwidth and the "
        "ledger was within 5.00%.")
    assert chapter.decode_summary("torch").startswith("On CPU A with PyTorch's kernels (bf16 KV): at batch 1 the "
                                                       "steps used at least 30.0% of the copy bandwidth and the "
                                                       "ledger was within 50.0%")
    assert chapter.decode_summary(kv_dtype="int8") == ""
    assert chapter.kernels_notes() == "native C kernels" and chapter.bandwidth_range() == "2.00 GB/s to 2.00 GB/s"
    labels = [item.label["value"] for item in measured.bandwidth_figure().legend[0].items]
    assert any(lab.endswith("kvlab kernels") for lab in labels)
    assert any(lab.endswith("PyTorch kernels") for lab in labels)
    pace = [item.label["value"] for item in measured.pace_figure().legend[0].items]
    assert "achieved = copy bandwidth" in pace and any(lab.endswith("PyTorch kernels") for lab in pace)


def test_pace_summary_tells_the_two_memory_states_apart(results):
    from kvlab.book import measured

    run = _fake_decode("a", "CPU A", 0.05)
    write_result("decode", run, machine="cpu-a")
    assert measured.pace_summary().startswith("In the recorded run on CPU A the copy bandwidth around these steps "
                                              "stayed between 2.00 GB/s and 2.00 GB/s, and the cores kept up")
    for p in run["points"][:2]:  # two steps while the machine's memory was faster
        p["bandwidth_bytes_per_s"], p["fraction_of_bandwidth"] = 4e9, 0.6
    write_result("decode", run, machine="cpu-a")
    assert measured.pace_summary().startswith(
        "On CPU A some steps ran while the copy bandwidth was up to 4.00 GB/s instead of 2.00 GB/s to 2.00 GB/s: "
        "those used 60.0% to 60.0% of it, the others 75.0% to 75.0%.")


def test_report_recompute_curves(results):
    curve = {"preset": "p", "kv_bytes_per_token": 10.0, "streamed_weight_bytes": 1.0,
             "points": [{"tokens": n, "recompute_s": 1e-3, "fetch_s": 1e-5 * n, "predicted_recompute_s": 1e-3,
                         "predicted_fetch_s": 1e-5 * n} for n in (1, 10, 1000)],
             "crossover_tokens": 100.0, "predicted_crossover_tokens": 100.0}
    write_result("recompute-vs-fetch", {"environment": {"device_name": "X"}, "machine": {}, "curves": [curve]},
                 machine="m")
    (c,) = report.recompute_curves()
    assert c["crossover_tokens"] == 100.0 and c["fetch_pageable_s"] is None
    np.testing.assert_allclose(c["tokens"], [1, 10, 1000])


def test_measure_undisturbed_retries_when_another_process_stalled_the_cpu(monkeypatch):
    import time as _time

    from kvlab.bench import timing

    stalls = iter([0.0, 1e9, 1e9, 1e9 + 10])  # PSI counter (us): attempt 1 stalled, attempt 2 quiet
    monkeypatch.setattr(timing, "_stall_total_us", lambda: next(stalls))
    calls = []

    def measure():
        calls.append(1)
        _time.sleep(0.01)
        return len(calls)

    result, stall, attempts = timing.measure_undisturbed(measure, max_stall=0.05, attempts=3)
    assert (result, attempts) == (2, 2) and stall < 0.05


def test_suite_survives_a_broken_benchmark(results, monkeypatch, capsys):
    """A one-shot GPU run must not lose every result to one crash: the others still run and
    are written, the failure is reported, and the exit status says something failed."""
    import kvlab.bench.decode as decode
    import kvlab.bench.memory as memory
    import kvlab.bench.recompute as recompute
    import kvlab.bench.transfer as transfer

    def fake(kind):
        return lambda device, **kw: {"benchmark": kind, "environment": {}, "bandwidth_bytes_per_s": 1.0,
                                     "points": [], "skipped": [], "summary": {}, "curves": []}

    def boom(device, **kw):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(memory, "run_memory", fake("memory"))
    monkeypatch.setattr(transfer, "run_transfer", fake("transfer"))
    monkeypatch.setattr(decode, "run_decode", fake("decode"))
    monkeypatch.setattr(recompute, "run_recompute", boom)
    code = main(["bench", "all", "--device", "cpu", "--json"])
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert code == 1 and "kernel exploded" in out["recompute-vs-fetch"]["error"]
    assert "Traceback" in captured.err and out["decode"]["written_to"]
    assert (results / machine_slug("cpu") / "decode.json").exists()

"""Benchmarks run end to end in quick mode (into a temporary KVLAB_RESULTS_DIR), write
well-formed JSON, stay bounded, and feed the book's data functions. No speed is asserted:
the figures are measured and reported, not tested."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tarfile
import time as _time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import kvlab.bench.memory as memory
from kvlab import hardware
from kvlab.bench import gpu_session

pytest.importorskip("torch")

from kvlab import native
from kvlab.bench import (
    decode,
    host_copy,
    kernel_table,
    recompute,
    report,  # noqa: E402
    timing,
)
from kvlab.bench.decode import (
    GRIDS,
    HOST_MAX_TOKENS,
    decode_groups,
    make_step,
    resolve_grid,
    skip_record,
)
from kvlab.bench.findings import findings
from kvlab.bench.gpu_session import MAX_DEPTH, MAX_FILES
from kvlab.bench.recompute import crossover  # noqa: E402
from kvlab.bench.results import machine_slug, results_dir, write_result  # noqa: E402
from kvlab.bench.timing import Budget, time_call  # noqa: E402
from kvlab.book import measured as chapter
from kvlab.cli import main  # noqa: E402
from kvlab.decoder import Decoder, fit, ledger
from kvlab.errors import KvlabError
from kvlab.hardware import get_device

#: The checkout: the GPU session runs its steps (kvlab, tests/) from here.
ROOT = Path(__file__).resolve().parents[1]

DECODE_KEYS = {
    "batch",
    "context",
    "placement",
    "kv_dtype",
    "measured_step_s",
    "predicted_step_s",
    "error",
    "achieved_bytes_per_s",
    "fraction_of_bandwidth",
    "step_bytes",
}


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


def test_decode_compares_kernels_point_by_point(results, capsys):
    if not native.available():
        pytest.skip(f"needs kvlab's native kernels: {native.status()}")
    r = bench(
        capsys,
        "decode",
        "--quick",
        "--batches",
        "1",
        "--contexts",
        "512",
        "--kernels",
        "native",
        "--compare-kernels",
    )
    assert {p["kernels"]["attention"] for p in r["points"]} == {"native"}
    written = results / machine_slug("cpu") / "decode-torch-kernels-quick.json"
    other = json.loads(written.read_text())
    # only device placement is compared, every such point once, with PyTorch's kernels
    assert [(p["placement"], p["kv_dtype"]) for p in other["points"]] == [
        (p["placement"], p["kv_dtype"]) for p in r["points"] if p["placement"] == "device"
    ]
    assert {p["kernels"]["attention"] for p in other["points"]} == {"torch"}
    assert other["environment"]["kernels"] == "torch"
    assert r["comparison_summary"] == other["summary"]
    # same shapes, same bytes: the ledger's prediction differs only by the bandwidth around
    # each point
    on_device = [p for p in r["points"] if p["placement"] == "device"]
    for a, b in zip(on_device, other["points"], strict=True):
        assert a["step_bytes"] == b["step_bytes"]


def test_results_dir_follows_the_current_folder_not_the_package(tmp_path, monkeypatch):
    """Without $KVLAB_RESULTS_DIR: a checkout's results/ from anywhere inside it (the book's
    notebooks run in notebooks/), else ./results; the variable wins over both."""
    monkeypatch.delenv("KVLAB_RESULTS_DIR", raising=False)
    checkout = tmp_path / "checkout"
    for folder in ("kvlab", "results", "notebooks"):
        (checkout / folder).mkdir(parents=True)
    monkeypatch.chdir(checkout / "notebooks")
    assert results_dir() == checkout / "results"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert results_dir() == elsewhere / "results"
    monkeypatch.setenv("KVLAB_RESULTS_DIR", str(tmp_path / "mine"))
    assert results_dir() == tmp_path / "mine"


@pytest.mark.parametrize("where", ["file", "below-a-file"])
def test_unusable_results_dir_is_refused_before_the_work(tmp_path, monkeypatch, capsys, where):
    """A benchmark that cannot save its result says so before it runs (one line, exit 2),
    not after minutes of measuring; with --no-write it runs."""
    afile = tmp_path / "afile"
    afile.write_text("")
    target = afile if where == "file" else afile / "results"
    monkeypatch.setenv("KVLAB_RESULTS_DIR", str(target))

    def never(*args, **kwargs):
        raise AssertionError("the benchmark ran")

    monkeypatch.setattr(memory, "run_memory", never)
    for bench_name in ("memory", "decode", "all"):
        code = main(["bench", bench_name, "--quick", "--device", "cpu"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        assert f"cannot save results to {target}" in err and "--no-write" in err
        assert f"{afile} is not a folder" in err
    assert afile.read_text() == ""


def test_a_result_that_cannot_be_saved_is_printed_first(results, capsys, monkeypatch):
    """Checked before the run; should the disk still fail at the end, the result is printed
    and the failure is one line (exit 2), so nothing measured is lost."""

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("kvlab.bench.results.write_result", full)
    code = main(["bench", "memory", "--quick", "--device", "cpu", "--json"])
    out, err = capsys.readouterr()
    assert code == 2 and json.loads(out)["bandwidth_bytes_per_s"] > 0
    assert err.strip().endswith(
        "the result above could not be saved: [Errno 28] No space left on device"
    )


@pytest.mark.parametrize("suite", ["gpu-suite", "all"])
def test_plan_with_an_unlimited_budget(capsys, suite):
    """--budget inf: every point planned, the JSON strict (null for the unlimited budget)."""
    assert main(["bench", suite, "--plan", "h200", "--budget", "inf", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out, parse_constant=lambda c: 1 / 0)
    assert plan["budget_s"] is None
    points = [p for b in plan["benchmarks"] for p in b["points"]]
    assert points and not any(p["beyond_budget"] for p in points)
    assert main(["bench", suite, "--plan", "h200", "--budget", "inf"]) == 0
    text = capsys.readouterr().out
    assert "budget unlimited" in text and "n/a" not in text


def test_decode_time_budget_skips_points(results, capsys):
    r = bench(capsys, "decode", "--quick", "--preset", "tiny", "--budget", "0.01", "--no-write")
    assert not r["points"] and r["skipped"]
    assert all(s["reason"] == "time budget exhausted" for s in r["skipped"])
    assert not (results / machine_slug("cpu")).exists()


@pytest.mark.parametrize(
    "argv,fragment",
    [
        (["decode", "--contexts", "0"], "whole numbers >= 1"),
        (["decode", "--kv-dtypes", "int3"], "unknown kv dtype"),
        (["decode", "--preset", "huge"], "unknown decoder preset"),
        (["decode", "--preset", ""], "unknown decoder preset ''"),
        (["decode", "--weight-dtype", ""], "unknown weight dtype ''"),
        (["memory", "--budget", "-1"], "expected seconds > 0"),
        (["memory", "--budget", "nan"], "expected seconds > 0"),
        (["memory", "--device", "tpu"], "not a torch device"),
        (["memory", "--device", "meta"], "run on cpu or cuda"),
        (
            ["memory", "--threads", "nan"],
            "--threads: expected a whole number in 1..4,096, got 'nan'",
        ),
        (["memory", "--threads", "1.5"], "--threads: expected a whole number"),
        (
            ["memory", "--repeats", "nan"],
            "--repeats: expected a whole number in 1..1,000, got 'nan'",
        ),
        (["memory", "--repeats", "1e400"], "--repeats: expected a whole number"),
        (["decode", "--contexts", "inf"], "--contexts: expected whole numbers >= 1"),
        (
            ["decode", "--contexts", "100M"],
            "100M = 104,857,600 is above the limit of 100,000,000 tokens",
        ),
        (
            ["decode", "--batches", "1e30"],
            "--batches: 1e30 = 1,000,000,000,000,000,019,884,624,838,656 is above",
        ),
        (["decode", "--plan", "h900"], "unknown hardware 'h900'"),
        (["decode", "--plan", "h200", "--plan-link", "hbm3"], "not a link"),
        (["all", "--only", "decod"], "--only: unknown benchmark 'decod'"),
    ],
)
def test_bad_input_is_one_line(results, capsys, argv, fragment):
    device = [] if "--device" in argv else ["--device", "cpu"]
    code = main(["bench", *argv, "--quick", "--no-write", *device])
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
    assert len(calls) == 2 + 5 * 3 and t.repeats == 5
    assert t.min_s <= t.p25_s <= t.median_s <= t.p75_s <= t.max_s
    assert Budget(None).allows(1e9) and not Budget(1.0).allows(2.0)


def _fake_decode(machine_dir, device_name, error):
    points = []
    for placement in ("device", "host"):
        for batch in (1, 8):
            for ctx in (1024, 4096):
                measured = 0.01 * (1 + error) * batch
                points.append(
                    {
                        "batch": batch,
                        "context": ctx,
                        "placement": placement,
                        "prefetch": False,
                        "kv_dtype": "bf16",
                        "measured_step_s": measured,
                        "predicted_step_s": 0.01 * batch,
                        "error": error,
                        "achieved_bytes_per_s": 1e9,
                        "fraction_of_bandwidth": 0.8 - error,
                        "step_bytes": 1e7,
                        "spread": 0.01,
                        "bandwidth_bytes_per_s": 2e9,
                    }
                )
    return {
        "benchmark": "decode",
        "environment": {"device_name": device_name, "device": "cpu"},
        "model": {"preset": "cpu-bench", "weight_dtype": "bf16"},
        "bandwidth_bytes_per_s": 2e9,
        "machine": {"flops_per_s": 1e12},
        "points": points,
    }


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
    # older files: PyTorch
    assert default["kernels"] == "native" and torch_run["kernels"] == "torch"
    np.testing.assert_allclose(torch_run["points"]["error"], 0.5)
    assert report.targets(kernels="torch")[0]["rows"][0]["max_abs_error"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="kernels"):
        report.decode_comparison(kernels="fast")
    from kvlab.viz import bench_figures  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    assert chapter.decode_summary() == (
        "On CPU A with kvlab's kernels (bf16 KV): at batch 1 the steps used at least 75.0% of the "
        "copy bandwidth and the ledger was within 5.00%; at batch 8 the steps used at least 75.0% "
        "of the copy bandwidth and the ledger was within 5.00%."
    )
    assert chapter.decode_summary("torch").startswith(
        "On CPU A with PyTorch's kernels (bf16 KV): at batch 1 the steps used at least 30.0% of "
        "the copy bandwidth and the ledger was within 50.0%"
    )
    assert chapter.decode_summary(kv_dtype="int8") == ""
    assert chapter.kernels_notes() == "native C kernels"
    assert chapter.bandwidth_range() == "2.00 GB/s to 2.00 GB/s"
    labels = [item.label["value"] for item in bench_figures.bandwidth_figure().legend[0].items]
    assert any(lab.endswith("kvlab kernels") for lab in labels)
    assert any(lab.endswith("PyTorch kernels") for lab in labels)
    pace = [item.label["value"] for item in bench_figures.pace_figure().legend[0].items]
    assert "achieved = copy bandwidth" in pace
    assert any(lab.endswith("PyTorch kernels") for lab in pace)


def test_pace_summary_tells_the_two_memory_states_apart(results):
    run = _fake_decode("a", "CPU A", 0.05)
    write_result("decode", run, machine="cpu-a")
    assert chapter.pace_summary().startswith(
        "In the recorded run on CPU A the copy bandwidth around these steps stayed between "
        "2.00 GB/s and 2.00 GB/s, and the cores kept up"
    )
    for p in run["points"][:2]:  # two steps while the machine's memory was faster
        p["bandwidth_bytes_per_s"], p["fraction_of_bandwidth"] = 4e9, 0.6
    write_result("decode", run, machine="cpu-a")
    assert chapter.pace_summary().startswith(
        "On CPU A some steps ran while the copy bandwidth was up to 4.00 GB/s instead of 2.00 GB/s "
        "to 2.00 GB/s: those used 60.0% to 60.0% of it, the others 75.0% to 75.0%."
    )


def test_report_recompute_curves(results):
    curve = {
        "preset": "p",
        "kv_bytes_per_token": 10.0,
        "streamed_weight_bytes": 1.0,
        "points": [
            {
                "tokens": n,
                "recompute_s": 1e-3,
                "fetch_s": 1e-5 * n,
                "predicted_recompute_s": 1e-3,
                "predicted_fetch_s": 1e-5 * n,
            }
            for n in (1, 10, 1000)
        ],
        "crossover_tokens": 100.0,
        "predicted_crossover_tokens": 100.0,
    }
    result = {"environment": {"device_name": "X"}, "machine": {}, "curves": [curve]}
    write_result("recompute-vs-fetch", result, machine="m")
    (c,) = report.recompute_curves()
    assert c["crossover_tokens"] == 100.0 and c["fetch_pageable_s"] is None
    np.testing.assert_allclose(c["tokens"], [1, 10, 1000])


def test_measure_undisturbed_retries_when_another_process_stalled_the_cpu(monkeypatch):
    stalls = iter([0.0, 1e9, 1e9, 1e9 + 10])  # PSI counter (us): attempt 1 stalled, attempt 2 quiet
    monkeypatch.setattr(timing, "_stall_total_us", lambda: next(stalls))
    calls = []

    def measure():
        calls.append(1)
        _time.sleep(0.01)
        return len(calls)

    result, stall, attempts = timing.measure_undisturbed(measure, max_stall=0.05, attempts=3)
    assert (result, attempts) == (2, 2) and stall < 0.05


def _fake_runner(kind):
    def run(device, **kw):
        return {
            "benchmark": kind,
            "environment": {},
            "bandwidth_bytes_per_s": 1.0,
            "points": [],
            "skipped": [],
            "summary": {},
            "curves": [],
        }

    return run


def _fake_suite(monkeypatch, recompute_runner):
    """Every benchmark of the suite replaced by a stand-in; recompute-vs-fetch by the one given."""
    for module, kind in ((memory, "memory"), (host_copy, "transfer"), (decode, "decode")):
        monkeypatch.setattr(module, f"run_{kind}", _fake_runner(kind))
    monkeypatch.setattr(recompute, "run_recompute", recompute_runner)


def test_suite_survives_a_broken_benchmark(results, monkeypatch, capsys):
    """A one-shot GPU run must not lose every result to one crash: the others still run and
    are written, the failure is reported, and the exit status says something failed."""

    def boom(device, **kw):
        raise RuntimeError("kernel exploded")

    _fake_suite(monkeypatch, boom)
    code = main(["bench", "all", "--device", "cpu", "--json"])
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert code == 1 and "kernel exploded" in out["recompute-vs-fetch"]["error"]
    assert "Traceback" in captured.err and out["decode"]["written_to"]
    assert (results / machine_slug("cpu") / "decode.json").exists()


def test_suite_records_a_refused_benchmark_and_goes_on(results, monkeypatch, capsys):
    """A refused benchmark (a KvlabError: its model does not fit, say) is one line in the
    summary, not the end of the run: the others still run and are written."""

    def refuse(device, **kw):
        raise KvlabError(
            "decoder 'gpu-bench' weights (bf16) needs 7.3 GB but only 4 GB of cuda memory is free"
        )

    _fake_suite(monkeypatch, refuse)
    code = main(["bench", "all", "--device", "cpu", "--json"])
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert code == 1 and set(out["recompute-vs-fetch"]) == {"refused"}
    assert "needs 7.3 GB" in out["recompute-vs-fetch"]["refused"]
    assert "Traceback" not in captured.err
    assert out["decode"]["written_to"] and (results / machine_slug("cpu") / "decode.json").exists()


def test_decode_refuses_points_one_by_one_and_goes_on(results, capsys, monkeypatch):
    """A cache too big for memory skips its points with the memory check's reason, and the
    sweep goes on with the next group."""
    real = fit.require

    def tight(what, needed, device, hint):
        if "KV cache (2 x" in what:
            raise fit.KvlabError(f"{what} needs more than this test allows; {hint}")
        return real(what, needed, device, hint)

    monkeypatch.setattr(fit, "require", tight)
    r = bench(
        capsys,
        "decode",
        "--quick",
        "--preset",
        "tiny",
        "--contexts",
        "64",
        "--placements",
        "device",
        "--kv-dtypes",
        "bf16",
        "--no-write",
    )
    assert [(p["batch"], p["context"]) for p in r["points"]] == [(1, 64)]
    assert [(s["batch"], s["context"]) for s in r["skipped"]] == [(2, 64)]
    assert "needs more than this test allows" in r["skipped"][0]["reason"]


def test_decode_groups_put_the_main_questions_first():
    """A run cut short by its budget has bf16 on device and host (serial and prefetch)
    before the other KV dtypes; host points beyond the limit are refused up front."""
    grid = resolve_grid(True, False)
    groups = decode_groups(grid, True)
    order = [(g.placement, g.prefetch, g.kv_dtype) for g, _, _ in groups]
    assert (
        order[:9]
        == [("device", False, "bf16")] * 3
        + [("host", False, "bf16")] * 3
        + [("host", True, "bf16")] * 3
    )
    assert {kv for _, _, kv in order[9:]} == {"fp8", "int8"} and len(groups) == 3 * 3 + 2 * 3
    limit = HOST_MAX_TOKENS["cuda"]
    for g, ctxs, refused in groups:
        assert sorted(ctxs + [c for c, _ in refused]) == grid["contexts"]
        assert all(g.placement == "host" and g.batch * c > limit for c, _ in refused)
    g, _, [(ctx, why)] = next(x for x in groups if x[0].placement == "host" and x[0].batch == 8)
    assert skip_record(g, ctx, why) == {
        "placement": "host",
        "prefetch": False,
        "kv_dtype": "bf16",
        "batch": 8,
        "context": 32768,
        "reason": "host placement limited to 131,072 tokens",
    }
    assert resolve_grid(False, False, kv_dtypes=["int8"])["host_kv_dtypes"] == ("int8",)
    assert resolve_grid(False, False)["prefetch"] == (False,)  # nothing to overlap with on a CPU


def test_plan_walks_the_cuda_sweep_without_allocating(capsys, monkeypatch):
    """`--plan` prints every point with its bytes, predicted time and memory on a catalogue
    device, on a machine without CUDA, without allocating a single tensor."""
    import torch

    def refuse(*args, **kwargs):
        raise AssertionError("the plan allocated a tensor")

    for name in ("empty", "zeros", "ones", "randn", "randint", "empty_like", "full"):
        monkeypatch.setattr(torch, name, refuse)
    assert main(["bench", "gpu-suite", "--plan", "h200", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    names = [b["benchmark"] for b in plan["benchmarks"]]
    assert names == ["memory", "transfer", "recompute-vs-fetch", "decode"]
    decode = plan["benchmarks"][3]["points"]
    g = GRIDS["cuda"]
    groups = len(g["kv_dtypes"]) + 2  # host: bf16 serial and prefetched
    assert len(decode) == len(g["contexts"]) * len(g["batches"]) * groups
    first = decode[0]
    expected = ledger.predict_decode("gpu-bench", get_device("h200"), 1, 1024, "bf16", "bf16")
    assert first["point"] == "device bf16 b=1 ctx=1024" and first["bytes"] == expected["step_bytes"]
    # batch 1 is memory-bound: the catalogue's 4.8 TB/s sets the pace
    assert first["predicted_s"] == pytest.approx(expected["step_bytes"] / 4.8e12)
    refused = [p["point"] for p in decode if p["refused"]]
    assert len(refused) == 8 and all(p.startswith("host") for p in refused)  # 4 per prefetch
    assert not any(p["beyond_budget"] for b in plan["benchmarks"] for p in b["points"])
    assert plan["wall_s"] < plan["budget_s"]


def test_plan_names_what_does_not_fit_and_what_the_budget_leaves_out(capsys):
    assert (
        main(
            [
                "bench",
                "decode",
                "--plan",
                "h200",
                "--batches",
                "1,64",
                "--contexts",
                "32k",
                "--placements",
                "device",
                "--kv-dtypes",
                "bf16",
                "--budget",
                "1.5",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    lines = {line.split()[2]: line for line in out.splitlines() if line.startswith("device bf16")}
    # 137 GB of KV is more than the 127 GB usable
    assert "refused: needs" in lines["b=64"] and "GB usable" in lines["b=64"]
    # 1.5 s of budget: not even one point
    assert "refused" not in lines["b=1"] and "beyond budget" in lines["b=1"]


def test_small_copies_time_a_loop_of_calls(monkeypatch):
    """A 1 MiB copy takes microseconds, about a launch: small sizes time a loop of calls per
    repeat (at least 256 MiB moved), large ones one call."""
    MiB = 1 << 20
    sizes = (MiB, 3 * MiB, 16 * MiB, 256 * MiB, 1 << 30)
    assert [timing.calls_per_repeat(s) for s in sizes] == [256, 86, 16, 1, 1]
    seen = []

    def fake_time_call(fn, device="cpu", repeats=5, warmup=2, inner=1):
        seen.append(inner)
        return timing.Timing(1e-3, 1e-3, 1e-3, 1e-3, 1e-3, repeats, warmup)

    for module in (memory, host_copy):
        monkeypatch.setattr(module, "time_call", fake_time_call)
        monkeypatch.setattr(module, "QUICK_SIZES", {"cpu": [MiB, 64 * MiB]})
    r = memory.run_memory("cpu", quick=True, quiet=True)
    loops = {(MiB, 256), (64 * MiB, 4)}
    assert {(p["size_bytes"], p["calls_per_repeat"]) for p in r["points"]} == loops
    t = host_copy.run_transfer("cpu", quick=True, quiet=True)
    assert [(p["size_bytes"], p["calls_per_repeat"]) for p in t["points"]] == sorted(loops)
    seen.clear()
    memory.copy_bandwidth("cpu", MiB)
    assert seen == [256]


class _Recorder:
    """Stand-ins for torch.cuda's stream, graph and device calls, recording the device each
    one names."""

    def __init__(self):
        self.calls = []

    def stream_of(self, device):
        rec = self

        class Stream:
            def wait_stream(self, other):
                rec.calls.append(("wait_stream", self.device, other.device))

        stream = Stream()
        stream.device = device
        return stream

    def named(self, kind, device):
        @contextlib.contextmanager
        def context():
            self.calls.append((kind, device))
            yield

        return context()

    def new_stream(self, device=None):
        self.calls.append(("Stream", device))
        return self.stream_of(device)

    def current_stream(self, device=None):
        self.calls.append(("current_stream", device))
        return self.stream_of(device)

    def install(self, monkeypatch):
        import torch

        rec = self

        class Graph:
            def replay(self):
                rec.calls.append(("replay", None))

        monkeypatch.setattr(torch.cuda, "Stream", self.new_stream)
        monkeypatch.setattr(torch.cuda, "current_stream", self.current_stream)
        monkeypatch.setattr(torch.cuda, "stream", lambda s: self.named("stream", s.device))
        monkeypatch.setattr(torch.cuda, "device", lambda d: self.named("device", d))
        monkeypatch.setattr(
            torch.cuda,
            "graph",
            lambda g, pool=None, stream=None: self.named("graph", getattr(stream, "device", None)),
        )
        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)


def test_cuda_graph_capture_names_the_benchmarks_device(monkeypatch):
    """`--device cuda:1`: the warm-up stream, the capture and the stream waits all name
    cuda:1, never the current device."""

    import torch

    rec = _Recorder()
    rec.install(monkeypatch)
    gpu = torch.device("cuda:1")
    model = SimpleNamespace(device=gpu, forward_plan=lambda tokens, cache, plan: torch.arange(3.0))
    fn, graphed = make_step(model, SimpleNamespace(placement="device"), None, None, cuda_graph=True)
    assert graphed and torch.equal(fn(), torch.arange(3.0)) and ("replay", None) in rec.calls
    named = [c for c in rec.calls if c[0] != "replay"]
    assert {c[1] for c in named} == {gpu}
    assert {c[2] for c in named if c[0] == "wait_stream"} == {gpu}
    assert ("graph", gpu) in named and ("device", gpu) in named
    host = SimpleNamespace(placement="host")
    assert make_step(model, host, None, None, cuda_graph=True)[1] is False  # host: eager


def test_device_index_beyond_the_gpus_is_one_line(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert main(["bench", "memory", "--device", "cuda:1", "--no-write"]) == 2
    err = capsys.readouterr().err.strip()
    assert "torch sees 1 CUDA device(s), numbered from 0" in err and len(err.splitlines()) == 1


def test_result_files_are_ordinary_files(results):
    path = write_result("memory", {"x": 1}, machine="m")
    umask = os.umask(0o022)
    os.umask(umask)
    # 0644 with the usual umask, not mkstemp's 0600
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    assert [p.name for p in path.parent.iterdir()] == ["memory.json"]  # no temporaries left


# ----------------------------------------------------------------- the GPU session


def _point(placement, batch, ctx, measured, predicted, prefetch=False, kv="bf16", share=0.9):
    return {
        "placement": placement,
        "prefetch": prefetch,
        "kv_dtype": kv,
        "batch": batch,
        "context": ctx,
        "measured_step_s": measured,
        "predicted_step_s": predicted,
        "error": measured / predicted - 1,
        "fraction_of_bandwidth": share,
        "achieved_bytes_per_s": share * 4e12,
    }


def test_findings_from_hand_made_results():
    decode = {
        "points": [
            _point("device", 1, 1024, 1.1, 1.0, share=0.88),
            _point("device", 1, 8192, 1.0, 1.0),
            _point("device", 8, 1024, 1.3, 1.0),
            _point("device", 1, 1024, 2.0, 1.0, kv="int8"),
            _point("host", 1, 1024, 3.0, 2.5),
            _point("host", 1, 1024, 2.0, 1.5, prefetch=True),
        ],
        "skipped": [{}],
    }
    curves = [{"preset": "p", "crossover_tokens": 900.0, "predicted_crossover_tokens": 1000.0}]
    f = findings(
        {
            "decode": decode,
            "memory": {"bandwidth_bytes_per_s": 4e12},
            "recompute-vs-fetch": {"curves": curves},
        }
    )
    b1 = f["decode_batch1"]
    assert b1["kv_dtype"] == "bf16" and b1["share_min"] == 0.88 and b1["meets_target"]
    assert b1["points"][0]["share_of_memory_copy"] == pytest.approx(0.88)
    err = f["ledger_error"]  # |errors| 0.1, 0, 0.3, 1.0 -> median 0.2
    assert err["median_abs_error"] == pytest.approx(0.2)
    assert err["max_abs_error"] == pytest.approx(1.0) and not err["meets_target"]
    assert err["by_kv_dtype"]["bf16"]["median_abs_error"] == pytest.approx(0.1)
    [overlap] = f["host_overlap"]  # predicted saving 1.0 s, measured 1.0 s
    assert overlap["share_of_predicted_saving"] == pytest.approx(1.0)
    assert overlap["measured_serial_s"] == 3.0
    assert f["crossovers"][0]["crossover_tokens"] == 900.0 and f["decode_skipped"] == 1


def test_gpu_session_packs_what_comes_back(tmp_path):
    assert gpu_session.catalogue_device("NVIDIA H200") == "h200"
    (tmp_path / "results" / "gpu").mkdir(parents=True)
    for i in range(7):
        (tmp_path / "results" / "gpu" / f"r{i}.json").write_text("{}")
    (tmp_path / "session.json").write_text("{}")
    (tmp_path / "session.log").write_text("")
    # 9 files are more than come back: the results travel as one archive
    assert gpu_session.pack(tmp_path) == ["results.tar.gz", "session.json", "session.log"]
    with tarfile.open(tmp_path / "results.tar.gz") as tar:
        assert len([m for m in tar.getmembers() if m.isfile()]) == 7


@pytest.mark.parametrize(
    "reported,device",
    [
        ("NVIDIA H200", "h200"),
        ("  nvidia   H200 ", "h200"),  # case and spacing aside
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA GeForce RTX 3090", "rtx-3090"),
        ("NVIDIA B200", "b200"),
        ("AMD Instinct MI300X", "mi300x"),
        ("AMD Instinct MI300X VF", "mi300x"),
        # near misses: other parts, other memories; an honest unknown, never the neighbour
        ("NVIDIA L40", None),
        ("NVIDIA H100 PCIe", None),
        ("NVIDIA H100 NVL", None),
        ("NVIDIA H200 NVL", None),
        ("NVIDIA A100-SXM4-40GB", None),
        ("NVIDIA A100-PCIE-40GB", None),
        ("NVIDIA A100 80GB PCIe", None),
        ("NVIDIA GH200 480GB", None),
        ("NVIDIA GeForce RTX 3090 Ti", None),
        ("NVIDIA GeForce RTX 4090 D", None),
        ("Tesla T4", None),
        ("", None),
        (None, None),
    ],
)
def test_gpu_names_map_to_the_catalogue_device_or_to_none(reported, device):
    assert gpu_session.catalogue_device(reported) == device
    if device is None:
        note = gpu_session.unknown_device_note(reported)
        assert note.startswith("unknown device:") and "reported_names" in note


def test_every_catalogue_device_lists_the_names_its_driver_reports():
    """Where a new GPU's author adds it: kvlab/data/hardware.toml, one entry with its figures
    and `reported_names`; no name may belong to two devices."""

    seen = {}
    for dev in hardware.devices().values():
        assert dev.reported_names, f"{dev.name}: add reported_names"
        for name in dev.reported_names:
            assert hardware.device_for_reported_name(name) is dev
            assert name.lower() not in seen, (name, seen.get(name.lower()), dev.name)
            seen[name.lower()] = dev.name
    b200 = hardware.get_device("b200")
    assert b200.capacity_bytes == 180e9 and b200.memory_bandwidth_bytes_per_s == 8e12
    assert "HGX B200 datasheet" in b200.source


def test_unknown_gpu_gets_no_plan_and_says_why(tmp_path, monkeypatch):
    session = gpu_session.Session(tmp_path, 60)
    session.record["facts"] = {"device_name": "NVIDIA L40"}
    gpu_session.run_plan(session, gpu_session.catalogue_device("NVIDIA L40"), 60, None)
    assert session.record["plan"].startswith("unknown device: 'NVIDIA L40' is not")
    assert not session.record["steps"]  # nothing ran for it


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--out", "{file}"], "--out {file}: exists and is not a folder"),
        (["--out", "{file}/sub"], "--out {file}/sub: cannot write there"),
        (["--out", "{dir}", "--deadline", "0"], "argument --deadline: expected seconds > 0"),
        (["--out", "{dir}", "--deadline", "inf"], "--deadline must be a finite number"),
        (["--out", "{dir}", "--budget", "nan"], "argument --budget: expected seconds > 0"),
        (["--out", "{dir}", "--only", ","], "--only names no benchmark"),
        (["--bogus"], "the following arguments are required: --out"),
        ([], "the following arguments are required: --out"),
    ],
)
def test_gpu_session_bad_arguments_are_one_line_and_exit_2(tmp_path, argv, message):
    """Before any step runs: one line on stderr, exit status 2, nothing written."""

    afile = tmp_path / "afile"
    afile.write_text("x")
    fill = {"file": str(afile), "dir": str(tmp_path / "out")}
    argv = [a.format(**fill) for a in argv]
    done = subprocess.run(
        [sys.executable, "-m", "kvlab", "bench", "gpu-session", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("kvlab bench") and ": error: " in done.stderr
    assert message.format(**fill) in done.stderr
    assert afile.read_text() == "x"
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_gpu_session_stays_inside_its_deadline(tmp_path):
    """With no time left for the suite, the session says so and still leaves its record."""
    argv = ["--out", str(tmp_path), "--dry-run", "--deadline", "20", "--tests"]
    code = main(["bench", "gpu-session", *argv])
    record = json.loads((tmp_path / "session.json").read_text())
    assert record["suite"] == {"skipped": "only 0 s of suite budget left"} and code == 0
    assert record["tests"] == {"skipped": "no test files named"}
    assert sorted(record["files"]) == ["session.json", "session.log"]


@pytest.mark.slow
def test_gpu_session_dry_run_on_the_cpu(tmp_path):
    """The GPU session script, run end to end where CUDA is absent (suite on the CPU, quick):
    every step runs and is recorded, results land under OUT, and OUT holds only what the
    device machine sends back."""

    out = tmp_path / "out"
    argv = [
        sys.executable,
        "-m",
        "kvlab",
        "bench",
        "gpu-session",
        "--out",
        str(out),
        "--dry-run",
        "--only",
        "transfer",
        "--deadline",
        "240",
        "--tests",
        "tests/test_decoder.py",
    ]
    done = subprocess.run(
        argv,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((out / "session.json").read_text())
    assert [s["step"] for s in record["steps"]][-3:] == ["plan", "suite", "gpu tests"]
    assert all(s["rc"] == 0 and not s["timed_out"] for s in record["steps"])
    assert record["plan"]["points"] == 16
    assert record["suite"]["transfer"]["written_to"].startswith(str(out))
    assert "skipped" in record["tests"]["summary"] and record["findings"]["link_bytes_per_s"] > 0
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= MAX_FILES
    assert all(len(p.relative_to(out).parts) <= MAX_DEPTH + 1 for p in files)
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", p.name) for p in files)
    [result] = (out / "results").glob("*/transfer-quick.json")
    assert json.loads(result.read_text())["benchmark"] == "transfer"
    assert "===== suite" in (out / "session.log").read_text()


@pytest.mark.gpu
def test_decode_sweep_on_cuda(results, capsys):
    """A small sweep on CUDA: device steps are replayed CUDA graphs, host-placed KV runs serial
    and prefetched, every point is measured and carries the contract."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    code = main(
        [
            "bench",
            "decode",
            "--quick",
            "--device",
            "cuda:0",
            "--preset",
            "small",
            "--contexts",
            "256,1k",
            "--json",
            "--no-write",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    r = json.loads(out)
    assert r["points"] and not r["skipped"] and r["environment"]["device"] == "cuda:0"
    assert all(p["cuda_graph"] for p in r["points"] if p["placement"] == "device")
    placements = {(p["placement"], p["prefetch"]) for p in r["points"]}
    assert placements == {("device", False), ("host", False), ("host", True)}
    for p in r["points"]:
        assert DECODE_KEYS <= set(p) and p["measured_step_s"] > 0


def test_kernel_table_interpolates_in_log2_and_clamps():
    """Hand-checked: batch 2 lies halfway (in log2) between 1 and 4; context 4K halfway
    between 2K and 8K; past the table's ends the nearest share holds."""
    table = {
        "batches": [1, 4, 16],
        "contexts": [2048, 8192],
        "weights": [1.0, 0.8, 0.6],
        "attention": {"bf16": [[0.9, 0.7], [0.8, 0.6], [0.5, 0.3]]},
    }
    assert kernel_table.shares(table, 2, 4096, "bf16") == pytest.approx((0.9, 0.75))
    assert kernel_table.shares(table, 8, 2048, "bf16") == pytest.approx((0.7, 0.65))
    assert kernel_table.shares(table, 64, 32768, "bf16") == pytest.approx((0.6, 0.3))
    assert kernel_table.shares(table, 1, 1024, "bf16") == pytest.approx((1.0, 0.9))


def test_kernel_tables_rest_pass_runs_the_step_without_its_kernels():
    """The rest pass calls neither kernel (its logits are the output matrix's stand-in
    zeros), still writes the new token's K/V as a step does, and leaves the decoder whole:
    a decode afterwards gives the same logits as a decoder that never ran it."""
    import torch

    model, twin = Decoder("tiny", "fp32", seed=3), Decoder("tiny", "fp32", seed=3)
    tokens = torch.tensor([[5], [7]])
    cache, cache_twin = model.new_cache(2, 16, "bf16"), twin.new_cache(2, 16, "bf16")
    for c in (cache, cache_twin):
        c.fill_random_([8, 8], seed=1)
    before = cache.view(0, 9)[0].clone()
    logits = kernel_table.rest_pass(model, cache, 2, 9)()
    assert torch.count_nonzero(logits) == 0
    after = cache.view(0, 9)[0]
    assert not torch.equal(before, after)  # position 8 of layer 0 was written
    assert "attend" not in vars(model)
    assert not any("forward" in vars(m) for m in model.linears())
    torch.testing.assert_close(
        model.decode(tokens, cache), twin.decode(tokens, cache_twin), rtol=0, atol=0
    )


def test_kernel_table_prices_the_ledgers_bytes_at_the_kernels_shares():
    """Hand-checked: 800 MB of weights at 80% of 10 GB/s is 100 ms, 90 MB of KV at 60% is
    15 ms, the rest at batch 2 (halfway in log2 between 0.5 ms and 2.5 ms) 1.5 ms, and the
    ledger's other 10 MB (held in the rest) are not added again; host placement adds the
    fetch serially, or overlaps it when prefetching."""
    table = {
        "batches": [1, 4],
        "contexts": [512],
        "weights": [0.8, 0.8],
        "attention": {"bf16": [[0.6], [0.6]]},
        "rest_s": {"bf16": [0.5e-3, 2.5e-3]},
    }
    pred = {"weight_read_bytes": 800e6, "kv_read_bytes": 90e6, "step_bytes": 900e6, "fetch_s": 0.2}
    point = {"bandwidth_bytes_per_s": 10e9, "batch": 2, "context": 512, "kv_dtype": "bf16"}
    device = {**point, "placement": "device", "prefetch": False}
    assert kernel_table.predict_step_s(table, pred, device) == pytest.approx(0.1165)
    serial = {**point, "placement": "host", "prefetch": False}
    assert kernel_table.predict_step_s(table, pred, serial) == pytest.approx(0.3165)
    overlapped = {**point, "placement": "host", "prefetch": True}
    assert kernel_table.predict_step_s(table, pred, overlapped) == pytest.approx(0.2)


@pytest.mark.parametrize("out", ["", ".", "results"])
def test_gpu_session_refuses_a_folder_it_did_not_write(tmp_path, out):
    """`--out ""` in a checkout once packed the checkout's results/ into a tarball and removed
    the tracked JSON: a folder holding anything a session did not write is refused, untouched."""
    checkout = tmp_path / "checkout"
    recorded = checkout / "results" / "cpu-x" / "decode.json"
    recorded.parent.mkdir(parents=True)
    recorded.write_text("{}")
    (checkout / "kvlab").mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "kvlab", "bench", "gpu-session", "--out", out, "--dry-run"],
        cwd=checkout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "holds files no GPU session wrote" in done.stderr
    assert recorded.read_text() == "{}"
    assert sorted(p.name for p in checkout.iterdir()) == ["kvlab", "results"]


def test_gpu_session_may_write_again_where_a_session_wrote(tmp_path):
    out = tmp_path / "out"
    (out / "results").mkdir(parents=True)
    (out / "session.log").write_text("")
    assert gpu_session.check_out(out) == out
    assert gpu_session.check_out(tmp_path / "new") == tmp_path / "new"

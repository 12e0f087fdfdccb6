"""The quick benchmarks end to end: one `kvlab bench all --quick` run (into a temporary
KVLAB_RESULTS_DIR), shared by this file's tests, each of which checks one benchmark's
contract on the result that run wrote. `all` runs each benchmark as `kvlab bench NAME
--quick` does (kvlab.bench.suite), so running them one by one as well would time every
quick sweep twice. No speed is asserted: the figures are measured, not tested."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

pytest.importorskip("torch")

from test_bench import DECODE_KEYS  # the decode result's point contract

from kvlab import native
from kvlab.bench import kernel_table, report
from kvlab.bench.results import machine_slug
from kvlab.cli import main
from kvlab.decoder import ledger

SUITE = ("memory", "transfer", "recompute-vs-fetch", "decode")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """`kvlab bench all --device cpu --quick --json`, once: its exit status, summary, stderr,
    results folder, each benchmark's written result (by name) and what the book's report
    finds there."""
    results = tmp_path_factory.mktemp("results")
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVLAB_RESULTS_DIR", str(results))
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["bench", "all", "--device", "cpu", "--quick", "--json"])
        # report.machines() reads $KVLAB_RESULTS_DIR: asked while it names this run's folder
        machines = (report.machines(), report.machines(include_quick=True))
    folder = results / machine_slug("cpu")
    return {
        "code": code,
        "summary": json.loads(out.getvalue()),
        "err": err.getvalue(),
        "folder": folder,
        "results": {
            name: json.loads((folder / f"{name}-quick.json").read_text())
            for name in SUITE
            if (folder / f"{name}-quick.json").exists()
        },
        "machines": machines,
    }


def result_of(quick, name: str) -> dict:
    """Benchmark `name`'s result as the run wrote it; its progress went to stderr, not into
    the JSON (which parsed)."""
    assert quick["code"] == 0, quick["err"]
    assert f"kvlab bench suite: {name}" in quick["err"]
    return quick["results"][name]


def test_memory_quick(quick):
    r = result_of(quick, "memory")
    assert r["bandwidth_bytes_per_s"] > 1e8 and r["matmul_flops_per_s"]["bf16"] > 1e8
    assert {p["kernel"] for p in r["points"]} == {"copy", "read", "write"}
    copy = [p for p in r["points"] if p["kernel"] == "copy"]
    assert all(p["bytes_moved"] == 2 * p["size_bytes"] for p in copy)  # STREAM: read + write
    assert all(p["min_s"] <= p["median_s"] <= p["max_s"] for p in r["points"])
    summary = quick["summary"]["memory"]
    assert summary["bandwidth_bytes_per_s"] == r["bandwidth_bytes_per_s"]
    assert summary["written_to"] == str(quick["folder"] / "memory-quick.json")
    assert r["environment"]["torch"] and r["environment"]["device_name"]


def test_transfer_quick(quick):
    r = result_of(quick, "transfer")
    assert r["bandwidth_bytes_per_s"] > 1e8
    assert {p["direction"] for p in r["points"]} == {"h2h"}  # no accelerator: host -> host


def test_decode_quick_points_carry_the_contract(quick):
    """Every point carries the contract's keys and is self-consistent; comparisons between
    points use the ledger at one fixed bandwidth (each point's own prediction uses the copy
    bandwidth measured around it, which a busy machine moves between points)."""
    r = result_of(quick, "decode")
    assert r["points"] and not r["skipped"]
    flops = r["machine"]["flops_per_s"]
    for p in r["points"]:
        assert DECODE_KEYS <= set(p)
        assert p["measured_step_s"] > 0 and p["predicted_step_s"] > 0
        assert p["error"] == pytest.approx(p["measured_step_s"] / p["predicted_step_s"] - 1)
        assert p["achieved_bytes_per_s"] == pytest.approx(p["step_bytes"] / p["measured_step_s"])
        # the prediction is the ledger's at the bandwidth recorded with the point
        at_point = ledger.measured_device("x", p["bandwidth_bytes_per_s"], flops, 1e12)
        again = ledger.predict_decode(
            p["preset"],
            at_point,
            p["batch"],
            p["context"],
            p["weight_dtype"],
            p["kv_dtype"],
            p["placement"],
            p["prefetch"],
            r["machine"].get("link_bytes_per_s"),
        )
        assert p["predicted_step_s"] == pytest.approx(again["predicted_step_s"])
        # the second prediction: the same bytes at the kernel table's shares
        assert p["predicted_kernels_step_s"] == pytest.approx(
            kernel_table.predict_step_s(r["kernel_table"], again, p)
        )
        assert p["kernels_error"] == pytest.approx(
            p["measured_step_s"] / p["predicted_kernels_step_s"] - 1
        )
    table = r["kernel_table"]
    assert table["batches"] == [1, 4] and table["contexts"] == [512]
    assert all(share > 0 for share in table["weights"])
    assert set(table["attention"]) == {"bf16", "int8"}
    assert set(table["rest_s"]) == {"bf16", "int8"}
    assert all(len(rest) == 2 and min(rest) > 0 for rest in table["rest_s"].values())
    assert {p["placement"] for p in r["points"]} == {"device", "host"}
    assert {p["kv_dtype"] for p in r["points"]} == {"bf16", "int8"}
    # the ledger counts the bytes: more context, more bytes; int8 KV moves fewer than bf16
    by = {(p["placement"], p["kv_dtype"], p["batch"], p["context"]): p for p in r["points"]}
    step = {key: p["step_bytes"] for key, p in by.items()}
    assert step[("device", "bf16", 2, 1024)] > step[("device", "bf16", 2, 256)]
    assert step[("device", "int8", 2, 1024)] < step[("device", "bf16", 2, 1024)]
    host, dev = by[("host", "bf16", 2, 1024)], by[("device", "bf16", 2, 1024)]
    assert host["fetch_bytes"] == dev["kv_read_bytes"]
    fixed = ledger.measured_device("fixed", 10e9, flops, 1e12)  # one bandwidth for both
    args = (r["model"]["preset"], fixed, 2, 1024, "bf16", "bf16")
    link = r["machine"]["link_bytes_per_s"]
    assert (
        ledger.predict_decode(*args, "host", False, link)["predicted_step_s"]
        > ledger.predict_decode(*args, "device")["predicted_step_s"]
    )
    model = r["model"]
    assert model["streamed_weight_bytes"] == pytest.approx(model["ledger_weight_read_bytes"])
    assert (quick["folder"] / "decode-quick.json").exists()


def test_recompute_vs_fetch_quick(quick):
    r = result_of(quick, "recompute-vs-fetch")
    (curve,) = r["curves"]
    assert [p["tokens"] for p in curve["points"]] == [16, 64, 256]
    for p in curve["points"]:
        assert p["recompute_s"] > 0 and p["fetch_s"] > 0 and p["predicted_fetch_s"] > 0
        assert p["kv_bytes"] == p["tokens"] * curve["kv_bytes_per_token"]


@pytest.mark.slow
def test_all_quick_writes_every_benchmark(quick):
    assert quick["code"] == 0 and set(quick["summary"]) == set(SUITE)
    expected = [
        "decode-quick.json",
        "memory-quick.json",
        "recompute-vs-fetch-quick.json",
        "transfer-quick.json",
    ]
    from kvlab.decoder import tune  # noqa: PLC0415 - torch loads only when used

    # where auto picked the native kernels (timed faster here), the decode points are timed
    # again with PyTorch's
    if native.available() and tune.choice()["kernels"] == "native":
        expected.insert(1, "decode-torch-kernels-quick.json")
    assert sorted(p.name for p in quick["folder"].glob("*.json")) == expected
    everything, with_quick = quick["machines"]
    assert everything == {}  # quick results stay out of the book by default
    assert machine_slug("cpu") in with_quick

"""Real KV transfer between a prefill and a decode process: correctness, bounds, cleanup.

The quick runs really spawn two processes per engine and move data through gloo and
Mooncake; they check checksums from both sides, that every run ends inside its time
bound, that a dead or hung peer gives a clear KvlabError, and that no child survives.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from kvlab.cli import main
from kvlab.errors import KvlabError
from kvlab.kv_transfer import (
    TransferConfig,
    parse_size,
    parse_sizes,
    quick_config,
    run_benchmark,
    save_results,
)
from kvlab.kv_transfer.config import format_size
from kvlab.kv_transfer.worker import summarise

ROOT = Path(__file__).resolve().parents[1]


def _mooncake_importable() -> bool:
    try:
        import mooncake.engine  # noqa: F401
    except (ImportError, OSError):
        return False
    return True


needs_mooncake = pytest.mark.skipif(
    not _mooncake_importable(),
    reason="mooncake-transfer-engine-non-cuda (and Debian libibverbs1) not installed",
)
ENGINES = ["torch", pytest.param("mooncake", marks=needs_mooncake)]


def _children(pid: int) -> list[int]:
    """Live kvlab.kv_transfer.child processes whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        state = stat.rsplit(")", 1)[1].split()[0]
        if ppid == pid and b"kvlab.kv_transfer.child" in cmd and state != "Z":
            found.append(int(entry.name))
    return found


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """Results and failure logs go to the test's own folder."""
    monkeypatch.setenv("KVLAB_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    yield
    assert _children(os.getpid()) == [], "a transfer process outlived its test"


# ----------------------------------------------------------------- pure parts


def test_sizes_are_binary():
    assert parse_size("4k") == 4096 and parse_size("512M") == 512 * 2**20 == parse_size("512MiB")
    assert parse_size("1g") == 2**30 and parse_sizes("4k, 64k,1M") == (4096, 65536, 2**20)
    assert [format_size(n) for n in (8, 4096, 512 * 2**20)] == ["8 B", "4 KiB", "512 MiB"]
    with pytest.raises(KvlabError, match="512M"):
        parse_size("lots")


@pytest.mark.parametrize(
    "changes,match",
    [
        ({"engine": "nccl"}, "unknown transfer engine"),
        ({"sizes_bytes": (0,)}, "transfer size"),
        ({"sizes_bytes": (4096,), "layouts": ("paged",)}, "two 65536-byte blocks"),
        ({"layouts": ("ragged",)}, "layouts"),
        ({"min_repeats": 10, "max_repeats": 3}, "max_repeats"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"fault": "decode:explode"}, "fault"),
        ({"device": "tpu"}, "cpu or cuda"),
    ],
)
def test_nonsense_configurations_fail_in_one_line(changes, match):
    with pytest.raises(KvlabError, match=match):
        TransferConfig(**changes).validate()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_is_one_line(capsys):
    assert main(["bench", "kv-transfer", "--quick", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "no CUDA device" in err and len(err.strip().splitlines()) == 1


def test_paged_cases_need_whole_blocks():
    cfg = TransferConfig(sizes_bytes=(4096, 65536, 131072, 196608, 200000), block_bytes=65536)
    paged = [("paged", 131072), ("paged", 196608)]
    assert cfg.cases() == [("contiguous", s) for s in cfg.sizes_bytes] + paged
    assert cfg.label == "torch-gloo" and TransferConfig(device="cuda").label == "torch-nccl"
    assert TransferConfig(engine="mooncake", completion="flag").label == "mooncake-tcp-flag"


def test_summary_reports_median_and_spread():
    s = summarise([1.0, 2.0, 3.0, 4.0, 100.0], 1000)
    assert (s["time_s"]["median"], s["time_s"]["min"], s["time_s"]["max"]) == (3.0, 1.0, 100.0)
    assert s["bandwidth_bytes_per_s"]["median"] == pytest.approx(1000 / 3.0)
    bw = s["bandwidth_bytes_per_s"]
    assert bw["p10"] < bw["median"] < bw["p90"]


def test_saving_merges_engines_by_label(tmp_path):
    env = {"device": "cpu", "device_name": "test cpu"}

    def result(label, value):
        return {
            "kind": "kv_transfer",
            "environment": env,
            "engines": {label: {"rows": [], "summary": value}},
        }

    save_results(result("torch-gloo", 1), "cmd a", machine="box")
    path = save_results(result("mooncake-tcp", 2), "cmd b", machine="box")
    saved = json.loads(path.read_text())
    assert path == tmp_path / "results" / "box" / "kv_transfer.json"
    summaries = {k: v["summary"] for k, v in saved["engines"].items()}
    assert summaries == {"torch-gloo": 1, "mooncake-tcp": 2}
    assert saved["engines"]["mooncake-tcp"]["command"] == "cmd b"


# ------------------------------------------------------- real processes (quick)


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("engine", ENGINES)
def test_quick_transfer_moves_the_kv_intact(engine, capsys):
    start = time.monotonic()
    code = main(["bench", "kv-transfer", "--quick", "--engine", engine, "--json", "--save"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    config = quick_config(engine=engine)
    ((label, entry),) = result["engines"].items()
    assert [(r["layout"], r["bytes"]) for r in entry["rows"]] == config.cases()
    for row in entry["rows"]:
        assert row["checksum_ok"] and row["checksum"]["prefill"] == row["checksum"]["decode"]
        assert row["checksum"]["prefill"].startswith("crc32:")
        assert row["repeats"] >= config.min_repeats and row["time_s"]["min"] > 0
        blocks = 1 if row["layout"] == "contiguous" else row["bytes"] // config.block_bytes
        assert row["blocks"] == blocks
    assert time.monotonic() - start < config.time_limit_s
    assert {p["pid"] for p in entry["processes"].values()} == set(entry["pids"].values())
    assert all(_gone(pid) for pid in entry["pids"].values())
    assert f"kv-transfer {label} [1/" in err  # progress on stderr
    saved = json.loads(Path(result["saved_to"]).read_text())
    assert label in saved["engines"] and "--quick" in saved["engines"][label]["command"]


@pytest.mark.slow
@pytest.mark.timeout(120)
@needs_mooncake
def test_mooncake_doorbell_completion(capsys):
    code = main(
        [
            "bench",
            "kv-transfer",
            "--quick",
            "--engine",
            "mooncake",
            "--completion",
            "flag",
            "--json",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    entry = json.loads(out)["engines"]["mooncake-tcp-flag"]
    assert entry["config"]["completion"] == "flag"
    assert "saved_to" not in json.loads(out)  # quick: no save
    assert all(r["checksum_ok"] for r in entry["rows"])


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "engine,fault,first",
    [
        ("torch", "decode:exit@1", "decode"),
        ("torch", "prefill:exit@2", "prefill"),
        pytest.param("mooncake", "decode:exit@1", "decode", marks=needs_mooncake),
        pytest.param("mooncake", "prefill:exit@3", "prefill", marks=needs_mooncake),
    ],
)
def test_a_dying_peer_is_a_clear_error(engine, fault, first):
    config = quick_config(engine=engine, fault=fault, timeout_s=10)
    start = time.monotonic()
    with pytest.raises(KvlabError) as info:
        run_benchmark([config], progress=lambda line: None)
    message = str(info.value)
    assert f"the {first} process died (exit code 17)" in message
    assert "Both processes were stopped" in message and "\n" not in message
    assert time.monotonic() - start < 60  # well inside the 10 s wait bound + start-up


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "engine,fault,waiter",
    [
        ("torch", "prefill:hang@1", "decode"),
        pytest.param("mooncake", "decode:hang@0", "prefill", marks=needs_mooncake),
    ],
)
def test_a_hung_peer_times_out(engine, fault, waiter):
    config = quick_config(engine=engine, fault=fault, timeout_s=2)
    start = time.monotonic()
    with pytest.raises(KvlabError, match=rf"the {waiter} process failed: .*(timed out|Timed out)"):
        run_benchmark([config], progress=lambda line: None)
    assert time.monotonic() - start < 45


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_whole_run_is_bounded():
    config = quick_config(fault="decode:hang@0", timeout_s=60, time_limit_s=4)
    with pytest.raises(KvlabError, match="time limit of 4 s"):
        run_benchmark([config], progress=lambda line: None)


def _as_from_a_terminal() -> None:
    """Ctrl-C as a shell delivers it: a test runner's worker may hold SIGINT ignored or
    blocked, and a child inherits both (seen under pytest-xdist, where the command then ran
    to its end and exited 0)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ctrl_c_stops_both_processes(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "kvlab",
        "bench",
        "kv-transfer",
        "--engine",
        "torch",
        "--sizes",
        "4k",
        "--layout",
        "contiguous",
        "--seconds-per-size",
        "60",
        "--repeats",
        "100000",
        "--no-save",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        preexec_fn=_as_from_a_terminal,
    )
    try:
        deadline = time.monotonic() + 60
        while len(_children(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        kids = _children(proc.pid)
        assert len(kids) == 2
        time.sleep(1.0)  # let them connect and start transferring
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130
        assert "interrupted" in proc.stderr.read().decode()
        assert all(_gone(pid) for pid in kids)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_same_code_runs_under_torchrun(tmp_path):
    engine = "all" if _mooncake_importable() else "torch"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "kvlab",
        "bench",
        "kv-transfer",
        "--quick",
        "--engine",
        engine,
        "--json",
        "--no-save",
    ]
    done = subprocess.run(
        cmd,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout[done.stdout.index("{") :])  # rank 0 prints, rank 1 stays silent
    expected = {"torch-gloo", "mooncake-tcp"} if engine == "all" else {"torch-gloo"}
    assert set(result["engines"]) == expected
    for entry in result["engines"].values():
        assert entry["launcher"] == "torchrun"
        assert entry["rows"] and all(r["checksum_ok"] for r in entry["rows"])


@pytest.mark.gpu
@pytest.mark.timeout(180)
def test_nccl_between_two_gpus(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip("NCCL send/recv needs two GPUs (one process per GPU)")
    code = main(
        ["bench", "kv-transfer", "--quick", "--engine", "torch", "--device", "cuda", "--json"]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    entry = json.loads(out)["engines"]["torch-nccl"]
    assert all(r["checksum_ok"] for r in entry["rows"])

"""One call that measures a CUDA machine and leaves everything in one folder:

    python3 -m kvlab bench gpu-session --out "$OUT"      # make gpu-session OUT=...

made for a borrowed GPU whose time is scarce and from which only one folder comes back.
It needs python3 with torch (a CUDA build), numpy and pytest: no installs, no nbval, no
network. In order, each step bounded so that the whole stays inside `--deadline`:

1. facts: `nvidia-smi` (summary and `-q`), torch, CUDA and the device's properties;
2. plan: `kvlab bench gpu-suite --plan` on the matching catalogue device (nothing runs);
3. suite: `kvlab bench gpu-suite` with a budget trimmed to the deadline, results written
   straight into OUT/results/<gpu>/ (KVLAB_RESULTS_DIR), each as soon as it finishes;
4. tests: `pytest -m gpu` over the decoder, bench and KV-transfer tests, where they are in
   the current folder (a kvlab checkout; `--tests` names others);
5. findings: the figures the run is judged by (`kvlab.bench.findings`).

OUT ends with session.json (facts, every step's command, exit status and time, the plan,
the suite's summary, the findings), session.log (every step's output) and
results/<gpu>/*.json: at most 8 files, at most two folders down, plain names. A step
that fails or times out is recorded and the next one still runs. `--dry-run` does the
same on a machine without CUDA (the suite on the CPU in quick mode), so the session's own
mistakes show up before device time is spent; a test runs it that way. Every step runs in
the current folder, with the kvlab that runs the session on its PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

from ..errors import KvlabError
from ..hardware import device_for_reported_name
from .findings import findings

#: Where the kvlab running this session is imported from: its steps import the same one.
IMPORT_ROOT = str(Path(__file__).resolve().parents[2])
#: The GPU tests: the decoder on CUDA (placements, prefetch, graphs), bench and KV transfer.
GPU_TESTS = ("tests/test_decoder.py", "tests/test_bench.py", "tests/test_kv_transfer.py")
#: Files that may come back from the device machine, and how deep.
MAX_FILES, MAX_DEPTH = 8, 2
#: Seconds kept for what follows the suite (the GPU tests, findings, packing).
TESTS_RESERVE_S = 120.0
#: Seconds a suite may run past its budget: its last point, writing its result.
SUITE_GRACE_S = 60.0


class Session:
    """The output folder, its log, its record, and the clock every step is bounded by."""

    def __init__(self, out: Path, deadline_s: float):
        self.out = out
        self.out.mkdir(parents=True, exist_ok=True)
        self.log_path = out / "session.log"
        self.start = time.monotonic()
        self.deadline_s = deadline_s
        self.record: dict = {
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "deadline_s": deadline_s,
            "steps": [],
        }

    def left_s(self) -> float:
        return self.deadline_s - (time.monotonic() - self.start)

    def log(self, text: str) -> None:
        with open(self.log_path, "a", encoding="utf-8") as handle:
            handle.write(text if text.endswith("\n") else text + "\n")
        print(text.rstrip("\n"), file=sys.stderr, flush=True)

    def run(
        self,
        name: str,
        argv: list[str],
        timeout_s: float,
        env: dict | None = None,
        min_s: float = 1.0,
    ) -> dict:
        """Run one step in its own process group, its stderr on the console and in the log,
        its stdout in the log and returned; never raises. Skipped when less than `min_s` is
        left for it."""
        step = {"step": name, "argv": argv, "timeout_s": round(timeout_s, 1)}
        self.log(f"\n===== {name}: {' '.join(argv)} (up to {timeout_s:.0f} s) =====")
        t0 = time.monotonic()
        stdout = ""
        if timeout_s < min_s:
            step.update(rc=None, skipped=f"{max(0.0, timeout_s):.0f} s left before the deadline")
        else:
            done = _run_bounded(argv, timeout_s, {**os.environ, **(env or {})}, self.log_path)
            stdout = done.pop("stdout")  # in the log; the record keeps the outcome
            step.update(done)
        step["wall_s"] = round(time.monotonic() - t0, 2)
        self.log(
            f"===== {name}: rc={step.get('rc')} in {step['wall_s']} s"
            + (" (timed out)" if step.get("timed_out") else "")
            + " ====="
        )
        self.record["steps"].append(step)
        self.save()
        return {**step, "stdout": stdout}

    def save(self) -> None:
        tmp = self.out / ".session.json.partial"
        tmp.write_text(json.dumps(self.record, indent=1, default=str) + "\n")
        os.replace(tmp, self.out / "session.json")


def _run_bounded(argv: list[str], timeout_s: float, env: dict, log_path: Path) -> dict:
    """Run argv; stderr goes to the log and the console line by line, stdout is collected.
    At the timeout the whole process group is killed. Returns rc, timed_out and stdout."""
    chunks: list[str] = []
    with open(log_path, "a", encoding="utf-8") as log:
        try:
            proc = subprocess.Popen(
                argv,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        except OSError as exc:
            return {"rc": None, "error": f"{type(exc).__name__}: {exc}", "stdout": ""}

        def tee():
            for line in proc.stderr:
                log.write(line)
                log.flush()
                sys.stderr.write(line)

        readers = [
            threading.Thread(target=tee, daemon=True),
            threading.Thread(target=lambda: chunks.append(proc.stdout.read()), daemon=True),
        ]
        for reader in readers:
            reader.start()
        try:
            proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            timed_out = True
        for reader in readers:
            reader.join(timeout=10)
        stdout = "".join(chunks)
        log.write(stdout)
    return {"rc": proc.returncode, "timed_out": timed_out, "stdout": stdout}


def catalogue_device(name: str | None) -> str | None:
    """The catalogue device (kvlab hardware) this GPU is, by the exact name its driver reports
    (the `reported_names` of kvlab/data/hardware.toml, where a new GPU is added); None for a
    GPU the catalogue does not list, never a near miss ("NVIDIA L40" is not an L4)."""
    found = device_for_reported_name(name)
    return found.name if found else None


def unknown_device_note(name: str | None) -> str:
    """What the record says about a GPU the catalogue does not list."""
    return (
        f"unknown device: {name or 'no GPU name reported'!r} is not a reported name of any "
        "device in kvlab's hardware catalogue (kvlab/data/hardware.toml, reported_names); "
        "its results are filed under its own name and no plan is made"
    )


def torch_facts() -> dict:
    """torch and CUDA versions, and every visible device's properties."""
    facts: dict = {"python": sys.version.split()[0], "executable": sys.executable}
    try:
        import torch
    except ImportError as exc:
        return {**facts, "torch": None, "error": str(exc)}
    facts.update(
        torch=torch.__version__,
        cuda=torch.version.cuda,
        cuda_available=torch.cuda.is_available(),
        devices=[],
    )
    for index in range(torch.cuda.device_count() if facts["cuda_available"] else 0):
        props = torch.cuda.get_device_properties(index)
        facts["devices"].append(
            {
                "index": index,
                "name": props.name,
                "total_memory_bytes": props.total_memory,
                "multi_processor_count": props.multi_processor_count,
                "capability": f"{props.major}.{props.minor}",
                "l2_cache_bytes": getattr(props, "L2_cache_size", None),
            }
        )
    return facts


def _commit() -> str | None:
    """The commit of the checkout the session runs in, where git and its history came along."""
    if not shutil.which("git"):
        return None
    done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def gather_facts(session: Session) -> dict:
    """nvidia-smi's summary (and its full report into the log) and torch's view."""
    facts = {"torch": torch_facts(), "commit": _commit()}
    smi = shutil.which("nvidia-smi")
    if smi is None:
        facts["nvidia_smi"] = "not found"
    else:
        query = (
            "name,driver_version,memory.total,memory.used,clocks.max.sm,clocks.max.memory,"
            "clocks.sm,clocks.mem,power.limit,pcie.link.gen.max,pcie.link.width.max,"
            "temperature.gpu"
        )
        step = session.run("nvidia-smi", [smi, f"--query-gpu={query}", "--format=csv"], 30)
        facts["nvidia_smi"] = step["stdout"].strip()
        session.run("nvidia-smi -q", [smi, "-q"], 30)
    devices = facts["torch"].get("devices") or []
    facts["device_name"] = devices[0]["name"] if devices else None
    session.record["facts"] = facts
    session.save()
    return facts


def _json_out(step: dict):
    """The JSON object a `--json` step printed (None when it printed none)."""
    text = step.get("stdout", "")
    try:
        return json.loads(text[text.index("{") :]) if "{" in text else None
    except json.JSONDecodeError:
        return None


def _only(names) -> list[str]:
    return ["--only", ",".join(names)] if names else []


def run_plan(session: Session, device: str | None, budget_s: float, only) -> None:
    """The suite's plan on the catalogue device (or say why there is none)."""
    if device is None:
        session.record["plan"] = unknown_device_note(session.record["facts"].get("device_name"))
        return
    argv = [
        sys.executable,
        "-m",
        "kvlab",
        "bench",
        "gpu-suite",
        "--plan",
        device,
        "--budget",
        f"{budget_s:.0f}",
        "--json",
        *_only(only),
    ]
    plan = _json_out(session.run("plan", argv, min(60.0, session.left_s())))
    if plan:
        points = [p for b in plan["benchmarks"] for p in b["points"]]
        session.record["plan"] = {
            "device": plan["device"],
            "wall_s": round(plan["wall_s"], 1),
            "budget_s": plan["budget_s"],
            "points": len(points),
            "refused": sum(1 for p in points if p["refused"]),
            "beyond_budget": sum(1 for p in points if p.get("beyond_budget")),
        }


def run_suite_step(session: Session, args) -> None:
    """`kvlab bench gpu-suite` (dry run: `kvlab bench all --device cpu --quick`) into
    OUT/results, its budget trimmed so that the tests still fit before the deadline."""
    budget = min(args.budget, session.left_s() - TESTS_RESERVE_S - SUITE_GRACE_S)
    session.record["suite_budget_s"] = round(budget, 1)
    if budget < 10:
        session.record["suite"] = {"skipped": f"only {max(0.0, budget):.0f} s of suite budget left"}
        return
    where = (
        ["all", "--device", "cpu", "--quick"]
        if args.dry_run
        else ["gpu-suite", "--device", args.device]
    )
    argv = [
        sys.executable,
        "-m",
        "kvlab",
        "bench",
        *where,
        "--budget",
        f"{budget:.0f}",
        "--json",
        *_only(args.only),
    ]
    env = {
        "KVLAB_RESULTS_DIR": str(session.out / "results"),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [IMPORT_ROOT, os.environ.get("PYTHONPATH")])),
    }
    step = session.run("suite", argv, budget + SUITE_GRACE_S, env)
    session.record["suite"] = _json_out(step) or {
        "rc": step.get("rc"),
        "note": "no JSON summary printed",
    }


def run_tests(session: Session, tests) -> None:
    """`pytest -m gpu` over the GPU tests (they skip where CUDA is absent); None: kvlab's own,
    where the current folder has them."""
    if tests is None:
        tests = [t for t in GPU_TESTS if Path(t).is_file()]
        if not tests:
            session.record["tests"] = {"skipped": f"no {GPU_TESTS[0]} here (not a checkout)"}
            return
    if not tests:
        session.record["tests"] = {"skipped": "no test files named"}
        return
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "gpu",
        "-q",
        "-rs",
        "-p",
        "no:cacheprovider",
        *tests,
    ]
    step = session.run(
        "gpu tests", argv, session.left_s() - 15, {"PYTHONUNBUFFERED": "1"}, min_s=20
    )
    tail = step["stdout"].strip().splitlines()
    session.record["tests"] = {"rc": step.get("rc"), "summary": tail[-1] if tail else None}


def load_session_results(folder: Path) -> dict[str, dict]:
    """{kind: result} of the full (or, failing that, quick) results under folder/<machine>/."""
    found: dict[str, dict] = {}
    for path in sorted(folder.glob("*/*.json")):
        kind = path.stem.removesuffix("-quick")
        if kind not in found or not path.stem.endswith("-quick"):
            found[kind] = json.loads(path.read_text())
    return found


def pack(out: Path) -> list[str]:
    """Keep OUT within what comes back (MAX_FILES files, MAX_DEPTH folders, plain names):
    when the results would exceed it they go into one results.tar.gz. Returns the files."""

    def files():
        return sorted(p for p in out.rglob("*") if p.is_file())

    def too_deep():
        return any(len(p.relative_to(out).parts) > MAX_DEPTH + 1 for p in files())

    results = out / "results"
    if results.is_dir() and (len(files()) > MAX_FILES or too_deep()):
        with tarfile.open(out / "results.tar.gz", "w:gz") as tar:
            tar.add(results, arcname="results")
        shutil.rmtree(results)
    bad = [str(p.relative_to(out)) for p in files() if not re.fullmatch(r"[A-Za-z0-9._-]+", p.name)]
    if bad:
        raise RuntimeError(f"gpu_session: names that would not come back: {bad}")
    return [str(p.relative_to(out)) for p in files()]


#: What a session writes at OUT's top level; a folder holding anything else is someone's.
SESSION_FILES = {
    "session.log",
    "session.json",
    ".session.json.partial",
    "results",
    "results.tar.gz",
}


def _not_a_sessions(out: Path) -> list[str]:
    """Up to three names at OUT's top level that no session wrote (empty: OUT is new, empty,
    or a previous session's). `--out .` in a checkout once packed and removed its results/."""
    try:
        names = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    except (OSError, ValueError):
        return []  # mkdir and the write probe say why
    if "session.log" not in names and "results" in names:
        return ["results/ from elsewhere", *[n for n in names if n != "results"]][:3]
    return [n for n in names if n not in SESSION_FILES][:3]


def check_out(out: Path) -> Path:
    """OUT must be a folder this process can write (created if missing): checked before any
    step runs, so that a bad path costs a line, not a session's device time."""
    shown = str(out)[:200]
    try:
        is_file = out.exists() and not out.is_dir()
    except (OSError, ValueError):  # ValueError: a NUL byte in the path
        is_file = False  # mkdir says why below
    if is_file:
        raise KvlabError(f"--out {shown}: exists and is not a folder")
    others = _not_a_sessions(out)
    if others:
        raise KvlabError(
            f"--out {shown}: holds files no GPU session wrote ({', '.join(others)}); name an "
            "empty or new folder (a session packs OUT/results into results.tar.gz and removes it)"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".gpu_session-write-probe"
        probe.write_text("")
        probe.unlink()
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        why = getattr(exc, "strerror", None) or str(exc)
        raise KvlabError(f"--out {shown}: cannot write there ({why})") from None
    return out


def main(args) -> int:
    """The session, from `kvlab bench gpu-session`'s checked arguments (out, deadline, budget,
    device, only, tests, dry_run); exit status 1 when a step failed."""
    session = Session(args.out, args.deadline)
    session.record.update(dry_run=args.dry_run, device=args.device, only=args.only)
    facts = gather_facts(session)
    if not args.dry_run and not facts["torch"].get("cuda_available"):
        session.log("gpu_session: torch sees no CUDA device; --dry-run checks the session on a CPU")
        session.record["error"] = "no CUDA device"
    else:
        found = catalogue_device(facts.get("device_name"))
        facts["catalogue_device"] = found
        if found is None and not args.dry_run:
            facts["catalogue_note"] = unknown_device_note(facts.get("device_name"))
        plan_device = found or ("h200" if args.dry_run else None)
        run_plan(session, plan_device, args.budget, args.only)
        run_suite_step(session, args)
        run_tests(session, args.tests)
        session.record["findings"] = findings(load_session_results(session.out / "results"))
    session.record["wall_s"] = round(time.monotonic() - session.start, 1)
    session.save()
    session.record["files"] = pack(args.out)
    session.save()
    failed = [
        s["step"]
        for s in session.record["steps"]
        if s.get("rc") not in (0, None) or s.get("timed_out")
    ]
    session.log(
        f"gpu_session: done in {session.record['wall_s']} s; files: "
        f"{', '.join(session.record['files'])}"
        + (f"; steps that failed: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed or "error" in session.record else 0

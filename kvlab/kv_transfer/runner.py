"""Run a prefill and a decode process on this machine and collect what they measure.

The parent never touches torch. It starts both children as fresh interpreters
(`python -m kvlab.kv_transfer.child`, like multiprocessing's spawn but without re-importing
the caller's script, so it works from any script or notebook), wired by socket pairs:
one between the two children (the control channel), one from each child back up (rows,
errors). The parent owns every bound:
- a child that exits before finishing, or reports an error, ends the run with one
  clear KvlabError naming which process failed first;
- startup and the whole run have deadlines (the children bound each of their own waits);
- both children are always stopped and reaped (terminate, then kill) on success,
  failure, timeout and Ctrl-C, and they die with the parent (PR_SET_PDEATHSIG).
The children's stdout/stderr (C++ logging from gloo/Mooncake) go to a log file that an
error message points at; the parent's stderr carries one progress line per case.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from multiprocessing.connection import Connection, wait
from pathlib import Path

from ..errors import KvlabError
from ..fmt import seconds, si
from .config import DECODE, PREFILL, ROLES, TransferConfig, format_size

GRACE_S = 2.0  # after a failure, how long the other side may take to explain itself


def _pair() -> tuple[Connection, socket.socket]:
    """(our Connection, the socket whose fd a child inherits)."""
    ours, theirs = socket.socketpair()
    return Connection(ours.detach()), theirs


def run_local(config: TransferConfig, progress=None) -> dict:
    """Measure every case of `config` between two local processes; returns rows + facts."""
    config.validate()
    progress = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    log_dir = tempfile.mkdtemp(prefix="kvlab-kv-transfer-")
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    peer_a, peer_b = socket.socketpair()
    peer_socks = {PREFILL: peer_a, DECODE: peer_b}
    readers, procs, logs = {}, {}, []
    state = {"rows": [], "ready": {}, "done": set(), "errors": {}, "exits": {}, "log_dir": log_dir}
    ok = False
    try:
        for role in ROLES:
            reader, child_sock = _pair()
            readers[role] = reader
            log = open(os.path.join(log_dir, f"{role}.log"), "wb")
            logs.append(log)
            fds = (peer_socks[role].fileno(), child_sock.fileno())
            procs[role] = subprocess.Popen(
                [sys.executable, "-m", "kvlab.kv_transfer.child", role, *map(str, fds)],
                pass_fds=fds,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                close_fds=True,
            )
            child_sock.close()  # the child holds it now; our copy would hide its exit
            reader.send(asdict(config))
        for sock in peer_socks.values():
            sock.close()
        _monitor(config, procs, readers, state, progress)
        ok = True
    finally:
        _stop(procs)
        for conn in (*readers.values(), *logs):
            conn.close()
        for sock in peer_socks.values():
            sock.close()
        if ok:
            shutil.rmtree(log_dir, ignore_errors=True)
    return {
        "rows": state["rows"],
        "processes": state["ready"],
        "pids": {role: p.pid for role, p in procs.items()},
    }


def _monitor(config, procs, readers, state, progress) -> None:
    start = time.monotonic()
    deadline = start + config.time_limit_s
    startup_deadline = start + config.startup_timeout_s
    total = len(config.cases())
    open_readers = dict(readers)
    failed_at = None
    while len(state["done"]) < len(ROLES):
        now = time.monotonic()
        all_exited = all(r in state["exits"] for r in ROLES)
        if failed_at is not None and (now > failed_at + GRACE_S or all_exited):
            raise KvlabError(_failure_message(config, state))
        if now > deadline:
            raise KvlabError(
                f"kv-transfer ({config.label}) did not finish within its time limit "
                f"of {config.time_limit_s:g} s; both processes were stopped"
            )
        if len(state["ready"]) < len(ROLES) and now > startup_deadline and failed_at is None:
            missing = [r for r in ROLES if r not in state["ready"]]
            raise KvlabError(
                f"kv-transfer ({config.label}): the {' and '.join(missing)} process "
                f"did not start within {config.startup_timeout_s:g} s; logs in "
                f"{state['log_dir']}"
            )
        ready = wait(list(open_readers.values()), timeout=0.1)
        for handle in ready:
            role = next(r for r, c in open_readers.items() if c is handle)
            try:
                kind, _, payload = handle.recv()
            except (EOFError, OSError):
                del open_readers[role]
                continue
            if kind == "ready":
                state["ready"][role] = payload
            elif kind == "row":
                state["rows"].append(payload)
                progress(_progress_line(config, payload, len(state["rows"]), total))
            elif kind == "done":
                state["done"].add(role)
            elif kind == "error":
                state["errors"].setdefault(role, (time.monotonic(), payload))
                failed_at = failed_at or time.monotonic()
        for role in ROLES:
            if role in state["exits"] or role in open_readers and open_readers[role].poll():
                continue  # still running, or last words not read yet
            code = procs[role].poll()
            if code is not None:
                state["exits"][role] = code
                if role not in state["done"] and role not in state["errors"]:
                    failed_at = failed_at or time.monotonic()


def _failure_message(config, state) -> str:
    """Name the process that failed first: a silent death beats the error it caused."""
    dead = [
        r
        for r in ROLES
        if r in state["exits"] and r not in state["errors"] and r not in state["done"]
    ]
    parts = []
    if dead:
        role = dead[0]
        parts.append(f"the {role} process died (exit code {state['exits'][role]})")
        other = next((r for r in ROLES if r != role), None)
        if other in state["errors"]:
            parts.append(f"then the {other} process reported: {state['errors'][other][1]}")
    else:
        first = min(state["errors"], key=lambda r: state["errors"][r][0])
        parts.append(f"the {first} process failed: {state['errors'][first][1]}")
        other = DECODE if first == PREFILL else PREFILL
        if other in state["errors"]:
            parts.append(f"the {other} process then reported: {state['errors'][other][1]}")
    done = len(state["rows"])
    return (
        f"kv-transfer ({config.label}) stopped after {done} of {len(config.cases())} cases: "
        + "; ".join(parts)
        + f". Both processes were stopped; their logs are in {state['log_dir']}"
    )


def _progress_line(config, row, n, total) -> str:
    t = row["time_s"]
    check = "ok" if row["checksum_ok"] else "CHECKSUM MISMATCH"
    bandwidth = si(row["bandwidth_bytes_per_s"]["median"], "B/s")
    return (
        f"kv-transfer {config.label} [{n}/{total}] {row['layout']:<10} "
        f"{format_size(row['bytes']):>8}  {row['repeats']:>3} x  median "
        f"{seconds(t['median']):>9}  (p10 {seconds(t['p10'])}, p90 {seconds(t['p90'])})  "
        f"{bandwidth:>10}  {check}"
    )


def _stop(procs) -> None:
    """Terminate, then kill, then reap every child; never leave one behind."""
    for proc in procs.values():
        if proc.poll() is None:
            proc.terminate()
    for proc in procs.values():
        try:
            proc.wait(3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(3)

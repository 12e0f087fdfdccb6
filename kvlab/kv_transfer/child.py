"""Entry point of one benchmark process: `python -m kvlab.kv_transfer.child ROLE PEER_FD REPORT_FD`.

Started by `kvlab.kv_transfer.runner`, never by hand. It receives its configuration over
the report socket, runs its role, and reports "ready", rows, "done" or "error" back.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from multiprocessing.connection import Connection

from ..errors import KvlabError
from .channel import PipeChannel
from .config import DECODE, PREFILL, TransferConfig
from .worker import run_role


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies, so no orphan lingers."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:  # the parent died before the signal was armed
        return 1

    role, peer_fd, report_fd = argv[0], int(argv[1]), int(argv[2])
    report_conn, peer_conn = Connection(report_fd), Connection(peer_fd)

    def report(kind, payload):
        report_conn.send((kind, role, payload))

    try:
        if not report_conn.poll(60):
            raise KvlabError("no configuration from the parent within 60 s")
        config = TransferConfig(**report_conn.recv())
        if config.host.startswith("127."):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        os.environ.setdefault("MC_TCP_BIND_ADDRESS", config.host)
        os.environ.setdefault("MC_LOG_LEVEL", "ERROR")

        peer = DECODE if role == PREFILL else PREFILL
        run_role(role, config, PipeChannel(peer_conn, peer, config.timeout_s), report)
        report("done", None)
        status = 0
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent
        status = 1
        message = str(exc) if isinstance(exc, KvlabError) else f"{type(exc).__name__}: {exc}"
        try:
            report("error", message)
        except OSError:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # skip interpreter teardown: engine threads must not hold up the exit


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

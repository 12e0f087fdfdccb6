"""The control channel between the prefill and decode processes (never the KV itself).

It carries the out-of-band facts a transfer needs (ports, buffer addresses, block
tables, repeat counts, checksums). Every wait on it is bounded, and a peer that has
exited is reported as such instead of as a timeout.

- `PipeChannel`: a multiprocessing pipe between two processes spawned by the runner;
  the peer's exit closes it, so the survivor learns at once.
- `DistChannel`: objects over a gloo process group, for processes started by torchrun
  (one per node); waits are bounded by the group's timeout.
"""

from __future__ import annotations

from ..errors import KvlabError


class PeerError(KvlabError):
    """The other process died, hung past a timeout, or broke the protocol."""


class PipeChannel:
    def __init__(self, conn, peer: str, timeout_s: float):
        self.conn = conn
        self.peer = peer
        self.timeout_s = timeout_s
        self._pending: list = []

    def send(self, obj) -> None:
        try:
            self.conn.send(obj)
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
            raise PeerError(f"the {self.peer} process is gone (control channel closed)") from None

    def recv(self, what: str = "a message", timeout_s: float | None = None):
        if self._pending:
            return self._pending.pop(0)
        timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            if not self.conn.poll(timeout):
                raise PeerError(
                    f"timed out after {timeout:g} s waiting for {what} from the {self.peer} process"
                )
            return self.conn.recv()
        except (EOFError, ConnectionResetError, BrokenPipeError, OSError):
            raise PeerError(f"the {self.peer} process exited while we waited for {what}") from None

    def check_peer(self) -> None:
        """Raise if the peer has exited (called inside data-path polling loops)."""
        try:
            if self.conn.poll(0):
                self._pending.append(self.conn.recv())
        except (EOFError, ConnectionResetError, BrokenPipeError, OSError):
            raise PeerError(f"the {self.peer} process exited during the transfer") from None


class DistChannel:
    """Pickled objects over a (gloo) process group; used under torchrun."""

    def __init__(self, group, peer_rank: int, peer: str, timeout_s: float):
        self.group = group
        self.peer_rank = peer_rank
        self.peer = peer
        self.timeout_s = timeout_s

    def send(self, obj) -> None:
        import torch.distributed as dist

        try:
            dist.send_object_list([obj], dst=self.peer_rank, group=self.group)
        except RuntimeError as exc:
            raise PeerError(f"cannot reach the {self.peer} process: {_first_line(exc)}") from None

    def recv(self, what: str = "a message", timeout_s: float | None = None):
        import torch.distributed as dist

        box = [None]
        try:
            dist.recv_object_list(box, src=self.peer_rank, group=self.group)
        except RuntimeError as exc:
            raise PeerError(
                f"waiting for {what} from the {self.peer} process failed: {_first_line(exc)}"
            ) from None
        return box[0]

    def check_peer(self) -> None:
        return None


def _first_line(exc: BaseException) -> str:
    """The useful part of a library's error: its first line, without gloo's boilerplate."""
    text = str(exc).strip().splitlines()
    line = text[0].split(" This is typically caused by")[0] if text else type(exc).__name__
    if line.startswith("[") and "] " in line:  # gloo's "[/path/to/pair.cc:537] Read error ..."
        line = line.split("] ", 1)[1]
    return line.rstrip(". ")[:300] or type(exc).__name__

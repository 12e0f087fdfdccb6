"""Two real KV-transfer engines behind one interface.

A case moves `len(table)` blocks of `block_bytes` from the prefill process's KV pool to
the decode process's pool (contiguous = one block). Per timed iteration the prefill side
calls `push` then `wait_ack`; the decode side `pull` (returns when the KV is in its pool)
then `ack`. So one iteration = the KV crossing + one small acknowledgement back.

- `TorchEngine`: torch.distributed send/recv, gloo over TCP on CPU, NCCL between GPUs.
  Two-sided: a paged transfer is gathered into a staging buffer (index_select), sent as
  one message and scattered into the decode pool (index_copy_); both copies are timed.
- `MooncakeEngine`: the Mooncake Transfer Engine. One-sided writes straight from prefill
  blocks into decode blocks (a batch of (source, destination, length) requests, no
  staging), with a completion notification: Mooncake's TransferNotify, or a one-sided
  write of a sequence number into a "doorbell" word the receiver polls.

torch and mooncake are imported only inside these classes (in the child processes).
"""

from __future__ import annotations

import time
from datetime import timedelta

from ..errors import KvlabError
from .channel import PeerError, _first_line
from .config import DECODE, PREFILL, TransferConfig


def exchange(channel, role: str, mine, what: str):
    """Swap one object with the peer; prefill sends first so neither side blocks the other."""
    if role == PREFILL:
        channel.send(mine)
        return channel.recv(what)
    theirs = channel.recv(what)
    channel.send(mine)
    return theirs


class Engine:
    def __init__(self, config: TransferConfig, role: str, channel):
        self.config, self.role, self.channel = config, role, channel
        self.peer_name = DECODE if role == PREFILL else PREFILL

    def connect(self) -> dict:  # returns facts for the result's environment
        raise NotImplementedError

    def open_case(self, pool, table) -> None: ...
    def push(self, seq: int) -> None: ...
    def wait_ack(self, seq: int) -> None: ...
    def pull(self, seq: int) -> None: ...
    def ack(self, seq: int) -> None: ...
    def close_case(self) -> None: ...
    def close(self) -> None: ...


class TorchEngine(Engine):
    """torch.distributed point-to-point: gloo (CPU, TCP) or NCCL (CUDA)."""

    def connect(self) -> dict:
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.rank = 0 if self.role == PREFILL else 1
        self.peer_rank = 1 - self.rank
        self.timeout = timedelta(seconds=self.config.timeout_s)
        self.own_group = not dist.is_initialized()
        if self.own_group:  # spawned by kvlab's runner: rendezvous through the control channel
            if self.role == PREFILL:
                store = dist.TCPStore(
                    self.config.host, 0, 2, True, timeout=self.timeout, wait_for_workers=False
                )
                self.channel.send({"store_port": store.port})
            else:
                port = self.channel.recv("the rendezvous port")["store_port"]
                store = dist.TCPStore(self.config.host, port, 2, False, timeout=self.timeout)
            dist.init_process_group(
                self.config.backend, store=store, rank=self.rank, world_size=2, timeout=self.timeout
            )
        self.device = torch.device(self.config.device)
        self.ack_buf = torch.zeros(1, dtype=torch.int64, device=self.device)
        return {"engine": "torch.distributed", "backend": dist.get_backend()}

    def _op(self, what: str, fn):
        try:
            return fn()
        except RuntimeError as exc:
            raise PeerError(
                f"{what} failed, the {self.peer_name} process is unreachable: {_first_line(exc)}"
            ) from None

    def _recv(self, tensor, what: str) -> None:
        def go():
            work = self.dist.irecv(tensor, self.peer_rank)
            work.wait(timeout=self.timeout)

        self._op(f"receiving {what}", go)

    def open_case(self, pool, table) -> None:
        self.pool, self.table = pool, table
        self.first = int(table[0])
        self.staging = None
        if table.numel() > 1:
            self.staging = self.torch.empty(
                (table.numel(), pool.shape[1]), dtype=pool.dtype, device=pool.device
            )

    def push(self, seq: int) -> None:
        if self.staging is None:
            self._op(
                "sending the KV", lambda: self.dist.send(self.pool[self.first], self.peer_rank)
            )
        else:
            self.torch.index_select(self.pool, 0, self.table, out=self.staging)  # gather the blocks
            self._op("sending the KV", lambda: self.dist.send(self.staging, self.peer_rank))

    def wait_ack(self, seq: int) -> None:
        self._recv(self.ack_buf, "the acknowledgement")
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def pull(self, seq: int) -> None:
        if self.staging is None:
            self._recv(self.pool[self.first], "the KV")
        else:
            self._recv(self.staging, "the KV")
            self.pool.index_copy_(0, self.table, self.staging)  # scatter into the block table

    def ack(self, seq: int) -> None:
        self._op("acknowledging", lambda: self.dist.send(self.ack_buf, self.peer_rank))

    def close_case(self) -> None:
        self.pool = self.table = self.staging = None

    def close(self) -> None:
        if self.own_group and self.dist.is_initialized():
            self.dist.destroy_process_group()


class MooncakeEngine(Engine):
    """Mooncake Transfer Engine: P2P handshake (no metadata server), one-sided writes."""

    DATA, ACK = 0, 8  # int64 slots of the doorbell buffer (64 bytes apart)
    #: Requests per batch call: the TCP transport's queue rejects a batch of 4096 (seen with
    #: 0.3.13.post1: "TCP lane queue-full rejection", rc=-1), so bigger tables go in chunks.
    MAX_BATCH = 1024

    def connect(self) -> dict:
        import torch

        try:
            from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode
        except ImportError as exc:
            raise KvlabError(
                "the Mooncake engine needs mooncake-transfer-engine-non-cuda (CPU) or "
                f"mooncake-transfer-engine (CUDA), and Debian's libibverbs1: {_first_line(exc)}"
            ) from None
        self.torch, self.Notify, self.Write = torch, TransferNotify, TransferOpcode.Write
        self.engine = TransferEngine()
        protocol = self.config.mooncake_protocol
        rc = self.engine.initialize(self.config.host, "P2PHANDSHAKE", protocol, "")
        if rc != 0:
            raise KvlabError(
                f"Mooncake could not start ({protocol} on {self.config.host}, rc={rc})"
            )
        self.signal = torch.zeros(16, dtype=torch.int64)  # doorbells the peer writes into
        self.signal_src = torch.zeros(16, dtype=torch.int64)  # what we write into the peer's
        self.registered = []
        for buf in (self.signal, self.signal_src):
            self._register(buf.data_ptr(), buf.numel() * 8, "cpu")
        mine = {
            "session": f"{self.config.host}:{self.engine.get_rpc_port()}",
            "signal": self.signal.data_ptr(),
        }
        theirs = exchange(self.channel, self.role, mine, "the Mooncake session id")
        self.peer, self.peer_signal = theirs["session"], theirs["signal"]
        self.notes: set[str] = set()
        return {
            "engine": "mooncake",
            "backend": protocol,
            "handshake": "P2PHANDSHAKE",
            "completion": self.config.completion,
        }

    def _register(self, ptr: int, nbytes: int, location: str) -> None:
        rc = self.engine.register_memory(ptr, nbytes, location if location != "cpu" else "*")
        if rc != 0:
            raise KvlabError(f"Mooncake could not register {nbytes} bytes of memory (rc={rc})")
        self.registered.append(ptr)

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise PeerError(
                f"Mooncake {what} to the {self.peer_name} process failed (rc={rc}): "
                "the peer is gone or unreachable"
            )

    def _wait(self, ready, what: str) -> None:
        timeout = self.config.timeout_s
        deadline = time.monotonic() + timeout
        next_check = time.monotonic() + 0.05
        while not ready():
            now = time.monotonic()
            if now > deadline:
                raise PeerError(
                    f"timed out after {timeout:g} s waiting for the {what} from the "
                    f"{self.peer_name} process"
                )
            if now > next_check:
                self.channel.check_peer()
                next_check = now + 0.05
            time.sleep(self.config.poll_s)

    def _noted(self, msg: str) -> bool:
        self.notes.update(n.msg for n in self.engine.get_notifies())
        if msg in self.notes:
            self.notes.discard(msg)
            return True
        return False

    def _doorbell(self, slot: int, seq: int) -> None:
        self.signal_src[slot] = seq
        rc = self.engine.transfer_sync_write(
            self.peer, self.signal_src.data_ptr() + 8 * slot, self.peer_signal + 8 * slot, 8
        )
        self._check(rc, "doorbell write")

    def open_case(self, pool, table) -> None:
        self.pool = pool
        block = pool.shape[1]
        location = "cpu" if pool.device.type == "cpu" else f"cuda:{pool.device.index or 0}"
        self._register(pool.data_ptr(), pool.numel(), location)
        mine = {"base": pool.data_ptr(), "table": table.tolist(), "block": block}
        theirs = exchange(self.channel, self.role, mine, "its KV pool's block addresses")
        if self.role == PREFILL:
            self.src = [pool.data_ptr() + int(b) * block for b in table.tolist()]
            self.dst = [theirs["base"] + int(b) * block for b in theirs["table"]]
            self.lengths = [block] * len(self.src)

    def push(self, seq: int) -> None:
        note = self.Notify("kvlab", f"kv {seq}") if self.config.completion == "notify" else None
        if len(self.src) == 1:
            rc = self.engine.transfer_sync(
                self.peer, self.src[0], self.dst[0], self.lengths[0], self.Write, note
            )
            self._check(rc, "write of the KV")
        else:
            n = self.MAX_BATCH
            for i in range(0, len(self.src), n):  # chunks complete in order; the last one notifies
                last = i + n >= len(self.src)
                rc = self.engine.batch_transfer_sync(
                    self.peer,
                    self.src[i : i + n],
                    self.dst[i : i + n],
                    self.lengths[i : i + n],
                    self.Write,
                    note if last else None,
                )
                self._check(rc, "write of the KV")
        if note is None:
            self._doorbell(self.DATA, seq)

    def _await(self, seq: int, slot: int, note: str, notified: str, rung: str) -> None:
        """Wait for message `seq`: its notification `note seq`, or its doorbell in `slot`."""
        if self.config.completion == "notify":
            self._wait(lambda: self._noted(f"{note} {seq}"), notified)
        else:
            self._wait(lambda: int(self.signal[slot]) >= seq, rung)

    def pull(self, seq: int) -> None:
        self._await(seq, self.DATA, "kv", "KV-arrived notification", "KV doorbell")

    def ack(self, seq: int) -> None:
        if self.config.completion == "notify":
            self.signal_src[self.ACK] = seq
            rc = self.engine.transfer_sync(
                self.peer,
                self.signal_src.data_ptr() + 8 * self.ACK,
                self.peer_signal + 8 * self.ACK,
                8,
                self.Write,
                self.Notify("kvlab", f"ack {seq}"),
            )
            self._check(rc, "acknowledgement")
        else:
            self._doorbell(self.ACK, seq)

    def wait_ack(self, seq: int) -> None:
        self._await(seq, self.ACK, "ack", "acknowledgement", "acknowledgement")

    def close_case(self) -> None:
        ptr = self.pool.data_ptr()
        self.engine.unregister_memory(ptr)
        self.registered.remove(ptr)
        self.pool = None

    def close(self) -> None:
        for ptr in list(self.registered):
            self.engine.unregister_memory(ptr)
        self.registered.clear()


def make_engine(config: TransferConfig, role: str, channel) -> Engine:
    return {"torch": TorchEngine, "mooncake": MooncakeEngine}[config.engine](config, role, channel)

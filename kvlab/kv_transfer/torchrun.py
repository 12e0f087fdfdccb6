"""The same benchmark across nodes (or GPUs) with torchrun: one process per rank.

Rank 0 is the prefill side, rank 1 the decode side. torchrun provides the rendezvous
(MASTER_ADDR / MASTER_PORT); a gloo group carries the control messages, and the data
goes over NCCL (`--device cuda`), gloo (`--device cpu`) or Mooncake. Two nodes:

    # on node A (prefill) and node B (decode), the same line with --node-rank 0 / 1:
    torchrun --nnodes 2 --nproc-per-node 1 --node-rank R --master-addr A_IP --master-port 29511 \\
        -m kvlab bench kv-transfer --engine torch --device cuda --host THIS_NODE_IP
    # two GPUs of one node (NVLink):
    torchrun --standalone --nproc-per-node 2 -m kvlab bench kv-transfer --engine torch --device cuda

Mooncake across nodes: add `--engine mooncake --mooncake-protocol rdma` (CUDA build of
mooncake-transfer-engine) and `--host` set to each node's address. Rank 0 writes the
results file; a failing peer surfaces as an error on the other rank after `--timeout`.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from datetime import timedelta

from ..errors import KvlabError
from .channel import DistChannel
from .config import DECODE, PREFILL, TransferConfig
from .runner import _progress_line
from .worker import run_role


def under_torchrun() -> bool:
    """True in a process that torchrun (torch.distributed.elastic) started."""
    launched = all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))
    return "TORCHELASTIC_RUN_ID" in os.environ or launched


_GROUP: dict = {}


def init_torchrun(configs) -> None:
    """Join torchrun's rendezvous once for all engines (a second init on the same store fails).

    The default group uses NCCL when a torch engine moves CUDA buffers, gloo otherwise;
    a separate gloo group carries the control messages.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        return
    world = int(os.environ["WORLD_SIZE"])
    if world != 2:
        raise KvlabError(
            f"kv-transfer under torchrun needs exactly 2 processes (prefill, decode), got {world}"
        )
    first = configs[0]
    if first.host.startswith("127."):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("MC_TCP_BIND_ADDRESS", first.host)
    os.environ.setdefault("MC_LOG_LEVEL", "ERROR")
    nccl = any(c.engine == "torch" and c.backend == "nccl" for c in configs)
    backend = "nccl" if nccl else "gloo"
    if backend == "nccl":
        import torch

        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    timeout = timedelta(seconds=max(c.timeout_s for c in configs))
    try:
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
        _GROUP["control"] = dist.new_group(backend="gloo", timeout=timeout)
    except RuntimeError as exc:
        raise KvlabError(f"torchrun rendezvous failed: {exc}".splitlines()[0]) from None


def finish_torchrun() -> None:
    import torch.distributed as dist

    _GROUP.clear()
    if dist.is_initialized():
        dist.destroy_process_group()


def run_torchrun(config: TransferConfig, progress=None) -> dict | None:
    """Run this rank's role (after `init_torchrun`); rank 0 returns the rows, rank 1 None."""
    import torch

    config.validate()
    rank = int(os.environ["RANK"])
    role = PREFILL if rank == 0 else DECODE
    if config.device.startswith("cuda"):
        config = _with_device(config, f"cuda:{torch.cuda.current_device()}")
    peer = DECODE if role == PREFILL else PREFILL
    channel = DistChannel(_GROUP["control"], 1 - rank, peer, config.timeout_s)
    rows, facts = [], {}
    progress = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    total = len(config.cases())

    def report(kind, payload):
        if kind == "row":
            rows.append(payload)

            progress(_progress_line(config, payload, len(rows), total))
        elif kind == "ready":
            facts[role] = payload

    run_role(role, config, channel, report)
    if role != PREFILL:
        return None
    return {"rows": rows, "processes": facts, "pids": {}, "launcher": "torchrun"}


def _with_device(config: TransferConfig, device: str) -> TransferConfig:
    return replace(config, device=device)

"""What each of the two processes runs: build a KV pool, move it, time it, check it.

Per case (layout, size) both sides allocate a pool of fixed-size blocks and a block
table (contiguous = one block; paged = the request's blocks scattered over a larger
pool, in a random order, on each side). The prefill side fills its blocks with data
(every block stamped with its own number, so a misplaced block changes the checksum).
Timed loop: warm-up, then as many repeats as fit in `seconds_per_size` (within
[min_repeats, max_repeats]). Then the decode side zeroes its pool, one more transfer
runs, and both sides checksum the request's blocks in block-table order; the prefill
side reports both checksums.
"""

from __future__ import annotations

import os
import time
import zlib
from dataclasses import replace

import numpy as np

from ..errors import KvlabError
from .config import DECODE, PREFILL, TransferConfig
from .engines import exchange, make_engine

#: Bytes of random data repeated through every block (stamps make blocks distinct).
TILE_BYTES = 1 << 20


def summarise(times_s: list[float], nbytes: int) -> dict:
    """Median and spread of per-iteration times, and the bandwidths they imply."""
    t = np.asarray(times_s, dtype=float)
    q10, q25, q50, q75, q90 = np.percentile(t, [10, 25, 50, 75, 90])
    return {
        "time_s": {
            "median": q50,
            "p10": q10,
            "p25": q25,
            "p75": q75,
            "p90": q90,
            "min": float(t.min()),
            "max": float(t.max()),
            "mean": float(t.mean()),
        },
        # percentiles of bandwidth: the 10th percentile comes from the 90th of time
        "bandwidth_bytes_per_s": {
            "median": nbytes / q50,
            "p10": nbytes / q90,
            "p90": nbytes / q10,
            "max": nbytes / float(t.min()),
        },
    }


def _layout(config: TransferConfig, layout: str, size: int) -> tuple[int, int, int]:
    """(block_bytes, blocks in the request, blocks in the pool)."""
    if layout == "contiguous":
        return size, 1, 1
    blocks = size // config.block_bytes
    return config.block_bytes, blocks, blocks + max(1, blocks // 4)


def _fill(torch, pool, case_index: int, seed: int) -> None:
    """Random bytes (one tile repeated) with each block's first 8 bytes = its own stamp."""
    gen = torch.Generator().manual_seed(seed * 1000 + case_index)
    flat = pool.view(-1)
    tile = torch.randint(
        0, 256, (min(TILE_BYTES, flat.numel()),), dtype=torch.uint8, generator=gen
    ).to(pool.device)
    for start in range(0, flat.numel(), tile.numel()):
        end = min(start + tile.numel(), flat.numel())
        flat[start:end].copy_(tile[: end - start])
    width = min(8, pool.shape[1])
    stamps = torch.arange(pool.shape[0], dtype=torch.int64) * 1_000_003 + case_index + 1
    pool[:, :width].copy_(stamps.view(torch.uint8).view(-1, 8)[:, :width].to(pool.device))


def checksum(pool, table) -> str:
    """CRC-32 of the request's blocks, read in block-table order."""
    crc = 0
    rows = pool.index_select(0, table).cpu().numpy() if pool.device.type != "cpu" else None
    for i, b in enumerate(table.tolist()):
        block = rows[i] if rows is not None else pool[b].numpy()
        crc = zlib.crc32(memoryview(block), crc)
    return f"crc32:{crc:08x}"


def _maybe_fault(config: TransferConfig, role: str, case_index: int) -> None:
    fault = config.fault_at(role)
    if fault and fault[1] == case_index:
        if fault[0] == "exit":
            os._exit(17)  # die without a word, as a crashed or OOM-killed process would
        # hang: the peer's timeouts must fire
        time.sleep(10 * max(config.timeout_s, config.time_limit_s))


def role_device(torch, config: TransferConfig, role: str) -> str:
    """'cuda' means one GPU per role when there are two (NCCL refuses two ranks on one GPU)."""
    if config.device != "cuda":
        return config.device
    if not torch.cuda.is_available():
        raise KvlabError("--device cuda asked for, but torch sees no CUDA device")
    index = 1 if role == DECODE and torch.cuda.device_count() > 1 else 0
    return f"cuda:{index}"


def run_role(role: str, config: TransferConfig, channel, report) -> None:
    """Run every case as `role`; `report(kind, payload)` sends rows/progress upwards."""

    import torch

    torch.set_num_threads(config.threads)
    config = replace(config, device=role_device(torch, config, role))
    if config.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(config.device))
    engine = make_engine(config, role, channel)
    info = engine.connect()
    report("ready", {"pid": os.getpid(), "device": config.device, **info})
    seq = 0
    try:
        for index, (layout, size) in enumerate(config.cases()):
            block, blocks, pool_blocks = _layout(config, layout, size)
            pool = torch.zeros((pool_blocks, block), dtype=torch.uint8, device=config.device)
            rng = np.random.default_rng([config.seed, index, 0 if role == PREFILL else 1])
            order = rng.permutation(pool_blocks)[:blocks].astype(np.int64)
            table = torch.from_numpy(order).to(config.device)
            if role == PREFILL:
                _fill(torch, pool, index, config.seed)
            engine.open_case(pool, table)
            _maybe_fault(config, role, index)  # test hook: fail mid-transfer, peers connected
            if role == PREFILL:
                row, seq = _prefill_case(engine, channel, config, pool, table, seq)
                report(
                    "row",
                    {
                        "layout": layout,
                        "bytes": size,
                        "block_bytes": block,
                        "blocks": blocks,
                        **row,
                    },
                )
            else:
                seq = _decode_case(engine, channel, config, pool, table, seq)
            engine.close_case()
            del pool, table
    finally:
        engine.close()


def _prefill_case(engine, channel, config, pool, table, seq):
    def once():
        nonlocal seq
        seq += 1
        t0 = time.perf_counter()
        engine.push(seq)
        engine.wait_ack(seq)
        return time.perf_counter() - t0

    warm = [once() for _ in range(config.warmup)]
    estimate = min(warm) if warm else once()
    repeats = int(
        np.clip(
            config.seconds_per_size / max(estimate, 1e-9), config.min_repeats, config.max_repeats
        )
    )
    channel.send({"repeats": repeats, "warmup_done": bool(warm)})
    times = [once() for _ in range(repeats)]
    channel.recv("word that the decode pool is zeroed")
    once()  # the verification transfer
    mine = checksum(pool, table)
    theirs = exchange(channel, PREFILL, mine, "the decode side's checksum")
    row = {
        "warmup": len(warm) if warm else 1,
        "repeats": repeats,
        **summarise(times, pool.shape[1] * table.numel()),
        "checksum": {"prefill": mine, "decode": theirs},
        "checksum_ok": mine == theirs,
    }
    return row, seq


def _decode_case(engine, channel, config, pool, table, seq):
    def once():
        nonlocal seq
        seq += 1
        engine.pull(seq)
        engine.ack(seq)

    for _ in range(config.warmup):
        once()
    plan = channel.recv("the repeat count")
    if not plan["warmup_done"]:
        once()
    for _ in range(plan["repeats"]):
        once()
    pool.zero_()
    channel.send("zeroed")
    once()
    exchange(channel, DECODE, checksum(pool, table), "the prefill side's checksum")
    return seq

"""Decode with KV outside HBM: read from its placement every step, or moved once.

Decode reads the whole KV history every step, so KV left in a slow placement is paid
for on every token; KV moved into HBM before decoding is paid for once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cost import Num, Result, _out, decode_step
from ..deployment import Deployment
from ..errors import check_number
from .placement import TierPath, as_path, transfer_time_s


def carried(source, *names: str) -> dict:
    """{name: source.name}: the figures a result carries over unchanged from the result it
    is built on (its deployment, batch, context, ...)."""
    return {name: getattr(source, name) for name in names}


# --------------------------------------------------------------- where KV is read


@dataclass(frozen=True)
class TieredStep(Result):
    """One decode step whose KV is read (all or `tier_fraction` of it) from a placement."""

    model: str
    hardware: str
    placement: str
    batch: Num
    context: Num
    tier_fraction: Num  # share of the KV read from the placement each step
    tier_bandwidth_bytes_per_s: Num
    hbm_bytes: Num  # weights + resident KV + new K/V, read/written in HBM
    tier_bytes: Num  # KV read over the placement's path every step
    hbm_time_s: Num
    tier_time_s: Num
    compute_time_s: Num
    step_time_s: Num
    bound: Num  # "compute", "memory" (HBM) or "tier"
    tokens_per_s: Num
    hbm_step_time_s: Num  # the same step with all KV in HBM
    hbm_tokens_per_s: Num
    slowdown: Num  # step_time_s / hbm_step_time_s


def tiered_decode_step(
    d: Deployment, batch, context, path: TierPath | str, tier_fraction=1.0, overlap=False
) -> TieredStep:
    """A decode step of deployment `d` that reads `tier_fraction` of every sequence's KV
    over `path` (a `TierPath`, or a placement or tier name at its peak).

    Weights, the resident KV and the new token's K/V move at HBM speed; the tiered KV
    moves at the placement's speed, every step. `overlap=False` (default) adds the two
    (attention of a layer waits for that layer's KV); `overlap=True` takes the longer,
    the best a perfectly pipelined fetch can do. The placement latency is paid once
    per step (a per-layer fetch would pay it num_layers times).
    """
    path = as_path(path)
    step = decode_step(d, batch, context)
    p, bandwidth, latency = path.resolve(d.hardware)
    fraction = check_number(
        "tier_fraction", tier_fraction, minimum=0, allow_equal_min=True, maximum=1.0
    )
    hbm_bw = step.bandwidth_bytes_per_s  # the device's, or the scenario's override
    tier_bytes = np.asarray(fraction) * np.asarray(step.kv_read_bytes, dtype=float)
    hbm_bytes = np.asarray(step.step_bytes, dtype=float) - tier_bytes
    hbm_time = np.asarray(transfer_time_s(hbm_bytes, hbm_bw, d.efficiency))
    tier_time = np.where(
        tier_bytes > 0, transfer_time_s(tier_bytes, bandwidth, path.efficiency, latency), 0.0
    )
    memory_time = np.maximum(hbm_time, tier_time) if overlap else hbm_time + tier_time
    compute = np.asarray(step.compute_time_s, dtype=float)
    step_time = np.maximum(memory_time, compute)
    bound = np.where(
        compute >= memory_time, "compute", np.where(tier_time > hbm_time, "tier", "memory")
    )
    b = np.asarray(step.batch, dtype=float)
    return TieredStep(
        **carried(step, "model", "hardware", "batch", "context", "compute_time_s"),
        placement=p.name,
        tier_fraction=fraction,
        tier_bandwidth_bytes_per_s=_out(np.asarray(bandwidth, dtype=float)),
        hbm_bytes=_out(hbm_bytes),
        tier_bytes=_out(tier_bytes),
        hbm_time_s=_out(hbm_time),
        tier_time_s=_out(tier_time),
        step_time_s=_out(step_time),
        bound=bound.item() if bound.ndim == 0 else bound,
        tokens_per_s=_out(b / step_time),
        hbm_step_time_s=step.step_time_s,
        hbm_tokens_per_s=step.tokens_per_s,
        slowdown=_out(step_time / np.asarray(step.step_time_s)),
    )


@dataclass(frozen=True)
class MoveOnce(Result):
    """KV read from its placement every step, against moved into HBM once before decode."""

    placement: str
    kv_bytes: Num  # the batch's KV history
    fetch_once_s: Num  # moving it into HBM once
    hbm_step_time_s: Num  # a decode step once it is local
    every_step_time_s: Num  # a decode step that reads it remotely
    output_tokens: Num
    total_move_once_s: Num  # fetch + output_tokens local steps
    total_every_step_s: Num  # output_tokens remote steps
    speedup: Num  # total_every_step_s / total_move_once_s
    breakeven_tokens: Num  # output tokens after which moving once wins


def move_once_vs_every_step(
    d: Deployment, batch, context, path: TierPath | str, output_tokens=256
) -> MoveOnce:
    """The article's rule for PD disaggregation: pull the KV into HBM before decoding.

    The context is held fixed over the `output_tokens` steps (the few hundred tokens
    a response adds change little at thousands of tokens of history).
    """
    out = check_number(
        "output_tokens", output_tokens, minimum=1, allow_equal_min=True, maximum=1e7, integer=True
    )
    path = as_path(path)
    step = tiered_decode_step(d, batch, context, path)
    kv = np.asarray(step.tier_bytes, dtype=float)
    fetch = np.asarray(path.time_s(kv, d.hardware))
    local, remote = np.asarray(step.hbm_step_time_s), np.asarray(step.step_time_s)
    n = np.asarray(out, dtype=float)
    gain = remote - local
    with np.errstate(divide="ignore", invalid="ignore"):
        breakeven = np.where(gain > 0, np.ceil(fetch / gain), np.inf)
    return MoveOnce(
        placement=step.placement,
        kv_bytes=_out(kv),
        fetch_once_s=_out(fetch),
        hbm_step_time_s=_out(local),
        every_step_time_s=_out(remote),
        output_tokens=out,
        total_move_once_s=_out(fetch + n * local),
        total_every_step_s=_out(n * remote),
        speedup=_out(n * remote / (fetch + n * local)),
        breakeven_tokens=_out(breakeven),
    )

"""Decode with KV outside HBM: read from its placement every step, or moved once.

Decode reads the whole KV history every step, so KV left in a slow placement is paid
for on every token; KV moved into HBM before decoding is paid for once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cost import Result, _out
from ..dtypes import DType
from ..errors import check_number
from ..hardware import Device, Tier
from ..models import ModelSpec
from ..scenario import Scenario
from .placement import Placement, TierPath, transfer_time_s

# --------------------------------------------------------------- where KV is read


@dataclass(frozen=True)
class TieredStep(Result):
    """One decode step whose KV is read (all or `tier_fraction` of it) from a placement."""

    model: str
    hardware: str
    placement: str
    batch: object
    context: object
    tier_fraction: object  # share of the KV read from the placement each step
    tier_bandwidth_bytes_per_s: object
    hbm_bytes: object  # weights + resident KV + new K/V, read/written in HBM
    tier_bytes: object  # KV read over the placement's path every step
    hbm_time_s: object
    tier_time_s: object
    compute_time_s: object
    step_time_s: object
    bound: object  # "compute", "memory" (HBM) or "tier"
    tokens_per_s: object
    hbm_step_time_s: object  # the same step with all KV in HBM
    hbm_tokens_per_s: object
    slowdown: object  # step_time_s / hbm_step_time_s


def tiered_decode_step(
    model: ModelSpec | str,
    hardware: Device | str,
    batch=1,
    context=4096,
    tier: Placement | Tier | str = "host-pcie5",
    tier_fraction=1.0,
    weight_dtype: str | DType = "fp16",
    kv_dtype: str | DType = "fp16",
    efficiency=1.0,
    tier_efficiency=1.0,
    tier_bandwidth_bytes_per_s=None,
    latency_s=None,
    overlap=False,
) -> TieredStep:
    """A decode step that reads `tier_fraction` of every sequence's KV from `tier`: the
    long-form signature of `tiered_step` (the CLI, the book and the labs call this one)."""
    return tiered_step(
        Scenario(model, hardware, weight_dtype, kv_dtype, efficiency),
        batch,
        context,
        TierPath(tier, tier_efficiency, tier_bandwidth_bytes_per_s, latency_s),
        tier_fraction,
        overlap,
    )


def tiered_step(
    sc: Scenario, batch, context, path: TierPath, tier_fraction=1.0, overlap=False
) -> TieredStep:
    """A decode step of scenario `sc` that reads `tier_fraction` of every sequence's KV over `path`.

    Weights, the resident KV and the new token's K/V move at HBM speed; the tiered KV
    moves at the placement's speed, every step. `overlap=False` (default) adds the two
    (attention of a layer waits for that layer's KV); `overlap=True` takes the longer,
    the best a perfectly pipelined fetch can do. The placement latency is paid once
    per step (a per-layer fetch would pay it num_layers times).
    """
    step = sc.decode_step(batch, context)
    p, bandwidth, latency = path.resolve(sc.hardware)
    fraction = check_number(
        "tier_fraction", tier_fraction, minimum=0, allow_equal_min=True, maximum=1.0
    )
    hbm_bw = step.bandwidth_bytes_per_s  # the device's, or the scenario's override
    tier_bytes = np.asarray(fraction) * np.asarray(step.kv_read_bytes, dtype=float)
    hbm_bytes = np.asarray(step.step_bytes, dtype=float) - tier_bytes
    hbm_time = np.asarray(transfer_time_s(hbm_bytes, hbm_bw, sc.efficiency))
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
        model=step.model,
        hardware=step.hardware,
        placement=p.name,
        batch=step.batch,
        context=step.context,
        tier_fraction=fraction,
        tier_bandwidth_bytes_per_s=_out(np.asarray(bandwidth, dtype=float)),
        hbm_bytes=_out(hbm_bytes),
        tier_bytes=_out(tier_bytes),
        hbm_time_s=_out(hbm_time),
        tier_time_s=_out(tier_time),
        compute_time_s=step.compute_time_s,
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
    kv_bytes: object  # the batch's KV history
    fetch_once_s: object  # moving it into HBM once
    hbm_step_time_s: object  # a decode step once it is local
    every_step_time_s: object  # a decode step that reads it remotely
    output_tokens: object
    total_move_once_s: object  # fetch + output_tokens local steps
    total_every_step_s: object  # output_tokens remote steps
    speedup: object  # total_every_step_s / total_move_once_s
    breakeven_tokens: object  # output tokens after which moving once wins


def move_once_vs_every_step(
    model: ModelSpec | str,
    hardware: Device | str,
    batch=1,
    context=4096,
    tier: Placement | Tier | str = "remote-ib-400g",
    output_tokens=256,
    weight_dtype: str | DType = "fp16",
    kv_dtype: str | DType = "fp16",
    efficiency=1.0,
    tier_efficiency=1.0,
    tier_bandwidth_bytes_per_s=None,
    latency_s=None,
) -> MoveOnce:
    """The long-form signature of `move_once` (what the CLI and the book call)."""
    return move_once(
        Scenario(model, hardware, weight_dtype, kv_dtype, efficiency),
        batch,
        context,
        TierPath(tier, tier_efficiency, tier_bandwidth_bytes_per_s, latency_s),
        output_tokens,
    )


def move_once(sc: Scenario, batch, context, path: TierPath, output_tokens=256) -> MoveOnce:
    """The article's rule for PD disaggregation: pull the KV into HBM before decoding.

    The context is held fixed over the `output_tokens` steps (the few hundred tokens
    a response adds change little at thousands of tokens of history).
    """
    out = check_number(
        "output_tokens", output_tokens, minimum=1, allow_equal_min=True, maximum=1e7, integer=True
    )
    step = tiered_step(sc, batch, context, path)
    kv = np.asarray(step.tier_bytes, dtype=float)
    fetch = np.asarray(path.time_s(kv, sc.hardware))
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

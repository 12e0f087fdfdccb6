"""How fat the KV gets against device capacity, where overflow starts, what spilling costs.

KV grows with batch x context; once weights + KV pass the device's capacity the overflow
must live in a lower tier. Spilled KV is still read every decode step, so tokens/s falls
to the speed of the slower path; capping the batch instead keeps everything in HBM.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import cost
from ..cost import Num, Result, _out
from ..deployment import Deployment
from .decode import carried, tiered_decode_step
from .placement import TierPath


@dataclass(frozen=True)
class KVFootprint(Result):
    """Weights + batch x context of KV against the device's memory."""

    model: str
    hardware: str
    batch: Num
    context: Num
    kv_bytes_per_token: float
    kv_bytes_per_request: Num  # one sequence's KV at this context
    kv_cache_bytes: Num  # the whole batch's KV
    weight_bytes: float
    capacity_bytes: float
    kv_room_bytes: float  # capacity left for KV once the weights are in
    fits: Num
    overflow_bytes: Num  # KV that does not fit beside the weights
    overflow_fraction: Num  # overflow / KV (1.0 when not even the weights fit)
    max_batch: Num  # at this context
    max_context: Num  # at this batch (inf: a sliding window caps the KV)


def kv_footprint(d: Deployment, batch=1, context=4096) -> KVFootprint:
    """KV bytes for batch x context, and how much of it overflows the device."""
    step = cost.decode_step(d, batch, context)
    fit = cost.memory_fit(d, batch, context)
    kv = np.asarray(step.kv_cache_bytes, dtype=float)
    room = max(step.capacity_bytes - step.weight_bytes, 0.0)
    overflow = np.maximum(kv - room, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        fraction = np.where(kv > 0, overflow / np.where(kv > 0, kv, 1.0), 0.0)
    if room == 0.0:
        fraction = np.ones_like(fraction)
    per_request = kv / np.asarray(step.batch, dtype=float)
    return KVFootprint(
        **carried(step, "model", "hardware", "batch", "context", "kv_bytes_per_token"),
        **carried(step, "kv_cache_bytes", "weight_bytes", "capacity_bytes", "fits"),
        **carried(fit, "max_batch", "max_context"),
        kv_bytes_per_request=_out(per_request),
        kv_room_bytes=room,
        overflow_bytes=_out(overflow),
        overflow_fraction=_out(fraction),
    )


@dataclass(frozen=True)
class SpillCost(Result):
    """Decode with the overflow spilled to a lower tier, against capping the batch."""

    placement: str
    batch: Num
    context: Num
    fits: Num
    overflow_fraction: Num
    tokens_per_s_spilled: Num  # the batch runs, overflow read from the tier each step
    tokens_per_s_unlimited: Num  # as if HBM were big enough (the ledger's figure)
    capped_batch: Num  # the largest batch that fits (0: not one sequence)
    tokens_per_s_capped: Num  # run only the batch that fits, all in HBM
    step_time_s: Num  # of the spilled configuration


def spill_cost(d: Deployment, batch, context, path: TierPath | str, overlap=False) -> SpillCost:
    """Tokens/s when the KV that overflows HBM is read over `path` every step.

    The overflow share of every sequence's KV is read over the tier (KV of all running
    sequences is touched every step, so which blocks spill does not matter).
    """
    fp = kv_footprint(d, batch, context)
    spilled = tiered_decode_step(d, batch, context, path, fp.overflow_fraction, overlap)
    capped = np.minimum(np.asarray(fp.batch), np.asarray(fp.max_batch))
    capped_step = cost.decode_step(d, np.maximum(capped, 1), context)
    capped_tps = np.where(capped >= 1, np.asarray(capped_step.tokens_per_s, dtype=float), 0.0)
    return SpillCost(
        **carried(fp, "batch", "context", "fits", "overflow_fraction"),
        placement=spilled.placement,
        tokens_per_s_spilled=spilled.tokens_per_s,
        tokens_per_s_unlimited=spilled.hbm_tokens_per_s,
        capped_batch=_out(capped.astype(np.int64)),
        tokens_per_s_capped=_out(capped_tps),
        step_time_s=spilled.step_time_s,
    )

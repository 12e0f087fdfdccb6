"""Pruning before simulating: a design that cannot hold the model and the requests is not
run. The test is the ledger's memory fit per GPU (`kvlab.cost.memory_fit`, weights and K/V
heads split over the tensor-parallel group), asked of every request of the workload
(prompt + output tokens, batch 1):

- weights alone leave no room for one request's KV: pruned;
- more requests than the attainment target lets miss are each too large for an empty
  instance: pruned, since the simulator rejects those at arrival and a rejected request
  misses its SLOs at every rate.

The simulator's own admission rule is stricter (whole KV blocks, a watermark), so a design
kept here may still reject a few requests, but a pruned design can never meet the target.
"""

from __future__ import annotations

import numpy as np

from .. import cost
from ..deployment import Deployment
from ..fmt import percent, si


def prune_reason(design, model: str, weight_dtype, kv_dtype, request_tokens, attainment) -> str:
    """Why `design` cannot meet the target in memory ('' when it may)."""
    d = Deployment(
        model, design.hardware, weight_dtype, kv_dtype, tensor_parallel=design.tensor_parallel
    )
    tokens = np.asarray(request_tokens, dtype=float)
    smallest = float(tokens.min())
    fit = cost.memory_fit(d, 1, smallest)
    where = f"per GPU of {design.hardware} at TP{design.tensor_parallel}"
    if not bool(fit.fits):
        return (
            f"weights ({si(float(fit.weight_bytes), 'B')} {where}) leave no room for the KV of "
            f"even the smallest request ({smallest:,.0f} tokens) in "
            f"{si(float(fit.capacity_bytes), 'B')}"
        )
    fits = np.asarray(cost.memory_fit(d, 1, tokens).fits, dtype=bool)
    too_large = 1.0 - float(fits.mean())
    if too_large > 1.0 - attainment + 1e-12:
        room = float(fit.capacity_bytes - fit.weight_bytes)
        return (
            f"{percent(too_large)} of the requests need more KV than the "
            f"{si(room, 'B')} left {where} after the weights; the attainment target "
            f"{percent(attainment)} lets at most {percent(1 - attainment)} miss"
        )
    return ""

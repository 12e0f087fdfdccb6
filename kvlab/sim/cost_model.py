"""Which step-time model a run uses: `make_cost(config)`, the one place that reads a
SimConfig's cost knobs (model, GPU, dtypes, efficiency, remote KV's link).

A number as the efficiency gives `LedgerCost` (kvlab/sim/costs.py: the ledger's
per-operator ceiling, scaled); `efficiency="measured"` gives `KernelCost`
(kvlab/sim/kernel_cost.py: every operator timed from published kernel tables). Another
model plugs in here (see the costs module for the four questions it must answer).
Both are shared per configuration, so that sweeps reuse their tables and memos.
"""

from __future__ import annotations

import functools

from .costs import LedgerCost
from .kernel_cost import KernelCost


def make_cost(config) -> LedgerCost:
    """The step-time model of a (resolved) SimConfig."""
    remote = config.link if config.remote_kv else None
    if config.efficiency == "measured":
        return kernel_cost(
            config.model,
            config.hardware,
            config.weight_dtype,
            config.kv_dtype,
            remote,
            config.link_efficiency,
            config.max_batch,
        )
    return ledger_cost(
        config.model,
        config.hardware,
        config.weight_dtype,
        config.kv_dtype,
        config.efficiency,
        remote,
        config.link_efficiency,
        config.max_batch,
    )


@functools.lru_cache(maxsize=16)
def ledger_cost(
    model, hardware, weight_dtype, kv_dtype, efficiency, remote_link, link_efficiency, max_batch
) -> LedgerCost:
    """A shared LedgerCost per configuration: sweeps reuse its tables and prefill memo."""
    return LedgerCost(
        model, hardware, weight_dtype, kv_dtype, efficiency, remote_link, link_efficiency, max_batch
    )


@functools.lru_cache(maxsize=8)
def kernel_cost(
    model, hardware, weight_dtype, kv_dtype, remote_link, link_efficiency, max_batch
) -> KernelCost:
    """A shared KernelCost per configuration: sweeps reuse its memos (each run reads its
    counters as differences)."""
    return KernelCost(
        model, hardware, weight_dtype, kv_dtype, remote_link, link_efficiency, max_batch
    )

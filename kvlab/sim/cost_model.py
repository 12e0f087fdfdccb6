"""Which step-time model a run uses: `make_cost(config)`, from the config's deployment.

`Ceiling(efficiency)` gives `LedgerCost` (the ledger's operator table at the ceiling,
divided by the efficiency), `KernelTables()` gives `KernelCost` (every operator timed
from published kernel tables); a config's `step_overhead_s` wraps either in
`HostOverhead`. Both are shared per configuration, so sweeps reuse their tables and memos.
"""

from __future__ import annotations

import functools

from ..deployment import Deployment
from .costs import HostOverhead, LedgerCost
from .kernel_cost import KernelCost


def make_cost(config) -> LedgerCost:
    """The step-time model of a (resolved) SimConfig."""
    remote = config.link if config.remote_kv else None
    cost = _cost(config.deployment, remote, config.link_efficiency, config.max_batch)
    overhead_s = getattr(config, "step_overhead_s", 0.0)
    return HostOverhead(cost, overhead_s) if overhead_s else cost


@functools.lru_cache(maxsize=16)
def _cost(d: Deployment, remote_link, link_efficiency, max_batch) -> LedgerCost:
    """A shared cost object per configuration: sweeps reuse its tables and memos (a
    KernelCost's counters are read as differences by each run)."""
    kind = KernelCost if d.kernel_tables else LedgerCost
    return kind(d, remote_link, link_efficiency, max_batch)

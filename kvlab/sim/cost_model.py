"""Which step-time model a run uses: `make_cost(config)`, the one place that reads a
SimConfig's cost knobs (model, GPU, dtypes, speed, remote KV's link) into a `Deployment`.

`Ceiling(efficiency)` gives `LedgerCost` (kvlab/sim/costs.py: the ledger's operator table
at the ceiling, divided by the efficiency); `KernelTables()` gives `KernelCost`
(kvlab/sim/kernel_cost.py: every operator timed from published kernel tables). Another
model plugs in here (see the costs module for the four questions it must answer). Both
are shared per configuration, so that sweeps reuse their tables and memos. A config's
`step_overhead_s` wraps either in `HostOverhead` (the host's time between steps).
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

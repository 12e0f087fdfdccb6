"""Every static panel the book embeds, by key: the browser and node tests rebuild each
one here to compare what the page shows with what kvlab computes for the same settings."""

from __future__ import annotations

from typing import Callable

from . import (
    bandwidth_wall,
    beyond_hbm,
    kv_centric,
    metrics_and_diagnosis,
    past_the_ceiling,
    plan_a_deployment,
    prefix_caching,
    what_a_hit_saves,
)


def panels() -> dict[str, Callable[[], object]]:
    """{panel key: a factory returning that kvlab.viz.Panel}."""

    def pick(module, name):
        return lambda: module.panels()[name]

    return _unique(
        [
            ("hits", what_a_hit_saves.hit_panel),
            # the decode step: bytes, time, the batch and context sweeps, the roofline
            ("ledger", pick(bandwidth_wall, "ledger")),
            ("quantization", pick(bandwidth_wall, "quantization")),
            ("speculative", pick(past_the_ceiling, "speculative")),
            ("tensor-parallel", pick(past_the_ceiling, "tensor_parallel")),
            ("capacity", pick(prefix_caching, "capacity")),
            ("latency", pick(prefix_caching, "latency")),
            ("granularity", pick(prefix_caching, "granularity")),
            ("footprint", pick(beyond_hbm, "footprint")),
            ("tier-read", pick(beyond_hbm, "tier_read")),
            ("hit-miss", pick(beyond_hbm, "hit_miss")),
            ("pd", pick(beyond_hbm, "pd")),
            ("tpot-budget", pick(metrics_and_diagnosis, "budget")),
            ("sweep", kv_centric.sweep_panel),
            ("load-capacity", kv_centric.capacity_panel),
            ("timeline", kv_centric.timeline_panel),
            ("plan", plan_a_deployment.panel),
        ]
    )


def _unique(pairs) -> dict:
    """A dict that refuses a key twice: the browser test finds a panel by its page key."""
    out = {}
    for key, factory in pairs:
        if key in out:
            raise ValueError(
                f"two panels share the key {key!r}; panel keys must be unique book-wide"
            )
        out[key] = factory
    return out

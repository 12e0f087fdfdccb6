"""Every static panel the book embeds, by key: the browser and node tests rebuild each
one here to compare what the page shows with what kvlab computes for the same settings."""
from __future__ import annotations

from typing import Callable


def panels() -> dict[str, Callable[[], object]]:
    """{panel key: a factory returning that kvlab.viz.Panel}."""
    from . import bandwidth_wall, beyond_hbm, kv_centric, metrics_and_diagnosis, prefix_caching, what_a_hit_saves
    from . import past_the_ceiling

    def pick(module, name):
        return lambda: module.panels()[name]

    return {
        "hits": what_a_hit_saves.hit_panel,
        "ledger": pick(bandwidth_wall, "ledger"),
        "knee": pick(bandwidth_wall, "batch"),
        "context": pick(bandwidth_wall, "context"),
        "roofline": pick(bandwidth_wall, "roofline"),
        "quantization": pick(bandwidth_wall, "quantization"),
        "speculative": pick(past_the_ceiling, "speculative"),
        "tensor-parallel": pick(past_the_ceiling, "tensor_parallel"),
        "capacity": pick(prefix_caching, "capacity"),
        "latency": pick(prefix_caching, "latency"),
        "granularity": pick(prefix_caching, "granularity"),
        "footprint": pick(beyond_hbm, "footprint"),
        "tier-read": pick(beyond_hbm, "tier_read"),
        "hit-miss": pick(beyond_hbm, "hit_miss"),
        "pd": pick(beyond_hbm, "pd"),
        "tpot-budget": pick(metrics_and_diagnosis, "budget"),
        "sweep": kv_centric.sweep_panel,
        "capacity": kv_centric.capacity_panel,
        "timeline": kv_centric.timeline_panel,
    }

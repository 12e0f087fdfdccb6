"""Every static panel the book embeds, by key: the browser test rebuilds each one here to
compare what the page shows with what kvlab computes for the same settings."""
from __future__ import annotations

from typing import Callable

from .panel import Panel


def panels() -> dict[str, Callable[[], Panel]]:
    from . import diagnosis_panels, hits, ledger, prefix_panels, roofline, sim_panels, tier_panels

    return {
        "hits": hits.hit_panel,
        "ledger": ledger.ledger_panel,
        "knee": ledger.batch_panel,
        "context": ledger.context_panel,
        "roofline": roofline.roofline_panel,
        "quantization": roofline.quantization_panel,
        "capacity": prefix_panels.capacity_panel,
        "latency": prefix_panels.latency_panel,
        "granularity": prefix_panels.granularity_panel,
        "footprint": tier_panels.footprint_panel,
        "tier-read": tier_panels.tier_read_panel,
        "hit-miss": tier_panels.hit_miss_panel,
        "pd": tier_panels.pd_panel,
        "tpot-budget": diagnosis_panels.tpot_budget_panel,
        "sweep": sim_panels.sweep_panel,
        "timeline": sim_panels.timeline_panel,
    }

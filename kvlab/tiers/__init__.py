"""Where a request's KV lives (HBM, host memory over PCIe, a remote node) and what that costs.

Every byte and FLOP count comes from `kvlab.cost`; this package only decides *where* the
KV bytes come from and how fast that path is:

- `placement`: placements and their slowest hop, `transfer_time_s` (the one fetch
  formula), `kv_fetch_time_s`;
- `decode`: KV read from a placement every step against moved into HBM once;
- `hit`: the value of a prefix-cache hit (recompute saved - fetch) and its break-even;
- `capacity`: KV footprint against device memory, overflow, and what spilling costs;
- `link_model`: the link model (latency + size / bandwidth) against message size;
- `series`: plot-ready series over contexts, hit rates and links (no plotting library).

All functions broadcast over their numeric arguments, like the ledger.
"""

from .capacity import KVFootprint, SpillCost, kv_footprint, spill_cost
from .decode import MoveOnce, TieredStep, move_once_vs_every_step, tiered_decode_step
from .hit import HitValue, breakeven_prompt_tokens, hit_value, mean_prefill_time_s
from .placement import (
    HBM,
    LINK_LATENCY_S,
    PLACEMENT_NAMES,
    PLACEMENTS,
    Placement,
    TierPath,
    as_path,
    get_placement,
    kv_fetch_time_s,
    placements,
    transfer_time_s,
)

__all__ = [
    "HBM",
    "LINK_LATENCY_S",
    "PLACEMENT_NAMES",
    "PLACEMENTS",
    "Placement",
    "get_placement",
    "placements",
    "transfer_time_s",
    "kv_fetch_time_s",
    "TierPath",
    "as_path",
    "TieredStep",
    "tiered_decode_step",
    "MoveOnce",
    "move_once_vs_every_step",
    "HitValue",
    "hit_value",
    "mean_prefill_time_s",
    "breakeven_prompt_tokens",
    "KVFootprint",
    "kv_footprint",
    "SpillCost",
    "spill_cost",
]

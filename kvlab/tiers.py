"""Where a request's KV lives (HBM, host memory over PCIe, a remote node) and what that costs.

The one formula every fetch shares: time = latency + bytes / (tier bandwidth x efficiency).
"""
from __future__ import annotations

import numpy as np

from .cost import kv_bytes_per_token
from .dtypes import DType
from .errors import check_number
from .hardware import Tier, get_tier
from .models import ModelSpec


def kv_fetch_time_s(
    model: ModelSpec | str,
    tokens,
    tier: Tier | str,
    kv_dtype: str | DType = "fp16",
    efficiency=1.0,
    latency_s=0.0,
):
    """Seconds to bring `tokens` tokens of KV over `tier` (vectorised over tokens/efficiency)."""
    t = get_tier(tier)
    tokens = check_number("tokens", tokens, minimum=0, allow_equal_min=True, maximum=1e9)
    efficiency = check_number("efficiency", efficiency, maximum=1.0)
    latency_s = check_number("latency_s", latency_s, minimum=0, allow_equal_min=True, maximum=3600)
    moved = np.asarray(tokens, dtype=float) * kv_bytes_per_token(model, kv_dtype)
    seconds = latency_s + moved / (t.bandwidth_bytes_per_s * np.asarray(efficiency))
    return seconds.item() if np.ndim(seconds) == 0 else seconds

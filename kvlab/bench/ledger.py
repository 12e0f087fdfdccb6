"""How fast the ledger is: a whole slider grid in one vectorised call, against a plain
Python loop of per-point calls over the same points (what per-point calculators do)."""

from __future__ import annotations

import time

import numpy as np

from .. import cost
from ..deployment import Deployment


def run_ledger_grid(
    points: int = 100_000,
    loop_points: int | None = None,
    repeats: int = 7,
    model: str = "llama-3.1-8b",
    hardware: str = "h100-sxm",
) -> dict:
    """Time `cost.decode_step` over a batch x context grid of about `points` points, once
    vectorised (median of `repeats`) and once as a Python loop of scalar calls over the
    first `loop_points` of the same points (all of them by default)."""
    d = Deployment(model, hardware)
    batches = np.arange(1, 101, dtype=float)[:, None]
    contexts = np.linspace(256, 131072, max(points // 100, 1)).round()[None, :]
    n = batches.size * contexts.size
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        grid = cost.decode_step(d, batches, contexts)
        times.append(time.perf_counter() - start)
    flat = [(int(b), int(c)) for b in batches.ravel() for c in contexts.ravel()][: loop_points or n]
    start = time.perf_counter()
    for b, c in flat:
        last = cost.decode_step(d, b, c)
    loop_s = time.perf_counter() - start
    assert last.step_time_s == np.ravel(grid.step_time_s)[len(flat) - 1]  # same numbers either way
    vector_s = float(np.median(times))
    per_point_loop = loop_s / len(flat)
    return {
        "points": n,
        "vectorised_s": vector_s,
        "vectorised_min_s": float(min(times)),
        "vectorised_ns_per_point": vector_s / n * 1e9,
        "loop_points": len(flat),
        "loop_s": loop_s,
        "loop_us_per_point": per_point_loop * 1e6,
        "speedup": per_point_loop * n / vector_s,
        "model": model,
        "hardware": hardware,
    }

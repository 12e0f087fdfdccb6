"""The control recipes of kvlab.viz.controls build the same Control as spelled out."""

from __future__ import annotations

from kvlab.grids import BATCH_GRID, EFFICIENCY_GRID
from kvlab.models import models
from kvlab.viz.controls import (
    batch_control,
    efficiency_control,
    fraction_slider,
    log_slider,
    model_control,
    slider,
)
from kvlab.viz.panel import Control


def test_slider_recipes_equal_the_controls_written_out():
    assert slider("n", "N", (1, 2), 1) == Control("n", "N", (1, 2), 1, kind="slider")
    assert log_slider("b", "B", (1, 8), 1, (1, 64)) == Control(
        "b", "B", (1, 8), 1, kind="slider", live_range=(1, 64), log=True
    )
    assert fraction_slider("a", "A", (0.5, 0.7), 0.7) == Control(
        "a", "A", (0.5, 0.7), 0.7, kind="slider", live_range=(0.0, 1.0), integer=False
    )


def test_standard_controls():
    assert batch_control() == Control(
        "batch", "Batch (sequences)", BATCH_GRID, 1, kind="slider", live_range=(1, 4096), log=True
    )
    eff = efficiency_control()
    assert (eff.options, eff.live_range, eff.integer) == (EFFICIENCY_GRID, (0.3, 1.0), False)
    m = model_control("mistral-7b")
    assert m.default == "mistral-7b" and m.options == tuple(models())
    assert m.label_of("mistral-7b") == models()["mistral-7b"].display_name

"""The standard controls every chapter reuses, with the grids the static pages offer."""

from __future__ import annotations

from ..deployment import Deployment, parse_speed
from ..grids import BATCH_GRID, CONTEXT_GRID, DTYPE_CHOICES, EFFICIENCY_GRID, HIT_GRID  # noqa: F401
from ..hardware import devices
from ..models import models
from .panel import Control


def catalog_control(key: str, label: str, catalog: dict, default: str) -> Control:
    """A drop-down of a catalogue's entries ({name: entry with a display_name})."""
    names = tuple(catalog)
    return Control(
        key, label, names, default, option_labels=tuple(catalog[n].display_name for n in names)
    )


def model_control(default: str = "llama-3.1-8b") -> Control:
    return catalog_control("model", "Model", models(), default)


def hardware_control(default: str = "h100-sxm") -> Control:
    return catalog_control("hardware", "Device", devices(), default)


def batch_control(default: int = 1) -> Control:
    return log_slider("batch", "Batch (sequences)", BATCH_GRID, default, (1, 4096))


def context_control(
    default: int = 4096, label: str = "Context (tokens)", key: str = "context"
) -> Control:
    return log_slider(key, label, CONTEXT_GRID, default, (128, 262144))


def dtype_control(key: str, label: str, default: str = "fp16") -> Control:
    return Control(key, label, DTYPE_CHOICES, default)


def efficiency_control(default: float = 1.0) -> Control:
    return fraction_slider(
        "efficiency", "Achieved fraction of peak", EFFICIENCY_GRID, default, (0.3, 1.0)
    )


def hit_control(default: float = 0.95) -> Control:
    return fraction_slider(
        "hit",
        "Prefix-cache hit (share of prompt)",
        HIT_GRID,
        default,
        option_labels=tuple(f"{round(100 * h)}%" for h in HIT_GRID),
    )


def deployment(state: dict, **override) -> Deployment:
    """The deployment a panel state stands for: its model, device, dtypes and efficiency
    (each overridable; dtypes fp16 and the ceiling where the state has none)."""
    s = {**state, **override}
    return Deployment(
        s["model"],
        s["hardware"],
        s.get("weight_dtype", "fp16"),
        s.get("kv_dtype", "fp16"),
        parse_speed(s.get("efficiency", 1.0)),
    )


def slider(key: str, label: str, grid, default, live_range=None, **kwargs) -> Control:
    """A slider: the static page offers `grid`; the live widget any value in `live_range`."""
    return Control(key, label, grid, default, kind="slider", live_range=live_range, **kwargs)


def log_slider(key: str, label: str, grid, default, live_range) -> Control:
    """A slider over counts that span decades (tokens, sequences), on a log scale."""
    return slider(key, label, grid, default, live_range, log=True)


def fraction_slider(key: str, label: str, grid, default, live_range=(0.0, 1.0), **kwargs):
    """A slider over a share or a fraction (not a whole number)."""
    return slider(key, label, grid, default, live_range, integer=False, **kwargs)

"""The standard controls every chapter reuses, with the grids the static pages offer."""

from __future__ import annotations

from ..deployment import Deployment, parse_speed
from ..grids import BATCH_GRID, CONTEXT_GRID, DTYPE_CHOICES, EFFICIENCY_GRID, HIT_GRID  # noqa: F401
from ..hardware import devices
from ..models import models
from .panel import Control


def model_control(default: str = "llama-3.1-8b") -> Control:
    names = tuple(models())
    return Control(
        "model",
        "Model",
        names,
        default,
        option_labels=tuple(models()[n].display_name for n in names),
    )


def hardware_control(default: str = "h100-sxm") -> Control:
    names = tuple(devices())
    return Control(
        "hardware",
        "Device",
        names,
        default,
        option_labels=tuple(devices()[n].display_name for n in names),
    )


def batch_control(default: int = 1) -> Control:
    return Control(
        "batch",
        "Batch (sequences)",
        BATCH_GRID,
        default,
        kind="slider",
        live_range=(1, 4096),
        log=True,
    )


def context_control(
    default: int = 4096, label: str = "Context (tokens)", key: str = "context"
) -> Control:
    return Control(
        key, label, CONTEXT_GRID, default, kind="slider", live_range=(128, 262144), log=True
    )


def dtype_control(key: str, label: str, default: str = "fp16") -> Control:
    return Control(key, label, DTYPE_CHOICES, default)


def efficiency_control(default: float = 1.0) -> Control:
    return Control(
        "efficiency",
        "Achieved fraction of peak",
        EFFICIENCY_GRID,
        default,
        kind="slider",
        live_range=(0.3, 1.0),
        integer=False,
    )


def hit_control(default: float = 0.95) -> Control:
    return Control(
        "hit",
        "Prefix-cache hit (share of prompt)",
        HIT_GRID,
        default,
        kind="slider",
        option_labels=tuple(f"{round(100 * h)}%" for h in HIT_GRID),
        live_range=(0.0, 1.0),
        integer=False,
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

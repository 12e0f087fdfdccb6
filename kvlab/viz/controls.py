"""The standard controls every chapter reuses, with the grids the static pages offer."""

from __future__ import annotations

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


def ledger_state(state: dict, **override) -> dict:
    """The `kvlab.cost.decode_step` keyword arguments a panel state stands for."""
    keys = ("batch", "context", "weight_dtype", "kv_dtype", "efficiency")
    out = {k: state[k] for k in keys if k in state}
    out.update(override)
    return out

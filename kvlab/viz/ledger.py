"""Chapter 2's bandwidth ledger: the decode-step panel (kvlab.viz.decode_step: one control
bar for the step, its batch and context sweeps and its roofline point), and the ledger's
bytes and time bars the live dashboard draws."""

from __future__ import annotations

from .. import cost
from ..hardware import devices
from ..models import models
from . import style
from .controls import (
    ledger_state,
)
from .decode_step import BYTES_Y, decode_step_panel
from .panel import Panel
from .terms import ledger_terms


def _terms() -> dict:
    return ledger_terms(models(), devices())


def _step(state: dict, **override):
    return cost.decode_step(state["model"], state["hardware"], **ledger_state(state, **override))


# ------------------------------------------------------------------ the ledger
def ledger_panel() -> Panel:
    """The ledger of one decode step: since chapter 2's one control bar drives every figure of
    the ledger, this is kvlab.viz.decode_step's panel (key "ledger")."""
    return decode_step_panel()


TIME_KINDS = ("memory", "compute")  # the time bars, in the order of TIME_COLORS
TIME_COLORS = (style.BLUE, style.GREY)


def _ledger_sources(weights, kv_read, kv_write, memory_s, compute_s) -> dict:
    """The ledger's bytes and time bars (the live dashboard draws them)."""
    from ..fmt import seconds

    return {
        "bytes": {
            "y": list(BYTES_Y),
            "weights": [weights],
            "kv_read": [kv_read],
            "kv_write": [kv_write],
        },
        "time": {
            "kind": list(TIME_KINDS),
            "seconds": [memory_s, compute_s],
            "color": list(TIME_COLORS),
            "label": [seconds(memory_s), seconds(compute_s)],
        },
    }

"""Chapter 5 figures: the TPOT budget against batch (pitfall 1) and diagnosis reports."""
from __future__ import annotations

import html

import numpy as np

from .. import cost
from ..diagnose import Diagnosis
from ..hardware import devices
from ..models import models
from . import style
from .controls import BATCH_GRID, context_control, hardware_control, model_control
from .panel import Control, Panel
from .terms import ledger_terms

SLO_GRID = (0.02, 0.03, 0.05, 0.1, 0.2)
DTYPES_USED = {"weight_dtype": "fp16", "kv_dtype": "fp16"}  # the panel has no dtype controls
SLO_READOUT = (
    ("slo_batch", "Largest batch within the TPOT budget", "count"),
    ("slo_tokens_per_s", "Tokens/s at that batch", "rate"),
    ("knee_batch", "Knee (KV reads reach the weights)", "count"),
    ("max_batch", "Largest batch that fits in memory", "count"),
)


def tpot_budget_panel() -> Panel:
    """TPOT against batch with a TPOT budget: raise the batch while watching TPOT."""
    grid = np.array(BATCH_GRID, dtype=float)

    def compute(state):
        s = cost.decode_step(state["model"], state["hardware"], grid, state["context"],
                             **DTYPES_USED)
        within = np.flatnonzero((s.step_time_s <= state["slo"]) & s.fits)
        k = within[-1] if within.size else 0
        knee = cost.batch_knee(s)
        return {"sources": {
            "curve": {"batch": grid.tolist(), "tpot_s": s.step_time_s.tolist(), "tokens_per_s": s.tokens_per_s.tolist()},
            "slo": {"batch": [grid[0], grid[-1]], "tpot_s": [state["slo"], state["slo"]]},
            "pick": {"batch": [grid[k]], "tpot_s": [s.step_time_s[k]]}},
            "values": {"slo_batch": float(grid[k]) if within.size else 0.0,
                       "slo_tokens_per_s": float(s.tokens_per_s[k]) if within.size else 0.0,
                       "knee_batch": float(grid[knee]), "max_batch": float(np.ravel(s.max_batch)[0])}}

    def figures(src):
        fig = style.new_figure("Raise the batch while watching TPOT", "batch (sequences)", "TPOT",
                               x_axis_type="log", y_axis_type="log", height=320)
        fig.line("batch", "tpot_s", source=src["curve"], color=style.GREEN, width=2.5, legend_label="TPOT")
        fig.line("batch", "tpot_s", source=src["slo"], color=style.VERMILION, width=2, line_dash="dashed",
                 legend_label="TPOT budget")
        fig.scatter("batch", "tpot_s", source=src["pick"], size=11, color=style.BLUE, legend_label="largest batch within it")
        fig.xaxis.formatter = style.count_ticks()
        fig.yaxis.formatter = style.seconds_ticks()
        fig.legend.location = "top_left"
        return fig

    slo = Control("slo", "TPOT budget", SLO_GRID, 0.05, kind="slider", integer=False, live_range=(0.005, 0.5),
                  option_labels=tuple(f"{round(v * 1000)} ms" for v in SLO_GRID))
    controls = (model_control(), hardware_control(), context_control(8192), slo)
    terms = {**ledger_terms(models(), devices()), "batches": list(BATCH_GRID),
             "dtypes_used": DTYPES_USED}
    return Panel("tpot-budget", controls, compute, figures, "tpot-budget", terms, SLO_READOUT)


class DiagnosisReport:
    """A diagnosis as HTML for the book."""

    def __init__(self, title: str, diagnosis: Diagnosis):
        self.title, self.diagnosis = title, diagnosis

    def _repr_html_(self) -> str:
        d = self.diagnosis
        items = []
        for f in d.findings:
            advice = "".join(f"<li>{html.escape(a)}</li>" for a in f.advice)
            items.append(f"<li><b>{html.escape(f.check)}</b>: {html.escape(f.verdict)}"
                         + (f"<ul>{advice}</ul>" if advice else "") + "</li>")
        return (f'<div class="kvlab-diagnosis"><p><b>{html.escape(self.title)}</b> — diagnosis: '
                f"<b>{html.escape(d.bound)}-bound</b></p><ol>{''.join(items)}</ol></div>")

    def __repr__(self) -> str:
        return f"{self.title}\n{self.diagnosis.report()}"

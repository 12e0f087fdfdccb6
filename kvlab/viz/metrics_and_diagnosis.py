"""Chapter 5 figures: the TPOT budget and the memory limit against batch (pitfall 1), and
diagnosis reports."""

from __future__ import annotations

import html
import math

import numpy as np

from .. import cost
from ..deployment import Deployment
from ..diagnose import Diagnosis
from ..hardware import devices
from ..models import models
from . import i18n, style
from .controls import (
    BATCH_GRID,
    context_control,
    hardware_control,
    model_control,
    slider,
)
from .panel import Panel
from .terms import ledger_terms

SLO_GRID = (0.02, 0.03, 0.05, 0.1, 0.2)
DTYPES_USED = {"weight_dtype": "fp16", "kv_dtype": "fp16"}  # the panel has no dtype controls
SLO_READOUT = (
    ("tpot_batch", "Largest batch within the TPOT budget (memory aside)", "count"),
    ("max_batch", "Largest batch that fits in memory", "count"),
    ("allowed_batch", "Largest batch both allow", "count"),
    ("limited_by", "What limits the batch", "text"),
    ("allowed_tpot_s", "TPOT at that batch", "seconds"),
    ("allowed_tokens_per_s", "Tokens/s at that batch", "rate"),
    ("knee_batch", "Knee (KV reads reach the weights)", "count"),
)
#: Kept while chapter 5's prose quotes them: the batch both limits allow, and its tokens/s.
SLO_GLUE = (("slo_batch", "count"), ("slo_tokens_per_s", "rate"))
LIMIT_LABELS = (
    "largest batch within the TPOT budget",
    "memory limit: largest batch that fits",
    "the batch both allow",
)


def tpot_batch(d: Deployment, context, slo_s) -> int:
    """The largest batch whose TPOT stays within `slo_s`, memory aside (0 if not even one
    sequence does): the ledger's step time grows with the batch, so a bisection finds it."""

    def within(b):
        return cost.decode_step(d, b, context).step_time_s <= slo_s

    if not within(1):
        return 0
    lo, hi = 1, cost.MAX_BATCH
    if within(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if within(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _mark(batch: int, **columns) -> dict:
    """One figure mark at `batch` (a callable column is evaluated there), or none at all
    (no glyph, no legend entry) when the batch is 0: nothing can run."""
    row = {k: (v(batch) if callable(v) else v) for k, v in columns.items()} if batch >= 1 else None
    rows = {k: [v] if row else [] for k, v in (row or columns).items()}
    return {"batch": [batch] if row else [], **rows}


def _limit(tpot: int, memory: int) -> str:
    return "device memory" if memory < tpot else ("TPOT budget" if tpot < memory else "both")


def _tpot_budget_compute(state):
    ctx, slo = state["context"], state["slo"]
    d = Deployment(state["model"], state["hardware"], **DTYPES_USED)
    budget = tpot_batch(d, ctx, slo)
    grid = cost.decode_step(d, np.array(BATCH_GRID), ctx)
    memory = int(np.ravel(grid.max_batch)[0])
    allowed = min(budget, memory)
    marks = [budget, memory, allowed]
    batches = sorted(set(BATCH_GRID) | {b for b in marks if b >= 1})
    steps = [cost.decode_step(d, b, ctx) for b in batches]
    tpot = [s.step_time_s for s in steps]
    at = dict(zip(batches, steps, strict=True))
    chosen = at.get(allowed)
    tps = chosen.tokens_per_s if chosen else 0.0

    def time(b):
        return at[b].step_time_s

    sources = {
        "curve": {
            "batch": batches,
            "tpot_s": tpot,
            "tokens_per_s": [s.tokens_per_s for s in steps],
        },
        "slo": {"batch": [batches[0], batches[-1]], "tpot_s": [slo, slo]},
        "budget": _mark(budget, tpot_s=time, budget_label=LIMIT_LABELS[0]),
        "memory": _mark(
            memory, low=min(tpot), high=max(max(tpot), slo), memory_label=LIMIT_LABELS[1]
        ),
        "allowed": _mark(allowed, tpot_s=time, allowed_label=LIMIT_LABELS[2]),
    }
    return {
        "sources": sources,
        "values": {
            "tpot_batch": budget,
            "max_batch": memory,
            "allowed_batch": allowed,
            "limited_by": _limit(budget, memory),
            "allowed_tpot_s": chosen.step_time_s if chosen else math.nan,
            "allowed_tokens_per_s": tps,
            "knee_batch": float(BATCH_GRID[cost.batch_knee(grid)]),
            "slo_batch": allowed,
            "slo_tokens_per_s": tps,
        },
    }


def _tpot_budget_figures(src):
    fig = style.chart(
        "TPOT budget and memory: two limits on the batch",
        "batch (sequences)",
        "TPOT",
        "xy",
        height=340,
    )
    style.line(fig, "batch", "tpot_s", src["curve"], style.GREEN, legend="TPOT")
    slo = src["slo"]
    style.line(fig, "batch", "tpot_s", slo, style.VERMILION, 2, dash="dashed", legend="TPOT budget")
    # each mark is absent (no glyph, no legend entry) when its batch is 0
    fig.segment(
        "batch",
        "low",
        "batch",
        "high",
        source=src["memory"],
        color=style.GREY,
        width=2.5,
        line_dash="dotted",
        legend_field="memory_label",
    )
    style.dot(fig, "batch", "tpot_s", src["budget"], size=10, legend_field="budget_label")
    allowed = src["allowed"]
    style.ring(fig, "batch", "tpot_s", allowed, 15, style.BLUE, 3, legend_field="allowed_label")
    return style.finish(fig, x="count", y="seconds", legend="top_left", legend_px="10px")


def tpot_budget_panel() -> Panel:
    """TPOT against batch with a TPOT budget and the memory limit, kept apart: the budget
    allows one batch, memory another, and the smaller one is what the deployment gets."""

    slo = slider(
        "slo",
        "TPOT budget",
        SLO_GRID,
        0.05,
        (0.005, 0.5),
        integer=False,
        option_labels=tuple(f"{round(v * 1000)} ms" for v in SLO_GRID),
    )
    controls = (model_control(), hardware_control(), context_control(8192), slo)
    terms = {
        **ledger_terms(models(), devices()),
        "batches": list(BATCH_GRID),
        "dtypes_used": DTYPES_USED,
        "max_batch": cost.MAX_BATCH,
        "labels": list(LIMIT_LABELS),
    }
    return Panel(
        "tpot-budget",
        controls,
        _tpot_budget_compute,
        _tpot_budget_figures,
        "tpot-budget",
        terms,
        SLO_READOUT,
        glue=SLO_GLUE,
    )


def _colon() -> str:
    return "：" if i18n.chinese() else ": "


def _shown(d: Diagnosis) -> list:
    """The findings a report lists: the memory fit (step 0) first when it fails."""
    return d.findings if d.fits else [d.fit, *d.findings]


def report_text(d: Diagnosis) -> str:
    """`Diagnosis.report()` in the edition's language: the domain writes its bound, checks,
    verdicts and advice in English, and each passes through the label table here (the
    Chinese keeps the English's numbers, as formatted); in English it is the same text."""
    colon = _colon()
    lines = [f"{i18n.t('Diagnosis')}{colon}{i18n.t(f'{d.bound}-bound')}", ""]
    for f in _shown(d):
        lines.append(f"{f.step}. {i18n.t(f.check)}{colon}{i18n.t(f.verdict)}")
        lines += [f"   - {i18n.t(a)}" for a in f.advice]
    return "\n".join(lines)


class DiagnosisReport:
    """A diagnosis as HTML for the book, in the edition's language (see `report_text`)."""

    def __init__(self, title: str, diagnosis: Diagnosis):
        self.title, self.diagnosis = title, diagnosis

    def _repr_html_(self) -> str:
        d, colon = self.diagnosis, _colon()
        items = []
        for f in _shown(d):
            advice = "".join(f"<li>{html.escape(i18n.t(a))}</li>" for a in f.advice)
            items.append(
                f"<li><b>{html.escape(i18n.t(f.check))}</b>{colon}"
                f"{html.escape(i18n.t(f.verdict))}"
                + (f"<ul>{advice}</ul>" if advice else "")
                + "</li>"
            )
        start = "" if d.fits else ' start="0"'  # the list is numbered as the steps are
        title, bound = i18n.t(self.title), i18n.t(f"{d.bound}-bound")
        return (
            f'<div class="kvlab-diagnosis"><p><b>{html.escape(title)}</b> — '
            f"{i18n.t('diagnosis')}{colon}<b>{html.escape(bound)}</b></p>"
            f"<ol{start}>{''.join(items)}</ol></div>"
        )

    def __repr__(self) -> str:
        return f"{i18n.t(self.title)}\n{report_text(self.diagnosis)}"

"""Panels of "Past the per-user ceiling": speculative decoding and tensor parallelism.

Both rest on the ledger's per-operator arithmetic (`kvlab.operators`: a verify pass runs
batch x (K + 1) rows through every GEMM; tensor parallelism lays out per-GPU shapes, adds
two all-reduces per layer and times them from the measured tables), which is too involved
for a JavaScript twin. So kvlab computes at build time every step time the panels need on
their grids (the `terms`: one JSON string per panel, rounded to LOOKUP_DIGITS as lookup
tables are), and the twins in
js/past_the_ceiling.js only combine them: tokens per verify pass from the acceptance, tokens/s,
speedups and shares from the times, memory fit from per-GPU bytes. `compute` does the same
arithmetic on the same terms for grid states and asks the ledger for any other value (the
live face).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .. import cost, fmt
from ..deployment import Deployment, KernelTables
from ..grids import BATCH_GRID
from ..hardware import get_device
from ..jsonsafe import jsonable
from ..models import get_model
from ..speculative import breakeven_batch, speculative_step, tokens_per_verify_step
from . import style
from .controls import batch_control, fraction_slider, log_slider, slider
from .panel import LOOKUP_DIGITS, Control, Panel

NOT_MEASURED = "n/a (outside the tables)"
#: The bars of the tensor-parallel panel: each degree as the ceiling and the measured kernels
#: time it, labelled "TP 8, ceiling". The JavaScript twin takes these words from the terms,
#: and the Chinese page's table (kvlab.viz.i18n) translates them as Python does.
TP_KINDS = ("ceiling", "measured")


def _rounded(values) -> list:
    """Floats as the page stores them (None where not finite)."""
    return jsonable(np.asarray(values, dtype=float), LOOKUP_DIGITS)


def _finite(x) -> bool:
    return x is not None and math.isfinite(x)


def _page_terms(key: str, data: dict) -> dict:
    """The terms as the page holds them: one JSON string, parsed once per page into
    KVLAB.tables[key] (as lookup panels' tables are; a nested dict of arrays would cost
    bokeh's verbose map encoding)."""
    return {"key": key, "data": json.dumps(data, separators=(",", ":"), allow_nan=False)}


# ======================================================== speculative decoding
@dataclass(frozen=True)
class SpecSetup:
    """A target model on its GPUs with what drafts for it (None: a self-drafting head)."""

    label: str
    model: str
    hardware: str
    tensor_parallel: int
    draft_model: str | None
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"

    @property
    def deployment(self) -> Deployment:
        """The target's deployment (the draft runs on the same GPUs, dtypes and degree)."""
        return Deployment(
            self.model,
            self.hardware,
            self.weight_dtype,
            self.kv_dtype,
            tensor_parallel=self.tensor_parallel,
        )


SPEC_SETUPS = {
    "8b-h100-head": SpecSetup(
        "Llama 3.1 8B, one H100, draft head", "llama-3.1-8b", "h100-sxm", 1, None
    ),
    "70b-8xh100-8b": SpecSetup(
        "Llama 3.1 70B, 8 H100s (TP8), Llama 3.1 8B drafts",
        "llama-3.1-70b",
        "h100-sxm",
        8,
        "llama-3.1-8b",
    ),
    "70b-8xh100-head": SpecSetup(
        "Llama 3.1 70B, 8 H100s (TP8), draft head", "llama-3.1-70b", "h100-sxm", 8, None
    ),
    "v3-8xh200-mtp": SpecSetup(
        "DeepSeek-V3 (fp8), 8 H200s (TP8), MTP head",
        "deepseek-v3",
        "h200",
        8,
        None,
        weight_dtype="fp8",
    ),
}
SPEC_CONTEXTS = (256, 1024, 4096, 32768)
SPEC_TOKENS = (1, 2, 3, 4, 6, 8)
SPEC_ACCEPTANCES = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)

SPEC_READOUT = (
    ("tokens_per_verify_step", "Tokens per verify pass (expected)", "rate"),
    ("verify_over_decode", "One verify pass costs (decode steps)", "ratio"),
    ("draft_share", "Share of a round spent drafting", "percent"),
    ("plain_each", "Tokens/s each sequence, plain", "rate"),
    ("spec_each", "Tokens/s each sequence, speculative", "rate"),
    ("plain_all", "Tokens/s whole batch, plain", "rate"),
    ("spec_all", "Tokens/s whole batch, speculative", "rate"),
    ("speedup", "Speculative over plain", "ratio"),
    ("breakeven_batch", "Stops paying from batch", "count_or_never"),
    ("max_batch", "Largest batch that fits", "count"),
)


def spec_times(setup: str, context, speculative_tokens) -> dict:
    """Step times over BATCH_GRID (s): plain decode, one drafted token, one verify pass."""
    s = SPEC_SETUPS[setup]
    step = speculative_step(
        s.deployment, np.array(BATCH_GRID), context, speculative_tokens, 0.5, s.draft_model
    )
    return {
        "base": np.asarray(step.baseline_step_time_s, dtype=float),
        "draft": np.asarray(step.draft_step_time_s, dtype=float),
        "verify": np.asarray(step.verify_step_time_s, dtype=float),
        "max_batch": int(np.ravel(step.max_batch)[0]),
    }


def spec_breakeven(setup: str, context, speculative_tokens, acceptance, fit: int) -> int | None:
    """The batch from which speculation stops paying, up to the largest batch that fits."""
    if fit < 1:
        return None
    s = SPEC_SETUPS[setup]
    return breakeven_batch(
        s.deployment,
        context,
        speculative_tokens,
        acceptance,
        s.draft_model,
        max_batch=min(fit, cost.MAX_BATCH),
    )


@lru_cache(maxsize=1)
def spec_terms() -> dict:
    """Every grid time and break-even batch the page combines (rounded as it stores them)."""
    times, breakeven, fits = {}, {}, {}
    for key in SPEC_SETUPS:
        times[key], breakeven[key], fits[key] = {}, {}, {}
        for ctx in SPEC_CONTEXTS:
            runs = {k: spec_times(key, ctx, k) for k in SPEC_TOKENS}
            first = runs[SPEC_TOKENS[0]]
            fits[key][str(ctx)] = first["max_batch"]
            times[key][str(ctx)] = {
                "base": _rounded(first["base"]),
                "draft": _rounded(first["draft"]),
                "verify": {str(k): _rounded(r["verify"]) for k, r in runs.items()},
            }
            breakeven[key][str(ctx)] = {
                str(k): [
                    spec_breakeven(key, ctx, k, a, first["max_batch"]) for a in SPEC_ACCEPTANCES
                ]
                for k in SPEC_TOKENS
            }
    return {
        "batches": list(BATCH_GRID),
        "acceptances": list(SPEC_ACCEPTANCES),
        "times": times,
        "breakeven": breakeven,
        "max_batch": fits,
    }


def _spec_inputs(state: dict) -> tuple:
    """(batches, base, draft, verify, breakeven, max batch) for a state: the page's terms on
    the grid, the ledger elsewhere."""
    setup, ctx, k, a = (state[x] for x in ("setup", "context", "speculative_tokens", "acceptance"))
    on_grid = ctx in SPEC_CONTEXTS and k in SPEC_TOKENS and a in SPEC_ACCEPTANCES
    batches = list(BATCH_GRID)
    if state["batch"] not in batches:
        batches = sorted({*batches, int(state["batch"])})
        on_grid = False
    if on_grid:
        t = spec_terms()
        run = t["times"][setup][str(ctx)]
        fit = t["max_batch"][setup][str(ctx)]
        return (
            batches,
            run["base"],
            run["draft"],
            run["verify"][str(k)],
            t["breakeven"][setup][str(ctx)][str(k)][SPEC_ACCEPTANCES.index(a)],
            fit,
        )
    s = SPEC_SETUPS[setup]
    step = speculative_step(s.deployment, np.array(batches), ctx, k, a, s.draft_model)
    fit = int(np.ravel(step.max_batch)[0])
    return (
        batches,
        np.asarray(step.baseline_step_time_s, float).tolist(),
        np.asarray(step.draft_step_time_s, float).tolist(),
        np.asarray(step.verify_step_time_s, float).tolist(),
        spec_breakeven(setup, ctx, k, a, fit),
        fit,
    )


def spec_compute(state: dict) -> dict:
    """Plain and speculative tokens/s over the batch grid; KVLAB.panels.speculative is the twin
    (same operations, same order)."""
    batches, base, draft, verify, breakeven, fit = _spec_inputs(state)
    k = state["speculative_tokens"]
    tau = tokens_per_verify_step(state["acceptance"], k)
    cycle = [v + k * d for v, d in zip(verify, draft, strict=True)]
    plain_each = [1.0 / t for t in base]
    spec_each = [tau / c for c in cycle]
    plain_all = [b / t for b, t in zip(batches, base, strict=True)]
    spec_all = [b * tau / c for b, c in zip(batches, cycle, strict=True)]
    i = batches.index(state["batch"])
    return {
        "sources": {
            "curve": {
                "batch": batches,
                "plain_each": plain_each,
                "spec_each": spec_each,
                "plain_all": plain_all,
                "spec_all": spec_all,
                "speedup": [tau * t / c for t, c in zip(base, cycle, strict=True)],
            },
            "here": {"batch": [batches[i]], "spec_each": [spec_each[i]], "spec_all": [spec_all[i]]},
        },
        "values": {
            "tokens_per_verify_step": tau,
            "verify_over_decode": verify[i] / base[i],
            "draft_share": k * draft[i] / cycle[i],
            "plain_each": plain_each[i],
            "spec_each": spec_each[i],
            "plain_all": plain_all[i],
            "spec_all": spec_all[i],
            "speedup": tau * base[i] / cycle[i],
            "breakeven_batch": breakeven,
            "max_batch": fit,
        },
    }


def spec_figures(src):
    from bokeh.layouts import column

    def pair(title, y_label, plain, spec, height):
        fig = style.chart(title, "batch (sequences)", y_label, "xy", height=height)
        curve = src["curve"]
        a = style.line(fig, "batch", plain, curve, legend="plain decode")
        b = style.line(fig, "batch", spec, curve, style.ORANGE, dash="dashed", legend="speculative")
        fig.scatter("batch", spec, source=src["here"], size=10, color=style.VERMILION)
        tips = [
            ("batch", "@batch{0,0}"),
            ("plain", f"@{plain}{{0,0.0}}"),
            ("speculative", f"@{spec}{{0,0.0}}"),
            ("speedup", "@speedup{0.00}x"),
        ]
        return style.finish(fig, x="count", y="count", tips=tips, on=[a, b], mode="vline")

    each = pair(
        "Each user's speed: plain against speculative",
        "tokens/s, each sequence",
        "plain_each",
        "spec_each",
        300,
    )
    each.legend.location = "bottom_left"
    whole = pair(
        "The whole batch: where the dashed line drops below, speculation costs throughput",
        "tokens/s, whole batch",
        "plain_all",
        "spec_all",
        260,
    )
    whole.x_range = each.x_range
    whole.legend.location = "top_left"
    return column(each, whole)


def speculative_panel() -> Panel:
    """Per-user and aggregate tokens/s with and without speculation, against the batch."""
    acceptance_labels = tuple(f"{round(100 * a)}%" for a in SPEC_ACCEPTANCES)
    controls = (
        Control(
            "setup",
            "Model, GPUs and drafter",
            tuple(SPEC_SETUPS),
            "8b-h100-head",
            option_labels=tuple(s.label for s in SPEC_SETUPS.values()),
        ),
        log_slider("context", "Context (tokens)", SPEC_CONTEXTS, 4096, (128, 131072)),
        slider(
            "speculative_tokens",
            "Drafted tokens per round (K)",
            SPEC_TOKENS,
            4,
            (1, cost.MAX_SPECULATIVE_TOKENS),
        ),
        fraction_slider(
            "acceptance",
            "Acceptance per drafted token",
            SPEC_ACCEPTANCES,
            0.7,
            option_labels=acceptance_labels,
        ),
        batch_control(1),
    )
    return Panel(
        "speculative",
        controls,
        spec_compute,
        spec_figures,
        "speculative",
        _page_terms("speculative", spec_terms()),
        SPEC_READOUT,
    )


# ======================================================== tensor parallelism
TP_MODELS = {"llama-3.1-70b": "bf16", "deepseek-v3": "fp8"}  # their weights' dtype
TP_DEVICES = ("h100-sxm", "h200", "b200", "a100-80gb", "l40s")  # all with all-reduce tables
TP_DEGREES = (1, 2, 4, 8)
TP_CONTEXT = 4096  # tokens per sequence, fixed: the panel is about weights and all-reduces
TP_BATCHES = tuple(2**i for i in range(11))  # 1 to 1,024: doubling keeps the page light
TP_KV_DTYPE = "bf16"
TP_COLORS = (style.GREY, style.BLUE, style.ORANGE, style.GREEN)

TP_READOUT = (
    ("weight_bytes", "Weights on each GPU", "bytes"),
    ("fits", "Fits in each GPU's memory", "yesno"),
    ("max_batch", "Largest batch that fits (4K tokens)", "count"),
    ("step_time_s", "Time per step (TPOT), ceiling", "seconds"),
    ("allreduce_time_s", "of which all-reduces", "seconds"),
    ("allreduce_share", "All-reduce share of the step", "text"),
    ("tokens_per_s_per_sequence", "Tokens/s each sequence, ceiling", "rate"),
    ("tokens_per_s", "Tokens/s whole batch, ceiling", "rate"),
    ("speedup", "Faster than one GPU by", "ratio"),
    ("share_of_ideal", "Share of the ideal N× speedup", "percent"),
    ("measured_step_time_s", "Time per step, measured kernels", "seconds"),
    ("measured_allreduce_share", "All-reduce share, measured", "text"),
)


def tp_run(model: str, hardware: str, tp: int, batches=TP_BATCHES) -> dict:
    """One model on `tp` GPUs over the batches: ceiling and measured step and all-reduce
    times (None where the tables have no data), and what memory fit needs (per GPU)."""
    d = Deployment(model, hardware, TP_MODELS[model], TP_KV_DTYPE, tensor_parallel=tp)
    b = np.array(batches)
    ceiling = cost.decode_step(d, b, TP_CONTEXT)
    nan = np.full(b.shape, np.nan)
    try:
        measured = cost.decode_step(d.replace(speed=KernelTables()), b, TP_CONTEXT)
        m_step, m_reduce = measured.step_time_s, measured.allreduce_time_s
    except ValueError:  # KvlabError: no tables for this model's layers (MLA)
        m_step, m_reduce = nan, nan

    def full(x):  # one GPU: a scalar 0 s of all-reduces
        return np.broadcast_to(np.asarray(x, dtype=float), b.shape)

    return {
        "ceiling_s": full(ceiling.step_time_s),
        "allreduce_s": full(ceiling.allreduce_time_s),
        "measured_s": full(m_step),
        "measured_allreduce_s": full(m_reduce),
        "weight_bytes": float(ceiling.weight_bytes),
        "kv_bytes_per_token": float(ceiling.kv_bytes_per_token),
        "capacity_bytes": float(ceiling.capacity_bytes),
    }


TIMES = ("ceiling_s", "allreduce_s", "measured_s", "measured_allreduce_s")  # arrays over batch
SIZES = ("weight_bytes", "kv_bytes_per_token", "capacity_bytes")  # per GPU


@lru_cache(maxsize=1)
def tp_terms() -> dict:
    runs = {}
    for model in TP_MODELS:
        runs[model] = {}
        for hw in TP_DEVICES:
            runs[model][hw] = {}
            for tp in TP_DEGREES:
                r = tp_run(model, hw, tp)
                runs[model][hw][str(tp)] = {
                    **{k: _rounded(r[k]) for k in TIMES},
                    **{k: r[k] for k in SIZES},
                }
    return {
        "batches": list(TP_BATCHES),
        "degrees": list(TP_DEGREES),
        "context": TP_CONTEXT,
        "runs": runs,
        "kinds": list(TP_KINDS),
        "not_measured": NOT_MEASURED,
    }


def _tp_runs(state: dict) -> tuple[list, dict]:
    """(batches, {degree: run}) from the page's terms, or the ledger for an off-grid batch."""
    batches = list(TP_BATCHES)
    if state["batch"] in batches:
        runs = tp_terms()["runs"][state["model"]][state["hardware"]]
        return batches, {tp: runs[str(tp)] for tp in TP_DEGREES}
    batches = sorted({*batches, int(state["batch"])})
    runs = {}
    for tp in TP_DEGREES:
        r = tp_run(state["model"], state["hardware"], tp, batches)
        runs[tp] = {**r, **{k: np.asarray(r[k], float).tolist() for k in TIMES}}
    return batches, runs


def _share_text(part, whole) -> str:
    return fmt.percent(part / whole) if _finite(part) and _finite(whole) else NOT_MEASURED


def _nan(x) -> float:
    return x if _finite(x) else math.nan


def tp_compute(state: dict) -> dict:
    """Step time and tokens/s against the tensor-parallel degree and batch; the twin is
    KVLAB.panels["tensor-parallel"] (same operations, same order)."""
    batches, runs = _tp_runs(state)
    i, n, b = batches.index(state["batch"]), state["tensor_parallel"], state["batch"]
    r, one = runs[n], runs[1]
    w, kv, cap = r["weight_bytes"], r["kv_bytes_per_token"], r["capacity_bytes"]
    bars = {"y": [], "work_s": [], "allreduce_s": []}
    for tp in TP_DEGREES:
        for kind, step, reduce in zip(
            TP_KINDS,
            ("ceiling_s", "measured_s"),
            ("allreduce_s", "measured_allreduce_s"),
            strict=True,
        ):
            t, ar = runs[tp][step][i], runs[tp][reduce][i]
            bars["y"].append(f"TP {tp}, {kind}")
            bars["work_s"].append(t - ar if _finite(t) and _finite(ar) else math.nan)
            bars["allreduce_s"].append(_nan(ar) if _finite(t) else math.nan)
    curve = {"batch": batches}
    fit_batch, fit_tps = [], []
    for tp in TP_DEGREES:
        run = runs[tp]
        curve[f"tp{tp}"] = [1.0 / t for t in run["ceiling_s"]]
        curve[f"m{tp}"] = [1.0 / t if _finite(t) else math.nan for t in run["measured_s"]]
        for x, t in zip(batches, run["ceiling_s"], strict=True):
            kv_x = x * TP_CONTEXT * run["kv_bytes_per_token"]
            fit_batch.append(x)
            fit_tps.append(
                1.0 / t if run["weight_bytes"] + kv_x <= run["capacity_bytes"] else math.nan
            )
    step, reduce, measured = r["ceiling_s"][i], r["allreduce_s"][i], r["measured_s"][i]
    speedup = one["ceiling_s"][i] / step
    return {
        "sources": {
            "bars": bars,
            "curve": curve,
            "fits": {"batch": fit_batch, "tokens_per_s": fit_tps},
            "here": {"batch": [b], "tokens_per_s": [1.0 / step]},
        },
        "values": {
            "weight_bytes": w,
            "fits": w + b * TP_CONTEXT * kv <= cap,
            "max_batch": math.floor(max(cap - w, 0.0) / (TP_CONTEXT * kv)),
            "step_time_s": step,
            "allreduce_time_s": reduce,
            "allreduce_share": _share_text(reduce, step),
            "tokens_per_s_per_sequence": 1.0 / step,
            "tokens_per_s": b / step,
            "speedup": speedup,
            "share_of_ideal": speedup / n,
            "measured_step_time_s": measured if _finite(measured) else None,
            "measured_allreduce_share": _share_text(r["measured_allreduce_s"][i], measured),
        },
    }


def tp_figures(src):
    from bokeh.layouts import column

    factors = [f"TP {tp}, {kind}" for tp in TP_DEGREES for kind in TP_KINDS]
    bars = style.stacked_bars(
        "One step at the chosen batch: work on each GPU and all-reduces",
        "seconds",
        factors[::-1],
        "y",
        {
            "work_s": (style.BLUE, "weights and KV on each GPU"),
            "allreduce_s": (style.VERMILION, "all-reduces"),
        },
        src["bars"],
        x="seconds",
        bar_height=0.7,
        height=250,
    )
    speed = style.chart(
        "Each user's speed against batch (solid: ceiling, dashed: measured "
        "kernels; dots: the batch fits)",
        "batch (sequences)",
        "tokens/s, each sequence",
        "xy",
        height=320,
    )
    lines = []
    for tp, color in zip(TP_DEGREES, TP_COLORS, strict=True):
        curve, label = src["curve"], f"TP {tp}"
        lines.append(style.line(speed, "batch", f"tp{tp}", curve, color, legend=label))
        style.line(speed, "batch", f"m{tp}", curve, color, 2, dash="dashed", legend=label)
    speed.scatter("batch", "tokens_per_s", source=src["fits"], size=5, color=style.GREY)
    speed.scatter("batch", "tokens_per_s", source=src["here"], size=11, color=style.VERMILION)
    tips = [("batch", "@batch{0,0}")] + [(f"TP {tp}", f"@tp{tp}{{0,0.0}}") for tp in TP_DEGREES]
    style.finish(
        speed, x="count", y="count", legend="bottom_left", tips=tips, on=lines[:1], mode="vline"
    )
    return column(bars, speed)


def tensor_parallel_panel() -> Panel:
    """Step time and per-user tokens/s against the tensor-parallel degree and the batch."""
    controls = (
        Control(
            "model",
            "Model (weights)",
            tuple(TP_MODELS),
            "llama-3.1-70b",
            option_labels=tuple(f"{get_model(m).display_name} ({d})" for m, d in TP_MODELS.items()),
        ),
        Control(
            "hardware",
            "GPU",
            TP_DEVICES,
            "h100-sxm",
            option_labels=tuple(get_device(d).display_name for d in TP_DEVICES),
        ),
        slider("tensor_parallel", "GPUs (tensor parallel)", TP_DEGREES, 8),
        log_slider("batch", "Batch (sequences)", TP_BATCHES, 1, (1, 4096)),
    )
    return Panel(
        "tensor-parallel",
        controls,
        tp_compute,
        tp_figures,
        "tensor-parallel",
        _page_terms("tensor-parallel", tp_terms()),
        TP_READOUT,
    )

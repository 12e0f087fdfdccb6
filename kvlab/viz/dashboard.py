"""The dashboard: every lever of the book on one page, the whole ledger updating live (Voila).

Live only. One page, top to bottom: the controls (the deployment: model, device, dtypes,
speed from the ceiling x an efficiency or from the published kernel tables, tensor
parallelism; the workload: batch and context; where the KV is read from, the
prefill-to-decode link and the cache hit; speculative decoding: draft tokens and their
acceptance), the readout and figures of the decode step they make, then a small serving
run (kvlab.sim, a generated workload on a few GPUs, well under a few seconds) with its
latency percentiles, re-run with its button.

Every number comes from kvlab, through `_ledger` (the decode step, the speculative round,
the tier, the hit and the transfer) and `_serving_run` (the simulator): the two places
that call into the ledger and the simulator.
"""

from __future__ import annotations

import html
import math

import numpy as np

from .. import cost, speculative, tiers
from ..deployment import Ceiling, Deployment, KernelTables
from ..errors import KvlabError
from ..hardware import get_tier
from ..sim import ARCHS, SimConfig, simulate, trace_at_rate, trace_slice
from . import speed, style
from .bandwidth_wall import bytes_figure, bytes_source, roof_source
from .controls import (
    batch_control,
    context_control,
    dtype_control,
    efficiency_control,
    fraction_slider,
    hardware_control,
    hit_control,
    model_control,
    slider,
)
from .panel import LIVE_ROW, Control, Panel, _live_control, _live_value, readout_html

PLACEMENTS = (
    "hbm",
    "peer-nvlink4",
    "host-pcie5",
    "host-pcie4",
    "remote-ib-400g",
    "remote-ib-200g",
    "remote-10gbe",
)
LINKS = ("nvlink4", "ib-400g", "ib-200g", "ethernet-10g")
TP_DEGREES = (1, 2, 4, 8)
DRAFT_TOKENS = tuple(range(1, 9))
ACCEPTANCES = tuple(round(0.05 * i, 2) for i in range(21))

DASHBOARD_READOUT = (
    ("weight_read_bytes", "Weights read per step (each GPU)", "bytes"),
    ("kv_read_bytes", "KV history read per step (each GPU)", "bytes"),
    ("step_time_s", "TPOT, KV in HBM", "seconds"),
    ("tokens_per_s", "Tokens/s, whole batch", "rate"),
    ("tokens_per_s_per_sequence", "Tokens/s, each sequence", "rate"),
    ("bound", "Bound by", "text"),
    ("speed", "Speed from", "text"),
    ("allreduce_share", "All-reduce share of the step", "percent"),
    ("arithmetic_intensity", "Arithmetic intensity", "intensity"),
    ("ridge_flops_per_byte", "Ridge point", "intensity"),
    ("memory_needed_bytes", "Memory needed, each GPU (weights + KV)", "bytes"),
    ("fits", "Fits in device memory", "yesno"),
    ("max_batch", "Largest batch that fits", "count"),
    ("spec_tokens_per_verify", "Speculative: tokens per verify pass", "rate"),
    ("spec_each", "Speculative: tokens/s, each sequence", "rate"),
    ("spec_speedup", "Speculative over plain decode", "ratio"),
    ("tier_tokens_per_s", "Tokens/s, KV read from the tier (one GPU)", "rate"),
    ("tier_slowdown", "Slowdown against HBM (one GPU)", "ratio"),
    ("hit_value_s", "Value of a hit (saved - fetch)", "seconds"),
    ("hit_ttft_s", "TTFT with the hit", "seconds"),
    ("miss_ttft_s", "TTFT without it", "seconds"),
    ("transfer_s", "One request's KV over the link", "seconds"),
    ("transfer_steps", "... in decode steps", "ratio"),
)


def dashboard_controls() -> tuple[Control, ...]:
    return (
        model_control(),
        hardware_control(),
        dtype_control("weight_dtype", "Weights"),
        dtype_control("kv_dtype", "KV cache"),
        speed.speed_control(),
        efficiency_control(),
        slider("tensor_parallel", "GPUs (tensor parallel)", TP_DEGREES, 1),
        batch_control(),
        context_control(),
        Control("kv_tier", "KV read from", PLACEMENTS, "hbm"),
        # one 400 Gb/s NIC per GPU, as in current nodes and the simulator's default
        Control("link", "Prefill→decode link", LINKS, SimConfig().link),
        hit_control(0.9),
        slider("draft_tokens", "Speculative: tokens drafted per round", DRAFT_TOKENS, 4, (1, 8)),
        fraction_slider(
            "acceptance", "Speculative: acceptance of a drafted token", ACCEPTANCES, 0.7
        ),
    )


# ------------------------------------------------------------ the one call site
def _ledger(state: dict) -> dict:
    """Everything the dashboard shows of the ledger, for one state: the decode step at the
    chosen speed and tensor-parallel degree, the speculative round, the step with its KV
    read from a tier and the value of a cache hit (both one GPU at the ceiling x the
    efficiency: those models have no measured mode), and the phrase naming the speed."""
    m, hw, b, c = state["model"], state["hardware"], state["batch"], state["context"]
    eff, tp = state["efficiency"], state["tensor_parallel"]
    one = Deployment(m, hw, state["weight_dtype"], state["kv_dtype"], Ceiling(eff))
    measured = state["speed"] == "measured"
    why = speed.why_not(m, hw, state["weight_dtype"], state["kv_dtype"]) if measured else ""
    d = one.replace(tensor_parallel=tp)
    step = None
    if measured and not why:
        try:
            d = d.replace(speed=KernelTables())
            step = cost.decode_step(d, b, c)
        except KvlabError:  # a point outside the tables' range: the ceiling, and why
            why, d = speed.NO_RANGE, one.replace(tensor_parallel=tp)
    step = step or cost.decode_step(d, b, c)
    spec = speculative.speculative_step(d, b, c, state["draft_tokens"], state["acceptance"])
    tier = state["kv_tier"]
    one_gpu = cost.decode_step(one, b, c)
    placed = one_gpu if tier == "hbm" else tiers.tiered_decode_step(one, b, c, tier)
    hit_tier = "host-pcie5" if tier == "hbm" else tier
    hit = tiers.hit_value(one, c, hit_tier, state["hit"])
    return {
        "step": step,
        "speculative": spec,
        "one_gpu": one_gpu,
        "placed": placed,
        "hit": hit,
        "speed": speed.speed_text(measured, why, eff, hw),
    }


def _dashboard_compute(state):
    led = _ledger(state)
    step, spec, placed, hit = led["step"], led["speculative"], led["placed"], led["hit"]
    link_bytes_per_s = get_tier(state["link"]).bandwidth_bytes_per_s
    # one request's KV, whole (with tensor parallelism each GPU holds a share of it)
    transfer = led["one_gpu"].kv_cache_bytes / state["batch"] / link_bytes_per_s
    x = np.logspace(-1, 4, 41)
    efficiency = 1.0 if step.efficiency == "measured" else state["efficiency"]
    values = {
        **step.to_dict(),
        "speed": led["speed"],
        "allreduce_share": step.allreduce_time_s / step.step_time_s,
        "spec_tokens_per_verify": spec.tokens_per_verify_step,
        "spec_each": spec.tokens_per_s_per_sequence,
        "spec_speedup": spec.speculative_speedup,
        "tier_tokens_per_s": placed.tokens_per_s,
        "tier_slowdown": 1.0 if state["kv_tier"] == "hbm" else placed.slowdown,
        "hit_value_s": hit.value_s,
        "hit_ttft_s": hit.hit_time_s,
        "miss_ttft_s": hit.miss_time_s,
        "transfer_s": transfer,
        "transfer_steps": transfer / step.step_time_s,
    }
    return {
        "sources": {
            "bytes": bytes_source(step),
            "roof": roof_source(step, x, efficiency),
            "point": {"x": [step.arithmetic_intensity], "y": [step.flops / step.step_time_s]},
        },
        "values": values,
    }


def _dashboard_figures(src):
    from bokeh.layouts import column

    bytes_fig = bytes_figure(src["bytes"])
    roof = style.chart("Roofline position", "FLOPs per byte", "FLOP/s", "xy", height=280)
    style.line(roof, "x", "y", src["roof"], style.GREY, 3)
    roof.scatter("x", "y", source=src["point"], size=13, color=style.BLUE)
    return column(bytes_fig, style.finish(roof, x="count", y="FLOP/s"))


def dashboard_panel() -> Panel:
    """All the ledger's controls: the step, fit, roofline, speculation, tier, hit, transfer."""
    return Panel(
        "dashboard",
        dashboard_controls(),
        _dashboard_compute,
        _dashboard_figures,
        js="",
        readout=DASHBOARD_READOUT,
    )


# ------------------------------------------------------------------ serving run
SERVING_TRACE = "generated:conversation"  # Mooncake-like conversations, labelled generated
SERVING_REQUESTS = 200
SERVING_RATES = (1, 2, 4, 6, 8, 12, 16)
SERVING_GPUS = (1, 2, 3, 4)
SERVING_READOUT = (
    ("requests_completed", "Requests completed", "count"),
    ("ttft_p50_s", "TTFT p50", "seconds"),
    ("ttft_p90_s", "TTFT p90", "seconds"),
    ("ttft_p99_s", "TTFT p99", "seconds"),
    ("itl_p50_s", "TBT p50 (all token gaps)", "seconds"),
    ("itl_p90_s", "TBT p90", "seconds"),
    ("itl_p99_s", "TBT p99", "seconds"),
    ("tpot_p50_s", "TPOT p50 (per request)", "seconds"),
    ("throughput_tokens_per_s", "Output tokens/s, cluster", "rate"),
    ("slo_attainment", "Requests within both SLOs", "percent"),
    ("prefix_hit_ratio", "Prompt tokens from the prefix cache", "percent"),
)


def serving_controls() -> tuple[Control, ...]:
    return (
        Control("arch", "Serving: cluster design", ARCHS, "kv-centric"),
        slider("rate", "Serving: requests per second", SERVING_RATES, 4),
        slider("prefill", "Serving: prefill GPUs", SERVING_GPUS, 2),
        # colocated: every GPU does both, prefill + decode of them
        slider("decode", "Serving: decode GPUs", SERVING_GPUS, 2),
    )


def _serving_run(ledger_state: dict, run: dict) -> dict:
    """One small simulation (kvlab.sim) of the dashboard's deployment: the first
    SERVING_REQUESTS requests of a generated conversation trace at the chosen rate, on
    the chosen cluster, each worker one GPU (no tensor parallelism in the simulator), at
    the dashboard's speed. Returns the run's summary plus 'note' and 'speed'."""
    m, hw = ledger_state["model"], ledger_state["hardware"]
    dtypes = {"weight_dtype": ledger_state["weight_dtype"], "kv_dtype": ledger_state["kv_dtype"]}
    measured = ledger_state["speed"] == "measured"
    why = speed.why_not(m, hw, dtypes["weight_dtype"], dtypes["kv_dtype"]) if measured else ""
    efficiency = "measured" if measured and not why else ledger_state["efficiency"]
    trace = trace_at_rate(trace_slice(SERVING_TRACE, limit=SERVING_REQUESTS), run["rate"])
    result = simulate(
        trace,
        arch=run["arch"],
        model=m,
        hardware=hw,
        efficiency=efficiency,
        prefill_workers=run["prefill"],
        decode_workers=run["decode"],
        **dtypes,
    )
    summary = result.summary()
    gpus = result.config.gpus
    summary["note"] = (
        f"{summary['requests']} requests of {result.trace}; {run['arch']}, {gpus} GPU"
        f"{'s' if gpus > 1 else ''}, one per worker"
    )
    summary["speed"] = speed.speed_text(measured, why, ledger_state["efficiency"], hw)
    return summary


def serving_section(ledger_view):
    """The serving run's controls, its button and its readout, reading the model, device,
    dtypes and speed from the ledger panel's live view (kvlab.viz.panel.LiveView)."""
    import ipywidgets as w

    controls = serving_controls()
    boxes = {c.key: _live_control(c) for c in controls}
    widgets = {key: box.children[1] for key, box in boxes.items()}
    button = w.Button(
        description="Run the serving simulation",
        button_style="primary",
        layout=w.Layout(width="auto", align_self="flex-start"),
    )
    status = w.HTML()
    readout = w.HTML(layout=w.Layout(width="100%"))

    def run(_click=None):
        state = {c.key: _live_value(c, widgets[c.key].value) for c in controls}
        status.value = '<span class="kvlab-label">simulating…</span>'
        try:
            summary = _serving_run(ledger_view.state(), state)
        except (KvlabError, ValueError) as exc:
            status.value = f'<p class="kvlab-error">{html.escape(str(exc))}</p>'
            readout.value = ""
            return
        values = {k: _finite(summary[k]) for k, _label, _kind in SERVING_READOUT}
        readout.value = readout_html(SERVING_READOUT, values)
        status.value = (
            f'<p class="kvlab-label" data-kind="note">{html.escape(summary["note"])}; speed: '
            f"{html.escape(summary['speed'])}</p>"
        )

    button.add_class("kvlab-serving-run")
    status.add_class("kvlab-serving-status")
    readout.add_class("kvlab-serving-readout")
    button.on_click(run)
    run()
    title = w.HTML('<h2 class="kvlab-section">A small serving run</h2>')
    row = w.Box([*boxes.values()], layout=w.Layout(**LIVE_ROW))
    return w.VBox([title, row, button, status, readout])


def _finite(value):
    """None for a percentile the run has no request for (NaN), else the value."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def live():
    """The whole dashboard page: the ledger panel, then the serving run."""
    import ipywidgets as w

    view = dashboard_panel().live_view()
    return w.VBox([view.box, serving_section(view)])

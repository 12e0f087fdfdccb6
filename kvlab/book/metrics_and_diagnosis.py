"""Chapter 5, "Metrics and diagnosis": token timestamps behind TTFT, TPOT and ITL, the
five-step diagnosis on four deployments, and the pitfalls."""

from __future__ import annotations

import functools

from .. import cost, fmt, tiers
from .. import diagnose as diagnosis
from ..deployment import Deployment
from ..diagnose import BUSY_SHARE_FOR_GAPS
from ..hardware import get_device
from ..models import get_model
from ..viz.i18n import t
from . import sim_runs
from .kv_centric import CONFIG
from .lang import pick

#: The deployment the diagnosis cases share: model, device, batch, context.
MODEL, HARDWARE, BATCH, CONTEXT = "llama-3.1-8b", "h100-sxm", 8, 16384
HOST_TIER = "host-pcie5"
NIC = "ib-400g"  # one 400 Gb/s NIC per GPU, the book's node (chapter 3)
#: The token-gap example's window of the conversation trace: one minute, after the first
#: five (the generated stand-in starts emptier; both show prefill chunks stalling decode).
STREAMS_START_S, STREAMS_S = 300.0, 60.0


@functools.cache
def token_streams() -> dict:
    """Token timestamps on chapter 4's small cluster (its config: step times from measured
    kernels), one minute of the trace."""

    return sim_runs.token_streams(start_s=STREAMS_START_S, duration_s=STREAMS_S, config=CONFIG)


def token_stream_figure():
    from ..viz import kv_centric as serving_figures  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    return serving_figures.token_stream_figure(token_streams())


def ceiling_tokens_per_s() -> float:
    return cost.decode_step(Deployment(MODEL, HARDWARE), BATCH, CONTEXT).tokens_per_s


def diagnosis_cases() -> dict:
    """{title: Diagnosis} for five deployments of one model, measured as a profiler and a
    load test would: tokens/s, and (where a profiler ran) the kernels' memory throughput."""
    d = Deployment(MODEL, HARDWARE)
    ceiling = ceiling_tokens_per_s()
    peak = get_device(HARDWARE).memory_bandwidth_bytes_per_s
    host = tiers.tiered_decode_step(d, BATCH, CONTEXT, HOST_TIER).tokens_per_s
    m, hw, b, ctx = MODEL, HARDWARE, BATCH, CONTEXT
    return {
        "near the ceiling": diagnosis.diagnose(
            m, hw, b, ctx, 0.88 * ceiling, measured_bandwidth_bytes_per_s=0.9 * peak
        ),
        "fast kernels, gaps between them": diagnosis.diagnose(
            m, hw, b, ctx, 0.5 * ceiling, measured_bandwidth_bytes_per_s=0.85 * peak
        ),
        "lots of headroom": diagnosis.diagnose(
            m, hw, b, ctx, 0.25 * ceiling, measured_bandwidth_bytes_per_s=0.3 * peak
        ),
        "KV served from host memory": diagnosis.diagnose(
            m, hw, b, ctx, 0.9 * host, kv_tier=HOST_TIER
        ),
        "disaggregated, KV over one 400 Gb/s NIC": diagnosis.diagnose(
            m,
            hw,
            b,
            ctx,
            0.85 * ceiling,
            network_bandwidth_bytes_per_s=NIC,
            kv_bytes_per_request=ctx * d.kv_bytes_per_token,
        ),
    }


def diagnosis_reports() -> list:
    from ..viz.metrics_and_diagnosis import DiagnosisReport  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    return [DiagnosisReport(title, result) for title, result in diagnosis_cases().items()]


@functools.cache
def panels() -> dict:
    from ..viz import bandwidth_wall, metrics_and_diagnosis  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    return {
        "budget": metrics_and_diagnosis.tpot_budget_panel(),
        "quantization": bandwidth_wall.quantization_panel(),
    }


def _setup() -> str:
    """The deployment the diagnosis cases share, for the prose."""
    model = get_model(MODEL).display_name
    device = get_device(HARDWARE).display_name
    context = fmt.fixed(CONTEXT, 0)
    return pick(
        f"{model} on an {device}, batch {BATCH}, {context}-token contexts",
        f"{device} 上的 {model}，批大小 {BATCH}，上下文 {context} token",
    )


def numbers() -> dict[str, str]:
    out = {}
    streams = token_streams()
    for arch, summ in streams["summary"].items():
        out.update(
            {
                f"ts_{arch}_tpot": fmt.seconds(summ["tpot_p50_s"]),
                f"ts_{arch}_itl50": fmt.seconds(summ["itl_p50_s"]),
                f"ts_{arch}_itl99": fmt.seconds(summ["itl_p99_s"]),
            }
        )
    out["ts_trace"] = t(streams["trace"])  # 'conversation [300-360 s]' (+ ' (generated)')
    co = streams["summary"]["colocated"]
    out["ts_colocated_ratio"] = f"{fmt.sig(co['itl_p99_s'] / co['itl_p50_s'], 2)}×"
    p = panels()
    budget, quant = p["budget"], p["quantization"]
    out.update(budget.readout_texts())
    out["budget_slo"] = fmt.seconds(budget.default_state["slo"])
    # the tightest budget the panel offers, where the budget binds before memory does
    tight = min(next(c for c in budget.controls if c.key == "slo").options)
    out["budget_tight_slo"] = fmt.seconds(tight)
    out.update(budget.readout_texts("tpot-budget-tight", slo=tight))
    out["budget_context"] = fmt.fixed(budget.default_state["context"], 0)
    out.update(quant.readout_texts("q16"))
    out.update(quant.readout_texts("q4k", context=4096))
    out["q_batch"] = fmt.fixed(quant.default_state["batch"], 0)
    out.update(
        {
            "bw_bound": fmt.percent(diagnosis.BANDWIDTH_BOUND_UTILISATION, 2),
            "low_util": fmt.percent(diagnosis.LOW_UTILISATION, 2),
            "diag_ceiling": fmt.rate(ceiling_tokens_per_s()),
            "diag_cases": fmt.fixed(len(diagnosis_cases()), 0),
            "busy_share": fmt.percent(BUSY_SHARE_FOR_GAPS),
            "diag_setup": _setup(),
        }
    )
    return out

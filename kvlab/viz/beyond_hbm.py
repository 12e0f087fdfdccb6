"""Chapter 3 panels: KV beyond HBM — footprint, reading from a tier, hit vs miss,
PD transfers, and measured transfers against the link model.

The footprint panel recombines ledger terms in the browser (js/beyond_hbm.js); the others
are lookup panels (kvlab computes every grid state at build time) because tier paths carry
latencies and break-even searches that belong in Python only.
"""

from __future__ import annotations

import numpy as np

from .. import tiers
from ..article import ARTICLE_IB_BYTES_PER_S
from ..bench.report import kv_transfer_series
from ..deployment import Deployment
from ..hardware import devices
from ..models import get_model, models
from ..tiers.link_model import MODEL_LINKS, link_model_curves
from ..tiers.placement import PLACEMENT_NAMES
from ..tiers.series import CONTEXTS as TIER_CONTEXTS
from ..tiers.series import hit_rate_series, pd_series
from . import speed, style
from .controls import (
    CONTEXT_GRID,
    batch_control,
    hardware_control,
    log_slider,
    model_control,
)
from .panel import Control, Panel, lookup_panel
from .terms import ledger_terms

SHOWN_PLACEMENTS = PLACEMENT_NAMES
PLACEMENT_COLORS = dict(
    zip(
        SHOWN_PLACEMENTS,
        (
            style.BLUE,
            style.SKY,
            style.GREEN,
            style.YELLOW,
            style.ORANGE,
            style.PURPLE,
            style.VERMILION,
        ),
        strict=True,
    )
)
SMALL_MODELS = ("article-7b", "llama-2-7b", "llama-3.1-8b", "qwen2.5-7b")


def small_model_control(default="article-7b") -> Control:
    return Control(
        "model",
        "Model",
        SMALL_MODELS,
        default,
        option_labels=tuple(get_model(m).display_name for m in SMALL_MODELS),
    )


# ------------------------------------------------------------------ footprint
FOOTPRINT_READOUT = (
    ("kv_bytes_per_token", "KV per token", "bytes"),
    ("request_4k_bytes", "KV of one 4K-token request", "bytes"),
    ("batch_4k_bytes", "KV of the batch at 4K tokens", "bytes"),
    ("weight_bytes", "Weights", "bytes"),
    ("weights_fit", "Weights fit in device memory", "yesno"),
    ("room_bytes", "Memory left for KV", "bytes"),
    ("max_batch_4k", "Largest batch at 4K tokens", "count"),
    ("max_context", "Longest context at this batch", "count_or_unbounded"),  # window: unbounded
)
REQUEST_TOKENS = 4096  # the request the readout sizes
ROOM_LABEL = "device memory left after the weights"
DTYPES_USED = {"weight_dtype": "fp16", "kv_dtype": "fp16"}  # the panel has no dtype controls


def footprint_panel() -> Panel:
    """KV bytes against context for a batch, next to the memory the weights leave."""
    grid = np.array(CONTEXT_GRID, dtype=float)

    def compute(state):
        d, batch = Deployment(state["model"], state["hardware"], **DTYPES_USED), state["batch"]
        fp = tiers.kv_footprint(d, batch, grid)
        at4k = tiers.kv_footprint(d, batch, REQUEST_TOKENS)
        # no room at all (the weights fill or overflow the device): no line on a log axis
        shown = grid.size if fp.kv_room_bytes > 0 else 0
        room = {
            "context": grid.tolist()[:shown],
            "room": [fp.kv_room_bytes] * shown,
            "room_label": [ROOM_LABEL] * shown,
        }
        kv = {"context": grid.tolist(), "kv": np.asarray(fp.kv_cache_bytes).tolist()}
        return {
            "sources": {"kv": kv, "room": room},
            "values": {
                "kv_bytes_per_token": fp.kv_bytes_per_token,
                "request_4k_bytes": REQUEST_TOKENS * fp.kv_bytes_per_token,
                "batch_4k_bytes": at4k.kv_cache_bytes,
                "weight_bytes": fp.weight_bytes,
                "weights_fit": fp.weight_bytes <= fp.capacity_bytes,
                "room_bytes": fp.kv_room_bytes,
                "max_batch_4k": at4k.max_batch,
                "max_context": at4k.max_context,
            },
        }

    def figures(src):
        fig = style.chart(
            "How fat the KV cache gets", "context (tokens per sequence)", "bytes", "xy", height=330
        )
        a = style.line(fig, "context", "kv", src["kv"], style.KV_READ, 3, legend="KV of the batch")
        # absent, legend entry too, where nothing is left
        room = src["room"]
        style.line(fig, "context", "room", room, style.GREY, 2, dash="dashed", field="room_label")
        tips = [("context", "@context{0,0}"), ("KV", "@kv{0.000a}B")]
        return style.finish(
            fig, x="count", y="B", legend="top_left", tips=tips, on=[a], mode="vline"
        )

    controls = (model_control("article-7b"), hardware_control(), batch_control(32))
    terms = {
        **ledger_terms(models(), devices()),
        "contexts": list(CONTEXT_GRID),
        "request_tokens": REQUEST_TOKENS,
        "dtypes_used": DTYPES_USED,
        "room_label": ROOM_LABEL,
    }
    return Panel("footprint", controls, compute, figures, "footprint", terms, FOOTPRINT_READOUT)


# ------------------------------------------------------- KV read from a tier
TIER_HARDWARE = "h100-sxm"  # the node the tier panels describe: one 400 Gb/s NIC per GPU
REMOTE = "remote-ib-400g"  # the default network case
TIER_READOUT = (
    ("hbm_4k", "Tokens/s at 4K, KV in HBM", "rate"),
    ("host_4k", "... KV in host memory over PCIe 5", "rate"),
    ("remote_400g_4k", "... KV on a node across one 400G NIC", "rate"),
    ("host_slowdown", "Host memory is slower than HBM by", "ratio"),
    ("speed", "Speed from", "text"),
)
#: The 200 Gb/s case; `remote_4k` is its name while chapter 3's prose still quotes it.
TIER_GLUE = (("remote_200g_4k", "rate"), ("remote_4k", "rate"))
TIER_TITLE = "Decode speed when the KV is read from a tier every step"


def _tier_times(state: dict) -> tuple[dict, np.ndarray, bool]:
    """Step time per placement over the contexts, the step with all KV in HBM, and whether
    they are measured: the ceiling of kvlab.tiers; or, measured, the kernel tables' decode
    step (all KV in HBM) plus the KV's trip over the placement's path every step (the link
    model: the tables hold kernels, not links), a fetch that does not overlap the step."""
    model, batch = state["model"], state["batch"]
    measured = state["speed"] == "measured"
    kernel_s = np.array(
        [
            speed.measured_time(model, TIER_HARDWARE, "fp16", "fp16", batch, int(c))[0]
            for c in TIER_CONTEXTS
        ]
    )
    out, local = {}, None
    d = Deployment(model, TIER_HARDWARE)
    for name in SHOWN_PLACEMENTS:
        step = tiers.tiered_decode_step(d, batch, TIER_CONTEXTS, name)
        tier_s, ceiling_s = np.asarray(step.tier_time_s), np.asarray(step.step_time_s)
        if measured:  # KV in HBM: the kernels read it already; no trip to add
            out[name] = kernel_s if name == "hbm" else kernel_s + tier_s
        else:
            out[name] = ceiling_s
        local = kernel_s if measured else np.asarray(step.hbm_step_time_s)
    return out, local, measured


def _decade_ticks(contexts):
    """Labels at powers of ten only: the measured kernels cover a shorter range (under two
    decades), where bokeh's log ticker labels every minor tick and the labels run together."""
    from bokeh.models import FixedTicker

    lo, hi = float(np.min(contexts)), float(np.max(contexts))
    decades = range(int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi))) + 1)
    return FixedTicker(
        ticks=[10.0**e for e in decades if lo <= 10.0**e <= hi],
        minor_ticks=[m * 10.0**e for e in decades for m in range(2, 10) if lo <= m * 10.0**e <= hi],
    )


def tier_read_panel():
    """Tokens/s against context when the KV is read from each placement at every step,
    at the ceiling or with the decode kernels measured."""

    def compute(state):
        times, local, measured = _tier_times(state)
        c = TIER_CONTEXTS.astype(float)
        i4k = int(np.flatnonzero(c == 4096)[0])
        tps = {name: state["batch"] / t for name, t in times.items()}
        sources = {
            name: {
                "context": c[np.isfinite(v)].tolist(),
                "tokens_per_s": v[np.isfinite(v)].tolist(),
            }
            for name, v in tps.items()
        }
        why = speed.why_not(state["model"], TIER_HARDWARE, "fp16", "fp16") if measured else ""
        if measured and not why and not np.isfinite(local[i4k]):
            why = speed.NO_RANGE
        title = TIER_TITLE
        if measured:
            title = f"{TIER_TITLE} ({speed.short_source(TIER_HARDWARE)}, H100 SXM)"
        return {
            "sources": sources,
            "titles": {"tier-read": title},
            "values": {
                "hbm_4k": tps["hbm"][i4k],
                "host_4k": tps["host-pcie5"][i4k],
                "remote_400g_4k": tps[REMOTE][i4k],
                "host_slowdown": times["host-pcie5"][i4k] / local[i4k],
                "speed": speed.speed_text(measured, why, 1.0, TIER_HARDWARE),
                "remote_200g_4k": tps["remote-ib-200g"][i4k],
                "remote_4k": tps["remote-ib-200g"][i4k],
            },
        }

    def figures(src):
        fig = style.chart(
            TIER_TITLE, "context (tokens)", "tokens per second, whole batch", "xy", height=380
        )
        fig.name = "tier-read"
        _placement_lines(fig, "context", "tokens_per_s", src, _placement_label)
        fig.xaxis.ticker = _decade_ticks(TIER_CONTEXTS)
        return style.finish(fig, x="count", y="count", legend="bottom_left", legend_px="10px")

    batch = log_slider("batch", "Batch (sequences)", (1, 8, 32), 8, (1, 512))
    controls = (small_model_control(), batch, speed.speed_control())
    return lookup_panel("tier-read", controls, compute, figures, TIER_READOUT, glue=TIER_GLUE)


def _placement_label(name: str) -> str:
    return tiers.get_placement(name).description if name != "hbm" else "the GPU's own HBM"


def _placement_lines(fig, x: str, y: str, src, label) -> None:
    """One curve per shown placement, in its colour, labelled `label(name)`."""
    for name in SHOWN_PLACEMENTS:
        style.line(fig, x, y, src[name], PLACEMENT_COLORS[name], legend=label(name))


# -------------------------------------------------------------- hit vs miss
HIT_RATES = np.array([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0])
HIT_READOUT = (
    ("miss_s", "Prefill with no hit (recompute in HBM)", "seconds"),
    ("hit_host4_s", "Hit fetched from host over PCIe 4", "seconds"),
    ("hit_10gbe_s", "Hit fetched over 10 GbE", "seconds"),
    ("mean_99_host4_s", "Mean prefill at a 99% hit rate, PCIe 4", "seconds"),
    ("breakeven_host4", "Shortest prompt a PCIe 4 hit pays for", "count_or_never"),
)


def hit_miss_panel():
    """Mean prefill time against hit rate per placement: a cache can be a liability."""

    def compute(state):
        d = Deployment(state["model"], "h100-sxm")
        s = hit_rate_series(d, state["prompt"], HIT_RATES, placements=SHOWN_PLACEMENTS)
        rates = s["hit_rates"]
        sources = {
            p: {"rate": rates.tolist(), "time": v["mean_prefill_time_s"].tolist()}
            for p, v in s["placements"].items()
        }
        sources["miss"] = {
            "rate": rates.tolist(),
            "time": np.full(rates.shape, s["miss_time_s"]).tolist(),
        }
        pl = s["placements"]
        i99 = int(np.argmin(np.abs(rates - 0.99)))
        breakeven = tiers.breakeven_prompt_tokens(d, "host-pcie4")
        return {
            "sources": sources,
            "values": {
                "miss_s": float(s["miss_time_s"]),
                "hit_host4_s": float(pl["host-pcie4"]["hit_time_s"]),
                "hit_10gbe_s": float(pl["remote-10gbe"]["hit_time_s"]),
                "mean_99_host4_s": float(pl["host-pcie4"]["mean_prefill_time_s"][i99]),
                "breakeven_host4": float(np.asarray(breakeven).ravel()[0]),
            },
        }

    def figures(src):
        fig = style.chart(
            "Mean prefill time against hit rate",
            "prefix-cache hit rate",
            "seconds",
            "y",
            height=380,
        )
        miss = "every request a miss"
        style.line(fig, "rate", "time", src["miss"], "black", 2, dash="dashed", legend=miss)
        _placement_lines(fig, "rate", "time", src, lambda name: f"hits served from {name}")
        return style.finish(fig, x="percent", y="seconds", legend="top_left", legend_px="10px")

    prompt = log_slider("prompt", "Prompt (tokens)", (512, 2048, 4096, 16384), 4096, (64, 131072))
    return lookup_panel(
        "hit-miss", (small_model_control("llama-2-7b"), prompt), compute, figures, HIT_READOUT
    )


# ---------------------------------------------------------- PD transfers
#: The links a request's KV may cross from prefill to decode: {name: (path, bandwidth override)}.
PD_LINKS = {
    "ethernet-10g": ("ethernet-10g", None),
    "ib-200g": ("ib-200g", None),
    "article-200GB/s": ("remote-ib-200g", ARTICLE_IB_BYTES_PER_S),
    "ib-400g": ("ib-400g", None),
    "nvlink4": ("nvlink4", None),
}
PD_LABELS = {
    "ethernet-10g": "10 GbE",
    "ib-200g": "one 200 Gb/s NIC",
    "article-200GB/s": "200 GB/s (the article)",
    "ib-400g": "one 400 Gb/s NIC, one per GPU",
    "nvlink4": "NVLink 4 (in a node)",
}
PD_READOUT = (
    ("kv_bytes", "KV of the batch at this context", "bytes"),
    ("decode_step_s", "One decode step (KV local)", "seconds"),
    ("t_10g_s", "KV over 10 GbE", "seconds"),
    ("t_200g_s", "KV over one 200 Gb/s NIC", "seconds"),
    ("t_400g_s", "KV over one 400 Gb/s NIC", "seconds"),
    ("t_article_s", "KV at 200 GB/s (the article's figure)", "seconds"),
    ("t_nvlink_s", "KV over NVLink 4", "seconds"),
    ("remote_slowdown_400g", "Decode reading the KV over 400G every step: slower by", "ratio"),
)
PD_GLUE = (("remote_slowdown_200g", "ratio"),)  # the 200 Gb/s case, for comparison


def _pd_compute(state):
    s = pd_series(
        Deployment(state["model"], TIER_HARDWARE), state["context"], state["batch"], PD_LINKS
    )
    names = list(s["links"])
    rows = s["links"]
    sources = {
        "links": {
            "link": [PD_LABELS[n] for n in names],
            "transfer": [rows[n]["transfer_s"] for n in names],
            "every_step": [rows[n]["every_step_time_s"] for n in names],
            "color": [style.PALETTE[i % len(style.PALETTE)] for i in range(len(names))],
        },
        "step": {
            "link": [PD_LABELS[n] for n in names],
            "step": [s["decode_step_s"]] * len(names),
        },
    }
    return {
        "sources": sources,
        "values": {
            "kv_bytes": s["kv_bytes"],
            "decode_step_s": s["decode_step_s"],
            "t_10g_s": rows["ethernet-10g"]["transfer_s"],
            "t_200g_s": rows["ib-200g"]["transfer_s"],
            "t_400g_s": rows["ib-400g"]["transfer_s"],
            "t_article_s": rows["article-200GB/s"]["transfer_s"],
            "t_nvlink_s": rows["nvlink4"]["transfer_s"],
            "remote_slowdown_400g": rows["ib-400g"]["every_step_slowdown"],
            "remote_slowdown_200g": rows["ib-200g"]["every_step_slowdown"],
        },
    }


def _pd_figures(src):
    labels = list(src["links"].data["link"])
    fig = style.new_figure(
        "Moving a request's KV from prefill to decode",
        "seconds (log scale)",
        "",
        y_range=labels,
        x_axis_type="log",
        height=300,
        x_range=(1e-5, 100),
    )
    bars = fig.hbar(
        y="link", left=1e-5, right="transfer", height=0.6, color="color", source=src["links"]
    )
    fig.scatter(
        "step",
        "link",
        source=src["step"],
        marker="dash",
        size=26,
        color="black",
        line_width=3,
        legend_label="one decode step",
    )
    tips = [
        ("", "@link"),
        ("transfer", "@transfer{0.000000} s"),
        ("decode step reading it remotely", "@every_step{0.000000} s"),
    ]
    return style.finish(fig, x="seconds", legend="bottom_right", tips=tips, on=[bars])


def pd_panel():
    """One request's KV over each link against one decode step, and the every-step disaster."""

    context = log_slider("context", "Context (tokens)", (1024, 4096, 32768), 4096, (128, 131072))
    batch = log_slider("batch", "Requests moved together", (1, 8), 1, (1, 256))
    return lookup_panel(
        "pd",
        (small_model_control(), context, batch),
        _pd_compute,
        _pd_figures,
        PD_READOUT,
        glue=PD_GLUE,
    )


# ------------------------------------------------------ measured transfers
def transfers_figure():
    """Measured KV transfers of every recorded machine next to the link model."""
    from bokeh.models import ColumnDataSource

    data = {
        "model": link_model_curves(MODEL_LINKS, 2.0 ** np.arange(12, 30)),
        "measured": kv_transfer_series(),
    }
    fig = style.chart(
        "KV transfer: effective bandwidth against message size",
        "message size",
        "effective bandwidth (bytes/s)",
        "xy",
        height=400,
    )
    for i, (name, curve) in enumerate(data["model"]["links"].items()):
        x, y = curve["sizes_bytes"], curve["bandwidth_bytes_per_s"]
        style.line(
            fig, x, y, None, style.PALETTE[i], 2, dash="dashed", legend=f"link model: {name}"
        )
    markers = ("circle", "triangle", "square", "diamond")
    k = 0
    for machine, payload in data["measured"].items():
        for engine, entry in payload["engines"].items():
            for layout, rows in entry["layouts"].items():
                src = ColumnDataSource(
                    {
                        "bytes": rows["bytes"],
                        "bw": rows["bandwidth_bytes_per_s_median"],
                        "p10": rows["bandwidth_bytes_per_s_p10"],
                        "p90": rows["bandwidth_bytes_per_s_p90"],
                    }
                )
                color = style.PALETTE[(4 + k) % len(style.PALETTE)]
                fig.scatter(
                    "bytes",
                    "bw",
                    source=src,
                    size=8,
                    marker=markers[k % len(markers)],
                    color=color,
                    legend_label=f"measured: {engine}, {layout} ({machine})",
                )
                fig.segment("bytes", "p10", "bytes", "p90", source=src, color=color)
                k += 1
    style.finish(fig, x="B", y="B/s", legend_px="10px")
    fig.legend.ncols = 2
    fig.add_layout(fig.legend[0], "below")
    fig.height = 560
    return fig

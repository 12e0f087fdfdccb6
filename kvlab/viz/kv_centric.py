"""Chapter 4 (and 5) figures from the serving simulator. Pure: each takes the data the
book computed (kvlab.book.sim_runs) and draws it.

Simulations are too heavy for the browser, so the interactive ones are lookup panels:
kvlab runs every grid state when the book is built and the page looks results up.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .. import fmt
from ..errors import KvlabError
from ..sim import ARCHS, SimConfig
from . import style
from .controls import slider
from .panel import Control, Panel, lookup_panel

ARCH_COLORS = style.ARCH_COLORS
KIND_COLORS = {
    "fetch": style.PURPLE,
    "prefill": style.VERMILION,
    "transfer": style.YELLOW,
    "decode": style.BLUE,
}


def _share_chart(title: str, x_label: str, y_label: str, height: int = 300):
    """A share (0 to 1) against a log x axis: the chapter's distributions and hit ratios."""
    return style.chart(title, x_label, y_label, "x", y_range=(0, 1), height=height)


def cdf_figure(data: dict, metric: str, title: str):
    """The distribution of a per-request metric for each architecture (percentile curves);
    `data` from kvlab.book.sim_runs.compare_architectures."""
    fig = _share_chart(f"{title}: {data['trace']}", "seconds (log scale)", "share of requests")
    q = np.asarray(data["quantiles"]) / 100
    for arch in data["archs"]:
        values = np.asarray(data[metric][arch], dtype=float)
        ok = values > 0
        style.line(fig, values[ok], q[ok], None, ARCH_COLORS[arch], legend=arch)
    return style.finish(fig, x="seconds", y="percent", legend="bottom_right")


# ---------------------------------------------------------------- the sweep
#: What the sweep shows of each architecture: (metric key, readout label).
SWEEP_SHOWN = (
    ("ttft_p50_s", "TTFT p50"),
    ("ttft_p90_s", "TTFT p90"),
    ("tpot_p50_s", "TPOT p50"),
    ("itl_p99_s", "ITL p99"),
)
SWEEP_METRICS = tuple(k for k, _ in SWEEP_SHOWN)
SWEEP_READOUT = tuple(
    (f"{arch}_{k}", f"{arch}: {label}", "seconds") for arch in ARCHS for k, label in SWEEP_SHOWN
)


def sweep_panel(s: dict, run_point: Callable[[dict], dict] | None = None):
    """TTFT and token latencies of the three architectures for a link, pool and GPU counts.

    `s`: a grid from kvlab.book.sim_runs.sweep; `run_point(state)` (live widgets only)
    simulates a state off that grid and returns a grid of one point in the same form."""
    links = tuple(s["links"])
    pools = tuple(float(p) for p in s["pool_bytes_per_node"])

    def compute(state):
        try:
            idx = (
                links.index(state["link"]),
                pools.index(float(state["pool"])),
                list(s["prefill_workers"]).index(state["prefill"]),
                list(s["decode_workers"]).index(state["decode"]),
            )
            values = {
                arch: {k: float(s["metrics"][arch][k][idx]) for k in s["keys"]} for arch in ARCHS
            }
        except ValueError:  # a value off the grid (live widgets): simulate that one point
            if run_point is None:
                raise KvlabError("that setting is off the simulated grid") from None
            one = run_point(state)
            values = {
                arch: {k: float(one["metrics"][arch][k].ravel()[0]) for k in one["keys"]}
                for arch in ARCHS
            }
        out = {f"{arch}_{k}": values[arch][k] for arch in ARCHS for k in SWEEP_METRICS}
        # the page rebuilds the bars from these values (js_sources below): keep the two in step
        bars = {"arch": list(ARCHS), "color": [ARCH_COLORS[a] for a in ARCHS]}
        for k in SWEEP_METRICS:
            bars[k] = [values[a][k] for a in ARCHS]
        return {"sources": {"bars": bars}, "values": out}

    def figures(src):
        from bokeh.layouts import row

        return row(
            _paired_bars(
                "Time to first token", src["bars"], ("ttft_p50_s", "p50"), ("ttft_p90_s", "p90")
            ),
            _paired_bars(
                "Between tokens", src["bars"], ("tpot_p50_s", "TPOT p50"), ("itl_p99_s", "ITL p99")
            ),
        )

    controls = (
        Control(
            "link",
            "Network between nodes",
            links,
            SimConfig().link if SimConfig().link in links else links[0],
        ),
        Control(
            "pool",
            "Prefix pool per node",
            pools,
            pools[-1],
            option_labels=tuple("none" if p == 0 else f"{p / 1e9:.0f} GB" for p in pools),
        ),
        slider("prefill", "Prefill GPUs", tuple(int(p) for p in s["prefill_workers"]), 2),
        slider("decode", "Decode GPUs", tuple(int(d) for d in s["decode_workers"]), 2),
    )
    # the page rebuilds the bars from the values: KVLAB.sources.sweep (js/kv_centric.js)
    js_sources = (
        "sweep",
        {
            "archs": list(ARCHS),
            "colors": [ARCH_COLORS[a] for a in ARCHS],
            "metrics": list(SWEEP_METRICS),
        },
    )
    return lookup_panel("sweep", controls, compute, figures, SWEEP_READOUT, js_sources=js_sources)


def _paired_bars(title: str, source, first: tuple[str, str], second: tuple[str, str]):
    """Two bars per architecture (a solid and a light one), in seconds."""
    from bokeh.transform import dodge

    fig = style.new_figure(
        title, "", "seconds", x_range=list(ARCHS), y_range=style.from_zero(), width=340, height=300
    )
    for (column, label), offset, alpha in ((first, -0.17, 1.0), (second, 0.17, 0.45)):
        fig.vbar(
            x=dodge("arch", offset, range=fig.x_range),
            top=column,
            width=0.3,
            color="color",
            alpha=alpha,
            source=source,
            legend_label=label,
        )
    style.finish(fig, y="seconds", legend="top_left")
    fig.xaxis.major_label_text_font_size = "10px"
    return fig


# ------------------------------------------------------------- capacity under load
#: Design -> readout stem (glue keys: capacity_<stem>_<metric>).
DESIGN_KEYS = {
    "colocated": "colocated",
    "disaggregated": "disaggregated",
    "kv-centric": "kv_centric",
}
#: What the capacity panel reads of each design at the chosen load: (key, label, format).
CAPACITY_SHOWN = (
    ("slo_attainment", "requests within both SLOs", "percent"),
    ("goodput_requests_per_s", "goodput (requests/s)", "rate"),
    ("ttft_p90_s", "TTFT p90", "seconds"),
    ("itl_p99_s", "TBT p99 (all token gaps)", "seconds"),
)
CAPACITY_READOUT = tuple(
    (f"{DESIGN_KEYS[d]}_{k}", f"{d}: {label}", kind)
    for d in ARCHS
    for k, label, kind in CAPACITY_SHOWN
) + tuple((f"{DESIGN_KEYS[d]}_saturation", f"{d} saturates at", "text") for d in ARCHS)
EARLY_REJECT_OPTIONS = ("on", "off")


def saturation_text(rate: float, status: str, level: float) -> str:
    """A design's saturation rate as the readout says it."""
    where = {"crossed": "", "above": "above ", "below": "below "}[status]
    return f"{where}{fmt.sig(rate, 2)} requests/s" + (
        f" (never under {fmt.percent(level, 2)})" if status == "above" else ""
    )


def capacity_panel(data: dict, level: float) -> Panel:
    """SLO attainment and goodput of the three designs against the offered load; controls
    for the load, the colocated engine's token budget and early rejection for both separated
    designs (off at first: the three compared alike, none rejecting); the readout gives each
    design's figures at that load and where it saturates (attainment under `level`). `data`
    from kvlab.book.sim_runs.load_sweep, which must hold the variants named in its settings:
    colocated at each budget, disaggregated and KV-centric with and without early rejection.

    Every state is a lookup into `data` (the browser twin, KVLAB.panels.load_capacity in
    js/kv_centric.js, does the same lookups): the curves depend on two controls only, so
    the page stores them once, not once per load as a lookup panel's table would."""
    rates = [float(r) for r in data["rates"]]
    settings = data["settings"]
    colocated = {
        str(cfg["chunk_tokens"]): name
        for name, cfg in settings.items()
        if cfg["arch"] == "colocated" and not cfg["early_reject"]
    }
    separated = {
        arch: {
            ("on" if cfg["early_reject"] else "off"): name
            for name, cfg in settings.items()
            if cfg["arch"] == arch
        }
        for arch in ("disaggregated", "kv-centric")
    }
    used = sorted({*colocated.values(), *(n for v in separated.values() for n in v.values())})
    keys = [k for k, _, _ in CAPACITY_SHOWN]
    terms = {
        "rates": rates,
        "designs": [DESIGN_KEYS[d] for d in ARCHS],
        "colors": [ARCH_COLORS[d] for d in ARCHS],
        "keys": keys,
        "colocated": colocated,
        "disaggregated": separated["disaggregated"],
        "kv_centric": separated["kv-centric"],
        "curves": {
            name: {k: [float(v) for v in data["metrics"][name][k]] for k in keys} for name in used
        },
        "saturation": {name: saturation_text(*data["saturation"][name], level) for name in used},
    }
    budgets = tuple(sorted(int(c) for c in colocated))
    default_budget = (
        settings["colocated"]["chunk_tokens"] if "colocated" in settings else budgets[-1]
    )

    def compute(state):
        return _capacity_state(terms, state)

    controls = (
        slider(
            "rate", "Offered load (requests/s)", tuple(rates), rates[len(rates) // 2], integer=False
        ),
        Control(
            "chunk",
            "Colocated token budget",
            budgets,
            default_budget,
            option_labels=tuple(
                f"{b:,}" + (" (vLLM's default)" if b == default_budget else "") for b in budgets
            ),
        ),
        Control("early_reject", "Early rejection (separated designs)", EARLY_REJECT_OPTIONS, "off"),
    )
    return Panel(
        "load-capacity",
        controls,
        compute,
        lambda src: _capacity_figures(src, rates, level),
        "load_capacity",
        terms,
        CAPACITY_READOUT,
    )


def _capacity_state(terms: dict, state: dict) -> dict:
    """The figures' sources and the readout of one state: lookups only (the JS twin's)."""
    i = terms["rates"].index(float(state["rate"]))
    picked = {
        "colocated": terms["colocated"][str(state["chunk"])],
        "disaggregated": terms["disaggregated"][state["early_reject"]],
        "kv_centric": terms["kv_centric"][state["early_reject"]],
    }
    curves, values = {"rate": list(terms["rates"])}, {}
    at = {
        "design": list(terms["designs"]),
        "color": list(terms["colors"]),
        "rate": [terms["rates"][i]] * len(terms["designs"]),
    }
    at["slo_attainment"], at["goodput_requests_per_s"] = [], []
    for d in terms["designs"]:
        c = terms["curves"][picked[d]]
        for k in terms["keys"]:
            values[f"{d}_{k}"] = c[k][i]
        for k in ("slo_attainment", "goodput_requests_per_s"):
            curves[f"{d}_{k}"] = list(c[k])
            at[k].append(c[k][i])
        values[f"{d}_saturation"] = terms["saturation"][picked[d]]
    return {"sources": {"curves": curves, "at": at}, "values": values}


#: The capacity panel's two figures: (title, x label, y label).
CAPACITY_AXES = (
    ("Requests within both SLOs", "offered load (requests/s)", "share of requests"),
    ("Goodput", "offered load (requests/s)", "requests/s within both SLOs"),
)


def _capacity_figures(src, rates: list[float], level: float):
    """Attainment and goodput against the offered load, one line per design."""
    from bokeh.layouts import row
    from bokeh.models import ColumnDataSource

    top = max(rates) * 1.05
    limit = ColumnDataSource({"rate": [0.0, top], "level": [level, level], "offered": [0.0, top]})
    # (figure, its metric, the dashed limit line's column and label, legend place)
    specs = (
        (
            style.new_figure(
                *CAPACITY_AXES[0], x_range=(0, top), y_range=(0, 1.02), width=340, height=320
            ),
            "slo_attainment",
            "level",
            f"{fmt.percent(level, 2)}: saturation",
            "bottom_left",
        ),
        (
            style.new_figure(
                *CAPACITY_AXES[1], x_range=(0, top), y_range=(0, top), width=340, height=320
            ),
            "goodput_requests_per_s",
            "offered",
            "every request served",
            "top_left",
        ),
    )
    for fig, _metric, column, label, _where in specs:
        style.line(fig, "rate", column, limit, style.GREY, None, dash="dashed", legend=label)
    for design, key in DESIGN_KEYS.items():
        for fig, metric, *_ in specs:
            style.line(
                fig, "rate", f"{key}_{metric}", src["curves"], ARCH_COLORS[design], legend=design
            )
    for fig, metric, _column, _label, where in specs:
        fig.scatter("rate", metric, source=src["at"], color="color", size=9)
        style.finish(fig, legend=where, legend_px="10px")
    att, good = specs[0][0], specs[1][0]
    att.yaxis.formatter = style.percent_ticks()
    return row(att, good)


# ------------------------------------------------- same bytes, lower latency
def critical_path_figure(data: dict):
    """Time the KV moves took on the wire: hidden behind compute against on the critical
    path; `data` from kvlab.book.sim_runs.bytes_vs_critical_path."""
    from bokeh.models import ColumnDataSource

    variants = data["variants"]
    exposed = [sum(data[v]["exposed_s"].values()) for v in variants]
    hidden = [sum(data[v]["hidden_s"].values()) for v in variants]
    moved = [sum(data[v]["bytes"].values()) for v in variants]
    src = ColumnDataSource(
        {"variant": variants, "exposed": exposed, "hidden": hidden, "bytes": moved}
    )
    return style.stacked_bars(
        f"Same bytes, lower latency: {data['trace']}",
        "seconds of transfer, summed over requests",
        variants[::-1],
        "variant",
        {
            "exposed": (style.VERMILION, "on the critical path"),
            "hidden": (style.GREEN, "hidden behind compute"),
        },
        src,
        x="seconds",
        legend_side="below",
        height=240,
        tips=[
            ("", "@variant"),
            ("bytes moved", "@bytes{0.00a}B"),
            ("exposed", "@exposed{0.0} s"),
            ("hidden", "@hidden{0.0} s"),
        ],
    )


def global_vs_local_figure(data: dict):
    """Prefix hit ratio of one global pool against per-node caches of the same total size;
    `data` from kvlab.book.sim_runs.hit_rate_global_vs_local."""
    fig = _share_chart(
        f"One global pool or {data['nodes']} separate caches: {data['trace']}",
        "cache per node (bytes of KV)",
        "prompt tokens served",
    )
    pools = data["pool_bytes_per_node"]
    style.line(fig, pools, data["global_token_hit_ratio"], legend="global pool")
    local = data["local_token_hit_ratio"]
    style.line(fig, pools, local, None, style.ORANGE, legend="per-node caches")
    unlimited = np.full(pools.shape, data["infinite_token_hit_ratio"])
    style.line(
        fig, pools, unlimited, None, style.GREY, None, dash="dashed", legend="unlimited cache"
    )
    return style.finish(fig, x="B", y="percent", legend="top_left")


# ------------------------------------------------------------------ timeline
TIMELINE_READOUT = (
    ("ttft_p50_s", "TTFT p50 in this slice", "seconds"),
    ("tpot_p50_s", "TPOT p50 in this slice", "seconds"),
    ("requests", "Requests in the slice", "count"),
)


def timeline_panel(timeline_of: Callable[[str], dict], duration_s: float):
    """A Gantt chart of prefill, KV transfer and decode on each GPU for a short slice;
    `timeline_of(arch)` gives kvlab.book.sim_runs.timeline's data for an architecture."""
    lanes = ("prefill-0", "prefill-1", "decode-0", "decode-1", "gpu-0", "gpu-1", "gpu-2", "gpu-3")

    def compute(state):
        t = timeline_of(state["arch"])
        rows = [r for r in t["rows"] if r[3] != "decode"]
        decode = [r for r in t["rows"] if r[3] == "decode"]
        return {
            "sources": {
                "spans": {
                    "worker": [r[0] for r in rows],
                    "start": [r[1] for r in rows],
                    "end": [r[2] for r in rows],
                    "kind": [r[3] for r in rows],
                    "request": [r[4] for r in rows],
                    "color": [KIND_COLORS[r[3]] for r in rows],
                },
                "decode": {
                    "worker": [r[0] for r in decode],
                    "start": [r[1] for r in decode],
                    "end": [r[2] for r in decode],
                    "request": [r[4] for r in decode],
                },
            },
            "values": {
                "ttft_p50_s": t["summary"]["ttft_p50_s"],
                "tpot_p50_s": t["summary"]["tpot_p50_s"],
                "requests": t["summary"]["requests"],
            },
        }

    def figures(src):
        from bokeh.transform import dodge

        fig = style.new_figure(
            "Who does what, when",
            "seconds from the start of the slice",
            "",
            y_range=list(lanes)[::-1],
            height=360,
            x_range=(0, duration_s * 1.5),
        )
        fig.hbar(
            y=dodge("worker", 0.18, range=fig.y_range),
            left="start",
            right="end",
            height=0.06,
            color=style.BLUE,
            alpha=0.35,
            source=src["decode"],
            legend_label="decode (one line per request)",
        )
        spans = fig.hbar(
            y=dodge("worker", -0.12, range=fig.y_range),
            left="start",
            right="end",
            height=0.4,
            color="color",
            source=src["spans"],
            legend_field="kind",
        )
        tips = [
            ("", "@kind on @worker"),
            ("request", "@request"),
            ("from", "@start{0.000} s"),
            ("to", "@end{0.000} s"),
        ]
        return style.finish(fig, legend="bottom_right", legend_px="10px", tips=tips, on=[spans])

    control = Control("arch", "Architecture", tuple(ARCHS), "kv-centric")
    return lookup_panel("timeline", (control,), compute, figures, TIMELINE_READOUT)


# ------------------------------------------------------ chapter 5: token times
def token_stream_figure(data: dict):
    """Per-token timestamps of a few requests: equal TPOT, very different ITL; `data` from
    kvlab.book.sim_runs.token_streams."""
    from bokeh.layouts import column

    figs = []
    for arch in data["archs"]:
        fig = style.new_figure(
            f"{arch}: every output token of {len(data[arch])} requests",
            "seconds since the request arrived",
            "request",
            height=220,
            y_range=[str(r["request"]) for r in data[arch]][::-1],
        )
        for row in data[arch]:
            times = np.asarray(row["token_times_s"], dtype=float)
            fig.scatter(
                times,
                [str(row["request"])] * len(times),
                marker="dash",
                angle=np.pi / 2,
                size=9,
                color=ARCH_COLORS.get(arch, style.BLUE),
                alpha=0.7,
            )
        fig.xaxis.formatter = style.seconds_ticks()
        figs.append(fig)
    return column(*figs)


# ------------------------------------------------------------- schedulers
def scheduler_figure(data: dict):
    """What each engine scheduler costs the first token (TTFT p90) and buys the gaps
    between tokens (the p90 over requests of each one's worst gap); `data` from
    kvlab.book.sim_runs.schedulers."""
    from bokeh.layouts import row
    from bokeh.models import ColumnDataSource

    names = data["variants"]
    s = data["summary"]
    src = ColumnDataSource(
        {
            "scheduler": names,
            "ttft": [s[n]["ttft_p90_s"] for n in names],
            "gap": [s[n]["worst_gap_p90_s"] for n in names],
        }
    )
    figs = []
    for column, title, color in (
        ("ttft", "TTFT p90", style.VERMILION),
        ("gap", "a request's worst gap, p90", style.BLUE),
    ):
        fig = style.new_figure(
            f"{title}: {data['trace']}",
            "seconds",
            "",
            y_range=names[::-1],
            x_range=style.from_zero(),
            width=340,
            height=240,
        )
        bars = fig.hbar(y="scheduler", right=column, height=0.6, color=color, source=src)
        tips = [("", "@scheduler"), (title, f"@{column}{{0.000}} s")]
        figs.append(style.finish(fig, x="seconds", tips=tips, on=[bars]))
    return row(*figs)


# ------------------------------------------------------------- Mooncake's regime
#: Line styles of the two step-time models in the Mooncake-regime figure.
STEP_MODELS = (("kernels", "solid", "kernels only"), ("fitted", "dashed", "with host time"))
SYSTEM_COLORS = {"mooncake": style.BLUE, "vllm": style.GREY}


def mooncake_figure(data: dict):
    """FAST'25's Figure 1 redrawn by kvlab: the share of requests whose TBT (the mean of their
    slowest 10% of gaps) stays under each limit, Mooncake against vLLM, with step times
    from kernels alone and with the fitted host time; the three limits marked. `data` from
    kvlab.book.sim_runs.mooncake_regime."""
    from bokeh.models import Span

    fig = _share_chart(
        f"Effective request capacity: {data['trace']}",
        "TBT limit (mean of the slowest 10% of gaps), log scale",
        "share of requests",
        height=320,
    )
    renderers = []
    for col, dash, how in STEP_MODELS:
        if col not in data:
            continue
        for name, row in data[col].items():
            tbt = np.asarray(row["tbt_s"], dtype=float)
            tbt = tbt[tbt > 0]
            if not tbt.size:
                continue
            share = np.arange(1, tbt.size + 1) / data["requests"]
            color = SYSTEM_COLORS.get(name, style.ORANGE)
            label = f"{name}, {how}"
            renderers.append(style.line(fig, tbt, share, None, color, dash=dash, legend=label))
    for limit in data["tbt_slos_s"]:
        fig.add_layout(
            Span(
                location=limit,
                dimension="height",
                line_color=style.VERMILION,
                line_dash="dotted",
                line_width=1.5,
            )
        )
    return style.finish(fig, x="seconds", y="percent", legend="bottom_right")

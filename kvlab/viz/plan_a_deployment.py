"""The capstone chapter's figure and panel: `kvlab plan`'s searches, computed when the book
is built, read back in the page.

- `front_figure(terms)`: the best capacity per GPU of each architecture against the TBT
  target, one plot per model (the chapter's SLO front).
- `plan_panel(terms)`: pick a model, a kind of traffic and a TBT target; every design's
  capacity per GPU, ranked, the front of that model and traffic, and the best design,
  the runner-up and what binds. Its JavaScript twin (kvlab/viz/js/plan_a_deployment.js) ranks
  the designs as kvlab.plan.rank does and takes each architecture's best per target.

Both read `terms` (`plan_terms`): per search, each design's row as the planner's table
has it, in the planner's rank order; the page holds nothing else, so it stays offline.
"""

from __future__ import annotations

from .. import fmt
from . import style
from .controls import slider
from .panel import Control, Panel

ARCHS = ("colocated", "disaggregated", "kv-centric")
ARCH_LABELS = {
    "colocated": "colocated",
    "disaggregated": "disaggregated",
    "kv-centric": "KV-centric",
}
ARCH_COLORS = style.ARCH_COLORS
TRAFFIC_LABELS = {
    "cold": "conversation, cold start",
    "warm": "conversation, warmed up",
    "long": "long prompts (generated)",
}
#: A design row: the columns `plan_terms` keeps of each planner row, in this order.
ROW = (
    "key",
    "arch",
    "tensor_parallel",
    "prefill_workers",
    "decode_workers",
    "scheduler",
    "chunk_tokens",
    "gpus",
    "requests_per_s_per_gpu",
    "saturation_requests_per_s",
    "ttft_s",
    "tbt_s",
    "binds",
)
BINDS_LABELS = {
    "ttft": "TTFT",
    "tbt": "TBT",
    "ttft and tbt": "TTFT and TBT",
    None: "nothing: it met the SLOs at every rate tried",
}
NONE_MEETS = "no design meets the SLOs"


def search_id(model: str, traffic: str, tbt_s: float) -> str:
    """How terms file a search: 'llama-3.1-8b|cold|0.03'."""
    return f"{model}|{traffic}|{tbt_s:g}"


def plan_terms(searches: dict, models: dict, traffic, targets_s, ttft_s: float) -> dict:
    """The terms both faces read. `searches`: {(model, traffic, tbt_s): plan dict}; `models`:
    {model: option label}."""
    table = {}
    for (model, kind, tbt_s), out in searches.items():
        rows = []
        for r in out["designs"]:
            lim = r.get("limit")
            row = {**r, "binds": lim["binds"] if lim else None}
            rows.append([row[c] for c in ROW])
        table[search_id(model, kind, tbt_s)] = {"rows": rows, "pruned": len(out["pruned"])}
    return {
        "models": list(models),
        "model_labels": [models[m] for m in models],
        "traffic": list(traffic),
        "targets_s": list(targets_s),
        "ttft_s": ttft_s,
        "archs": list(ARCHS),
        "arch_labels": [ARCH_LABELS[a] for a in ARCHS],
        "arch_colors": [ARCH_COLORS[a] for a in ARCHS],
        "binds_labels": [[k, v] for k, v in BINDS_LABELS.items()],
        "none_meets": NONE_MEETS,
        "searches": table,
    }


def describe(arch, tp, prefill, decode, scheduler, chunk) -> str:
    """A design in words: 'colocated, 8 × TP1, prefill-first', 'KV-centric, 4P:4D × TP1'
    (kvlab/viz/js/plan_a_deployment.js describe is the twin)."""
    if arch == "colocated":
        how = (
            f"chunked ({fmt.fixed(chunk, 0)} tokens per step)"
            if scheduler == "chunked"
            else scheduler
        )
        return f"colocated, {prefill} × TP{tp}, {how}"
    return f"{ARCH_LABELS[arch]}, {prefill}P:{decode}D × TP{tp}"


def _rows(terms: dict, model: str, traffic: str, tbt_s: float) -> tuple[list[dict], int]:
    found = terms["searches"][search_id(model, traffic, tbt_s)]
    return [dict(zip(ROW, row, strict=True)) for row in found["rows"]], found["pruned"]


def front(terms: dict, model: str, traffic: str) -> dict:
    """Each architecture's best capacity per GPU at each TBT target (0 where none of its
    designs meets the SLOs): {"target_ms": [...], arch: [...]}."""
    out = {"target_ms": [1e3 * t for t in terms["targets_s"]]}
    for arch in terms["archs"]:
        best = []
        for tbt_s in terms["targets_s"]:
            rows, _ = _rows(terms, model, traffic, tbt_s)
            best.append(
                max([r["requests_per_s_per_gpu"] for r in rows if r["arch"] == arch], default=0.0)
            )
        out[arch.replace("-", "_")] = best
    return out


def plan_state(terms: dict, state: dict) -> dict:
    """The panel's Python face (kvlab/viz/js/plan_a_deployment.js is the browser's)."""
    rows, pruned = _rows(terms, state["model"], state["traffic"], state["tbt_s"])
    labels = dict(zip(terms["archs"], terms["arch_labels"], strict=True))
    colors = dict(zip(terms["archs"], terms["arch_colors"], strict=True))
    binds = {k: v for k, v in terms["binds_labels"]}
    words = [
        describe(
            r["arch"],
            r["tensor_parallel"],
            r["prefill_workers"],
            r["decode_workers"],
            r["scheduler"],
            r["chunk_tokens"],
        )
        for r in rows
    ]
    bars = {
        "rank": list(range(1, len(rows) + 1)),
        "per_gpu": [r["requests_per_s_per_gpu"] for r in rows],
        "design": words,
        "arch": [labels[r["arch"]] for r in rows],
        "color": [colors[r["arch"]] for r in rows],
        "ttft_s": [r["ttft_s"] for r in rows],
        "tbt_s": [r["tbt_s"] for r in rows],
    }
    best, second = rows[0], rows[1] if len(rows) > 1 else None
    met = best["requests_per_s_per_gpu"] > 0
    gap = 0.0
    if met and second is not None:
        gap = 1.0 - second["requests_per_s_per_gpu"] / best["requests_per_s_per_gpu"]
    line = front(terms, state["model"], state["traffic"])
    i = terms["targets_s"].index(state["tbt_s"])
    here = {
        "target_ms": [line["target_ms"][i]],
        "per_gpu": [best["requests_per_s_per_gpu"]],
    }
    return {
        "sources": {"bars": bars, "front": line, "here": here},
        "values": {
            "best": words[0] if met else terms["none_meets"],
            "best_per_gpu": best["requests_per_s_per_gpu"],
            "best_requests_per_s": best["saturation_requests_per_s"],
            "gpus": best["gpus"],
            "best_ttft_s": best["ttft_s"],
            "best_tbt_s": best["tbt_s"],
            "binds": binds[best["binds"]] if met else terms["none_meets"],
            "runner_up": words[1] if second is not None else "-",
            "gap": gap,
            "designs": len(rows),
            "pruned": pruned,
        },
    }


PLAN_READOUT = (
    ("best", "Best design", "text"),
    ("best_per_gpu", "Its requests/s per GPU", "rate"),
    ("best_requests_per_s", "Its requests/s in all", "rate"),
    ("gpus", "GPUs it uses", "count"),
    ("best_ttft_s", "Its TTFT at saturation", "seconds"),
    ("best_tbt_s", "Its TBT at saturation", "seconds"),
    ("binds", "What binds just past its saturation", "text"),
    ("runner_up", "Runner-up", "text"),
    ("gap", "Runner-up's requests/s per GPU, below the best", "percent"),
    ("designs", "Designs simulated", "count"),
    ("pruned", "Designs pruned before simulating (memory)", "count"),
)


def _bars_figure(src):
    fig = style.new_figure(
        "Every design, ranked by requests/s per GPU",
        "rank",
        "requests/s per GPU at saturation",
        y_range=style.from_zero(),
        height=300,
    )
    bars = fig.vbar(
        x="rank",
        top="per_gpu",
        width=0.75,
        color="color",
        legend_field="arch",
        source=src["bars"],
    )
    fig.xaxis.ticker.desired_num_ticks = 12
    fig.xaxis.minor_tick_line_color = None
    tips = [
        ("design", "@design"),
        ("requests/s per GPU", "@per_gpu{0.000}"),
        ("TTFT at saturation", "@ttft_s{0.00} s"),
        ("TBT at saturation", "@tbt_s{0.000} s"),
    ]
    return style.finish(fig, tips=tips, on=[bars])


def _front_plot(title: str, source, here=None, height: int = 300):
    fig = style.new_figure(
        title,
        "TBT target (ms)",
        "best requests/s per GPU",
        y_range=style.from_zero(),
        height=height,
    )
    renderers = []
    for arch in ARCHS:
        column = arch.replace("-", "_")
        color = ARCH_COLORS[arch]
        label = ARCH_LABELS[arch]
        renderers.append(style.line(fig, "target_ms", column, source, color, legend=label))
        fig.scatter("target_ms", column, source=source, color=color, size=7)
    if here is not None:
        fig.scatter(
            "target_ms",
            "per_gpu",
            source=here,
            size=16,
            marker="circle",
            fill_alpha=0,
            line_color=style.VERMILION,
            line_width=2.5,
            legend_label="best at this target",
        )
    tips = [("TBT target", "@target_ms{0} ms")] + [
        (ARCH_LABELS[a], f"@{a.replace('-', '_')}{{0.000}}") for a in ARCHS
    ]
    return style.finish(fig, legend="top_left", tips=tips, on=renderers[:1], mode="vline")


def plan_panel(terms: dict, default_model: str, default_traffic: str, default_tbt_s: float):
    """The searches, one at a time (module docstring)."""
    models = dict(zip(terms["models"], terms["model_labels"], strict=True))
    traffic = tuple(terms["traffic"])
    targets = tuple(terms["targets_s"])
    controls = (
        Control(
            "model",
            "Model and GPUs on offer",
            tuple(models),
            default_model,
            option_labels=tuple(models.values()),
        ),
        Control(
            "traffic",
            "Traffic",
            traffic,
            default_traffic,
            option_labels=tuple(TRAFFIC_LABELS[t] for t in traffic),
        ),
        slider(
            "tbt_s",
            "TBT target",
            targets,
            default_tbt_s,
            option_labels=tuple(f"{fmt.sig(1e3 * t, 3)} ms" for t in targets),
        ),
    )

    def figures(src):
        from bokeh.layouts import column

        return column(
            _bars_figure(src),
            _front_plot(
                "Best of each architecture against the TBT target", src["front"], src["here"]
            ),
        )

    return Panel(
        "plan",
        controls,
        lambda state: plan_state(terms, state),
        figures,
        "plan",
        terms,
        PLAN_READOUT,
    )


def front_figure(terms: dict, traffic: str = "cold"):
    """Each model's SLO front on one kind of traffic, side by side."""
    from bokeh.layouts import row
    from bokeh.models import ColumnDataSource

    plots = []
    for model, label in zip(terms["models"], terms["model_labels"], strict=True):
        source = ColumnDataSource(front(terms, model, traffic))
        plots.append(_front_plot(label, source, height=280))
    return row(*plots)

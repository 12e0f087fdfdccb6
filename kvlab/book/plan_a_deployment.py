"""The capstone chapter, "Plan a deployment": `kvlab plan` on the conversation trace for
Llama 3.1 8B and 70B (the 70B across tensor-parallel degrees), the best capacity per GPU
against the TBT target, the best design per SLO, and what a warm cache and long prompts
change. The searches run once per book build (kvlab/book/plan_searches.py keeps them on
disk for the other edition); this module only reads them."""

from __future__ import annotations

import functools
import math

import numpy as np

from .. import cost, fmt, labs
from ..deployment import Deployment
from ..hardware import USABLE_MEMORY_FRACTION, get_device
from ..models import get_model
from ..sim.costs import LedgerCost
from ..traces import load_trace
from ..viz.i18n import t
from . import plan_searches as ps
from .lang import join, pick

MODEL_8B, MODEL_70B = ps.MODELS
SEARCH_CLI_REQUESTS = 1000  # the full search's requests per slice (the CLI's default)
SEARCH_CLI_SLICES = 3


def search(model: str, traffic: str = "cold", tbt_s: float = ps.TBT_SLO_S, ttft_s=None) -> dict:
    """One of the chapter's searches (a `kvlab plan --json` dict)."""
    key = ps.Search(model, traffic, ps.TTFT_SLO_S if ttft_s is None else ttft_s, tbt_s)
    return ps.searches()[key]


def model_label(model: str) -> str:
    """'Llama 3.1 8B on 8 × NVIDIA H100 SXM5 80GB'."""
    ((hardware, count),) = ps.offers(model).items()
    return f"{get_model(model).display_name} on {count} × {get_device(hardware).display_name}"


@functools.cache
def terms() -> dict:
    from ..viz.plan_a_deployment import plan_terms  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    found = {
        (s.model, s.traffic, s.tbt_s): out
        for s, out in ps.searches().items()
        if s.ttft_s == ps.TTFT_SLO_S
    }
    return plan_terms(
        found,
        {m: model_label(m) for m in ps.MODELS},
        ps.TRAFFIC,
        ps.TBT_TARGETS_S,
        ps.TTFT_SLO_S,
    )


def panel():
    from ..viz.plan_a_deployment import plan_panel  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    return plan_panel(terms(), MODEL_8B, "cold", ps.TBT_SLO_S)


def front_figure():
    from ..viz.plan_a_deployment import front_figure as figure  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    return figure(terms(), "cold")


def words(row: dict) -> str:
    """A design in the edition's words."""
    from ..viz.plan_a_deployment import describe  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    return t(
        describe(
            row["arch"],
            row["tensor_parallel"],
            row["prefill_workers"],
            row["decode_workers"],
            row["scheduler"],
            row["chunk_tokens"],
        )
    )


def best_of(out: dict, **match) -> dict | None:
    """The best-ranked design of a search whose fields equal `match` (None if none)."""
    return next((r for r in out["designs"] if all(r[k] == v for k, v in match.items())), None)


def binds_words(row: dict) -> str:
    from ..viz.plan_a_deployment import BINDS_LABELS  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    lim = row.get("limit")
    return t(BINDS_LABELS[lim["binds"] if lim else None])


def per_gpu(row: dict) -> str:
    return fmt.sig(row["requests_per_s_per_gpu"], 3)


def burst_share(trace) -> float:
    """Share of the measured requests that arrive at the same instant as the one before."""
    a = np.asarray(trace.arrival_s[trace.lead_in :])
    return float(np.mean(np.diff(a) == 0))


def prefill_speedup(model: str, hardware: str, tokens: float, low: int, high: int) -> float:
    """How many times faster a prompt of `tokens` prefills at TP `high` than at TP `low`
    (the ledger's prefill, all-reduces included)."""

    def seconds(tp):
        c = LedgerCost(Deployment(model, hardware, tensor_parallel=tp), max_batch=256)
        return float(np.asarray(c.prefill_times_s(tokens, 0.0)[0]))

    return seconds(low) / seconds(high)


def kv_room_bytes(model: str, hardware: str, tp: int) -> float:
    """HBM per GPU left for KV once the weights' share is in (kvlab.cost.memory_fit's)."""
    d = Deployment(model, hardware, tensor_parallel=tp)
    return get_device(hardware).capacity_bytes * USABLE_MEMORY_FRACTION - d.weight_bytes


def winners(model: str, traffic: str = "cold") -> list[tuple[float, dict]]:
    """(TBT target, best design) at each target, tightest first."""
    return [(tbt, search(model, traffic, tbt)["best"]) for tbt in ps.TBT_TARGETS_S]


def winners_sentence(model: str, traffic: str = "cold") -> str:
    """'at 15 ms, A; at 20 ms, B; at 30 ms, C' (targets with the same winner grouped)."""
    groups: list[list] = []
    for tbt, best in winners(model, traffic):
        label = (
            words(best) if best["saturation_requests_per_s"] > 0 else t("no design meets the SLOs")
        )
        if groups and groups[-1][1] == label:
            groups[-1][0].append(tbt)
        else:
            groups.append([[tbt], label])
    parts = []
    for tbts, label in groups:
        targets = join([fmt.seconds(x) for x in tbts])
        parts.append(pick(f"at {targets}, {label}", f"{targets} 时为 {label}"))
    return pick("; ".join(parts), "；".join(parts))


def full_search_command(model: str) -> str:
    """The chapter's search for `model` at full size, as a shell command."""
    ((hardware, count),) = ps.offers(model).items()
    tps = ",".join(str(x) for x in ps.OFFERS[model][1])
    trace = ps.conversation()
    return (
        f"kvlab plan {trace} --model {model} --gpus {hardware}:{count} --tensor-parallel {tps} "
        f"--ttft-slo {ps.TTFT_SLO_S:g} --tbt-slo {ps.TBT_SLO_S:g} --tbt-stat {ps.TBT_STAT} "
        f"--start {ps.START_S:g} --requests {SEARCH_CLI_REQUESTS} --slices {SEARCH_CLI_SLICES} "
        f"--warmup {ps.WARMUP_S:g}"
    )


def search_seconds() -> float:
    """Wall seconds the chapter's searches took, each in its own process, summed."""
    return sum(out["wall_s"] for out in ps.searches().values())


def simulations() -> int:
    return sum(r["simulations"] for out in ps.searches().values() for r in out["designs"])


def numbers() -> dict[str, str]:
    cold8, cold70 = search(MODEL_8B), search(MODEL_70B)
    w8 = ps.workload("cold").traces()[0]
    warm = ps.workload("warm").traces()[0]
    long = load_trace(ps.LONG_PROMPTS)
    out = {
        "trace_label": t(w8.label.split(" [")[0]),
        "requests": fmt.fixed(ps.REQUESTS, 0),
        "start_min": fmt.fixed(ps.START_S / 60, 0),
        "mean_prompt": fmt.fixed(float(np.mean(w8.input_tokens)), 0),
        "median_prompt": fmt.fixed(float(np.median(w8.input_tokens)), 0),
        "mean_output": fmt.fixed(float(np.mean(w8.output_tokens)), 0),
        "burst_share": fmt.percent(burst_share(w8)),
        "ttft_slo": fmt.seconds(ps.TTFT_SLO_S),
        "tbt_stat": ps.TBT_STAT,
        "tbt_slo": fmt.seconds(ps.TBT_SLO_S),
        "tbt_targets": join([fmt.seconds(x) for x in ps.TBT_TARGETS_S]),
        "attainment": fmt.percent(ps.ATTAINMENT),
        "model_8b": get_model(MODEL_8B).display_name,
        "model_70b": get_model(MODEL_70B).display_name,
        "gpus_8b": t(model_label(MODEL_8B).split(" on ")[1]),
        "gpus_70b": t(model_label(MODEL_70B).split(" on ")[1]),
        "tp_70b": join([f"TP{x}" for x in ps.OFFERS[MODEL_70B][1]]),
        "tp_small": f"TP{ps.OFFERS[MODEL_70B][1][0]}",
        "tp_mid": f"TP{ps.OFFERS[MODEL_70B][1][1]}",
        "tp_large": f"TP{ps.OFFERS[MODEL_70B][1][2]}",
        "searches": fmt.fixed(len(ps.searches()), 0),
        "simulations": fmt.fixed(simulations(), 0),
        "search_minutes": fmt.sig(search_seconds() / 60, 2),
        "full_requests": fmt.fixed(SEARCH_CLI_REQUESTS, 0),
        "full_slices": fmt.fixed(SEARCH_CLI_SLICES, 0),
    }
    out.update(_one_search(cold8))
    out.update(_seventy(cold70))
    out.update(_front())
    out.update(_warm(warm))
    out.update(_long(long, w8))
    out.update(_slo_table())
    out.update(_lab())
    return out


def _slo_table() -> dict:
    """The best design and its requests/s per GPU per model at each TBT target (the
    chapter's table of the best design per SLO)."""
    out = {}
    for i, tbt in enumerate(ps.TBT_TARGETS_S):
        out[f"slo_{i}_tbt"] = fmt.seconds(tbt)
        for name, model in (("8b", MODEL_8B), ("70b", MODEL_70B)):
            best = search(model, tbt_s=tbt)["best"]
            met = best["saturation_requests_per_s"] > 0
            out[f"slo_{i}_{name}"] = words(best) if met else t("no design meets the SLOs")
            out[f"slo_{i}_{name}_per_gpu"] = per_gpu(best)
    return out


def _lab() -> dict:
    """What the lab's question states (its search is kvlab.labs.lab_plan)."""

    return {
        "lab_model": get_model(labs.LAB_PLAN_MODEL).display_name,
        "lab_gpus": f"{labs.LAB_PLAN_GPUS} × {get_device(labs.LAB_PLAN_HARDWARE).display_name}",
        "lab_tp": join([f"TP{x}" for x in labs.LAB_PLAN_TP]),
        "lab_instances": join([f"{labs.LAB_PLAN_GPUS // x} × TP{x}" for x in labs.LAB_PLAN_TP]),
        "lab_ttft": fmt.seconds(labs.LAB_PLAN_TTFT_S),
        "lab_tbt": fmt.seconds(labs.LAB_PLAN_TBT_S),
        "lab_requests": fmt.fixed(labs.LAB_PLAN_REQUESTS, 0),
        "lab_room_tp2": fmt.si(
            kv_room_bytes(labs.LAB_PLAN_MODEL, labs.LAB_PLAN_HARDWARE, labs.LAB_PLAN_TP[0]), "B"
        ),
        **{f"lab_tp_{c}": f"TP{x}" for c, x in zip("abc", labs.LAB_PLAN_TP, strict=True)},
    }


def _one_search(out: dict) -> dict:
    rows = [r for r in out["designs"] if r["saturation_requests_per_s"] > 0]
    best, second, worst = rows[0], rows[1], rows[-1]
    top = best["requests_per_s_per_gpu"]
    return {
        "designs_8b": fmt.fixed(len(out["designs"]), 0),
        "best_8b": words(best),
        "best_8b_per_gpu": per_gpu(best),
        "best_8b_rate": fmt.sig(best["saturation_requests_per_s"], 3),
        "best_8b_gpus": fmt.fixed(best["gpus"], 0),
        "best_8b_ttft": fmt.seconds(best["ttft_s"]),
        "best_8b_tbt": fmt.seconds(best["tbt_s"]),
        "best_8b_binds": binds_words(best),
        "second_8b": words(second),
        "second_8b_per_gpu": per_gpu(second),
        "gap_8b": fmt.percent(1 - second["requests_per_s_per_gpu"] / top),
        "worst_8b": words(worst),
        "worst_8b_per_gpu": per_gpu(worst),
        "worst_8b_times": fmt.sig(top / worst["requests_per_s_per_gpu"], 2),
    }


def _seventy(out: dict) -> dict:
    smallest = ps.OFFERS[MODEL_70B][1][0]
    tp2 = [p for p in out["pruned"] if p["tensor_parallel"] == smallest]
    ((hardware, _),) = ps.offers(MODEL_70B).items()
    trace = ps.workload("cold").traces()[0]
    tokens = trace.input_tokens + trace.output_tokens
    d2 = Deployment(MODEL_70B, hardware, tensor_parallel=smallest)
    fits = np.asarray(cost.memory_fit(d2, 1, tokens).fits, dtype=bool)
    best = out["best"]
    _, mid, large = ps.OFFERS[MODEL_70B][1]
    other_tp = large if best["tensor_parallel"] != large else mid
    other = best_of(out, tensor_parallel=other_tp)
    tight = search(MODEL_70B, ttft_s=ps.TIGHT_TTFT_SLO_S)
    median = float(np.median(trace.input_tokens))
    eight = search(MODEL_8B)["best"]
    return {
        "designs_70b": fmt.fixed(len(out["designs"]) + len(out["pruned"]), 0),
        "pruned_70b": fmt.fixed(len(out["pruned"]), 0),
        "pruned_tp2_70b": fmt.fixed(len(tp2), 0),
        "weights_70b": fmt.si(cost.weight_bytes(MODEL_70B), "B"),
        "tp2_room": fmt.si(kv_room_bytes(MODEL_70B, hardware, smallest), "B"),
        "tp2_too_large": fmt.percent(1 - float(fits.mean())),
        "best_70b": words(best),
        "best_70b_tp": f"TP{best['tensor_parallel']}",
        "best_70b_per_gpu": per_gpu(best),
        "best_70b_ttft": fmt.seconds(best["ttft_s"]),
        "other_70b": words(other),
        "other_70b_tp": f"TP{other_tp}",
        "other_70b_per_gpu": per_gpu(other),
        "other_70b_gap": fmt.percent(
            abs(1 - other["requests_per_s_per_gpu"] / best["requests_per_s_per_gpu"])
        ),
        "tp8_speedup": fmt.sig(
            prefill_speedup(MODEL_70B, hardware, median, *ps.OFFERS[MODEL_70B][1][1:]), 2
        ),
        "times_8b_over_70b": fmt.sig(
            eight["requests_per_s_per_gpu"] / best["requests_per_s_per_gpu"], 2
        ),
        "tight_ttft": fmt.seconds(ps.TIGHT_TTFT_SLO_S),
        "tight_70b": words(tight["best"]),
        "tight_70b_per_gpu": per_gpu(tight["best"]),
        "tight_70b_loss": fmt.percent(
            1 - tight["best"]["requests_per_s_per_gpu"] / best["requests_per_s_per_gpu"]
        ),
    }


def _front() -> dict:
    out = {}
    for name, model in (("8b", MODEL_8B), ("70b", MODEL_70B)):
        won = winners(model)
        tight, loose = won[0][1], won[-1][1]
        out[f"front_{name}"] = winners_sentence(model)
        out[f"front_{name}_tight_per_gpu"] = per_gpu(tight)
        out[f"front_{name}_loose_per_gpu"] = per_gpu(loose)
        out[f"front_{name}_tight_share"] = fmt.percent(
            tight["requests_per_s_per_gpu"] / loose["requests_per_s_per_gpu"]
        )
    out["tight_target"] = fmt.seconds(ps.TBT_TARGETS_S[0])
    return out


def _warm(trace) -> dict:
    cold, warm = search(MODEL_8B), search(MODEL_8B, "warm")
    out = {
        "warmup": fmt.seconds(ps.WARMUP_S),
        "warmup_requests": fmt.fixed(trace.lead_in, 0),
        "best_warm_8b": words(warm["best"]),
        "best_warm_8b_per_gpu": per_gpu(warm["best"]),
    }
    for arch in ("colocated", "kv-centric"):
        a, b = best_of(cold, arch=arch), best_of(warm, arch=arch)
        name = arch.replace("-", "_")
        out.update(
            {
                f"warm_{name}": words(b),
                f"warm_{name}_hit_cold": fmt.percent(a["prefix_hit_ratio"]),
                f"warm_{name}_hit_warm": fmt.percent(b["prefix_hit_ratio"]),
                f"warm_{name}_cold": per_gpu(a),
                f"warm_{name}_warm": per_gpu(b),
                f"warm_{name}_loss": fmt.percent(
                    1 - b["requests_per_s_per_gpu"] / a["requests_per_s_per_gpu"]
                ),
            }
        )
    gap = {}
    for kind, out_ in (("cold", cold), ("warm", warm)):
        c, k = best_of(out_, arch="colocated"), best_of(out_, arch="kv-centric")
        gap[kind] = 1 - k["requests_per_s_per_gpu"] / c["requests_per_s_per_gpu"]
    out["warm_gap_cold"], out["warm_gap_warm"] = fmt.percent(gap["cold"]), fmt.percent(gap["warm"])
    return out


def _long(trace, conversation) -> dict:
    out = {
        "long_mean_prompt": fmt.fixed(float(np.mean(trace.input_tokens)), 0),
        "long_times_prompt": fmt.sig(
            float(np.mean(trace.input_tokens)) / float(np.mean(conversation.input_tokens)), 2
        ),
        "long_mean_output": fmt.fixed(float(np.mean(trace.output_tokens)), 0),
    }
    for name, model in (("8b", MODEL_8B), ("70b", MODEL_70B)):
        cold, long = search(model)["best"], search(model, "long")["best"]
        out.update(
            {
                f"long_{name}": words(long),
                f"long_{name}_per_gpu": per_gpu(long),
                f"long_{name}_times": fmt.sig(
                    cold["requests_per_s_per_gpu"] / long["requests_per_s_per_gpu"], 2
                ),
            }
        )
    return out


def is_finite(x) -> bool:
    return x is not None and math.isfinite(x)

"""Chapter 4, "Mooncake: the KV cache at the centre of scheduling": three designs on
one trace, their capacity as the load rises (SLO attainment and goodput), a cluster sweep,
bytes against the critical path, a global pool, a timeline and the remote-KV disaster, all
simulated when the book is built."""

from __future__ import annotations

import functools

import numpy as np

from .. import fmt
from ..hardware import get_device, get_tier
from ..models import get_model
from ..sim import SimConfig
from ..viz.i18n import t
from . import sim_runs
from .lang import pick

#: Glue-key stems of the architectures and the critical-path variants.
ARCH_KEYS = {"colocated": "colocated", "disaggregated": "disaggregated", "kv-centric": "kv_centric"}
VARIANT_KEYS = {
    "disaggregated": "disaggregated",
    "disaggregated + overlap": "disaggregated_overlap",
    "kv-centric": "kv_centric",
}
#: Seconds of the conversation trace each figure replays.
COMPARE_S, SWEEP_S, CRITICAL_PATH_S = 600.0, 120.0, 300.0
POOLS_S, TIMELINE_S, DISASTER_S = 600.0, 20.0, 60.0


@functools.cache
def comparison() -> dict:
    return sim_runs.compare_architectures(duration_s=COMPARE_S)


@functools.cache
def sweep() -> dict:
    return sim_runs.sweep(duration_s=SWEEP_S)


@functools.cache
def critical_path() -> dict:
    return sim_runs.bytes_vs_critical_path(duration_s=CRITICAL_PATH_S)


@functools.cache
def pools() -> dict:
    return sim_runs.hit_rate_global_vs_local(duration_s=POOLS_S)


@functools.cache
def load() -> dict:
    """The load sweep (kvlab.book.sim_runs.load_sweep): every design at rising rates."""
    return sim_runs.load_sweep()


@functools.cache
def disaster() -> dict:
    return sim_runs.remote_kv_disaster(duration_s=DISASTER_S)


@functools.cache
def timeline(arch: str) -> dict:
    return sim_runs.timeline(arch=arch, duration_s=TIMELINE_S)


def _sweep_point(state: dict) -> dict:
    """One off-grid point of the sweep (live widgets)."""
    return sim_runs.sweep(
        duration_s=SWEEP_S,
        links=(state["link"],),
        pool_bytes_per_node=(state["pool"],),
        prefill_workers=(state["prefill"],),
        decode_workers=(state["decode"],),
    )


@functools.cache
def sweep_panel():
    from ..viz import sim_panels

    return sim_panels.sweep_panel(sweep(), _sweep_point)


@functools.cache
def capacity_panel():
    from ..viz import sim_panels

    return sim_panels.capacity_panel(load(), sim_runs.SATURATION_ATTAINMENT)


@functools.cache
def timeline_panel():
    from ..viz import sim_panels

    return sim_panels.timeline_panel(timeline, TIMELINE_S)


def cdf_figure(metric: str, title: str):
    from ..viz import sim_panels

    return sim_panels.cdf_figure(comparison(), metric, title)


def critical_path_figure():
    from ..viz import sim_panels

    return sim_panels.critical_path_figure(critical_path())


def pools_figure():
    from ..viz import sim_panels

    return sim_panels.global_vs_local_figure(pools())


def _setup() -> str:
    cfg = SimConfig()
    tier = get_tier(cfg.link)
    prefill, decode = cfg.prefill_workers, cfg.decode_workers
    device = get_device(cfg.hardware).display_name
    model = get_model(cfg.model).display_name
    nic = fmt.si(tier.bandwidth_bytes_per_s * 8, "b/s")
    link = f"{cfg.link}, {fmt.si(tier.bandwidth_bytes_per_s, 'B/s')}"
    return pick(
        f"{prefill} prefill and {decode} decode GPUs ({prefill + decode} doing both "
        f"when colocated), {device}, {model}, one {nic} NIC per GPU ({link})",
        f"{prefill} 块预填充 GPU 和 {decode} 块解码 GPU（共置时 {prefill + decode} 块 "
        f"GPU 都兼做两者），{device}，{model}，每块 GPU 一块 {nic} 网卡"
        f"（{link.replace(', ', '，')}）",
    )


def _per_s(rate: str) -> str:
    """A request rate for the prose: '5.5 requests/s' (in Chinese '5.5 请求/秒')."""
    return t(f"{rate} requests/s")


def numbers() -> dict[str, str]:
    cmp = comparison()
    out = {"trace": t(cmp["trace"]), "requests": fmt.fixed(cmp["requests"], 0), "setup": _setup()}
    for arch, s in cmp["summary"].items():
        a = ARCH_KEYS[arch]
        out.update(
            {
                f"{a}_ttft_p50": fmt.seconds(s["ttft_p50_s"]),
                f"{a}_ttft_p90": fmt.seconds(s["ttft_p90_s"]),
                f"{a}_tpot_p50": fmt.seconds(s["tpot_p50_s"]),
                f"{a}_itl_p99": fmt.seconds(s["itl_p99_s"]),
                f"{a}_hits": fmt.percent(s["prefix_hit_ratio"]),
            }
        )
    out.update(sweep_panel().readout_texts())
    cp = critical_path()
    for v in cp["variants"]:
        k = VARIANT_KEYS[v]
        out.update(
            {
                f"cp_{k}_bytes": fmt.si(sum(cp[v]["bytes"].values()), "B"),
                f"cp_{k}_exposed": fmt.seconds(sum(cp[v]["exposed_s"].values())),
                f"cp_{k}_ttft": fmt.seconds(cp[v]["ttft_p50_s"]),
            }
        )
    gl = pools()
    mid = len(gl["pool_bytes_per_node"]) // 2
    out.update(
        {
            "gl_nodes": str(gl["nodes"]),
            "gl_pool": fmt.si(gl["pool_bytes_per_node"][mid], "B"),
            "gl_global": fmt.percent(gl["global_token_hit_ratio"][mid]),
            "gl_local": fmt.percent(gl["local_token_hit_ratio"][mid]),
        }
    )
    out.update(timeline_panel().readout_texts())
    out.update(_disaster_numbers(disaster()))
    out.update(capacity_numbers(load(), capacity_panel()))
    return out


def _ratio(x: float) -> str:
    return f"{fmt.sig(x, 3)}×"


def _disaster_numbers(d: dict) -> dict[str, str]:
    """The remote-KV disaster: TPOT at the trace's load and one request at a time, beside
    the bandwidth ratio and one step's slowdown that bound a single step."""
    return {
        "remote_tpot": fmt.seconds(d["remote"]["tpot_p50_s"]),
        "local_tpot": fmt.seconds(d["local"]["tpot_p50_s"]),
        "disaster_link": d["link"],
        "disaster_trace": t(d["trace"]),
        "disaster_bandwidth_ratio": _ratio(d["bandwidth_ratio"]),
        "disaster_context": fmt.fixed(d["context"], 0),
        "disaster_step_ratio": _ratio(d["step_ratio"]),
        "disaster_tpot_ratio": _ratio(d["tpot_ratio"]),
        "disaster_light_requests": fmt.fixed(d["light_remote"]["requests"], 0),
        "disaster_light_local_tpot": fmt.seconds(d["light_local"]["tpot_p50_s"]),
        "disaster_light_remote_tpot": fmt.seconds(d["light_remote"]["tpot_p50_s"]),
        "disaster_light_tpot_ratio": _ratio(d["light_tpot_ratio"]),
    }


#: The light load at which the chapter compares token gaps (requests/s, on the sweep's grid).
LIGHT_RATE = 3.0


def capacity_numbers(d: dict, panel) -> dict[str, str]:
    """The load sweep's prose numbers: the setting and SLOs, each variant's saturation
    rate, peak goodput and goodput at the highest load, token gaps and prefix hits at a
    light load (keys <figure>_<variant>, the variant's name with "-" and "+" as "_":
    sat_kv_centric_er), and the capacity panel's readout at its default state
    (capacity_<design>_<figure>)."""
    from ..viz.sim_panels import saturation_text

    rates, level = d["rates"], sim_runs.SATURATION_ATTAINMENT
    light = int(np.flatnonzero(rates == LIGHT_RATE)[0]) if LIGHT_RATE in rates else 0
    out = {
        "load_trace": t(d["trace"]),
        "load_requests": fmt.fixed(d["requests"], 0),
        "load_rates": _per_s(f"{fmt.sig(rates[0], 2)}–{fmt.sig(rates[-1], 2)}"),
        "load_top_rate": _per_s(fmt.sig(rates[-1], 2)),
        "load_light_rate": _per_s(fmt.sig(rates[light], 2)),
        "load_ttft_slo": fmt.seconds(d["ttft_slo_s"]),
        "load_tbt_slo": fmt.seconds(d["tbt_slo_s"]),
        "load_tbt_stat": d["tbt_stat"],
        "load_saturation_level": fmt.percent(level, 2),
        "load_ttft_slo_prefills": fmt.fixed(sim_runs.TTFT_SLO_PREFILLS, 0),
        "load_ttft_slo_percentile": f"p{fmt.fixed(sim_runs.TTFT_SLO_PROMPT_PERCENTILE, 0)}",
        "load_default_chunk": fmt.fixed(d["settings"]["colocated"]["chunk_tokens"], 0),
        "load_chunk_mid": fmt.fixed(d["settings"]["colocated-2048"]["chunk_tokens"], 0),
        "load_chunk_small": fmt.fixed(d["settings"]["colocated-512"]["chunk_tokens"], 0),
        "load_gpus": fmt.fixed(
            sum(d["settings"]["disaggregated"][k] for k in ("prefill_workers", "decode_workers")), 0
        ),
    }
    for name in d["variants"]:
        key, m = name.replace("-", "_").replace("+", "_"), d["metrics"][name]
        goodput = m["goodput_requests_per_s"]
        out.update(
            {
                f"sat_{key}": t(saturation_text(*d["saturation"][name], level)),
                f"peak_goodput_{key}": _per_s(fmt.sig(np.nanmax(goodput), 3)),
                f"top_goodput_{key}": _per_s(fmt.sig(goodput[-1], 3)),
                f"top_attainment_{key}": fmt.percent(m["slo_attainment"][-1]),
                f"top_rejected_{key}": fmt.fixed(m["requests_rejected_early"][-1], 0),
                f"light_itl_p99_{key}": fmt.seconds(m["itl_p99_s"][light]),
                f"light_ttft_p90_{key}": fmt.seconds(m["ttft_p90_s"][light]),
                f"light_tpot_p50_{key}": fmt.seconds(m["tpot_p50_s"][light]),
                f"light_hits_{key}": fmt.percent(m["prefix_hit_ratio"][light]),
            }
        )
    out.update(panel.readout_texts("capacity"))
    return out

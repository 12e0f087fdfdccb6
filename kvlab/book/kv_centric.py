"""Chapter 4, "Mooncake: the KV cache at the centre of scheduling": three designs on
one trace, a cluster sweep, bytes against the critical path, a global pool, a timeline
and the remote-KV disaster, all simulated when the book is built."""
from __future__ import annotations

import functools

from .. import cost, fmt
from ..sim import SimConfig
from . import sim_runs

#: Glue-key stems of the architectures and the critical-path variants.
ARCH_KEYS = {"colocated": "colocated", "disaggregated": "disaggregated", "kv-centric": "kv_centric"}
VARIANT_KEYS = {"disaggregated": "disaggregated", "disaggregated + overlap": "disaggregated_overlap",
                "kv-centric": "kv_centric"}
COMPARE_S, SWEEP_S, CRITICAL_PATH_S, POOLS_S, TIMELINE_S, DISASTER_S = 600.0, 180.0, 300.0, 600.0, 20.0, 60.0


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
def timeline(arch: str) -> dict:
    return sim_runs.timeline(arch=arch, duration_s=TIMELINE_S)


def _sweep_point(state: dict) -> dict:
    """One off-grid point of the sweep (live widgets)."""
    return sim_runs.sweep(duration_s=SWEEP_S, links=(state["link"],), pool_bytes_per_node=(state["pool"],),
                          prefill_workers=(state["prefill"],), decode_workers=(state["decode"],))


@functools.cache
def sweep_panel():
    from ..viz import sim_panels

    return sim_panels.sweep_panel(sweep(), _sweep_point)


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
    return (f"{cfg.prefill_workers} prefill and {cfg.decode_workers} decode GPUs "
            f"({cfg.prefill_workers + cfg.decode_workers} doing both when colocated), "
            f"{cost.get_device(cfg.hardware).display_name}, {cost.get_model(cfg.model).display_name}, "
            f"a {cfg.link} network")


def numbers() -> dict[str, str]:
    cmp = comparison()
    out = {"trace": cmp["trace"], "requests": fmt.fixed(cmp["requests"], 0), "setup": _setup()}
    for arch, s in cmp["summary"].items():
        a = ARCH_KEYS[arch]
        out.update({f"{a}_ttft_p50": fmt.seconds(s["ttft_p50_s"]), f"{a}_ttft_p90": fmt.seconds(s["ttft_p90_s"]),
                    f"{a}_tpot_p50": fmt.seconds(s["tpot_p50_s"]), f"{a}_itl_p99": fmt.seconds(s["itl_p99_s"]),
                    f"{a}_hits": fmt.percent(s["prefix_hit_ratio"])})
    out.update(sweep_panel().readout_texts())
    cp = critical_path()
    for v in cp["variants"]:
        k = VARIANT_KEYS[v]
        out.update({f"cp_{k}_bytes": fmt.si(sum(cp[v]["bytes"].values()), "B"),
                    f"cp_{k}_exposed": fmt.seconds(sum(cp[v]["exposed_s"].values())),
                    f"cp_{k}_ttft": fmt.seconds(cp[v]["ttft_p50_s"])})
    gl = pools()
    mid = len(gl["pool_bytes_per_node"]) // 2
    out.update({"gl_nodes": str(gl["nodes"]), "gl_pool": fmt.si(gl["pool_bytes_per_node"][mid], "B"),
                "gl_global": fmt.percent(gl["global_token_hit_ratio"][mid]),
                "gl_local": fmt.percent(gl["local_token_hit_ratio"][mid])})
    out.update(timeline_panel().readout_texts())
    disaster = sim_runs.remote_kv_disaster(duration_s=DISASTER_S)
    out.update({"remote_tpot": fmt.seconds(disaster["remote"]["tpot_p50_s"]),
                "local_tpot": fmt.seconds(disaster["local"]["tpot_p50_s"])})
    return out

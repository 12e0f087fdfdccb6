"""Chapter 4, "Mooncake: the KV cache at the centre of scheduling": what a GPU runs per
iteration (three schedulers, preemption), three designs on one slice, their capacity in a
small cluster and in Mooncake's regime (FAST'25's experiment, kvlab.sim.experiments), a
cluster sweep, bytes against the critical path, a global pool, a timeline and the remote-KV
disaster; every step time from measured kernels, all simulated when the book is built.

The simulations take about a minute; each is stored once per build under _build/
(kvlab.book.run_cache) so that the second edition reads what the first computed. Each
number the prose states names its slice: the first ten minutes of the conversation trace
(the designs, the schedulers, preemption), its first 400 requests at rising rates
(capacity in the small cluster), ten minutes after a ten-minute warm-up at its own rate
(Mooncake's regime)."""

from __future__ import annotations

import functools

import numpy as np

from .. import fmt
from ..cost import decode_step, prefill
from ..deployment import Deployment, KernelTables
from ..hardware import get_device, get_tier
from ..models import get_model
from ..published import mooncake as published
from ..sim import SimConfig, make_cost
from ..sim import experiments as ex
from ..traces import trace_or_generated
from ..viz.i18n import t
from . import run_cache, sim_runs
from .lang import pick

#: The small cluster: kvlab's default SimConfig (2 prefill + 2 decode H100s, Llama 3.1 8B)
#: with every step time from measured kernels (TensorRT-LLM tables).
CONFIG = SimConfig(efficiency=KernelTables())
#: Glue-key stems of the architectures and the critical-path variants.
ARCH_KEYS = {"colocated": "colocated", "disaggregated": "disaggregated", "kv-centric": "kv_centric"}
VARIANT_KEYS = {
    "disaggregated": "disaggregated",
    "disaggregated + overlap": "disaggregated_overlap",
    "kv-centric": "kv_centric",
}
#: Seconds of the conversation trace each figure replays.
COMPARE_S, SWEEP_S, CRITICAL_PATH_S = 600.0, 60.0, 300.0
POOLS_S, TIMELINE_S, DISASTER_S = 600.0, 20.0, 60.0
#: The cluster sweep's grid: links, host memory per node for prefix KV, prefill and decode
#: GPUs (3 x 2 x 3 x 3 points per design that moves KV).
SWEEP_LINKS = ("ethernet-10g", "ib-400g", "nvlink4")
SWEEP_POOLS = (0.0, 400e9)


def _key(*inputs) -> tuple:
    """A run's cache key: the conversation trace that will be used (the real one or its
    generated stand-in) and the inputs."""
    trace = trace_or_generated("conversation")
    return (trace.label, trace.generated, len(trace), CONFIG, *inputs)


def _cached(name: str, compute, *inputs):
    return run_cache.cached(f"ch4-{name}", _key(*inputs), compute)


def _simulated(name: str, run, duration_s: float):
    """`run` over `duration_s` of the trace on the small cluster, stored once per build."""
    return _cached(name, lambda: run(duration_s=duration_s, config=CONFIG), duration_s)


@functools.cache
def comparison() -> dict:
    return _simulated("compare", sim_runs.compare_architectures, COMPARE_S)


@functools.cache
def schedulers() -> dict:
    return _simulated("schedulers", sim_runs.schedulers, COMPARE_S)


@functools.cache
def preemption() -> dict:
    return _simulated("preemption", sim_runs.preemption, COMPARE_S)


def _sweep(**grid) -> dict:
    return sim_runs.sweep(
        duration_s=SWEEP_S,
        config=CONFIG,
        **{"links": SWEEP_LINKS, "pool_bytes_per_node": SWEEP_POOLS, **grid},
    )


@functools.cache
def sweep() -> dict:
    return _cached("sweep", _sweep, SWEEP_S, SWEEP_LINKS, SWEEP_POOLS)


@functools.cache
def critical_path() -> dict:
    return _simulated("critical-path", sim_runs.bytes_vs_critical_path, CRITICAL_PATH_S)


@functools.cache
def pools() -> dict:
    return sim_runs.hit_rate_global_vs_local(duration_s=POOLS_S)


@functools.cache
def load() -> dict:
    """The load sweep (kvlab.book.sim_runs.load_sweep): every design at rising rates."""
    return _cached("load", lambda: sim_runs.load_sweep(config=CONFIG))


@functools.cache
def regime() -> dict:
    """Mooncake's regime: FAST'25's experiment on a window of the trace (sim_runs)."""
    return _cached("mooncake", sim_runs.mooncake_regime)


@functools.cache
def report() -> dict:
    """The arXiv report's 3P+1D against 4M on its two public-data workloads (sim_runs)."""
    return _cached("report", sim_runs.report_runs)


@functools.cache
def disaster() -> dict:
    return _simulated("disaster", sim_runs.remote_kv_disaster, DISASTER_S)


@functools.cache
def timeline(arch: str) -> dict:
    return sim_runs.timeline(arch=arch, duration_s=TIMELINE_S, config=CONFIG)


@functools.cache
def bounds() -> dict:
    """The most any prefix cache could serve of each slice's prompt tokens."""
    return {
        "load": sim_runs.cache_bound(limit=sim_runs.LOAD_REQUESTS),
        "compare": sim_runs.cache_bound(duration_s=COMPARE_S),
        "mooncake": sim_runs.cache_bound(
            start_s=sim_runs.MOONCAKE_START_S,
            duration_s=sim_runs.MOONCAKE_DURATION_S,
            warmup_s=sim_runs.MOONCAKE_WARMUP_S,
        ),
    }


def _sweep_point(state: dict) -> dict:
    """One off-grid point of the sweep (live widgets)."""
    return _sweep(
        links=(state["link"],),
        pool_bytes_per_node=(state["pool"],),
        prefill_workers=(state["prefill"],),
        decode_workers=(state["decode"],),
    )


@functools.cache
def sweep_panel():
    from ..viz import kv_centric as figures  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    return figures.sweep_panel(sweep(), _sweep_point)


@functools.cache
def capacity_panel():
    from ..viz import kv_centric as figures  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    return figures.capacity_panel(load(), sim_runs.SATURATION_ATTAINMENT)


@functools.cache
def timeline_panel():
    from ..viz import kv_centric as figures  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    return figures.timeline_panel(timeline, TIMELINE_S)


def cdf_figure(metric: str, title: str):
    from ..viz import kv_centric as figures  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    return figures.cdf_figure(comparison(), metric, title)


def scheduler_figure():
    from ..viz import kv_centric as figures  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    return figures.scheduler_figure(schedulers())


def mooncake_figure():
    from ..viz import kv_centric as figures  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    return figures.mooncake_figure(regime())


def critical_path_figure():
    from ..viz import kv_centric as figures  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    return figures.critical_path_figure(critical_path())


def pools_figure():
    from ..viz import kv_centric as figures  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    return figures.global_vs_local_figure(pools())


def _setup() -> str:
    cfg = CONFIG
    tier = get_tier(cfg.link)
    prefill_n, decode_n = cfg.prefill_workers, cfg.decode_workers
    device = get_device(cfg.hardware).display_name
    model = get_model(cfg.model).display_name
    nic = fmt.si(tier.bandwidth_bytes_per_s * 8, "b/s")
    link = f"{cfg.link}, {fmt.si(tier.bandwidth_bytes_per_s, 'B/s')}"
    return pick(
        f"{prefill_n} prefill and {decode_n} decode GPUs ({prefill_n + decode_n} doing both "
        f"when colocated), {device}, {model}, one {nic} NIC per GPU ({link})",
        f"{prefill_n} 块预填充 GPU 和 {decode_n} 块解码 GPU（共置时 {prefill_n + decode_n} 块 "
        f"GPU 都兼做两者），{device}，{model}，每块 GPU 一块 {nic} 网卡"
        f"（{link.replace(', ', '，')}）",
    )


def _per_s(rate: str) -> str:
    """A request rate for the prose: '5.5 requests/s' (in Chinese '5.5 请求/秒')."""
    return t(f"{rate} requests/s")


def _ratio(x: float) -> str:
    return f"{fmt.sig(x, 3)}×"


def _gain(x: float) -> str:
    """A capacity gain as the papers print it: '+33%'."""
    return ("+" if x >= 0 else "−") + fmt.percent(abs(x))


def _kernel_source(config: SimConfig) -> str:
    """Where a config's step times come from, for the prose (no 'measured: ' prefix)."""
    return t(make_cost(config.resolved()).source.removeprefix("measured: "))


def _seconds(stem: str, run: dict, *figures: str) -> dict[str, str]:
    """Glue `<stem>_<figure>` for each figure: the run's `<figure>_s`, in seconds."""
    return {f"{stem}_{figure}": fmt.seconds(run[f"{figure}_s"]) for figure in figures}


def numbers() -> dict[str, str]:
    cmp = comparison()
    out = {
        "trace": t(cmp["trace"]),
        "requests": fmt.fixed(cmp["requests"], 0),
        "setup": _setup(),
        "kernel_source": _kernel_source(CONFIG),
    }
    for arch, s in cmp["summary"].items():
        a = ARCH_KEYS[arch]
        out.update(_seconds(a, s, "ttft_p50", "ttft_p90", "tpot_p50", "itl_p99"))
        out[f"{a}_hits"] = fmt.percent(s["prefix_hit_ratio"])
    out.update(scheduler_numbers(schedulers()))
    out.update(preemption_numbers(preemption()))
    out.update(sweep_panel().readout_texts())
    out["sweep_trace"] = t(sweep()["trace"])
    cp = critical_path()
    out["cp_trace"] = t(cp["trace"])
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
            "gl_trace": t(gl["trace"]),
            "gl_nodes": str(gl["nodes"]),
            "gl_pool": fmt.si(gl["pool_bytes_per_node"][mid], "B"),
            "gl_global": fmt.percent(gl["global_token_hit_ratio"][mid]),
            "gl_local": fmt.percent(gl["local_token_hit_ratio"][mid]),
        }
    )
    out.update(timeline_panel().readout_texts())
    out["timeline_trace"] = t(timeline("kv-centric")["trace"])
    out.update(_disaster_numbers(disaster()))
    out.update(capacity_numbers(load(), capacity_panel()))
    out.update(regime_numbers(regime(), load(), bounds()))
    out.update(report_numbers(report()))
    out.update(small_fast25_numbers(cmp))
    return out


def small_fast25_numbers(cmp: dict) -> dict[str, str]:
    """FAST'25's yardstick on the small cluster's comparison slice (at its own rate):
    each design's effective request capacity per TBT limit (sm_cap_<design>_<i>) and the
    KV-centric design's gain over colocated (sm_gain_<i>)."""
    caps = cmp["fast25_capacity"]
    out = {}
    for i, limit in enumerate(cmp["fast25_tbt_slos_s"], start=1):
        out[f"sm_slo_{i}"] = fmt.seconds(limit)
        for arch, key in ARCH_KEYS.items():
            out[f"sm_cap_{key}_{i}"] = fmt.percent(caps[arch][i - 1])
        out[f"sm_gain_{i}"] = _gain(caps["kv-centric"][i - 1] / caps["colocated"][i - 1] - 1)
    return out


#: Glue stems of the arXiv report's workloads.
REPORT_KEYS = {"arxiv-summarization": "arxiv", "l-eval": "leval"}


def report_numbers(d: dict) -> dict[str, str]:
    """The arXiv report's comparison: limits, throughputs, gains against the published ones,
    and the share of prompt tokens the pool served (rp_<workload>_<figure>)."""
    out = {}
    for name, r in d.items():
        k = REPORT_KEYS[name]
        tp = r["throughput"]
        out.update(
            {
                f"rp_{k}_ttft_slo": fmt.seconds(r["ttft_slo_s"]),
                f"rp_{k}_tbt_slo": fmt.seconds(r["tbt_slo_s"]),
                f"rp_{k}_mooncake": _per_s(fmt.sig(tp["mooncake-3p1d"], 3)),
                f"rp_{k}_vllm": _per_s(fmt.sig(tp["vllm-4m"], 3)),
                f"rp_{k}_gain": _gain(r["gain"]),
                f"rp_{k}_pub_gain": _gain(r["published_gain"]),
                f"rp_{k}_hits": fmt.percent(r["hits"]["mooncake-3p1d"]),
                f"rp_{k}_low": _per_s(fmt.sig(r["lowest_rate_per_s"], 2)),
            }
        )
    return out


#: Glue stems of the schedulers' runs.
SCHEDULER_KEYS = {name: name.replace("-", "_") for name in sim_runs.SCHEDULER_VARIANTS}


def scheduler_numbers(d: dict) -> dict[str, str]:
    """Each scheduler's run on the comparison slice (sched_<stem>_<figure>), the budgets, and
    chunked prefill's price: what a 512-token budget costs the first token and buys the
    gaps against a 2,048-token one."""
    out = {"sched_trace": t(d["trace"]), "sched_requests": fmt.fixed(d["requests"], 0)}
    for name, s in d["summary"].items():
        k = f"sched_{SCHEDULER_KEYS[name]}"
        out.update(_seconds(k, s, "ttft_p50", "ttft_p90", "itl_p99", "tpot_p50"))
        out.update({f"{k}_worst_{q}": fmt.seconds(s[f"worst_gap_{q}_s"]) for q in ("p50", "p90")})
        out[f"{k}_chunk"] = fmt.fixed(d["chunk_tokens"][name], 0)
    small, mid = d["summary"]["chunked-512"], d["summary"]["chunked-2048"]
    out["chunk_ttft_price"] = _ratio(small["ttft_p90_s"] / mid["ttft_p90_s"])
    out["chunk_gap_gain"] = _ratio(mid["worst_gap_p90_s"] / small["worst_gap_p90_s"])
    return out


def preemption_numbers(d: dict) -> dict[str, str]:
    """The preemption runs: the memory given to the engine, the KV room it leaves, each
    mode's preemptions and what they cost (pre_<figure>)."""
    rec, swap, roomy = d["recompute"], d["swap"], d["roomy"]
    return {
        "pre_memory": fmt.percent(d["memory_fraction"]),
        "pre_roomy_memory": fmt.percent(CONFIG.memory_fraction),
        "pre_room_tokens": fmt.fixed(round(d["kv_room_tokens"], -3), 0),
        "pre_recompute_preemptions": fmt.fixed(rec["preemptions"], 0),
        "pre_swap_preemptions": fmt.fixed(swap["preemptions"], 0),
        "pre_swap_bytes": fmt.si(swap["swapped_bytes"], "B"),
        **_seconds("pre_roomy", roomy, "ttft_p90", "queue_p90"),
        **_seconds("pre_recompute", rec, "ttft_p90", "queue_p90", "e2e_p90"),
        **_seconds("pre_swap", swap, "ttft_p90", "e2e_p90"),
        "pre_refused": fmt.fixed(roomy["requests_completed"] - rec["requests_completed"], 0),
    }


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


def _past_rate(d: dict) -> int:
    """Index of the last rate of the load sweep at which the KV-centric design (without early
    rejection) still meets its SLOs: the prose reads which SLO fails at the next rate."""
    att = d["metrics"]["kv-centric"]["slo_attainment"]
    ok = np.flatnonzero(att >= sim_runs.SATURATION_ATTAINMENT)
    return int(ok[-1]) if ok.size else 0


def capacity_numbers(d: dict, panel) -> dict[str, str]:
    """The load sweep's prose numbers: the setting and SLOs, each variant's saturation
    rate (DistServe's goodput), the rate of good requests at the highest load (keys
    <figure>_<variant>, the variant's name with "-" and "+" as "_": sat_kv_centric_er),
    which SLO the requests miss at the first rate past the KV-centric design's saturation
    (past_<slo>_miss_<design>), and the capacity panel's readout at its default state
    (capacity_<design>_<figure>)."""
    from ..viz.kv_centric import saturation_text  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    rates, level = d["rates"], sim_runs.SATURATION_ATTAINMENT
    b = min(_past_rate(d), len(rates) - 2)
    kv, co = d["metrics"]["kv-centric"], d["metrics"]["colocated"]
    out = {
        "load_trace": t(d["trace"]),
        "load_requests": fmt.fixed(d["requests"], 0),
        "load_rates": _per_s(f"{fmt.sig(rates[0], 2)}–{fmt.sig(rates[-1], 2)}"),
        "load_top_rate": _per_s(fmt.sig(rates[-1], 2)),
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
        "past_rate": _per_s(fmt.sig(rates[b + 1], 2)),
        "past_ttft_miss_kv": fmt.percent(1 - kv["ttft_slo_attainment"][b + 1]),
        "past_tbt_miss_kv": fmt.percent(1 - kv["tbt_slo_attainment"][b + 1]),
        "past_ttft_miss_co": fmt.percent(1 - co["ttft_slo_attainment"][b + 1]),
        "past_tbt_miss_co": fmt.percent(1 - co["tbt_slo_attainment"][b + 1]),
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
                f"load_hits_{key}": fmt.percent(m["prefix_hit_ratio"][b]),
                "load_hits_rate": _per_s(fmt.sig(rates[b], 2)),
            }
        )
    out.update(panel.readout_texts("capacity"))
    return out


def _stall(config: SimConfig, context: int) -> tuple[float, float]:
    """(seconds of a lone prefill of `context` tokens, one decode step at batch 8 and that
    context) on one instance of `config`, from the kernel tables."""
    c = config.resolved()
    d = Deployment(c.model, c.hardware, speed=KernelTables(), tensor_parallel=c.tensor_parallel)
    return prefill(d, context).time_s, decode_step(d, 8, context).step_time_s


def regime_numbers(m: dict, small: dict, bound: dict) -> dict[str, str]:
    """Mooncake's regime (FAST'25's experiment on a window, sim_runs.mooncake_regime) beside
    the small cluster: capacities and gains per TBT limit with kernel step times (mc_k_) and
    with the fitted host time (mc_f_), the published gains (mc_pub_), prefix hits, how long
    a prefill stalls a colocated stream in each regime, and how much any cache could hit in
    each slice."""

    moon = ex.fast25_systems()["mooncake"]
    out = {
        "mc_trace": t(m["trace"]),
        "mc_requests": fmt.fixed(m["requests"], 0),
        "mc_warmup_requests": fmt.fixed(m["warmup_requests"], 0),
        "mc_nodes": fmt.fixed(m["nodes"], 0),
        "mc_prefill_nodes": fmt.fixed(m["prefill_nodes"], 0),
        "mc_decode_nodes": fmt.fixed(m["nodes"] - m["prefill_nodes"], 0),
        "mc_gpus": fmt.fixed(moon.gpus, 0),
        "mc_model": get_model(moon.model).display_name,
        "mc_device": get_device(moon.hardware).display_name,
        "mc_tp": fmt.fixed(moon.tensor_parallel, 0),
        "mc_ttft_slo": fmt.seconds(m["ttft_slo_s"]),
        "mc_pool_tokens": fmt.fixed(published("fast25_testbed")["cache_tokens_per_node"], 0),
        "mc_pool": fmt.si(moon.pool_bytes_per_node, "B"),
        "mc_kernel_source": _kernel_source(moon),
        "mc_context": fmt.fixed(m["context"], 0),
        "mc_prefill": fmt.seconds(m["prefill_s"]),
        "mc_step": fmt.seconds(m["decode_step_s"]),
        "mc_stall_steps": fmt.fixed(m["prefill_s"] / m["decode_step_s"], 0),
        "mc_overhead": fmt.seconds(m["step_overhead_s"]),
        "mc_pub_median": fmt.seconds(m["published"]["mooncake_median_tbt_s"]),
        "mc_k_median": fmt.seconds(m["kernels"]["mooncake"]["median_tbt_s"]),
        "mc_k_vllm_median": fmt.seconds(m["kernels"]["vllm"]["median_tbt_s"]),
        "mc_f_vllm_median": fmt.seconds(m["fitted"]["vllm"]["median_tbt_s"]),
        "mc_hits_mooncake": fmt.percent(m["kernels"]["mooncake"]["prefix_hit_ratio"]),
        "mc_hits_vllm": fmt.percent(m["kernels"]["vllm"]["prefix_hit_ratio"]),
        "mc_prefill_busy": fmt.percent(m["kernels"]["mooncake"]["prefill_busy_share"]),
        "mc_bound": fmt.percent(bound["mooncake"]),
        "load_bound": fmt.percent(bound["load"]),
        "compare_bound": fmt.percent(bound["compare"]),
    }
    for i, limit in enumerate(m["tbt_slos_s"], start=1):
        out[f"mc_slo_{i}"] = fmt.seconds(limit)
        out[f"mc_pub_gain_{i}"] = _gain(m["published"]["gains"][i - 1])
        for col, stem in (("kernels", "k"), ("fitted", "f")):
            rows = m[col]
            out[f"mc_{stem}_gain_{i}"] = _gain(rows["vllm"]["gain"][i - 1])
            for name in ("mooncake", "vllm"):
                out[f"mc_{stem}_cap_{name}_{i}"] = fmt.percent(rows[name]["capacity"][i - 1])
    context = int(np.median(trace_or_generated("conversation").input_tokens))
    small_prefill, small_step = _stall(CONFIG, context)
    big_prefill, big_step = _stall(moon, context)
    out.update(
        {
            "stall_context": fmt.fixed(context, 0),
            "small_prefill": fmt.seconds(small_prefill),
            "small_step": fmt.seconds(small_step),
            "small_stall_steps": fmt.fixed(small_prefill / small_step, 0),
            "big_prefill": fmt.seconds(big_prefill),
            "big_step": fmt.seconds(big_step),
            "big_stall_steps": fmt.fixed(big_prefill / big_step, 0),
        }
    )
    return out


def regime_claims(m: dict, small: dict) -> dict:
    """The comparisons the prose makes, as numbers tests hold it to: KV-centric's gain over
    vLLM in Mooncake's regime at the strictest limit (kernels only and fitted), and its
    saturation rate over colocated's and disaggregated's in the small cluster."""
    sat = {k: v[0] for k, v in small["saturation"].items()}
    return {
        "mooncake_gain_kernels": m["kernels"]["vllm"]["gain"][0],
        "mooncake_gain_fitted": m["fitted"]["vllm"]["gain"][0],
        "small_over_colocated": sat["kv-centric"] / sat["colocated"] - 1,
        "small_over_disaggregated": sat["kv-centric"] / sat["disaggregated"] - 1,
        "small_er_over_disaggregated_er": sat["kv-centric+er"] / sat["disaggregated+er"] - 1,
    }

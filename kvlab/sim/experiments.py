"""Mooncake's published serving experiments, described once as kvlab runs.

Each experiment is a cluster (SimConfigs, one per system the paper compared), a workload
and the paper's yardstick (kvlab/data/published/mooncake.toml holds what was published):

    FAST'25 end to end (section 5.2)   16 nodes per system, LLaMA3-70B at TP8 on 8xA800
        nodes; Mooncake 8P+8D against vLLM 0.5.1 (16 instances) plain, with prefix caching
        and with chunked prefill; the trace at its own timestamps; effective request
        capacity (TTFT <= 30 s, TBT = mean of a request's slowest 10% of gaps <= 100, 200,
        300 ms) and its gain over vLLM: `fast25_systems`, `capacities`.
    FAST'25 global vs local cache (section 5.3.2)   10 prefill nodes, 3M tokens of cache
        each, every output cut to one token: `pool_systems`, `one_token_outputs`.
    arXiv report (section 8.1.1)   Mooncake-[3P+1D] against vLLM-[4M] on ArXiv
        Summarization and L-Eval-like Poisson workloads; the SLOs are 10x the TTFT and 5x the
        TBT seen at the lowest rate, and throughput is the highest rate whose P90 TTFT and
        P90 TBT stay under them: `report_systems`, `report_workload`, `report_slos`,
        `p90_throughput`.

The node: one 8-GPU A800 server is one tensor-parallel instance; its four 200 Gb/s NICs
are 100 Gb/s per GPU (kvlab's link is one NIC per GPU: ib-200g at half its rate), PCIe 4
to host memory; step times from measured kernels (the A800 runs the A100's tables).
`fit_step_overhead` finds the host time per iteration that makes kvlab's Mooncake as slow
between tokens as the published one (kernel tables time only the GPU).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .. import metrics
from ..deployment import KernelTables
from ..errors import KvlabError, check_number
from ..hardware import get_device
from ..published import mooncake
from ..traces.generate import poisson_trace
from .cluster import simulate
from .config import SimConfig

#: One 8xA800 node as one instance (FAST'25 section 5.1; the report's section 8).
A800_NODE = dict(
    model="llama-3.1-70b",  # LLaMA3-70B's shapes (the report's LLaMA2-70B differs in vocabulary)
    hardware="a800-80gb",
    tensor_parallel=8,
    efficiency=KernelTables(),
    link="ib-200g",
    link_efficiency=0.5,  # 4 x 200 Gb/s per 8 GPUs: 100 Gb/s per GPU
    host_link="pcie4-x16",
)
#: vLLM 0.5's token budget with chunked prefill ("512 is the default max_num_batched_tokens
#: for chunked prefill", vLLM docs, Performance and Tuning, v0.5; Apache-2.0).
VLLM_05_CHUNK_TOKENS = 512
#: The TBT statistics of the two papers: FAST'25's per request; the report's P90 over
#: requests of each one's mean gap (its plots are in s/token).
FAST25_TBT_STAT = "slowest10-mean"


def node_config(**overrides) -> SimConfig:
    """A SimConfig of A800 TP8 nodes (A800_NODE) with `overrides`."""
    return SimConfig(**{**A800_NODE, **overrides})


def kv_bytes_per_token(config: SimConfig) -> float:
    """KV bytes of one token over a whole instance (every GPU's share)."""
    c = config.resolved()
    return c.deployment.kv_bytes_per_token * c.tensor_parallel


def cache_bytes(config: SimConfig, tokens: float) -> float:
    """Host memory that holds `tokens` tokens of the instance's KV."""
    return float(tokens) * kv_bytes_per_token(config)


def hbm_cache_bytes(config: SimConfig) -> float:
    """The KV room of one instance: HBM its engine keeps for KV beside the weights, where
    vLLM's prefix cache lives (its cached blocks are the free ones, so kvlab's host-memory
    cache of this size stands in for it: same capacity, loads over PCIe)."""
    c = config.resolved()
    d = c.deployment
    room = get_device(c.hardware).capacity_bytes * c.memory_fraction - d.weight_bytes
    return room * c.tensor_parallel


def fast25_systems(
    nodes: int | None = None, prefill_nodes: int | None = None, **overrides
) -> dict[str, SimConfig]:
    """FAST'25's four systems on `nodes` nodes each (default 16; Mooncake with
    `prefill_nodes` of them prefilling, default 8, the best split of its section 5.5):
    {"mooncake", "vllm", "vllm-prefix-caching", "vllm-chunked-prefill"}."""
    t = mooncake("fast25_testbed")
    nodes = t["nodes_per_system"] if nodes is None else nodes
    if prefill_nodes is None:
        prefill_nodes = max(1, round(nodes * t["best_prefill_nodes"] / t["nodes_per_system"]))
    if not 1 <= prefill_nodes < nodes:
        raise KvlabError(f"Mooncake needs 1 to {nodes - 1} prefill nodes of {nodes}")
    base = node_config(ttft_slo_s=t["ttft_slo_s"], tbt_stat=FAST25_TBT_STAT, **overrides)
    vllm = dict(arch="colocated", prefill_workers=nodes, decode_workers=0, prefix_cache="none")
    return {
        "mooncake": dataclasses.replace(
            base,
            arch="kv-centric",
            prefill_workers=prefill_nodes,
            decode_workers=nodes - prefill_nodes,
            pool_bytes_per_node=cache_bytes(base, t["cache_tokens_per_node"]),
        ),
        "vllm": dataclasses.replace(base, scheduler="prefill-first", **vllm),
        "vllm-prefix-caching": dataclasses.replace(
            base,
            scheduler="prefill-first",
            **{**vllm, "prefix_cache": "local"},
            pool_bytes_per_node=hbm_cache_bytes(base),
        ),
        "vllm-chunked-prefill": dataclasses.replace(
            base, scheduler="chunked", chunk_tokens=VLLM_05_CHUNK_TOKENS, **vllm
        ),
    }


def _measured_records(result) -> np.ndarray:
    rec = result.records[result.measured]
    view = np.zeros(rec.size, dtype=metrics.REQUEST_DTYPE)
    for name in metrics.REQUEST_DTYPE.names:
        view[name] = rec[name]
    return view


def capacities(result, ttft_slo_s: float, tbt_slos_s) -> list[float]:
    """Effective request capacity (FAST'25) of one run's measured requests at each TBT limit."""
    view = _measured_records(result)
    return [metrics.effective_request_capacity(view, ttft_slo_s, t) for t in tbt_slos_s]


def tbt_per_request_s(result, tbt_stat: str = FAST25_TBT_STAT) -> np.ndarray:
    """Each finished measured request's TBT statistic (NaN-free, sorted): a CDF's points."""
    view = _measured_records(result)
    values = view[metrics.TBT_COLUMNS[tbt_stat]]
    return np.sort(values[np.isfinite(values)])


def median_tbt_s(result, tbt_stat: str = FAST25_TBT_STAT) -> float:
    values = tbt_per_request_s(result, tbt_stat)
    return float(np.median(values)) if values.size else math.nan


@dataclasses.dataclass(frozen=True)
class OverheadFit:
    """The host time per iteration that matches a published median TBT, and the run at it."""

    step_overhead_s: float
    median_tbt_s: float
    target_s: float
    runs: int
    result: object = dataclasses.field(repr=False)


def fit_step_overhead(
    trace, config: SimConfig, target_s: float, rel_tol: float = 0.02, max_runs: int = 5
) -> OverheadFit:
    """The host seconds per engine iteration (`SimConfig.step_overhead_s`) at which the
    median per-request TBT of `config` on `trace` is `target_s` (secant steps from the
    config's own overhead; the median grows with the overhead, a little faster than one
    for one as batches grow). If kvlab is already slower than the target, no overhead."""
    check_number("target_s", target_s, maximum=10)
    o0 = config.step_overhead_s
    r0 = simulate(trace, config)
    m0 = median_tbt_s(r0, config.tbt_stat)
    best = (abs(m0 - target_s), o0, m0, r0)
    if m0 >= target_s:
        return OverheadFit(o0, m0, target_s, 1, r0)
    o1, runs = o0 + (target_s - m0), 1
    while runs < max_runs:
        r1 = simulate(trace, dataclasses.replace(config, step_overhead_s=o1))
        m1 = median_tbt_s(r1, config.tbt_stat)
        runs += 1
        if abs(m1 - target_s) < best[0]:
            best = (abs(m1 - target_s), o1, m1, r1)
        if abs(m1 - target_s) <= rel_tol * target_s or m1 == m0:
            break
        o0, m0, o1 = o1, m1, max(0.0, o1 + (target_s - m1) * (o1 - o0) / (m1 - m0))
    _, o, m, r = best
    return OverheadFit(o, m, target_s, runs, r)


def one_token_outputs(trace):
    """The trace with every output cut to one token (FAST'25 section 5.3.2: the prefill
    alone, decode out of the way)."""
    requests = tuple(dataclasses.replace(r, output_tokens=1) for r in trace.requests)
    return dataclasses.replace(trace, name=f"{trace.name}, 1-token outputs", requests=requests)


def pool_systems(prefill_nodes: int | None = None, **overrides) -> dict[str, SimConfig]:
    """FAST'25's cache comparison: `prefill_nodes` (default 10) nodes of 3M tokens of cache
    each, one global pool ("global": Mooncake, requests to the best hit and queue) or
    separate caches with requests sent to the node of the longest match and shortest
    estimated TTFT ("local", the paper's set-up) or to the shortest queue whatever the
    caches hold ("local-least-loaded"); one decode node takes the single output token."""
    t = mooncake("fast25_global_vs_local")
    n = t["prefill_nodes"] if prefill_nodes is None else prefill_nodes
    base = node_config(prefill_workers=n, decode_workers=1, **overrides)
    base = dataclasses.replace(
        base, pool_bytes_per_node=cache_bytes(base, t["cache_tokens_per_node"])
    )
    return {
        "global": dataclasses.replace(base, arch="kv-centric"),
        "local": dataclasses.replace(
            base, arch="disaggregated", prefix_cache="local", prefill_router="cache-aware"
        ),
        "local-least-loaded": dataclasses.replace(
            base, arch="disaggregated", prefix_cache="local", prefill_router="least-loaded"
        ),
    }


def mean_prefill_s(result) -> float:
    """Mean time a measured request's prefill held its instance (prefix load included)."""
    rec = result.records[result.measured]
    span = rec["prefill_end_s"] - rec["prefill_start_s"]
    span = span[np.isfinite(span)]
    return float(span.mean()) if span.size else math.nan


# ------------------------------------------------------------------ the arXiv report
#: The report's public-data workloads as Poisson streams: lengths fixed at the published
#: means (the report gives no spread); L-Eval's long documents shared by many questions
#: (16,384 of 19,019 tokens from one of 20 documents: its ">80%" cache ratio after the first
#: use of each), ArXiv Summarization's unique (Table 2: ~0%).
REPORT_WORKLOADS = {
    "arxiv-summarization": "poisson:rate={rate:g},prompt=8088,output=229,requests={requests},"
    "seed={seed}",
    "l-eval": "poisson:rate={rate:g},prompt=19019,output=72,prefix=16384,prefixes=20,"
    "requests={requests},seed={seed}",
}
REPORT_KEYS = {"arxiv-summarization": "report_arxiv_summarization", "l-eval": "report_l_eval"}


def report_workload(name: str, rate_per_s: float, requests: int = 200, seed: int = 0):
    """One of REPORT_WORKLOADS at a rate (a generated Trace)."""

    if name not in REPORT_WORKLOADS:
        raise KvlabError(f"unknown report workload {name!r}; valid: {', '.join(REPORT_WORKLOADS)}")
    check_number("rate_per_s", rate_per_s, maximum=1e4)
    return poisson_trace(
        REPORT_WORKLOADS[name].format(rate=rate_per_s, requests=requests, seed=seed)
    )


def report_systems(**overrides) -> dict[str, SimConfig]:
    """The report's Mooncake-[3P+1D] (global pool of 3M tokens per node) and vLLM-[4M]
    (four colocated instances, vLLM v0's scheduler, no prefix cache)."""
    base = node_config(**overrides)
    tokens = mooncake("fast25_testbed")["cache_tokens_per_node"]
    return {
        "mooncake-3p1d": dataclasses.replace(
            base,
            arch="kv-centric",
            prefill_workers=3,
            decode_workers=1,
            pool_bytes_per_node=cache_bytes(base, tokens),
        ),
        "vllm-4m": dataclasses.replace(
            base,
            arch="colocated",
            prefill_workers=4,
            decode_workers=0,
            scheduler="prefill-first",
            prefix_cache="none",
        ),
    }


def p90s(summary: dict) -> tuple[float, float]:
    """(P90 TTFT, P90 TBT) of a run summary: the report's yardstick, TBT as each request's
    mean gap (TPOT)."""
    return summary["ttft_p90_s"], summary["tpot_p90_s"]


def report_slos(light: dict) -> tuple[float, float]:
    """The report's limits from the runs at the lowest rate ({system: summary}): 10 x the
    lowest P90 TTFT and 5 x the lowest P90 TBT seen there."""
    t = mooncake("report_testbed")
    ttft = min(p90s(s)[0] for s in light.values())
    tbt = min(p90s(s)[1] for s in light.values())
    return t["ttft_slo_factor"] * ttft, t["tbt_slo_factor"] * tbt


@dataclasses.dataclass(frozen=True)
class Throughput:
    """The highest rate seen to meet both P90 limits, the lowest seen to miss, and runs."""

    rate_per_s: float
    missed_at_per_s: float
    runs: int


def p90_throughput(
    config: SimConfig,
    workload_at,
    ttft_slo_s: float,
    tbt_slo_s: float,
    start_rate_per_s: float,
    rel_tol: float = 0.025,
    max_rate_per_s: float = 1e3,
) -> Throughput:
    """The report's throughput: the highest request rate at which `config` keeps the P90 TTFT
    and P90 TBT of `workload_at(rate)` (a Trace) within their limits; doubled from a rate
    that meets them, then bisected geometrically to `rel_tol`."""
    runs = 0

    def meets(rate: float) -> bool:
        nonlocal runs
        runs += 1
        ttft, tbt = p90s(simulate(workload_at(rate), config).summary())
        return ttft <= ttft_slo_s and tbt <= tbt_slo_s

    lo = start_rate_per_s
    if not meets(lo):
        raise KvlabError(f"{config.arch} misses the P90 limits already at {lo:g} requests/s")
    hi = lo * 2
    while meets(hi):
        lo, hi = hi, hi * 2
        if hi > max_rate_per_s:
            return Throughput(lo, math.inf, runs)
    while hi - lo > rel_tol * hi:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    return Throughput(lo, hi, runs)

"""The simulator runs behind chapters 4 (architectures) and 5 (metrics): plain dicts of
numpy arrays and lists, no plotting library. Each function picks a slice of a trace and
a grid of clusters for one figure and runs kvlab.sim over it.

Every function takes `trace=None` for the real conversation trace when this machine has
it and its generated stand-in otherwise (`trace.label` says which), plus a slice
(`start_s`, `duration_s`) and a base `SimConfig` (or keyword overrides).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

from .. import cost, metrics
from ..cost import kv_bytes_per_token
from ..deployment import Deployment, KernelTables
from ..hardware import get_device, get_tier
from ..prefix.blocks import BlockPrefixCache
from ..prefix.pools import global_vs_local
from ..prompt import served_from_blocks
from ..published import mooncake
from ..sim import ARCHS, SimConfig, make_cost, simulate, trace_at_rate, trace_slice
from ..sim import experiments as ex
from ..sim.network import PURPOSES
from ..tiers import tiered_decode_step
from ..traces import load_trace, trace_or_generated

#: Links the chapter's network slider steps through (commodity Ethernet .. NVLink).
SWEEP_LINKS = ("ethernet-10g", "ib-200g", "ib-400g", "nvlink4")
#: Host DRAM per prefill node for prefix KV: none, some, a lot (a 3-minute slice of the
#: conversation trace holds ~0.9 TB of distinct prefix KV for an 8B model).
SWEEP_POOL_BYTES = (0.0, 100e9, 400e9)
SWEEP_PREFILL_WORKERS = (1, 2, 3)
SWEEP_DECODE_WORKERS = (1, 2, 3)
#: Summary figures stored at every grid point of `sweep`.
SWEEP_KEYS = (
    "ttft_p50_s",
    "ttft_p90_s",
    "tpot_p50_s",
    "itl_p99_s",
    "throughput_tokens_per_s",
    "prefix_hit_ratio",
    "slo_attainment",
    "goodput_tokens_per_s",
    "mean_transfer_exposed_s",
    "bytes_moved",
    "move_exposed_s",
    "move_hidden_s",
)
QUANTILES = np.linspace(0, 100, 101)


def _slice(trace, start_s, duration_s):
    trace = trace_or_generated("conversation") if trace is None else load_trace(trace)
    return trace_slice(trace, start_s, duration_s)


def _config(config, overrides) -> SimConfig:
    config = config or SimConfig()
    return dataclasses.replace(config, **overrides) if overrides else config


#: FAST'25's yardstick (kvlab.metrics.effective_request_capacity): TTFT within 30 s and the
#: mean of a request's slowest tenth of gaps within each limit.
FAST25_TTFT_SLO_S, FAST25_TBT_SLOS_S = 30.0, metrics.MOONCAKE_TBT_SLOS_S


def compare_architectures(
    trace=None,
    start_s: float = 0.0,
    duration_s: float = 600.0,
    config: SimConfig | None = None,
    archs=ARCHS,
    ttft_slo_s=metrics.DEFAULT_TTFT_SLO_S,
    tbt_slo_s=metrics.DEFAULT_TBT_SLO_S,
    **overrides,
) -> dict:
    """The architectures side by side on the same slice and the same GPUs.

    Returns {"trace", "generated", "requests", "archs", "summary": {arch: summary dict},
    "quantiles": percent grid (0..100), "ttft_s" / "tpot_s" / "itl_s": {arch: values at
    those percentiles} (plot-ready CDFs), "slo_curve": {arch: {"tbt_slo_s", "attainment"}},
    "fast25_tbt_slos_s", "fast25_capacity": {arch: FAST'25's effective request capacity at
    each of its TBT limits}}.
    """
    sliced = _slice(trace, start_s, duration_s)
    base = _config(config, overrides)
    out = {
        "trace": sliced.label,
        "generated": sliced.generated,
        "requests": len(sliced),
        "archs": list(archs),
        "summary": {},
        "quantiles": QUANTILES,
        "ttft_s": {},
        "tpot_s": {},
        "itl_s": {},
        "slo_curve": {},
        "fast25_tbt_slos_s": list(FAST25_TBT_SLOS_S),
        "fast25_capacity": {},
    }
    for arch in archs:
        r = simulate(
            sliced,
            dataclasses.replace(base, arch=arch, remote_kv=base.remote_kv and arch != "colocated"),
        )
        out["summary"][arch] = r.summary(ttft_slo_s, tbt_slo_s)
        done = r.records[r.done]
        out["ttft_s"][arch] = _quantiles(done["ttft_s"])
        out["tpot_s"][arch] = _quantiles(done["tpot_s"])
        out["itl_s"][arch] = _quantiles(metrics.itl_s(r.token_times_s, r.token_offsets))
        view = np.zeros(r.records.size, dtype=metrics.REQUEST_DTYPE)
        for name in metrics.REQUEST_DTYPE.names:
            view[name] = r.records[name]
        out["slo_curve"][arch] = metrics.slo_curve(view, ttft_slo_s)
        measured = view[r.measured]
        out["fast25_capacity"][arch] = [
            metrics.effective_request_capacity(measured, FAST25_TTFT_SLO_S, limit)
            for limit in FAST25_TBT_SLOS_S
        ]
    return out


def _quantiles(values) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    return np.percentile(v, QUANTILES) if v.size else np.full(QUANTILES.size, np.nan)


def sweep(  # noqa: PLR0913 - a chapter's run: keyword-only knobs its notebook sets
    trace=None,
    start_s: float = 0.0,
    duration_s: float = 180.0,
    links=SWEEP_LINKS,
    pool_bytes_per_node=SWEEP_POOL_BYTES,
    prefill_workers=SWEEP_PREFILL_WORKERS,
    decode_workers=SWEEP_DECODE_WORKERS,
    archs=ARCHS,
    config: SimConfig | None = None,
    keys=SWEEP_KEYS,
    progress=None,
    **overrides,
) -> dict:
    """Every architecture over a grid of (link, pool size, prefill GPUs, decode GPUs).

    Returns {"trace", "generated", "requests", "links", "link_bandwidth_bytes_per_s",
    "pool_bytes_per_node", "prefill_workers", "decode_workers", "archs", "keys",
    "metrics": {arch: {key: array of shape (links, pools, prefill, decode)}}}; a value is
    NaN where a run completed no request. Colocated runs prefill + decode GPUs that do both
    and moves no KV between GPUs, so its values do not depend on the link (it is run once
    per link-free point). The default grid is 243 runs: about 13 s of CPU on a 2-minute slice of
    the conversation trace (the chapter's) on the 2-core development machine.
    """
    sliced = _slice(trace, start_s, duration_s)
    base = _config(config, overrides)
    links, pools = tuple(links), tuple(float(p) for p in pool_bytes_per_node)
    pws, dws = tuple(int(p) for p in prefill_workers), tuple(int(d) for d in decode_workers)
    shape = (len(links), len(pools), len(pws), len(dws))
    out = {
        "trace": sliced.label,
        "generated": sliced.generated,
        "requests": len(sliced),
        "links": list(links),
        "link_bandwidth_bytes_per_s": np.array(
            [get_tier(name).bandwidth_bytes_per_s for name in links]
        ),
        "pool_bytes_per_node": np.array(pools),
        "prefill_workers": np.array(pws),
        "decode_workers": np.array(dws),
        "archs": list(archs),
        "keys": list(keys),
        "metrics": {},
    }
    total = sum(math.prod(shape[1:]) if a == "colocated" else math.prod(shape) for a in archs)
    done = 0
    for arch in archs:
        grid = {k: np.full(shape, np.nan) for k in keys}
        for (j, pool), (m, p), (n, d) in itertools.product(
            enumerate(pools), enumerate(pws), enumerate(dws)
        ):
            for i, link in enumerate(links):
                if arch == "colocated" and i > 0:
                    for k in keys:
                        grid[k][i, j, m, n] = grid[k][0, j, m, n]
                    continue
                cfg = dataclasses.replace(
                    base,
                    arch=arch,
                    link=link,
                    pool_bytes_per_node=pool,
                    prefill_workers=p,
                    decode_workers=d,
                    remote_kv=base.remote_kv and arch != "colocated",
                )
                s = simulate(sliced, cfg).summary()
                for k in keys:
                    value = s.get(k)
                    grid[k][i, j, m, n] = np.nan if value is None else value
                done += 1
                if progress is not None:
                    progress(done, total)
        out["metrics"][arch] = grid
    return out


def bytes_vs_critical_path(
    trace=None,
    start_s: float = 0.0,
    duration_s: float = 300.0,
    config: SimConfig | None = None,
    **overrides,
) -> dict:
    """ "Same bytes, lower latency": what each move cost in bytes, and how much of its time
    sat on the requests' critical path, for disaggregation without and with layer-wise
    overlap, and the KV-centric design (global pool, cache-aware routing, overlap).

    Returns {"trace", "generated", "variants": [names], "purposes": [...], per variant:
    "bytes": {purpose: bytes}, "wire_s", "exposed_s", "hidden_s" (same keys), "ttft_p50_s",
    "ttft_p90_s", "mean_transfer_exposed_s", "prefix_hit_ratio"}.
    """
    sliced = _slice(trace, start_s, duration_s)
    base = _config(config, overrides)
    variants = {
        "disaggregated": dict(arch="disaggregated", overlap=False),
        "disaggregated + overlap": dict(arch="disaggregated", overlap=True),
        "kv-centric": dict(arch="kv-centric"),
    }
    out = {
        "trace": sliced.label,
        "generated": sliced.generated,
        "variants": list(variants),
        "purposes": list(PURPOSES),
    }
    for name, change in variants.items():
        r = simulate(sliced, dataclasses.replace(base, **change, remote_kv=False))
        s, by = r.summary(), r.network["by_purpose"]
        out[name] = {
            "bytes": {p: by[p]["bytes"] for p in PURPOSES},
            "wire_s": {p: by[p]["wire_s"] for p in PURPOSES},
            "exposed_s": {p: by[p]["exposed_s"] for p in PURPOSES},
            "hidden_s": {p: by[p]["hidden_s"] for p in PURPOSES},
            "ttft_p50_s": s["ttft_p50_s"],
            "ttft_p90_s": s["ttft_p90_s"],
            "mean_transfer_exposed_s": s["mean_transfer_exposed_s"],
            "prefix_hit_ratio": s["prefix_hit_ratio"],
        }
    return out


def hit_rate_global_vs_local(  # noqa: PLR0913 - a chapter's run: keyword-only knobs its notebook sets
    trace=None,
    start_s: float = 0.0,
    duration_s: float | None = 600.0,
    nodes: int = 4,
    pool_bytes_per_node=None,
    model: str = "llama-3.1-8b",
    kv_dtype: str = "fp16",
    policy: str = "lru",
) -> dict:
    """Prefix-cache hit ratio of one global pool against `nodes` separate per-node caches of
    the same total size, requests spread round-robin (a load balancer that ignores caches).

    A pure cache replay (kvlab.prefix), no timing: request i looks its chain up and caches
    it, on node i % nodes or in the pool. Returns {"trace", "generated", "nodes",
    "pool_bytes_per_node", "capacity_blocks_per_node", "global_token_hit_ratio",
    "local_token_hit_ratio", "infinite_token_hit_ratio"} (arrays over pool sizes).
    """
    sliced = _slice(trace, start_s, duration_s)
    bt = sliced.block_tokens
    block_bytes = bt * kv_bytes_per_token(model, kv_dtype)
    unique = len({h for r in sliced.requests for h in r.hash_ids})
    if (
        pool_bytes_per_node is None
    ):  # from a sliver of the distinct blocks to all of them on every node
        pool_bytes_per_node = (
            np.array([0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0]) * unique * block_bytes / nodes
        )
    pools = np.asarray(pool_bytes_per_node, dtype=float)
    caps = np.floor(pools / block_bytes)
    ratios = global_vs_local(sliced, nodes, caps, policy)
    return {
        "trace": sliced.label,
        "generated": sliced.generated,
        "nodes": nodes,
        "pool_bytes_per_node": pools,
        "capacity_blocks_per_node": caps.astype(np.int64),
        **ratios,
    }


def timeline(
    trace=None,
    arch: str = "kv-centric",
    start_s: float = 0.0,
    duration_s: float = 20.0,
    config: SimConfig | None = None,
    **overrides,
) -> dict:
    """A Gantt chart of a short slice: {"trace", "generated", "arch", "workers": lane names
    in order, "rows": [(worker, start_s, end_s, kind, request)], "kinds"}. Kinds: "fetch"
    (prefix KV loaded), "prefill", "transfer" (KV arriving at a decode GPU), "decode" (one
    request's decode, from joining the batch to its last token). Decode rows of one worker
    overlap: they share its batch."""
    sliced = _slice(trace, start_s, duration_s)
    r = simulate(sliced, dataclasses.replace(_config(config, overrides), arch=arch))
    rows = [(w, float(a), float(b), kind, int(q)) for w, a, b, kind, q in r.timeline]
    workers = [w["name"] for w in r.workers]
    return {
        "trace": sliced.label,
        "generated": sliced.generated,
        "arch": arch,
        "workers": workers,
        "rows": rows,
        "kinds": ["fetch", "prefill", "transfer", "decode"],
        "summary": r.summary(),
    }


def token_streams(
    trace=None,
    start_s: float = 0.0,
    duration_s: float = 60.0,
    requests: int = 6,
    min_tokens: int = 100,
    archs=("colocated", "disaggregated"),
    config: SimConfig | None = None,
    **overrides,
) -> dict:
    """Per-token timestamps of a few requests, to show TTFT, TPOT and ITL and why TPOT (a
    mean) hides the stalls that ITL shows.

    The requests are the `requests` of at least `min_tokens` tokens with the largest gap
    between their worst ITL and their TPOT in the first architecture (colocated: prefill
    chunks stall decode); the same requests are given for every architecture. Returns
    {"trace", "generated", "archs", "requests": [ids], arch: [{"request", "arrival_s",
    "token_times_s" (from arrival), "ttft_s", "tpot_s", "itl_s", "itl_p99_s", "itl_max_s"}],
    "summary": {arch: {"tpot_p50_s", "itl_p50_s", "itl_p99_s", "ttft_p50_s"}}}.
    """
    sliced = _slice(trace, start_s, duration_s)
    base = _config(config, overrides)
    runs = {arch: simulate(sliced, dataclasses.replace(base, arch=arch)) for arch in archs}
    first = runs[archs[0]].records
    eligible = np.flatnonzero((first["status"] == 0) & (first["tokens"] >= min_tokens))
    stall = first["itl_max_s"][eligible] - first["tpot_s"][eligible]
    picked = eligible[np.argsort(-stall, kind="stable")[:requests]]
    picked = np.sort(picked)
    out = {
        "trace": sliced.label,
        "generated": sliced.generated,
        "archs": list(archs),
        "requests": picked.tolist(),
        "summary": {},
    }
    for arch, r in runs.items():
        rows = []
        for i in picked:
            rec = r.records[i]
            t = r.tokens(int(i))
            rows.append(
                {
                    "request": int(i),
                    "arrival_s": float(rec["arrival_s"]),
                    "token_times_s": t - rec["arrival_s"],
                    "ttft_s": float(rec["ttft_s"]),
                    "tpot_s": float(rec["tpot_s"]),
                    "itl_s": np.diff(t),
                    "itl_p99_s": float(rec["itl_p99_s"]),
                    "itl_max_s": float(rec["itl_max_s"]),
                }
            )
        out[arch] = rows
        s = r.summary()
        out["summary"][arch] = {
            k: s[k] for k in ("ttft_p50_s", "tpot_p50_s", "tpot_p99_s", "itl_p50_s", "itl_p99_s")
        }
    return out


#: The light-load twin of the disaster: this many requests of the slice, one at a time.
DISASTER_LIGHT_REQUESTS = 12


def remote_kv_disaster(
    trace=None,
    start_s: float = 0.0,
    duration_s: float = 60.0,
    config: SimConfig | None = None,
    **overrides,
) -> dict:
    """Disaggregation with the KV moved once into the decode GPU's HBM against read over
    the network at every step, at the trace's own load and at light load, beside the two
    ratios that bound the slowdown of one step.

    Returns {"trace", "local", "remote": summaries at the trace's load, "light_local",
    "light_remote": summaries of the slice's first DISASTER_LIGHT_REQUESTS requests arriving
    one at a time, "link", "bandwidth_ratio" (HBM bandwidth over the link's, from the
    catalogues), "context" (the slice's median prompt), "step_ratio" (a batch-1 decode step
    at that context with its KV remote over one with it in HBM: kvlab.tiers),
    "tpot_ratio" and "light_tpot_ratio" (median TPOT remote over local, simulated)}.

    A step reads the weights from HBM either way, so one step slows by less than the
    bandwidth ratio; under load a remote-KV decode GPU makes so few tokens per second that
    its batch and queue grow, which is how the simulated TPOT ratio outgrows both."""
    sliced = _slice(trace, start_s, duration_s)
    base = dataclasses.replace(_config(config, overrides), arch="disaggregated").resolved()
    light = trace_slice(sliced, 0.0, None, min(DISASTER_LIGHT_REQUESTS, len(sliced)))
    runs = {}
    for load, tr in (("", sliced), ("light_", _one_at_a_time(light))):
        for where, remote in (("local", False), ("remote", True)):
            runs[load + where] = simulate(tr, dataclasses.replace(base, remote_kv=remote)).summary()
    device = get_device(base.hardware)
    context = int(np.median(sliced.input_tokens))
    d = Deployment(base.model, device, base.weight_dtype, base.kv_dtype)
    step = tiered_decode_step(d, 1, context, base.link)
    ratio = lambda a, b: a["tpot_p50_s"] / b["tpot_p50_s"]  # noqa: E731
    return {
        "trace": sliced.label,
        **runs,
        "link": base.link,
        "bandwidth_ratio": device.memory_bandwidth_bytes_per_s
        / get_tier(base.link).bandwidth_bytes_per_s,
        "context": context,
        "step_ratio": float(step.slowdown),
        "tpot_ratio": ratio(runs["remote"], runs["local"]),
        "light_tpot_ratio": ratio(runs["light_remote"], runs["light_local"]),
    }


def _one_at_a_time(trace, gap_s: float = 3600.0):
    """The trace's requests in order, `gap_s` apart: each one runs alone."""
    requests = tuple(
        dataclasses.replace(r, arrival_s=i * gap_s) for i, r in enumerate(trace.requests)
    )
    return dataclasses.replace(trace, name=f"{trace.name}, one at a time", requests=requests)


# ------------------------------------------------------------------ capacity under load
#: Mean request rates of the load sweep (requests/s): below, at and past each design's knee.
LOAD_RATES = (2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0)
#: Requests replayed at every rate: the first ones of the trace, their gaps scaled.
LOAD_REQUESTS = 400
#: A design saturates where fewer than this share of requests meet both SLOs.
SATURATION_ATTAINMENT = 0.9
#: The TTFT limit is this many times an idle GPU's prefill of the slice's p90 prompt.
TTFT_SLO_PREFILLS = 10.0
TTFT_SLO_PROMPT_PERCENTILE = 90.0
#: The designs of the load sweep: a name and what it changes in the base config. Colocated
#: at the engine's default token budget (None: vLLM's for the GPU) and at smaller ones;
#: disaggregated and KV-centric without and with early rejection.
LOAD_VARIANTS = {
    "colocated": dict(arch="colocated", chunk_tokens=None),
    "colocated-2048": dict(arch="colocated", chunk_tokens=2048),
    "colocated-512": dict(arch="colocated", chunk_tokens=512),
    "disaggregated": dict(arch="disaggregated", early_reject=False),
    "disaggregated+er": dict(arch="disaggregated", early_reject=True),
    "kv-centric": dict(arch="kv-centric", early_reject=False),
    "kv-centric+er": dict(arch="kv-centric", early_reject=True),
}
#: Summary figures stored at every (variant, rate) of `load_sweep`.
LOAD_KEYS = (
    "slo_attainment",
    "ttft_slo_attainment",
    "tbt_slo_attainment",
    "goodput_requests_per_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "itl_p99_s",
    "throughput_tokens_per_s",
    "prefix_hit_ratio",
    "requests_rejected_early",
    "requests_completed",
    "preemptions",
)


#: Each role's mean share of the run its GPUs spent computing (kvlab.sim results' workers).
BUSY_KEYS = ("prefill_busy_share", "decode_busy_share", "colocated_busy_share")


def busy_shares(result) -> dict:
    """{role_busy_share: mean over that role's GPUs} (NaN for a role the cluster lacks)."""
    out = {}
    for key in BUSY_KEYS:
        role = key.removesuffix("_busy_share")
        shares = [w["busy_share"] for w in result.workers if w["role"] == role]
        out[key] = float(np.mean(shares)) if shares else math.nan
    return out


def capacity_ttft_slo_s(sliced, config: SimConfig) -> float:
    """TTFT limit of the load sweep: TTFT_SLO_PREFILLS idle-GPU prefills of the slice's
    TTFT_SLO_PROMPT_PERCENTILE-th percentile prompt, priced by the run's own step costs.

    Mooncake held Kimi's traffic to TTFT <= 30 s; that limit belongs to a far larger model
    than the 8B one simulated here, whose long prompts prefill in a fraction of a second, so
    the limit is scaled to the model: a request may queue for about nine of its prefills."""
    prompt = int(np.percentile(sliced.input_tokens, TTFT_SLO_PROMPT_PERCENTILE))
    prefill_s = float(make_cost(config.resolved()).prefill_times_s(prompt, 0)[0])
    return TTFT_SLO_PREFILLS * prefill_s


def saturation_rate(rates, attainment, level: float = SATURATION_ATTAINMENT) -> tuple[float, str]:
    """Where attainment first falls below `level`, linearly interpolated between the rates
    around the crossing: (rate, "crossed"); (first rate, "below") when it is below already
    there; (last rate, "above") when it never falls below within the rates."""
    r, a = np.asarray(rates, dtype=float), np.asarray(attainment, dtype=float)
    below = np.flatnonzero(a < level)
    if below.size == 0:
        return float(r[-1]), "above"
    i = int(below[0])
    if i == 0:
        return float(r[0]), "below"
    w = (a[i - 1] - level) / (a[i - 1] - a[i])
    return float(r[i - 1] + w * (r[i] - r[i - 1])), "crossed"


def load_sweep(  # noqa: PLR0913 - a chapter's run: keyword-only knobs its notebook sets
    trace=None,
    requests: int = LOAD_REQUESTS,
    rates=LOAD_RATES,
    variants=None,
    config: SimConfig | None = None,
    ttft_slo_s: float | None = None,
    tbt_slo_s: float = metrics.DEFAULT_TBT_SLO_S,
    keys=LOAD_KEYS,
    **overrides,
) -> dict:
    """Every design at rising request rates: the first `requests` requests of the trace,
    their arrival gaps scaled to each mean rate (burstiness and prefix sharing kept), under
    one pair of SLOs (TTFT <= `ttft_slo_s`, by default `capacity_ttft_slo_s`; the p90 of
    each request's token gaps <= `tbt_slo_s`, Mooncake's strictest TBT limit). Rejected
    requests count as missing their SLOs.

    Returns {"trace", "generated", "requests", "rates", "ttft_slo_s", "tbt_slo_s", "tbt_stat",
    "variants": [names], "settings": {name: resolved config fields that differ},
    "metrics": {name: {key: array over rates}}, "saturation": {name: (rate, status)}}
    (status: see `saturation_rate`)."""
    sliced = trace_slice(_slice(trace, 0.0, None), 0.0, None, requests)
    base = _config(config, overrides)
    variants = dict(LOAD_VARIANTS if variants is None else variants)
    if ttft_slo_s is None:
        ttft_slo_s = capacity_ttft_slo_s(sliced, base)
    base = dataclasses.replace(base, ttft_slo_s=ttft_slo_s, tbt_slo_s=tbt_slo_s)
    rates = tuple(float(r) for r in rates)
    played = [trace_at_rate(sliced, rate) for rate in rates]
    out = {
        "trace": sliced.label,
        "generated": sliced.generated,
        "requests": len(sliced),
        "rates": np.array(rates),
        "ttft_slo_s": ttft_slo_s,
        "tbt_slo_s": tbt_slo_s,
        "tbt_stat": base.tbt_stat,
        "variants": list(variants),
        "settings": {},
        "metrics": {},
        "saturation": {},
    }
    for name, change in variants.items():
        cfg = dataclasses.replace(base, **change)
        resolved = cfg.resolved()
        out["settings"][name] = {
            k: getattr(resolved, k)
            for k in (
                "arch",
                "chunk_tokens",
                "early_reject",
                "prefill_workers",
                "decode_workers",
                "link",
            )
        }
        grid = {k: np.full(len(rates), np.nan) for k in (*keys, *BUSY_KEYS)}
        for i, tr in enumerate(played):
            r = simulate(tr, cfg)
            s = {**r.summary(), **busy_shares(r)}
            for k in (*keys, *BUSY_KEYS):
                grid[k][i] = np.nan if s.get(k) is None else s[k]
        out["metrics"][name] = grid
        out["saturation"][name] = saturation_rate(rates, grid["slo_attainment"])
    return out


# ------------------------------------------------------------- schedulers and preemption
#: The engine schedulers on the colocated cluster: a name and what it changes. Chunked at
#: the engine's budget for the GPU (None: vLLM's) and at smaller ones.
SCHEDULER_VARIANTS = {
    "prefill-first": dict(scheduler="prefill-first", chunk_tokens=None),
    "chunked": dict(scheduler="chunked", chunk_tokens=None),
    "chunked-2048": dict(scheduler="chunked", chunk_tokens=2048),
    "chunked-512": dict(scheduler="chunked", chunk_tokens=512),
    "decode-first": dict(scheduler="decode-first", chunk_tokens=None),
}
#: Summary figures stored per scheduler or preemption run.
RUN_KEYS = (
    "ttft_p50_s",
    "ttft_p90_s",
    "tpot_p50_s",
    "itl_p50_s",
    "itl_p99_s",
    "e2e_p90_s",
    "queue_p90_s",
    "slo_attainment",
    "throughput_tokens_per_s",
    "preemptions",
    "requests_preempted",
    "swapped_bytes",
    "requests_completed",
)


def _keep(summary: dict, keys=RUN_KEYS) -> dict:
    return {k: summary.get(k) for k in keys}


def schedulers(
    trace=None,
    start_s: float = 0.0,
    duration_s: float = 600.0,
    variants=None,
    config: SimConfig | None = None,
    **overrides,
) -> dict:
    """The colocated cluster of `config` under each engine scheduler on one slice: what a
    GPU runs per iteration decides who waits (kvlab.sim.schedulers). Returns {"trace",
    "generated", "requests", "variants", "chunk_tokens": {name: budget}, "summary": {name:
    RUN_KEYS and `worst_gaps`}}."""
    sliced = _slice(trace, start_s, duration_s)
    base = dataclasses.replace(_config(config, overrides), arch="colocated")
    variants = dict(SCHEDULER_VARIANTS if variants is None else variants)
    out = {
        "trace": sliced.label,
        "generated": sliced.generated,
        "requests": len(sliced),
        "variants": list(variants),
        "chunk_tokens": {},
        "summary": {},
    }
    for name, change in variants.items():
        cfg = dataclasses.replace(base, **change)
        out["chunk_tokens"][name] = cfg.resolved().chunk_tokens
        r = simulate(sliced, cfg)
        out["summary"][name] = {**_keep(r.summary()), **worst_gaps(r)}
    return out


def worst_gaps(result) -> dict:
    """Percentiles over finished requests of each one's longest token gap: a stall that
    hits few gaps (a p99 over all gaps misses it) but most requests once."""
    worst = result.records["itl_max_s"][result.done]
    worst = worst[np.isfinite(worst)]
    return {
        f"worst_gap_p{q}_s": float(np.percentile(worst, q)) if worst.size else math.nan
        for q in (50, 90)
    }


#: The share of HBM the preemption runs give the engine (vLLM's gpu_memory_utilization):
#: an 8B model's weights leave room for the KV of only a few long conversations.
PREEMPTION_MEMORY_FRACTION = 0.3


def preemption(
    trace=None,
    start_s: float = 0.0,
    duration_s: float = 600.0,
    memory_fraction: float = PREEMPTION_MEMORY_FRACTION,
    config: SimConfig | None = None,
    **overrides,
) -> dict:
    """The colocated cluster with little KV room, once with each preemption mode: when a step
    finds no free block the newest sequence is dropped and prefilled again later
    ("recompute"), or its KV goes to host memory and comes back ("swap"). Returns
    {"trace", "generated", "requests", "memory_fraction", "kv_room_tokens" (per GPU),
    "roomy": the same slice with the config's own memory, "recompute", "swap": RUN_KEYS}."""
    sliced = _slice(trace, start_s, duration_s)
    base = dataclasses.replace(_config(config, overrides), arch="colocated")
    tight = dataclasses.replace(base, memory_fraction=memory_fraction)
    r = tight.resolved()
    d = Deployment(r.model, r.hardware, r.weight_dtype, r.kv_dtype, tensor_parallel=1)
    room = get_device(r.hardware).capacity_bytes * memory_fraction - d.weight_bytes
    out = {
        "trace": sliced.label,
        "generated": sliced.generated,
        "requests": len(sliced),
        "memory_fraction": memory_fraction,
        "kv_room_tokens": room / d.kv_bytes_per_token,
        "roomy": _keep(simulate(sliced, base).summary()),
    }
    for mode in ("recompute", "swap"):
        out[mode] = _keep(simulate(sliced, dataclasses.replace(tight, preemption=mode)).summary())
    return out


def cache_bound(trace=None, start_s: float = 0.0, duration_s=None, limit=None, warmup_s=0.0):
    """The most any prefix cache could serve of a slice's measured prompt tokens (an infinite
    cache that has seen the lead-in): how cold or warm a slice is."""

    trace = trace_or_generated("conversation") if trace is None else load_trace(trace)
    sliced = trace_slice(trace, start_s, duration_s, limit, warmup_s)
    cache = BlockPrefixCache(math.inf)
    hits = [cache.access(r.hash_ids) for r in sliced.requests]
    measured = sliced.input_tokens[sliced.lead_in :]
    served = served_from_blocks(np.asarray(hits[sliced.lead_in :]), sliced.block_tokens, measured)
    return float(np.sum(served) / np.sum(measured))


# ------------------------------------------------------------------ Mooncake's regime
#: The window of the conversation trace replayed in Mooncake's regime: ten minutes after a
#: ten-minute lead-in that fills the caches, at the trace's own timestamps.
MOONCAKE_START_S, MOONCAKE_DURATION_S, MOONCAKE_WARMUP_S = 1200.0, 600.0, 600.0
#: The systems compared there (kvlab.sim.experiments.fast25_systems).
MOONCAKE_SYSTEMS = ("mooncake", "vllm")


def mooncake_regime(
    trace=None,
    start_s: float = MOONCAKE_START_S,
    duration_s: float = MOONCAKE_DURATION_S,
    warmup_s: float = MOONCAKE_WARMUP_S,
    nodes: int | None = None,
    systems=MOONCAKE_SYSTEMS,
    fit: bool = True,
) -> dict:
    """FAST'25's end-to-end experiment on a window of the conversation trace: 16 nodes per
    system (8xA800, LLaMA3-70B at TP8), Mooncake 8P+8D against vLLM 0.5 (16 instances),
    effective request capacity at FAST'25's three TBT limits. Run twice: with step times
    from measured kernels alone ("kernels"), and with the host time per iteration that makes
    kvlab's Mooncake as slow between tokens as the paper's ("fitted", `fit=True`).

    Returns {"trace", "generated", "requests" (measured), "warmup_requests", "nodes",
    "prefill_nodes", "ttft_slo_s", "tbt_slos_s", "published" (kvlab.published.mooncake
    "fast25_conversation"), "step_overhead_s", "kernels"/"fitted": {system: {"capacity"
    (per limit), "gain" (Mooncake's over this system's, per limit), "tbt_s" (each
    request's slowest-10% mean, sorted), "median_tbt_s", "prefix_hit_ratio", "ttft_p90_s",
    "tpot_p50_s", "prefill_busy_share", "decode_busy_share"}}, "prefill_s", "decode_step_s"
    (a prefill of the window's median prompt and one decode step at batch 8 and that
    context, on one instance, from the kernels)}."""

    trace = trace_or_generated("conversation") if trace is None else load_trace(trace)
    sliced = trace_slice(trace, start_s, duration_s, None, warmup_s)
    configs = ex.fast25_systems(nodes)
    configs = {k: configs[k] for k in systems}
    pub = mooncake("fast25_conversation")
    slos = mooncake("fast25_testbed")["tbt_slos_s"]
    moon = configs["mooncake"]
    out = {
        "trace": sliced.label,
        "generated": sliced.generated,
        "requests": len(sliced) - sliced.lead_in,
        "warmup_requests": sliced.lead_in,
        "nodes": moon.instances,
        "prefill_nodes": moon.prefill_workers,
        "ttft_slo_s": moon.ttft_slo_s,
        "tbt_slos_s": list(slos),
        "published": pub,
        "step_overhead_s": 0.0,
    }

    def record(results: dict) -> dict:
        rows = {}
        for name, r in results.items():
            s = r.summary()
            rows[name] = {
                "capacity": ex.capacities(r, configs[name].ttft_slo_s, slos),
                "tbt_s": ex.tbt_per_request_s(r),
                "median_tbt_s": ex.median_tbt_s(r),
                "prefix_hit_ratio": s["prefix_hit_ratio"],
                "ttft_p90_s": s["ttft_p90_s"],
                "tpot_p50_s": s["tpot_p50_s"],
                **busy_shares(r),
            }
        for row in rows.values():
            row["gain"] = [
                m / b - 1 if b > 0 else math.inf
                for m, b in zip(rows["mooncake"]["capacity"], row["capacity"], strict=True)
            ]
        return rows

    kernels = {k: simulate(sliced, c) for k, c in configs.items()}
    out["kernels"] = record(kernels)
    if fit:
        found = ex.fit_step_overhead(sliced, moon, pub["mooncake_median_tbt_s"])
        out["step_overhead_s"] = found.step_overhead_s
        fitted = {"mooncake": found.result}
        for k, c in configs.items():
            if k != "mooncake":
                fitted[k] = simulate(
                    sliced, dataclasses.replace(c, step_overhead_s=found.step_overhead_s)
                )
        out["fitted"] = record(fitted)
    d = Deployment(
        moon.model, moon.hardware, speed=KernelTables(), tensor_parallel=moon.tensor_parallel
    )
    context = int(np.median(sliced.input_tokens[sliced.lead_in :]))
    out["context"] = context
    out["prefill_s"] = cost.prefill(d, context).time_s
    out["decode_step_s"] = cost.decode_step(d, 8, context).step_time_s
    return out


def report_runs(requests: int = 200, workloads=None) -> dict:
    """The Mooncake arXiv report's comparison (section 8.1.1): Mooncake-[3P+1D] against
    vLLM-[4M] on each public-data workload (kvlab.sim.experiments), SLOs at 10x / 5x the
    lowest rate's P90 TTFT / TBT, throughput = the highest rate within both.

    Returns {workload: {"text" (its spec, rate R), "lowest_rate_per_s", "ttft_slo_s",
    "tbt_slo_s", "hits" {system: prefix hit ratio at the lowest rate}, "throughput"
    {system: requests/s}, "gain", "published_gain"}}."""

    systems = ex.report_systems()
    out = {}
    for name in workloads or ex.REPORT_WORKLOADS:
        pub = mooncake(ex.REPORT_KEYS[name])
        low = pub["lowest_rate_per_s"]

        def at(rate, name=name):
            return ex.report_workload(name, rate, requests)

        light = {k: simulate(at(low), c).summary() for k, c in systems.items()}
        ttft, tbt = ex.report_slos(light)
        found = {k: ex.p90_throughput(c, at, ttft, tbt, low).rate_per_s for k, c in systems.items()}
        out[name] = {
            "text": ex.REPORT_WORKLOADS[name]
            .replace("{rate:g}", "R")
            .format(requests=requests, seed=0),
            "lowest_rate_per_s": low,
            "ttft_slo_s": ttft,
            "tbt_slo_s": tbt,
            "hits": {k: s["prefix_hit_ratio"] for k, s in light.items()},
            "throughput": found,
            "gain": found["mooncake-3p1d"] / found["vllm-4m"] - 1,
            "published_gain": pub["gain"],
        }
    return out

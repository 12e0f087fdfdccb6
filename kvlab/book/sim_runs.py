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

from .. import metrics
from ..cost import kv_bytes_per_token
from ..deployment import Deployment
from ..hardware import get_device, get_tier
from ..prefix.pools import global_vs_local
from ..sim import ARCHS, SimConfig, make_cost, simulate, trace_at_rate, trace_slice
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
    those percentiles} (plot-ready CDFs), "slo_curve": {arch: {"tbt_slo_s", "attainment"}}}.
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
    return out


def _quantiles(values) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    return np.percentile(v, QUANTILES) if v.size else np.full(QUANTILES.size, np.nan)


def sweep(
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


def hit_rate_global_vs_local(
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


def load_sweep(
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
        grid = {k: np.full(len(rates), np.nan) for k in keys}
        for i, tr in enumerate(played):
            s = simulate(tr, cfg).summary()
            for k in keys:
                grid[k][i] = np.nan if s.get(k) is None else s[k]
        out["metrics"][name] = grid
        out["saturation"][name] = saturation_rate(rates, grid["slo_attainment"])
    return out

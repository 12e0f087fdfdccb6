"""Plot-ready data for chapter 3 (KV beyond HBM): plain numpy arrays in dicts.

Each function is one figure's data, computed by `kvlab.tiers` / `kvlab.cost`; nothing
here plots. `jsonable` turns any of them into JSON-ready lists for CustomJS sliders
(inf becomes None, meaning "never").
"""
from __future__ import annotations

import numpy as np

from ..bench.results import load_results
from ..cost import decode_step, kv_bytes_per_token
from ..hardware import get_device, get_tier
from ..models import get_model
from .capacity import kv_footprint, spill_cost
from .decode import tiered_decode_step
from .hit import breakeven_prompt_tokens, hit_value, mean_prefill_time_s
from .links import MODEL_LINKS, link_model_curves
from .placement import get_placement, kv_fetch_time_s

CHAPTER_MODELS = ("article-7b", "llama-2-7b", "llama-3.1-8b", "qwen2.5-7b", "llama-3.1-70b", "deepseek-v3")
CHAPTER_PLACEMENTS = ("hbm", "peer-nvlink4", "host-pcie5", "host-pcie4", "remote-ib-400g", "remote-ib-200g",
                      "remote-10gbe")
CONTEXTS = 2 ** np.arange(9, 18)  # 512 .. 131072 tokens
PROMPTS = np.unique(np.geomspace(16, 131072, 60).astype(np.int64))
#: The article writes "200 GB/s" for InfiniBand; one 200 Gb/s NIC is 25 GB/s. Both are shown.
ARTICLE_200_GBPS = 200e9
PD_LINKS = ("ethernet-10g", "ib-200g", "article-200GB/s", "ib-400g", "nvlink4")


def kv_size_series(models=CHAPTER_MODELS, hardware="h100-sxm", contexts=CONTEXTS, batches=(1, 8, 32, 128),
                   weight_dtype="fp16", kv_dtype="fp16") -> dict:
    """How fat the KV gets: bytes for batch x context per model, against the device."""
    c = np.asarray(contexts, dtype=np.int64)
    b = np.asarray(batches, dtype=np.int64)
    out = {"hardware": get_device(hardware).name, "capacity_bytes": get_device(hardware).capacity_bytes,
           "contexts": c, "batches": b, "models": {}}
    for name in models:
        fp = kv_footprint(name, hardware, b[:, None], c[None, :], weight_dtype, kv_dtype)
        per_batch = kv_footprint(name, hardware, b, int(c.max()), weight_dtype, kv_dtype)
        out["models"][name] = {
            "display_name": get_model(name).display_name or name,
            "kv_bytes_per_token": fp.kv_bytes_per_token, "weight_bytes": fp.weight_bytes,
            "kv_room_bytes": fp.kv_room_bytes, "kv_bytes": np.asarray(fp.kv_cache_bytes),  # (batch, context)
            "total_bytes": fp.weight_bytes + np.asarray(fp.kv_cache_bytes), "fits": np.asarray(fp.fits),
            "max_batch": np.asarray(fp.max_batch)[0],  # per context
            "max_context": np.asarray(per_batch.max_context, dtype=float),  # per batch
        }
    return out


def tier_throughput_series(model="article-7b", hardware="h100-sxm", batch=32, contexts=CONTEXTS,
                           placements=CHAPTER_PLACEMENTS, tier_efficiency=1.0, overlap=False) -> dict:
    """Tokens/s when every sequence's KV is read from each placement every step."""
    c = np.asarray(contexts, dtype=np.int64)
    fits = np.asarray(kv_footprint(model, hardware, batch, c).fits)
    out = {"model": model, "hardware": hardware, "batch": batch, "contexts": c, "fits_in_hbm": fits,
           "placements": {}}
    for name in placements:
        p = get_placement(name)
        step = tiered_decode_step(model, hardware, batch, c, p, tier_efficiency=tier_efficiency, overlap=overlap)
        out["placements"][name] = {
            "description": p.description, "bottleneck": p.bottleneck,
            "bandwidth_bytes_per_s": p.bandwidth_bytes_per_s(hardware),
            "tokens_per_s": np.asarray(step.tokens_per_s), "step_time_s": np.asarray(step.step_time_s),
            "slowdown": np.asarray(step.slowdown), "bound": np.asarray(step.bound),
        }
    return out


def spill_series(model="article-7b", hardware="h100-sxm", context=4096, batches=None, tier="host-pcie5",
                 tier_efficiency=1.0) -> dict:
    """Tokens/s against batch: all in HBM (if it were big enough), overflow spilled, batch capped."""
    if batches is None:
        top = max(int(kv_footprint(model, hardware, 1, context).max_batch) * 4, 8)
        batches = np.unique(np.geomspace(1, top, 80).astype(np.int64))
    b = np.asarray(batches, dtype=np.int64)
    s = spill_cost(model, hardware, b, context, tier, tier_efficiency=tier_efficiency)
    return {"model": model, "hardware": hardware, "context": context, "placement": s.placement, "batches": b,
            "max_batch": int(kv_footprint(model, hardware, 1, context).max_batch),
            "overflow_fraction": np.asarray(s.overflow_fraction),
            "tokens_per_s_unlimited": np.asarray(s.tokens_per_s_unlimited),
            "tokens_per_s_spilled": np.asarray(s.tokens_per_s_spilled),
            "tokens_per_s_capped": np.asarray(s.tokens_per_s_capped)}


def hit_vs_miss_series(model="article-7b", hardware="h100-sxm", prompts=PROMPTS, placements=CHAPTER_PLACEMENTS,
                       hit_fraction=1.0, efficiency=1.0, tier_efficiency=1.0) -> dict:
    """Prefill time of a miss (recompute in HBM) and of a hit fetched from each placement."""
    p_tokens = np.asarray(prompts, dtype=np.int64)
    out = {"model": model, "hardware": hardware, "prompt_tokens": p_tokens, "placements": {}}
    for name in placements:
        h = hit_value(model, hardware, p_tokens, name, hit_fraction, efficiency=efficiency,
                      tier_efficiency=tier_efficiency)
        out["miss_time_s"] = np.asarray(h.miss_time_s)
        out["placements"][name] = {
            "hit_time_s": np.asarray(h.hit_time_s), "fetch_time_s": np.asarray(h.fetch_time_s),
            "value_s": np.asarray(h.value_s), "liability": np.asarray(h.liability),
            "breakeven_prompt_tokens": breakeven_prompt_tokens(model, hardware, name, hit_fraction,
                                                               efficiency=efficiency, tier_efficiency=tier_efficiency),
        }
    return out


def hit_rate_series(model="llama-2-7b", hardware="h100-sxm", prompt_tokens=4096, placements=CHAPTER_PLACEMENTS,
                    hit_rates=np.linspace(0, 1, 101), efficiency=1.0, tier_efficiency=1.0) -> dict:
    """Mean prefill time against hit rate: falls for a cache worth having, rises for a liability.

    The default (llama-2-7b: full multi-head KV, 512 KiB per token) over PCIe 4 is the
    article's "99% hit rate, slower than a miss".
    """
    rates = np.asarray(hit_rates, dtype=float)
    out = {"model": model, "hardware": hardware, "prompt_tokens": prompt_tokens, "hit_rates": rates,
           "placements": {}}
    for name in placements:
        h = hit_value(model, hardware, prompt_tokens, name, efficiency=efficiency, tier_efficiency=tier_efficiency)
        out["miss_time_s"] = h.miss_time_s
        out["placements"][name] = {"mean_prefill_time_s": np.asarray(mean_prefill_time_s(h, rates)),
                                   "hit_time_s": h.hit_time_s, "value_s": h.value_s, "liability": h.liability}
    return out


def breakeven_series(model="article-7b", hardware="h100-sxm", prompts=PROMPTS, placements=CHAPTER_PLACEMENTS,
                     efficiency=1.0, tier_efficiency=1.0) -> dict:
    """The break-even line: the link bandwidth a hit needs to pay, per prompt length.

    Above the line (a faster tier) the hit saves time; below it the cache is a liability.
    Each placement is a horizontal line at its bandwidth; where it crosses the curve is
    its break-even prompt length.
    """
    p_tokens = np.asarray(prompts, dtype=np.int64)
    h = hit_value(model, hardware, p_tokens, "hbm", efficiency=efficiency, tier_efficiency=tier_efficiency,
                  latency_s=0.0)
    return {"model": model, "hardware": hardware, "prompt_tokens": p_tokens,
            "breakeven_bandwidth_bytes_per_s": np.asarray(h.breakeven_bandwidth_bytes_per_s),
            "placements": {n: get_placement(n).bandwidth_bytes_per_s(hardware) for n in placements}}


def hit_value_grid(model="article-7b", hardware="h100-sxm", prompts=PROMPTS,
                   bandwidths_bytes_per_s=np.geomspace(1e9, 1e12, 61), latency_s=0.0, efficiency=1.0) -> dict:
    """Value of a hit over (prompt length x link bandwidth): the regions where a hit is a
    liability (value < 0) and the break-even line between them, for a heat map."""
    p_tokens = np.asarray(prompts, dtype=np.int64)
    bw = np.asarray(bandwidths_bytes_per_s, dtype=float)
    h = hit_value(model, hardware, p_tokens[:, None], "hbm", efficiency=efficiency,
                  tier_bandwidth_bytes_per_s=bw[None, :], latency_s=latency_s)
    line = hit_value(model, hardware, p_tokens, "hbm", efficiency=efficiency, latency_s=latency_s)
    return {"model": model, "hardware": hardware, "prompt_tokens": p_tokens, "bandwidths_bytes_per_s": bw,
            "value_s": np.asarray(h.value_s), "liability": np.asarray(h.liability),  # (prompt, bandwidth)
            "speedup": np.asarray(h.speedup),
            "breakeven_bandwidth_bytes_per_s": np.asarray(line.breakeven_bandwidth_bytes_per_s),
            "placements": {n: get_placement(n).bandwidth_bytes_per_s(hardware) for n in CHAPTER_PLACEMENTS}}


def _pd_link(name: str):
    """(placement, bandwidth override, label, derivation) of a PD link name."""
    if name == "article-200GB/s":
        return ("remote-ib-200g", ARTICLE_200_GBPS, "200 GB/s (as the article writes it)",
                "200 GB/s = 1.6 Tb/s: eight 200 Gb/s NICs, not one")
    tier = get_tier(name)
    return tier, None, tier.example, tier.derivation


def pd_series(model="article-7b", hardware="h100-sxm", context=4096, batch=1, links=PD_LINKS,
              tier_efficiency=1.0) -> dict:
    """PD disaggregation: one request's KV over each link against one decode step, and the
    remote-KV-every-step disaster (tokens/s if decode read that KV over the link each step)."""
    step = decode_step(model, hardware, batch, context)
    kv = batch * context * kv_bytes_per_token(model)
    out = {"model": model, "hardware": hardware, "context": context, "batch": batch, "kv_bytes": kv,
           "decode_step_s": step.step_time_s, "local_tokens_per_s": step.tokens_per_s, "links": {}}
    for name in links:
        where, bw, label, derivation = _pd_link(name)
        transfer = kv_fetch_time_s(model, batch * context, where, bandwidth_bytes_per_s=bw,
                                   efficiency=tier_efficiency, latency_s=None)
        remote = tiered_decode_step(model, hardware, batch, context, where, tier_efficiency=tier_efficiency,
                                    tier_bandwidth_bytes_per_s=bw)
        out["links"][name] = {
            "label": label, "derivation": derivation,
            "bandwidth_bytes_per_s": bw or get_placement(where).bandwidth_bytes_per_s(hardware),
            "transfer_s": transfer, "decode_steps_per_transfer": transfer / step.step_time_s,
            "every_step_time_s": remote.step_time_s, "every_step_tokens_per_s": remote.tokens_per_s,
            "every_step_slowdown": remote.slowdown,
        }
    return out


def measured_transfer_series(kind: str = "kv_transfer") -> dict:
    """Every recorded results/<machine>/kv_transfer.json as per-layout arrays for plotting."""
    out = {}
    for machine, payload in load_results(kind).items():
        engines = {}
        for label, entry in payload.get("engines", {}).items():
            layouts = {}
            for layout in ("contiguous", "paged"):
                rows = sorted((r for r in entry.get("rows", []) if r["layout"] == layout), key=lambda r: r["bytes"])
                if rows:
                    layouts[layout] = {
                        "bytes": np.array([r["bytes"] for r in rows], dtype=float),
                        **{f"time_s_{q}": np.array([r["time_s"][q] for r in rows]) for q in ("median", "p10", "p90")},
                        **{f"bandwidth_bytes_per_s_{q}": np.array([r["bandwidth_bytes_per_s"][q] for r in rows])
                           for q in ("median", "p10", "p90")},
                    }
            engines[label] = {"layouts": layouts, "summary": entry.get("summary", {}),
                              "environment": entry.get("environment", payload.get("environment", {})),
                              "command": entry.get("command", "")}
        out[machine] = {"environment": payload.get("environment", {}), "engines": engines}
    return out


def transfer_overlay(links=MODEL_LINKS, sizes_bytes=None, efficiency=1.0) -> dict:
    """Measured transfers of every recorded machine next to the link model's curves."""
    sizes = 2.0 ** np.arange(12, 30) if sizes_bytes is None else sizes_bytes
    return {"model": link_model_curves(links, sizes, efficiency), "measured": measured_transfer_series()}


def article_numbers(model="article-7b", article_bandwidth_bytes_per_s=2e12) -> dict:
    """The article's section-3 numbers as kvlab computes them (pure bandwidth, no latency)."""
    kv_tok = kv_bytes_per_token(model)
    request = 4096 * kv_tok
    step = decode_step(model, "h100-sxm", 1, 4096, bandwidth_bytes_per_s=article_bandwidth_bytes_per_s)

    def over(tier=None, bw=None, eff=1.0):
        return kv_fetch_time_s(model, 4096, tier or "ib-200g", efficiency=eff, bandwidth_bytes_per_s=bw)

    return {
        "kv_bytes_per_token": kv_tok, "kv_bytes_4k_request": request, "kv_bytes_32_requests": 32 * request,
        "weight_bytes": decode_step(model, "h100-sxm", 1, 0).weight_bytes,
        "transfer_s": {"ethernet-10g": over("ethernet-10g"), "ethernet-10g at 60%": over("ethernet-10g", eff=0.6),
                       "ethernet-10g at 85%": over("ethernet-10g", eff=0.85), "ib-200g (200 Gb/s)": over("ib-200g"),
                       "200 GB/s": over(bw=ARTICLE_200_GBPS), "ib-400g": over("ib-400g"), "nvlink4": over("nvlink4"),
                       "pcie5-x16": over("pcie5-x16")},
        "decode_step_s": step.step_time_s,  # batch 1, 4K context at the article's 2 TB/s
        "notes": [
            "512 MiB = 4096 tokens x 128 KiB; the article's '512 MB' and '16 GB' are binary (16 GiB = 17.2 GB).",
            "10 GbE at line rate moves it in 0.43 s (0.51-0.72 s at 60-85% efficiency): the article's "
            "'measured in seconds' is an order of magnitude, about 100 decode steps.",
            "'200 GB/s' gives 2.7 ms (2.56 ms per decimal 512 MB). One 200 Gb/s NIC is 25 GB/s: 21.5 ms, 8x more.",
        ],
    }


def jsonable(obj):
    """Arrays -> lists, numpy scalars -> Python, inf/nan -> None: ready for json.dumps / CustomJS."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, (np.generic,)):
        obj = obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj

"""Chapter 3, "When HBM is not enough": how big the KV gets, reading it from a slower
tier, when a hit is a liability, and moving KV between prefill and decode."""
from __future__ import annotations

import functools

from .. import cost, fmt, tiers
from ..article import ARTICLE_BANDWIDTH_BYTES_PER_S, ARTICLE_CONTEXT_TOKENS, ARTICLE_IB_BYTES_PER_S, ARTICLE_MODEL
from ..bench.report import kv_transfer_series

#: The share of a link's line rate a realistic transfer reaches (quoted in the prose).
REALISTIC_LINK_EFFICIENCY = 0.6


def article_numbers(model=ARTICLE_MODEL, bandwidth_bytes_per_s=ARTICLE_BANDWIDTH_BYTES_PER_S) -> dict:
    """The article's section-3 numbers as kvlab computes them (pure bandwidth, no latency)."""
    ctx = ARTICLE_CONTEXT_TOKENS
    kv_tok = cost.kv_bytes_per_token(model)
    request = ctx * kv_tok
    step = cost.decode_step(model, "h100-sxm", 1, ctx, bandwidth_bytes_per_s=bandwidth_bytes_per_s)

    def over(tier=None, bw=None, eff=1.0):
        return tiers.kv_fetch_time_s(model, ctx, tier or "ib-200g", efficiency=eff, bandwidth_bytes_per_s=bw)

    return {
        "kv_bytes_per_token": kv_tok, "kv_bytes_4k_request": request, "kv_bytes_32_requests": 32 * request,
        "weight_bytes": cost.decode_step(model, "h100-sxm", 1, 0).weight_bytes,
        "transfer_s": {"ethernet-10g": over("ethernet-10g"),
                       "ethernet-10g at 60%": over("ethernet-10g", eff=REALISTIC_LINK_EFFICIENCY),
                       "ib-200g (200 Gb/s)": over("ib-200g"), "200 GB/s": over(bw=ARTICLE_IB_BYTES_PER_S),
                       "ib-400g": over("ib-400g"), "nvlink4": over("nvlink4"), "pcie5-x16": over("pcie5-x16")},
        "decode_step_s": step.step_time_s,  # batch 1, 4K context at the article's 2 TB/s
    }


@functools.cache
def panels() -> dict:
    from ..viz import tier_panels

    return {"footprint": tier_panels.footprint_panel(), "tier_read": tier_panels.tier_read_panel(),
            "hit_miss": tier_panels.hit_miss_panel(), "pd": tier_panels.pd_panel()}


def transfers_figure():
    from ..viz import tier_panels

    return tier_panels.transfers_figure()


def measured_engines() -> str:
    """The best bandwidth and the smallest block's time each recorded transfer engine reached."""
    best = {}
    for payload in kv_transfer_series().values():
        for engine, entry in payload["engines"].items():
            rows = entry["layouts"].get("contiguous")
            if rows is not None:
                best[engine] = (float(rows["bandwidth_bytes_per_s_median"].max()), float(rows["time_s_median"].min()))
    return ", ".join(f"{e} {fmt.si(bw, 'B/s')} at best, {fmt.seconds(lat)} for the smallest block"
                     for e, (bw, lat) in sorted(best.items())) or "none recorded yet"


def numbers() -> dict[str, str]:
    art = article_numbers()
    t = art["transfer_s"]
    nic = tiers.get_placement("ib-200g").bandwidth_bytes_per_s()
    out = {
        "kv_token_kib": fmt.sig(art["kv_bytes_per_token"] / 1024, 3),
        "mha_over_gqa": fmt.fixed(cost.kv_bytes_per_token("llama-2-7b") / cost.kv_bytes_per_token(ARTICLE_MODEL), 0),
        "nic_200g": fmt.si(nic, "B/s"),
        "nic_200g_sold": f"{fmt.sig(nic * 8 / 1e9, 3)} Gb/s",
        "article_200": fmt.si(ARTICLE_IB_BYTES_PER_S, "B/s"),
        "realistic": fmt.percent(REALISTIC_LINK_EFFICIENCY, 2),
        "kv_4k_mib": fmt.fixed(art["kv_bytes_4k_request"] / 2**20, 0),
        "kv_32": fmt.gib(art["kv_bytes_32_requests"]),
        "kv_32_gb": fmt.si(art["kv_bytes_32_requests"], "B"),
        "weights": fmt.si(art["weight_bytes"], "B"),
        "t_10g": fmt.seconds(t["ethernet-10g"]),
        "t_10g_60": fmt.seconds(t["ethernet-10g at 60%"]),
        "t_200gbit": fmt.seconds(t["ib-200g (200 Gb/s)"]),
        "t_200gbyte": fmt.seconds(t["200 GB/s"]),
        "t_nvlink": fmt.seconds(t["nvlink4"]),
        "art_step": fmt.seconds(art["decode_step_s"]),
        "t_10g_steps": fmt.fixed(t["ethernet-10g"] / art["decode_step_s"], 0),
        "measured_engines": measured_engines(),
    }
    for panel in panels().values():
        out.update(panel.readout_texts())
    return out

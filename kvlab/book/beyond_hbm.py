"""Chapter 3, "When HBM is not enough": how big the KV gets, reading it from a slower
tier, when a hit is a liability, and moving KV between prefill and decode."""

from __future__ import annotations

import functools

from .. import cost, fmt, tiers
from ..article import (
    ARTICLE_BANDWIDTH_BYTES_PER_S,
    ARTICLE_CONTEXT_TOKENS,
    ARTICLE_IB_BYTES_PER_S,
    ARTICLE_MODEL,
)
from ..bench.report import kv_transfer_series
from ..deployment import Ceiling, Deployment, KernelTables
from ..hardware import USABLE_MEMORY_FRACTION
from ..models import describe_params, get_model
from ..sim.costs import pipeline_time_s
from ..tiers import TierPath
from ..viz import i18n
from .bandwidth_wall import attention_intensity, large_batch_intensity
from .lang import pick

#: The share of a link's line rate a realistic transfer reaches (quoted in the prose).
REALISTIC_LINK_EFFICIENCY = 0.6


def article_numbers(
    model=ARTICLE_MODEL, bandwidth_bytes_per_s=ARTICLE_BANDWIDTH_BYTES_PER_S
) -> dict:
    """The article's section-3 numbers as kvlab computes them (pure bandwidth, no latency)."""
    ctx = ARTICLE_CONTEXT_TOKENS
    d = Deployment(model, "h100-sxm", bandwidth_bytes_per_s=bandwidth_bytes_per_s)
    kv_tok = d.kv_bytes_per_token
    request = ctx * kv_tok
    step = cost.decode_step(d, 1, ctx)

    def over(tier=None, bw=None, eff=1.0):
        return tiers.kv_fetch_time_s(d, ctx, TierPath(tier or "ib-200g", eff, bw, latency_s=0.0))

    return {
        "kv_bytes_per_token": kv_tok,
        "kv_bytes_4k_request": request,
        "kv_bytes_32_requests": 32 * request,
        "weight_bytes": d.weight_bytes,
        "transfer_s": {
            "ethernet-10g": over("ethernet-10g"),
            "ethernet-10g at 60%": over("ethernet-10g", eff=REALISTIC_LINK_EFFICIENCY),
            "ib-200g (200 Gb/s)": over("ib-200g"),
            "200 GB/s": over(bw=ARTICLE_IB_BYTES_PER_S),
            "ib-400g": over("ib-400g"),
            "nvlink4": over("nvlink4"),
            "pcie5-x16": over("pcie5-x16"),
        },
        "decode_step_s": step.step_time_s,  # batch 1, 4K context at the article's 2 TB/s
    }


@functools.cache
def panels() -> dict:
    from ..viz import beyond_hbm as figures  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    return {
        "footprint": figures.footprint_panel(),
        "tier_read": figures.tier_read_panel(),
        "hit_miss": figures.hit_miss_panel(),
        "pd": figures.pd_panel(),
    }


def transfers_figure():
    from ..viz import beyond_hbm as figures  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    return figures.transfers_figure()


def measured_engines() -> str:
    """The best bandwidth and the smallest block's time each recorded transfer engine reached."""
    best = {}
    for payload in kv_transfer_series().values():
        for engine, entry in payload["engines"].items():
            rows = entry["layouts"].get("contiguous")
            if rows is not None:
                best[engine] = (
                    float(rows["bandwidth_bytes_per_s_median"].max()),
                    float(rows["time_s_median"].min()),
                )
    if not best:
        return pick("none recorded yet", "尚无记录")
    parts = [(e, fmt.si(bw, "B/s"), fmt.seconds(lat)) for e, (bw, lat) in sorted(best.items())]
    return pick(
        ", ".join(f"{e} {bw} at best, {lat} for the smallest block" for e, bw, lat in parts),
        "；".join(f"{e} 最高 {bw}，最小的块 {lat}" for e, bw, lat in parts),
    )


def _as_sold(bytes_per_s: float) -> str:
    """A NIC's bandwidth as it is sold, in bits: 25 GB/s -> '200 Gb/s'."""
    return f"{fmt.sig(bytes_per_s * 8 / 1e9, 3)} Gb/s"


def numbers() -> dict[str, str]:
    art = article_numbers()
    t = art["transfer_s"]
    nic = tiers.get_placement("ib-200g").bandwidth_bytes_per_s()
    out = {
        "kv_token_kib": fmt.sig(art["kv_bytes_per_token"] / 1024, 3),
        "mha_over_gqa": fmt.fixed(
            cost.kv_bytes_per_token("llama-2-7b") / cost.kv_bytes_per_token(ARTICLE_MODEL), 0
        ),
        "nic_200g": fmt.si(nic, "B/s"),
        "nic_200g_sold": _as_sold(nic),
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
        out.update(_words(panel.readout_texts()))
    # the tier reads with the kernels measured on the H100 (chapter 2b), for the prose
    out.update(_words(panels()["tier_read"].readout_texts("tier-read-measured", speed="measured")))
    out["hit-miss_breakeven_host4"] = _breakeven_words(out["hit-miss_breakeven_host4"])
    out.update(_hit_numbers())
    out.update(_breakeven_numbers())
    out.update(measured_tier_numbers())
    out.update(mla_numbers())
    out["t_400g"] = fmt.seconds(t["ib-400g"])
    nic_400g = tiers.get_placement("ib-400g").bandwidth_bytes_per_s()
    out["nic_400g"] = fmt.si(nic_400g, "B/s")
    out["nic_400g_sold"] = _as_sold(nic_400g)
    out["article_200_cards"] = fmt.sig(ARTICLE_IB_BYTES_PER_S / nic_400g, 2)
    out["usable_fraction"] = fmt.percent(USABLE_MEMORY_FRACTION, 2)
    return out


def _words(texts: dict[str, str]) -> dict[str, str]:
    """Readout texts for the prose, their words ('yes', 'never') in the edition's language."""
    return {key: i18n.t(text) for key, text in texts.items()}


def _breakeven_words(text: str) -> str:
    """The shortest prompt a hit pays for, as the Chinese sentence asks it ('how long?'):
    a count of tokens, or that no length does ('never' in English)."""
    if text in ("never", i18n.t("never")):
        return pick("never", "任何长度都不划算")
    return pick(text, f"{text} 个 token")


def _hit_numbers() -> dict[str, str]:
    c = hit_conditions()
    out = {
        f"hc_{name}_{k}": fmt.seconds(v[k])
        for name, v in c.items()
        if isinstance(v, dict)
        for k in ("miss_s", "hit_s")
    }
    out.update(
        {
            "hc_realistic_eff": fmt.percent(REALISTIC_PREFILL_EFFICIENCY, 2),
            "hc_realistic_link": fmt.percent(REALISTIC_LINK_SHARE, 2),
            "hc_copies": fmt.fixed(c["block_copies"]["copies"], 0),
            "hc_per_copy": fmt.seconds(c["block_copies"]["per_copy_s"]),
            "hc_block_tokens": fmt.fixed(SWAP_BLOCK_TOKENS, 0),
            "hc_short_prompt": fmt.fixed(c["short_prompt_tokens"], 0),
        }
    )
    return out


# -------------------------------------------------- when is a hit slower than a miss?

#: The article's anecdote as kvlab reproduces it: full multi-head KV (Llama 2 7B), a 4K
#: prompt, a full hit read from host memory over PCIe 4.0 before the last token computes,
#: an H100 at the peaks of its data sheet.
ANECDOTE = dict(model="llama-2-7b", tier="host-pcie4", prompt_tokens=4096)
#: A realistic share of peak FLOP/s for prefill (model FLOPs utilisation) and of PCIe.
REALISTIC_PREFILL_EFFICIENCY = 0.6
REALISTIC_LINK_SHARE = 0.8
#: vLLM-style swapping copies one block per layer for K and for V: 16-token blocks.
SWAP_BLOCK_TOKENS = 16


def _hit(
    model, tier, prompt_tokens, efficiency=1.0, tier_efficiency=1.0, latency_s=None, overlap=False
) -> dict:
    h = tiers.hit_value(
        Deployment(model, "h100-sxm", speed=Ceiling(efficiency)),
        prompt_tokens,
        TierPath(tier, tier_efficiency, latency_s=latency_s),
        1.0,
    )
    hit = float(h.hit_time_s)
    if overlap:  # fetch layer by layer while the uncached part computes
        hit = pipeline_time_s(
            float(h.fetch_time_s), float(h.hit_compute_time_s), get_model(model).num_layers
        )
    return {"miss_s": float(h.miss_time_s), "hit_s": hit, "pays": hit < float(h.miss_time_s)}


def hit_conditions() -> dict[str, dict]:
    """The anecdote, each of its conditions changed alone, and real liabilities."""
    a = ANECDOTE
    blocks = -(-a["prompt_tokens"] // SWAP_BLOCK_TOKENS)
    per_copy = tiers.LINK_LATENCY_S["pcie5-x16"]
    copies = blocks * get_model("llama-3.1-8b").num_layers * 2
    return {
        "anecdote": _hit(**a),
        "pcie5": _hit(a["model"], "host-pcie5", a["prompt_tokens"]),
        "gqa": _hit("article-7b", a["tier"], a["prompt_tokens"]),
        "realistic": _hit(**a, efficiency=REALISTIC_PREFILL_EFFICIENCY),
        "realistic_both": _hit(
            **a, efficiency=REALISTIC_PREFILL_EFFICIENCY, tier_efficiency=REALISTIC_LINK_SHARE
        ),
        "overlap": _hit(**a, overlap=True),
        "remote_10gbe": _hit("llama-3.1-8b", "remote-10gbe", a["prompt_tokens"]),
        "block_copies": {
            **_hit("llama-3.1-8b", "host-pcie5", a["prompt_tokens"], latency_s=copies * per_copy),
            "copies": copies,
            "per_copy_s": per_copy,
        },
        "short_prompt_tokens": float(
            tiers.breakeven_prompt_tokens(Deployment("llama-3.1-8b", "h100-sxm"), "host-pcie5")
        ),
    }


def breakeven_beyond_the_window(model: str = "llama-2-7b", tier: str = "host-pcie4") -> dict:
    """The shortest prompt a full hit from `tier` pays for, inside the model's context
    window (inf: none does) and with the window raised to the ledger's limit."""
    d = Deployment(model, "h100-sxm")
    return {
        "window": d.model.max_position_embeddings,
        "inside_window": float(tiers.breakeven_prompt_tokens(d, tier)),
        "uncapped": float(tiers.breakeven_prompt_tokens(d, tier, max_tokens=1 << 20)),
    }


def _breakeven_numbers() -> dict[str, str]:
    b = breakeven_beyond_the_window(ANECDOTE["model"], ANECDOTE["tier"])
    return {
        "hc_window": fmt.fixed(b["window"], 0),
        "hc_breakeven_uncapped": fmt.fixed(b["uncapped"], 0),
    }


# ------------------------------------------------ measured kernels, links at a share

#: The tier panel's starting point, for the prose's measured-mode numbers.
TIER_MODEL, TIER_BATCH, TIER_CONTEXT = ARTICLE_MODEL, 8, 4096


def measured_tier_reads(link_share: float = 1.0) -> dict:
    """Tokens/s at the tier panel's starting point with the decode kernels measured on the
    H100 (chapter 2b: the step with all KV in HBM) plus the KV's trip over each path at
    `link_share` of its line rate every step (the tables time kernels, not links), as the
    panel's measured mode adds them; and the slowdown of host memory against HBM."""
    d = Deployment(TIER_MODEL, "h100-sxm")
    tables = d.replace(speed=KernelTables())
    kernel_s = cost.decode_step(tables, TIER_BATCH, TIER_CONTEXT).step_time_s
    out = {"hbm": TIER_BATCH / kernel_s}
    for name, placement in (("host", "host-pcie5"), ("remote", "remote-ib-400g")):
        path = TierPath(placement, link_share)
        trip = tiers.tiered_decode_step(d, TIER_BATCH, TIER_CONTEXT, path).tier_time_s
        out[name] = TIER_BATCH / (kernel_s + float(trip))
    out["host_slowdown"] = out["hbm"] / out["host"]
    return out


def measured_tier_numbers() -> dict[str, str]:
    shared = measured_tier_reads(REALISTIC_LINK_SHARE)
    return {
        "tm_link_share": fmt.percent(REALISTIC_LINK_SHARE, 2),
        "tm_host_share": fmt.rate(shared["host"]),
        "tm_remote_share": fmt.rate(shared["remote"]),
        "tm_host_share_slowdown": f"{fmt.sig(shared['host_slowdown'], 3)}×",
    }


# ------------------------------------------------------------------ MLA's latent


def mla_numbers(hardware: str = "h100-sxm", context: int = 4096) -> dict[str, str]:
    """Multi-head latent attention: KV bytes per token, the FLOPs per byte of KV a large
    batch reaches at `context` (chapter 2's intensity limit: a sequence's FLOPs through the
    weights and its attention), and attention's alone, against a GQA model."""
    v3 = get_model("deepseek-v3")
    v3_on, gqa = Deployment(v3, hardware), Deployment("llama-3.1-8b", hardware)
    return {
        "mla_latent": fmt.fixed(v3.kv_lora_rank, 0),
        "mla_rope": fmt.fixed(v3.qk_rope_head_dim, 0),
        "mla_v2_lite": fmt.fixed(cost.kv_bytes_per_token("deepseek-v2-lite"), 0),
        "mla_v3": fmt.fixed(cost.kv_bytes_per_token("deepseek-v3"), 0),
        "mla_article": fmt.fixed(cost.kv_bytes_per_token(ARTICLE_MODEL), 0),
        "mla_v3_heads": fmt.fixed(v3.num_heads, 0),
        "mla_v3_params": describe_params(v3.params.total),
        "mla_context": fmt.fixed(context, 0),
        "mla_v3_intensity": fmt.sig(large_batch_intensity(v3_on, context), 2),
        "mla_gqa_intensity": fmt.sig(large_batch_intensity(gqa, context), 2),
        "mla_v3_attention": fmt.sig(attention_intensity(v3_on), 3),
        "mla_gqa_attention": fmt.sig(attention_intensity(gqa), 2),
        "mla_ridge": fmt.sig(cost.decode_step(v3_on, 1, 1).ridge_flops_per_byte, 3),
    }

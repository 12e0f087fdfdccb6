"""Chapter 2, "The bandwidth wall": tiers, the ledger of one step, batching, long
contexts, quantization and the roofline."""

from __future__ import annotations

import functools

import numpy as np

from .. import cost, fmt
from ..article import ARTICLE_BANDWIDTH_BYTES_PER_S, ARTICLE_CONTEXT_TOKENS, ARTICLE_MODEL
from ..deployment import Deployment, KernelTables
from ..hardware import get_device, get_tier
from ..models import get_model
from ..operators import operator_work, pass_counts
from ..published import kv_quantization
from ..viz.i18n import t
from .lang import pick

#: Tiers whose bandwidth the prose quotes.
QUOTED_TIERS = (
    "hbm3e",
    "hbm3",
    "hbm2e",
    "gddr6x",
    "gddr6",
    "ddr5",
    "pcie4-x16",
    "pcie5-x16",
    "ib-200g",
    "ib-400g",
    "nvlink4",
)
#: The network card of the book's node: one 400 Gb/s NIC per GPU (chapter 3).
NIC = "ib-400g"
#: A point where one max over the whole step and the sum over operators differ: a large
#: batch at a short context (its GEMMs compute-bound, its attention memory-bound).
MIXED_BATCH, MIXED_CONTEXT = 1024, 256
#: The batch the article's amortisation example uses.
ARTICLE_BATCH = 16


def article_steps() -> tuple[cost.DecodeStep, cost.DecodeStep]:
    """The article's worked ledger: its 7B at a 4K context on a 2 TB/s device, batch 1 and 16."""
    d = Deployment(ARTICLE_MODEL, "h100-sxm", bandwidth_bytes_per_s=ARTICLE_BANDWIDTH_BYTES_PER_S)
    return (
        cost.decode_step(d, 1, ARTICLE_CONTEXT_TOKENS),
        cost.decode_step(d, ARTICLE_BATCH, ARTICLE_CONTEXT_TOKENS),
    )


@functools.cache
def panels() -> dict:
    """The chapter's panels, built once per kernel: the decode step (one control bar for the
    ledger, the batch and context sweeps and the roofline) and quantization."""
    from ..viz import bandwidth_wall as figures  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    return {
        "ledger": figures.decode_step_panel(),
        "quantization": figures.quantization_panel(),
    }


def tiers_figure():
    from ..viz import bandwidth_wall as figures  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    return figures.tiers_figure()


def numbers() -> dict[str, str]:
    from ..viz import bandwidth_wall as figures  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    out = {
        f"tier_{name}": fmt.si(get_tier(name).bandwidth_bytes_per_s, "B/s") for name in QUOTED_TIERS
    }
    ddr5 = get_tier("ddr5")
    out.update(
        {
            "ddr5_derivation": t(ddr5.derivation),
            "ddr5_two_channels": fmt.si(ddr5.bandwidth_bytes_per_s / 4, "B/s"),
            "hbm_over_pcie": fmt.fixed(
                get_tier("hbm3e").bandwidth_bytes_per_s
                / get_tier("pcie5-x16").bandwidth_bytes_per_s,
                0,
            ),
            "band_low": fmt.percent(figures.ACHIEVABLE_BAND[0]),
            "band_high": fmt.percent(figures.ACHIEVABLE_BAND[1]),
            "ib200_derivation": t(get_tier("ib-200g").derivation),
            "nic_derivation": t(get_tier(NIC).derivation),
            "nic_sold": _as_sold(get_tier(NIC).bandwidth_bytes_per_s),
        }
    )
    art, art16 = article_steps()
    p = panels()
    led = p["ledger"].values()
    out.update(
        {
            "art_bandwidth": fmt.si(ARTICLE_BANDWIDTH_BYTES_PER_S, "B/s"),
            "art16_batch": fmt.fixed(art16.batch, 0),
            "ledger_memory_over_compute": fmt.sig(led["memory_time_s"] / led["compute_time_s"], 3),
            "art_kv_token": fmt.fixed(art.kv_bytes_per_token, 0),
            "art_kv_read": fmt.si(art.kv_read_bytes, "B"),
            "art_step": fmt.si(art.step_bytes, "B"),
            "art_tps": fmt.rate(art.tokens_per_s),
            "art16_tps": fmt.rate(art16.tokens_per_s),
            "art16_each": fmt.rate(art16.tokens_per_s_per_sequence),
        }
    )
    for name in ("ledger", "quantization"):
        out.update(p[name].readout_texts())
    base = p["ledger"].default_state
    d = Deployment(base["model"], base["hardware"])
    ridge = cost.decode_step(d, 1, 1).ridge_flops_per_byte
    out.update(_step_definition_numbers(d, base["context"]))
    kv_equals_16 = kv_equals_weights_context(d, ARTICLE_BATCH)
    out.update(
        {
            "kvw_batch": fmt.fixed(ARTICLE_BATCH, 0),
            "kvw_context_batch": fmt.fixed(kv_equals_16, 0),
            "wall_context": fmt.fixed(base["context"], 0),
            "wall_limit": fmt.sig(large_batch_intensity(d, base["context"]), 2),
            "wall_attention": fmt.sig(attention_intensity(d), 2),
            "wall_ridge": fmt.sig(ridge, 3),
            "wall_longest_context": fmt.fixed(longest_compute_bound_context(d), 0),
            "wall_device": get_device(base["hardware"]).display_name,
        }
    )
    out.update({k: fmt.sig(v, 2) for k, v in tier_step_ratios().items()})
    out.update(_moe_and_quantization_numbers())
    short, long_ = (flash_attention_effect(d, ctx) for ctx in (base["context"], 32768))
    out.update(
        {
            "flash_attn_naive": fmt.sig(short["attention_intensity_naive"], 2),
            "flash_context": fmt.fixed(base["context"], 0),
            "flash_ratio": f"{fmt.sig(short['time_ratio'], 3)}×",
            "flash_ratio_32k": f"{fmt.sig(long_['time_ratio'], 3)}×",
        }
    )
    quant = p["quantization"].default_state
    out.update(
        {
            "ledger_model_name": get_model(base["model"]).display_name,
            "ledger_device_name": get_device(base["hardware"]).display_name,
            "quant_context": fmt.fixed(quant["context"], 0),
            "quant_batch": fmt.fixed(quant["batch"], 0),
        }
    )
    return out


def worked_example() -> str:
    """The chapter's checked printout (nbval compares it in English; the Chinese edition
    prints the same numbers in Chinese)."""
    art, art16 = article_steps()
    kv, kv_read = f"{art.kv_bytes_per_token:,.0f} B", f"{art.kv_read_bytes:,.0f} B"
    step, tps = f"{art.step_bytes / 1e9:.2f} GB", f"{art.tokens_per_s:.1f} tokens/s"
    total = f"{art16.tokens_per_s:.0f} tokens/s"
    each = f"{art16.tokens_per_s_per_sequence:.1f}"
    return "\n".join(
        [
            pick(
                f"KV per token: {kv}; KV read at 4K: {kv_read}",
                f"每个 token 的 KV：{kv}；4K 上下文读取的 KV：{kv_read}",
            ),
            pick(
                f"step: {step} -> {tps} at 2 TB/s, batch 1",
                f"每步：{step} -> 带宽 2 TB/s、批大小 1 时 {tps}",
            ),
            pick(
                f"batch 16: {total} in aggregate, {each} per sequence",
                f"批大小 16：总计 {total}，每个序列 {each}",
            ),
        ]
    )


def _as_sold(bytes_per_s: float) -> str:
    """A NIC's bandwidth as it is sold, in bits: 50 GB/s -> '400 Gb/s'."""
    return f"{fmt.sig(bytes_per_s * 8 / 1e9, 3)} Gb/s"


def _source(citation: str) -> str:
    """A published figure's citation in the edition's language ('(abstract)': 摘要)."""
    return pick(citation, citation.replace(" (abstract)", "（摘要）"))


# ------------------------------------------------------------- how long a step takes


def step_definitions(d: Deployment, batch, context) -> dict:
    """The ledger's step time, the sum over operators of max(bytes / bandwidth, FLOPs / peak)
    (`step_time_s`), against one max over the whole step, max(step bytes / bandwidth, step
    FLOPs / peak): equal when every operator is bound by the same resource, larger when some
    are compute-bound and others memory-bound."""
    s = cost.decode_step(d, batch, context)
    return {
        "sum_s": float(s.step_time_s),
        "whole_max_s": float(max(s.memory_time_s, s.compute_time_s)),
    }


def _step_definition_numbers(d: Deployment, context) -> dict[str, str]:
    start = step_definitions(d, 1, context)
    mixed = step_definitions(d, MIXED_BATCH, MIXED_CONTEXT)
    return {
        "stepdef_start_sum": fmt.seconds(start["sum_s"]),
        "stepdef_start_max": fmt.seconds(start["whole_max_s"]),
        "stepdef_batch": fmt.fixed(MIXED_BATCH, 0),
        "stepdef_context": fmt.fixed(MIXED_CONTEXT, 0),
        "stepdef_mixed_sum": fmt.seconds(mixed["sum_s"]),
        "stepdef_mixed_max": fmt.seconds(mixed["whole_max_s"]),
    }


def kv_equals_weights_context(d: Deployment, batch) -> int:
    """The context at which a step's KV reads equal the weights it reads, at `batch`."""
    one = cost.decode_step(d, 1, 1)
    return int(one.weight_read_bytes // (batch * one.kv_bytes_per_token))


def attention_intensity(d: Deployment) -> float:
    """FLOPs decode attention does per byte of KV it reads (long contexts, any batch): the
    query's scores and weighted sum over each cached token, against that token's KV bytes
    (the attention group of the deployment's operator table). Unlike the weights, the KV is
    not shared by the batch, so no batch raises this."""
    return float(d.table.groups["attention"].flops_per_pair / d.kv_bytes_per_token)


# ------------------------------------------------ what batching cannot do at long contexts


def large_batch_intensity(d: Deployment, context) -> float:
    """FLOPs per byte a decode step of deployment `d` tends to as the batch grows without
    bound.

    Weights are read once per step, so at a large batch they stop counting; each sequence
    still brings its own KV and its own FLOPs, so the intensity levels off at
    (FLOPs per sequence) / (KV bytes per sequence), whatever the batch. Those FLOPs are all
    of a sequence's: its token through the weights (2 per parameter) and its attention; the
    attention alone is `attention_intensity`.
    """
    one = cost.decode_step(d, 1, context)
    return float(one.flops / (one.kv_read_bytes + one.kv_write_bytes))


def longest_compute_bound_context(d: Deployment) -> int:
    """The longest context at which a large enough batch reaches the device's ridge point
    (0 if none does): beyond it, no batch makes decode compute-bound."""
    ridge = cost.decode_step(d, 1, 1).ridge_flops_per_byte
    lo, hi = 0, int(cost.MAX_CONTEXT_TOKENS)
    if large_batch_intensity(d, 1) < ridge:
        return 0
    while hi - lo > 1:  # the intensity limit falls as the context grows
        mid = (lo + hi) // 2
        if large_batch_intensity(d, mid) >= ridge:
            lo = mid
        else:
            hi = mid
    return lo


def tier_step_ratios(nic: str = NIC) -> dict[str, float]:
    """How much bandwidth each step down the hierarchy costs, from the catalogue: HBM3e to
    8-channel DDR5 host memory, DDR5 to the PCIe 5.0 x16 link it reaches the GPU through,
    PCIe 5.0 to one NIC (the book's 400 Gb/s per GPU), and HBM3e to that NIC end to end."""
    bw = {name: get_tier(name).bandwidth_bytes_per_s for name in ("hbm3e", "ddr5", "pcie5-x16")}
    nic_bw = get_tier(nic).bandwidth_bytes_per_s
    return {
        "hbm_over_ddr": bw["hbm3e"] / bw["ddr5"],
        "ddr_over_pcie": bw["ddr5"] / bw["pcie5-x16"],
        "pcie_over_nic": bw["pcie5-x16"] / nic_bw,
        "hbm_over_nic": bw["hbm3e"] / nic_bw,
    }


# ----------------------------------------------------- FlashAttention, operator by operator


def flash_attention_effect(d: Deployment, prompt_tokens) -> dict:
    """What FlashAttention changes in one prefill: the attention operator's FLOPs per byte
    with and without it (the score matrices' round trips through memory), and the prefill
    time without it over the time with it (the ledger's per-operator ceiling)."""
    attention = next(op for op in d.table.operators if op.kind == "attention")
    counts = pass_counts(1, prompt_tokens, 0)

    def attention_intensity(flash):
        nbytes, flops = operator_work(attention, d.table, counts, flash)
        return float(flops / nbytes)

    with_flash = cost.prefill(d, prompt_tokens)
    without = cost.prefill(d, prompt_tokens, flash_attention=False)
    return {
        "attention_intensity_naive": attention_intensity(False),
        "attention_intensity_flash": attention_intensity(True),
        "time_ratio": float(without.time_s / with_flash.time_s),
    }


# ----------------------------------------------------------- MoE, and what quantizing costs


def _moe_and_quantization_numbers() -> dict[str, str]:
    moe = moe_weight_reads()
    kivi, kvquant, fp8 = (
        kv_quantization("kivi"),
        kv_quantization("kvquant"),
        kv_quantization("vllm_fp8"),
    )
    int4_batch, fp16_batch = int4_compute_bound_batch("llama-3.1-8b", "h100-sxm", 256)
    return {
        "moe_b1": fmt.si(moe["weight_read_bytes"][0], "B"),
        "moe_b8": fmt.si(moe["weight_read_bytes"][1], "B"),
        "moe_b32": fmt.si(moe["weight_read_bytes"][2], "B"),
        "moe_b128": fmt.si(moe["weight_read_bytes"][3], "B"),
        "moe_all": fmt.si(moe["weight_bytes"], "B"),
        "kivi_bits": str(kivi["kv_bits"]),
        "kivi_memory": fmt.sig(kivi["peak_memory_reduction"], 2),
        "kivi_batch": fmt.sig(kivi["max_batch_gain"], 2),
        "kivi_low": fmt.sig(kivi["throughput_gain_low"], 3),
        "kivi_high": fmt.sig(kivi["throughput_gain_high"], 3),
        "kivi_source": _source(kivi["source"]),
        "kvquant_bits": str(kvquant["kv_bits"]),
        "kvquant_ppl": fmt.sig(kvquant["perplexity_increase_below"], 1),
        "kvquant_source": _source(kvquant["source"]),
        "fp8_source": fp8["source"],
        "int4_compute_batch": fmt.fixed(int4_batch, 0),
        "fp16_compute_batch": fmt.fixed(fp16_batch, 0),
        "int4_measured_speedup": f"{fmt.sig(measured_int4_speedup(), 2)}×",
        "int4_bytes_speedup": f"{fmt.sig(ceiling_int4_speedup(), 2)}×",
    }


def moe_weight_reads(model: str = "mixtral-8x7b", batches=(1, 8, 32, 128)) -> dict:
    """Weight bytes a decode step streams against the batch: a mixture of experts reads
    only the experts its tokens pick, so a bigger batch touches (and streams) more of them."""
    return {
        "batch": list(batches),
        "weight_read_bytes": [float(cost.weight_read_bytes(model, b)) for b in batches],
        "weight_bytes": float(cost.weight_bytes(model)),
    }


def int4_compute_bound_batch(model, hardware, context, kv_dtype="fp8") -> tuple[int, int]:
    """The smallest batch (on a powers-of-two grid up to 4096) at which decode turns
    compute-bound with int4 weights, and with fp16 weights and KV (0: none on the grid)."""
    grid = 2 ** np.arange(0, 13)

    def first(wdt, kdt):
        bound = np.asarray(
            cost.decode_step(Deployment(model, hardware, wdt, kdt), grid, context).bound
        )
        hit = np.flatnonzero(bound == "compute")
        return int(grid[hit[0]]) if hit.size else 0

    return first("int4", kv_dtype), first("fp16", "fp16")


def ceiling_int4_speedup(
    model: str = "llama-3.1-8b", hardware: str = "a100-80gb", context: int = 1024
) -> float:
    """What the bytes promise: the same step's ceiling with int4 weights over bf16 (the
    weights are nearly all of a one-token step's bytes, so nearly 4x)."""
    bf16 = cost.decode_step(Deployment(model, hardware, "bf16"), 1, context)
    int4 = cost.decode_step(Deployment(model, hardware, "int4"), 1, context)
    return float(bf16.step_time_s / int4.step_time_s)


def measured_int4_speedup(
    model: str = "llama-3.1-8b", hardware: str = "a100-80gb", context: int = 1024
) -> float:
    """Measured int4 weight-only decode at batch 1 over bf16, from the kernel tables (the
    only device whose tables have int4 GEMMs is the A100): unpacking costs the kernels."""
    bf16 = cost.decode_step(Deployment(model, hardware, "bf16", speed=KernelTables()), 1, context)
    int4 = cost.decode_step(Deployment(model, hardware, "int4", speed=KernelTables()), 1, context)
    return float(bf16.step_time_s / int4.step_time_s)

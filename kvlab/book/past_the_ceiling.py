"""Chapter 2c, "Past the per-user ceiling": the two levers that raise each user's tokens/s
for the same bandwidth (verifying several tokens per pass over the weights; splitting the
weights over GPUs), and DeepSeek-V3 (MoE + MLA) worked through with both."""

from __future__ import annotations

import functools

import numpy as np

from .. import cost, fmt
from ..deployment import Ceiling, Deployment, KernelTables
from ..hardware import get_device
from ..kernel_tables import load
from ..models import describe_params, get_model
from ..operators import experts_touched
from ..parallel import allreduce_link
from ..speculative import breakeven_batch, speculative_step, tokens_per_verify_step
from ..viz.i18n import t
from .lang import pick

#: The chapter's running example: Llama 3.1 8B on one H100, bf16 weights and KV.
MODEL, DEVICE, DTYPES = "llama-3.1-8b", "h100-sxm", dict(weight_dtype="bf16", kv_dtype="bf16")
CONTEXT = 4096  # tokens per sequence
CEILING = Ceiling()  # the sheet's peaks: the chapter's default speed
BIG_BATCH = 64  # the batch the intro and the all-reduce paragraph compare with batch 1
#: Speculative decoding: drafted tokens per round, acceptance per drafted token, a longer
#: draft, and the short context at which the verify pass turns compute-bound.
SPEC_K, SPEC_A, SPEC_K_LONG, SHORT_CONTEXT = 4, 0.7, 8, 256
#: Tensor parallelism: a model that fits no single H100 in bf16.
TP_MODEL, TP_DEGREE = "llama-3.1-70b", 8
#: GPUs whose all-reduces cross PCIe instead of NVLink, and the batch the prose quotes them at.
PCIE_DEVICE, PCIE_BATCH = "l40s", 8
#: DeepSeek-V3 served as its authors' open deployments do: fp8 weights, 8 GPUs of one server.
V3, V3_DEVICE, V3_DTYPES = "deepseek-v3", "h200", dict(weight_dtype="fp8", kv_dtype="bf16")
V3_BATCHES = (1, 64, 128)  # 128 sequences of 4K tokens fit on 8 H200s
#: Published results the prose cites (facts from the papers; the sources say where).
PUBLISHED = {
    # The abstract changed between versions: v1 (August 2024) reports up to 1.84x for
    # Llama 3.1 8B on 8 A100s; the version published at ICLR 2025 (arXiv v4) up to 2.51x
    # "on various types of hardware and tasks". Both: batch sizes 32 to 256, "moderate to
    # long sequences", a draft model with a sparse (StreamingLLM) KV cache.
    "magicdec": {
        "speedup": 1.84,
        "iclr_speedup": 2.51,
        "model": "Llama 3.1 8B",
        "batch_low": 32,
        "batch_high": 256,
        "gpus": "8 NVIDIA A100s",
        "gpus_zh": "8 块 NVIDIA A100",
        "source": "Chen et al., MagicDec, arXiv:2408.11049v1, abstract",
        "source_zh": "Chen 等，MagicDec，arXiv:2408.11049v1，摘要",
        "iclr_source": "Sadhukhan et al., ICLR 2025, arXiv:2408.11049v4, abstract",
        "iclr_source_zh": "Sadhukhan 等，ICLR 2025，arXiv:2408.11049v4，摘要",
    },
    "v3_mtp": {
        "acceptance_low": 0.85,
        "acceptance_high": 0.90,
        "tokens_per_s_gain": 1.8,
        "source": "DeepSeek-AI, DeepSeek-V3 technical report, arXiv:2412.19437, §5.4.3",
        "source_zh": "DeepSeek-AI，DeepSeek-V3 技术报告，arXiv:2412.19437，§5.4.3",
    },
}


@functools.cache
def panels() -> dict:
    """The chapter's panels, built once per kernel (their terms take a few seconds)."""
    from ..viz import past_the_ceiling as figures  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    return {
        "speculative": figures.speculative_panel(),
        "tensor_parallel": figures.tensor_parallel_panel(),
    }


def numbers() -> dict[str, str]:
    out = {
        **intro_numbers(),
        **speculative_numbers(),
        **tensor_parallel_numbers(),
        **allreduce_numbers(),
        **deepseek_numbers(),
    }
    p = panels()
    readouts = {
        **p["speculative"].readout_texts(),
        **p["speculative"].readout_texts("spec_short", context=SHORT_CONTEXT),
        **p["tensor_parallel"].readout_texts("tp_panel"),
    }
    out.update({key: t(text) for key, text in readouts.items()})  # 'never', 'yes' in Chinese
    return out


def _deployment(model=MODEL, hardware=DEVICE, speed=CEILING, tensor_parallel=1, **dtypes):
    """`model` on `hardware` (bf16 weights and KV unless `dtypes` say otherwise)."""
    dtypes = {**DTYPES, **dtypes}
    return Deployment(
        model, hardware, dtypes["weight_dtype"], dtypes["kv_dtype"], speed, tensor_parallel
    )


def _step(model=MODEL, hardware=DEVICE, batch=1, context=CONTEXT, **kw) -> cost.DecodeStep:
    """A decode step of `_deployment(model, hardware, **kw)`."""
    return cost.decode_step(_deployment(model, hardware, **kw), batch, context)


def _times(x: float) -> str:
    return f"{fmt.sig(x, 3)}×"


# ------------------------------------------------------------------ the ceiling
def intro_numbers() -> dict[str, str]:
    """Batching raises the batch's tokens/s and lowers each user's."""
    one, big = _step(), _step(batch=BIG_BATCH)
    return {
        "model": get_model(MODEL).display_name,
        "device": get_device(DEVICE).display_name,
        "context": fmt.fixed(CONTEXT, 0),
        "b1_each": fmt.rate(one.tokens_per_s_per_sequence),
        "b1_step_bytes": fmt.si(one.step_bytes, "B"),
        "bandwidth": fmt.si(one.bandwidth_bytes_per_s, "B/s"),
        "big_batch": fmt.fixed(BIG_BATCH, 0),
        "big_all": fmt.rate(big.tokens_per_s),
        "big_each": fmt.rate(big.tokens_per_s_per_sequence),
    }


# ------------------------------------------------------------- speculative decoding
def spec(
    batch=1,
    context=CONTEXT,
    k=SPEC_K,
    a=SPEC_A,
    model=MODEL,
    hardware=DEVICE,
    draft_model=None,
    **kw,
):
    """A speculation round on `_deployment(model, hardware, **kw)`."""
    d = _deployment(model, hardware, **kw)
    return speculative_step(d, batch, context, k, a, draft_model)


def draft_head_bytes(model=MODEL, weight_dtype="bf16") -> tuple[float, float]:
    """(LM head bytes, one decoder layer's bytes) of a model: what a self-drafting head reads
    per drafted token besides its KV."""
    m = get_model(model)
    bpe = cost.weight_bytes(model, weight_dtype) / m.params.total
    head = m.vocab_size * m.hidden_size * bpe
    layer = (
        cost.weight_bytes(model, weight_dtype) - m.params.embedding * bpe - head
    ) / m.num_layers
    return head, layer


def speculative_numbers() -> dict[str, str]:
    one = spec()
    long_fit = int(one.max_batch)
    long_ = spec(batch=long_fit)
    ridge = float(_step().ridge_flops_per_byte)
    bpe = 2  # bf16: a weight matrix times m rows does 2m FLOPs per 2 bytes, m FLOPs per byte
    head, layer = draft_head_bytes()
    tp = dict(model=TP_MODEL, tensor_parallel=TP_DEGREE)
    by_8b, by_head = spec(draft_model=MODEL, **tp), spec(**tp)
    fit_70b = int(by_8b.max_batch)
    return {
        "spec_k": fmt.fixed(SPEC_K, 0),
        "spec_a": fmt.percent(SPEC_A, 2),
        "spec_k_long": fmt.fixed(SPEC_K_LONG, 0),
        "spec_tau": fmt.sig(tokens_per_verify_step(SPEC_A, SPEC_K), 3),
        "spec_tau_long": fmt.sig(tokens_per_verify_step(SPEC_A, SPEC_K_LONG), 3),
        "spec_tau_limit": fmt.sig(1 / (1 - SPEC_A), 3),
        "spec_verify_b1": _times(one.verify_step_time_s / one.baseline_step_time_s),
        "spec_draft_token": fmt.percent(one.draft_step_time_s / one.baseline_step_time_s),
        "spec_head_bytes": fmt.si(head, "B"),
        "spec_layer_bytes": fmt.si(layer, "B"),
        "spec_speedup_b1": _times(one.speculative_speedup),
        "spec_short_context": fmt.fixed(SHORT_CONTEXT, 0),
        "spec_ridge": fmt.sig(ridge, 3),
        "spec_plain_gemm_batch": fmt.fixed(ridge * bpe / 2, 0),
        "spec_verify_gemm_batch": fmt.fixed(ridge * bpe / 2 / (SPEC_K + 1), 0),
        "spec_long_fit": fmt.fixed(long_fit, 0),
        "spec_long_fit_speedup": _times(long_.speculative_speedup),
        "spec_70b_tp": fmt.fixed(TP_DEGREE, 0),
        "spec_70b_draft_token": fmt.percent(by_8b.draft_step_time_s / by_8b.baseline_step_time_s),
        "spec_70b_draft_b1": _times(by_8b.speculative_speedup),
        "spec_70b_head_b1": _times(by_head.speculative_speedup),
        "spec_70b_draft_breakeven": _never(
            breakeven_batch(
                _deployment(TP_MODEL, tensor_parallel=TP_DEGREE),
                CONTEXT,
                SPEC_K,
                SPEC_A,
                MODEL,
                max_batch=fit_70b,
            )
        ),
        "spec_70b_fit": fmt.fixed(fit_70b, 0),
        **_published_magicdec(),
    }


def _never(batch) -> str:
    return t("never") if batch is None else fmt.fixed(batch, 0)


def _published_magicdec() -> dict[str, str]:
    p = PUBLISHED["magicdec"]
    return {
        "magicdec_speedup": _times(p["speedup"]),
        "magicdec_iclr_speedup": _times(p["iclr_speedup"]),
        "magicdec_iclr_source": pick(p["iclr_source"], p["iclr_source_zh"]),
        "magicdec_model": p["model"],
        "magicdec_batches": pick(
            f"{p['batch_low']} to {p['batch_high']}", f"{p['batch_low']} 到 {p['batch_high']}"
        ),
        "magicdec_gpus": pick(p["gpus"], p["gpus_zh"]),
        "magicdec_source": pick(p["source"], p["source_zh"]),
    }


# ------------------------------------------------------------- tensor parallelism
def tp_steps(batch=1, model=TP_MODEL, hardware=DEVICE, speed=CEILING) -> dict[int, cost.DecodeStep]:
    """The model's decode step at 1, 2, 4 and 8 GPUs (bf16, the chapter's context)."""
    return {
        tp: _step(model, hardware, batch, speed=speed, tensor_parallel=tp) for tp in (1, 2, 4, 8)
    }


def tensor_parallel_numbers() -> dict[str, str]:
    s = tp_steps()
    one, eight = s[1], s[TP_DEGREE]
    m = get_model(TP_MODEL)
    link = allreduce_link(DEVICE, TP_DEGREE)
    out = {
        "tp_model": m.display_name,
        "tp_degree": fmt.fixed(TP_DEGREE, 0),
        "tp_weights": fmt.si(one.weight_bytes, "B"),
        "tp_capacity": fmt.si(one.capacity_bytes, "B"),
        "tp1_fits": t("yes" if one.fits else "no"),
        "tp_layers": fmt.fixed(m.num_layers, 0),
        "tp_allreduces": fmt.fixed(2 * m.num_layers, 0),
        "tp_hidden": fmt.fixed(m.hidden_size, 0),
        "tp_message_b1": fmt.si(m.hidden_size * 2, "B"),
        "tp_link_bw": fmt.si(link.bandwidth_bytes_per_s, "B/s"),
        "tp_latency": fmt.seconds(link.latency_s),
        "tp_latency_total": fmt.seconds(2 * m.num_layers * link.latency_s),
        "tp_link_time_b1": fmt.seconds(float(eight.allreduce_time_s - eight.allreduce_latency_s)),
        "tp1_step": fmt.seconds(one.step_time_s),
        "tp8_step": fmt.seconds(eight.step_time_s),
        "tp8_speedup": _times(one.step_time_s / eight.step_time_s),
        "tp8_share_b1": fmt.percent(eight.allreduce_time_s / eight.step_time_s),
        "tp1_each": fmt.rate(one.tokens_per_s_per_sequence),
        "tp8_each": fmt.rate(eight.tokens_per_s_per_sequence),
    }
    for tp, step in s.items():
        out[f"tp{tp}_weights"] = fmt.si(step.weight_bytes, "B")
        out[f"tp{tp}_max_batch"] = fmt.fixed(step.max_batch, 0)

    def at(batch, speed):
        return _step(TP_MODEL, DEVICE, batch, speed=speed, tensor_parallel=TP_DEGREE)

    tables = KernelTables()
    measured, big, big_measured = at(1, tables), at(BIG_BATCH, CEILING), at(BIG_BATCH, tables)
    out.update(
        {
            "tp8_measured_step": fmt.seconds(measured.step_time_s),
            "tp8_measured_over_ceiling": _times(measured.step_time_s / eight.step_time_s),
            "tp8_measured_share_b1": fmt.percent(measured.allreduce_time_s / measured.step_time_s),
            "tp8_share_big": fmt.percent(big.allreduce_time_s / big.step_time_s),
            **_pcie_numbers(),
            "tp8_measured_share_big": fmt.percent(
                big_measured.allreduce_time_s / big_measured.step_time_s
            ),
        }
    )
    return out


def _pcie_numbers() -> dict[str, str]:
    """The same split over GPUs whose all-reduces cross PCIe, measured."""
    s = _step(TP_MODEL, PCIE_DEVICE, PCIE_BATCH, speed=KernelTables(), tensor_parallel=TP_DEGREE)
    return {
        "pcie_device": get_device(PCIE_DEVICE).display_name,
        "pcie_batch": fmt.fixed(PCIE_BATCH, 0),
        "pcie_link_bw": fmt.si(allreduce_link(PCIE_DEVICE, TP_DEGREE).bandwidth_bytes_per_s, "B/s"),
        "pcie_measured_share": fmt.percent(s.allreduce_time_s / s.step_time_s),
    }


def allreduce_at_batch(batch=BIG_BATCH, model=TP_MODEL, hardware=DEVICE, gpus=TP_DEGREE) -> dict:
    """One all-reduce of a decode step's activations (batch x hidden bf16 elements) over
    `gpus` GPUs: measured (TensorRT-LLM's table), at the sheet's link bandwidth alone (ring
    traffic 2 (N - 1) / N of the message), and as the ceiling costs it (latency + sheet)."""
    elements = batch * get_model(model).hidden_size
    message = 2.0 * elements
    link = allreduce_link(hardware, gpus)
    sheet = 2 * (gpus - 1) / gpus * message / link.bandwidth_bytes_per_s
    measured = load(hardware).all_reduce(gpus).scalar(elements)
    return {
        "message_bytes": message,
        "measured_s": measured,
        "sheet_s": sheet,
        "ceiling_s": link.latency_s + sheet,
        "measured_over_sheet": measured / sheet,
        "measured_over_ceiling": measured / (link.latency_s + sheet),
    }


def allreduce_numbers() -> dict[str, str]:
    a = allreduce_at_batch()
    return {
        "ar_message": fmt.si(a["message_bytes"], "B"),
        "ar_measured": fmt.seconds(a["measured_s"]),
        "ar_sheet": fmt.seconds(a["sheet_s"]),
        "ar_over_sheet": _times(a["measured_over_sheet"]),
        "ar_over_ceiling": _times(a["measured_over_ceiling"]),
    }


# ------------------------------------------------------------------ DeepSeek-V3
def deepseek_numbers() -> dict[str, str]:
    m = get_model(V3)
    p = m.params
    steps = {b: _step(V3, V3_DEVICE, b, tensor_parallel=TP_DEGREE, **V3_DTYPES) for b in V3_BATCHES}
    h100 = _step(V3, DEVICE, 1, tensor_parallel=TP_DEGREE, **V3_DTYPES)
    reads = {b: float(cost.weight_read_bytes(V3, b, "fp8")) for b in V3_BATCHES}
    total = cost.weight_bytes(V3, "fp8")
    one, mid = steps[V3_BATCHES[0]], steps[V3_BATCHES[1]]
    out = {
        "v3_params": describe_params(p.total),
        "v3_active": describe_params(p.active_per_token(m.experts_per_token)),
        "v3_experts": fmt.fixed(m.num_experts, 0),
        "v3_topk": fmt.fixed(m.experts_per_token, 0),
        "v3_shared": fmt.fixed(m.num_shared_experts, 0),
        "v3_moe_layers": fmt.fixed(p.moe_layers, 0),
        "v3_weights": fmt.si(total, "B"),
        "v3_device": get_device(V3_DEVICE).display_name,
        "v3_capacity": fmt.si(one.capacity_bytes, "B"),
        "v3_per_gpu": fmt.si(one.weight_bytes, "B"),
        "v3_h100_fits": t("yes" if h100.fits else "no"),
        "v3_h100_capacity": fmt.si(h100.capacity_bytes, "B"),
        "v3_kv_token": fmt.fixed(one.kv_bytes_per_token, 0),
        "v3_kv_70b": fmt.fixed(cost.kv_bytes_per_token(TP_MODEL, "bf16"), 0),
        "v3_kv_ratio": _times(cost.kv_bytes_per_token(TP_MODEL, "bf16") / one.kv_bytes_per_token),
        "v3_max_batch": fmt.fixed(one.max_batch, 0),
        "v3_b1_per_gpu": fmt.si(one.weight_read_bytes, "B"),
        "v3_each_b1": fmt.rate(one.tokens_per_s_per_sequence),
        "v3_each_mid": fmt.rate(mid.tokens_per_s_per_sequence),
        "v3_all_mid": fmt.rate(mid.tokens_per_s),
        "v3_mid": fmt.fixed(V3_BATCHES[1], 0),
        "v3_share_b1": fmt.percent(one.allreduce_time_s / one.step_time_s),
    }
    for i, b in enumerate(V3_BATCHES):
        out[f"v3_read_{i}"] = fmt.si(reads[b], "B")
        out[f"v3_batch_{i}"] = fmt.fixed(b, 0)
    out["v3_read_mid_share"] = fmt.percent(reads[V3_BATCHES[1]] / total)
    out["v3_latent"] = fmt.fixed(m.kv_lora_rank, 0)
    out["v3_rope"] = fmt.fixed(m.qk_rope_head_dim, 0)
    out["v3_expert_gpu"] = fmt.si(p.expert / TP_DEGREE, "B")  # fp8: one byte per weight
    out.update(v3_fixed_cost_numbers())
    out.update(mtp_numbers())
    return out


def v3_fixed_costs(batch: int = 1) -> dict:
    """The ledger's own estimate of what a DeepSeek-V3 step pays besides moving its bytes
    (the measured tables have no MLA): every kernel of its operator list (kvlab.operators)
    at the smallest-kernel latency of the device's tables, as the measured mode charges the
    small kernels (kvlab.kernel_tables `kernel_floor_s`); the all-reduces already carry
    their latency in the ceiling. Each kernel then costs a fixed latency plus its bytes at
    the sheet's bandwidth: an optimistic estimate, since small products reach less of it."""
    ops = _deployment(V3, V3_DEVICE, tensor_parallel=TP_DEGREE, **V3_DTYPES).table.operators
    kernels = sum(op.calls for op in ops if op.kind != "allreduce")
    allreduces = sum(op.calls for op in ops if op.kind == "allreduce")
    floor_s = load(V3_DEVICE).kernel_floor_s
    ceiling = _step(V3, V3_DEVICE, batch, tensor_parallel=TP_DEGREE, **V3_DTYPES)
    fixed_s = kernels * floor_s
    return {
        "kernels": kernels,
        "allreduces": allreduces,
        "kernel_floor_s": floor_s,
        "fixed_s": fixed_s,
        "ceiling_step_s": float(ceiling.step_time_s),
        "with_fixed_tokens_per_s": batch / (float(ceiling.step_time_s) + fixed_s),
    }


def v3_fixed_cost_numbers() -> dict[str, str]:
    f = v3_fixed_costs()
    return {
        "v3_kernels": fmt.fixed(f["kernels"], 0),
        "v3_allreduces": fmt.fixed(f["allreduces"], 0),
        "v3_kernel_floor": fmt.seconds(f["kernel_floor_s"]),
        "v3_fixed": fmt.seconds(f["fixed_s"]),
        "v3_fixed_share": fmt.percent(f["fixed_s"] / f["ceiling_step_s"]),
        "v3_step_b1": fmt.seconds(f["ceiling_step_s"]),
        "v3_each_b1_fixed": fmt.rate(f["with_fixed_tokens_per_s"]),
    }


def mtp_numbers() -> dict[str, str]:
    """DeepSeek-V3's multi-token prediction as a one-token draft (K = 1) at the report's
    lower acceptance: its verify pass of two tokens per sequence touches more experts."""
    pub = PUBLISHED["v3_mtp"]
    m = get_model(V3)
    a = pub["acceptance_low"]
    b = np.array(V3_BATCHES)
    d = _deployment(V3, V3_DEVICE, tensor_parallel=TP_DEGREE, **V3_DTYPES)
    s = speculative_step(d, b, CONTEXT, 1, a)
    speedup, verify = np.asarray(s.speculative_speedup), np.asarray(s.verify_step_time_s)
    return {
        "mtp_a_low": fmt.percent(a, 2),
        "mtp_a_high": fmt.percent(pub["acceptance_high"], 2),
        "mtp_published": f"{fmt.sig(pub['tokens_per_s_gain'], 2)}×",
        "mtp_source": pick(pub["source"], pub["source_zh"]),
        "mtp_tau": fmt.sig(tokens_per_verify_step(a, 1), 3),
        "mtp_experts_1": fmt.fixed(m.experts_per_token, 0),  # one token: exactly its own
        "mtp_experts_2": fmt.sig(float(experts_touched(m.num_experts, m.experts_per_token, 2)), 3),
        "mtp_verify_b1": _times(float(verify[0] / np.asarray(s.baseline_step_time_s)[0])),
        "mtp_speedup_b1": _times(float(speedup[0])),
        "mtp_speedup_mid": _times(float(speedup[1])),
        "mtp_speedup_big": _times(float(speedup[2])),
        **mtp_peak_numbers(),
    }


def mtp_peak(max_batch: int = 512) -> dict:
    """Where multi-token prediction pays most in the ledger: the batch (1..max_batch) of the
    largest speedup, and how many experts per layer a plain step's tokens touch there
    (even, independent routing). Past it every expert is read anyway, and the verify pass's
    extra rows only cost."""
    m = get_model(V3)
    a = PUBLISHED["v3_mtp"]["acceptance_low"]
    b = np.arange(1, max_batch + 1)
    d = _deployment(V3, V3_DEVICE, tensor_parallel=TP_DEGREE, **V3_DTYPES)
    s = speculative_step(d, b, CONTEXT, 1, a)
    speedup = np.asarray(s.speculative_speedup)
    i = int(np.argmax(speedup))
    return {
        "batch": int(b[i]),
        "speedup": float(speedup[i]),
        "experts_touched": float(experts_touched(m.num_experts, m.experts_per_token, b[i])),
        "speedup_at_max": float(speedup[-1]),
    }


def mtp_peak_numbers() -> dict[str, str]:
    peak = mtp_peak()
    return {
        "mtp_peak_batch": fmt.fixed(peak["batch"], 0),
        "mtp_peak_experts": fmt.sig(peak["experts_touched"], 3),
    }


def worked_example() -> str:
    """The chapter's checked printout (nbval compares it): the 70B over 1-8 H100s at batch 1
    (in Chinese for the Chinese edition, with the same numbers)."""
    lines = [
        pick(
            f"{TP_MODEL} bf16 on H100s, batch 1, {CONTEXT}-token context:",
            f"{TP_MODEL}，bf16，H100，批大小 1，上下文 {CONTEXT} token：",
        )
    ]
    for tp, s in tp_steps().items():
        weights, step = f"{s.weight_bytes / 1e9:6.1f} GB", f"{s.step_time_s * 1e3:6.2f} ms"
        reduces, speed = (
            f"{s.allreduce_time_s * 1e3:5.3f} ms",
            f"{s.tokens_per_s_per_sequence:6.1f}",
        )
        lines.append(
            pick(
                f"TP{tp}: {weights} of weights per GPU, fits: {str(bool(s.fits)):5}, "
                f"step {step}, all-reduces {reduces}, {speed} tokens/s",
                f"TP{tp}：每块 GPU 的权重 {weights}，放得下：{'是' if s.fits else '否'}，"
                f"每步 {step}，其中 all-reduce {reduces}，{speed} tokens/s",
            )
        )
    taus = [f"K={k}: {tokens_per_verify_step(SPEC_A, k):.3f}" for k in (1, 2, 4, 8)]
    lines.append(
        pick(
            f"tokens per verify pass at A={SPEC_A}: {', '.join(taus)}",
            f"A={SPEC_A} 时每次验证前向得到的 token 数："
            + "，".join(x.replace(": ", "：") for x in taus),
        )
    )
    return "\n".join(lines)

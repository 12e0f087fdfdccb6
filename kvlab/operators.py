"""A forward step as a list of operators: each GEMM, attention, the small kernels between.

The ledger's ceiling (`kvlab.cost`) is the sum over these operators of
max(bytes / bandwidth, FLOPs / peak): each kernel is held back by its own resource. One
max over the whole step would average a compute-bound GEMM with a memory-bound attention
and hide, for example, what FlashAttention changes. The measured mode
(`kvlab.measured`) times the same operators from published kernel tables.

`bytes` are the ledger's bytes, partitioned: the weights each operator streams and the
KV that attention reads and writes; they add up to `DecodeStep.step_bytes` and
`Prefill.bytes_moved`. Activations stay out of them, as they always have in the ledger
(at decode a token's activations are kilobytes beside megabytes of weights); the small
elementwise kernels carry theirs in `activation_bytes_per_call`, which only the measured
mode uses. FLOPs follow the ledger too: 2 per parameter per token, plus attention.

Shapes are per GPU at a tensor-parallel degree `tp` (Megatron style: QKV, gate/up and the
LM head split by columns, O and down by rows, K/V heads replicated when fewer than `tp`,
norms and the router replicated); at tp > 1 two all-reduces per layer join the list.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from .dtypes import DType
from .errors import KvlabError
from .models import ModelSpec, expected_experts_touched

#: Tensor-parallel degrees the measured extract covers.
TP_DEGREES = (1, 2, 4, 8)
#: Bytes per activation element (bf16) in the small kernels and all-reduce messages.
ACTIVATION_BYTES = 2
#: Bytes per logit read by sampling (fp32 logits).
LOGIT_BYTES = 4


@dataclass(frozen=True)
class Operator:
    """One kind of kernel in a step, with its totals over all its calls in that step."""

    name: str  # qkv_proj, o_proj, gate_up_proj, down_proj, lm_head, router, experts, ...
    kind: str  # gemm | moe | attention | elementwise | allreduce
    calls: int  # launches per step (one per layer for per-layer kernels)
    bytes: object  # ledger bytes per step, all calls: weights streamed, KV read + written
    flops: object  # per step, all calls
    m: object = 1.0  # rows per call: tokens in the batch
    n: int = 0  # GEMM output columns (per GPU)
    k: int = 0  # GEMM reduction depth (per GPU)
    activation_bytes_per_call: object = 0.0  # elementwise kernels (measured mode only)
    link_bytes_per_call: object = 0.0  # all-reduce message (bf16 activations)
    gpus: int = 1  # GPUs an all-reduce spans


@dataclass(frozen=True)
class LayerShapes:
    """Per-GPU shapes of one model at one tensor-parallel degree."""

    gemms: dict  # name -> (n, k): one call per layer (lm_head: one per step)
    heads: int  # query heads per GPU
    kv_heads: int  # K/V heads per GPU
    head_dim: int
    moe: tuple | None  # (hidden, expert intermediate, experts, experts per token)


def _check_tp(m: ModelSpec, tp: int) -> None:
    if tp not in TP_DEGREES:
        raise KvlabError(f"tensor-parallel degree must be one of {TP_DEGREES}, got {tp!r}")
    if m.num_heads % tp:
        raise KvlabError(f"{m.name}: {m.num_heads} query heads do not split over {tp} GPUs")


@lru_cache(maxsize=256)
def layer_shapes(m: ModelSpec, tp: int = 1) -> LayerShapes:
    """GEMM shapes (n, k) per GPU, attention layout, MoE shape. MLA models have no GEMM
    shapes here: their projections are counted but not laid out (no measured tables)."""
    _check_tp(m, tp)
    h, hd = m.hidden_size, m.head_dim
    heads, kv = m.num_heads // tp, max(1, m.num_kv_heads // tp)
    gemms = {}
    if not m.is_mla:
        gemms["qkv_proj"] = ((heads + 2 * kv) * hd, h)
        gemms["o_proj"] = (h, heads * hd)
    dense_layers = m.num_layers - (len(m.moe_layer_indices) if m.is_moe else 0)
    up = 2 if m.gated_mlp else 1
    if dense_layers:
        gemms["gate_up_proj"] = (up * m.intermediate_size // tp, h)
        gemms["down_proj"] = (h, m.intermediate_size // tp)
    if m.is_moe:
        gemms["router"] = (m.num_experts, h)
        if m.shared_expert_intermediate_size:
            gemms["shared_gate_up_proj"] = (up * m.shared_expert_intermediate_size // tp, h)
            gemms["shared_down_proj"] = (h, m.shared_expert_intermediate_size // tp)
    gemms["lm_head"] = (math.ceil(m.vocab_size / tp), h)
    moe = (h, m.expert_intermediate_size, m.num_experts, m.experts_per_token) if m.is_moe else None
    return LayerShapes(gemms, heads, kv, hd, moe)


def _calls(m: ModelSpec, name: str) -> int:
    """Launches per step of a weight operator: one per layer that has it, the LM head once."""
    moe_layers = len(m.moe_layer_indices) if m.is_moe else 0
    if name == "lm_head":
        return 1
    if name.startswith(("shared", "router")):
        return moe_layers
    if name in ("gate_up_proj", "down_proj"):
        return m.num_layers - moe_layers
    return m.num_layers


@lru_cache(maxsize=256)
def _laid_out_params(m: ModelSpec, tp: int) -> dict:
    """Parameters per GPU of the operators `layer_shapes` lays out, and of the norms."""
    shapes = layer_shapes(m, tp)
    per_step = {name: float(n * k * _calls(m, name)) for name, (n, k) in shapes.gemms.items()}
    if m.qkv_bias and "qkv_proj" in per_step:
        per_step["qkv_proj"] += float(shapes.gemms["qkv_proj"][0] * m.num_layers)
    if m.tie_word_embeddings:
        per_step["lm_head"] = 0.0  # the ledger counts a tied head with the embedding
    per_step["norms"] = float(2 * m.hidden_size * m.num_layers + m.hidden_size)
    return per_step


def _mla_projections_per_gpu(m: ModelSpec, whole: float, tp: int) -> float:
    """One GPU's share of an MLA model's attention projections (`whole` at tp = 1): the
    down-projections into the query and KV latents (q_a_proj, kv_a_proj_with_mqa) and the
    latents' norms are replicated on every GPU, as vLLM and SGLang lay them out; the
    up-projections and the output projection split over tp."""
    if tp == 1:
        return whole
    latents = m.q_lora_rank + m.kv_lora_rank  # q_lora_rank 0: no query latent
    replicated = float(m.num_layers * (m.hidden_size * (latents + m.qk_rope_head_dim) + latents))
    replicated = min(replicated, whole)
    return replicated + (whole - replicated) / tp


@lru_cache(maxsize=256)
def _weight_params(m: ModelSpec, tp: int) -> dict:
    """Parameters per GPU carried by each operator per step (all layers), such that at
    tp = 1 they add up to the ledger's streamed parameters exactly (plus routed experts,
    which the `experts` operator carries by the batch)."""
    per_step = dict(_laid_out_params(m, tp))
    derived = m if m.num_parameters_override is None else replace(m, num_parameters_override=None)
    streamed = derived.params.streamed_dense
    if m.is_mla:  # MLA projections: what the laid-out shapes leave over at tp = 1
        whole = streamed - sum(_laid_out_params(m, 1).values())
        per_step["attention_proj"] = _mla_projections_per_gpu(m, whole, tp)
    if m.num_parameters_override is not None:  # a stated size: scale the shapes to it
        scale = m.params.streamed_dense / streamed
        per_step = {name: value * scale for name, value in per_step.items()}
    return per_step


def _experts(m: ModelSpec, touching, tokens, tp: int, bpe: float):
    """(bytes, flops) of the routed experts: weights of the experts `touching` tokens pick
    (uniform routing), FLOPs of the `tokens` computed."""
    p = m.params
    touched = expected_experts_touched(m.num_experts, m.experts_per_token, touching)
    weight = p.moe_layers * touched * p.expert / tp * bpe
    flops = 2.0 * tokens * p.moe_layers * m.experts_per_token * p.expert / tp
    return weight, flops


def _gemm_ops(m: ModelSpec, tokens, weights: DType, tp: int, experts_tokens) -> list[Operator]:
    """The weight-carrying operators for a forward pass over `tokens` rows."""
    shapes, params = layer_shapes(m, tp), _weight_params(m, tp)
    bpe = weights.bytes_per_element
    ops = []
    for name, per_step in params.items():
        if name == "norms":
            continue
        n, k = shapes.gemms.get(name, (0, 0))
        calls = m.num_layers if name == "attention_proj" else _calls(m, name)
        ops.append(
            Operator(
                name, "gemm", calls, per_step * bpe, 2.0 * tokens * per_step, m=tokens, n=n, k=k
            )
        )
    if m.is_moe:
        weight, flops = _experts(m, experts_tokens, tokens, tp, bpe)
        ops.append(Operator("experts", "moe", m.params.moe_layers, weight, flops, m=tokens))
    return ops


def _small_ops(m: ModelSpec, tokens, weights: DType, tp: int) -> list[Operator]:
    """Norms, activation, embedding, sampling, router top-k: the kernels no GEMM table has."""
    h, layers = m.hidden_size, m.num_layers
    norms = _weight_params(m, tp)["norms"]
    moe_layers = len(m.moe_layer_indices) if m.is_moe else 0
    act = m.intermediate_size // tp
    up = 3 if m.gated_mlp else 2  # read gate and up (or one input), write one output
    ops = [
        Operator(
            "add_norm",
            "elementwise",
            2 * layers + 1,
            norms * weights.bytes_per_element,
            2.0 * tokens * norms,
            m=tokens,
            activation_bytes_per_call=4 * tokens * h * ACTIVATION_BYTES,
        ),
        Operator(
            "embedding",
            "elementwise",
            1,
            0.0,
            0.0,
            m=tokens,
            activation_bytes_per_call=2 * tokens * h * ACTIVATION_BYTES,
        ),
        Operator(
            "sampling",
            "elementwise",
            1,
            0.0,
            0.0,
            m=tokens,
            activation_bytes_per_call=tokens * math.ceil(m.vocab_size / tp) * LOGIT_BYTES,
        ),
    ]
    if layers - moe_layers:
        ops.insert(
            1,
            Operator(
                "act_mul",
                "elementwise",
                layers - moe_layers,
                0.0,
                0.0,
                m=tokens,
                activation_bytes_per_call=up * tokens * act * ACTIVATION_BYTES,
            ),
        )
    if moe_layers:
        ops.insert(
            1,
            Operator(
                "router_topk",
                "elementwise",
                moe_layers,
                0.0,
                0.0,
                m=tokens,
                activation_bytes_per_call=tokens * m.num_experts * 4,
            ),
        )
    if tp > 1:
        ops.append(
            Operator(
                "all_reduce",
                "allreduce",
                2 * layers,
                0.0,
                0.0,
                m=tokens,
                link_bytes_per_call=tokens * h * ACTIVATION_BYTES,
                gpus=tp,
            )
        )
    return ops


def kv_bytes_per_token_per_gpu(m: ModelSpec, kv: DType, tp: int = 1) -> float:
    """KV bytes one token adds over all layers on one GPU (K/V heads split over tp)."""
    if m.is_mla or tp == 1:
        return m.kv_elements_per_token * kv.bytes_per_element
    return 2 * m.num_layers * layer_shapes(m, tp).kv_heads * m.head_dim * kv.bytes_per_element


def weight_bytes_per_gpu(m: ModelSpec, weights: DType, tp: int = 1) -> float:
    """Bytes of weights one GPU holds at tensor-parallel degree `tp`: every matrix split
    (the embedding by vocabulary rows, each routed expert by its intermediate size), norms
    and replicated K/V heads whole. At tp = 1 the model's whole weight bytes."""
    p = m.params
    if tp == 1:
        return p.total * weights.bytes_per_element
    streamed = sum(_weight_params(m, tp).values())
    return (
        p.embedding / tp + streamed + p.moe_layers * m.num_experts * p.expert / tp
    ) * weights.bytes_per_element


def decode_operators(
    m: ModelSpec, batch, context, weights: DType, kv: DType, tp: int = 1, queries=1
) -> list[Operator]:
    """The operators of one decode step: `batch` sequences, `context` tokens of KV each
    (arrays broadcast). Their bytes add up to the ledger's step bytes at tp = 1.

    `queries` > 1 is a speculative verify step: each sequence runs that many positions
    through the model at once (GEMMs at m = batch x queries, weights read once), reads its
    KV history once, writes `queries` new entries, and query i attends to the history and
    the i before it."""
    b = np.asarray(batch, dtype=float)
    attended = np.asarray(m.effective_context(np.asarray(context, dtype=float)), dtype=float)
    kv_tok = kv_bytes_per_token_per_gpu(m, kv, tp)
    q = np.asarray(queries, dtype=float)
    tokens = b * q  # rows through every GEMM
    pairs = q * attended + q * (q - 1) / 2  # query-key pairs per sequence (1: the history)
    attention = Operator(
        "attention",
        "attention",
        m.num_layers,
        b * attended * kv_tok + tokens * kv_tok,
        b * m.attention_flops_per_cached_token / tp * pairs,
        m=b,
    )
    ops = _gemm_ops(m, tokens, weights, tp, tokens)
    return ops[:1] + [attention] + ops[1:] + _small_ops(m, tokens, weights, tp)


def prefill_operators(
    m: ModelSpec,
    batch,
    prompt_tokens,
    cached_tokens,
    weights: DType,
    kv: DType,
    flash_attention: bool = True,
    tp: int = 1,
) -> list[Operator]:
    """The operators of a prefill of `prompt_tokens - cached_tokens` new tokens in each of
    `batch` sequences. Attention covers n*c + n(n+1)/2 query-key pairs; without
    FlashAttention its score matrices make four trips through memory (fp16)."""
    b = np.asarray(batch, dtype=float)
    c = np.asarray(cached_tokens, dtype=float)
    n = np.asarray(prompt_tokens, dtype=float) - c
    pairs = n * c + n * (n + 1) / 2
    kv_tok = kv_bytes_per_token_per_gpu(m, kv, tp)
    kv_bytes = b * (c + n) * kv_tok
    if not flash_attention:
        kv_bytes = kv_bytes + b * (m.num_heads // tp * m.num_layers) * pairs * 4 * 2
    attention = Operator(
        "attention",
        "attention",
        m.num_layers,
        kv_bytes,
        b * m.attention_flops_per_cached_token / tp * pairs,
        m=b * n,
    )
    ops = _gemm_ops(m, b * n, weights, tp, b * np.maximum(n, 1))
    return ops[:1] + [attention] + ops[1:] + _small_ops(m, b * n, weights, tp)


def allreduce_s(op: Operator, link_bandwidth_bytes_per_s, latency_s=0.0):
    """(latency part, bandwidth part) of an all-reduce operator's time over all its calls:
    each call pays a fixed `latency_s` and moves 2 (p - 1) / p of its message over the
    link (the bandwidth-optimal ring's traffic per GPU)."""
    ring = 2 * (op.gpus - 1) / op.gpus
    return (
        op.calls * latency_s,
        op.calls * op.link_bytes_per_call * ring / link_bandwidth_bytes_per_s,
    )


def ceiling_s(
    ops: list[Operator],
    bandwidth_bytes_per_s,
    flops_per_s,
    link_bandwidth_bytes_per_s=None,
    link_latency_s=0.0,
):
    """Sum over operators of max(bytes / bandwidth, FLOPs / peak), plus every all-reduce's
    latency and link time (`allreduce_s`)."""
    total = 0.0
    for op in ops:
        if op.kind == "allreduce":
            if link_bandwidth_bytes_per_s is None:
                raise KvlabError("an all-reduce needs a link bandwidth for its ceiling")
            latency, link = allreduce_s(op, link_bandwidth_bytes_per_s, link_latency_s)
            total = total + latency + link
            continue
        total = total + np.maximum(op.bytes / bandwidth_bytes_per_s, op.flops / flops_per_s)
    return total

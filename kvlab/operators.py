"""The ledger's one table: the operators of a forward pass and what each moves and computes.

A pass over `batch` sequences, each adding `new` tokens on top of `cached` tokens of KV,
is a decode step (new = 1), a speculative verify pass (new = K + 1) or a prefill (new =
the uncached prompt). Its work is set by four counts (`PassCounts`): rows through the
GEMMs, tokens that pick routed experts, KV tokens attention reads or writes, and
query-key pairs. `OperatorTable` holds, once per (model, dtypes, tensor-parallel degree),
what every operator costs per unit of those counts: bytes per pass (the weights it
streams), FLOPs per token, bytes per KV token, FLOPs and score bytes per query-key pair,
bytes per routed expert touched, link bytes per token. Everything that prices a pass
evaluates this table: `kvlab.cost` (decode, verify, prefill, memory fit), the
per-operator view of `kvlab budget`, the simulator's step times, the measured mode's
ceilings, and the panels' build-time terms (the browser sums the groups it is given).

Operators fall into groups that share an arithmetic intensity, so the sum over operators
of max(bytes / bandwidth, FLOPs / peak) equals the sum over groups: `dense` (every weight
GEMM and norm: its weights once, 2 FLOPs per weight per row), `experts` (routed experts,
read by how many the tokens touch), `attention`, and `allreduce` (tensor parallelism:
latency plus link time). One max over the whole step would average a compute-bound GEMM
with a memory-bound attention and hide, for example, what FlashAttention changes.

Shapes are per GPU at a tensor-parallel degree `tp` (Megatron style: QKV, gate/up and the
LM head split by columns, O and down by rows, K/V heads split, norms and the router
replicated; MLA's latent has no heads to split and is replicated); at tp > 1 two
all-reduces per layer join the list. Activations stay out of the ledger's bytes (at
decode a token's activations are kilobytes beside megabytes of weights); the small
elementwise kernels carry theirs in `activation_bytes_per_token`, which only the measured
mode uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from .dtypes import DType
from .errors import KvlabError
from .models import ModelSpec

#: Tensor-parallel degrees: 1, 2, 4 or 8 GPUs of one server (one NVLink domain), the
#: degrees the measured extract covers.
TP_DEGREES = (1, 2, 4, 8)
#: Bytes per activation element (bf16) in the small kernels and all-reduce messages.
ACTIVATION_BYTES = 2
#: Bytes per logit read by sampling and the router's top-k (fp32 logits).
LOGIT_BYTES = 4
#: Attention without FlashAttention writes the score matrix S and the probabilities P to
#: memory and reads both back: 4 passes over heads x query-key pairs, fp16 elements.
NAIVE_ATTENTION_PASSES = 4
SCORE_BYTES = 2
#: The operator groups, in the order a step lists them.
GROUPS = ("dense", "experts", "attention", "allreduce")
#: A count, bytes or seconds: a number, or an array of them (a slider grid is one call).
Num = float | int | np.ndarray


# ------------------------------------------------------------------------- the counts


def query_key_pairs(new, cached):
    """Query-key pairs of `new` tokens appended to `cached` ones under a causal mask: token
    i of the new ones attends to the cached tokens, the i before it and itself, so the
    pass costs new x cached + new (new + 1) / 2 pairs. A decode step (new = 1) attends to
    its history and itself; a prefix hit removes both the linear and most of the quadratic
    work of a prefill. The ledger's only pair count."""
    return new * cached + new * (new + 1) / 2


def experts_touched(num_experts: int, experts_per_token: int, tokens):
    """Expected distinct experts `tokens` touch in one MoE layer, under even, independent
    routing: each token picks k of E experts, an expert stays untouched with probability
    (1 - k/E)^tokens, so E (1 - (1 - k/E)^tokens) are read. Real routers are skewed,
    which touches fewer: for the weights a batch reads this is an upper bound. The
    ledger's only expert count (0 for a dense model)."""
    if not num_experts:
        return 0.0
    keep = 1.0 - experts_per_token / num_experts
    if type(tokens) in (int, float):
        return num_experts * (1.0 - keep**tokens)
    return num_experts * (1.0 - keep ** np.asarray(tokens, dtype=float))


@dataclass(frozen=True)
class PassCounts:
    """What sets a pass's work: `tokens` rows through every GEMM, `touching` tokens that
    pick routed experts, `kv_tokens` KV entries attention reads or writes, `pairs`
    query-key pairs (one attention kernel)."""

    tokens: Num
    touching: Num
    kv_tokens: Num
    pairs: Num


def pass_counts(batch, new, cached) -> PassCounts:
    """The counts of a pass over `batch` sequences that each add `new` tokens on top of
    `cached` tokens of KV (arrays broadcast). A pass always picks experts for at least one
    token per sequence (a full prefix hit still computes its last token)."""
    tokens = batch * new
    touching = tokens if type(new) in (int, float) and new >= 1 else batch * np.maximum(new, 1)
    return PassCounts(
        tokens, touching, batch * (cached + new), batch * query_key_pairs(new, cached)
    )


# ------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Operator:
    """One kind of kernel of a pass, with its costs over all its calls in that pass, per
    GPU, per unit of the pass's counts (`PassCounts`)."""

    name: str  # qkv_proj, o_proj, gate_up_proj, down_proj, lm_head, experts, attention, ...
    kind: str  # gemm | moe | attention | elementwise | allreduce
    group: str  # dense | experts | attention | allreduce | "" (no ledger cost)
    calls: int  # launches per pass (one per layer for per-layer kernels)
    n: int = 0  # GEMM output columns (per GPU)
    k: int = 0  # GEMM reduction depth (per GPU)
    weight_bytes: float = 0.0  # streamed once per pass
    flops_per_token: float = 0.0
    expert_bytes: float = 0.0  # per expert touched per MoE layer, over all MoE layers
    kv_bytes_per_token: float = 0.0  # attention: per KV entry read or written
    flops_per_pair: float = 0.0
    score_bytes_per_pair: float = 0.0  # attention without FlashAttention
    activation_bytes_per_token: float = 0.0  # per call (the measured mode's small kernels)
    link_bytes_per_token: float = 0.0  # all-reduce message per call (bf16 activations)
    share: float = 1.0  # of the layers a pass runs (a self-drafting head: 1 / layers)

    @property
    def per_layer(self) -> bool:
        """Runs in every layer that has it (the LM head, embedding, sampling run once)."""
        return self.calls != 1


@dataclass(frozen=True)
class GroupTerms:
    """An operator group's summed coefficients (see `Operator`)."""

    weight_bytes: float = 0.0
    flops_per_token: float = 0.0
    expert_bytes: float = 0.0
    kv_bytes_per_token: float = 0.0
    flops_per_pair: float = 0.0
    score_bytes_per_pair: float = 0.0
    link_bytes_per_token: float = 0.0  # summed over calls
    calls: float = 0  # launches per pass (a share of the layers runs a share of them)


@dataclass(frozen=True)
class OperatorTable:
    """The ledger of one (model, weight dtype, KV dtype, tensor-parallel degree)."""

    model: ModelSpec
    weights: DType
    kv: DType
    tp: int
    operators: tuple  # of Operator, in step order
    groups: dict  # group name -> GroupTerms
    resident_weight_bytes: float  # what one GPU holds (embedding and every expert included)
    kv_bytes_per_token: float  # what one token adds to one GPU's KV over all layers

    def experts_touched(self, tokens):
        return experts_touched(self.model.num_experts, self.model.experts_per_token, tokens)

    def work(self, counts: PassCounts, flash_attention: bool = True) -> dict:
        """Per group, in `GROUPS` order: (bytes, FLOPs) of a pass with these counts (the
        all-reduce's bytes are link bytes, its FLOPs 0)."""
        return {
            name: _work(name, self.groups[name], self, counts, flash_attention)
            for name in GROUPS
            if name in self.groups
        }

    def layers(self, share: float) -> OperatorTable:
        """This table for a pass through `share` of the layers: per-layer operators scaled,
        once-per-pass ones (LM head, embedding, sampling) whole. A self-drafting head is
        one layer's share (1 / num_layers)."""
        ops = tuple(_scaled(op, share) for op in self.operators)
        return replace(self, operators=ops, groups=_group(ops))


#: The per-unit costs an operator carries and a group sums (all linear in the counts).
COEFFICIENTS = (
    "weight_bytes",
    "flops_per_token",
    "expert_bytes",
    "kv_bytes_per_token",
    "flops_per_pair",
    "score_bytes_per_pair",
)


def _scaled(op: Operator, share: float) -> Operator:
    if not op.per_layer:
        return op
    scaled = {name: getattr(op, name) * share for name in COEFFICIENTS}
    link = op.link_bytes_per_token * share
    return replace(op, **scaled, link_bytes_per_token=link, share=op.share * share)


def _group(ops) -> dict:
    """Sum the operators' coefficients per group (every coefficient is linear in the
    counts, so a group's bytes and FLOPs are its operators' sums)."""
    sums: dict = {}
    for op in ops:
        if not op.group:
            continue
        t = sums.setdefault(op.group, GroupTerms())
        sums[op.group] = GroupTerms(
            *(getattr(t, name) + getattr(op, name) for name in COEFFICIENTS),
            t.link_bytes_per_token + op.link_bytes_per_token * op.calls,
            t.calls + op.calls * op.share,
        )
    return sums


def check_tensor_parallel(m: ModelSpec, tp) -> int:
    """The tensor-parallel degree as an int: one of TP_DEGREES, dividing the model's query
    heads, and either dividing its K/V heads or a multiple of them (each K/V head then
    replicated on tp / kv_heads GPUs, as vLLM and TensorRT-LLM do); anything else raises,
    as engines refuse it."""
    number = isinstance(tp, (int, float, np.integer, np.floating))
    if isinstance(tp, (bool, np.bool_)) or not number or not np.isfinite(tp) or tp != int(tp):
        raise KvlabError(f"tensor_parallel must be one of {TP_DEGREES}, got {tp!r}")
    tp = int(tp)
    if tp not in TP_DEGREES:
        raise KvlabError(f"tensor-parallel degree must be one of {TP_DEGREES}, got {tp!r}")
    if m.num_heads % tp:
        raise KvlabError(f"{m.name}: {m.num_heads} query heads do not split over {tp} GPUs")
    kv = m.num_kv_heads
    if not m.is_mla and tp > 1 and kv % tp and tp % kv:
        raise KvlabError(
            f"{m.name}: {kv} K/V heads neither split over {tp} GPUs nor replicate evenly "
            f"on them (engines need the degree to divide the K/V heads or be a multiple of "
            f"them); try a degree among "
            f"{', '.join(str(d) for d in TP_DEGREES if not kv % d or not d % kv)}"
        )
    return tp


@dataclass(frozen=True)
class LayerShapes:
    """Per-GPU shapes of one model at one tensor-parallel degree."""

    gemms: dict  # name -> (n, k): one call per layer (lm_head: one per step)
    heads: int  # query heads per GPU
    kv_heads: int  # K/V heads per GPU
    head_dim: int
    moe: tuple | None  # (hidden, expert intermediate, experts, experts per token)


@lru_cache(maxsize=256)
def layer_shapes(m: ModelSpec, tp: int = 1) -> LayerShapes:
    """GEMM shapes (n, k) per GPU, attention layout, MoE shape. MLA models have no GEMM
    shapes here: their projections are counted but not laid out (no measured tables)."""
    tp = check_tensor_parallel(m, tp)
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


def _moe_layers(m: ModelSpec) -> int:
    return len(m.moe_layer_indices) if m.is_moe else 0


def _calls(m: ModelSpec, name: str) -> int:
    """Launches per step of a weight operator: one per layer that has it, the LM head once."""
    if name == "lm_head":
        return 1
    if name.startswith(("shared", "router")):
        return _moe_layers(m)
    if name in ("gate_up_proj", "down_proj"):
        return m.num_layers - _moe_layers(m)
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
    """Parameters per GPU carried by each weight operator per pass (all layers), such that
    at tp = 1 they add up to the model's streamed parameters exactly (routed experts
    aside: the `experts` operator carries them by the tokens)."""
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


def _weight_ops(m: ModelSpec, weights: DType, tp: int) -> list[Operator]:
    """The weight-carrying operators (GEMMs, the routed experts)."""
    shapes, params = layer_shapes(m, tp), _weight_params(m, tp)
    bpe = weights.bytes_per_element
    ops = []
    for name, per_step in params.items():
        if name == "norms":
            continue
        n, k = shapes.gemms.get(name, (0, 0))
        calls = m.num_layers if name == "attention_proj" else _calls(m, name)
        ops.append(Operator(name, "gemm", "dense", calls, n, k, per_step * bpe, 2.0 * per_step))
    if m.is_moe:
        p = m.params
        expert = p.moe_layers * p.expert / tp
        ops.append(
            Operator(
                "experts",
                "moe",
                "experts",
                p.moe_layers,
                expert_bytes=expert * weights.bytes_per_element,
                flops_per_token=2.0 * m.experts_per_token * expert,
            )
        )
    return ops


def _attention_op(m: ModelSpec, kv: DType, tp: int) -> Operator:
    """Attention: reads and writes KV entries, spends FLOPs (and, without FlashAttention,
    score bytes) per query-key pair."""
    return Operator(
        "attention",
        "attention",
        "attention",
        m.num_layers,
        kv_bytes_per_token=kv_bytes_per_token_per_gpu(m, kv, tp),
        flops_per_pair=m.attention_flops_per_cached_token / tp,
        score_bytes_per_pair=float(
            m.num_heads // tp * m.num_layers * NAIVE_ATTENTION_PASSES * SCORE_BYTES
        ),
    )


def _small_ops(m: ModelSpec, weights: DType, tp: int) -> list[Operator]:
    """Norms, activation, embedding, sampling, router top-k, all-reduces: the kernels no
    GEMM table has. Only the norms carry ledger bytes (their weights)."""
    h, layers, moe_layers = m.hidden_size, m.num_layers, _moe_layers(m)
    norms = _weight_params(m, tp)["norms"]
    up = 3 if m.gated_mlp else 2  # read gate and up (or one input), write one output
    act = ACTIVATION_BYTES
    small = [
        ("embedding", 1, 2 * h * act),
        ("sampling", 1, math.ceil(m.vocab_size / tp) * LOGIT_BYTES),
    ]
    if moe_layers:
        small.insert(0, ("router_topk", moe_layers, m.num_experts * LOGIT_BYTES))
    if layers - moe_layers:
        small.insert(-2, ("act_mul", layers - moe_layers, up * (m.intermediate_size // tp) * act))
    norm = Operator(
        "add_norm",
        "elementwise",
        "dense",
        2 * layers + 1,
        weight_bytes=norms * weights.bytes_per_element,
        flops_per_token=2.0 * norms,
        activation_bytes_per_token=4 * h * act,
    )
    ops = [norm] + [
        Operator(name, "elementwise", "", calls, activation_bytes_per_token=per_token)
        for name, calls, per_token in small
    ]
    if tp > 1:
        link = Operator(
            "all_reduce", "allreduce", "allreduce", 2 * layers, link_bytes_per_token=h * act
        )
        ops.append(link)
    return ops


def kv_bytes_per_token_per_gpu(m: ModelSpec, kv: DType, tp: int = 1) -> float:
    """KV bytes one token adds over all layers on one GPU: 2 x layers x K/V heads per GPU
    x head_dim x bytes per element (K/V heads split over tp, replicated when fewer than
    tp); MLA: the latent plus the shared RoPE key per layer, replicated on every GPU."""
    if m.is_mla or tp == 1:
        return m.kv_elements_per_token * kv.bytes_per_element
    return 2 * m.num_layers * layer_shapes(m, tp).kv_heads * m.head_dim * kv.bytes_per_element


def _resident_weight_bytes(m: ModelSpec, weights: DType, tp: int) -> float:
    """Bytes of weights one GPU holds: every matrix split (the embedding by vocabulary
    rows, each routed expert by its intermediate size), norms and replicated K/V heads
    whole. At tp = 1 the model's whole weight bytes."""
    p = m.params
    if tp == 1:
        return p.total * weights.bytes_per_element
    streamed = sum(_weight_params(m, tp).values())
    experts = p.moe_layers * m.num_experts * p.expert
    return (p.embedding / tp + streamed + experts / tp) * weights.bytes_per_element


@lru_cache(maxsize=512)
def operator_table(m: ModelSpec, weights: DType, kv: DType, tp: int = 1) -> OperatorTable:
    """The table of one (model, weight dtype, KV dtype, tensor-parallel degree), built once."""
    tp = check_tensor_parallel(m, tp)
    weight = _weight_ops(m, weights, tp)
    ops = tuple(weight[:1] + [_attention_op(m, kv, tp)] + weight[1:] + _small_ops(m, weights, tp))
    return OperatorTable(
        model=m,
        weights=weights,
        kv=kv,
        tp=tp,
        operators=ops,
        groups=_group(ops),
        resident_weight_bytes=_resident_weight_bytes(m, weights, tp),
        kv_bytes_per_token=kv_bytes_per_token_per_gpu(m, kv, tp),
    )


def operator_work(op: Operator, table: OperatorTable, counts: PassCounts, flash: bool = True):
    """(bytes, FLOPs) of one operator in a pass with these counts (link bytes for an
    all-reduce): the per-operator view of `OperatorTable.work`."""
    return _work(op.group, op, table, counts, flash, op.link_bytes_per_token * op.calls)


def _work(group: str, t, table: OperatorTable, counts: PassCounts, flash: bool, link=None):
    """(bytes, FLOPs) of a group's (or one operator's) coefficients `t` in a pass; `link`:
    the link bytes per token over all calls (a group's sum carries them already)."""
    if group == "allreduce":
        return (t.link_bytes_per_token if link is None else link) * counts.tokens, 0.0
    if group == "attention":
        nbytes = t.kv_bytes_per_token * counts.kv_tokens
        if not flash:
            nbytes = nbytes + t.score_bytes_per_pair * counts.pairs
        return nbytes, t.flops_per_pair * counts.pairs
    if group == "experts":
        touched = table.experts_touched(counts.touching)
        return t.expert_bytes * touched, t.flops_per_token * counts.tokens
    return t.weight_bytes, t.flops_per_token * counts.tokens

"""The ledger: bytes, FLOPs and time of a decode step, a verify pass, a prefill; memory fit.

Every question is asked of a `Deployment` and evaluates its `OperatorTable`
(`kvlab.operators`): a pass's time is the sum over operator groups of max(bytes /
bandwidth, FLOPs / peak), divided by the efficiency, plus the all-reduces of tensor
parallelism. That is the rule the book teaches: each step streams the weights once for
the whole batch plus the KV history of every sequence.

Batch, context, and the deployment's bandwidth override and efficiency may be numpy
arrays; they broadcast, so a whole slider grid is one call. Under tensor parallelism
bytes, FLOPs and memory are per GPU, tokens/s the group's. With `KernelTables()` as the
speed, step times come from published kernel tables (`kvlab.kernel_tables`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from .deployment import (
    MAX_BANDWIDTH_BYTES_PER_S,
    MAX_CAPACITY_BYTES,
    MIN_BANDWIDTH_BYTES_PER_S,
    Deployment,
)
from .dtypes import DType, parse_dtype
from .errors import KvlabError, check_number
from .kernel_tables.timing import kernel_decode_fields, kernel_prefill_time
from .models import ModelSpec, get_model
from .operators import (
    NAIVE_ATTENTION_PASSES,
    SCORE_BYTES,
    Num,
    OperatorTable,
    PassCounts,
    kv_bytes_per_token_per_gpu,
    operator_table,
    pass_counts,
)
from .parallel import allreduce_link, tensor_parallel_notes
from .prompt import served_tokens

__all__ = [
    "MAX_BANDWIDTH_BYTES_PER_S",
    "MAX_CAPACITY_BYTES",
    "MIN_BANDWIDTH_BYTES_PER_S",
    "NAIVE_ATTENTION_PASSES",
    "SCORE_BYTES",
]

#: Upper bounds beyond which an input is a typo rather than a configuration.
MAX_BATCH = 1_000_000
MAX_CONTEXT_TOKENS = 100_000_000
#: Drafted tokens per verification beyond which acceptance makes more of them pointless.
MAX_SPECULATIVE_TOKENS = 16


def _out(x):
    """numpy scalar -> Python float, arrays unchanged (kvlab.tiers' results)."""
    return x.item() if isinstance(x, np.ndarray) and x.ndim == 0 else x


def _plain(x):
    """0-d arrays and numpy scalars -> Python numbers, arrays unchanged."""
    if type(x) in (int, float):
        return x
    return x.item() if isinstance(x, (np.ndarray, np.generic)) and np.ndim(x) == 0 else x


def check_count(name: str, value, minimum: int, maximum: int):
    """A whole number (or array of them) in [minimum, maximum]; raises otherwise."""
    return check_number(
        name, value, minimum=minimum, allow_equal_min=True, maximum=maximum, integer=True
    )


@dataclass(frozen=True)
class Result:
    """Base for ledger results: `to_dict()` gives JSON-ready values."""

    @classmethod
    def _build(cls, **values):
        """The instance `cls(**values)` would make, without the frozen dataclass's field-by-
        field `object.__setattr__` (a third of a scalar ledger call). Every field is given."""
        obj = object.__new__(cls)
        obj.__dict__.update(values)
        return obj

    def to_dict(self) -> dict:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, np.ndarray):
                value = value.tolist()
            elif isinstance(value, (np.floating, np.integer, np.bool_)):
                value = value.item()
            if isinstance(value, float) and not np.isfinite(value):
                value = None  # JSON has no infinity: null means "unbounded"
            out[f.name] = value
        return out


# ------------------------------------------------------------------ per-model terms


def weight_bytes(model: ModelSpec | str, weight_dtype: str | DType = "fp16") -> float:
    """Bytes the weights occupy in memory (all parameters, scales included)."""
    return get_model(model).params.total * parse_dtype(weight_dtype).bytes_per_element


def kv_bytes_per_token(model: ModelSpec | str, kv_dtype: str | DType = "fp16") -> float:
    """Bytes of K/V cached per token over all layers: 2 x layers x kv_heads x head_dim x
    bytes per element (MLA: (kv_lora_rank + qk_rope_head_dim) x layers x bytes)."""
    return kv_bytes_per_token_per_gpu(get_model(model), parse_dtype(kv_dtype))


def weight_read_bytes(model: ModelSpec | str, batch=1, weight_dtype: str | DType = "fp16"):
    """Weight bytes one forward pass over `batch` tokens streams from memory: the dense
    weights once (the embedding table is only gathered) plus the routed experts the
    tokens touch, which grows with the batch until all are read."""
    table = operator_table(get_model(model), parse_dtype(weight_dtype), parse_dtype("fp16"))
    work = table.work(pass_counts(batch, 1, 0))
    return _plain(np.asarray(work["dense"][0] + work.get("experts", (0.0,))[0], dtype=float))


# ---------------------------------------------------------------- the one evaluation


def _top(a, b):
    return max(a, b) if type(a) is float and type(b) is float else np.maximum(a, b)


@dataclass(frozen=True)
class UnitSeconds:
    """Seconds per unit of a pass's counts at the ceiling (efficiency 1) of one
    deployment's rates: how the simulator and `kvlab.cost` alike turn an `OperatorTable`
    into time. Arrays broadcast (a bandwidth sweep is one object)."""

    dense_s: Num  # the dense weights, once per pass
    dense_per_token_s: Num
    expert_s: Num  # per routed expert touched per layer, over all MoE layers
    experts_per_token_s: Num
    kv_s: Num  # per KV entry attention reads or writes
    pair_s: Num  # per query-key pair
    score_s: Num  # per query-key pair, the score traffic without FlashAttention
    allreduce_latency_s: float  # per pass (every all-reduce's fixed cost)
    allreduce_per_token_s: Num  # link time per row
    table: OperatorTable

    def weights_s(self, tokens, touching):
        """The weight groups of a pass over `tokens` rows, `touching` of which pick experts:
        max(memory, compute) each."""
        dense = _top(self.dense_s, self.dense_per_token_s * tokens)
        if not self.expert_s and not self.experts_per_token_s:
            return dense
        touched = self.table.experts_touched(touching)
        return dense + _top(self.expert_s * touched, self.experts_per_token_s * tokens)

    def attention_s(self, kv_tokens, pairs, flash_attention: bool = True):
        """One attention kernel over `kv_tokens` KV entries and `pairs` query-key pairs."""
        memory = self.kv_s * kv_tokens
        if not flash_attention:
            memory = memory + self.score_s * pairs
        return _top(memory, self.pair_s * pairs)

    def allreduce_s(self, tokens) -> tuple:
        """(latency part, link part) of a pass's all-reduces over `tokens` rows."""
        return self.allreduce_latency_s, self.allreduce_per_token_s * tokens

    def pass_s(self, counts: PassCounts, flash_attention: bool = True):
        """A pass's work at the ceiling, all-reduces excluded."""
        return self.weights_s(counts.tokens, counts.touching) + self.attention_s(
            counts.kv_tokens, counts.pairs, flash_attention
        )


def unit_seconds(d: Deployment, table: OperatorTable | None = None) -> UnitSeconds:
    """The `UnitSeconds` of deployment `d` (of `table`, e.g. a share of its layers, when
    given) at the ceiling of its bandwidth and peak."""
    table = d.table if table is None else table
    g = table.groups
    bw, pk = d.memory_bandwidth_bytes_per_s, d.peak_flops_per_s
    dense, attention = g["dense"], g["attention"]
    experts = g.get("experts")
    latency = link_s = 0.0
    if table.tp > 1:
        link = allreduce_link(d.hardware, table.tp)
        reduce = g["allreduce"]
        ring = 2 * (table.tp - 1) / table.tp
        latency = reduce.calls * link.latency_s
        link_s = reduce.link_bytes_per_token * ring / link.bandwidth_bytes_per_s
    return UnitSeconds(
        dense_s=dense.weight_bytes / bw,
        dense_per_token_s=dense.flops_per_token / pk,
        expert_s=experts.expert_bytes / bw if experts else 0.0,
        experts_per_token_s=experts.flops_per_token / pk if experts else 0.0,
        kv_s=attention.kv_bytes_per_token / bw,
        pair_s=attention.flops_per_pair / pk,
        score_s=attention.score_bytes_per_pair / bw,
        allreduce_latency_s=latency,
        allreduce_per_token_s=link_s,
        table=table,
    )


# ------------------------------------------------------------------------- decode


@dataclass(frozen=True)
class DecodeStep(Result):
    """One decode step of `batch` sequences, each with `context` tokens of KV history."""

    model: str
    hardware: str
    weight_dtype: str
    kv_dtype: str
    batch: Num
    context: Num
    bandwidth_bytes_per_s: Num
    efficiency: Num | str  # a fraction of the peaks, or "measured" (published kernel tables)
    weight_bytes: float  # weights in memory
    weight_read_bytes: Num  # weights streamed by this step
    kv_bytes_per_token: float
    kv_read_bytes: Num  # batch x attended context x KV/token
    kv_write_bytes: Num  # the new token's K/V for every sequence
    step_bytes: Num
    flops: Num
    arithmetic_intensity: Num  # FLOPs per byte moved
    ridge_flops_per_byte: Num  # roofline knee: peak FLOP/s / bandwidth in use
    memory_time_s: Num  # step bytes / bandwidth (x efficiency)
    compute_time_s: Num  # step FLOPs / peak (x efficiency)
    step_time_s: Num
    bound: str | np.ndarray  # "memory" or "compute": which whole-step time is longer
    tokens_per_s: Num  # aggregate over the batch
    tokens_per_s_per_sequence: Num
    kv_cache_bytes: Num  # KV held in memory for the batch
    memory_needed_bytes: Num
    capacity_bytes: Num  # what weights + KV may fill (hardware.USABLE_MEMORY_FRACTION)
    fits: bool | np.ndarray
    max_batch: Num  # largest batch whose KV fits beside the weights at this context
    ceiling_step_time_s: Num  # sum over operator groups of max(bytes/bw, FLOPs/peak)
    efficiency_source: str  # what step_time_s rests on: the sheet peaks, or which tables
    overhead_s: Num = 0.0  # kernel tables: the per-step fixed cost of the small kernels
    tensor_parallel: int = 1  # GPUs the weights and K/V heads are split over
    allreduce_time_s: Num = 0.0  # the step's all-reduces (2 per layer), in step_time_s
    allreduce_latency_s: Num = 0.0  # their fixed per-collective part; the rest is link time
    notes: tuple = ()  # what a reader must know to read the numbers (replicated K/V heads...)


def _scalar(*values) -> bool:
    return all(type(v) in (int, float) for v in values)


def _counts(batch, context, queries, m: ModelSpec, scalar: bool):
    """(attended context, pass counts) of a decode-like pass."""
    if scalar:
        attended = float(min(context, m.sliding_window) if m.sliding_window else context)
        b = float(batch)
    else:
        attended = np.asarray(m.effective_context(np.asarray(context, dtype=float)), dtype=float)
        b = np.asarray(batch, dtype=float)
    q = queries if type(queries) is int else np.asarray(queries, dtype=float)
    return attended, pass_counts(b, q, attended)


def decode_step(d: Deployment, batch=1, context=4096) -> DecodeStep:
    """The ledger of one decode step of `batch` sequences with `context` tokens of KV
    history each (arrays broadcast). Memory: weights + KV must fit in the deployment's
    usable capacity, as the simulator's do. Under kernel tables a scalar point outside
    the tables raises; array points there are NaN."""
    return _step(d, batch, context, 1)


def verify_step(d: Deployment, batch=1, context=4096, speculative_tokens=4) -> DecodeStep:
    """The ledger of one speculative verification pass: each of `batch` sequences runs its
    last token and `speculative_tokens` drafted ones (K + 1 positions) through the target
    model at once. The weights are read once for batch x (K + 1) rows, each sequence's KV
    history once, K + 1 new K/V entries are written. Its `tokens_per_s` fields count
    positions verified; `kvlab.speculative.speculative_step` turns them into tokens kept."""
    k = check_count("speculative_tokens", speculative_tokens, 0, MAX_SPECULATIVE_TOKENS)
    return _step(d, batch, context, k + 1 if type(k) is int else np.asarray(k, float) + 1.0)


def check_batch_context(batch, context) -> tuple:
    """batch (>= 1) and context (>= 0) tokens, checked."""
    batch = check_count("batch", batch, 1, MAX_BATCH)
    return batch, check_count("context", context, 0, MAX_CONTEXT_TOKENS)


def _step(d: Deployment, batch, context, queries) -> DecodeStep:
    """A decode (queries = 1) or verify step."""
    if not isinstance(d, Deployment):
        raise KvlabError(f"the ledger prices a Deployment, got {type(d).__name__}")
    batch, context = check_batch_context(batch, context)
    m, table = d.model, d.table
    bw, eff, capacity = d.memory_bandwidth_bytes_per_s, d.efficiency, d.usable_capacity_bytes
    scalar = _scalar(batch, context, bw, eff, capacity, queries)
    attended, counts = _counts(batch, context, queries, m, scalar)
    work = table.work(counts)
    fields = _ledger_fields(d, work, scalar)
    fields.update(_memory_fields(d, counts.tokens / queries, attended, scalar))
    fields["kv_read_bytes"] = _plain(counts.tokens / queries * attended * table.kv_bytes_per_token)
    fields["kv_write_bytes"] = _plain(counts.tokens * table.kv_bytes_per_token)
    units = unit_seconds(d)
    local = units.pass_s(counts)
    latency, link = units.allreduce_s(counts.tokens)
    step_time = local / eff + latency + link / eff
    fields.update(
        step_time_s=_plain(step_time),
        tokens_per_s=_plain(counts.tokens / step_time),
        tokens_per_s_per_sequence=_plain(queries / step_time),
        ceiling_step_time_s=_plain(local + latency + link),
        allreduce_time_s=_plain(latency + link / eff + 0.0 * counts.tokens)
        if table.tp > 1
        else 0.0,
        allreduce_latency_s=_plain(latency + 0.0 * counts.tokens) if table.tp > 1 else 0.0,
        notes=_notes(d),
        overhead_s=0.0,
    )
    if d.kernel_tables:
        fields.update(kernel_decode_fields(d, batch, context, scalar, queries))
    return DecodeStep._build(
        model=m.name,
        hardware=d.hardware.name,
        weight_dtype=d.weight_dtype.name,
        kv_dtype=d.kv_dtype.name,
        batch=batch,
        context=context,
        efficiency=d.speed.label,
        tensor_parallel=table.tp,
        **fields,
    )


def pass_totals(d: Deployment, work: dict) -> tuple:
    """(bytes, FLOPs, memory time, compute time) of a pass's `work`, all-reduces aside: the
    whole pass against the bandwidth and the peak at the deployment's efficiency."""
    local = [v for k, v in work.items() if k != "allreduce"]
    nbytes = sum(b for b, _ in local)
    flops = sum(f for _, f in local)
    eff = d.efficiency
    return (
        nbytes,
        flops,
        nbytes / (d.memory_bandwidth_bytes_per_s * eff),
        flops / (d.peak_flops_per_s * eff),
    )


def _ledger_fields(d: Deployment, work: dict, scalar: bool) -> dict:
    """Bytes, FLOPs and the whole-step memory and compute times of a pass."""
    bw, peak = d.memory_bandwidth_bytes_per_s, d.peak_flops_per_s
    weight_read = work["dense"][0] + (work["experts"][0] if "experts" in work else 0.0)
    step_bytes, flops, memory_time, compute_time = pass_totals(d, work)
    if scalar:
        bound = "compute" if compute_time > memory_time else "memory"
    else:
        bound = np.where(np.asarray(compute_time) > memory_time, "compute", "memory")
        bound = bound.item() if bound.ndim == 0 else bound
        bw = np.asarray(bw, dtype=float)
    return dict(
        bandwidth_bytes_per_s=_plain(bw),
        weight_read_bytes=_plain(weight_read),
        step_bytes=_plain(step_bytes),
        flops=_plain(flops),
        arithmetic_intensity=_plain(flops / step_bytes),
        ridge_flops_per_byte=_plain(peak / bw),
        memory_time_s=_plain(memory_time),
        compute_time_s=_plain(compute_time),
        bound=bound,
        efficiency_source=d.speed.source if not d.kernel_tables else "",
    )


def _memory_fields(d: Deployment, batch, attended, scalar: bool) -> dict:
    """Weights + KV against the usable capacity: fits, and the largest batch that fits."""
    kv_tok, w_total = d.table.kv_bytes_per_token, d.table.resident_weight_bytes
    capacity = d.usable_capacity_bytes
    kv = batch * attended * kv_tok
    needed = w_total + kv
    if scalar:
        room = max(capacity - w_total, 0.0)
        max_batch, fits = math.floor(room / (max(attended, 1.0) * kv_tok)), needed <= capacity
    else:
        room = np.maximum(capacity - w_total, 0.0)
        max_batch = _plain(np.floor(room / (np.maximum(attended, 1.0) * kv_tok)).astype(np.int64))
        fits = _plain(np.asarray(needed <= capacity))
    return dict(
        weight_bytes=w_total,
        kv_bytes_per_token=kv_tok,
        kv_cache_bytes=_plain(kv),
        memory_needed_bytes=_plain(needed),
        capacity_bytes=capacity,
        fits=fits,
        max_batch=max_batch,
    )


def _notes(d: Deployment) -> tuple:
    if d.table.tp == 1:
        return ()
    return tensor_parallel_notes(d.model, d.table.tp, allreduce_link(d.hardware, d.table.tp))


# ------------------------------------------------------------------------ prefill


@dataclass(frozen=True)
class Prefill(Result):
    """Prefill of `prompt_tokens` per sequence, of which `cached_tokens` hit a prefix cache."""

    batch: Num
    prompt_tokens: Num
    cached_tokens: Num
    computed_tokens: Num
    flops: Num
    bytes_moved: Num
    compute_time_s: Num
    memory_time_s: Num
    time_s: Num
    bound: str | np.ndarray
    ttft_s: Num  # prefill time; queueing and KV fetch are added by tiers/sim
    ceiling_time_s: Num = None  # sum over operator groups of max(bytes/bw, FLOPs/peak)
    efficiency_source: str = ""


def prefill(
    d: Deployment, prompt_tokens, cached_tokens=0, batch=1, flash_attention: bool = True
) -> Prefill:
    """FLOPs and time to prefill the uncached part of a prompt (causal attention included).

    The n computed tokens attend to the c cached ones and to each other
    (`operators.query_key_pairs`); a prefix hit removes both the linear and most of the
    quadratic work, and that is all a hit saves. Without FlashAttention
    (`flash_attention=False`) the score matrices also make round trips through memory,
    which FlashAttention keeps on chip: same FLOPs, more bytes, and per operator that turns
    attention from compute- to memory-bound. Kernel tables time FlashAttention kernels
    only. At tensor parallelism the FLOPs and bytes are per GPU, all-reduces included."""
    if d.kernel_tables and not flash_attention:
        raise KvlabError(
            "the published kernel tables time FlashAttention kernels; "
            "flash_attention=False does not apply to them"
        )
    prompt, cached, batch = _prefill_counts(prompt_tokens, cached_tokens, batch)
    p_arr, c_arr, b = (np.asarray(x, dtype=float) for x in (prompt, cached, batch))
    c_arr = _served(p_arr, c_arr)
    cached = int(c_arr) if c_arr.ndim == 0 else c_arr.astype(np.int64)
    n = p_arr - c_arr
    counts = pass_counts(b, n, c_arr)
    bytes_moved, flops, memory_s, compute_s = pass_totals(d, d.table.work(counts, flash_attention))
    units = unit_seconds(d)
    eff = d.efficiency
    work_s = units.pass_s(counts, flash_attention)
    latency, link = units.allreduce_s(counts.tokens)
    computing = n > 0
    ceiling = np.where(computing, work_s + latency + link, 0.0)
    time_s = np.where(computing, work_s / eff + latency + link / eff, 0.0)
    compute_time = np.where(computing, compute_s, 0.0)
    memory_time = np.where(computing, memory_s, 0.0)
    source = d.speed.source if not d.kernel_tables else ""
    if d.kernel_tables:
        time_s, source = kernel_prefill_time(d, batch, prompt, cached)
    bound = np.where(compute_time >= memory_time, "compute", "memory")
    return Prefill(
        batch=batch,
        prompt_tokens=prompt,
        cached_tokens=cached,
        computed_tokens=_plain(n),
        flops=_plain(np.asarray(flops)),
        bytes_moved=_plain(np.asarray(bytes_moved)),
        compute_time_s=_plain(compute_time),
        memory_time_s=_plain(memory_time),
        time_s=_plain(np.asarray(time_s)),
        bound=bound.item() if bound.ndim == 0 else bound,
        ttft_s=_plain(np.asarray(time_s)),
        ceiling_time_s=_plain(ceiling),
        efficiency_source=source,
    )


def _prefill_counts(prompt_tokens, cached_tokens, batch) -> tuple:
    """prefill's token counts and batch, checked (in that order)."""
    prompt = check_count("prompt_tokens", prompt_tokens, 1, MAX_CONTEXT_TOKENS)
    cached = check_count("cached_tokens", cached_tokens, 0, MAX_CONTEXT_TOKENS)
    return prompt, cached, check_count("batch", batch, 1, MAX_BATCH)


def _served(p_arr, c_arr):
    """The cached tokens a prefill serves (as floats): never more than the prompt, and the
    last prompt token is always computed (its logits give the first output token)."""
    if np.any(c_arr > p_arr):
        bad = int(np.max(c_arr - p_arr))
        raise KvlabError(
            f"cached_tokens cannot exceed prompt_tokens (by {bad:,} tokens here); "
            "a prefix hit covers at most the whole prompt"
        )
    return np.asarray(served_tokens(c_arr, p_arr), dtype=float)


# --------------------------------------------------------------------- memory fit


@dataclass(frozen=True)
class MemoryFit(Result):
    """Weights + KV against device memory."""

    weight_bytes: float
    kv_cache_bytes: Num
    needed_bytes: Num
    capacity_bytes: float
    fits: bool | np.ndarray
    max_batch: Num  # at the given context
    max_context: Num  # at the given batch (None/inf: a sliding window caps the KV)


def memory_fit(d: Deployment, batch=1, context=4096) -> MemoryFit:
    """Does weights + batch x context of KV fit; the largest batch and the longest context
    that do (per GPU under tensor parallelism: each holds its share of weights and KV)."""
    batch, context = check_batch_context(batch, context)
    m = d.model
    attended = np.asarray(m.effective_context(np.asarray(context, dtype=float)), dtype=float)
    fit = _memory_fields(d, np.asarray(batch, dtype=float), attended, False)
    room = np.maximum(fit["capacity_bytes"] - fit["weight_bytes"], 0.0)
    kv_tok = fit["kv_bytes_per_token"]
    max_context = np.floor(room / (np.asarray(batch, dtype=float) * kv_tok))
    if m.sliding_window:
        window_fits = np.asarray(batch) * m.sliding_window * kv_tok <= room
        max_context = np.where(window_fits, np.inf, max_context)
    return MemoryFit(
        weight_bytes=fit["weight_bytes"],
        kv_cache_bytes=fit["kv_cache_bytes"],
        needed_bytes=fit["memory_needed_bytes"],
        capacity_bytes=fit["capacity_bytes"],
        fits=fit["fits"],
        max_batch=fit["max_batch"],
        max_context=_plain(max_context),
    )


def batch_knee(step: DecodeStep) -> int:
    """Index, in a decode step computed over a grid of batches, of the knee.

    The knee is the first batch at which KV history reads reach the weight reads (from
    there on the step costs at least twice the weights and throughput is within 2x of its
    ceiling, while TPOT keeps growing), or at which compute takes over; the last index if
    neither happens on the grid.
    """
    kv = np.atleast_1d(step.kv_read_bytes)
    weights = np.broadcast_to(step.weight_read_bytes, kv.shape)
    bound = np.broadcast_to(step.bound, kv.shape)
    past = np.flatnonzero((kv >= weights) | (bound == "compute"))
    return int(past[0]) if past.size else kv.size - 1

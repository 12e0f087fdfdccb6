"""The ledger: bytes, FLOPs and time of one decode step, of a prefill, and memory fit.

Every numeric argument (batch, context, bandwidth, efficiency...) may be a numpy array;
they broadcast, so a whole slider grid is one call. The rule the book teaches is in
`decode_step`: each step streams the weights once for the whole batch plus the KV
history of every sequence, and takes the longer of moving those bytes and doing the
FLOPs.

Tensor parallelism (`tensor_parallel=N`) splits the weights and the K/V heads over N GPUs
and adds two all-reduces per layer; every byte, FLOP and memory figure is then per GPU,
tokens/s are the group's. `verify_step` is the pass speculative decoding verifies drafted
tokens with (`kvlab.speculative` turns it into tokens kept).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import lru_cache

import numpy as np

from .dtypes import DType, parse_dtype
from .errors import KvlabError, check_number
from .hardware import Device, get_device
from .models import ModelSpec, expected_experts_touched, get_model
from .operators import (
    allreduce_s,
    ceiling_s,
    decode_operators,
    kv_bytes_per_token_per_gpu,
    prefill_operators,
    weight_bytes_per_gpu,
)
from .parallel import allreduce_link, check_tensor_parallel, tensor_parallel_notes
from .prompt import served_tokens

#: Upper bounds beyond which an input is a typo rather than a configuration.
MAX_BATCH = 1_000_000
MAX_CONTEXT_TOKENS = 100_000_000
MAX_BANDWIDTH_BYTES_PER_S = 1e15  # 1 PB/s: 200x an H200
MAX_FLOPS_PER_S = 1e18
#: Lower bounds, likewise: below them a step takes longer than a float can say (1e-300 B/s).
MIN_BANDWIDTH_BYTES_PER_S = 1e3  # 1 kB/s: slower than any memory or link KV crosses
MIN_FLOPS_PER_S = 1e6
MIN_EFFICIENCY = 1e-3  # 0.1% of peak
MAX_CAPACITY_BYTES = 1e14
#: Drafted tokens per verification beyond which acceptance makes more of them pointless.
MAX_SPECULATIVE_TOKENS = 16
#: Attention without FlashAttention writes the score matrix S and the probabilities P to
#: memory and reads both back: 4 passes over heads x query-key pairs, fp16 elements.
NAIVE_ATTENTION_PASSES = 4
SCORE_BYTES = 2


def _out(x):
    """numpy scalar -> Python float, arrays unchanged."""
    return x.item() if isinstance(x, np.ndarray) and x.ndim == 0 else x


def _plain(x):
    """0-d arrays and numpy scalars -> Python numbers, arrays unchanged."""
    return x.item() if isinstance(x, (np.ndarray, np.generic)) and np.ndim(x) == 0 else x


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
    m = get_model(model)
    return m.params.total * parse_dtype(weight_dtype).bytes_per_element


def kv_bytes_per_token(model: ModelSpec | str, kv_dtype: str | DType = "fp16") -> float:
    """Bytes of K/V cached per token over all layers: 2 x layers x kv_heads x head_dim x
    bytes per element (MLA: (kv_lora_rank + qk_rope_head_dim) x layers x bytes)."""
    m = get_model(model)
    return m.kv_elements_per_token * parse_dtype(kv_dtype).bytes_per_element


def weight_read_bytes(model: ModelSpec | str, batch=1, weight_dtype: str | DType = "fp16"):
    """Weight bytes one forward pass over `batch` tokens streams from memory.

    Dense models stream every matrix once, whatever the batch (the embedding table is
    only gathered, so it is left out). MoE models stream the shared parts plus the
    experts the batch's tokens touch, which grows with the batch until all are read.
    """
    m = get_model(model)
    p = m.params
    elements = p.streamed_dense
    if m.is_moe:
        touched = expected_experts_touched(m.num_experts, m.experts_per_token, batch)
        elements = elements + p.moe_layers * touched * p.expert
    return _out(np.asarray(elements, dtype=float) * parse_dtype(weight_dtype).bytes_per_element)


# ------------------------------------------------------------------------- decode


@dataclass(frozen=True)
class DecodeStep(Result):
    """One decode step of `batch` sequences, each with `context` tokens of KV history."""

    model: str
    hardware: str
    weight_dtype: str
    kv_dtype: str
    batch: object
    context: object
    bandwidth_bytes_per_s: object
    efficiency: object  # a fraction of the peaks, or "measured"
    weight_bytes: float  # weights in memory
    weight_read_bytes: object  # weights streamed by this step
    kv_bytes_per_token: float
    kv_read_bytes: object  # batch x attended context x KV/token
    kv_write_bytes: object  # the new token's K/V for every sequence
    step_bytes: object
    flops: object
    arithmetic_intensity: object  # FLOPs per byte moved
    ridge_flops_per_byte: object  # roofline knee: peak FLOP/s / bandwidth in use
    memory_time_s: object  # step bytes / bandwidth (x efficiency)
    compute_time_s: object  # step FLOPs / peak (x efficiency)
    step_time_s: object
    bound: object  # "memory" or "compute": which of the two whole-step times is longer
    tokens_per_s: object  # aggregate over the batch
    tokens_per_s_per_sequence: object
    kv_cache_bytes: object  # KV held in memory for the batch
    memory_needed_bytes: object
    capacity_bytes: float  # what weights + KV may fill (hardware.USABLE_MEMORY_FRACTION)
    fits: object
    max_batch: object  # largest batch whose KV fits beside the weights at this context
    ceiling_step_time_s: object  # sum over operators of max(bytes/bandwidth, FLOPs/peak)
    efficiency_source: str  # what step_time_s rests on: the sheet peaks, or which tables
    overhead_s: object = 0.0  # measured mode: the per-step fixed cost of the small kernels
    tensor_parallel: int = 1  # GPUs the weights and K/V heads are split over
    allreduce_time_s: object = 0.0  # the step's all-reduces (2 per layer), in step_time_s
    allreduce_latency_s: object = 0.0  # their fixed per-collective part; the rest is link time
    notes: tuple = ()  # what a reader must know to read the numbers (replicated K/V heads...)


@lru_cache(maxsize=256)
def _params(m: ModelSpec):
    """Parameter counts, derived once per model (a ledger call needs them several times)."""
    return m.params


_dtype = lru_cache(maxsize=256)(parse_dtype)


def _scalar(*values) -> bool:
    return all(type(v) in (int, float) for v in values)


def _touched(m: ModelSpec, tokens, scalar: bool):
    """Experts a batch of tokens touches per MoE layer (0 for dense models)."""
    if not m.is_moe:
        return 0.0
    if scalar:
        return m.num_experts * (1.0 - (1.0 - m.experts_per_token / m.num_experts) ** tokens)
    return expected_experts_touched(m.num_experts, m.experts_per_token, tokens)


def _ceiling(terms, bandwidth, peak, scalar: bool):
    """Sum over operators of max(bytes / bandwidth, FLOPs / peak).

    `terms` are (bytes, FLOPs) of groups of operators that share an arithmetic intensity:
    every weight GEMM (and norm) at one m moves its weights once and does 2 FLOPs per
    weight per token, so they are bound alike and their maxima add up exactly; routed
    experts (an intensity of their own) and attention are the other groups. The detailed
    list is `kvlab.operators.decode_operators`; a test checks the two agree.
    """
    top = max if scalar else np.maximum
    total = 0.0
    for nbytes, flops in terms:
        total = total + top(nbytes / bandwidth, flops / peak)
    return total


def _is_measured(efficiency) -> bool:
    return isinstance(efficiency, str) and efficiency.strip().lower() == "measured"


def _check_efficiency(efficiency):
    if isinstance(efficiency, str) and not _is_measured(efficiency):
        raise KvlabError(f"efficiency must be a number in (0, 1] or 'measured', got {efficiency!r}")
    return check_number(
        "efficiency", efficiency, minimum=MIN_EFFICIENCY, allow_equal_min=True, maximum=1.0
    )


def decode_step(
    model: ModelSpec | str,
    hardware: Device | str,
    batch=1,
    context=4096,
    weight_dtype: str | DType = "fp16",
    kv_dtype: str | DType = "fp16",
    bandwidth_bytes_per_s=None,
    efficiency=1.0,
    capacity_bytes=None,
    tensor_parallel=1,
) -> DecodeStep:
    """The ledger of one decode step. Array arguments broadcast against each other.

    The ceiling is the sum over the step's operators of max(bytes / bandwidth, FLOPs /
    peak). `bandwidth_bytes_per_s` overrides the device's peak (to budget with a measured
    figure); a numeric `efficiency` scales both bandwidth and FLOP/s (1.0 = the physical
    ceiling, 0.6-0.85 is what real kernels reach); `efficiency="measured"` times every
    operator from published kernel tables instead (`kvlab.measured`; devices with data
    only; a scalar point outside the tables raises, array points there are NaN).
    `tensor_parallel` (1, 2, 4, 8) splits the step over that many GPUs of one server
    (`allreduce_link` says how its all-reduces are costed); bytes and memory are per GPU.
    Memory: weights + KV must fit in the device's usable capacity (`capacity_bytes`
    overrides it), as the simulator's do.
    """
    return _step(
        model,
        hardware,
        batch,
        context,
        weight_dtype,
        kv_dtype,
        bandwidth_bytes_per_s,
        efficiency,
        capacity_bytes,
        tensor_parallel,
        1,
    )


def verify_step(
    model: ModelSpec | str,
    hardware: Device | str,
    batch=1,
    context=4096,
    speculative_tokens=4,
    weight_dtype: str | DType = "fp16",
    kv_dtype: str | DType = "fp16",
    bandwidth_bytes_per_s=None,
    efficiency=1.0,
    capacity_bytes=None,
    tensor_parallel=1,
) -> DecodeStep:
    """The ledger of one speculative verification pass: each of `batch` sequences runs its
    last token and `speculative_tokens` drafted ones (K + 1 positions) through the target
    model at once. The weights are read once for batch x (K + 1) rows, each sequence's KV
    history once, K + 1 new K/V entries are written. Its `tokens_per_s` fields count
    positions verified; `kvlab.speculative.speculative_step` turns them into tokens kept."""
    k = check_number(
        "speculative_tokens",
        speculative_tokens,
        minimum=0,
        allow_equal_min=True,
        maximum=MAX_SPECULATIVE_TOKENS,
        integer=True,
    )
    return _step(
        model,
        hardware,
        batch,
        context,
        weight_dtype,
        kv_dtype,
        bandwidth_bytes_per_s,
        efficiency,
        capacity_bytes,
        tensor_parallel,
        _plus_one(k),
    )


def _plus_one(k):
    return k + 1 if type(k) is int else np.asarray(k, dtype=float) + 1.0


def _step(
    model,
    hardware,
    batch,
    context,
    weight_dtype,
    kv_dtype,
    bandwidth_bytes_per_s,
    efficiency,
    capacity_bytes,
    tensor_parallel,
    queries,
) -> DecodeStep:
    """A decode (queries = 1) or verify step: validate, then the fast scalar ledger, the
    per-operator one (tensor parallelism, verification) and/or the measured tables."""
    m, dev = get_model(model), get_device(hardware)
    wdt, kdt = _dtype(weight_dtype), _dtype(kv_dtype)
    batch = check_number(
        "batch", batch, minimum=1, allow_equal_min=True, maximum=MAX_BATCH, integer=True
    )
    context = check_number(
        "context",
        context,
        minimum=0,
        allow_equal_min=True,
        maximum=MAX_CONTEXT_TOKENS,
        integer=True,
    )
    measured = _is_measured(efficiency)
    if measured and bandwidth_bytes_per_s is not None:
        raise KvlabError(
            "efficiency 'measured' times kernels from their tables; "
            "a bandwidth override does not apply to it"
        )
    bandwidth = (
        dev.memory_bandwidth_bytes_per_s
        if bandwidth_bytes_per_s is None
        else check_number(
            "bandwidth (bytes/s)",
            bandwidth_bytes_per_s,
            minimum=MIN_BANDWIDTH_BYTES_PER_S,
            allow_equal_min=True,
            maximum=MAX_BANDWIDTH_BYTES_PER_S,
        )
    )
    eff = 1.0 if measured else _check_efficiency(efficiency)
    capacity = (
        dev.usable_capacity_bytes
        if capacity_bytes is None
        else check_number("capacity (bytes)", capacity_bytes, maximum=MAX_CAPACITY_BYTES)
    )
    tp = (
        1
        if type(tensor_parallel) is int and tensor_parallel == 1
        else check_tensor_parallel(m, tensor_parallel)
    )
    scalar = _scalar(batch, context, bandwidth, eff, capacity)
    if tp == 1 and type(queries) is int and queries == 1:
        fields = _decode_fields(m, dev, wdt, kdt, batch, context, bandwidth, eff, capacity, scalar)
    else:
        fields = _operator_fields(
            m, dev, wdt, kdt, batch, context, bandwidth, eff, capacity, tp, queries
        )
    if measured:
        from .measured.timing import measured_decode_fields

        fields.update(measured_decode_fields(m, dev, wdt, kdt, batch, context, scalar, tp, queries))
    fields.setdefault("overhead_s", 0.0)
    return DecodeStep._build(
        model=m.name,
        hardware=dev.name,
        weight_dtype=wdt.name,
        kv_dtype=kdt.name,
        batch=batch,
        context=context,
        efficiency="measured" if measured else eff,
        **fields,
    )


def _decode_fields(m, dev, wdt, kdt, batch, context, bandwidth, eff, capacity, scalar) -> dict:
    """Every number of a decode step at the sheet's peaks x `eff` (plain floats for scalar
    inputs: no numpy on that path, which a simulator calls thousands of times)."""
    p = _params(m)
    wbpe = wdt.bytes_per_element
    if scalar:
        b = float(batch)
        attended = float(min(context, m.sliding_window) if m.sliding_window else context)
    else:
        b = np.asarray(batch, dtype=float)
        attended = np.asarray(m.effective_context(np.asarray(context, dtype=float)), dtype=float)
    touched = _touched(m, b, scalar)
    w_total = p.total * wbpe
    w_read = (p.streamed_dense + p.moe_layers * touched * p.expert) * wbpe
    kv_tok = m.kv_elements_per_token * kdt.bytes_per_element
    kv_read = b * attended * kv_tok
    kv_write = b * kv_tok
    step_bytes = w_read + kv_read + kv_write
    active = p.active_per_token(m.experts_per_token)
    attention_flops = b * m.attention_flops_per_cached_token * attended
    flops = b * (2.0 * active + m.attention_flops_per_cached_token * attended)
    peak = dev.peak_flops_per_s(wdt.compute)
    ceiling = _ceiling(
        (
            (p.streamed_dense * wbpe, b * 2.0 * p.streamed_dense),
            (p.moe_layers * touched * p.expert * wbpe, b * 2.0 * (active - p.streamed_dense)),
            (kv_read + kv_write, attention_flops),
        ),
        bandwidth,
        peak,
        scalar,
    )
    step_time = ceiling / eff
    memory_time = step_bytes / (bandwidth * eff)
    compute_time = flops / (peak * eff)
    needed = w_total + kv_read
    per_seq_kv = (max(attended, 1.0) if scalar else np.maximum(attended, 1.0)) * kv_tok
    room = max(capacity - w_total, 0.0) if scalar else np.maximum(capacity - w_total, 0.0)
    if scalar:
        bound = "compute" if compute_time > memory_time else "memory"
        max_batch, fits = math.floor(room / per_seq_kv), needed <= capacity
    else:
        bound = np.where(compute_time > memory_time, "compute", "memory")
        bound = bound.item() if bound.ndim == 0 else bound
        max_batch = _out(np.floor(room / per_seq_kv).astype(np.int64))
        fits = _out(np.asarray(needed <= capacity))
    out = _out if not scalar else (lambda x: x)
    source = "the sheet's bandwidth and FLOP/s x efficiency"
    return dict(
        bandwidth_bytes_per_s=out(np.asarray(bandwidth)) if not scalar else bandwidth,
        weight_bytes=w_total,
        weight_read_bytes=out(w_read),
        kv_bytes_per_token=kv_tok,
        kv_read_bytes=out(kv_read),
        kv_write_bytes=out(kv_write),
        step_bytes=out(step_bytes),
        flops=out(flops),
        arithmetic_intensity=out(flops / step_bytes),
        ridge_flops_per_byte=out(peak / (bandwidth if scalar else np.asarray(bandwidth, float))),
        memory_time_s=out(memory_time),
        compute_time_s=out(compute_time),
        step_time_s=out(step_time),
        bound=bound,
        tokens_per_s=out(b / step_time),
        tokens_per_s_per_sequence=out(1.0 / step_time),
        kv_cache_bytes=out(kv_read),
        memory_needed_bytes=out(needed),
        capacity_bytes=capacity,
        fits=fits,
        max_batch=max_batch,
        ceiling_step_time_s=out(ceiling),
        efficiency_source=source,
    )


# ------------------------------------------------- the ledger from the operators


def _operator_fields(
    m, dev, wdt, kdt, batch, context, bandwidth, eff, capacity, tp, queries
) -> dict:
    """Every number of a decode or verify step from its operator list (`kvlab.operators`):
    per GPU at `tp`, with `queries` positions per sequence. Numerically the fast ledger at
    tp = 1 and queries = 1; all-reduce latency is not scaled by `eff`, their link time is."""
    ops = decode_operators(m, batch, context, wdt, kdt, tp, queries)
    b = np.asarray(batch, dtype=float)
    attended = np.asarray(m.effective_context(np.asarray(context, dtype=float)), dtype=float)
    kv_tok = kv_bytes_per_token_per_gpu(m, kdt, tp)
    kv_read = b * attended * kv_tok
    kv_write = b * np.asarray(queries, dtype=float) * kv_tok
    local = [op for op in ops if op.kind != "allreduce"]
    step_bytes = sum(op.bytes for op in local)
    flops = sum(op.flops for op in local)
    peak = dev.peak_flops_per_s(wdt.compute)
    bw = np.asarray(bandwidth, dtype=float)
    ceiling = ceiling_s(local, bw, peak)
    latency = link_time = 0.0
    notes = ()
    if tp > 1:
        link = allreduce_link(dev, tp)
        reduce = next(op for op in ops if op.kind == "allreduce")
        latency, link_time = allreduce_s(reduce, link.bandwidth_bytes_per_s, link.latency_s)
        notes = tensor_parallel_notes(m, tp, link)
    step_time = ceiling / eff + latency + link_time / eff
    memory_time, compute_time = step_bytes / (bw * eff), flops / (peak * eff)
    w_total = weight_bytes_per_gpu(m, wdt, tp)
    room = np.maximum(capacity - w_total, 0.0)
    bound = np.where(compute_time > memory_time, "compute", "memory")
    out = _plain
    reduce_time = latency + link_time / eff + 0.0 * b
    return dict(
        bandwidth_bytes_per_s=out(bw),
        weight_bytes=w_total,
        weight_read_bytes=out(step_bytes - kv_read - kv_write),
        kv_bytes_per_token=kv_tok,
        kv_read_bytes=out(kv_read),
        kv_write_bytes=out(kv_write),
        step_bytes=out(step_bytes),
        flops=out(flops),
        arithmetic_intensity=out(flops / step_bytes),
        ridge_flops_per_byte=out(peak / bw),
        memory_time_s=out(memory_time),
        compute_time_s=out(compute_time),
        step_time_s=out(step_time),
        bound=bound.item() if bound.ndim == 0 else bound,
        tokens_per_s=out(b * queries / step_time),
        tokens_per_s_per_sequence=out(queries / step_time),
        kv_cache_bytes=out(kv_read),
        memory_needed_bytes=out(w_total + kv_read),
        capacity_bytes=capacity,
        fits=out(np.asarray(w_total + kv_read <= capacity)),
        max_batch=out(np.floor(room / (np.maximum(attended, 1.0) * kv_tok)).astype(np.int64)),
        ceiling_step_time_s=out(ceiling + latency + link_time),
        efficiency_source="the sheet's bandwidth and FLOP/s x efficiency",
        tensor_parallel=tp,
        allreduce_time_s=out(reduce_time),
        allreduce_latency_s=out(latency + 0.0 * b),
        notes=notes,
    )


# ------------------------------------------------------------------------ prefill


@dataclass(frozen=True)
class Prefill(Result):
    """Prefill of `prompt_tokens` per sequence, of which `cached_tokens` hit a prefix cache."""

    batch: object
    prompt_tokens: object
    cached_tokens: object
    computed_tokens: object
    flops: object
    bytes_moved: object
    compute_time_s: object
    memory_time_s: object
    time_s: object
    bound: object
    ttft_s: object  # prefill time; queueing and KV fetch are added by tiers/sim
    ceiling_time_s: object = None  # sum over operators of max(bytes/bandwidth, FLOPs/peak)
    efficiency_source: str = ""


def prefill(
    model: ModelSpec | str,
    hardware: Device | str,
    prompt_tokens,
    cached_tokens=0,
    batch=1,
    weight_dtype: str | DType = "fp16",
    kv_dtype: str | DType = "fp16",
    efficiency=1.0,
    flops_per_s=None,
    bandwidth_bytes_per_s=None,
    flash_attention: bool = True,
    tensor_parallel=1,
) -> Prefill:
    """FLOPs and time to prefill the uncached part of a prompt (causal attention included).

    Query i of the n computed tokens attends to the c cached tokens and the i before it,
    so attention costs n*c + n(n+1)/2 query-key pairs. A prefix hit removes both the
    linear and most of the quadratic work; that is all a hit saves. Without FlashAttention
    (`flash_attention=False`) the score matrices also make round trips through memory,
    which FlashAttention keeps on chip: same FLOPs, more bytes, and per operator that turns
    attention from compute- to memory-bound. `efficiency="measured"` times the operators
    from kernel tables (FlashAttention kernels only). At `tensor_parallel` N the FLOPs and
    bytes are per GPU and the all-reduces of N GPUs are added (as in `decode_step`).
    """
    m, dev = get_model(model), get_device(hardware)
    wdt, kdt = _dtype(weight_dtype), _dtype(kv_dtype)
    prompt, cached, batch = _prefill_counts(prompt_tokens, cached_tokens, batch)
    measured = _is_measured(efficiency)
    overrides = flops_per_s is not None or bandwidth_bytes_per_s is not None
    if measured and (overrides or not flash_attention):
        raise KvlabError(
            "efficiency 'measured' times FlashAttention kernels from their tables; "
            "flops_per_s, bandwidth_bytes_per_s and flash_attention=False "
            "do not apply"
        )
    eff = 1.0 if measured else _check_efficiency(efficiency)
    p_arr, c_arr, b = (np.asarray(x, dtype=float) for x in (prompt, cached, batch))
    c_arr = _served(p_arr, c_arr)
    cached = int(c_arr) if c_arr.ndim == 0 else c_arr.astype(np.int64)
    n = p_arr - c_arr
    peak, bandwidth = _prefill_rates(dev, wdt, flops_per_s, bandwidth_bytes_per_s)
    tp = (
        1
        if type(tensor_parallel) is int and tensor_parallel == 1
        else check_tensor_parallel(m, tensor_parallel)
    )
    if tp == 1:
        flops, bytes_moved, ceiling = _prefill_work(
            m, wdt, kdt, b, p_arr, c_arr, flash_attention, np.asarray(bandwidth), np.asarray(peak)
        )
        time_s = ceiling / eff
    else:
        flops, bytes_moved, ceiling, time_s = _prefill_parallel(
            m, dev, wdt, kdt, batch, prompt, cached, flash_attention, tp, bandwidth, peak, eff
        )
    compute_time = np.where(n > 0, flops / (np.asarray(peak) * eff), 0.0)
    memory_time = np.where(n > 0, bytes_moved / (np.asarray(bandwidth) * eff), 0.0)
    source = "the sheet's bandwidth and FLOP/s x efficiency"
    if measured:
        from .measured.timing import measured_prefill_time

        time_s, source = measured_prefill_time(m, dev, wdt, kdt, batch, prompt, cached, tp)
    bound = np.where(compute_time >= memory_time, "compute", "memory")
    return Prefill(
        batch=batch,
        prompt_tokens=prompt,
        cached_tokens=cached,
        computed_tokens=_out(n),
        flops=_out(flops),
        bytes_moved=_out(np.asarray(bytes_moved)),
        compute_time_s=_out(compute_time),
        memory_time_s=_out(memory_time),
        time_s=_out(time_s),
        bound=bound.item() if bound.ndim == 0 else bound,
        ttft_s=_out(time_s),
        ceiling_time_s=_out(ceiling),
        efficiency_source=source,
    )


def _prefill_counts(prompt_tokens, cached_tokens, batch) -> tuple:
    """prefill's token counts and batch, checked (in that order)."""
    prompt = check_number(
        "prompt_tokens",
        prompt_tokens,
        minimum=1,
        allow_equal_min=True,
        maximum=MAX_CONTEXT_TOKENS,
        integer=True,
    )
    cached = check_number(
        "cached_tokens",
        cached_tokens,
        minimum=0,
        allow_equal_min=True,
        maximum=MAX_CONTEXT_TOKENS,
        integer=True,
    )
    batch = check_number(
        "batch", batch, minimum=1, allow_equal_min=True, maximum=MAX_BATCH, integer=True
    )
    return prompt, cached, batch


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


def _prefill_rates(dev, wdt, flops_per_s, bandwidth_bytes_per_s) -> tuple:
    """(peak FLOP/s, bandwidth): the device's, or the checked overrides."""
    peak = (
        dev.peak_flops_per_s(wdt.compute)
        if flops_per_s is None
        else check_number(
            "flops_per_s",
            flops_per_s,
            minimum=MIN_FLOPS_PER_S,
            allow_equal_min=True,
            maximum=MAX_FLOPS_PER_S,
        )
    )
    bandwidth = (
        dev.memory_bandwidth_bytes_per_s
        if bandwidth_bytes_per_s is None
        else check_number(
            "bandwidth (bytes/s)",
            bandwidth_bytes_per_s,
            minimum=MIN_BANDWIDTH_BYTES_PER_S,
            allow_equal_min=True,
            maximum=MAX_BANDWIDTH_BYTES_PER_S,
        )
    )
    return peak, bandwidth


def _prefill_work(m, wdt, kdt, b, prompt, cached, flash, bandwidth, peak) -> tuple:
    """(FLOPs, bytes, ceiling) of a prefill on one GPU, grouped as in `decode_step`."""
    n = prompt - cached
    pairs = n * cached + n * (n + 1) / 2
    p = _params(m)
    active = p.active_per_token(m.experts_per_token)
    attention_flops = b * m.attention_flops_per_cached_token * pairs
    flops = b * (2.0 * active * n + m.attention_flops_per_cached_token * pairs)
    attention_bytes = b * (cached + n) * kv_bytes_per_token(m, kdt)
    if not flash:
        attention_bytes = (
            attention_bytes
            + b * (m.num_heads * m.num_layers) * pairs * NAIVE_ATTENTION_PASSES * SCORE_BYTES
        )
    w_read = weight_read_bytes(m, b * np.maximum(n, 1), wdt)
    dense_w = p.streamed_dense * wdt.bytes_per_element
    ceiling = np.where(
        n > 0,
        _ceiling(
            (
                (dense_w, b * 2.0 * p.streamed_dense * n),
                (w_read - dense_w, b * 2.0 * (active - p.streamed_dense) * n),
                (attention_bytes, attention_flops),
            ),
            bandwidth,
            peak,
            False,
        ),
        0.0,
    )
    return flops, w_read + attention_bytes, ceiling


def _prefill_parallel(
    m, dev, wdt, kdt, batch, prompt, cached, flash, tp, bandwidth, peak, eff
) -> tuple:
    """(FLOPs, bytes, ceiling, time) of a prefill per GPU at tensor-parallel `tp`, from its
    operators: each GPU's share of the work plus the all-reduces of batch x new tokens."""
    ops = prefill_operators(m, batch, prompt, cached, wdt, kdt, flash, tp)
    local = [op for op in ops if op.kind != "allreduce"]
    link = allreduce_link(dev, tp)
    reduce = next(op for op in ops if op.kind == "allreduce")
    latency, link_time = allreduce_s(reduce, link.bandwidth_bytes_per_s, link.latency_s)
    work = ceiling_s(local, np.asarray(bandwidth), np.asarray(peak))
    return (
        sum(op.flops for op in local),
        np.asarray(sum(op.bytes for op in local)),
        work + latency + link_time,
        work / eff + latency + link_time / eff,
    )


# --------------------------------------------------------------------- memory fit


@dataclass(frozen=True)
class MemoryFit(Result):
    """Weights + KV against device memory."""

    weight_bytes: float
    kv_cache_bytes: object
    needed_bytes: object
    capacity_bytes: float
    fits: object
    max_batch: object  # at the given context
    max_context: object  # at the given batch (None/inf: a sliding window caps the KV)


def memory_fit(
    model: ModelSpec | str,
    hardware: Device | str,
    batch=1,
    context=4096,
    weight_dtype: str | DType = "fp16",
    kv_dtype: str | DType = "fp16",
    capacity_bytes=None,
    tensor_parallel=1,
) -> MemoryFit:
    """Does weights + batch x context of KV fit; the largest batch and the longest context
    that do (per GPU at `tensor_parallel` N: each holds its share of weights and KV)."""
    step = decode_step(
        model,
        hardware,
        batch,
        context,
        weight_dtype,
        kv_dtype,
        capacity_bytes=capacity_bytes,
        tensor_parallel=tensor_parallel,
    )
    m = get_model(model)
    room = np.maximum(step.capacity_bytes - step.weight_bytes, 0.0)
    max_context = np.floor(room / (np.asarray(step.batch, dtype=float) * step.kv_bytes_per_token))
    if m.sliding_window:
        window_fits = np.asarray(step.batch) * m.sliding_window * step.kv_bytes_per_token <= room
        max_context = np.where(window_fits, np.inf, max_context)
    return MemoryFit(
        weight_bytes=step.weight_bytes,
        kv_cache_bytes=step.kv_cache_bytes,
        needed_bytes=step.memory_needed_bytes,
        capacity_bytes=step.capacity_bytes,
        fits=step.fits,
        max_batch=step.max_batch,
        max_context=_out(max_context),
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

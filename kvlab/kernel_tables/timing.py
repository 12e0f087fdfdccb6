"""The measured mode of the ledger: each operator of a step timed from kernel tables.

A step's time is the sum over its operators (`kvlab.operators`) of their measured
latencies: every GEMM at the batch's m, the fused MoE experts, attention over the batch's
contexts, the all-reduces, and the small kernels no table covers (norms, activation,
embedding, sampling, router top-k). Those small kernels cost what the tables show a kernel
costs when it does almost nothing (`kernel_floor`: the median latency of the GEMM table's
tiniest GEMMs, ~2-3 us) plus their activation bytes at the bandwidth large GEMVs reach.
That floor, summed over the small kernels of a step, is the per-step fixed overhead
(`overhead_s`): about 100 launches for a 32-layer dense model. Host-side work between steps
(scheduling, sampling on the CPU) is in no kernel table and is left out: this is the GPU's
time for a step run as one CUDA graph.

No operator is allowed below its own ceiling, max(bytes / sheet bandwidth, FLOPs / peak):
a benchmark that re-runs one GEMM on the same weights can find them in L2 (L40S's tables
beat its 864 GB/s sheet figure below ~256 MB), which a decode step, streaming every layer
once, never does. Where that floor binds, the operator says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..dtypes import DType, parse_dtype
from ..errors import KvlabError
from ..hardware import Device, get_device, gpu_link
from ..models import ModelSpec, get_model
from ..operators import ACTIVATION_BYTES, Num, layer_shapes, operator_table, query_key_pairs
from .tables import DTYPE_KEYS, Curve, load

#: Operators timed from the tables, and how each small kernel is timed.
SMALL_KERNELS = "kernel floor + activation bytes / large-GEMV bandwidth"


@dataclass(frozen=True)
class OperatorTime:
    """One operator's time in a step: measured (all calls) beside its ceiling."""

    name: str
    kind: str
    calls: int
    measured_s: Num  # NaN where out of the measured range
    ceiling_s: Num  # max(bytes / bandwidth, FLOPs / peak), efficiency 1
    in_range: bool | np.ndarray
    how: str  # table and how the value was obtained
    limit: str  # the measured range, for messages
    at_ceiling: bool | np.ndarray = False  # the table was faster than the ceiling: clamped to it


@dataclass(frozen=True)
class StepTime:
    """A measured step: total, its fixed overhead, range flags and the per-operator times."""

    step_time_s: Num
    overhead_s: float
    in_range: bool | np.ndarray
    operators: tuple
    source: str

    def out_of_range(self) -> list[str]:
        """Operators some point of this step falls outside of, with their measured ranges."""
        return [f"{op.name}: {op.limit}" for op in self.operators if not np.all(op.in_range)]


def _clamp(measured, ceiling):
    """Measured time, never below the ceiling (NaN stays NaN)."""
    return np.where(np.isnan(measured), np.nan, np.maximum(measured, ceiling))


def _timed(name, kind, calls, per_call, ceiling_call, ok, how, limit) -> OperatorTime:  # noqa: PLR0913 - the fields of one OperatorTime
    """An operator's times over its calls: the table's, floored at the ceiling."""
    return OperatorTime(
        name,
        kind,
        calls,
        calls * _clamp(per_call, ceiling_call),
        calls * ceiling_call,
        ok,
        how,
        limit,
        per_call < ceiling_call,
    )


def fresh_prompt_of(pairs):
    """The fresh prompt (no cached prefix) with this many query-key pairs: the inverse of
    `query_key_pairs(n, 0)`. The context-attention tables hold fresh prompts only, so a
    prefill over a cached prefix is timed at the fresh prompt of equal work."""
    return (np.sqrt(1 + 8 * np.asarray(pairs, dtype=float)) - 1) / 2


def _range(curve: Curve, what: str) -> str:
    return f"measured for {what} {curve.lo:g} to {curve.hi:g}"


class Kernels:
    """The interpolators one (model, device, dtypes, tensor-parallel degree) needs, built
    once, so that a simulator can time thousands of steps cheaply."""

    def __init__(self, m: ModelSpec, dev: Device, wdt: DType, kdt: DType, tp: int = 1):
        if m.is_mla:
            raise KvlabError(
                f"measured mode covers MHA/GQA attention; {m.name} uses MLA, "
                "whose tables are not in the extract"
            )
        self.model, self.device, self.wdt, self.kdt, self.tp = m, dev, wdt, kdt, tp
        self.tables = load(dev.kernel_tables_from or dev.name)  # the same die's, if borrowed
        self.table = operator_table(m, wdt, kdt, tp)  # the ledger's: ceilings come from it
        self.shapes = layer_shapes(m, tp)
        self.bandwidth = dev.memory_bandwidth_bytes_per_s
        self.peak = dev.peak_flops_per_s(wdt.compute)
        self.floor_s = self.tables.kernel_floor_s
        self.small_bandwidth = min(self.tables.gemv_bandwidth_bytes_per_s, self.bandwidth)
        by_name = {op.name: op for op in self.table.operators}
        label = DTYPE_KEYS.get(wdt.base, wdt.base)
        self.gemms = []  # (operator, curve, how)
        for name, (n, k) in self.shapes.gemms.items():
            curve, how = self.tables.gemm(wdt.base, n, k)
            self.gemms.append((by_name[name], curve, f"GEMM {n}x{k} {label}: {how}"))
        self.small = [op for op in self.table.operators if op.kind == "elementwise"]
        self.experts = None
        if m.is_moe:
            curve, how = self.tables.moe(*self.shapes.moe, tp, wdt.base)
            self.experts = (
                curve,
                f"MoE {self.shapes.moe[0]}x{self.shapes.moe[1]} {label}: {how}",
                by_name["experts"],
            )
        attention = by_name["attention"]
        self.kv_tok_layer = attention.kv_bytes_per_token / m.num_layers
        self.attn_flops_layer = attention.flops_per_pair / m.num_layers
        self.all_reduce = self.tables.all_reduce(tp) if tp > 1 else None
        # an all-reduce measured on a faster NVLink is never faster than this device's own
        # link: the smallest message's latency plus the ring's traffic at its bandwidth
        self.link_s_per_element = (
            2 * (tp - 1) / tp * ACTIVATION_BYTES / gpu_link(dev).bandwidth_bytes_per_s
            if tp > 1 and dev.kernel_tables_from
            else 0.0
        )
        self.layout = (self.shapes.heads, self.shapes.kv_heads, self.shapes.head_dim, kdt.base)
        self.layout_label = (
            f"{self.shapes.heads}/{self.shapes.kv_heads}/{self.shapes.head_dim} "
            f"KV {DTYPE_KEYS.get(kdt.base, kdt.base)}"
        )
        self._fixed: dict[int, float] = {}  # per batch: everything but attention

    @property
    def source(self) -> str:
        dev = self.device
        if dev.kernel_tables_from:
            return (
                f"measured: {self.tables.label}, standing in for the {dev.display_name} "
                "(the same die and memory; all-reduces at its own NVLink)"
            )
        return f"measured: {self.tables.label}"

    # ---------------------------------------------------------------- shared parts
    def _weights(self, tokens, touching) -> list[OperatorTime]:
        """GEMMs and MoE experts over `tokens` rows (`touching` tokens pick experts)."""
        out = []
        for op, curve, how in self.gemms:
            t, ok = curve(tokens)
            bytes_call, flops_token = op.weight_bytes / op.calls, op.flops_per_token / op.calls
            ceiling = np.maximum(bytes_call / self.bandwidth, flops_token * tokens / self.peak)
            limit = _range(curve, "m (tokens)")
            out.append(_timed(op.name, "gemm", op.calls, t, ceiling, ok, how, limit))
        if self.experts:
            curve, how, op = self.experts
            layers = op.calls
            bytes_layer = self.table.experts_touched(touching) * op.expert_bytes / layers
            flops_layer = op.flops_per_token / layers * tokens
            ceiling = np.maximum(bytes_layer / self.bandwidth, flops_layer / self.peak)
            t, ok = curve(tokens)
            out.append(
                _timed("experts", "moe", layers, t, ceiling, ok, how, _range(curve, "tokens"))
            )
        return out

    def _small(self, tokens) -> list[OperatorTime]:
        """Norms, activation, embedding, sampling, router top-k, and the all-reduces."""
        out = []
        for op in self.small:
            per_token = op.activation_bytes_per_token
            t = op.calls * (self.floor_s + per_token * tokens / self.small_bandwidth)
            ceiling = np.maximum(
                op.weight_bytes / self.bandwidth, op.flops_per_token * tokens / self.peak
            )
            ok = np.ones(np.shape(tokens), dtype=bool)  # no table: no range to leave
            fields = (op.name, "elementwise", op.calls, np.maximum(t, ceiling), ceiling, ok)
            out.append(OperatorTime(*fields, SMALL_KERNELS, "any size"))
        if self.all_reduce is not None:
            calls = 2 * self.model.num_layers
            t, ok = self._all_reduce_call_s(tokens * self.model.hidden_size)  # bf16 elements
            how = f"all-reduce over {self.tp} GPUs"
            limit = _range(self.all_reduce, "message elements")
            out.append(
                OperatorTime("all_reduce", "allreduce", calls, calls * t, 0.0 * t, ok, how, limit)
            )
        return out

    @property
    def overhead_s(self) -> float:
        """The per-step fixed cost: the kernel floor times the launches no table times."""
        return sum(op.calls for op in self.small) * self.floor_s

    def _step(self, ops: list[OperatorTime]) -> StepTime:
        total = sum(op.measured_s for op in ops)
        ok = True
        for op in ops:  # shapes differ (GEMMs follow the batch, attention the contexts too)
            ok = ok & np.asarray(op.in_range)
        return StepTime(total, self.overhead_s, ok, tuple(ops), self.source)

    def allreduce_s(self, tokens) -> tuple:
        """(total, latency part) of a step's all-reduces over `tokens` rows: the table's
        time at each message, and the table's time for its smallest message (the fixed cost
        of a collective) times the calls; (0, 0) at tp = 1."""
        if self.all_reduce is None:
            return 0.0, 0.0
        calls = 2 * self.model.num_layers
        elements = np.asarray(tokens, float) * self.model.hidden_size
        t, _ = self._all_reduce_call_s(elements)
        return calls * t, calls * float(self.all_reduce.y[0])

    def _all_reduce_call_s(self, elements):
        """(seconds, in range) of one all-reduce of `elements` bf16 values: the table's,
        floored at this device's own link where the tables are another device's. Past the
        largest message measured (a pass of ~64k tokens on a 70B model) the ring is
        bandwidth-bound: the time grows in proportion to the message at the bandwidth that
        largest message reached (out of range, so the step counts as outside the tables)."""
        curve = self.all_reduce
        t, ok = curve(elements)
        e = np.asarray(elements, dtype=float)
        t = np.where(e > curve.hi, float(curve.y[-1]) / curve.hi * e, t)
        if self.link_s_per_element:
            floor = float(self.all_reduce.y[0]) + elements * self.link_s_per_element
            t = np.where(np.isnan(t), np.nan, np.maximum(t, floor))
        return t, ok

    # --------------------------------------------------------------------- the steps
    def _ceiling_attention(self, b, ctx, q):
        """One layer's attention ceiling with q queries per sequence against ctx tokens."""
        return np.maximum(
            b * (ctx + q) * self.kv_tok_layer / self.bandwidth,
            b * query_key_pairs(q, ctx) * self.attn_flops_layer / self.peak,
        )

    def _attention(self, phase: str, timed: tuple, ceiling, grid, how: str, sizes: tuple):
        """The attention kernel of a pass: `timed` (seconds per layer, in range) from the
        `phase` table `grid`."""
        (t, ok), (lo, hi) = timed, sizes
        return _timed(
            "attention",
            "attention",
            self.model.num_layers,
            t,
            ceiling,
            ok,
            f"{phase} attention {self.layout_label}: {how}",
            f"measured for batch {grid.x[0]:g} to {grid.x[-1]:g} and {lo}{grid.y[0]:g} to "
            f"{grid.y[-1]:g} {hi}",
        )

    def _pass(self, attention: OperatorTime, tokens, touching) -> StepTime:
        """A pass over `tokens` rows (`touching` of them pick experts): every operator, in
        step order around its attention kernel."""
        ops = self._weights(tokens, touching)
        return self._step(ops[:1] + [attention] + ops[1:] + self._small(tokens))

    def decode(self, batch, context, queries=1) -> StepTime:
        """One decode step of `batch` sequences with `context` tokens of KV each (arrays
        broadcast; a batch of unequal contexts: pass their mean, which keeps the KV bytes).

        `queries` > 1 is a speculative verify step: GEMMs, MoE and the small kernels run
        at batch x queries rows. The generation-attention tables hold one query per
        sequence; with q queries the kernel still reads each sequence's KV once, so it is
        timed as the one-query measurement scaled by the ratio of the two ceilings (the
        kernel keeps the fraction of its roofline the table shows), never below its own."""
        b = np.asarray(batch, dtype=float)
        ctx = np.asarray(self.model.effective_context(np.asarray(context, float)), float)
        grid, how = self.tables.attention("generation", *self.layout)
        t, ok = grid(b, ctx)
        ceiling = self._ceiling_attention(b, ctx, 1.0)
        rows = b
        if not (np.ndim(queries) == 0 and queries == 1):
            q = np.asarray(queries, dtype=float)
            scaled = self._ceiling_attention(b, ctx, q)
            t, ceiling, rows = t * scaled / ceiling, scaled, b * q
            how += f"; {np.max(q):g} queries per sequence: one-query time x ceiling ratio"
        sizes = ("", "tokens in the cache (fewer at large batch x context)")
        attention = self._attention("generation", (t, ok), ceiling, grid, how, sizes)
        return self._pass(attention, rows, rows)

    def prefill(self, batch, prompt_tokens, cached_tokens=0) -> StepTime:
        """A prefill of `prompt_tokens - cached_tokens` new tokens in each of `batch`
        sequences. The tables hold prompts without a cached prefix; one with a prefix is timed
        as a fresh prompt with the same number of query-key pairs (same attention FLOPs)."""
        b = np.asarray(batch, dtype=float)
        c = np.asarray(cached_tokens, dtype=float)
        n = np.asarray(prompt_tokens, dtype=float) - c
        equal_work = fresh_prompt_of(query_key_pairs(n, c))
        grid, how = self.tables.attention("context", *self.layout)
        t, ok = grid(b, equal_work)
        ceiling = self._ceiling_attention(b, c, n)
        if np.any(c > 0):
            how += "; a cached prefix timed as a fresh prompt of equal query-key pairs"
        sizes = ("prompts of ", "tokens (fewer at large batch x prompt)")
        attention = self._attention("context", (t, ok), ceiling, grid, how, sizes)
        step = self._pass(attention, b * n, b * np.maximum(n, 1))
        done = n <= 0  # a full hit computes nothing
        return StepTime(
            np.where(done, 0.0, step.step_time_s),
            step.overhead_s,
            step.in_range | done,
            step.operators,
            step.source,
        )

    # ------------------------------------------------------------ simulator fast path
    def decode_step_s(self, batch: int, context: float) -> float:
        """One decode step's measured time in seconds for scalar inputs, without numpy
        arrays (a few microseconds once warm). NaN when out of the measured range; `context`
        is the batch's mean context when its sequences differ."""
        fixed = self._fixed.get(batch)
        if fixed is None:
            ops = self._weights(float(batch), float(batch)) + self._small(float(batch))
            fixed = self._fixed[batch] = float(sum(op.measured_s for op in ops))
        ctx = float(self.model.effective_context(context))
        grid, _ = self.tables.attention("generation", *self.layout)
        per_layer = grid.scalar(float(batch), ctx)
        if per_layer != per_layer:  # NaN: out of the measured range
            return per_layer
        floor = max(
            batch * (ctx + 1) * self.kv_tok_layer / self.bandwidth,
            batch * query_key_pairs(1, ctx) * self.attn_flops_layer / self.peak,
        )
        return fixed + self.model.num_layers * max(per_layer, floor)

    def decode_contexts_s(self, contexts) -> float:
        """One decode step of a batch whose sequences hold these contexts (one per sequence):
        timed at their mean, which keeps the step's KV bytes (attention's cost)."""
        return self.decode_step_s(len(contexts), sum(contexts) / len(contexts))


def kernels(model, hardware, weight_dtype="bf16", kv_dtype="bf16", tp: int = 1) -> Kernels:
    """The cached measured-mode interpolators for one configuration (the simulator's entry:
    `kernels(...).decode_step_s(batch, mean_context)`)."""
    model, hardware = get_model(model), get_device(hardware)
    return _kernels(model, hardware, parse_dtype(weight_dtype), parse_dtype(kv_dtype), int(tp))


@lru_cache(maxsize=64)
def _kernels(model: ModelSpec, device: Device, wdt: DType, kdt: DType, tp: int) -> Kernels:
    return Kernels(model, device, wdt, kdt, tp)


# ------------------------------------------------------------------ for kvlab.cost


def _plain(x):
    """A 0-d array or numpy scalar as a Python number, as the ledger returns scalars."""
    return x.item() if isinstance(x, (np.ndarray, np.generic)) and np.ndim(x) == 0 else x


def deployment_kernels(d) -> Kernels:
    """The cached interpolators of a `Deployment` whose speed is `KernelTables()`."""
    return _kernels(d.model, d.hardware, d.weight_dtype, d.kv_dtype, d.tensor_parallel)


def kernel_decode_fields(d, batch, context, scalar: bool, queries=1) -> dict:
    """The `DecodeStep` fields the kernel tables replace (a verify step at `queries` > 1).
    A scalar point outside the tables raises (naming the operators and their measured
    ranges); array points there are NaN."""
    kernels_ = deployment_kernels(d)
    out = dict(efficiency_source=kernels_.source, overhead_s=kernels_.overhead_s)
    if d.tensor_parallel > 1:
        rows = np.asarray(batch, dtype=float) * np.asarray(queries, dtype=float)
        total, latency = kernels_.allreduce_s(rows)
        out.update(allreduce_time_s=_plain(total), allreduce_latency_s=_plain(latency + 0.0 * rows))
    t = math.nan
    if scalar and type(queries) is int and queries == 1:  # numpy-free; NaN outside the tables
        t = kernels_.decode_step_s(batch, context)
    if t != t:  # the full path: a verify step, an array, or to say what is out of range
        step = kernels_.decode(batch, context, queries)
        if scalar and not bool(step.in_range):
            raise KvlabError(
                f"{d.model.name} on {d.hardware.name}, batch {batch}, context {context}: outside "
                f"the measured kernel tables ({'; '.join(step.out_of_range())})"
            )
        t = _plain(np.asarray(step.step_time_s, dtype=float))
        out.update(efficiency_source=step.source, overhead_s=step.overhead_s)
    rows = batch * queries if scalar else np.asarray(batch, float) * np.asarray(queries, float)
    per_sequence = queries / t if scalar else np.asarray(queries, dtype=float) / t
    return out | dict(
        step_time_s=t, tokens_per_s=_plain(rows / t), tokens_per_s_per_sequence=_plain(per_sequence)
    )


def kernel_prefill_time(d, batch, prompt, cached) -> tuple:
    """(time_s, source) of a prefill from the kernel tables; a scalar point outside them
    raises."""
    step = deployment_kernels(d).prefill(batch, prompt, cached)
    scalar = all(np.ndim(v) == 0 for v in (batch, prompt, cached))
    if scalar and not bool(step.in_range):
        raise KvlabError(
            f"{d.model.name} on {d.hardware.name}: a prefill of {prompt - cached} tokens x "
            f"batch {batch} is outside the measured kernel tables "
            f"({'; '.join(step.out_of_range())})"
        )
    return np.asarray(step.step_time_s), step.source

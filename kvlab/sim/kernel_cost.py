"""Step times from published kernel tables: a `SimConfig` whose speed is `KernelTables()`.

Every operator of a simulated GPU pass is timed from the tables `kvlab.cost` uses at that
speed (`kvlab.kernel_tables`: TensorRT-LLM latencies extracted from NVIDIA
aiconfigurator-core), so a pure decode step costs exactly `kvlab.cost.decode_step`'s
`step_time_s` and a lone prefill `kvlab.cost.prefill`'s `time_s`.

An engine iteration that fuses prompt chunks with a decode step (chunked prefill) is one
forward pass, priced the way the tables price its parts:

    GEMMs, MoE experts, norms and the other small kernels   at the pass's total m (every
        prompt-chunk token plus one token per decoding sequence), read once for the pass;
    decode attention     the generation-attention table at (batch, mean context);
    each chunk's attention   the context-attention table for that chunk (a chunk of n new
        tokens after c already in KV is timed as a fresh prompt with the same query-key
        pairs, as kvlab.kernel_tables does for a cached prefix).

Approximations: the attention kernels of the decodes and of each chunk run one after the
other (real engines may launch one varlen kernel); the tables' per-kernel floor, which
is the step's fixed overhead, is paid once per pass through the small kernels at m.

Outside a table's measured range nothing is silently extrapolated: the operator runs at
the efficiency (measured time over its max(bytes/bandwidth, FLOPs/peak) ceiling) that its
table shows at the nearest size it covers (for decode attention: the same batch at the
longest context measured; for a prefill: the longest fresh prompt every table covers),
and the run counts those step prices (`steps_priced_outside_tables` in its summary); an
all-reduce past its largest message keeps that message's bandwidth. The
generation tables stop at batch x context ~ 0.5 M tokens, so long-context batches do
leave them; decode attention there is memory-bound, so holding its efficiency is what a
longer read does.
"""

from __future__ import annotations

import math

import numpy as np

from ..deployment import Deployment
from ..errors import KvlabError
from ..kernel_tables.timing import deployment_kernels, fresh_prompt_of
from ..operators import pass_counts
from ..prompt import served_tokens
from .costs import LedgerCost

#: Contexts per decode plan above which one vectorised table call beats scalar lookups.
VECTOR_MIN = 128
#: Passes of up to this many tokens have their GEMM and small-kernel time tabulated at once.
PASS_TABLE_TOKENS = 1 << 17


class KernelCost(LedgerCost):
    """Step times from measured kernel tables for one (model, device, dtypes).

    The ledger's terms (efficiency 1) remain for the ceilings and for remote KV's network
    time; `remote_link` as in `LedgerCost`."""

    def __init__(self, d: Deployment, remote_link=None, link_efficiency=1.0, max_batch=256):
        if not d.kernel_tables:
            raise KvlabError("KernelCost prices a deployment whose speed is KernelTables()")
        super().__init__(d, remote_link, link_efficiency, max_batch)
        self.kernels = deployment_kernels(d)
        # look every table up now: a device or dtype without data fails before a run starts
        self.kernels.decode(1.0, 1.0)
        self.kernels.prefill(1.0, 1.0)
        self.steps_priced = 0
        self.steps_outside = 0
        self._edge_context: dict[int, tuple[float, float, float]] = {}  # batch -> edge
        self._pass_memo: dict[int, float] = {}  # tokens -> non-attention seconds of a pass
        self._prefill_memo: dict[tuple[int, int], tuple[float, float, bool]] = {}
        self._prompt_ref = None
        self._pass_table = None
        self._attention_ratio = None

    @property
    def source(self) -> str:
        return self.kernels.source

    def counts(self) -> tuple[int, int]:
        """(step prices given, of which beyond the tables' measured ranges) so far."""
        return self.steps_priced, self.steps_outside

    # ---------------------------------------------------------------- decode attention
    def _edge(self, batch: int) -> tuple[float, float, float]:
        """(longest context the generation table covers at `batch`, the measured decode
        step there, its attention's measured seconds over its ceiling there)."""
        edge = self._edge_context.get(batch)
        if edge is None:
            step_s = self.kernels.decode_step_s
            if not math.isfinite(step_s(batch, 1.0)):  # every table starts at context 1
                raise KvlabError(f"decode batch {batch} is outside the measured kernel tables")
            lo = _longest(lambda c: math.isfinite(step_s(batch, float(c))))
            ops = self.kernels.decode(float(batch), float(lo)).operators
            attention = next(op for op in ops if op.name == "attention")
            ratio = float(attention.measured_s) / float(self._attention_ceiling_s(batch, lo))
            edge = self._edge_context[batch] = (float(lo), step_s(batch, float(lo)), ratio)
        return edge

    def _attention_ceiling_s(self, batch: int, context):
        """Decode attention's ceiling (efficiency 1): the ledger's."""
        ctx = self.model.effective_context(np.asarray(context, dtype=float))
        counts = pass_counts(float(batch), 1, ctx)
        return self.units.attention_s(counts.kv_tokens, counts.pairs)

    def _decode(self, batch: int, contexts: np.ndarray) -> tuple[np.ndarray, int]:
        """(measured decode step seconds at each context, how many lie beyond the tables).
        Beyond the generation table, attention keeps the efficiency it has at the longest
        context measured for this batch: the step there plus the extra attention ceiling
        time scaled by that efficiency."""
        if contexts.size >= VECTOR_MIN:
            out = np.asarray(self.kernels.decode(float(batch), contexts).step_time_s, float)
        else:
            out = np.array([self.kernels.decode_step_s(batch, float(c)) for c in contexts])
        bad = ~np.isfinite(out)
        if bad.any():
            ctx_edge, step_edge, ratio = self._edge(batch)
            extra = self._attention_ceiling_s(batch, contexts[bad]) - self._attention_ceiling_s(
                batch, ctx_edge
            )
            out[bad] = step_edge + ratio * extra
        return out, int(bad.sum())

    def decode_times_s(self, batch: int, mean_context) -> np.ndarray:
        """Measured seconds of one decode step of `batch` sequences at each mean context."""
        self._check_batch(batch)
        ctx = np.asarray(mean_context, dtype=float)
        out, outside = self._decode(batch, ctx.ravel())
        self.steps_priced += ctx.size
        self.steps_outside += outside
        return out.reshape(ctx.shape)

    def remote_decode_times_s(self, batch: int, mean_context):
        """(step seconds, of which waiting on the network): the measured step after its KV
        history crossed the link (attention waits for it, as in the ledger's remote mode)."""
        _, network = super().remote_decode_times_s(batch, mean_context)
        return self.decode_times_s(batch, mean_context) + network, network

    # ------------------------------------------------------------ passes and prefills
    def _nonattention_s(self, tokens: int) -> float:
        """GEMMs, experts and small kernels of one pass over `tokens` tokens (memoised)."""
        if self._pass_table is None:  # every pass up to PASS_TABLE_TOKENS: one table call
            self._pass_table = self._pass_seconds(np.arange(1.0, PASS_TABLE_TOKENS + 1.0))
        if 1 <= tokens <= len(self._pass_table):
            return self._pass_table[tokens - 1]
        t = self._pass_memo.get(tokens)
        if t is None:
            t = self._pass_memo[tokens] = self._pass_seconds(np.array([float(tokens)]))[0]
        return t

    def _pass_seconds(self, tokens: np.ndarray) -> list[float]:
        """`_nonattention_s` over many token counts at once: an operator outside its table
        runs at the measured/ceiling ratio it has at the reference prompt (`_reference_prompt`);
        an all-reduce past its table extrapolates itself (bandwidth-bound)."""
        ref = self.kernels.decode(float(self._reference_prompt()), 1.0)
        refs = {op.name: op for op in ref.operators}
        total = np.zeros(tokens.size)
        for op in self.kernels.decode(tokens, 1.0).operators:
            if op.name == "attention":
                continue
            r = refs[op.name]  # small kernels have no ceiling and no range to leave
            if float(r.ceiling_s) > 0:
                beyond = np.asarray(op.ceiling_s, float) * float(r.measured_s) / float(r.ceiling_s)
            else:  # no ceiling of its own (the all-reduce): its table extrapolates itself
                beyond = np.asarray(op.measured_s, float)
            inside = np.broadcast_to(np.asarray(op.in_range, dtype=bool), tokens.shape)
            total = total + np.where(inside, np.asarray(op.measured_s, float), beyond)
        return total.tolist()

    def _reference_prompt(self) -> int:
        """The longest fresh prompt (batch 1) that every table covers whole."""
        if self._prompt_ref is None:
            prefill = self.kernels.prefill
            self._prompt_ref = _longest(lambda n: bool(prefill(1.0, float(n)).in_range))
        return self._prompt_ref

    def _context_attention_s(self, end: int, start: int) -> tuple[float, bool]:
        """(seconds, beyond the table?) of the context attention of tokens start..end (start
        already in KV), as Kernels.prefill times it: the table at a fresh prompt of equal
        query-key pairs, never below its ceiling; beyond the table, the ceiling at the
        efficiency the table shows for the reference prompt."""
        k = self.kernels
        counts = pass_counts(1.0, float(end - start), float(start))
        grid, _ = k.tables.attention("context", *k.layout)
        per_layer = grid.scalar(1.0, float(fresh_prompt_of(counts.pairs)))
        ceiling = float(self.units.attention_s(counts.kv_tokens, counts.pairs))
        if per_layer == per_layer:
            return max(self.model.num_layers * per_layer, ceiling), False
        if self._attention_ratio is None:
            ref = self._reference_prompt()
            at_ref, _ = self._context_attention_s(ref, 0)
            fresh = pass_counts(1.0, float(ref), 0.0)
            self._attention_ratio = at_ref / float(
                self.units.attention_s(fresh.kv_tokens, fresh.pairs)
            )
        return ceiling * self._attention_ratio, True

    def _prefill(self, end: int, start: int) -> tuple[float, float, bool]:
        """(whole prefill seconds, its attention's seconds, beyond the tables?) of tokens
        start..end of a prompt, start of them already in KV (memoised)."""
        key = (end, start)
        hit = self._prefill_memo.get(key)
        if hit is None:
            if end <= start:  # a full hit computes nothing
                return 0.0, 0.0, False
            attention, beyond = self._context_attention_s(end, start)
            total = self._nonattention_s(end - start) + attention
            beyond = beyond or end - start > self._reference_prompt()
            hit = self._prefill_memo[key] = (total, attention, beyond)
        return hit

    def prefill_times_s(self, prompt_tokens, cached_tokens):
        """(measured time, ceiling compute time, ceiling memory time) of a prefill of
        `prompt_tokens` of which `cached_tokens` come from a prefix cache (scalars)."""
        if isinstance(prompt_tokens, np.ndarray) or isinstance(cached_tokens, np.ndarray):
            raise KvlabError("measured step costs take one prefill at a time")
        _, compute, memory = super().prefill_times_s(prompt_tokens, cached_tokens)
        c = served_tokens(int(cached_tokens), int(prompt_tokens))
        total, _, outside = self._prefill(int(prompt_tokens), c)
        self.steps_priced += 1
        self.steps_outside += outside
        return total, compute, memory

    def iteration_time_s(self, batch: int, mean_context: float, chunks) -> float:
        """One forward pass over prompt chunks [(end token, start token), ...] and one decode
        token for each of `batch` sequences (the pricing in the module docstring)."""
        if not chunks:
            return float(self.decode_times_s(batch, float(mean_context))) if batch else 0.0
        tokens, attention_s, outside = batch, 0.0, 0
        for end, start in chunks:
            tokens += end - start
            _, att, beyond = self._prefill(int(end), int(start))
            attention_s += att
            outside |= beyond
        if batch:
            self._check_batch(batch)
            step, beyond = self._decode(batch, np.array([float(mean_context)]))
            attention_s += float(step[0]) - self._nonattention_s(batch)
            outside |= bool(beyond)
        self.steps_priced += 1
        self.steps_outside += int(outside)
        return float(self._nonattention_s(tokens) + attention_s) if tokens else 0.0


def _longest(inside, lo: int = 1, hi: int = 1 << 20) -> int:
    """The largest size in [lo, hi) that is `inside` a table (bisection: `inside(lo)` holds,
    `inside(hi)` does not, and a table covers every size up to its edge)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if inside(mid) else (lo, mid)
    return lo

"""Step times for the simulator: the ledger by default, measured numbers when you have them.

The simulator asks a cost object four questions (duck-typed; see `LedgerCost`):

    decode_times_s(batch, mean_context)         one decode step per mean_context entry
    remote_decode_times_s(batch, mean_context)  the same with all KV read over the network
    prefill_times_s(prompt_tokens, cached)      (time, compute, memory) of a prefill
    iteration_time_s(batch, mean_context, chunks)
                                                one engine iteration: prompt chunks
                                                [(end token, start token), ...] and a decode
                                                step of `batch` sequences (0: none) run as
                                                one forward pass

`make_cost(config)` (kvlab/sim/cost_model.py) picks the object for a run's speed;
another step-time model plugs in there: subclass `LedgerCost` (as `KernelCost` and
`BenchCost` do), answer the four questions, say where the times come from (`source`)
and how many step prices fell outside measured data (`counts()`).

`LedgerCost` has no formula of its own: it evaluates the deployment's operator table
through `kvlab.cost.UnitSeconds`, as `kvlab.cost.decode_step` and `prefill` do (the
tests check them against each other). Remote KV comes from
`kvlab.tiers.tiered_decode_step`, whose memory and compute times are each affine in the
context for a fixed batch, so two contexts per batch size give every step.
"""

from __future__ import annotations

import numpy as np

from ..cost import pass_totals, unit_seconds
from ..deployment import Deployment
from ..errors import KvlabError, check_number
from ..operators import pass_counts
from ..prompt import served_tokens
from ..tiers import TierPath, tiered_decode_step


def pipeline_time_s(a_s, b_s, stages: int):
    """Two activities streamed through `stages` equal pieces (layers): the longer one plus
    one piece of the shorter (the pipeline's fill). Without overlap it would be a + b."""
    if isinstance(a_s, float) and isinstance(b_s, float):
        return max(a_s, b_s) + min(a_s, b_s) / stages
    a, b = np.asarray(a_s, dtype=float), np.asarray(b_s, dtype=float)
    out = np.maximum(a, b) + np.minimum(a, b) / stages
    return out.item() if out.ndim == 0 else out


class LedgerCost:
    """Step times from the ledger for one deployment (`kvlab.deployment.Deployment`): its
    operator table at the ceiling of the device's rates, divided by the efficiency.

    `remote_link` (a tier or placement name) prices decode steps whose KV is read over the
    network every step (`kvlab.tiers.tiered_decode_step`).
    """

    def __init__(self, d: Deployment, remote_link=None, link_efficiency=1.0, max_batch=256):
        if not isinstance(d, Deployment):
            raise KvlabError(f"a step-time model prices a Deployment, got {type(d).__name__}")
        self.deployment = d
        self.model, self.device = d.model, d.hardware
        self.efficiency = float(check_number("efficiency", d.efficiency, maximum=1.0))
        self.remote_link, self.link_efficiency = remote_link, link_efficiency
        self.max_batch = int(max_batch)
        self.num_layers = self.model.num_layers
        self.kv_bytes_per_token = d.kv_bytes_per_token
        self.weight_bytes = d.weight_bytes
        self.units = unit_seconds(d)
        self._remote = None
        self._weights_memo: dict = {}  # tokens -> seconds of the weight groups + all-reduces
        self._ledger_prefill_memo: dict = {}  # (new, cached tokens) -> _ledger_prefill's prices

    @property
    def source(self) -> str:
        """Where the step times come from (a run's `efficiency_source`)."""
        if self.efficiency == 1.0:
            return "ledger: per-operator ceiling (efficiency 1)"
        return f"ledger: per-operator ceiling x efficiency {self.efficiency:g}"

    def counts(self) -> tuple[int, int]:
        """(step prices given, of which outside measured data): the ledger needs no data."""
        return 0, 0

    # ------------------------------------------------- the ledger's groups, at this speed
    def _weights_s(self, tokens: int) -> float:
        """Seconds of a pass's weight groups and all-reduces over `tokens` rows (memoised:
        a run asks for the same few batch sizes again and again)."""
        t = self._weights_memo.get(tokens)
        if t is None:
            u, eff = self.units, self.efficiency
            rows = float(tokens)
            latency, link = u.allreduce_s(rows)
            t = u.weights_s(rows, max(rows, 1.0)) / eff + latency + link / eff
            self._weights_memo[tokens] = t
        return t

    def _attention_s(self, kv_tokens, pairs):
        """One attention kernel at this speed."""
        return self.units.attention_s(kv_tokens, pairs) / self.efficiency

    def _decode_attention_s(self, batch: int, mean_context):
        """The decode attention of `batch` sequences at each mean context (effective)."""
        ctx = self.model.effective_context(mean_context)
        counts = pass_counts(float(batch), 1, ctx)
        return self._attention_s(counts.kv_tokens, counts.pairs)

    def _remote_tables(self):
        if self._remote is None:
            if self.remote_link is None:
                raise KvlabError("this cost model has no remote link: pass remote_link=")
            b = np.arange(1, self.max_batch + 1)[:, None]
            path = TierPath(self.remote_link, self.link_efficiency)
            s = tiered_decode_step(self.deployment, b, np.array([1, 2]), path)
            # no overlap: attention waits for its KV
            mem = np.asarray(s.hbm_time_s) + np.asarray(s.tier_time_s)
            comp, tier = np.asarray(s.compute_time_s), np.asarray(s.tier_time_s)
            self._remote = (
                mem[:, 0],
                mem[:, 1] - mem[:, 0],
                comp[:, 0],
                comp[:, 1] - comp[:, 0],
                tier[:, 0],
                tier[:, 1] - tier[:, 0],
            )
        return self._remote

    def _check_batch(self, batch):
        if not 1 <= batch <= self.max_batch:
            raise KvlabError(
                f"decode batch {batch} outside 1..{self.max_batch} (the cost model's max_batch)"
            )

    def decode_times_s(self, batch: int, mean_context) -> np.ndarray:
        """Seconds of one decode step of `batch` sequences at each mean KV history length."""
        self._check_batch(batch)
        ctx = np.asarray(mean_context, dtype=float)
        return self._weights_s(batch) + self._decode_attention_s(batch, ctx)

    def remote_decode_times_s(self, batch: int, mean_context) -> tuple[np.ndarray, np.ndarray]:
        """(step seconds, of which waiting on the network), all KV history read over the link."""
        self._check_batch(batch)
        mem0, mem_slope, comp0, comp_slope, tier0, tier_slope = self._remote_tables()
        i = batch - 1
        m = np.asarray(mean_context, dtype=float) - 1.0
        step = np.maximum(mem0[i] + mem_slope[i] * m, comp0[i] + comp_slope[i] * m)
        return step, tier0[i] + tier_slope[i] * m

    # ---------------------------------------------------------------------- prefill
    def prefill_times_s(self, prompt_tokens, cached_tokens):
        """(time, compute time, memory time) of prefilling `prompt_tokens` of which
        `cached_tokens` (scalar or array) come from a prefix cache: the ledger's prefill
        at this speed, with the last prompt token always computed."""
        if not isinstance(prompt_tokens, np.ndarray) and not isinstance(cached_tokens, np.ndarray):
            c = float(served_tokens(int(cached_tokens), int(prompt_tokens)))
            return self._ledger_prefill(float(prompt_tokens) - c, c)
        p = np.asarray(prompt_tokens, dtype=float)
        c = np.asarray(served_tokens(np.asarray(cached_tokens, dtype=float), p), dtype=float)
        n, c = np.broadcast_arrays(p - c, c)
        rows = [
            self._ledger_prefill(float(a), float(b))
            for a, b in zip(n.ravel(), c.ravel(), strict=True)
        ]
        return tuple(np.array(col).reshape(n.shape) for col in zip(*rows, strict=True))

    def _ledger_prefill(self, new: float, cached: float) -> tuple:
        """(time, compute, memory) of one prefill (memoised: the router prices each arrival
        on every worker, and a run asks for the same prompts and cached prefixes again)."""
        priced = self._ledger_prefill_memo.get((new, cached))
        if priced is None:
            counts = pass_counts(1.0, new, cached)
            d = self.deployment
            _, _, memory, compute = pass_totals(d, d.table.work(counts))
            time = self._weights_s(int(new)) + self._attention_s(counts.kv_tokens, counts.pairs)
            priced = self._ledger_prefill_memo[(new, cached)] = (time, compute, memory)
        return priced

    def iteration_time_s(self, batch: int, mean_context: float, chunks) -> float:
        """One forward pass over prompt chunks [(end token, start token), ...] and one decode
        token for each of `batch` sequences: every weight group is read once for all the
        pass's tokens; prefill attention and decode attention are kernels of their own."""
        tokens, kv, pairs = 0, 0.0, 0.0
        for end, start in chunks:
            c = pass_counts(1.0, float(end - start), float(start))
            tokens += end - start
            kv += c.kv_tokens
            pairs += c.pairs
        time = self._attention_s(kv, pairs) if chunks else 0.0
        if batch:
            self._check_batch(batch)
            time += float(self._decode_attention_s(batch, float(mean_context)))
            tokens += batch
        return float(time + self._weights_s(tokens)) if tokens else 0.0


class BenchCost(LedgerCost):
    """Decode step times interpolated from a measured table; prefill from the ledger.

    `batches` (B,), `contexts` (C,) and `step_times_s` (B, C): measured seconds of one
    decode step at each batch and (mean) context, e.g. from `kvlab bench decode` on the
    target GPU. Between points the time is interpolated linearly (in context, then in
    batch), beyond them the nearest edge is used. A fused iteration is charged the
    measured decode step plus the ledger's prefill (no shared weight read: conservative).
    """

    def __init__(self, batches, contexts, step_times_s, d: Deployment, **ledger):
        super().__init__(d, **ledger)
        self.batches = np.asarray(batches, dtype=float)
        self.contexts = np.asarray(contexts, dtype=float)
        self.step_table_s = np.asarray(step_times_s, dtype=float)
        if self.step_table_s.shape != (self.batches.size, self.contexts.size):
            raise KvlabError(
                "step_times_s must be (batches, contexts) = "
                f"{(self.batches.size, self.contexts.size)}, "
                f"got {self.step_table_s.shape}"
            )
        if np.any(np.diff(self.batches) <= 0) or np.any(np.diff(self.contexts) <= 0):
            raise KvlabError("measured batches and contexts must be strictly increasing")
        check_number("measured step time (s)", self.step_table_s, maximum=3600)

    @property
    def source(self) -> str:
        return "a measured decode-step table (prefill from the ledger's ceiling)"

    def decode_times_s(self, batch: int, mean_context) -> np.ndarray:
        m = np.asarray(mean_context, dtype=float)
        # shape (B, steps): one row per measured batch
        rows = np.array([np.interp(m, self.contexts, row) for row in self.step_table_s])
        if rows.ndim == 1:
            rows = rows[:, None]
        lo = int(
            np.clip(
                np.searchsorted(self.batches, batch, side="right") - 1, 0, self.batches.size - 1
            )
        )
        hi = min(lo + 1, self.batches.size - 1)
        if hi == lo or batch <= self.batches[lo]:
            out = rows[lo]
        else:
            w = (batch - self.batches[lo]) / (self.batches[hi] - self.batches[lo])
            out = rows[lo] * (1 - min(w, 1.0)) + rows[hi] * min(w, 1.0)
        return out if np.ndim(mean_context) else out.reshape(())

    def iteration_time_s(self, batch: int, mean_context: float, chunks) -> float:
        """The ledger's prefill of every chunk plus the measured decode step (no shared
        weight read: conservative)."""
        time_s = sum(float(self.prefill_times_s(end, start)[0]) for end, start in chunks)
        if batch:
            time_s += float(self.decode_times_s(batch, mean_context))
        return float(time_s)


class HostOverhead:
    """Another cost object's steps plus a fixed host time per engine iteration: the CPU's
    scheduling, sampling and kernel launches between steps, which GPU-side kernel tables
    leave out (vLLM's v0.6 release measured most of a small model's step on the CPU). Every
    priced iteration (a decode step, a fused or prefill-only pass, a prefill worker's
    prompt) lasts `overhead_s` longer; everything else is the wrapped object's."""

    def __init__(self, inner, overhead_s: float):
        check_number("step overhead", overhead_s, minimum=0, allow_equal_min=True, maximum=10)
        self.inner, self.overhead_s = inner, float(overhead_s)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @property
    def source(self) -> str:
        src = getattr(self.inner, "source", type(self.inner).__name__)
        return f"{src}; plus {self.overhead_s * 1e3:g} ms of host time per iteration"

    def decode_times_s(self, batch: int, mean_context):
        return self.inner.decode_times_s(batch, mean_context) + self.overhead_s

    def remote_decode_times_s(self, batch: int, mean_context):
        times, network = self.inner.remote_decode_times_s(batch, mean_context)
        return times + self.overhead_s, network

    def prefill_times_s(self, prompt_tokens, cached_tokens):
        time_s, compute, memory = self.inner.prefill_times_s(prompt_tokens, cached_tokens)
        return time_s + self.overhead_s, compute, memory

    def iteration_time_s(self, batch: int, mean_context, chunks) -> float:
        t = self.inner.iteration_time_s(batch, mean_context, chunks)
        return t + self.overhead_s if chunks or batch else t

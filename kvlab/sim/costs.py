"""Step times for the simulator: the ledger by default, measured numbers when you have them.

The simulator asks a cost object four questions (duck-typed; see `LedgerCost`):

    decode_times_s(batch, mean_context)         one decode step per mean_context entry
    remote_decode_times_s(batch, mean_context)  the same with all KV read over the network
    prefill_times_s(prompt_tokens, cached)      (time, compute, memory) of a prefill
    fused_time_s(batch, mean_context, prompt_tokens, cached)
                                                one engine iteration: a prefill chunk and a
                                                decode step run as one forward pass

`LedgerCost` answers from `kvlab.cost` (and `kvlab.tiers` for remote KV) without a
formula of its own: per batch size it evaluates the ledger at two contexts, and a step at
mean context m is the ledger's memory and compute times interpolated there, of which the
longer counts, as in the ledger. That is exact because the ledger's memory and compute
times are each affine in the context for a fixed batch (the tests check it against
`decode_step` and `tiered_decode_step`). A whole run's steps then cost two numpy
expressions per batch change instead of a ledger call per step.
"""
from __future__ import annotations

import functools

import numpy as np

from .. import cost
from ..errors import KvlabError, check_number
from ..hardware import get_device
from ..models import get_model


def pipeline_time_s(a_s, b_s, stages: int):
    """Two activities streamed through `stages` equal pieces (layers): the longer one plus
    one piece of the shorter (the pipeline's fill). Without overlap it would be a + b."""
    if isinstance(a_s, float) and isinstance(b_s, float):
        return max(a_s, b_s) + min(a_s, b_s) / stages
    a, b = np.asarray(a_s, dtype=float), np.asarray(b_s, dtype=float)
    out = np.maximum(a, b) + np.minimum(a, b) / stages
    return out.item() if out.ndim == 0 else out


class LedgerCost:
    """Step times from the analytic ledger for one (model, device, dtypes, efficiency).

    `remote_link` (a tier or placement name) prices decode steps whose KV is read over the
    network every step (`kvlab.tiers.tiered_decode_step`).
    """

    def __init__(self, model, hardware, weight_dtype="fp16", kv_dtype="fp16", efficiency=1.0,
                 remote_link=None, link_efficiency=1.0, max_batch=256):
        self.model = get_model(model)
        self.device = get_device(hardware)
        self.weight_dtype, self.kv_dtype = weight_dtype, kv_dtype
        self.efficiency = check_number("efficiency", efficiency, maximum=1.0)
        self.remote_link, self.link_efficiency = remote_link, link_efficiency
        self.max_batch = int(max_batch)
        self.num_layers = self.model.num_layers
        self.kv_bytes_per_token = cost.kv_bytes_per_token(self.model, kv_dtype)
        self.weight_bytes = cost.weight_bytes(self.model, weight_dtype)
        self._local = self._remote = None
        self._prefill_memo: dict = {}

    # ---------------------------------------------------------------- decode tables
    def _tables(self):
        """Per batch 1..max_batch: memory and compute time at mean context 1 and their
        slope per token of mean context, and the weight-read time (for fused iterations)."""
        if self._local is None:
            b = np.arange(1, self.max_batch + 1)[:, None]
            s = cost.decode_step(self.model, self.device, b, np.array([1, 2]), self.weight_dtype, self.kv_dtype,
                                 efficiency=self.efficiency)
            mem, comp = np.asarray(s.memory_time_s), np.asarray(s.compute_time_s)
            bandwidth = self.device.memory_bandwidth_bytes_per_s * self.efficiency
            weights = np.broadcast_to(cost.weight_read_bytes(self.model, b[:, 0], self.weight_dtype), b[:, 0].shape)
            weights = weights / bandwidth  # dense models: the same for every batch
            self._local = (mem[:, 0], mem[:, 1] - mem[:, 0], comp[:, 0], comp[:, 1] - comp[:, 0], weights)
        return self._local

    def _remote_tables(self):
        if self._remote is None:
            if self.remote_link is None:
                raise KvlabError("this cost model has no remote link: pass remote_link=")
            from ..tiers import tiered_decode_step

            b = np.arange(1, self.max_batch + 1)[:, None]
            s = tiered_decode_step(self.model, self.device, b, np.array([1, 2]), tier=self.remote_link,
                                   weight_dtype=self.weight_dtype, kv_dtype=self.kv_dtype,
                                   efficiency=self.efficiency, tier_efficiency=self.link_efficiency)
            mem = np.asarray(s.hbm_time_s) + np.asarray(s.tier_time_s)  # no overlap: attention waits for its KV
            comp, tier = np.asarray(s.compute_time_s), np.asarray(s.tier_time_s)
            self._remote = (mem[:, 0], mem[:, 1] - mem[:, 0], comp[:, 0], comp[:, 1] - comp[:, 0],
                            tier[:, 0], tier[:, 1] - tier[:, 0])
        return self._remote

    def _check_batch(self, batch):
        if not 1 <= batch <= self.max_batch:
            raise KvlabError(f"decode batch {batch} outside 1..{self.max_batch} (the cost model's max_batch)")

    def decode_times_s(self, batch: int, mean_context) -> np.ndarray:
        """Seconds of one decode step of `batch` sequences at each mean KV history length."""
        self._check_batch(batch)
        mem0, mem_slope, comp0, comp_slope, _ = self._tables()
        i = batch - 1
        m = np.asarray(mean_context, dtype=float) - 1.0
        return np.maximum(mem0[i] + mem_slope[i] * m, comp0[i] + comp_slope[i] * m)

    def remote_decode_times_s(self, batch: int, mean_context) -> tuple[np.ndarray, np.ndarray]:
        """(step seconds, of which waiting on the network) with all KV history read over the link."""
        self._check_batch(batch)
        mem0, mem_slope, comp0, comp_slope, tier0, tier_slope = self._remote_tables()
        i = batch - 1
        m = np.asarray(mean_context, dtype=float) - 1.0
        step = np.maximum(mem0[i] + mem_slope[i] * m, comp0[i] + comp_slope[i] * m)
        return step, tier0[i] + tier_slope[i] * m

    # ---------------------------------------------------------------------- prefill
    def prefill_times_s(self, prompt_tokens: int, cached_tokens):
        """(time, compute time, memory time) of prefilling `prompt_tokens` of which
        `cached_tokens` (scalar or array) come from a prefix cache."""
        key = (prompt_tokens, cached_tokens) if np.ndim(cached_tokens) == 0 else None
        if key is not None and key in self._prefill_memo:
            return self._prefill_memo[key]
        p = cost.prefill(self.model, self.device, prompt_tokens, cached_tokens, weight_dtype=self.weight_dtype,
                         kv_dtype=self.kv_dtype, efficiency=self.efficiency)
        out = (p.time_s, p.compute_time_s, p.memory_time_s)
        if key is not None:
            if len(self._prefill_memo) > 200_000:
                self._prefill_memo.clear()
            self._prefill_memo[key] = out
        return out

    def fused_time_s(self, batch: int, mean_context: float, prompt_tokens: int, cached_tokens: int) -> float:
        """One iteration that prefills tokens cached_tokens..prompt_tokens of a prompt and
        decodes one token for `batch` sequences: one forward pass, so the weights are read
        once, the KV of both parts and the FLOPs of both add up."""
        time_s, comp_p, mem_p = self.prefill_times_s(prompt_tokens, cached_tokens)
        if batch == 0:
            return float(time_s)
        self._check_batch(batch)
        mem0, mem_slope, comp0, comp_slope, weights = self._tables()
        i, m = batch - 1, mean_context - 1.0
        memory = mem_p + mem0[i] + mem_slope[i] * m - weights[i]
        compute = comp_p + comp0[i] + comp_slope[i] * m
        return float(max(memory, compute))


class MeasuredCost(LedgerCost):
    """Decode step times interpolated from a measured table; prefill from the ledger.

    `batches` (B,), `contexts` (C,) and `step_times_s` (B, C): measured seconds of one
    decode step at each batch and (mean) context, e.g. from `kvlab bench decode` on the
    target GPU. Between points the time is interpolated linearly (in context, then in
    batch), beyond them the nearest edge is used. A fused iteration is charged the
    measured decode step plus the ledger's prefill (no shared weight read: conservative).
    """

    def __init__(self, batches, contexts, step_times_s, model, hardware, **ledger):
        super().__init__(model, hardware, **ledger)
        self.batches = np.asarray(batches, dtype=float)
        self.contexts = np.asarray(contexts, dtype=float)
        self.table = np.asarray(step_times_s, dtype=float)
        if self.table.shape != (self.batches.size, self.contexts.size):
            raise KvlabError(f"step_times_s must be (batches, contexts) = {(self.batches.size, self.contexts.size)}, "
                             f"got {self.table.shape}")
        if np.any(np.diff(self.batches) <= 0) or np.any(np.diff(self.contexts) <= 0):
            raise KvlabError("measured batches and contexts must be strictly increasing")
        check_number("measured step time (s)", self.table, maximum=3600)

    def decode_times_s(self, batch: int, mean_context) -> np.ndarray:
        m = np.asarray(mean_context, dtype=float)
        rows = np.array([np.interp(m, self.contexts, row) for row in self.table])  # (B, steps)
        if rows.ndim == 1:
            rows = rows[:, None]
        lo = int(np.clip(np.searchsorted(self.batches, batch, side="right") - 1, 0, self.batches.size - 1))
        hi = min(lo + 1, self.batches.size - 1)
        if hi == lo or batch <= self.batches[lo]:
            out = rows[lo]
        else:
            w = (batch - self.batches[lo]) / (self.batches[hi] - self.batches[lo])
            out = rows[lo] * (1 - min(w, 1.0)) + rows[hi] * min(w, 1.0)
        return out if np.ndim(mean_context) else out.reshape(())

    def fused_time_s(self, batch: int, mean_context: float, prompt_tokens: int, cached_tokens: int) -> float:
        time_s, _, _ = self.prefill_times_s(prompt_tokens, cached_tokens)
        if batch == 0:
            return float(time_s)
        return float(time_s + float(self.decode_times_s(batch, mean_context)))


@functools.lru_cache(maxsize=16)
def ledger_cost(model, hardware, weight_dtype, kv_dtype, efficiency, remote_link, link_efficiency,
                max_batch) -> LedgerCost:
    """A shared LedgerCost per configuration: sweeps reuse its tables and prefill memo."""
    return LedgerCost(model, hardware, weight_dtype, kv_dtype, efficiency, remote_link, link_efficiency, max_batch)

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

`make_cost(config)` builds the cost object a run uses; it is the one place that reads the
config's cost knobs (model, GPU, dtypes, efficiency), so a step-time model measured on a
GPU (`efficiency="measured"`, from kvlab.cost's measured mode) plugs in there: give it the
four methods above (subclass `LedgerCost` and override the decode tables, as
`MeasuredCost` does) and return it from `make_cost`.

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

    def __init__(
        self,
        model,
        hardware,
        weight_dtype="fp16",
        kv_dtype="fp16",
        efficiency=1.0,
        remote_link=None,
        link_efficiency=1.0,
        max_batch=256,
    ):
        self.model = get_model(model)
        self.device = get_device(hardware)
        self.weight_dtype, self.kv_dtype = weight_dtype, kv_dtype
        self.efficiency = check_number("efficiency", efficiency, maximum=1.0)
        self.remote_link, self.link_efficiency = remote_link, link_efficiency
        self.max_batch = int(max_batch)
        self.num_layers = self.model.num_layers
        self.kv_bytes_per_token = cost.kv_bytes_per_token(self.model, kv_dtype)
        self.weight_bytes = cost.weight_bytes(self.model, weight_dtype)
        self._local = self._remote = self._prefill = None
        self._weights_memo: dict = {}  # tokens -> seconds (MoE: more experts with more tokens)

    # ---------------------------------------------------------------- decode tables
    def _tables(self):
        """Per batch 1..max_batch: memory and compute time at mean context 1 and their
        slope per token of mean context, and the weight-read time (for fused iterations)."""
        if self._local is None:
            b = np.arange(1, self.max_batch + 1)[:, None]
            s = cost.decode_step(
                self.model,
                self.device,
                b,
                np.array([1, 2]),
                self.weight_dtype,
                self.kv_dtype,
                efficiency=self.efficiency,
            )
            mem, comp = np.asarray(s.memory_time_s), np.asarray(s.compute_time_s)
            bandwidth = self.device.memory_bandwidth_bytes_per_s * self.efficiency
            weights = np.broadcast_to(
                cost.weight_read_bytes(self.model, b[:, 0], self.weight_dtype), b[:, 0].shape
            )
            weights = weights / bandwidth  # dense models: the same for every batch
            self._local = (
                mem[:, 0],
                mem[:, 1] - mem[:, 0],
                comp[:, 0],
                comp[:, 1] - comp[:, 0],
                weights,
            )
        return self._local

    def _remote_tables(self):
        if self._remote is None:
            if self.remote_link is None:
                raise KvlabError("this cost model has no remote link: pass remote_link=")
            from ..tiers import tiered_decode_step

            b = np.arange(1, self.max_batch + 1)[:, None]
            s = tiered_decode_step(
                self.model,
                self.device,
                b,
                np.array([1, 2]),
                tier=self.remote_link,
                weight_dtype=self.weight_dtype,
                kv_dtype=self.kv_dtype,
                efficiency=self.efficiency,
                tier_efficiency=self.link_efficiency,
            )
            mem = np.asarray(s.hbm_time_s) + np.asarray(
                s.tier_time_s
            )  # no overlap: attention waits for its KV
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
        mem0, mem_slope, comp0, comp_slope, _ = self._tables()
        i = batch - 1
        m = np.asarray(mean_context, dtype=float) - 1.0
        return np.maximum(mem0[i] + mem_slope[i] * m, comp0[i] + comp_slope[i] * m)

    def remote_decode_times_s(self, batch: int, mean_context) -> tuple[np.ndarray, np.ndarray]:
        """(step seconds, of which waiting on the network), all KV history read over the link."""
        self._check_batch(batch)
        mem0, mem_slope, comp0, comp_slope, tier0, tier_slope = self._remote_tables()
        i = batch - 1
        m = np.asarray(mean_context, dtype=float) - 1.0
        step = np.maximum(mem0[i] + mem_slope[i] * m, comp0[i] + comp_slope[i] * m)
        return step, tier0[i] + tier_slope[i] * m

    # ---------------------------------------------------------------------- prefill
    def _prefill_terms(self):
        """The ledger's prefill, read off it at three points: compute seconds a*n + b*pairs
        (pairs = n*c + n(n+1)/2 query-key pairs of n computed after c cached tokens) and
        KV-memory seconds k per token of KV touched; the weights' seconds come from
        `_weights_time_s`. `cost.prefill` is exactly that shape (the tests check it)."""
        if self._prefill is None:
            p = cost.prefill(
                self.model,
                self.device,
                np.array([1, 2, 2]),
                np.array([0, 0, 1]),
                weight_dtype=self.weight_dtype,
                kv_dtype=self.kv_dtype,
                efficiency=self.efficiency,
            )
            ct, mt = np.asarray(p.compute_time_s), np.asarray(p.memory_time_s)
            b = ct[1] - 2 * ct[0]  # (n=2, c=0): 2a + 3b; (n=1, c=0): a + b
            self._prefill = (
                ct[0] - b,
                b,
                mt[2] - mt[0],
            )  # (n=1, c=1) - (n=1, c=0): one more KV token
        return self._prefill

    def prefill_times_s(self, prompt_tokens, cached_tokens):
        """(time, compute time, memory time) of prefilling `prompt_tokens` of which
        `cached_tokens` (scalar or array) come from a prefix cache."""
        a, b, k = self._prefill_terms()
        if not isinstance(prompt_tokens, np.ndarray) and not isinstance(cached_tokens, np.ndarray):
            n, c = prompt_tokens - cached_tokens, cached_tokens
            if n <= 0:
                return 0.0, 0.0, 0.0
            compute = a * n + b * (n * c + n * (n + 1) / 2)
            memory = self._weights_time_s(n) + k * (c + n)
            return max(compute, memory), compute, memory
        c = np.asarray(cached_tokens, dtype=float)
        n = np.asarray(prompt_tokens, dtype=float) - c
        weights = np.vectorize(self._weights_time_s, otypes=[float])(
            np.maximum(n, 1).astype(np.int64)
        )
        compute = np.where(n > 0, a * n + b * (n * c + n * (n + 1) / 2), 0.0)
        memory = np.where(n > 0, weights + k * (c + n), 0.0)
        return np.maximum(compute, memory), compute, memory

    def _weights_time_s(self, tokens: int) -> float:
        """Seconds to stream the weights one forward pass over `tokens` tokens reads."""
        if tokens not in self._weights_memo:
            bandwidth = self.device.memory_bandwidth_bytes_per_s * self.efficiency
            self._weights_memo[tokens] = (
                float(cost.weight_read_bytes(self.model, max(tokens, 1), self.weight_dtype))
                / bandwidth
            )
        return self._weights_memo[tokens]

    def iteration_time_s(self, batch: int, mean_context: float, chunks) -> float:
        """One forward pass over prompt chunks [(end token, start token), ...] and one decode
        token for each of `batch` sequences: the weights are read once (for all the pass's
        tokens), the KV reads and the FLOPs of every part add up."""
        memory = compute = 0.0
        tokens = 0
        for end, start in chunks:
            _, comp_p, mem_p = self.prefill_times_s(end, start)
            memory += float(mem_p) - self._weights_time_s(end - start)
            compute += float(comp_p)
            tokens += end - start
        if batch:
            self._check_batch(batch)
            mem0, mem_slope, comp0, comp_slope, weights = self._tables()
            i, m = batch - 1, mean_context - 1.0
            memory += mem0[i] + mem_slope[i] * m - weights[i]
            compute += comp0[i] + comp_slope[i] * m
            tokens += batch
        return float(max(memory + self._weights_time_s(tokens), compute)) if tokens else 0.0

    def fused_time_s(
        self, batch: int, mean_context: float, prompt_tokens: int, cached_tokens: int
    ) -> float:
        """One iteration that prefills tokens cached_tokens..prompt_tokens of a prompt and
        decodes one token for `batch` sequences (`iteration_time_s` with one chunk)."""
        return self.iteration_time_s(batch, mean_context, [(prompt_tokens, cached_tokens)])


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
            raise KvlabError(
                "step_times_s must be (batches, contexts) = "
                f"{(self.batches.size, self.contexts.size)}, "
                f"got {self.table.shape}"
            )
        if np.any(np.diff(self.batches) <= 0) or np.any(np.diff(self.contexts) <= 0):
            raise KvlabError("measured batches and contexts must be strictly increasing")
        check_number("measured step time (s)", self.table, maximum=3600)

    def decode_times_s(self, batch: int, mean_context) -> np.ndarray:
        m = np.asarray(mean_context, dtype=float)
        rows = np.array([np.interp(m, self.contexts, row) for row in self.table])  # (B, steps)
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


def make_cost(config) -> LedgerCost:
    """The step-time model of a (resolved) SimConfig; the seam for measured step times."""
    return ledger_cost(
        config.model,
        config.hardware,
        config.weight_dtype,
        config.kv_dtype,
        config.efficiency,
        config.link if config.remote_kv else None,
        config.link_efficiency,
        config.max_batch,
    )


@functools.lru_cache(maxsize=16)
def ledger_cost(
    model, hardware, weight_dtype, kv_dtype, efficiency, remote_link, link_efficiency, max_batch
) -> LedgerCost:
    """A shared LedgerCost per configuration: sweeps reuse its tables and prefill memo."""
    return LedgerCost(
        model, hardware, weight_dtype, kv_dtype, efficiency, remote_link, link_efficiency, max_batch
    )

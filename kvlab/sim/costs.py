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

`make_cost(config)` (kvlab/sim/cost_model.py) builds the cost object a run uses; it is
the one place that reads the config's cost knobs (model, GPU, dtypes, efficiency): a
number gives `LedgerCost` (the ledger's ceiling, scaled by the efficiency),
`efficiency="measured"` gives `KernelCost` (kvlab/sim/kernel_cost.py: every operator timed
from published kernel tables, as kvlab.cost's measured mode does). Another step-time model
plugs in there: give it the four methods above (subclass `LedgerCost`, as `KernelCost` and
`MeasuredCost` do) and return it from `make_cost`. Cost objects also say where their times
come from (`source`) and how many step prices fell outside measured data (`counts()`).

`LedgerCost` answers from `kvlab.cost` (and `kvlab.tiers` for remote KV) without a
formula of its own: per batch size it evaluates the ledger at two contexts, and a step at
mean context m is the ledger's memory and compute times interpolated there, of which the
longer counts, as in the ledger. That is exact because the ledger's memory and compute
times are each affine in the context for a fixed batch (the tests check it against
`decode_step` and `tiered_decode_step`). A whole run's steps then cost two numpy
expressions per batch change instead of a ledger call per step.
"""

from __future__ import annotations

import numpy as np

from .. import cost
from ..dtypes import parse_dtype
from ..errors import KvlabError, check_number
from ..hardware import get_device
from ..models import get_model
from ..prompt import served_tokens


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
        self._remote = self._terms = None
        self._weights_memo: dict = {}  # tokens -> seconds (MoE: more experts with more tokens)

    @property
    def source(self) -> str:
        """Where the step times come from (a run's `efficiency_source`)."""
        if self.efficiency == 1.0:
            return "ledger: per-operator ceiling (efficiency 1)"
        return f"ledger: per-operator ceiling x efficiency {self.efficiency:g}"

    def counts(self) -> tuple[int, int]:
        """(step prices given, of which outside measured data): the ledger needs no data."""
        return 0, 0

    # ------------------------------------------------- the ledger's terms, per operator group
    def _groups(self):
        """Seconds per unit of the ledger's operator groups (kvlab.cost's per-operator
        ceiling): dense weights (bytes once per pass, FLOPs per token), routed experts (bytes
        by tokens, FLOPs per token), attention (bytes per KV token touched, FLOPs per
        query-key pair). A pass costs the sum over groups of max(memory, compute)."""
        if self._terms is None:
            m, wdt = self.model, parse_dtype(self.weight_dtype)
            p = m.params
            bw = self.device.memory_bandwidth_bytes_per_s * self.efficiency
            pk = self.device.peak_flops_per_s(wdt.compute) * self.efficiency
            dense_bytes = p.streamed_dense * wdt.bytes_per_element
            active = p.active_per_token(m.experts_per_token)
            self._terms = dict(
                dense_s=dense_bytes / bw,
                dense_per_token_s=2.0 * p.streamed_dense / pk,
                dense_bytes=dense_bytes,
                bandwidth=bw,
                experts_per_token_s=2.0 * (active - p.streamed_dense) / pk,
                kv_s=self.kv_bytes_per_token / bw,
                pair_s=m.attention_flops_per_cached_token / pk,
            )
        return self._terms

    def _experts_s(self, tokens: int) -> float:
        """Seconds to stream the routed experts `tokens` tokens touch (0 for dense models)."""
        if tokens not in self._weights_memo:
            g = self._groups()
            total = float(cost.weight_read_bytes(self.model, max(tokens, 1), self.weight_dtype))
            self._weights_memo[tokens] = (total - g["dense_bytes"]) / g["bandwidth"]
        return self._weights_memo[tokens]

    def _weights_time_s(self, tokens: int) -> float:
        """Seconds to stream the weights one forward pass over `tokens` tokens reads."""
        return self._groups()["dense_s"] + self._experts_s(tokens)

    def _gemm_s(self, tokens: int) -> float:
        """The weight groups of one pass over `tokens` tokens: max(memory, compute) each."""
        g = self._groups()
        return max(g["dense_s"], g["dense_per_token_s"] * tokens) + max(
            self._experts_s(tokens), g["experts_per_token_s"] * tokens
        )

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
        g = self._groups()
        ctx = np.asarray(
            self.model.effective_context(np.asarray(mean_context, dtype=float)), dtype=float
        )
        attention = np.maximum(batch * (ctx + 1.0) * g["kv_s"], batch * ctx * g["pair_s"])
        return self._gemm_s(batch) + attention

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
        `cached_tokens` (scalar or array) come from a prefix cache: kvlab.cost.prefill's
        per-operator ceiling, with the last prompt token always computed."""
        g = self._groups()
        if not isinstance(prompt_tokens, np.ndarray) and not isinstance(cached_tokens, np.ndarray):
            c = served_tokens(int(cached_tokens), int(prompt_tokens))
            n = prompt_tokens - c
            pairs = n * c + n * (n + 1) / 2
            kv, att = g["kv_s"] * (c + n), g["pair_s"] * pairs
            time = self._gemm_s(n) + max(kv, att)
            compute = (g["dense_per_token_s"] + g["experts_per_token_s"]) * n + att
            return time, compute, self._weights_time_s(n) + kv
        p = np.asarray(prompt_tokens, dtype=float)
        c = np.asarray(served_tokens(np.asarray(cached_tokens, dtype=float), p), dtype=float)
        n, shape = p - c, np.broadcast(p, c).shape
        pairs = n * c + n * (n + 1) / 2
        kv, att = g["kv_s"] * (c + n), g["pair_s"] * pairs
        flat = np.broadcast_to(n, shape).ravel().astype(np.int64)
        gemm = np.array([self._gemm_s(int(t)) for t in flat]).reshape(shape)
        weights = np.array([self._weights_time_s(int(t)) for t in flat]).reshape(shape)
        compute = (g["dense_per_token_s"] + g["experts_per_token_s"]) * n + att
        return gemm + np.maximum(kv, att), compute, weights + kv

    def iteration_time_s(self, batch: int, mean_context: float, chunks) -> float:
        """One forward pass over prompt chunks [(end token, start token), ...] and one decode
        token for each of `batch` sequences: every weight group is read once for all the
        pass's tokens; prefill attention and decode attention are kernels of their own."""
        g = self._groups()
        tokens, kv, att = 0, 0.0, 0.0
        for end, start in chunks:
            n = end - start
            tokens += n
            kv += g["kv_s"] * end
            att += g["pair_s"] * (n * start + n * (n + 1) / 2)
        time = max(kv, att) if chunks else 0.0
        if batch:
            self._check_batch(batch)
            ctx = float(self.model.effective_context(float(mean_context)))
            time += max(batch * (ctx + 1.0) * g["kv_s"], batch * ctx * g["pair_s"])
            tokens += batch
        return float(time + self._gemm_s(tokens)) if tokens else 0.0

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

    @property
    def source(self) -> str:
        return "a measured decode-step table (prefill from the ledger's ceiling)"

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

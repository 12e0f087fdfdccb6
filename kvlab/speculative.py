"""Speculative decoding in the ledger: draft K tokens cheaply, verify them in one pass.

A decode step reads every weight to make one token per sequence. Speculative decoding
(Leviathan et al., 2023, arXiv:2211.17192; Chen et al., 2023, arXiv:2302.01318) drafts K
tokens with something cheap, then runs the target model once over K + 1 positions per
sequence (`cost.verify_step`): the weights are read once for all of them, so while that
pass stays memory-bound it costs about one decode step, and every accepted draft token is
a step saved. With each drafted token accepted independently with probability A (the
papers' i.i.d. assumption), a verification yields (1 - A^(K+1)) / (1 - A) tokens: the
accepted prefix plus the one token the verify pass always adds.

The verify pass runs its GEMMs at batch x (K + 1) rows, so it turns compute-bound K + 1
times sooner than a decode step does: as the batch grows, speculation pays less, and
`breakeven_batch` finds where the speedup falls to 1. Its attention still reads each
sequence's KV once, so where long contexts make the step KV-bound, speculation keeps
paying at large batch (as MagicDec, Chen et al., 2024, arXiv:2408.11049, observed).

Drafts:
- `draft_model=NAME`: a smaller model with the target's vocabulary drafts
  autoregressively: K decode steps of its own ledger, on the same GPUs, dtypes and
  tensor-parallel degree (vLLM's default); its weights and KV count against memory.
- `draft_model=None`: self-drafting heads (EAGLE, Li et al., 2024, arXiv:2401.15077;
  DeepSeek-V3's multi-token prediction, arXiv:2412.19437). Each drafted token costs one
  decoder layer of the target's shape plus a pass over the target's LM head: EAGLE's
  draft head is one decoder layer that reuses the target's LM head, an MTP module one
  transformer block sharing the embedding and output head. In the ledger that is 1/L of
  every per-layer operator of the target's decode step plus the LM head, embedding and
  sampling once; one layer's weights and KV count against memory. The LM head is most of
  that cost on small models (1 GB of Llama 3.1 8B's 16), which is why EAGLE-3 drafts over a
  reduced vocabulary; Medusa's heads draft all K tokens in one pass. For both this is an
  upper bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import cost
from .cost import (
    MAX_BATCH,
    MAX_SPECULATIVE_TOKENS,
    Num,
    Result,
    _plain,
    check_count,
    unit_seconds,
)
from .deployment import Deployment
from .errors import KvlabError, check_number
from .kernel_tables.timing import deployment_kernels
from .models import get_model
from .operators import pass_counts

SELF_DRAFT = (
    "self-drafting head (EAGLE / multi-token prediction style): each drafted token "
    "costs one decoder layer of the target's shape plus a pass over its LM head"
)


def tokens_per_verify_step(acceptance, speculative_tokens):
    """Expected tokens a sequence gains per verification: (1 - A^(K+1)) / (1 - A), with
    each of the K drafted tokens accepted independently with probability A (Leviathan et
    al., 2023). A = 1 gives K + 1, A = 0 gives the one token the verify pass adds itself."""
    a = check_number("acceptance", acceptance, minimum=0.0, allow_equal_min=True, maximum=1.0)
    k = check_count("speculative_tokens", speculative_tokens, 0, MAX_SPECULATIVE_TOKENS)
    if type(a) is float and type(k) is int:
        return float(k + 1) if a == 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)
    a, k = np.asarray(a, dtype=float), np.asarray(k, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        geometric = (1.0 - a ** (k + 1)) / (1.0 - a)
    return np.where(a == 1.0, k + 1, geometric)


@dataclass(frozen=True)
class SpeculativeStep(Result):
    """One speculation round of `batch` sequences: K draft steps, one verify pass."""

    model: str
    hardware: str
    draft_model: str | None  # None: self-drafting heads
    draft: str  # what drafts, and what it costs
    weight_dtype: str
    kv_dtype: str
    batch: Num
    context: Num
    speculative_tokens: Num  # K, drafted per round
    acceptance: Num  # A, per drafted token
    tensor_parallel: int
    efficiency: Num | str
    tokens_per_verify_step: Num  # (1 - A^(K+1)) / (1 - A)
    verify_weight_read_bytes: Num  # per GPU, as every byte figure here
    verify_kv_read_bytes: Num
    verify_kv_write_bytes: Num  # K + 1 new entries per sequence
    verify_step_bytes: Num
    verify_flops: Num
    verify_arithmetic_intensity: Num
    verify_bound: Num
    verify_allreduce_time_s: Num
    verify_step_time_s: Num
    draft_step_time_s: Num  # one drafted token for the whole batch
    draft_time_s: Num  # K of them
    cycle_time_s: Num  # draft + verify: one round
    baseline_step_time_s: Num  # a plain decode step, same settings
    time_per_token_s: Num  # cycle / tokens per verify step: the effective TPOT
    tokens_per_s: Num  # aggregate over the batch
    tokens_per_s_per_sequence: Num
    speculative_speedup: Num  # tokens/s over the plain decode step's
    memory_needed_bytes: Num  # target + draft weights and KV, K + 1 extra entries
    capacity_bytes: Num
    fits: Num
    max_batch: Num  # largest batch that fits with the draft at this context
    efficiency_source: str
    notes: tuple = ()


def speculative_step(
    d: Deployment, batch=1, context=4096, speculative_tokens=4, acceptance=0.7, draft_model=None
) -> SpeculativeStep:
    """Tokens/s of speculative decoding against plain decode on deployment `d` (arrays
    broadcast; under kernel tables every pass is timed from them). See the module
    docstring for the draft's cost."""
    m = d.model
    k = check_count("speculative_tokens", speculative_tokens, 1, MAX_SPECULATIVE_TOKENS)
    tau = tokens_per_verify_step(acceptance, k)
    base = cost.decode_step(d, batch, context)
    verify = cost.verify_step(d, batch, context, k)
    if draft_model is None:
        step_s, w_bytes, kv_tok, what = _self_draft(d, base)
    else:
        step_s, w_bytes, kv_tok, what = _draft_model(d, draft_model, batch, context)
    draft_s = k * np.asarray(step_s, dtype=float)
    cycle = verify.step_time_s + draft_s
    b = np.asarray(base.batch, dtype=float)
    needed, max_batch = _memory(m, base, k, w_bytes, kv_tok)
    notes = ((VERIFY_TABLES_NOTE,) if d.kernel_tables else ()) + tuple(base.notes)
    return SpeculativeStep._build(
        model=m.name,
        hardware=base.hardware,
        draft_model=None if draft_model is None else get_model(draft_model).name,
        draft=what,
        weight_dtype=base.weight_dtype,
        kv_dtype=base.kv_dtype,
        batch=base.batch,
        context=base.context,
        speculative_tokens=k,
        acceptance=acceptance if np.ndim(acceptance) == 0 else np.asarray(acceptance, float),
        tensor_parallel=base.tensor_parallel,
        efficiency=base.efficiency,
        tokens_per_verify_step=tau,
        **{f"verify_{name}": getattr(verify, name) for name in VERIFY_FIELDS},
        draft_step_time_s=_plain(step_s),
        draft_time_s=_plain(draft_s),
        cycle_time_s=_plain(cycle),
        baseline_step_time_s=base.step_time_s,
        time_per_token_s=_plain(cycle / tau),
        tokens_per_s=_plain(b * tau / cycle),
        tokens_per_s_per_sequence=_plain(tau / cycle),
        speculative_speedup=_plain(tau * np.asarray(base.step_time_s) / cycle),
        memory_needed_bytes=_plain(needed),
        capacity_bytes=base.capacity_bytes,
        fits=_plain(np.asarray(needed <= base.capacity_bytes)),
        max_batch=max_batch,
        efficiency_source=verify.efficiency_source,
        notes=notes,
    )


def _memory(m, base, k, w_bytes, kv_tok) -> tuple:
    """(bytes needed, largest batch that fits): the plain step's memory plus K + 1 extra KV
    entries per sequence and the draft's weights and KV."""
    b = np.asarray(base.batch, dtype=float)
    attended = np.asarray(m.effective_context(np.asarray(base.context, dtype=float)))
    per_seq = (np.maximum(attended, 1.0) + k + 1) * base.kv_bytes_per_token + np.maximum(
        attended, 1.0
    ) * kv_tok
    needed = (
        base.memory_needed_bytes
        + b * (k + 1) * base.kv_bytes_per_token
        + w_bytes
        + b * attended * kv_tok
    )
    room = np.maximum(base.capacity_bytes - base.weight_bytes - w_bytes, 0.0)
    return needed, _plain(np.floor(room / per_seq).astype(np.int64))


#: The verify pass's ledger fields a SpeculativeStep carries, as verify_<field>.
VERIFY_FIELDS = (
    "weight_read_bytes",
    "kv_read_bytes",
    "kv_write_bytes",
    "step_bytes",
    "flops",
    "arithmetic_intensity",
    "bound",
    "allreduce_time_s",
    "step_time_s",
)
#: What a reader must know about a verify pass timed from kernel tables.
VERIFY_TABLES_NOTE = (
    "verify attention: the generation-attention tables hold one query per sequence; "
    "with K + 1 queries the kernel still reads the KV once, so it is timed as the "
    "one-query measurement scaled by the ratio of the two ceilings"
)


def _self_draft(d: Deployment, base) -> tuple:
    """(time of one drafted token, weight bytes, KV bytes per token, description) of a
    self-drafting head: one decoder layer of the target's shape plus its LM head (the
    deployment's operator table through one layer's share)."""
    m, tp = d.model, d.tensor_parallel
    if d.kernel_tables:
        ops = deployment_kernels(d).decode(base.batch, base.context).operators
        # an extra decoder layer runs 1/L of each per-layer kernel, all of a once-per-step one
        step_s = sum((1.0 if op.calls == 1 else 1.0 / m.num_layers) * op.measured_s for op in ops)
    else:
        b = np.asarray(base.batch, dtype=float)
        attended = np.asarray(m.effective_context(np.asarray(base.context, dtype=float)), float)
        counts = pass_counts(b, 1, attended)
        units = unit_seconds(d, d.table.layers(1.0 / m.num_layers))
        latency, link = units.allreduce_s(counts.tokens)
        step_s = units.pass_s(counts) / d.efficiency + latency + link / d.efficiency
    p = m.params
    head = (p.embedding + (0.0 if m.tie_word_embeddings else m.vocab_size * m.hidden_size)) / tp
    wbpe = d.weight_dtype.bytes_per_element
    layer_bytes = max(base.weight_bytes - head * wbpe, 0.0) / m.num_layers
    return _plain(step_s), layer_bytes, base.kv_bytes_per_token / m.num_layers, SELF_DRAFT


def _draft_model(d: Deployment, draft_model, batch, context) -> tuple:
    """(time of one drafted token, weight bytes, KV bytes per token, description) of a
    separate draft model: one decode step of its own ledger per drafted token."""
    m, drafter = d.model, get_model(draft_model)
    if drafter.vocab_size != m.vocab_size:
        raise KvlabError(
            f"draft model {drafter.name} has a vocabulary of {drafter.vocab_size:,} tokens, "
            f"{m.name} one of {m.vocab_size:,}: a draft must share the target's "
            "tokenizer"
        )
    step = cost.decode_step(d.replace(model=drafter), batch, context)
    what = (
        f"draft model {drafter.name}: K decode steps of its own ledger on the same GPUs "
        f"({step.weight_dtype} weights, {step.kv_dtype} KV, tensor parallel "
        f"{step.tensor_parallel})"
    )
    return step.step_time_s, step.weight_bytes, step.kv_bytes_per_token, what


def breakeven_batch(
    d: Deployment,
    context=4096,
    speculative_tokens=4,
    acceptance=0.7,
    draft_model=None,
    max_batch=MAX_BATCH,
) -> int | None:
    """The smallest batch at which speculation stops paying (speedup <= 1), or None when it
    pays at every batch up to `max_batch` (kernel tables: up to the tables' edge).

    The speedup is read on a doubling grid of batches, then bisected between the last
    batch that pays and the first that does not. Scalar context, K and A only."""
    if any(np.ndim(v) for v in (context, speculative_tokens, acceptance)):
        raise KvlabError("breakeven_batch takes one context, draft length and acceptance")
    top = check_count("max_batch", max_batch, 1, MAX_BATCH)
    grid = 2 ** np.arange(int(math.log2(top)) + 1)

    def speedup(batches):
        s = speculative_step(d, batches, context, speculative_tokens, acceptance, draft_model)
        return np.atleast_1d(np.asarray(s.speculative_speedup, dtype=float))

    s = speedup(grid)
    known = np.flatnonzero(~np.isfinite(s))
    edge = known[0] if known.size else s.size  # beyond the measured tables
    below = np.flatnonzero(s[:edge] <= 1.0)
    if not below.size:
        return None
    i = int(below[0])
    if i == 0:
        return 1
    lo, hi = int(grid[i - 1]), int(grid[i])  # pays at lo, not at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        value = speedup(np.array([mid]))[0]
        if value <= 1.0 or not np.isfinite(value):
            hi = mid
        else:
            lo = mid
    return hi

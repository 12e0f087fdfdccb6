"""This machine's decode step in three parts, each timed alone: two kernels and the rest.

The ledger prices a decode step at the measured copy bandwidth: the ceiling. A CPU's kernels
do not all reach it (on a 2-core Xeon, batch-8 weight tiles and long-context attention read at
60-80% of it), and then the ceiling's error says how far the kernels fall short, not whether
the ledger's bytes explain the step. So, as the GPU chapters price steps from published kernel
tables, `kvlab bench decode` times the decoder's own parts here, alone, at shapes *other* than
the sweep's: the weights (every matrix product of a pass) at batches 1, 4 and 16, the attention
(every layer) at 2K and 8K positions, and everything else a step does (norms, RoPE, the KV
write, activations, residuals, the per-operation dispatch: the step with both kernels replaced
by outputs made ready in advance) at those batches. The last is seconds, not bytes: on a CPU
it is dispatch and small operations, ~10% of a batch-1 step, that no byte count prices. Each
point's second prediction prices the ledger's weight bytes and KV bytes at the shares
interpolated for its batch and context (in log2, clamped at the table's ends) times the copy
bandwidth measured around that point, plus the rest's seconds at its batch. Its error is what
the parts alone do not explain: the parts running one after another, sharing caches.
"""

from __future__ import annotations

import numpy as np

from ..decoder import ledger

K = 1024
#: The table's shapes: none of them is a sweep's default batch (1 and 8 are timed steps; 1
#: is also here, as the weights' rate has no other anchor below 4) or context (1K to 32K
#: in powers of two are the sweep's; 2K and 8K are in it only as interpolation anchors).
SHAPES = {
    "cpu": {"batches": (1, 4, 16), "contexts": (2 * K, 8 * K)},
    "cpu-quick": {"batches": (1, 4), "contexts": (512,)},
    "cuda": {"batches": (1, 4, 16, 64), "contexts": (2 * K, 8 * K)},
    "cuda-quick": {"batches": (1, 4, 16), "contexts": (2 * K,)},
}


def _share(seconds: float, moved_bytes: float, bandwidth_bytes_per_s: float) -> float:
    return moved_bytes / seconds / bandwidth_bytes_per_s


def weight_pass(model, batch: int):
    """Every matrix product of one decode pass at `batch` rows, as the step runs them."""
    import torch  # noqa: PLC0415 - torch loads only when measuring

    g = torch.Generator(device=model.device).manual_seed(batch)
    xs = [
        (
            m,
            torch.randn(batch, m.in_features, generator=g, device=model.device).to(
                model.compute_dtype
            ),
        )
        for m in model.linears()
    ]

    def run():
        for m, x in xs:
            m(x)

    return run


def attention_pass(model, cache, batch: int, context: int):
    """Every layer's decode attention over `context` positions, through `Decoder.attend`."""
    import torch  # noqa: PLC0415 - torch loads only when measuring

    c = model.config
    plan = model.plan(cache, [context - 1] * batch, 1)
    g = torch.Generator(device=model.device).manual_seed(context)
    q = torch.randn(batch, c.num_heads, 1, c.head_dim, generator=g, device=model.device)
    q = (q / c.head_dim**0.5).to(model.compute_dtype)

    def run():
        for layer in range(c.num_layers):
            model.attend(q, cache, layer, plan)

    return run


def rest_pass(model, cache, batch: int, context: int):
    """A decode step at `batch` rows and `context` positions whose matrix products and
    attention return outputs made ready in advance: every other operation of the step runs
    as in the step (the KV write included), so its time is the step's rest."""
    import torch  # noqa: PLC0415 - torch loads only when measuring

    c, dev, dtype = model.config, model.device, model.compute_dtype
    plan = model.plan(cache, [context - 1] * batch, 1)
    tokens = torch.zeros(batch, 1, dtype=torch.long, device=dev)
    outputs = {
        m: torch.zeros(batch, 1, m.out_features, dtype=dtype, device=dev) for m in model.linears()
    }
    attended = torch.zeros(batch, c.num_heads, 1, c.head_dim, dtype=dtype, device=dev)

    def run():
        for m, out in outputs.items():  # instance attributes shadow the methods for one step
            m.forward = lambda x, out=out: out
        model.attend = lambda *args: attended
        try:
            return model.forward_plan(tokens, cache, plan)
        finally:
            for m in outputs:
                del m.forward
            del model.attend

    return run


def measure(model, kv_dtypes, spec_device, weight_dtype: str, kind: str, timed):
    """The table: each kernel's share of the copy bandwidth at the table's shapes, and the
    step's rest in seconds.

    {"batches", "contexts", "weights": [share per batch], "attention": {kv dtype: [[share per
    context] per batch]}, "rest_s": {kv dtype: [seconds per batch]}, "note"}; the shares are
    the ledger's bytes (`predict_decode`) over the kernel's time over the copy bandwidth
    measured around that timing. `timed(fn)` is the sweep's own measurement of a pass, (median
    seconds, copy bandwidth around it): bracketed and re-measured when disturbed as its points
    are, and on CUDA captured in a graph as its steps are, so that the table times kernels, not
    Python's launches."""
    shapes = SHAPES[kind]
    batches, contexts = shapes["batches"], shapes["contexts"]
    cfg = model.config

    def bytes_of(batch, context, kv_dtype):
        return ledger.predict_decode(cfg, spec_device, batch, context, weight_dtype, kv_dtype)

    weights = []
    for b in batches:
        t, bw = timed(weight_pass(model, b))
        weights.append(_share(t, bytes_of(b, 0, "bf16")["weight_read_bytes"], bw))
    attention, rest_by_kv = {}, {}
    for kv in kv_dtypes:
        rows, rests = [], []
        for b in batches:
            cache = model.new_cache(b, max(contexts), kv)
            cache.fill_random_([max(contexts)] * b)
            row = []
            for ctx in contexts:
                t, bw = timed(attention_pass(model, cache, b, ctx))
                row.append(_share(t, bytes_of(b, ctx, kv)["kv_read_bytes"], bw))
            rows.append(row)
            rests.append(timed(rest_pass(model, cache, b, contexts[0]))[0])
            del cache
        attention[kv], rest_by_kv[kv] = rows, rests
    return {
        "batches": list(batches),
        "contexts": list(contexts),
        "weights": weights,
        "attention": attention,
        "rest_s": rest_by_kv,
        "note": "each part alone: a kernel's share is the ledger's bytes / its time / the copy "
        "bandwidth measured around it; the rest is a step with both kernels' outputs made ready "
        "in advance, in seconds (kvlab.bench.kernel_table)",
    }


def _log2_interp(x: float, xs, ys) -> float:
    """ys at x, linear in log2(x) between the table's points, clamped at its ends."""
    return float(np.interp(np.log2(x), np.log2(np.asarray(xs, dtype=float)), ys))


def rest_s(table: dict, batch: int, kv_dtype: str) -> float:
    """The step's rest (everything but the two kernels) at `batch`, in seconds."""
    return _log2_interp(batch, table["batches"], table["rest_s"][kv_dtype])


def shares(table: dict, batch: int, context: int, kv_dtype: str) -> tuple[float, float]:
    """(weights' share, attention's share) of the copy bandwidth at (batch, context)."""
    w = _log2_interp(batch, table["batches"], table["weights"])
    per_batch = [
        _log2_interp(context, table["contexts"], row) for row in table["attention"][kv_dtype]
    ]
    return w, _log2_interp(batch, table["batches"], per_batch)


def predict_step_s(table: dict, pred: dict, point: dict) -> float:
    """The ledger's step priced at the parts' own speeds: weight bytes and KV bytes at the
    shares the table gives for the point's batch and context, times the copy bandwidth
    measured around the point, plus the rest's seconds at its batch (which hold the new
    token's KV write and the activations, so the ledger's bytes for those are not added);
    host placement adds the KV fetch as `ledger.predict_decode` does."""
    bw = point["bandwidth_bytes_per_s"]
    batch, kv_dtype = point["batch"], point["kv_dtype"]
    w_share, kv_share = shares(table, batch, point["context"], kv_dtype)
    weights, kv = pred["weight_read_bytes"], pred["kv_read_bytes"]
    core = (weights / w_share + kv / kv_share) / bw + rest_s(table, batch, kv_dtype)
    if point["placement"] != "host":
        return core
    return float(ledger.with_fetch(core, pred["fetch_s"], point["prefetch"]))


def describe(table: dict) -> str:
    """One line: each kernel's share of the copy bandwidth at the table's shapes, and the
    rest's milliseconds."""

    def pct(values) -> str:
        return "/".join(f"{v:.0%}" for v in values)

    batches = "/".join(str(b) for b in table["batches"])
    parts = [f"weights {pct(table['weights'])} of copy at batch {batches}"]
    for kv, rows in table["attention"].items():
        at = ", ".join(
            f"{ctx // K}K: {pct(row[i] for row in rows)}"
            if ctx >= K
            else f"{ctx}: {pct(row[i] for row in rows)}"
            for i, ctx in enumerate(table["contexts"])
        )
        parts.append(f"{kv} attention {at}")
    for kv, seconds in table["rest_s"].items():
        ms = "/".join(f"{s * 1e3:.1f}" for s in seconds)
        parts.append(f"rest with {kv} KV {ms} ms")
    return "; ".join(parts)

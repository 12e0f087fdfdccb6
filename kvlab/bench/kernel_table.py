"""This machine's decode kernels as a table: the share of the copy bandwidth each one reaches.

The ledger prices a decode step at the measured copy bandwidth: the ceiling. A CPU's kernels
do not all reach it (on a 2-core Xeon, batch-8 weight tiles and long-context attention read at
60-80% of it), and then the ceiling's error says how far the kernels fall short, not whether
the ledger's bytes explain the step. So, as the GPU chapters price steps from published kernel
tables, `kvlab bench decode` times the decoder's own two kernels here, alone, at shapes *other*
than the sweep's: the weights (every matrix product of a pass) at batches 1, 4 and 16, and the
attention (every layer) at 2K and 8K positions. Each point's second prediction prices the
ledger's weight bytes and KV bytes at the shares interpolated for its batch and context (in
log2, clamped at the table's ends), times the copy bandwidth measured around that point.
Its error is what the kernels' own rates do not explain: Python, norms, the KV write, and the
kernels running one after another instead of alone.
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


def measure(model, kv_dtypes, spec_device, weight_dtype: str, kind: str, timed):
    """The table: each kernel's share of the copy bandwidth at the table's shapes.

    {"batches", "contexts", "weights": [share per batch], "attention": {kv dtype: [[share per
    context] per batch]}, "note"}; the shares are the ledger's bytes (`predict_decode`) over
    the kernel's time over the copy bandwidth measured around that timing. `timed(fn)` is the
    sweep's own measurement of a pass, (median seconds, copy bandwidth around it): bracketed and
    re-measured when disturbed as its points are, and on CUDA captured in a graph as its steps
    are, so that the table times kernels, not Python's launches."""
    shapes = SHAPES[kind]
    batches, contexts = shapes["batches"], shapes["contexts"]
    cfg = model.config

    def bytes_of(batch, context, kv_dtype):
        return ledger.predict_decode(cfg, spec_device, batch, context, weight_dtype, kv_dtype)

    weights = []
    for b in batches:
        t, bw = timed(weight_pass(model, b))
        weights.append(_share(t, bytes_of(b, 0, "bf16")["weight_read_bytes"], bw))
    attention = {}
    for kv in kv_dtypes:
        rows = []
        for b in batches:
            cache = model.new_cache(b, max(contexts), kv)
            cache.fill_random_([max(contexts)] * b)
            row = []
            for ctx in contexts:
                t, bw = timed(attention_pass(model, cache, b, ctx))
                row.append(_share(t, bytes_of(b, ctx, kv)["kv_read_bytes"], bw))
            rows.append(row)
            del cache
        attention[kv] = rows
    return {
        "batches": list(batches),
        "contexts": list(contexts),
        "weights": weights,
        "attention": attention,
        "note": "each kernel alone: the ledger's bytes / its time / the copy bandwidth measured "
        "around it (kvlab.bench.kernel_table)",
    }


def _log2_interp(x: float, xs, ys) -> float:
    """ys at x, linear in log2(x) between the table's points, clamped at its ends."""
    return float(np.interp(np.log2(x), np.log2(np.asarray(xs, dtype=float)), ys))


def shares(table: dict, batch: int, context: int, kv_dtype: str) -> tuple[float, float]:
    """(weights' share, attention's share) of the copy bandwidth at (batch, context)."""
    w = _log2_interp(batch, table["batches"], table["weights"])
    per_batch = [
        _log2_interp(context, table["contexts"], row) for row in table["attention"][kv_dtype]
    ]
    return w, _log2_interp(batch, table["batches"], per_batch)


def predict_step_s(table: dict, pred: dict, point: dict) -> float:
    """The ledger's step priced at the kernels' shares: weight bytes and KV bytes at the
    shares the table gives for the point's batch and context, the rest (the new token's KV
    write, activations) at the copy bandwidth, all times the bandwidth measured around the
    point; host placement adds the KV fetch as `ledger.predict_decode` does."""
    bw = point["bandwidth_bytes_per_s"]
    w_share, kv_share = shares(table, point["batch"], point["context"], point["kv_dtype"])
    weights, kv = pred["weight_read_bytes"], pred["kv_read_bytes"]
    rest = pred["step_bytes"] - weights - kv
    core = (weights / w_share + kv / kv_share + rest) / bw
    if point["placement"] != "host":
        return core
    return float(ledger.with_fetch(core, pred["fetch_s"], point["prefetch"]))


def describe(table: dict) -> str:
    """One line: each kernel's share of the copy bandwidth at the table's shapes."""

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
    return "; ".join(parts)

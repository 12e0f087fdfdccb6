"""One decode step's operators as table rows, for `kvlab budget`'s per-operator view.

Kept apart from `kvlab.operators` (what a step consists of) and `kvlab.cost` (its totals)
because it needs both and the measured tables.
"""

from __future__ import annotations

import numpy as np

from .cost import decode_step, verify_step
from .dtypes import parse_dtype
from .hardware import get_device
from .models import get_model
from .operators import ceiling_s, decode_operators
from .parallel import allreduce_link


def operator_table(
    model,
    hardware,
    batch=1,
    context=4096,
    weight_dtype="fp16",
    kv_dtype="fp16",
    efficiency=1.0,
    bandwidth_bytes_per_s=None,
    tensor_parallel=1,
    speculative_tokens=0,
) -> list[dict]:
    """One decode step's operators as rows: calls, bytes, FLOPs, ceiling time (at the
    bandwidth in use, efficiency 1) and, with `efficiency="measured"`, the measured time,
    the table it came from and whether the ceiling floored it. Per GPU at
    `tensor_parallel` N; `speculative_tokens` K > 0 gives the verify pass over K + 1
    positions per sequence instead. Scalar inputs only."""
    k = int(speculative_tokens)
    args = (model, hardware, batch, context) + ((k,) if k else ())
    step = (verify_step if k else decode_step)(
        *args,
        weight_dtype=weight_dtype,
        kv_dtype=kv_dtype,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        efficiency=efficiency,
        tensor_parallel=tensor_parallel,
    )
    m, dev = get_model(model), get_device(hardware)
    wdt, kdt = parse_dtype(weight_dtype), parse_dtype(kv_dtype)
    tp = step.tensor_parallel
    peak = dev.peak_flops_per_s(wdt.compute)
    link = allreduce_link(dev, tp) if tp > 1 else None
    link_args = (link.bandwidth_bytes_per_s, link.latency_s) if link else ()
    rows = [
        dict(
            name=op.name,
            kind=op.kind,
            calls=op.calls,
            bytes=float(op.bytes),
            flops=float(op.flops),
            ceiling_s=float(ceiling_s([op], step.bandwidth_bytes_per_s, peak, *link_args)),
        )
        for op in decode_operators(m, step.batch, step.context, wdt, kdt, tp, k + 1)
    ]
    if step.efficiency == "measured":
        from .measured import kernels

        timed = kernels(m, dev, wdt, kdt, tp).decode(batch, context, k + 1).operators
        timed = {op.name: op for op in timed}
        for row in rows:
            op = timed[row["name"]]
            row.update(
                measured_s=float(op.measured_s), how=op.how, at_ceiling=bool(np.all(op.at_ceiling))
            )
    return rows

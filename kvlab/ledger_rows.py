"""One decode step's operators as table rows, for `kvlab budget`'s per-operator view.

Kept apart from `kvlab.operators` (the table) and `kvlab.cost` (its totals) because it
needs both and the kernel tables.
"""

from __future__ import annotations

import numpy as np

from .cost import check_batch_context, decode_step, unit_seconds, verify_step
from .deployment import Deployment
from .kernel_tables.timing import deployment_kernels
from .operators import operator_work, pass_counts


def operator_rows(d: Deployment, batch=1, context=4096, speculative_tokens=0) -> list[dict]:
    """One decode step's operators as rows: calls, bytes, FLOPs, ceiling time (at the
    bandwidth in use, efficiency 1) and, under kernel tables, the measured time, the
    table it came from and whether the ceiling floored it. Per GPU under tensor
    parallelism; `speculative_tokens` K > 0 gives the verify pass over K + 1 positions per
    sequence instead. Scalar inputs only."""
    k = int(speculative_tokens)
    step = verify_step(d, batch, context, k) if k else decode_step(d, batch, context)
    batch, context = check_batch_context(batch, context)
    attended = float(d.model.effective_context(context))
    counts = pass_counts(float(batch), k + 1, attended)
    bw, peak = step.bandwidth_bytes_per_s, d.peak_flops_per_s
    rows = []
    for op in d.table.operators:
        nbytes, flops = operator_work(op, d.table, counts)
        if op.kind == "allreduce":  # the pass's only all-reduce operator
            ceiling = sum(unit_seconds(d).allreduce_s(counts.tokens))
        else:
            ceiling = max(nbytes / bw, flops / peak)
        rows.append(
            dict(
                name=op.name,
                kind=op.kind,
                calls=op.calls,
                bytes=float(nbytes) if op.kind != "allreduce" else 0.0,
                flops=float(flops),
                ceiling_s=float(ceiling),
            )
        )
    if d.kernel_tables:
        timed = deployment_kernels(d).decode(batch, context, k + 1).operators
        timed = {op.name: op for op in timed}
        for row in rows:
            op = timed[row["name"]]
            row.update(
                measured_s=float(op.measured_s), how=op.how, at_ceiling=bool(np.all(op.at_ceiling))
            )
    return rows

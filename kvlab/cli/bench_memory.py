"""`kvlab bench memory`: copy/read/write bandwidth and matmul rate of a device."""

from __future__ import annotations

from ..bench.memory import run_memory
from . import bench_common as common


def register(sub) -> None:
    p = sub.add_parser(
        "memory",
        help="device copy bandwidth (STREAM-like) and matmul FLOP/s",
        description="Copy, read and write bandwidth over several array sizes "
        "(median of repeats), and the matmul rate: the figures the ledger is fed.",
    )
    common.add_common(p, budget_s=120)
    p.set_defaults(func=run)


def run(args) -> int:
    if args.plan is not None:  # "" is a (bad) device name, not "no plan"
        return common.show_plan(args, ("memory",))
    device = common.setup(args)
    r = run_memory(device, quick=args.quick, repeats=common.repeats(args), budget_s=args.budget)
    rows = [
        [
            p["kernel"],
            f"{p['size_bytes'] / 2**20:.0f}",
            f"{p['bandwidth_bytes_per_s'] / 1e9:.1f}",
            f"{p['spread']:.0%}",
        ]
        for p in r["points"]
    ]
    return common.finish(args, "memory", r, device, rows, ["kernel", "MiB", "GB/s", "spread"])

"""`kvlab bench transfer`: host <-> device copy bandwidth, pinned and pageable."""

from __future__ import annotations

from ..bench.host_copy import run_transfer
from . import bench_common as common


def register(sub) -> None:
    p = sub.add_parser(
        "transfer",
        help="host<->device copy bandwidth, pinned and pageable (CUDA)",
        description="Host -> device and device -> host copies of several sizes from "
        "pinned and pageable memory (on a CPU-only machine: host -> host copies).",
    )
    common.add_common(p, budget_s=120)
    p.set_defaults(func=run)


def run(args) -> int:
    if args.plan is not None:  # "" is a (bad) device name, not "no plan"
        return common.show_plan(args, ("transfer",))
    device = common.setup(args)
    r = run_transfer(device, quick=args.quick, repeats=common.repeats(args), budget_s=args.budget)
    rows = [
        [
            p["direction"],
            p["memory"],
            f"{p['size_bytes'] / 2**20:.0f}",
            f"{p['bandwidth_bytes_per_s'] / 1e9:.2f}",
            f"{p['spread']:.0%}",
        ]
        for p in r["points"]
    ]
    header = ["direction", "memory", "MiB", "GB/s", "spread"]
    return common.finish(args, "transfer", r, device, rows, header)

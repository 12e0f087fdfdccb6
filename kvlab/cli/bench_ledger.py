"""`kvlab bench ledger`: the ledger over a 100,000-point grid, vectorised against a loop."""

from __future__ import annotations

from ..bench.ledger import run_ledger_grid
from ..errors import check_number
from ..fmt import seconds
from .args import count, print_json


def register(sub) -> None:
    p = sub.add_parser(
        "ledger", help="time the ledger over a slider grid: one vectorised call vs a Python loop"
    )
    p.add_argument("--points", type=count, default=100_000, help="grid points (default 100,000)")
    p.add_argument("--loop-points", type=count, help="points for the Python loop (default: all)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    points = check_number(
        "--points", args.points, minimum=100, allow_equal_min=True, maximum=1e8, integer=True
    )
    loop = (
        None
        if args.loop_points is None
        else check_number(
            "--loop-points",
            args.loop_points,
            minimum=1,
            allow_equal_min=True,
            maximum=points,
            integer=True,
        )
    )
    r = run_ledger_grid(points, loop)
    if args.json:
        print_json(r)
    else:
        print(
            f"{r['points']:,} points vectorised: {seconds(r['vectorised_s'])} "
            f"({r['vectorised_ns_per_point']:.0f} ns a point)\n"
            f"{r['loop_points']:,} points in a Python loop: {seconds(r['loop_s'])} "
            f"({r['loop_us_per_point']:.0f} us a point), {r['speedup']:,.0f}x slower"
        )
    return 0

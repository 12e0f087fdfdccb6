"""`kvlab bench all` and `kvlab bench gpu-suite`: every benchmark, bounded in time.

`gpu-suite` is what `make bench-gpu` runs on a CUDA machine that has only python3,
numpy and torch: no installs, results under results/<gpu>/, done in under 10 minutes.
A benchmark that is refused or breaks is reported and the others still run; the exit
status is then 1.
"""

from __future__ import annotations

from ..bench.suite import SHARES, run_suite
from ..errors import KvlabError
from . import bench_common as common
from .args import print_json


def register(sub) -> None:
    for name, budget, help_text in (
        (
            "all",
            1800,
            "every benchmark on this machine (memory, transfer, recompute-vs-fetch, decode)",
        ),
        (
            "gpu-suite",
            480,
            "every benchmark on a CUDA device, sized to finish in under 10 minutes "
            "(make bench-gpu)",
        ),
    ):
        p = sub.add_parser(
            name,
            help=help_text,
            description=help_text + "; each result is written as soon as its benchmark finishes.",
        )
        common.add_common(p, budget_s=budget)
        p.add_argument(
            "--only",
            type=common.csv_names,
            metavar="NAMES",
            help="run only these, e.g. decode or memory,transfer (a rerun of what a "
            "first run left out)",
        )
        p.set_defaults(func=run, suite=name)


def run(args) -> int:
    names = tuple(name for name, _ in SHARES)
    for name in args.only or ():
        if name not in names:
            raise KvlabError(f"--only: unknown benchmark {name!r}; choose from {', '.join(names)}")
    only = tuple(args.only) if args.only else None
    if args.plan is not None:  # "" is a (bad) device name, not "no plan"
        return common.show_plan(args, only or names)
    import torch

    if args.suite == "gpu-suite" and args.device == "auto":
        if not torch.cuda.is_available():
            raise KvlabError(
                "gpu-suite needs a CUDA device and torch sees none; "
                "run 'kvlab bench all' for this machine"
            )
        args.device = "cuda"
    device = common.setup(args)
    out = run_suite(
        device,
        args.budget,
        quick=args.quick,
        repeats=common.repeats(args),
        write=not args.no_write,
        only=only,
    )
    if args.json:
        print_json(out)
    else:
        for name, summary in out.items():
            print(f"{name}: {summary.get('written_to') or summary}")
    failed = any("error" in summary or "refused" in summary for summary in out.values())
    return 1 if failed else 0

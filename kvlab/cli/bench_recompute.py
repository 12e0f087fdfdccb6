"""`kvlab bench recompute-vs-fetch`: prefill N tokens against fetching their KV from host
memory."""

from __future__ import annotations

from ..bench.recompute import run_recompute
from ..decoder.config import KV_DTYPES, MAX_TOKENS, WEIGHT_DTYPES, check_choice, get_config
from . import bench_common as common


def register(sub) -> None:
    p = sub.add_parser(
        "recompute-vs-fetch",
        help="time to prefill N tokens vs to fetch their KV from host memory",
        description="For a range of N: one prefill of N tokens on the device "
        "against copying their KV (every layer) from host memory; reports where the "
        "curves cross.",
    )
    common.add_kernels(p)
    common.add_common(p, budget_s=600)
    p.add_argument(
        "--presets", type=common.csv_names, help="decoder presets, e.g. cpu-bench,mha-small"
    )
    p.add_argument(
        "--tokens",
        type=common.csv_counts(MAX_TOKENS, " tokens"),
        help="comma-separated N, e.g. 16,256,4k",
    )
    p.add_argument("--weight-dtype", default="bf16", help="fp32, bf16, fp16 or int8 (default bf16)")
    p.add_argument(
        "--kv-dtype", default="bf16", help="fp32, bf16, fp16, int8 or fp8 (default bf16)"
    )
    p.set_defaults(func=run)


def run(args) -> int:
    for name in args.presets or ():
        get_config(name)
    check_choice("weight dtype", args.weight_dtype, WEIGHT_DTYPES)
    check_choice("kv dtype", args.kv_dtype, KV_DTYPES)
    options = {
        "presets": args.presets,
        "tokens": args.tokens,
        "weight_dtype": args.weight_dtype.lower(),
        "kv_dtype": args.kv_dtype.lower(),
    }
    if args.plan is not None:  # "" is a (bad) device name, not "no plan"
        return common.show_plan(args, ("recompute-vs-fetch",), {"recompute-vs-fetch": options})
    device = common.setup(args)
    r = run_recompute(
        device,
        **options,
        repeats=common.repeats(args),
        budget_s=args.budget,
        quick=args.quick,
        kernels=args.kernels,
    )
    rows = [
        [
            c["preset"],
            str(p["tokens"]),
            f"{p['recompute_s'] * 1e3:.3f}",
            f"{p['fetch_s'] * 1e3:.3f}",
            f"{p['predicted_recompute_s'] * 1e3:.3f}",
            f"{p['predicted_fetch_s'] * 1e3:.3f}",
        ]
        for c in r["curves"]
        for p in c["points"]
    ]
    header = [
        "preset",
        "tokens",
        "recompute ms",
        "fetch ms",
        "ledger recompute ms",
        "ledger fetch ms",
    ]
    return common.finish(args, "recompute-vs-fetch", r, device, rows, header)

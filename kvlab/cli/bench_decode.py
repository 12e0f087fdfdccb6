"""`kvlab bench decode`: measured decode steps of the toy decoder against the ledger."""

from __future__ import annotations

import sys

from ..bench.decode import run_decode, write_comparison
from ..decoder.config import (
    KV_DTYPES,
    MAX_TOKENS,
    PLACEMENTS,
    WEIGHT_DTYPES,
    check_choice,
    get_config,
)
from . import bench_common as common


def register(sub) -> None:
    p = sub.add_parser(
        "decode",
        help="decode step: measured vs the ledger, over batch x context x placement x KV dtype",
        description="Times one decode step of the toy decoder for every point of "
        "the sweep and compares it with the ledger fed this machine's measured "
        "bandwidth and matmul rate.",
    )
    common.add_kernels(p)
    common.add_common(p, budget_s=900)
    p.add_argument(
        "--preset",
        help="decoder preset: tiny, small, cpu-bench, gpu-bench, mha-small "
        "(default: cpu-bench on CPU, gpu-bench on CUDA, small with --quick on CPU)",
    )
    p.add_argument(
        "--batches",
        type=common.csv_counts(MAX_TOKENS, " sequences"),
        help="comma-separated, e.g. 1,8",
    )
    p.add_argument(
        "--contexts",
        help="comma-separated, e.g. 1k,4k,32k",
        type=common.csv_counts(MAX_TOKENS, " tokens (the KV cache's limit)"),
    )
    p.add_argument("--placements", type=common.csv_names, help="device,host")
    p.add_argument("--kv-dtypes", type=common.csv_names, help="from fp32,bf16,fp16,int8,fp8")
    p.add_argument("--weight-dtype", help="fp32, bf16, fp16 or int8 (weight-only)")
    p.add_argument(
        "--prefetch",
        choices=("off", "on", "both"),
        help="host placement: prefetch the next layer on a CUDA stream (default: "
        "both on CUDA; off on CPU)",
    )
    p.add_argument(
        "--no-cuda-graph", action="store_true", help="run device-placement steps eagerly on CUDA"
    )
    p.add_argument(
        "--compare-kernels",
        action="store_true",
        help="CPU with kvlab's kernels: also time every device-placement point with "
        "PyTorch's kernels, right after (writes decode-torch-kernels.json too)",
    )
    p.set_defaults(func=run)


def grid_options(args) -> dict:
    """The sweep's grid overrides from the arguments, checked (shared with --plan)."""
    if args.preset:
        get_config(args.preset)
    for name in args.placements or ():
        check_choice("placement", name, PLACEMENTS)
    for name in args.kv_dtypes or ():
        check_choice("kv dtype", name, KV_DTYPES)
    if args.weight_dtype:
        check_choice("weight dtype", args.weight_dtype, WEIGHT_DTYPES)
    prefetch = {None: None, "off": (False,), "on": (True,), "both": (False, True)}[args.prefetch]
    return {
        "preset": args.preset,
        "batches": args.batches,
        "contexts": args.contexts,
        "placements": args.placements,
        "kv_dtypes": args.kv_dtypes,
        "weight_dtype": args.weight_dtype and args.weight_dtype.lower(),
        "prefetch": prefetch,
    }


def run(args) -> int:
    options = grid_options(args)
    if args.plan is not None:  # "" is a (bad) device name, not "no plan"
        return common.show_plan(args, ("decode",), {"decode": options})
    device = common.setup(args)
    r = run_decode(
        device,
        **options,
        repeats=common.repeats(args),
        budget_s=args.budget,
        quick=args.quick,
        cuda_graph=not args.no_cuda_graph,
        kernels=args.kernels,
        compare_kernels=args.compare_kernels,
    )
    rows = [
        [
            p["placement"] + ("+pf" if p["prefetch"] else ""),
            p["kv_dtype"],
            str(p["batch"]),
            str(p["context"]),
            f"{p['measured_step_s'] * 1e3:.2f}",
            f"{p['predicted_step_s'] * 1e3:.2f}",
            f"{p['error']:+.1%}",
            f"{p['achieved_bytes_per_s'] / 1e9:.1f}",
            f"{p['fraction_of_bandwidth']:.0%}",
            f"{p['spread']:.0%}",
        ]
        for p in r["points"]
    ]
    header = [
        "placement",
        "kv",
        "batch",
        "context",
        "measured ms",
        "ledger ms",
        "error",
        "GB/s",
        "of copy",
        "spread",
    ]
    # PyTorch's kernels asked for on purpose: a comparison run, kept beside the main results
    on_cpu = not device.startswith("cuda")
    kind = "decode-torch-kernels" if args.kernels == "torch" and on_cpu else "decode"
    path = write_comparison(r, device, write=not args.no_write)
    if path is not None:
        print(f"written: {path}", file=sys.stderr)
    return common.finish(args, kind, r, device, rows, header)

"""`kvlab bench kv-transfer`: real KV transfer between a prefill and a decode process.

Spawns the two processes per engine on 127.0.0.1 (or runs as one rank under torchrun),
moves KV blocks of 4 KiB..512 MiB contiguous and paged, and reports the median and
spread of each transfer (push + acknowledgement), with checksums from both sides.
Full runs merge into results/<machine>/kv_transfer.json; --quick runs save only with --save.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

from ..fmt import seconds, si
from ..kv_transfer import (
    TransferConfig,
    parse_size,
    parse_sizes,
    quick_config,
    run_benchmark,
    save_results,
)
from ..kv_transfer.config import format_size
from .args import number, print_json, table

ENGINE_CHOICES = ("all", "torch", "mooncake")


def register(sub) -> None:
    p = sub.add_parser(
        "kv-transfer",
        help="move KV blocks from a prefill to a decode process (torch.distributed, Mooncake)",
        description="Move KV blocks (contiguous and paged) from a 'prefill' to a 'decode' process "
        "and measure time and bandwidth. Engines: torch.distributed (gloo over TCP on CPU, NCCL on "
        "GPUs) and the Mooncake Transfer Engine (one-sided writes, P2P handshake). Sizes are "
        "binary: 4k = 4096 bytes, "
        "512M = 512 MiB. Across nodes, run it under torchrun (see kvlab.kv_transfer.torchrun).",
    )
    p.add_argument(
        "--engine",
        choices=ENGINE_CHOICES,
        default="all",
        help="which engine(s) to run (default all)",
    )
    p.add_argument(
        "--device", default="cpu", help="where the KV buffers live: cpu (default) or cuda"
    )
    p.add_argument(
        "--layout",
        choices=("both", "contiguous", "paged"),
        default="both",
        help="one contiguous buffer, or fixed-size blocks gathered through a block "
        "table (default both)",
    )
    p.add_argument(
        "--sizes", help="comma-separated transfer sizes, e.g. 4k,1M,512M (default 4 KiB..512 MiB)"
    )
    p.add_argument(
        "--block-bytes",
        help="paged layout: bytes per block (default 64k = 16 tokens "
        "x one layer's K and V of the article's 7B)",
    )
    p.add_argument(
        "--repeats", type=int, help="maximum timed repeats per case (default 200; quick 5)"
    )
    p.add_argument(
        "--seconds-per-size", type=number, help="time budget of each case's timed loop (default 2)"
    )
    p.add_argument(
        "--timeout",
        type=number,
        help="bound on every blocking wait in the two processes, s (default 60)",
    )
    p.add_argument(
        "--time-limit", type=number, help="bound on the whole run per engine, s (default 900)"
    )
    p.add_argument(
        "--completion",
        choices=("notify", "flag"),
        default="notify",
        help="Mooncake completion signal: TransferNotify (default) or a one-sided doorbell write",
    )
    p.add_argument(
        "--mooncake-protocol", default="tcp", help="Mooncake transport: tcp (default) or rdma"
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind and advertise (default 127.0.0.1)"
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads per process (default 1)")
    p.add_argument(
        "--quick", action="store_true", help="3 small sizes, few repeats: a smoke test in seconds"
    )
    save = p.add_mutually_exclusive_group()
    save.add_argument(
        "--save",
        dest="save",
        action="store_true",
        default=None,
        help="write results/<machine>/kv_transfer.json (default for full runs)",
    )
    save.add_argument("--no-save", dest="save", action="store_false", help="do not write results")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--inject-fault", help=argparse.SUPPRESS)  # tests: decode:exit@1, prefill:hang@0
    p.set_defaults(func=run)


def configs_from_args(args) -> list:
    """One TransferConfig per engine from the parsed arguments (validated)."""
    from dataclasses import replace

    base = quick_config() if args.quick else TransferConfig()
    changes = {
        "device": args.device,
        "completion": args.completion,
        "mooncake_protocol": args.mooncake_protocol,
        "host": args.host,
        "threads": args.threads,
        "fault": args.inject_fault,
    }
    if args.layout != "both":
        changes["layouts"] = (args.layout,)
    if args.sizes:
        changes["sizes_bytes"] = parse_sizes(args.sizes)
    if args.block_bytes:
        changes["block_bytes"] = parse_size(args.block_bytes)
    if args.repeats is not None:
        changes["max_repeats"] = args.repeats
        changes["min_repeats"] = min(base.min_repeats, args.repeats)
    for flag, field in (
        ("seconds_per_size", "seconds_per_size"),
        ("timeout", "timeout_s"),
        ("time_limit", "time_limit_s"),
    ):
        if getattr(args, flag) is not None:
            changes[field] = getattr(args, flag)
    engines = ("torch", "mooncake") if args.engine == "all" else (args.engine,)
    if args.engine == "all" and importlib.util.find_spec("mooncake") is None:
        print(
            "kvlab bench kv-transfer: Mooncake is not installed (pip install "
            "mooncake-transfer-engine-non-cuda); running torch.distributed only",
            file=sys.stderr,
        )
        engines = ("torch",)
    return [replace(base, engine=engine, **changes).validate() for engine in engines]


def command_line(args) -> str:
    """The command that reproduces this run (recorded with the results)."""
    parts = ["kvlab", "bench", "kv-transfer", "--engine", args.engine, "--device", args.device]
    for flag in ("layout", "sizes", "block_bytes", "repeats", "seconds_per_size", "completion"):
        value = getattr(args, flag)
        if (
            value is not None
            and not (flag == "layout" and value == "both")
            and not (flag == "completion" and value == "notify")
        ):
            parts += [f"--{flag.replace('_', '-')}", str(value)]
    if args.quick:
        parts.append("--quick")
    return " ".join(parts)


def run(args) -> int:
    configs = configs_from_args(args)
    save = (not args.quick) if args.save is None else args.save
    if save:
        from ..bench.results import check_writable

        check_writable(None)  # before the transfers run, not after
    result = run_benchmark(configs)
    if not result:  # the decode rank under torchrun: rank 0 reports
        return 0
    if save:
        result["saved_to"] = str(save_results(result, command_line(args)))
    if args.json:
        print_json(result)
    else:
        print(render(result))
    return 0


def render(result: dict) -> str:
    lines = []
    env = result["environment"]
    lines.append(
        f"kvlab bench kv-transfer on {env['device_name']} ({env['cpu_count']} CPUs, "
        f"torch {env.get('torch')})"
    )
    for label, entry in result["engines"].items():
        rows = [
            [
                r["layout"],
                format_size(r["bytes"]),
                str(r["blocks"]),
                str(r["repeats"]),
                seconds(r["time_s"]["median"]),
                f"{seconds(r['time_s']['p10'])} - {seconds(r['time_s']['p90'])}",
                si(r["bandwidth_bytes_per_s"]["median"], "B/s"),
                "ok" if r["checksum_ok"] else "MISMATCH",
            ]
            for r in entry["rows"]
        ]
        header = [
            "layout",
            "size",
            "blocks",
            "reps",
            "median",
            "p10 - p90",
            "bandwidth",
            "checksum",
        ]
        lines += [
            "",
            f"{label}  (time = KV pushed + acknowledgement received; {entry['wall_s']:.1f} s)",
            table(rows, header),
        ]
        for layout, s in entry["summary"].items():
            fit = s.get("fit")
            if fit:
                lines.append(
                    f"  {layout}: fits latency {seconds(fit['latency_s'])} + size / "
                    f"{si(fit['bandwidth_bytes_per_s'], 'B/s')}"
                )
    if result.get("saved_to"):
        lines += ["", f"saved to {result['saved_to']}"]
    return "\n".join(lines)

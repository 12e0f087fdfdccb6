"""`kvlab diagnose`: the article's five steps applied to a measurement."""

from __future__ import annotations

from ..diagnose import diagnose
from . import add_command
from .args import count, number, print_json


def register(sub) -> None:
    p = add_command(
        sub,
        "diagnose",
        "Which bound applies, how far a measured tokens/s is from the ceiling, "
        "whether weights or KV dominate, and what to try, with the numbers behind each line.",
    )
    p.add_argument("--model", required=True, help="catalogue name or config.json path")
    p.add_argument("--hardware", default="h100-sxm", help="device name (see 'kvlab hardware')")
    p.add_argument("--batch", type=count, default=1, help="sequences decoded together")
    p.add_argument("--context", type=count, default=4096, help="tokens of KV history per sequence")
    p.add_argument(
        "--tokens-per-s", type=number, required=True, help="measured decode tokens/s, whole batch"
    )
    p.add_argument("--weight-dtype", default="fp16")
    p.add_argument("--kv-dtype", default="fp16")
    p.add_argument(
        "--memory-throughput",
        type=number,
        metavar="BYTES_PER_S",
        help="memory throughput a profiler measured (else inferred)",
    )
    p.add_argument(
        "--kv-tier", default="hbm", help="where the KV is read from each step: hbm, host-pcie5, ..."
    )
    p.add_argument(
        "--network",
        metavar="LINK|BYTES_PER_S",
        help="link name (ib-200g...) or bytes/s between nodes",
    )
    p.add_argument(
        "--kv-bytes-per-request", type=number, help="KV bytes each request sends over the network"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    network = args.network
    if network is not None:
        try:
            network = float(network)
        except ValueError:
            pass  # a link name
    result = diagnose(
        args.model,
        args.hardware,
        args.batch,
        args.context,
        args.tokens_per_s,
        args.weight_dtype,
        args.kv_dtype,
        args.memory_throughput,
        args.kv_tier,
        network,
        args.kv_bytes_per_request,
    )
    if args.json:
        print_json(result.to_dict())
    else:
        print(result.report())
    return 0

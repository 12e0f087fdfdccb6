"""`kvlab simulate`: replay a trace on a simulated cluster and report latency, throughput, SLOs.

JSON contract (always present): ttft_p50_s, ttft_p90_s, tpot_p50_s, itl_p99_s,
throughput_tokens_per_s, requests_completed, prefix_hit_ratio; plus the other
percentiles, SLO attainment and goodput, bytes moved per link, move time exposed on the
critical path vs hidden behind compute, rejected requests, and the resolved config.
"""
from __future__ import annotations

import sys

from .args import count, number, print_json


def register(sub) -> None:
    from ..sim.config import ARCHS, CACHE_POLICIES, DECODE_ROUTERS, PREFILL_ROUTERS, PREFIX_CACHES

    p = sub.add_parser(
        "simulate",
        help="replay a trace on a colocated, disaggregated or KV-centric cluster (discrete-event)",
        description="Replay a request trace on a simulated GPU cluster whose step times come from the "
        "ledger, and report TTFT / TPOT / ITL percentiles, throughput, SLO attainment, prefix hits and the "
        "bytes each link moved (on the critical path or hidden behind compute). Colocated uses "
        "prefill-workers + decode-workers GPUs that do both.",
    )
    p.add_argument("trace", metavar="TRACE",
                   help="a known trace (conversation, synthetic), generated[:PRESET][:SEED], or a .jsonl path")
    p.add_argument("--arch", required=True, choices=ARCHS, help="cluster architecture")
    p.add_argument("--prefill-workers", type=int, default=2, metavar="N", help="prefill GPUs (default 2)")
    p.add_argument("--decode-workers", type=int, default=2, metavar="N", help="decode GPUs (default 2)")
    p.add_argument("--model", default="llama-3.1-8b", help="catalogue name or config.json path (default llama-3.1-8b)")
    p.add_argument("--hardware", default="h100-sxm", help="GPU of every worker (default h100-sxm)")
    p.add_argument("--link", default="ib-200g", help="network between nodes, one NIC per GPU (default ib-200g)")
    p.add_argument("--host-link", default="pcie5-x16", help="host DRAM <-> GPU link (default pcie5-x16)")
    p.add_argument("--weight-dtype", default="fp16", help="weight dtype (default fp16)")
    p.add_argument("--kv-dtype", default="fp16", help="KV cache dtype (default fp16)")
    p.add_argument("--efficiency", type=number, default=1.0, help="share of peak FLOP/s and HBM bandwidth (default 1)")
    p.add_argument("--pool-bytes", type=number, default=500e9, metavar="BYTES",
                   help="host DRAM per prefill node for prefix KV, e.g. 5e11 (default 500 GB)")
    p.add_argument("--prefix-cache", choices=PREFIX_CACHES, help="override the architecture's prefix cache")
    p.add_argument("--cache-policy", choices=CACHE_POLICIES, default="lru", help="eviction policy (default lru)")
    p.add_argument("--prefill-router", choices=PREFILL_ROUTERS, help="override the prefill router")
    p.add_argument("--decode-router", choices=DECODE_ROUTERS, help="override the decode router")
    ov = p.add_mutually_exclusive_group()
    ov.add_argument("--overlap", dest="overlap", action="store_true", default=None,
                    help="stream KV moves layer by layer during the prefill (kv-centric default)")
    ov.add_argument("--no-overlap", dest="overlap", action="store_false", help="move KV before/after the prefill")
    p.add_argument("--remote-kv", action="store_true",
                   help="leave the KV remote during decode, read over the link every step (the disaster)")
    p.add_argument("--chunk-tokens", type=count, default=8192,
                   help="colocated: prompt tokens per prefill iteration, 0 = whole prompt (default 8192)")
    p.add_argument("--max-batch", type=int, default=256, help="sequences per decode GPU (default 256)")
    p.add_argument("--jitter", type=number, default=0.0, metavar="CV",
                   help="random spread (coefficient of variation) of every step's time (default 0)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random streams (default 0)")
    p.add_argument("--start", type=number, default=0.0, metavar="S", help="slice: seconds into the trace (default 0)")
    p.add_argument("--duration", type=number, metavar="S", help="slice: seconds of arrivals to replay (default all)")
    p.add_argument("--limit", type=int, metavar="N", help="slice: at most N requests")
    p.add_argument("--ttft-slo", type=number, default=30.0, metavar="S", help="TTFT limit in seconds (default 30)")
    p.add_argument("--tbt-slo", type=number, default=0.1, metavar="S",
                   help="time-between-tokens limit in seconds (default 0.1; Mooncake used 0.1/0.2/0.3)")
    p.add_argument("--tbt-stat", choices=("mean", "p90", "p99", "max"), default="p90",
                   help="which of a request's token gaps must meet the TBT limit (default p90; mean = TPOT)")
    p.add_argument("--records", metavar="PATH", help="also write per-request records (.csv or .jsonl)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..sim import SimConfig, simulate, trace_slice

    config = SimConfig(
        arch=args.arch, model=args.model, hardware=args.hardware, weight_dtype=args.weight_dtype,
        kv_dtype=args.kv_dtype, efficiency=args.efficiency, prefill_workers=args.prefill_workers,
        decode_workers=args.decode_workers, link=args.link, host_link=args.host_link,
        pool_bytes_per_node=args.pool_bytes, prefix_cache=args.prefix_cache, cache_policy=args.cache_policy,
        prefill_router=args.prefill_router, decode_router=args.decode_router, overlap=args.overlap,
        remote_kv=args.remote_kv, chunk_tokens=int(args.chunk_tokens), max_batch=args.max_batch,
        step_jitter=args.jitter, seed=args.seed,
    )
    trace = trace_slice(args.trace, args.start, args.duration, args.limit)
    progress = _progress if sys.stderr.isatty() and len(trace) > 2000 else None
    result = simulate(trace, config, progress=progress)
    if progress:
        sys.stderr.write("\n")
    if args.records:
        write_records(result, args.records)
    out = result.to_dict(args.ttft_slo, args.tbt_slo, args.tbt_stat)
    if args.json:
        print_json(out)
    else:
        print(render(out))
    return 0


def _progress(done: int, total: int) -> None:
    sys.stderr.write(f"\rkvlab simulate: {done:,}/{total:,} requests done")
    sys.stderr.flush()


def write_records(result, path: str) -> None:
    """Per-request records to .csv or .jsonl, atomically (a temp file renamed into place)."""
    import csv
    import json
    import os
    import tempfile
    from pathlib import Path

    from ..errors import KvlabError

    target = Path(path)
    if target.suffix not in (".csv", ".jsonl"):
        raise KvlabError(f"--records {path!r}: name a .csv or .jsonl file")
    if not target.parent.is_dir():
        raise KvlabError(f"--records {path!r}: folder {str(target.parent)!r} does not exist")
    rows = result.records_table()
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="") as handle:
            if target.suffix == ".csv":
                writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else [])
                writer.writeheader()
                writer.writerows(rows)
            else:
                for row in rows:
                    handle.write(json.dumps(row) + "\n")
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise


def render(r: dict) -> str:
    """The run as a short readable report."""
    from ..fmt import seconds, si

    def s(x):
        return "-" if x is None else seconds(x)

    cfg = r["config"]
    gpus = (f"{r['gpus']} GPUs doing both" if r["arch"] == "colocated"
            else f"{r['prefill_workers']} prefill + {r['decode_workers']} decode GPUs")
    lines = [
        f"kvlab simulate: {r['trace']} on {r['arch']} ({gpus}, {r['hardware']}, {r['model']})",
        f"  link {r['link']}, prefix cache {r['prefix_cache']} ({cfg['prefill_router']} prefill router, "
        f"{cfg['decode_router']} decode router), overlap {'on' if r['overlap'] else 'off'}"
        + (", KV REMOTE during decode" if r["remote_kv"] else ""),
        f"  requests {r['requests']:,}: {r['requests_completed']:,} done, {r['requests_rejected']:,} rejected"
        f" (too large for a GPU), {r['tokens_generated']:,} tokens in {s(r['duration_s'])}",
        "",
        "              p50        p90        p99       mean",
    ]
    for name in ("ttft", "tpot", "itl", "e2e", "queue"):
        lines.append(f"  {name.upper():<6}" + "".join(f"{s(r.get(f'{name}_{q}_s')):>11}" for q in ("p50", "p90", "p99",
                                                                                                  "mean")))
    lines += [
        "",
        f"  throughput        {r['throughput_tokens_per_s'] or 0:,.0f} tokens/s",
        f"  SLO (TTFT <= {s(r['ttft_slo_s'])}, {r['tbt_stat']} gap <= {s(r['tbt_slo_s'])}): "
        f"{100 * (r['slo_attainment'] or 0):.1f}% of requests; goodput {r['goodput_tokens_per_s'] or 0:,.0f} tokens/s",
        f"  prefix cache      {100 * r['prefix_hit_ratio']:.1f}% of prompt tokens served from cache",
        "",
        "  moved                 bytes   on critical path   hidden behind compute",
    ]
    for purpose, v in r["network"]["by_purpose"].items():
        if v["moves"]:
            lines.append(f"  {purpose:<19}{si(v['bytes'], 'B'):>10}   {s(v['exposed_s']):>12}   {s(v['hidden_s']):>14}"
                         f"   ({v['link']})")
    if r["rejected"]:
        lines += ["", f"  rejected: {r['rejected'][0]['reason']}" + (f" (and {len(r['rejected']) - 1} more)"
                                                                       if len(r["rejected"]) > 1 else "")]
    lines += ["", f"  simulated {s(r['sim_end_s'])} in {s(r['wall_s'])} of wall time ({r['events']:,} events)"]
    return "\n".join(lines)

"""`kvlab prefix-cache`: replay a trace through a block prefix cache and report both hit rates.

JSON contract: block_hit_ratio, token_hit_ratio, prefill_tokens_saved (plus request_hit_rate,
capacity_blocks (null = unlimited), evicted_blocks...; with --model also the TTFT and TPOT
the ledger gives for these hits).
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from ..deployment import Deployment
from ..errors import KvlabError, check_number
from ..fmt import percent, seconds
from ..hardware import get_device, get_tier
from ..models import get_model
from ..prefix.blocks import replay
from ..prefix.latency import mean_decode_context, tpot_s, ttft_s
from ..traces import load_trace
from .args import count, print_json

UNLIMITED = ("inf", "infinite", "unlimited")
RESIDENT = ("hbm", "resident", "local")


def capacity(text: str) -> float:
    """A block or token count ('10000', '10k'), or 'inf' for an unlimited cache. Only the word
    means unlimited: a number too large for a float (1e400) is refused, as `kvlab budget`
    refuses it, not read as infinity."""
    if text.strip().lower() in UNLIMITED:
        return math.inf
    value = count(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(
            f"expected a finite count such as 20000 or 20k, or 'inf' "
            f"for an unlimited cache, got {text[:40]!r}"
        )
    return value


def register(sub) -> None:
    p = sub.add_parser(
        "prefix-cache",
        help="replay a trace through a prefix cache: block and token hit ratios, prefill saved",
        description=(
            "Replay a request trace through a block-chain prefix cache (a request reuses the "
            "leading run of its cached blocks) under an eviction policy, and report the block "
            "hit ratio, the token hit ratio (prefill actually skipped) and the request-level hit "
            "rate side by side."
        ),
    )
    p.add_argument(
        "trace",
        metavar="TRACE",
        help="a known trace (conversation, synthetic), generated[:PRESET][:SEED], or a .jsonl path",
    )
    p.add_argument(
        "--policy",
        default="lru",
        choices=("lru", "lfu", "length-aware"),
        help="eviction policy (default lru)",
    )
    cap = p.add_mutually_exclusive_group(required=True)
    cap.add_argument(
        "--capacity-blocks",
        type=capacity,
        metavar="N|inf",
        help="cache size in blocks (10k works), or inf",
    )
    cap.add_argument(
        "--capacity-tokens",
        type=capacity,
        metavar="N",
        help="cache size in tokens (rounded down to whole blocks)",
    )
    p.add_argument(
        "--model", help="also give TTFT/TPOT from the ledger for this model (see 'kvlab models')"
    )
    p.add_argument("--hardware", default="h100-sxm", help="device for TTFT/TPOT (default h100-sxm)")
    p.add_argument(
        "--tier",
        default="hbm",
        help="where cached KV lives: hbm (resident, no fetch) or a tier such as pcie5-x16, ib-400g "
        "(see 'kvlab hardware')",
    )
    p.add_argument("--batch", type=count, default=16, help="decode batch for TPOT (default 16)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    _check_options(args)
    trace = load_trace(args.trace)
    result = replay(trace, args.capacity_blocks, args.policy, args.capacity_tokens)
    out = result.to_dict()
    if args.model:
        out.update(_latency(args, trace, result))
    if args.json:
        print_json(out)
    else:
        print(render(out))
    return 0


def _check_options(args) -> None:
    """Every option is checked, used or not: a typo in --tier or --hardware without --model
    is an error, never silently ignored."""
    get_device(args.hardware)
    if args.tier.lower() not in RESIDENT:
        try:
            get_tier(args.tier)
        except KvlabError as exc:
            raise KvlabError(f"{exc}, or hbm (KV resident in GPU memory)") from None
    check_number("batch", args.batch, minimum=1, allow_equal_min=True, maximum=1e6, integer=True)
    if args.model:
        get_model(args.model)


def _latency(args, trace, result) -> dict:
    d = Deployment(args.model, args.hardware)
    tier = None if args.tier.lower() in RESIDENT else args.tier
    inputs = trace.input_tokens
    with_cache = ttft_s(d, inputs, result.hit_tokens_per_request, tier)
    without = ttft_s(d, inputs, 0)
    tpot = tpot_s(d, mean_decode_context(inputs, trace.output_tokens), args.batch)
    return {
        "model": args.model,
        "hardware": args.hardware,
        "kv_tier": args.tier,
        "batch": int(args.batch),
        "mean_ttft_s": float(with_cache.mean()),
        "p90_ttft_s": float(_p90(with_cache)),
        "no_cache_mean_ttft_s": float(without.mean()),
        "mean_tpot_s": float(tpot.mean()),
    }


def _p90(x):
    return np.percentile(x, 90)


def share(x: float) -> str:
    """A ratio as a percentage that never rounds 99.99% up to 100% (or 0.004% down to 0%)."""
    if 0 < x < 1 and (x > 0.999 or x < 0.001):
        return f"{100 * x:.4g}%"
    return percent(x)


def tokens(n: float) -> str:
    return f"{n / 1e6:.3g}M tokens" if n >= 1e6 else f"{n:,.0f} tokens"


def render(r: dict) -> str:
    cap = (
        "unlimited"
        if r["capacity_blocks"] is None
        else (
            f"{r['capacity_blocks']:,} blocks ({tokens(r['capacity_blocks'] * r['block_tokens'])})"
        )
    )
    lines = [
        f"kvlab prefix-cache: {r['trace']}, {r['requests']:,} requests, "
        f"{r['block_refs']:,} block refs; policy {r['policy']}, capacity {cap}",
        "",
        f"  block hit ratio    {share(r['block_hit_ratio']):>7}   {r['hit_blocks']:,} of "
        f"{r['block_refs']:,} block refs hit (leading run of each chain)",
        f"  token hit ratio    {share(r['token_hit_ratio']):>7}   prefill tokens saved "
        f"{tokens(r['prefill_tokens_saved'])} of {tokens(r['input_tokens'])}",
        f"  request hit rate   {share(r['request_hit_rate']):>7}   requests that hit at least one "
        "block (says nothing about how much prefill was skipped)",
        f"  evicted blocks     {r['evicted_blocks']:>7,}",
    ]
    if "mean_ttft_s" in r:
        lines += [
            "",
            f"  {r['model']} on {r['hardware']}, cached KV in {r['kv_tier']} (ledger, no "
            "queueing):",
            f"  mean TTFT          {seconds(r['mean_ttft_s']):>9}   (no cache "
            f"{seconds(r['no_cache_mean_ttft_s'])}, p90 {seconds(r['p90_ttft_s'])})",
            f"  mean TPOT          {seconds(r['mean_tpot_s']):>9}   batch {r['batch']}: the same "
            "with or without hits",
        ]
    return "\n".join(lines)

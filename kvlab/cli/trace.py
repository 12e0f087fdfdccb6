"""`kvlab trace stats` and `kvlab trace download`: what a request trace holds, and getting one.

JSON contract of `stats`: requests, mean_input_tokens, mean_output_tokens, duration_s,
block_refs, unique_blocks (plus the sharing figures defined in kvlab.traces.trace_stats).
"""

from __future__ import annotations

from ..fmt import seconds
from ..traces import KNOWN_TRACES, load_trace, trace_stats
from ..traces.download import download_trace
from .args import print_json
from .prefix import share as percent


def register(sub) -> None:
    p = sub.add_parser(
        "trace",
        help="request traces: statistics, download",
        description="Mooncake-format request traces: what they hold, and fetching the public ones.",
    )
    tsub = p.add_subparsers(dest="trace_command", metavar="ACTION", parser_class=type(p))
    tsub.required = True

    s = tsub.add_parser(
        "stats", help="requests, token counts, duration, blocks and prefix sharing of a trace"
    )
    s.add_argument(
        "trace",
        metavar="TRACE",
        help="a known trace (conversation, synthetic), generated[:PRESET][:SEED], or a .jsonl path",
    )
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=run_stats)

    d = tsub.add_parser(
        "download",
        help="fetch the public Mooncake FAST'25 traces (sha256-checked)",
        description="Download the Mooncake FAST'25 traces into the trace cache "
        "($KVLAB_TRACE_DIR, else ~/.cache/kvlab/traces), verify their sha256 and "
        "write them atomically.",
    )
    d.add_argument(
        "names", nargs="*", metavar="NAME", help="conversation, synthetic (default: both)"
    )
    d.add_argument("--dir", help="destination folder instead of the trace cache")
    d.add_argument(
        "--base-url",
        help="where the files are (a mirror; default: the pinned GitHub commit, "
        "or $KVLAB_TRACE_BASE_URL)",
    )
    d.add_argument(
        "--force", action="store_true", help="download even if a verified copy is present"
    )
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.set_defaults(func=run_download)


def run_stats(args) -> int:
    st = trace_stats(load_trace(args.trace))
    if args.json:
        print_json(st.to_dict())
        return 0
    rows = [
        ["requests", f"{st.requests:,}"],
        ["duration", _duration(st)],
        [
            "input tokens",
            f"mean {st.mean_input_tokens:,.0f}, median {st.median_input_tokens:,.0f}, "
            f"p99 {st.p99_input_tokens:,.0f}, max {st.max_input_tokens:,}",
        ],
        ["output tokens", f"mean {st.mean_output_tokens:,.0f}"],
        ["block references", f"{st.block_refs:,} ({st.block_tokens} tokens per block)"],
        ["distinct blocks", f"{st.unique_blocks:,}"],
        [
            "share a prefix",
            f"{percent(st.shared_prefix_share)} of requests share their first block with an "
            "earlier one",
        ],
        [
            "reusable",
            f"{percent(st.reusable_block_share)} of block refs, "
            f"{percent(st.reusable_token_share)} of prompt tokens (an unlimited prefix cache)",
        ],
    ]
    print(f"kvlab trace stats: {st.label}")
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    return 0


def _duration(st) -> str:
    if st.duration_s <= 0:  # one request, or all at the same millisecond: no rate to give
        return (
            "0 s (a single request)"
            if st.requests == 1
            else f"0 s (all {st.requests:,} requests arrive at the same instant)"
        )
    return f"{seconds(st.duration_s)} ({st.requests_per_s:.3g} requests/s)"


def run_download(args) -> int:
    names = args.names or list(KNOWN_TRACES)
    results = [
        download_trace(n, dest_dir=args.dir, base_url=args.base_url, force=args.force)
        for n in names
    ]
    if args.json:
        print_json(
            {
                r.name: {"path": r.path, "bytes": r.bytes, "sha256": r.sha256, "fetched": r.fetched}
                for r in results
            }
        )
    else:
        for r in results:
            state = "downloaded" if r.fetched else "already present"
            print(f"{r.name}: {state}, {r.bytes:,} bytes, sha256 verified -> {r.path}")
    return 0

"""`kvlab plan`: search cluster designs for the most requests/s per GPU at the SLOs.

JSON contract (`--json`): `designs` ranked best first, each with `arch`,
`tensor_parallel`, `prefill_workers`, `decode_workers` (instances of tensor_parallel GPUs;
colocated: decode_workers 0), `scheduler` (null where no GPU mixes prefill and decode),
`gpus`, `saturation_requests_per_s`, `requests_per_s_per_gpu` (and `requests_per_dollar`
with prices), the latencies at that rate (`ttft_s`, `tbt_s` at the attainment quantile,
`ttft_p50_s`... `itl_p99_s`) and the `limit` that binds past it; `best`, `pareto` (keys),
`pruned` (with reasons), `why`. The logic lives in kvlab/plan/.
"""

from __future__ import annotations

import argparse
import sys

from .. import metrics
from ..deployment import parse_speed
from ..errors import KvlabError, check_number
from ..fmt import percent, seconds, sig
from ..plan import Job, Slo, Space, Workload, parse_gpus, parse_prices, plan
from ..plan.evaluate import DEFAULT_TOLERANCE
from ..plan.workload import DEFAULT_REQUESTS
from . import add_command
from .args import count, number, print_json, table


def _words(text: str) -> tuple:
    return tuple(w.strip() for w in text.split(",") if w.strip())


def _numbers(kind):
    def parse(text: str) -> tuple:
        words = _words(text)
        if not words:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
        return tuple(kind(w) for w in words)

    return parse


#: The design-space options: flag, parser of its list (None: kept as written, parsed by
#: space_of), metavar, help. Each left out keeps the search's default.
SPACE_OPTIONS = (
    ("--arch", _words, "A,..", "architectures (default colocated,disaggregated,kv-centric)"),
    ("--tensor-parallel", _numbers(count), "N,..", "GPUs per instance among 1,2,4,8 (default 1)"),
    (
        "--splits",
        None,
        "all|F,..",
        "prefill share of the instances of a disaggregated design (default 0.25,0.5,0.75; "
        "'all': every split)",
    ),
    (
        "--scheduler",
        _words,
        "S,..",
        "colocated iteration schedulers, each optionally with its token budget "
        "(chunked:512, prefill-first:4096; default chunked,prefill-first)",
    ),
    (
        "--chunk-tokens",
        _numbers(count),
        "N,..",
        "token budgets of the chunked scheduler (default: vLLM's for the GPU)",
    ),
    ("--max-batch", _numbers(count), "N,..", "batch caps"),
    (
        "--prefix-cache",
        _words,
        "C,..",
        "prefix caches: default (the architecture's), none, local, global",
    ),
    ("--pool-bytes", _numbers(number), "B,..", "host DRAM per node for prefix KV"),
)


def register(sub) -> None:
    p = add_command(
        sub,
        "plan",
        "Search cluster designs (architecture, tensor parallelism, prefill:decode "
        "split, scheduler and token budget, batch cap, prefix cache and pool, GPU type) for the "
        "one that serves the workload at the SLOs with the most requests/s per GPU (per dollar "
        "with --price). Each design's capacity is its saturation rate: the highest arrival rate "
        "at which the attainment target of requests meets both SLOs, found by the simulator's "
        "saturation search (bracket, then bisect the rate). Designs that cannot fit in memory "
        "are pruned first. Runs on every core, or on Ray with --ray.",
    )
    p.add_argument(
        "workload",
        metavar="WORKLOAD",
        help="a trace (conversation, synthetic, a .jsonl path) or a generated workload "
        "(generated[:PRESET][:SEED], poisson:rate=R,prompt=P,output=O[,requests=N][,seed=S]); "
        "its arrival rate is what the search varies",
    )
    p.add_argument("--model", required=True, metavar="M", help="catalogue name or config.json")
    p.add_argument(
        "--gpus",
        required=True,
        metavar="TYPE:COUNT[,TYPE:COUNT]",
        help="GPUs on offer, e.g. h100-sxm:8,a100-80gb:16; a design uses every GPU of its "
        "type, rounded down to whole instances",
    )
    p.add_argument("--ttft-slo", required=True, type=number, metavar="S", help="TTFT limit (s)")
    p.add_argument(
        "--tbt-slo", required=True, type=number, metavar="S", help="time-between-tokens limit (s)"
    )
    p.add_argument(
        "--tbt-stat",
        choices=metrics.TBT_STATS,
        default=metrics.DEFAULT_TBT_STAT,
        help=f"which of a request's token gaps the TBT limit holds (default "
        f"{metrics.DEFAULT_TBT_STAT})",
    )
    p.add_argument(
        "--attainment",
        type=number,
        default=0.9,
        metavar="F",
        help="share of requests that must meet both SLOs (default 0.9)",
    )
    p.add_argument(
        "--price",
        action="append",
        metavar="TYPE=USD_PER_HOUR",
        help="price of one GPU-hour (repeat per type; all types or none): rank per dollar",
    )
    p.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="run the evaluations as Ray tasks: a local Ray, or the cluster at ADDRESS "
        "(needs pip install 'kvlab[ray]'; write --ray=ADDRESS before WORKLOAD)",
    )
    p.add_argument(
        "--resume",
        metavar="FILE",
        help="append each finished design to FILE (JSON lines) and skip those already there",
    )
    p.add_argument(
        "--jobs",
        type=count,
        metavar="N",
        help="processes of the local pool (default: every core; 1 runs in this process)",
    )
    p.add_argument("--json", action="store_true", help="print the ranked table as one JSON object")
    p.add_argument("--top", type=count, default=10, metavar="N", help="rows shown (default 10)")
    w = p.add_argument_group("workload")
    w.add_argument("--start", type=number, default=0.0, metavar="S", help="seconds into the trace")
    w.add_argument(
        "--warmup",
        type=number,
        default=0.0,
        metavar="S",
        help="lead each slice in with the requests of the S seconds before it: they run (prefix "
        "caches fill) but are not measured (default 0: a cold start)",
    )
    w.add_argument(
        "--requests",
        type=count,
        default=DEFAULT_REQUESTS,
        metavar="N",
        help=f"requests per slice (default {DEFAULT_REQUESTS})",
    )
    w.add_argument(
        "--slices",
        type=count,
        default=1,
        metavar="K",
        help="consecutive slices; the saturation is their mean, with its spread (default 1)",
    )
    j = p.add_argument_group("evaluation")
    j.add_argument("--weight-dtype", default="fp16", metavar="DTYPE")
    j.add_argument("--kv-dtype", default="fp16", metavar="DTYPE")
    j.add_argument(
        "--efficiency",
        default="1.0",
        metavar="F|measured",
        help="share of peak FLOP/s and bandwidth (default 1), or 'measured' kernel tables",
    )
    j.add_argument("--seed", type=count, default=0, help="seed of the simulator's streams")
    j.add_argument(
        "--tolerance",
        type=number,
        default=DEFAULT_TOLERANCE,
        metavar="F",
        help=f"the rate search stops when its bracket is this share of its top (default "
        f"{DEFAULT_TOLERANCE:g})",
    )
    s = p.add_argument_group("design space (comma-separated lists)")
    for flag, parse, metavar, text in SPACE_OPTIONS:
        s.add_argument(flag, type=parse, default=None, metavar=metavar, help=text)
    p.set_defaults(func=run)


def space_of(args):
    fields = {}
    if args.arch:
        fields["archs"] = args.arch
    if args.tensor_parallel:
        fields["tensor_parallel"] = tuple(
            int(x) if x == int(x) else x for x in args.tensor_parallel
        )
    if args.splits is not None:
        if args.splits.strip().lower() == "all":
            fields["prefill_shares"] = None
        else:
            try:
                fields["prefill_shares"] = tuple(float(x) for x in _words(args.splits))
            except ValueError:
                raise KvlabError(
                    f"--splits wants 'all' or shares such as 0.25,0.5, got {args.splits!r}"
                ) from None
            if not fields["prefill_shares"]:
                raise KvlabError("--splits is empty")
    if args.scheduler:
        fields["schedulers"] = args.scheduler
    if args.chunk_tokens:
        fields["chunk_tokens"] = tuple(int(x) if x == int(x) else x for x in args.chunk_tokens)
    if args.max_batch:
        fields["max_batch"] = tuple(int(x) if x == int(x) else x for x in args.max_batch)
    if args.prefix_cache:
        fields["prefix_cache"] = args.prefix_cache
    if args.pool_bytes:
        fields["pool_bytes_per_node"] = args.pool_bytes
    return Space(**fields)


def run(args) -> int:
    offers = parse_gpus(args.gpus)
    prices = parse_prices(args.price, offers)
    slo = Slo(args.ttft_slo, args.tbt_slo, args.tbt_stat, args.attainment)
    job = Job(
        args.model,
        slo,
        args.weight_dtype,
        args.kv_dtype,
        parse_speed(args.efficiency),
        int(check_number("seed", args.seed, minimum=0, allow_equal_min=True, integer=True)),
        args.tolerance,
    )
    workload = Workload(args.workload, args.start, args.requests, args.slices, args.warmup)
    space = space_of(args)
    workers = None
    if args.jobs is not None:
        workers = int(
            check_number(
                "--jobs", args.jobs, minimum=1, allow_equal_min=True, maximum=4096, integer=True
            )
        )
    top = int(
        check_number("--top", args.top, minimum=1, allow_equal_min=True, maximum=1e6, integer=True)
    )
    runner = "ray" if args.ray is not None else "serial" if workers == 1 else "local"
    bar = None if args.json else Progress(sys.stderr)
    try:
        out = plan(
            job,
            workload,
            offers,
            space,
            prices,
            runner=runner,
            workers=workers,
            ray_address=args.ray or None,
            resume_path=args.resume,
            progress=bar,
        )
    except KeyboardInterrupt:
        if bar:
            bar.end()
        kept = (
            f"; finished designs are kept in {args.resume}: rerun with it to go on"
            if args.resume
            else ""
        )
        print(f"kvlab plan: interrupted{kept}", file=sys.stderr)
        return 130
    if bar:
        bar.end()
    if args.json:
        print_json(out)
    else:
        print(render(out, top))
    return 0


class Progress:
    """A bar on stderr: designs done, the best so far. Redrawn in place on a terminal, a
    line per design otherwise."""

    WIDTH = 24

    def __init__(self, stream):
        self.stream = stream
        self.tty = stream.isatty()
        self.drawn = False

    def __call__(self, done: int, total: int, best) -> None:
        filled = round(self.WIDTH * done / total) if total else self.WIDTH
        head = f"kvlab plan: [{'#' * filled}{'.' * (self.WIDTH - filled)}] {done}/{total} designs"
        if best is not None:
            per_gpu = sig(best["requests_per_s_per_gpu"], 3)
            head += f"; best so far {best['key']}: {per_gpu} requests/s per GPU"
        self.stream.write(("\r" + head + "\033[K") if self.tty else head + "\n")
        self.stream.flush()
        self.drawn = True

    def end(self) -> None:
        if self.tty and self.drawn:
            self.stream.write("\n")
            self.stream.flush()


def render(out: dict, top: int = 10) -> str:
    slo = out["slo"]
    w = out["workload"]
    lines = [
        f"kvlab plan: {out['model']} on {w['trace_name']} ({w['slices']} slice(s) of "
        f"{w['requests']:,} requests"
        + (f", each after a {seconds(w['warmup_s'])} warm-up" if w.get("warmup_s") else "")
        + f"), TTFT <= {seconds(slo['ttft_s'])} and {slo['tbt_stat']} "
        f"TBT <= {seconds(slo['tbt_s'])} for {percent(slo['attainment'])} of requests",
        f"{len(out['designs']) + len(out['pruned'])} designs: {len(out['pruned'])} pruned "
        f"(memory), {out['evaluated']} evaluated, {out['reused']} from the resume file; "
        f"{sig(out['wall_s'], 3)} s ({out['runner']})",
        "",
    ]
    per_dollar = out["ranked_by"] == "requests_per_dollar"
    header = ["#", "design", "GPUs", "req/s", "req/s/GPU"]
    header += ["req/$"] if per_dollar else []
    header += ["TTFT", "TBT", "binds", "front"]
    rows = []
    for r in out["designs"][:top]:
        row = [
            str(r["rank"]),
            r["key"],
            str(r["gpus"]),
            sig(r["saturation_requests_per_s"], 3),
            sig(r["requests_per_s_per_gpu"], 3),
        ]
        if per_dollar:
            row.append(sig(r["requests_per_dollar"], 3))
        lim = r["limit"]
        row += [
            seconds(r["ttft_s"]),
            seconds(r["tbt_s"]),
            lim["binds"] if lim else "-",
            "*" if r["pareto"] else "",
        ]
        rows.append(row)
    lines.append(table(rows, header))
    if len(out["designs"]) > top:
        lines.append(f"... {len(out['designs']) - top} more (--top N, or --json)")
    lines += ["", out["why"]]
    if out["pruned"]:
        lines += ["", "Pruned before simulating:"]
        lines += [f"  {p['key']}: {p['reason']}" for p in out["pruned"][:top]]
    return "\n".join(lines)

"""`kvlab bench BENCHMARK ...`: this machine's benchmarks, one row of BENCHMARKS each.

A row names a benchmark with its help, its own flags, the function that runs it and how
its result prints. The timed sweeps (memory, transfer, recompute-vs-fetch, decode) share
one runner (`run_sweep`): the common options, `--plan`, and `finish`, which writes
results/<machine>/<benchmark>.json and prints JSON or a table. torch is imported only when
a benchmark runs. Every numeric option is checked where argparse reads it (`whole`,
`seconds_value`, `csv_counts`): NaN, infinity, fractions and out-of-range values are one
line and exit 2, never a traceback and never a sweep that skips every point for an
internal reason.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from ..bench import gpu_session, prefix_replay
from ..bench import results as bench_results
from ..bench.decode import run_decode, write_comparison
from ..bench.host_copy import run_transfer
from ..bench.ledger import run_ledger_grid
from ..bench.memory import run_memory
from ..bench.plan import plan_suite
from ..bench.recompute import run_recompute
from ..bench.suite import SHARES, run_suite
from ..decoder.config import (
    KV_DTYPES,
    MAX_TOKENS,
    PLACEMENTS,
    WEIGHT_DTYPES,
    check_choice,
    get_config,
)
from ..errors import KvlabError, check_number
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
from . import Parser
from .args import count, number, print_json, table

#: Bounds of the whole-number options (timed repeats, torch threads).
MAX_REPEATS = 1000
MAX_THREADS = 4096

#: A text table's column: (header, key of a point or a function of it, format spec).
Column = tuple[str, "str | Callable[[dict], object]", str]


def flag(*names: str, **kwargs) -> tuple[tuple[str, ...], dict]:
    """One argparse option, as a row of a benchmark's `flags`."""
    return names, kwargs


EXCLUSIVE = ("(one of)",)


def exclusive(*rows: tuple) -> tuple[tuple[str, ...], dict]:
    """Options of which at most one may be given, as one row of a benchmark's `flags`."""
    return EXCLUSIVE, {"rows": rows}


@dataclass(frozen=True)
class Benchmark:
    """One `kvlab bench` subcommand."""

    name: str
    help: str
    run: Callable  # (benchmark, args) -> exit status
    description: str = ""
    flags: tuple = ()  # its own options, `flag(...)` rows
    budget_s: float | None = None  # a timed sweep: the common options with this --budget
    runner: Callable | None = None  # the sweep's kvlab.bench function
    grid: Callable | None = None  # args -> the checked grid options (shared with --plan)
    columns: tuple[Column, ...] = ()  # the sweep's text table, one row per point
    points: Callable[[dict], list] = lambda r: r["points"]
    kernels: bool = False  # --kernels: which CPU decode kernels


# ------------------------------------------------------------------ argument types


def whole(minimum: int, maximum: int, what: str = "a whole number"):
    """An argparse type: a whole number (4k accepted) in minimum..maximum."""

    def parse(text: str) -> int:
        value = count(text)
        if not math.isfinite(value) or value != int(value) or not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(
                f"expected {what} in {minimum:,}..{maximum:,}, got {text!r}"
            )
        return int(value)

    return parse


def seconds_value(text: str) -> float:
    """An argparse type: a number of seconds > 0 (inf: no limit)."""
    value = number(text)
    if not value > 0:  # NaN fails too
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


def csv_counts(maximum: int, unit: str = ""):
    """An argparse type: '1k,4k,32k' -> [1024, 4096, 32768], each a whole number in 1..maximum."""
    limit = f"{maximum:,}{unit}"

    def parse(text: str) -> list[int]:
        out = []
        for part in text.split(","):
            value = count(part)
            if not math.isfinite(value) or value < 1 or value != int(value):
                raise argparse.ArgumentTypeError(
                    f"expected whole numbers >= 1 such as 1k,4k; got {part!r}"
                )
            if value > maximum:
                raise argparse.ArgumentTypeError(
                    f"{part.strip()} = {int(value):,} is above the limit of {limit}"
                )
            out.append(int(value))
        return out

    return parse


def csv_names(text: str) -> list[str]:
    return [t.strip().lower() for t in text.split(",") if t.strip()]


# ------------------------------------------------------------- the timed sweeps


SWEEP_FLAGS = (
    flag(
        "--device",
        default="auto",
        help="'cpu', 'cuda', 'cuda:1', or 'auto' (CUDA when present; default)",
    ),
    flag(
        "--quick",
        action="store_true",
        help="CI-sized run (seconds); writes <benchmark>-quick.json so real results are kept",
    ),
    flag(
        "--repeats",
        type=whole(1, MAX_REPEATS),
        help="timed repeats per point (default: 5 on CPU, more on CUDA)",
    ),
    flag(
        "--threads", type=whole(1, MAX_THREADS), help="torch CPU threads (default: torch's choice)"
    ),
    flag("--no-write", action="store_true", help="do not write results/<machine>/<benchmark>.json"),
    flag("--json", action="store_true", help="print the whole result as one JSON object"),
    flag(
        "--plan",
        metavar="DEVICE",
        help="print every point of the CUDA sweep with its bytes, predicted time and "
        "memory on catalogue device DEVICE (kvlab hardware, e.g. h200) and what "
        "the budget leaves out; runs and allocates nothing",
    ),
    flag(
        "--plan-link",
        default="pcie5-x16",
        metavar="LINK",
        help="host<->device link for --plan (kvlab hardware; default pcie5-x16)",
    ),
)
KERNELS_FLAG = flag(
    "--kernels",
    choices=("auto", "native", "torch"),
    default="auto",
    help="CPU decode kernels: kvlab's native C kernels (built with the system "
    "compiler), PyTorch's, or native where they build (default)",
)


def setup(args) -> str:
    """Resolve --device and --threads, and check the results folder; returns the torch device."""
    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise KvlabError(
            f"--device {device}: torch {torch.__version__} sees no CUDA device; use --device cpu"
        )
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise KvlabError(
            f"--device {device!r} is not a torch device; use cpu, cuda or cuda:N"
        ) from None
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise KvlabError(f"--device {device}: torch sees {count} CUDA device(s), numbered from 0")
    if dev.type not in ("cpu", "cuda"):
        raise KvlabError(f"--device {device!r}: kvlab benchmarks run on cpu or cuda[:N]")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if not args.no_write:
        bench_results.check_writable(device)  # before the work, not after it
    return device


def run_sweep(b: Benchmark, args) -> int:
    """One timed sweep: its plan (--plan), or its run, written and printed."""
    options = b.grid(args) if b.grid else {}
    if args.plan is not None:  # "" is a (bad) device name, not "no plan"
        return show_plan(args, (b.name,), {b.name: options} if b.grid else None)
    device = setup(args)
    if b.kernels:
        options["kernels"] = args.kernels
    if b.name == "decode":
        options.update(cuda_graph=not args.no_cuda_graph, compare_kernels=args.compare_kernels)
    r = b.runner(device, **options, repeats=args.repeats, budget_s=args.budget, quick=args.quick)
    kind = b.name
    if b.name == "decode":
        # PyTorch's kernels asked for on purpose: a comparison run, kept beside the main results
        if args.kernels == "torch" and not device.startswith("cuda"):
            kind = "decode-torch-kernels"
        path = write_comparison(r, device, write=not args.no_write)
        if path is not None:
            print(f"written: {path}", file=sys.stderr)
    return finish(args, kind, r, device, b)


def finish(args, kind: str, result: dict, device: str, b: Benchmark) -> int:
    """Write the result (unless --no-write), then print JSON or a table and where it went."""
    name = f"{kind}-quick" if result.get("quick") else kind
    path, failed = None, None
    if not args.no_write:
        try:
            path = bench_results.write_result(name, result, device)
        except OSError as exc:  # checked before the run; the disk may still fill up
            failed = exc
    if path is not None:
        result["written_to"] = str(path)
    if args.json:
        print_json(result)
    else:
        rows = [[_cell(p, key, spec) for _, key, spec in b.columns] for p in b.points(result)]
        if rows:
            print(table(rows, [header for header, _, _ in b.columns]))
        if path is not None:
            print(f"written: {path}", file=sys.stderr)
    if failed is not None:  # the result is printed above: nothing measured is lost
        raise KvlabError(f"the result above could not be saved: {failed}")
    return 0


def _cell(point: dict, key, spec: str) -> str:
    value = key(point) if callable(key) else point[key]
    return format(value, spec) if spec else str(value)


def show_plan(args, only: tuple[str, ...], options: dict | None = None) -> int:
    """--plan: print what the run would do on the named catalogue device; nothing runs."""
    plan = plan_suite(
        args.plan,
        args.plan_link,
        budget_s=args.budget,
        quick=args.quick,
        only=only,
        repeats=args.repeats,
        options=options,
    )
    if args.json:
        print_json(plan)
    else:
        print(render_plan(plan))
    return 0


def render_plan(plan: dict) -> str:
    """A plan as text: one table per benchmark, a total line."""

    def note(p):
        if p["refused"]:
            return f"refused: {p['refused']}"
        return "beyond budget" if p["beyond_budget"] else ""

    unlimited = not math.isfinite(plan["budget_s"])
    budget = "unlimited" if unlimited else seconds(plan["budget_s"])
    lines = [
        f"plan on {plan['device_name']} ({si(plan['bandwidth_bytes_per_s'], 'B/s')}, "
        f"{plan['flops_per_s'] / 1e12:.0f} TFLOP/s bf16, {si(plan['capacity_bytes'], 'B')}), "
        f"link {plan['link']} ({si(plan['link_bytes_per_s'], 'B/s')}); "
        f"budget {budget}; {plan['basis']}"
    ]
    for b in plan["benchmarks"]:
        rows = [
            [
                p["point"],
                si(p["bytes"], "B"),
                "-" if p["predicted_s"] is None else seconds(p["predicted_s"]),
                si(p["device_bytes"], "B"),
                si(p["host_bytes"], "B"),
                seconds(p["wall_s"]),
                note(p),
            ]
            for p in b["points"]
        ]
        runs = sum(1 for p in b["points"] if not p["refused"] and not p["beyond_budget"])
        lines += [
            "",
            f"{b['benchmark']}: {runs} of {len(b['points'])} points, about "
            f"{seconds(b['wall_s'])}"
            + (f" of its {seconds(b['allowance_s'])}" if math.isfinite(b["allowance_s"]) else ""),
            table(rows, ["point", "bytes", "predicted", "device mem", "host mem", "wall", "note"]),
        ]
    lines += [
        "",
        f"total: about {seconds(plan['wall_s'])}"
        + ("" if unlimited else f" of the {budget} budget"),
    ]
    return "\n".join(lines)


def decode_grid(args) -> dict:
    """The decode sweep's grid overrides from the arguments, checked (shared with --plan)."""
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


def recompute_grid(args) -> dict:
    """The recompute-vs-fetch sweep's presets, token counts and dtypes, checked."""
    for name in args.presets or ():
        get_config(name)
    check_choice("weight dtype", args.weight_dtype, WEIGHT_DTYPES)
    check_choice("kv dtype", args.kv_dtype, KV_DTYPES)
    return {
        "presets": args.presets,
        "tokens": args.tokens,
        "weight_dtype": args.weight_dtype.lower(),
        "kv_dtype": args.kv_dtype.lower(),
    }


def _ms(key: str):
    return lambda p: p[key] * 1e3


def _gb_per_s(key: str):
    return lambda p: p[key] / 1e9


#: A point's spread over its repeats: interquartile range / median.
SPREAD: Column = ("spread", "spread", ".0%")


def copy_columns(labels: tuple[str, ...], gb_spec: str) -> tuple[Column, ...]:
    """The copy sweeps' table (memory, transfer): what was copied, MiB, GB/s, spread."""
    size = ("MiB", lambda p: p["size_bytes"] / 2**20, ".0f")
    rate = ("GB/s", _gb_per_s("bandwidth_bytes_per_s"), gb_spec)
    return (*((label, label, "") for label in labels), size, rate, SPREAD)


# ------------------------------------------------------------------- the suites


def run_suites(b: Benchmark, args) -> int:
    """`all` / `gpu-suite`: every sweep, bounded in time; exit 1 when one is refused or breaks."""
    names = tuple(name for name, _ in SHARES)
    for name in args.only or ():
        if name not in names:
            raise KvlabError(f"--only: unknown benchmark {name!r}; choose from {', '.join(names)}")
    only = tuple(args.only) if args.only else None
    if args.plan is not None:  # "" is a (bad) device name, not "no plan"
        return show_plan(args, only or names)
    import torch

    if b.name == "gpu-suite" and args.device == "auto":
        if not torch.cuda.is_available():
            raise KvlabError(
                "gpu-suite needs a CUDA device and torch sees none; "
                "run 'kvlab bench all' for this machine"
            )
        args.device = "cuda"
    device = setup(args)
    out = run_suite(
        device,
        args.budget,
        quick=args.quick,
        repeats=args.repeats,
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


ALL_HELP = "every benchmark on this machine (memory, transfer, recompute-vs-fetch, decode)"
GPU_SUITE_HELP = (
    "every benchmark on a CUDA device, sized to finish in under 10 minutes (make bench-gpu)"
)
SUITE_NOTE = "; each result is written as soon as its benchmark finishes."
ONLY_FLAG = flag(
    "--only",
    type=csv_names,
    metavar="NAMES",
    help="run only these, e.g. decode or memory,transfer (a rerun of what a first run left out)",
)


# ------------------------------------------------------- the ledger's own speed


def run_ledger(b: Benchmark, args) -> int:
    points = check_number(
        "--points", args.points, minimum=100, allow_equal_min=True, maximum=1e8, integer=True
    )
    loop = args.loop_points
    if loop is not None:
        loop = check_number(
            "--loop-points", loop, minimum=1, allow_equal_min=True, maximum=points, integer=True
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


def run_prefix_replay(b: Benchmark, args) -> int:
    """A trace's LRU replay, kvlab's against a plain OrderedDict's: a table or JSON."""
    r = prefix_replay.replay_speed(args.trace, args.capacities, args.repeats)
    if args.json:
        print_json(r)
        return 0
    rows = [
        [
            cap,
            seconds(c["kvlab_s"]),
            seconds(c["ordered_dict_s"]),
            f"{c['ordered_dict_s'] / c['kvlab_s']:.2f}x",
            f"{c['block_hit_ratio']:.1%}",
            "yes" if c["hits_agree"] else "NO",
        ]
        for cap, c in r["capacities"].items()
    ]
    header = ["capacity", "kvlab", "OrderedDict", "speed-up", "block hits", "hits agree"]
    print(f"{r['trace']}: {r['requests']:,} requests, median of {r['repeats']} replays")
    print(table(rows, header))
    return 0


# ----------------------------------------------------------------- KV transfer


def kv_transfer_configs(args) -> list:
    """One TransferConfig per engine from the parsed arguments (validated)."""
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
    for flag_name, field in (
        ("seconds_per_size", "seconds_per_size"),
        ("timeout", "timeout_s"),
        ("time_limit", "time_limit_s"),
    ):
        if getattr(args, flag_name) is not None:
            changes[field] = getattr(args, flag_name)
    engines = ("torch", "mooncake") if args.engine == "all" else (args.engine,)
    if args.engine == "all" and importlib.util.find_spec("mooncake") is None:
        print(
            "kvlab bench kv-transfer: Mooncake is not installed (pip install "
            "mooncake-transfer-engine-non-cuda); running torch.distributed only",
            file=sys.stderr,
        )
        engines = ("torch",)
    return [replace(base, engine=engine, **changes).validate() for engine in engines]


def kv_transfer_command(args) -> str:
    """The command that reproduces this run (recorded with the results)."""
    parts = ["kvlab", "bench", "kv-transfer", "--engine", args.engine, "--device", args.device]
    defaults = {"layout": "both", "completion": "notify"}
    for name in ("layout", "sizes", "block_bytes", "repeats", "seconds_per_size", "completion"):
        value = getattr(args, name)
        if value is not None and value != defaults.get(name):
            parts += [f"--{name.replace('_', '-')}", str(value)]
    if args.quick:
        parts.append("--quick")
    return " ".join(parts)


def run_kv_transfer(b: Benchmark, args) -> int:
    configs = kv_transfer_configs(args)
    save = (not args.quick) if args.save is None else args.save
    if save:
        bench_results.check_writable(None)  # before the transfers run, not after
    result = run_benchmark(configs)
    if not result:  # the decode rank under torchrun: rank 0 reports
        return 0
    if save:
        result["saved_to"] = str(save_results(result, kv_transfer_command(args)))
    if args.json:
        print_json(result)
    else:
        print(render_kv_transfer(result))
    return 0


KV_TRANSFER_COLUMNS = (
    ("layout", "layout", ""),
    ("size", lambda r: format_size(r["bytes"]), ""),
    ("blocks", "blocks", ""),
    ("reps", "repeats", ""),
    ("median", lambda r: seconds(r["time_s"]["median"]), ""),
    ("p10 - p90", lambda r: f"{seconds(r['time_s']['p10'])} - {seconds(r['time_s']['p90'])}", ""),
    ("bandwidth", lambda r: si(r["bandwidth_bytes_per_s"]["median"], "B/s"), ""),
    ("checksum", lambda r: "ok" if r["checksum_ok"] else "MISMATCH", ""),
)


def render_kv_transfer(result: dict) -> str:
    env = result["environment"]
    lines = [
        f"kvlab bench kv-transfer on {env['device_name']} ({env['cpu_count']} CPUs, "
        f"torch {env.get('torch')})"
    ]
    for label, entry in result["engines"].items():
        rows = [
            [_cell(r, key, spec) for _, key, spec in KV_TRANSFER_COLUMNS] for r in entry["rows"]
        ]
        lines += [
            "",
            f"{label}  (time = KV pushed + acknowledgement received; {entry['wall_s']:.1f} s)",
            table(rows, [header for header, _, _ in KV_TRANSFER_COLUMNS]),
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


# ------------------------------------------------------------ the GPU session


def check_gpu_session(args) -> None:
    """What argparse cannot check, before any step runs: a bad OUT costs a line, not a
    session's device time."""
    if not args.deadline < float("inf"):
        raise KvlabError(f"--deadline must be a finite number of seconds, got {args.deadline:g}")
    if not args.only and args.only is not None:
        raise KvlabError("--only names no benchmark")
    args.out = gpu_session.check_out(args.out)


def run_gpu_session(b: Benchmark, args) -> int:
    """The session (kvlab.bench.gpu_session); exit 1 when one of its steps failed."""
    check_gpu_session(args)
    return gpu_session.main(args)


# ------------------------------------------------------------------- the table


BENCHMARKS = (
    Benchmark(
        "kv-transfer",
        "move KV blocks from a prefill to a decode process (torch.distributed, Mooncake)",
        run_kv_transfer,
        description="Move KV blocks (contiguous and paged) from a 'prefill' to a 'decode' "
        "process and measure time and bandwidth. Engines: torch.distributed (gloo over TCP on "
        "CPU, NCCL on GPUs) and the Mooncake Transfer Engine (one-sided writes, P2P "
        "handshake). Sizes are binary: 4k = 4096 bytes, 512M = 512 MiB. Full runs merge into "
        "results/<machine>/kv_transfer.json; --quick runs save only with --save. Across "
        "nodes, run it under torchrun (see kvlab.kv_transfer.torchrun).",
        flags=(
            flag(
                "--engine",
                choices=("all", "torch", "mooncake"),
                default="all",
                help="which engine(s) to run (default all)",
            ),
            flag(
                "--device", default="cpu", help="where the KV buffers live: cpu (default) or cuda"
            ),
            flag(
                "--layout",
                choices=("both", "contiguous", "paged"),
                default="both",
                help="one contiguous buffer, or fixed-size blocks gathered through a block "
                "table (default both)",
            ),
            flag(
                "--sizes",
                help="comma-separated transfer sizes, e.g. 4k,1M,512M (default 4 KiB..512 MiB)",
            ),
            flag(
                "--block-bytes",
                help="paged layout: bytes per block (default 64k = 16 tokens "
                "x one layer's K and V of the article's 7B)",
            ),
            flag(
                "--repeats", type=int, help="maximum timed repeats per case (default 200; quick 5)"
            ),
            flag(
                "--seconds-per-size",
                type=number,
                help="time budget of each case's timed loop (default 2)",
            ),
            flag(
                "--timeout",
                type=number,
                help="bound on every blocking wait in the two processes, s (default 60)",
            ),
            flag(
                "--time-limit",
                type=number,
                help="bound on the whole run per engine, s (default 900)",
            ),
            flag(
                "--completion",
                choices=("notify", "flag"),
                default="notify",
                help="Mooncake completion signal: TransferNotify (default) or a one-sided "
                "doorbell write",
            ),
            flag(
                "--mooncake-protocol",
                default="tcp",
                help="Mooncake transport: tcp (default) or rdma",
            ),
            flag(
                "--host",
                default="127.0.0.1",
                help="address to bind and advertise (default 127.0.0.1)",
            ),
            flag("--threads", type=int, default=1, help="torch threads per process (default 1)"),
            flag(
                "--quick",
                action="store_true",
                help="3 small sizes, few repeats: a smoke test in seconds",
            ),
            exclusive(
                flag(
                    "--save",
                    dest="save",
                    action="store_true",
                    default=None,
                    help="write results/<machine>/kv_transfer.json (default for full runs)",
                ),
                flag("--no-save", dest="save", action="store_false", help="do not write results"),
            ),
            flag("--json", action="store_true", help="print one JSON object"),
            flag("--inject-fault", help=argparse.SUPPRESS),  # tests: decode:exit@1, prefill:hang@0
        ),
    ),
    Benchmark(
        "memory",
        "device copy bandwidth (STREAM-like) and matmul FLOP/s",
        run_sweep,
        description="Copy, read and write bandwidth over several array sizes "
        "(median of repeats), and the matmul rate: the figures the ledger is fed.",
        budget_s=120,
        runner=run_memory,
        columns=copy_columns(("kernel",), ".1f"),
    ),
    Benchmark(
        "transfer",
        "host<->device copy bandwidth, pinned and pageable (CUDA)",
        run_sweep,
        description="Host -> device and device -> host copies of several sizes from "
        "pinned and pageable memory (on a CPU-only machine: host -> host copies).",
        budget_s=120,
        runner=run_transfer,
        columns=copy_columns(("direction", "memory"), ".2f"),
    ),
    Benchmark(
        "decode",
        "decode step: measured vs the ledger, over batch x context x placement x KV dtype",
        run_sweep,
        description="Times one decode step of the toy decoder for every point of "
        "the sweep and compares it with the ledger fed this machine's measured "
        "bandwidth and matmul rate.",
        budget_s=900,
        runner=run_decode,
        grid=decode_grid,
        kernels=True,
        flags=(
            flag(
                "--preset",
                help="decoder preset: tiny, small, cpu-bench, gpu-bench, mha-small "
                "(default: cpu-bench on CPU, gpu-bench on CUDA, small with --quick on CPU)",
            ),
            flag(
                "--batches",
                type=csv_counts(MAX_TOKENS, " sequences"),
                help="comma-separated, e.g. 1,8",
            ),
            flag(
                "--contexts",
                help="comma-separated, e.g. 1k,4k,32k",
                type=csv_counts(MAX_TOKENS, " tokens (the KV cache's limit)"),
            ),
            flag("--placements", type=csv_names, help="device,host"),
            flag("--kv-dtypes", type=csv_names, help="from fp32,bf16,fp16,int8,fp8"),
            flag("--weight-dtype", help="fp32, bf16, fp16 or int8 (weight-only)"),
            flag(
                "--prefetch",
                choices=("off", "on", "both"),
                help="host placement: prefetch the next layer on a CUDA stream (default: "
                "both on CUDA; off on CPU)",
            ),
            flag(
                "--no-cuda-graph",
                action="store_true",
                help="run device-placement steps eagerly on CUDA",
            ),
            flag(
                "--compare-kernels",
                action="store_true",
                help="CPU with kvlab's kernels: also time every device-placement point with "
                "PyTorch's kernels, right after (writes decode-torch-kernels.json too)",
            ),
        ),
        columns=(
            ("placement", lambda p: p["placement"] + ("+pf" if p["prefetch"] else ""), ""),
            ("kv", "kv_dtype", ""),
            ("batch", "batch", ""),
            ("context", "context", ""),
            ("measured ms", _ms("measured_step_s"), ".2f"),
            ("ledger ms", _ms("predicted_step_s"), ".2f"),
            ("error", "error", "+.1%"),
            ("kernels error", lambda p: p.get("kernels_error", float("nan")), "+.1%"),
            ("GB/s", _gb_per_s("achieved_bytes_per_s"), ".1f"),
            ("of copy", "fraction_of_bandwidth", ".0%"),
            SPREAD,
        ),
    ),
    Benchmark(
        "recompute-vs-fetch",
        "time to prefill N tokens vs to fetch their KV from host memory",
        run_sweep,
        description="For a range of N: one prefill of N tokens on the device "
        "against copying their KV (every layer) from host memory; reports where the "
        "curves cross.",
        budget_s=600,
        runner=run_recompute,
        grid=recompute_grid,
        kernels=True,
        flags=(
            flag("--presets", type=csv_names, help="decoder presets, e.g. cpu-bench,mha-small"),
            flag(
                "--tokens",
                type=csv_counts(MAX_TOKENS, " tokens"),
                help="comma-separated N, e.g. 16,256,4k",
            ),
            flag("--weight-dtype", default="bf16", help="fp32, bf16, fp16 or int8 (default bf16)"),
            flag("--kv-dtype", default="bf16", help="fp32, bf16, fp16, int8 or fp8 (default bf16)"),
        ),
        columns=(
            ("preset", "preset", ""),
            ("tokens", "tokens", ""),
            ("recompute ms", _ms("recompute_s"), ".3f"),
            ("fetch ms", _ms("fetch_s"), ".3f"),
            ("ledger recompute ms", _ms("predicted_recompute_s"), ".3f"),
            ("ledger fetch ms", _ms("predicted_fetch_s"), ".3f"),
        ),
        points=lambda r: [{**p, "preset": c["preset"]} for c in r["curves"] for p in c["points"]],
    ),
    Benchmark(
        "all",
        ALL_HELP,
        run_suites,
        description=ALL_HELP + SUITE_NOTE,
        budget_s=1800,
        flags=(ONLY_FLAG,),
    ),
    Benchmark(
        "gpu-suite",
        GPU_SUITE_HELP,
        run_suites,
        description=GPU_SUITE_HELP + SUITE_NOTE,
        budget_s=480,
        flags=(ONLY_FLAG,),
    ),
    Benchmark(
        "gpu-session",
        "one bounded run on a borrowed GPU: facts, plan, suite, GPU tests, findings, all "
        "into one folder (make gpu-session OUT=...)",
        run_gpu_session,
        description="Measure a CUDA machine in one call that stays inside --deadline and "
        "leaves everything in --out: facts, plan, suite, pytest -m gpu, findings (made for a "
        "borrowed GPU from which only one folder comes back; see kvlab.bench.gpu_session).",
        flags=(
            flag("--out", required=True, type=Path, help="the folder that comes back ($OUT)"),
            flag(
                "--deadline",
                type=seconds_value,
                default=420.0,
                help="seconds the whole session may take (default 420: fits a 480 s call)",
            ),
            flag(
                "--budget",
                type=seconds_value,
                default=300.0,
                help="the suite's time budget, trimmed to what the deadline leaves (default 300)",
            ),
            flag("--device", default="cuda", help="the CUDA device to measure (default cuda)"),
            flag(
                "--only",
                type=csv_names,
                help="run only these benchmarks, e.g. decode (a rerun)",
            ),
            flag(
                "--tests",
                nargs="*",
                default=list(gpu_session.GPU_TESTS),
                help="test files for pytest -m gpu, from the current folder (default: kvlab's "
                "GPU tests, where they are here)",
            ),
            flag(
                "--dry-run",
                action="store_true",
                help="no CUDA needed: the suite runs on the CPU in quick mode (checks the session)",
            ),
        ),
    ),
    Benchmark(
        "ledger",
        "time the ledger over a slider grid: one vectorised call vs a Python loop",
        run_ledger,
        flags=(
            flag("--points", type=count, default=100_000, help="grid points (default 100,000)"),
            flag("--loop-points", type=count, help="points for the Python loop (default: all)"),
            flag("--json", action="store_true", help="print one JSON object"),
        ),
    ),
    Benchmark(
        "prefix-replay",
        "how fast a trace replays: kvlab's LRU prefix cache against a plain OrderedDict",
        run_prefix_replay,
        description=prefix_replay.__doc__.split("\n\n")[0],
        flags=(
            flag("trace", nargs="?", default="conversation", help="a trace (default conversation)"),
            flag(
                "--capacities",
                type=csv_counts(10**12, " blocks"),
                default="1000,10000,100000",
                help="cache sizes in blocks (default 1000,10000,100000)",
            ),
            flag(
                "--repeats", type=whole(1, MAX_REPEATS), default=5, help="timed replays (default 5)"
            ),
            flag("--json", action="store_true", help="print one JSON object"),
        ),
    ),
)


def register(sub) -> None:
    p = sub.add_parser("bench", help="microbenchmarks: results as JSON under results/<machine>/")
    bench = p.add_subparsers(dest="benchmark", metavar="BENCHMARK", parser_class=Parser)
    bench.required = True
    for b in BENCHMARKS:
        q = bench.add_parser(b.name, help=b.help, description=b.description or None)
        flags = b.flags
        if b.budget_s is not None:
            budget = flag(
                "--budget",
                type=seconds_value,
                default=b.budget_s,
                metavar="SECONDS",
                help=f"stop starting new points after this long (default {b.budget_s:g} s)",
            )
            extra = (KERNELS_FLAG,) if b.kernels else ()
            flags = (*extra, *SWEEP_FLAGS[:3], budget, *SWEEP_FLAGS[3:], *flags)
        for names, kwargs in flags:
            if names == EXCLUSIVE:
                group = q.add_mutually_exclusive_group()
                for row_names, row_kwargs in kwargs["rows"]:
                    group.add_argument(*row_names, **row_kwargs)
            else:
                q.add_argument(*names, **kwargs)
        q.set_defaults(func=lambda args, b=b: b.run(b, args))

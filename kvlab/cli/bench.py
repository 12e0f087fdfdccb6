"""`kvlab bench BENCHMARK ...`: this machine's benchmarks, one row of BENCHMARKS each.

A row is data: its options, one a line as `--help` shows them (`add_options`), the checks
run before anything starts, what runs it and how its result prints. One path (`command`)
serves every row: check; then --plan, or resolve the device, check the results folder
before the work, run, write results/<machine>/<benchmark>.json (the timed sweeps) and print
JSON or text. torch is imported only when a benchmark runs. Every numeric option is checked
where argparse reads it (`whole`, `seconds_value`, `csv_counts`): NaN, infinity, fractions
and out-of-range values are one line and exit 2, never a traceback and never a sweep that
skips every point for an internal reason.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import re
import sys
import textwrap
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from .. import kv_transfer
from ..bench import decode, gpu_session, host_copy, memory, prefix_replay, recompute, suite
from ..bench import results as bench_results
from ..bench.ledger import run_ledger_grid
from ..bench.plan import plan_suite
from ..decoder import config
from ..errors import KvlabError, check_number
from ..fmt import seconds, si
from . import Parser
from .args import count, number, print_json, table

#: Bounds of the whole-number options (timed repeats, torch threads).
MAX_REPEATS = 1000
MAX_THREADS = 4096

#: A text table's column: (header, key of a row or a function of it that formats it).
Column = tuple[str, "str | Callable[[dict], str]"]

#: The benchmarks `all` and `gpu-suite` run, in order.
SUITE = tuple(name for name, _ in suite.SHARES)


# ------------------------------------------------------------------ options


def whole(minimum: int, maximum: int):
    """An argparse type: a whole number (4k accepted) in minimum..maximum."""

    def parse(text: str) -> int:
        value = count(text)
        if not math.isfinite(value) or value != int(value) or not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(
                f"expected a whole number in {minimum:,}..{maximum:,}, got {text!r}"
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
                    f"{part.strip()} = {int(value):,} is above the limit of {maximum:,}{unit}"
                )
            out.append(int(value))
        return out

    return parse


def csv_names(text: str) -> list[str]:
    return [t.strip().lower() for t in text.split(",") if t.strip()]


#: The value types an option line may name.
TYPES = {
    "int": int,
    "number": number,
    "count": count,
    "seconds": seconds_value,
    "repeats": whole(1, MAX_REPEATS),
    "threads": whole(1, MAX_THREADS),
    "names": csv_names,
    "path": Path,
    "sequences": csv_counts(config.MAX_TOKENS, " sequences"),
    "contexts": csv_counts(config.MAX_TOKENS, " tokens (the KV cache's limit)"),
    "tokens": csv_counts(config.MAX_TOKENS, " tokens"),
    "blocks": csv_counts(10**12, " blocks"),
}
#: The option-line words that stand for argparse settings.
WORDS = {
    "!": {"action": "store_true"},
    "store_false": {"action": "store_false"},
    "?": {"nargs": "?"},
    "*": {"nargs": "*"},
    "required": {"required": True},
    "or": {},
}
PREFIXED = {"{": "choices", "=": "default", "<": "metavar", ">": "dest"}


def add_options(parser, spec: str) -> None:
    """Add the options of `spec`, one a line: `NAME [WORD ...]: help`. A WORD is a TYPES key,
    one of WORDS (! a switch; ? or * how many values; `or`: this option or the next, never
    both), {a,b} (the choices), =DEFAULT (a number where it reads as one), <METAVAR> or
    >DEST. An indented line goes on with the help above (blocks apart by a blank line are
    dedented each on its own); help `-` hides the option."""
    spec = "\n".join(textwrap.dedent(block) for block in spec.split("\n\n"))
    group = None
    for line in filter(str.strip, re.sub(r"\n[ \t]+", " ", spec).split("\n")):
        head, text = line.split(": ", 1)
        name, *words = head.split()
        kwargs = {"help": argparse.SUPPRESS if text == "-" else text}
        for word in words:
            if word in TYPES:
                kwargs["type"] = TYPES[word]
            elif word in WORDS:
                kwargs.update(WORDS[word])
            else:  # KeyError: a word this grammar does not have
                value = word[1:-1] if word[0] in "{<" else _default(word[1:])
                kwargs[PREFIXED[word[0]]] = tuple(value.split(",")) if word[0] == "{" else value
        if "or" in words and group is None:
            group = parser.add_mutually_exclusive_group()
        (group or parser).add_argument(name, **kwargs)
        group = group if "or" in words else None


def _default(text: str):
    if text.isdigit():
        return int(text)
    return float(text) if re.fullmatch(r"\d+\.\d*", text) else text


#: The timed sweeps' and the suites' common options (BUDGET: the benchmark's own).
SWEEP_OPTIONS = """
--device =auto: 'cpu', 'cuda', 'cuda:1', or 'auto' (CUDA when present; default)
--quick !: CI-sized run (seconds); writes <benchmark>-quick.json so real results are kept
--repeats repeats: timed repeats per point (default: 5 on CPU, more on CUDA)
--budget seconds =BUDGET <SECONDS>: stop starting new points after this long (default BUDGET s)
--threads threads: torch CPU threads (default: torch's choice)
--no-write !: do not write results/<machine>/<benchmark>.json
--json !: print the whole result as one JSON object
--plan <DEVICE>: print every point of the CUDA sweep with its bytes, predicted time and memory
    on catalogue device DEVICE (kvlab hardware, e.g. h200) and what the budget leaves out;
    runs and allocates nothing
--plan-link =pcie5-x16 <LINK>: host<->device link for --plan (kvlab hardware; default pcie5-x16)
"""
KERNELS_OPTION = """
--kernels {auto,native,torch} =auto: CPU decode kernels: kvlab's native C kernels (built with
    the system compiler), PyTorch's, or native where they build (default)
"""


# ------------------------------------------------------------------ the one path


@dataclass(frozen=True)
class Benchmark:
    """One `kvlab bench` subcommand."""

    name: str
    help: str
    options: str = ""  # its own options (add_options)
    description: str = ""
    budget_s: float | None = None  # a sweep or a suite (SWEEP_OPTIONS): its --budget
    check: Callable = lambda args: {}  # args -> what `run` needs, checked before it runs
    run: Callable | None = None  # (args, device, checked) -> result, exit status or None
    after: Callable | None = None  # (result, device, args) -> the name a sweep is written as
    text: Callable = lambda result: ""  # the result as text (JSON with --json)
    status: Callable = lambda result: 0  # the exit status of a result
    needs_cuda: str = ""  # what --device auto says without CUDA (else it picks the CPU)


def command(b: Benchmark, args) -> int:
    """Every benchmark's one path: check; --plan, or run, write and print."""
    checked = b.check(args)
    if getattr(args, "plan", None) is not None:  # "" is a (bad) device name, not "no plan"
        only = (b.name,) if b.name in SUITE else args.only or SUITE
        plan = plan_suite(
            args.plan,
            args.plan_link,
            budget_s=args.budget,
            quick=args.quick,
            only=only,
            repeats=args.repeats,
            options={b.name: checked},
        )
        return show(args, plan, render_plan)
    device = setup(b, args) if b.budget_s is not None else None
    if not getattr(args, "no_write", True):
        bench_results.check_writable(device)  # before the work, not after it
    result = b.run(args, device, checked)
    if not isinstance(result, dict) or not result:  # printed its own, or nothing to print
        return result or 0
    path = failed = None
    if b.name in SUITE:  # a timed sweep: its result is written here
        kind = b.after(result, device, args) if b.after else b.name
        try:
            name = f"{kind}-quick" if result.get("quick") else kind
            if not args.no_write:
                path = bench_results.write_result(name, result, device)
                result["written_to"] = str(path)
        except OSError as exc:  # checked before the run; the disk may still fill up
            failed = exc
    status = show(args, result, b.text, b.status(result))
    if path is not None and not args.json:
        print(f"written: {path}", file=sys.stderr)
    if failed is not None:  # the result is printed above: nothing measured is lost
        raise KvlabError(f"the result above could not be saved: {failed}")
    return status


def show(args, result: dict, text: Callable, status: int = 0) -> int:
    """Print a result: one JSON object with --json, else its text (where it has any)."""
    if args.json:
        print_json(result)
    elif shown := text(result):
        print(shown)
    return status


def setup(b: Benchmark, args) -> str:
    """Resolve --device and --threads; returns the torch device."""
    import torch

    cuda, device = torch.cuda.is_available(), args.device
    if device == "auto":
        if b.needs_cuda and not cuda:
            raise KvlabError(b.needs_cuda)
        device = "cuda" if cuda else "cpu"
    if device.startswith("cuda") and not cuda:
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
    return device


def rows_text(columns: tuple[Column, ...], rows: list[dict]) -> str:
    """Rows as a text table of `columns`."""
    cells = [[key(row) if callable(key) else row[key] for _, key in columns] for row in rows]
    return table(cells, [header for header, _ in columns])


def columns_text(columns: tuple[Column, ...], rows: Callable = lambda r: r["points"]):
    """A sweep's text: the table of `columns` over its rows (nothing when it has none)."""
    return lambda result: rows_text(columns, rows(result)) if rows(result) else ""


PLAN_COLUMNS: tuple[Column, ...] = (
    ("point", "point"),
    ("bytes", lambda p: si(p["bytes"], "B")),
    ("predicted", lambda p: "-" if p["predicted_s"] is None else seconds(p["predicted_s"])),
    ("device mem", lambda p: si(p["device_bytes"], "B")),
    ("host mem", lambda p: si(p["host_bytes"], "B")),
    ("wall", lambda p: seconds(p["wall_s"])),
    ("note", lambda p: f"refused: {p['refused']}" if p["refused"] else _budget_note(p)),
)


def _budget_note(point: dict) -> str:
    return "beyond budget" if point["beyond_budget"] else ""


def render_plan(plan: dict) -> str:
    """A plan as text: one table per benchmark, a total line."""
    unlimited = not math.isfinite(plan["budget_s"])
    budget = "unlimited" if unlimited else seconds(plan["budget_s"])
    lines = [
        f"plan on {plan['device_name']} ({si(plan['bandwidth_bytes_per_s'], 'B/s')}, "
        f"{plan['flops_per_s'] / 1e12:.0f} TFLOP/s bf16, {si(plan['capacity_bytes'], 'B')}), "
        f"link {plan['link']} ({si(plan['link_bytes_per_s'], 'B/s')}); "
        f"budget {budget}; {plan['basis']}"
    ]
    for b in plan["benchmarks"]:
        runs = sum(1 for p in b["points"] if not p["refused"] and not p["beyond_budget"])
        of = f" of its {seconds(b['allowance_s'])}" if math.isfinite(b["allowance_s"]) else ""
        head = f"{b['benchmark']}: {runs} of {len(b['points'])} points, about "
        lines += ["", f"{head}{seconds(b['wall_s'])}{of}", rows_text(PLAN_COLUMNS, b["points"])]
    total = "" if unlimited else f" of the {budget} budget"
    return "\n".join([*lines, "", f"total: about {seconds(plan['wall_s'])}{total}"])


# ------------------------------------------------------------- the timed sweeps


def sweep(runner: Callable, *passed: str) -> Callable:
    """A timed sweep's run: `runner` (kvlab.bench) given the checked grid and the options
    `passed` as they are."""
    return lambda args, device, checked: runner(
        device,
        **checked,
        **{dest: getattr(args, dest) for dest in passed},
        repeats=args.repeats,
        budget_s=args.budget,
        quick=args.quick,
    )


def grid(**checks: Callable | None) -> Callable:
    """A sweep's check: its grid options (shared with --plan), each through its check."""
    return lambda args: {
        dest: check(getattr(args, dest)) if check else getattr(args, dest)
        for dest, check in checks.items()
    }


def names(kind: str, valid=(), *, lower: bool = False, optional: bool = False) -> Callable:
    """A grid option's check: its name, or each of its names, must be in `valid` (a decoder
    preset without it); the value goes on (a name lower-cased with `lower`; one not given
    unchecked with `optional`, while an empty name is refused like any unknown one)."""

    def grid_value(value):
        if optional and value is None:
            return value
        for name in [value] if isinstance(value, str) else value or ():
            if valid:
                config.check_choice(kind, name, valid)
            else:
                config.get_config(name)
        return value.lower() if lower and isinstance(value, str) else value

    return grid_value


def decode_after(result: dict, device: str, args) -> str:
    """Decode writes its kernel comparison beside it; a run with PyTorch's kernels asked for
    on purpose (a comparison run) is kept beside the main results."""
    path = decode.write_comparison(result, device, write=not args.no_write)
    if path is not None:
        print(f"written: {path}", file=sys.stderr)
    torch_kernels = args.kernels == "torch" and not device.startswith("cuda")
    return "decode-torch-kernels" if torch_kernels else "decode"


def num(key: str, spec: str, times: float = 1, per: float = 1) -> Callable[[dict], str]:
    """A column of numbers: a row's `key` x `times` / `per`, formatted with `spec`."""
    return lambda row: format(row[key] * times / per, spec)


#: A point's spread over its repeats: interquartile range / median.
SPREAD: Column = ("spread", num("spread", ".0%"))


def copy_columns(labels: tuple[str, ...], gb_spec: str) -> tuple[Column, ...]:
    """The copy sweeps' table (memory, transfer): what was copied, MiB, GB/s, spread."""
    size = ("MiB", num("size_bytes", ".0f", per=2**20))
    rate = ("GB/s", num("bandwidth_bytes_per_s", gb_spec, per=1e9))
    return (*((label, label) for label in labels), size, rate, SPREAD)


# ------------------------------------------------------------ the other benchmarks


def check_suite(args) -> dict:
    """--only: names from SUITE (a tuple, or None for all)."""
    for name in args.only or ():
        if name not in SUITE:
            raise KvlabError(f"--only: unknown benchmark {name!r}; choose from {', '.join(SUITE)}")
    args.only = tuple(args.only) if args.only else None
    return {}


def run_suite(args, device: str, checked) -> dict:
    write = not args.no_write
    return suite.run_suite(device, args.budget, args.quick, args.repeats, write, args.only)


def suite_row(name: str, help_text: str, budget_s: float = 1800, needs_cuda: str = ""):
    """`all` / `gpu-suite`: every sweep, bounded in time; exit 1 when one is refused or breaks."""
    return Benchmark(
        name,
        help_text,
        SWEEP_OPTIONS
        + """--only names <NAMES>: run only these, e.g. decode or memory,transfer (a rerun of
            what a first run left out)""",
        help_text + "; each result is written as soon as its benchmark finishes.",
        budget_s,
        check=check_suite,
        run=run_suite,
        text=lambda out: "\n".join(f"{k}: {s.get('written_to') or s}" for k, s in out.items()),
        status=lambda out: int(any("error" in s or "refused" in s for s in out.values())),
        needs_cuda=needs_cuda,
    )


def check_ledger(args) -> dict:
    points = check_number(
        "--points", args.points, minimum=100, allow_equal_min=True, maximum=1e8, integer=True
    )
    loop = args.loop_points
    if loop is not None:
        loop = check_number(
            "--loop-points", loop, minimum=1, allow_equal_min=True, maximum=points, integer=True
        )
    return {"points": points, "loop": loop}


def ledger_text(r: dict) -> str:
    return (
        f"{r['points']:,} points vectorised: {seconds(r['vectorised_s'])} "
        f"({r['vectorised_ns_per_point']:.0f} ns a point)\n"
        f"{r['loop_points']:,} points in a Python loop: {seconds(r['loop_s'])} "
        f"({r['loop_us_per_point']:.0f} us a point), {r['speedup']:,.0f}x slower"
    )


PREFIX_REPLAY_COLUMNS: tuple[Column, ...] = (
    ("capacity", "capacity"),
    ("kvlab", lambda c: seconds(c["kvlab_s"])),
    ("OrderedDict", lambda c: seconds(c["ordered_dict_s"])),
    ("speed-up", lambda c: f"{c['ordered_dict_s'] / c['kvlab_s']:.2f}x"),
    ("block hits", num("block_hit_ratio", ".1%")),
    ("hits agree", lambda c: "yes" if c["hits_agree"] else "NO"),
)


def prefix_replay_text(r: dict) -> str:
    rows = [{"capacity": cap, **c} for cap, c in r["capacities"].items()]
    title = f"{r['trace']}: {r['requests']:,} requests, median of {r['repeats']} replays"
    return f"{title}\n{rows_text(PREFIX_REPLAY_COLUMNS, rows)}"


def check_gpu_session(args) -> None:
    """What argparse cannot check, before any step runs: a bad OUT costs a line, not a
    session's device time."""
    if not args.deadline < float("inf"):
        raise KvlabError(f"--deadline must be a finite number of seconds, got {args.deadline:g}")
    if not args.only and args.only is not None:
        raise KvlabError("--only names no benchmark")
    args.out = gpu_session.check_out(args.out)
    args.tests = list(gpu_session.GPU_TESTS) if args.tests is None else args.tests


def kv_transfer_configs(args) -> list:
    """One checked TransferConfig per engine; whether the run saves (--save, --no-save;
    by default full runs do) becomes --no-write."""
    base = kv_transfer.quick_config() if args.quick else kv_transfer.TransferConfig()
    changes = {
        "device": args.device,
        "completion": args.completion,
        "mooncake_protocol": args.mooncake_protocol,
        "host": args.host,
        "threads": args.threads,
        "fault": args.inject_fault,
    }
    times = {
        "seconds_per_size": "seconds_per_size",
        "timeout": "timeout_s",
        "time_limit": "time_limit_s",
    }
    for dest, field in times.items():  # the time bounds: a config field each, where given
        if getattr(args, dest) is not None:
            changes[field] = getattr(args, dest)
    if args.layout != "both":
        changes["layouts"] = (args.layout,)
    if args.sizes:
        changes["sizes_bytes"] = kv_transfer.parse_sizes(args.sizes)
    if args.block_bytes:
        changes["block_bytes"] = kv_transfer.parse_size(args.block_bytes)
    if args.repeats is not None:
        changes.update(max_repeats=args.repeats, min_repeats=min(base.min_repeats, args.repeats))
    engines = ("torch", "mooncake") if args.engine == "all" else (args.engine,)
    if args.engine == "all" and importlib.util.find_spec("mooncake") is None:
        print(
            "kvlab bench kv-transfer: Mooncake is not installed (pip install "
            "mooncake-transfer-engine-non-cuda); running torch.distributed only",
            file=sys.stderr,
        )
        engines = ("torch",)
    configs = [replace(base, engine=engine, **changes).validate() for engine in engines]
    args.no_write = args.no_save or (args.quick and not args.save)
    return configs


def kv_transfer_command(args) -> str:
    """The command that reproduces this run (recorded with the results)."""
    parts = ["kvlab", "bench", "kv-transfer", "--engine", args.engine, "--device", args.device]
    defaults = {"layout": "both", "completion": "notify"}
    for name in ("layout", "sizes", "block_bytes", "repeats", "seconds_per_size", "completion"):
        value = getattr(args, name)
        if value is not None and value != defaults.get(name):
            parts += [f"--{name.replace('_', '-')}", str(value)]
    return " ".join(parts + ["--quick"] * args.quick)


def run_kv_transfer(args, device, configs: list) -> dict | None:
    """The transfers, merged into results/<machine>/kv_transfer.json unless --no-write;
    nothing on the decode rank under torchrun (rank 0 reports)."""
    result = kv_transfer.run_benchmark(configs)
    if result and not args.no_write:
        result["saved_to"] = str(kv_transfer.save_results(result, kv_transfer_command(args)))
    return result


KV_TRANSFER_COLUMNS: tuple[Column, ...] = (
    ("layout", "layout"),
    ("size", lambda r: kv_transfer.config.format_size(r["bytes"])),
    ("blocks", "blocks"),
    ("reps", "repeats"),
    ("median", lambda r: seconds(r["time_s"]["median"])),
    ("p10 - p90", lambda r: f"{seconds(r['time_s']['p10'])} - {seconds(r['time_s']['p90'])}"),
    ("bandwidth", lambda r: si(r["bandwidth_bytes_per_s"]["median"], "B/s")),
    ("checksum", lambda r: "ok" if r["checksum_ok"] else "MISMATCH"),
)


def kv_transfer_text(result: dict) -> str:
    env = result["environment"]
    lines = [
        f"kvlab bench kv-transfer on {env['device_name']} ({env['cpu_count']} CPUs, "
        f"torch {env.get('torch')})"
    ]
    for label, entry in result["engines"].items():
        wall = f"time = KV pushed + acknowledgement received; {entry['wall_s']:.1f} s"
        lines += ["", f"{label}  ({wall})", rows_text(KV_TRANSFER_COLUMNS, entry["rows"])]
        for layout, s in entry["summary"].items():
            if fit := s.get("fit"):
                lines.append(
                    f"  {layout}: fits latency {seconds(fit['latency_s'])} + size / "
                    f"{si(fit['bandwidth_bytes_per_s'], 'B/s')}"
                )
    if result.get("saved_to"):
        lines += ["", f"saved to {result['saved_to']}"]
    return "\n".join(lines)


# ------------------------------------------------------------------- the table


BENCHMARKS = (
    Benchmark(
        "kv-transfer",
        "move KV blocks from a prefill to a decode process (torch.distributed, Mooncake)",
        description="Move KV blocks (contiguous and paged) from a 'prefill' to a 'decode' "
        "process and measure time and bandwidth. Engines: torch.distributed (gloo over TCP on "
        "CPU, NCCL on GPUs) and the Mooncake Transfer Engine (one-sided writes, P2P "
        "handshake). Sizes are binary: 4k = 4096 bytes, 512M = 512 MiB. Full runs merge into "
        "results/<machine>/kv_transfer.json; --quick runs save only with --save. Across "
        "nodes, run it under torchrun (see kvlab.kv_transfer.torchrun).",
        options="""
        --engine {all,torch,mooncake} =all: which engine(s) to run (default all)
        --device =cpu: where the KV buffers live: cpu (default) or cuda
        --layout {both,contiguous,paged} =both: one contiguous buffer, or fixed-size blocks
            gathered through a block table (default both)
        --sizes: comma-separated transfer sizes, e.g. 4k,1M,512M (default 4 KiB..512 MiB)
        --block-bytes: paged layout: bytes per block (default 64k = 16 tokens x one layer's K
            and V of the article's 7B)
        --repeats int: maximum timed repeats per case (default 200; quick 5)
        --seconds-per-size number: time budget of each case's timed loop (default 2)
        --timeout number: bound on every blocking wait in the two processes, s (default 60)
        --time-limit number: bound on the whole run per engine, s (default 900)
        --completion {notify,flag} =notify: Mooncake completion signal: TransferNotify
            (default) or a one-sided doorbell write
        --mooncake-protocol =tcp: Mooncake transport: tcp (default) or rdma
        --host =127.0.0.1: address to bind and advertise (default 127.0.0.1)
        --threads int =1: torch threads per process (default 1)
        --quick !: 3 small sizes, few repeats: a smoke test in seconds
        --save ! or: write results/<machine>/kv_transfer.json (default for full runs)
        --no-save !: do not write results
        --json !: print one JSON object
        --inject-fault: -
        """,  # --inject-fault, for the tests: decode:exit@1, prefill:hang@0
        check=kv_transfer_configs,
        run=run_kv_transfer,
        text=kv_transfer_text,
    ),
    Benchmark(
        "memory",
        "device copy bandwidth (STREAM-like) and matmul FLOP/s",
        description="Copy, read and write bandwidth over several array sizes "
        "(median of repeats), and the matmul rate: the figures the ledger is fed.",
        budget_s=120,
        options=SWEEP_OPTIONS,
        run=sweep(memory.run_memory),
        text=columns_text(copy_columns(("kernel",), ".1f")),
    ),
    Benchmark(
        "transfer",
        "host<->device copy bandwidth, pinned and pageable (CUDA)",
        description="Host -> device and device -> host copies of several sizes from "
        "pinned and pageable memory (on a CPU-only machine: host -> host copies).",
        budget_s=120,
        options=SWEEP_OPTIONS,
        run=sweep(host_copy.run_transfer),
        text=columns_text(copy_columns(("direction", "memory"), ".2f")),
    ),
    Benchmark(
        "decode",
        "decode step: measured vs the ledger, over batch x context x placement x KV dtype",
        description="Times one decode step of the toy decoder for every point of "
        "the sweep and compares it with the ledger fed this machine's measured "
        "bandwidth and matmul rate.",
        budget_s=900,
        run=sweep(decode.run_decode, "kernels", "cuda_graph", "compare_kernels"),
        options=KERNELS_OPTION
        + SWEEP_OPTIONS
        + """
        --preset: decoder preset: tiny, small, cpu-bench, gpu-bench, mha-small (default:
            cpu-bench on CPU, gpu-bench on CUDA, small with --quick on CPU)
        --batches sequences: comma-separated, e.g. 1,8
        --contexts contexts: comma-separated, e.g. 1k,4k,32k
        --placements names: device,host
        --kv-dtypes names: from fp32,bf16,fp16,int8,fp8
        --weight-dtype: fp32, bf16, fp16 or int8 (weight-only)
        --prefetch {off,on,both}: host placement: prefetch the next layer on a CUDA stream
            (default: both on CUDA; off on CPU)
        --no-cuda-graph store_false >cuda_graph: run device-placement steps eagerly on CUDA
        --compare-kernels !: CPU with kvlab's kernels: also time every device-placement point
            with PyTorch's kernels, right after (writes decode-torch-kernels.json too)
        """,
        check=grid(
            preset=names("preset", optional=True),
            batches=None,
            contexts=None,
            placements=names("placement", config.PLACEMENTS),
            kv_dtypes=names("kv dtype", config.KV_DTYPES),
            weight_dtype=names("weight dtype", config.WEIGHT_DTYPES, lower=True, optional=True),
            prefetch={None: None, "off": (False,), "on": (True,), "both": (False, True)}.get,
        ),
        after=decode_after,
        text=columns_text(
            (
                ("placement", lambda p: p["placement"] + ("+pf" if p["prefetch"] else "")),
                ("kv", "kv_dtype"),
                ("batch", "batch"),
                ("context", "context"),
                ("measured ms", num("measured_step_s", ".2f", times=1e3)),
                ("ledger ms", num("predicted_step_s", ".2f", times=1e3)),
                ("error", num("error", "+.1%")),
                # the kernel table's prediction; absent where the table could not be timed
                ("kernels error", lambda p: format(p.get("kernels_error", float("nan")), "+.1%")),
                ("GB/s", num("achieved_bytes_per_s", ".1f", per=1e9)),
                ("of copy", num("fraction_of_bandwidth", ".0%")),
                SPREAD,
            )
        ),
    ),
    Benchmark(
        "recompute-vs-fetch",
        "time to prefill N tokens vs to fetch their KV from host memory",
        description="For a range of N: one prefill of N tokens on the device "
        "against copying their KV (every layer) from host memory; reports where the "
        "curves cross.",
        budget_s=600,
        run=sweep(recompute.run_recompute, "kernels"),
        options=KERNELS_OPTION
        + SWEEP_OPTIONS
        + """
        --presets names: decoder presets, e.g. cpu-bench,mha-small
        --tokens tokens: comma-separated N, e.g. 16,256,4k
        --weight-dtype =bf16: fp32, bf16, fp16 or int8 (default bf16)
        --kv-dtype =bf16: fp32, bf16, fp16, int8 or fp8 (default bf16)
        """,
        check=grid(
            presets=names("preset"),
            tokens=None,
            weight_dtype=names("weight dtype", config.WEIGHT_DTYPES, lower=True),
            kv_dtype=names("kv dtype", config.KV_DTYPES, lower=True),
        ),
        text=columns_text(
            (
                ("preset", "preset"),
                ("tokens", "tokens"),
                ("recompute ms", num("recompute_s", ".3f", times=1e3)),
                ("fetch ms", num("fetch_s", ".3f", times=1e3)),
                ("ledger recompute ms", num("predicted_recompute_s", ".3f", times=1e3)),
                ("ledger fetch ms", num("predicted_fetch_s", ".3f", times=1e3)),
            ),
            lambda r: [{**p, "preset": c["preset"]} for c in r["curves"] for p in c["points"]],
        ),
    ),
    suite_row(
        "all", "every benchmark on this machine (memory, transfer, recompute-vs-fetch, decode)"
    ),
    suite_row(
        "gpu-suite",
        "every benchmark on a CUDA device, sized to finish in under 10 minutes (make bench-gpu)",
        budget_s=480,
        needs_cuda="gpu-suite needs a CUDA device and torch sees none; "
        "run 'kvlab bench all' for this machine",
    ),
    Benchmark(
        "gpu-session",
        "one bounded run on a borrowed GPU: facts, plan, suite, GPU tests, findings, all "
        "into one folder (make gpu-session OUT=...)",
        description="Measure a CUDA machine in one call that stays inside --deadline and "
        "leaves everything in --out: facts, plan, suite, pytest -m gpu, findings (made for a "
        "borrowed GPU from which only one folder comes back; see kvlab.bench.gpu_session).",
        options="""
        --out required path: the folder that comes back ($OUT)
        --deadline seconds =420.0: seconds the whole session may take (default 420: fits a 480
            s call)
        --budget seconds =300.0: the suite's time budget, trimmed to what the deadline leaves
            (default 300)
        --device =cuda: the CUDA device to measure (default cuda)
        --only names: run only these benchmarks, e.g. decode (a rerun)
        --tests *: test files for pytest -m gpu, from the current folder (default: kvlab's GPU
            tests, where they are here)
        --dry-run !: no CUDA needed: the suite runs on the CPU in quick mode (checks the session)
        """,
        check=check_gpu_session,
        run=lambda args, device, checked: gpu_session.main(args),
    ),
    Benchmark(
        "ledger",
        "time the ledger over a slider grid: one vectorised call vs a Python loop",
        options="""
        --points count =100000: grid points (default 100,000)
        --loop-points count: points for the Python loop (default: all)
        --json !: print one JSON object
        """,
        check=check_ledger,
        run=lambda args, device, checked: run_ledger_grid(checked["points"], checked["loop"]),
        text=ledger_text,
    ),
    Benchmark(
        "prefix-replay",
        "how fast a trace replays: kvlab's LRU prefix cache against a plain OrderedDict",
        description=prefix_replay.__doc__.split("\n\n")[0],
        options="""
        trace ? =conversation: a trace (default conversation)
        --capacities blocks =1000,10000,100000: cache sizes in blocks (default 1000,10000,100000)
        --repeats repeats =5: timed replays (default 5)
        --json !: print one JSON object
        """,
        run=lambda args, device, checked: prefix_replay.replay_speed(
            args.trace, args.capacities, args.repeats
        ),
        text=prefix_replay_text,
    ),
)


def register(sub) -> None:
    p = sub.add_parser("bench", help="microbenchmarks: results as JSON under results/<machine>/")
    bench = p.add_subparsers(dest="benchmark", metavar="BENCHMARK", parser_class=Parser)
    bench.required = True
    for b in BENCHMARKS:
        q = bench.add_parser(b.name, help=b.help, description=b.description or None)
        add_options(q, b.options.replace("BUDGET", str(b.budget_s)))
        q.set_defaults(func=lambda args, b=b: command(b, args))

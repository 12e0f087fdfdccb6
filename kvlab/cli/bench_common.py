"""Options and output shared by the `kvlab bench` benchmarks (memory, transfer, decode,
recompute-vs-fetch, all/gpu-suite).

Every numeric option is checked where argparse reads it (`whole`, `seconds_value`,
`csv_counts`): NaN, infinity, fractions and out-of-range values are one line and exit 2,
never a traceback and never a sweep that skips every point for an internal reason.
"""

from __future__ import annotations

import argparse
import math
import sys

from ..bench import results as bench_results
from ..bench.plan import plan_suite
from ..errors import KvlabError
from ..fmt import seconds, si
from .args import count, number, print_json, table

#: Bounds of the whole-number options (timed repeats, torch threads).
MAX_REPEATS = 1000
MAX_THREADS = 4096


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


def add_common(p, budget_s: float) -> None:
    p.add_argument(
        "--device",
        default="auto",
        help="'cpu', 'cuda', 'cuda:1', or 'auto' (CUDA when present; default)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="CI-sized run (seconds); writes <benchmark>-quick.json so real results are kept",
    )
    p.add_argument(
        "--repeats",
        type=whole(1, MAX_REPEATS),
        help="timed repeats per point (default: 5 on CPU, more on CUDA)",
    )
    p.add_argument(
        "--budget",
        type=seconds_value,
        default=budget_s,
        metavar="SECONDS",
        help=f"stop starting new points after this long (default {budget_s:g} s)",
    )
    p.add_argument(
        "--threads", type=whole(1, MAX_THREADS), help="torch CPU threads (default: torch's choice)"
    )
    p.add_argument(
        "--no-write", action="store_true", help="do not write results/<machine>/<benchmark>.json"
    )
    p.add_argument("--json", action="store_true", help="print the whole result as one JSON object")
    p.add_argument(
        "--plan",
        metavar="DEVICE",
        help="print every point of the CUDA sweep with its bytes, predicted time and "
        "memory on catalogue device DEVICE (kvlab hardware, e.g. h200) and what "
        "the budget leaves out; runs and allocates nothing",
    )
    p.add_argument(
        "--plan-link",
        default="pcie5-x16",
        metavar="LINK",
        help="host<->device link for --plan (kvlab hardware; default pcie5-x16)",
    )


def add_kernels(p) -> None:
    p.add_argument(
        "--kernels",
        choices=("auto", "native", "torch"),
        default="auto",
        help="CPU decode kernels: kvlab's native C kernels (built with the system "
        "compiler), PyTorch's, or native where they build (default)",
    )


def setup(args) -> str:
    """Resolve --device and --threads; returns the torch device string."""
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
    if not getattr(args, "no_write", True):
        from ..bench.results import check_writable

        check_writable(device)  # before the work, not after it
    return device


def repeats(args):
    return args.repeats


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


def finish(args, kind: str, result: dict, device: str, rows=None, header=None) -> int:
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
        if rows:
            print(table(rows, header))
        if path is not None:
            print(f"written: {path}", file=sys.stderr)
    if failed is not None:  # the result is printed above: nothing measured is lost
        raise KvlabError(f"the result above could not be saved: {failed}")
    return 0


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

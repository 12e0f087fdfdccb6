"""Options and output shared by the `kvlab bench` benchmarks (memory, transfer, decode,
recompute-vs-fetch, all/gpu-suite)."""
from __future__ import annotations

import sys

from ..errors import KvlabError
from .args import count, number, print_json, table


def add_common(p, budget_s: float) -> None:
    p.add_argument("--device", default="auto", help="'cpu', 'cuda', 'cuda:1', or 'auto' (CUDA when present; default)")
    p.add_argument("--quick", action="store_true",
                   help="CI-sized run (seconds); writes <benchmark>-quick.json so real results are kept")
    p.add_argument("--repeats", type=count, help="timed repeats per point (default: 5 on CPU, more on CUDA)")
    p.add_argument("--budget", type=number, default=budget_s, metavar="SECONDS",
                   help=f"stop starting new points after this long (default {budget_s:g} s)")
    p.add_argument("--threads", type=count, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--no-write", action="store_true", help="do not write results/<machine>/<benchmark>.json")
    p.add_argument("--json", action="store_true", help="print the whole result as one JSON object")


def add_kernels(p) -> None:
    p.add_argument("--kernels", choices=("auto", "native", "torch"), default="auto",
                   help="CPU decode kernels: kvlab's native C kernels (built with the system compiler), "
                        "PyTorch's, or native where they build (default)")


def setup(args) -> str:
    """Resolve --device and --threads; returns the torch device string."""
    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise KvlabError(f"--device {device}: torch {torch.__version__} sees no CUDA device; use --device cpu")
    try:
        torch.device(device)
    except RuntimeError:
        raise KvlabError(f"--device {device!r} is not a torch device; use cpu, cuda or cuda:N") from None
    if args.threads is not None:
        if args.threads < 1 or args.threads != int(args.threads):
            raise KvlabError(f"--threads must be a whole number >= 1, got {args.threads:g}")
        torch.set_num_threads(int(args.threads))
    if args.repeats is not None and (args.repeats < 1 or args.repeats != int(args.repeats) or args.repeats > 1000):
        raise KvlabError(f"--repeats must be a whole number in 1..1000, got {args.repeats:g}")
    if args.budget is not None and not args.budget > 0:
        raise KvlabError(f"--budget must be > 0 seconds, got {args.budget:g}")
    return device


def repeats(args):
    return None if args.repeats is None else int(args.repeats)


def finish(args, kind: str, result: dict, device: str, rows=None, header=None) -> int:
    """Write the result (unless --no-write), then print JSON or a table and where it went."""
    from ..bench.results import write_result

    name = f"{kind}-quick" if result.get("quick") else kind
    path = None if args.no_write else write_result(name, result, device)
    if path is not None:
        result["written_to"] = str(path)
    if args.json:
        print_json(result)
    else:
        if rows:
            print(table(rows, header))
        if path is not None:
            print(f"written: {path}", file=sys.stderr)
    return 0


def csv_counts(text: str) -> list[int]:
    """'1k,4k,32k' -> [1024, 4096, 32768]."""
    import argparse

    out = []
    for part in text.split(","):
        value = count(part)
        if value < 1 or value != int(value):
            raise argparse.ArgumentTypeError(f"expected whole numbers >= 1 such as 1k,4k; got {part!r}")
        out.append(int(value))
    return out


def csv_names(text: str) -> list[str]:
    return [t.strip().lower() for t in text.split(",") if t.strip()]

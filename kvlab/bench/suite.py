"""All benchmarks in one bounded run: `kvlab bench all` (this machine) and
`kvlab bench gpu-suite` (what `make bench-gpu` runs on a CUDA box in under 10 minutes).

Each benchmark gets a share of the time budget and writes its result file as soon as it
finishes, so a run cut short still leaves the earlier results behind. A benchmark that
is refused (a `KvlabError`: its model does not fit, say) or breaks is recorded in the
summary and the suite goes on: a one-shot GPU run must not lose every result to one.
"""

from __future__ import annotations

import sys
import time
import traceback

from ..errors import KvlabError
from . import decode, host_copy, memory, recompute
from .results import write_result

#: Share of the suite's budget for each benchmark (decode gets what the others leave).
SHARES = (("memory", 0.08), ("transfer", 0.07), ("recompute-vs-fetch", 0.25), ("decode", 0.60))
#: A benchmark is not started with less than this left of the suite's budget.
MIN_START_S = 5.0


def _runners() -> dict:
    """The benchmarks, looked up when the suite runs (a test replaces them)."""
    return {
        "memory": memory.run_memory,
        "transfer": host_copy.run_transfer,
        "recompute-vs-fetch": recompute.run_recompute,
        "decode": decode.run_decode,
    }


def allowance_s(name: str, share: float, left_s: float, budget_s: float) -> float:
    """Seconds benchmark `name` may take: its share of the budget; decode takes what is left."""
    return left_s if name == "decode" else min(left_s, share * budget_s)


def run_suite(
    device: str,
    budget_s: float,
    quick: bool = False,
    repeats=None,
    write: bool = True,
    only: tuple[str, ...] | None = None,
    quiet: bool = False,
) -> dict:
    """Run memory, transfer, recompute-vs-fetch and decode; returns {benchmark: summary}:
    where its result was written and its headline numbers, or `refused` / `error`."""
    runners = _runners()
    deadline = time.monotonic() + budget_s
    out = {}
    for name, share in SHARES:
        if only and name not in only:
            continue
        left = deadline - time.monotonic()
        if left < MIN_START_S:
            out[name] = {"skipped": "suite time budget exhausted"}
            continue
        allowance = allowance_s(name, share, left, budget_s)
        if not quiet:
            print(
                f"kvlab bench suite: {name} (up to {allowance:.0f} s)", file=sys.stderr, flush=True
            )
        cpu_decode = name == "decode" and not str(device).startswith("cuda")
        extra = {"compare_kernels": True} if cpu_decode else {}
        try:
            result = runners[name](
                device, quick=quick, repeats=repeats, budget_s=allowance, quiet=quiet, **extra
            )
        except Exception as exc:  # noqa: BLE001 - one benchmark must not cost the others
            out[name] = failure(name, exc)
            continue
        if name == "decode":
            decode.write_comparison(result, device, write)
        path = write_result(f"{name}-quick" if quick else name, result, device) if write else None
        out[name] = {"written_to": str(path) if path else None, **headline(name, result)}
    return out


def failure(name: str, exc: Exception) -> dict:
    """The summary of a benchmark that did not finish: refused (bad input or a size that does
    not fit, one line) or an error (with its traceback on stderr, for the bug report)."""
    if isinstance(exc, KvlabError):
        print(f"kvlab bench suite: {name} refused: {exc}", file=sys.stderr, flush=True)
        return {"refused": str(exc)}
    traceback.print_exc(file=sys.stderr)
    return {"error": f"{type(exc).__name__}: {exc}"}


def headline(name: str, r: dict) -> dict:
    """The few numbers of a result worth a line in the suite's summary."""
    if name in ("memory", "transfer"):
        return {"bandwidth_bytes_per_s": r.get("bandwidth_bytes_per_s")}
    if name == "decode":
        return {"points": len(r["points"]), "skipped": len(r["skipped"]), "summary": r["summary"]}
    return {
        c["preset"]: {
            "crossover_tokens": c["crossover_tokens"],
            "predicted_crossover_tokens": c["predicted_crossover_tokens"],
        }
        for c in r["curves"]
    }

"""All benchmarks in one bounded run: `kvlab bench all` (this machine) and
`kvlab bench gpu-suite` (what `make bench-gpu` runs on a CUDA box in under 10 minutes).

Each benchmark gets a share of the time budget and writes its result file as soon as it
finishes, so a run cut short still leaves the earlier results behind.
"""
from __future__ import annotations

import sys
import time
import traceback

from ..errors import KvlabError

from .results import write_result

#: Share of the suite's budget for each benchmark (decode gets what the others leave).
SHARES = (("memory", 0.08), ("transfer", 0.07), ("recompute-vs-fetch", 0.25), ("decode", 0.60))


def run_suite(device: str, budget_s: float, quick: bool = False, repeats=None, write: bool = True,
              only: tuple[str, ...] | None = None, quiet: bool = False) -> dict:
    """Run memory, transfer, recompute-vs-fetch and decode; returns {benchmark: summary}."""
    from .decode import run_decode, write_comparison
    from .memory import run_memory
    from .recompute import run_recompute
    from .transfer import run_transfer

    runners = {"memory": run_memory, "transfer": run_transfer, "recompute-vs-fetch": run_recompute,
               "decode": run_decode}
    deadline = time.monotonic() + budget_s
    out = {}
    for name, share in SHARES:
        if only and name not in only:
            continue
        left = deadline - time.monotonic()
        if left < 5:
            out[name] = {"skipped": "suite time budget exhausted"}
            continue
        allowance = left if name == "decode" else min(left, share * budget_s)
        if not quiet:
            print(f"kvlab bench suite: {name} (up to {allowance:.0f} s)", file=sys.stderr, flush=True)
        extra = {"compare_kernels": True} if name == "decode" and not str(device).startswith("cuda") else {}
        try:
            result = runners[name](device, quick=quick, repeats=repeats, budget_s=allowance, quiet=quiet, **extra)
        except KvlabError:
            raise
        except Exception as exc:  # one broken benchmark must not cost the others (one-shot GPU runs)
            traceback.print_exc(file=sys.stderr)
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        if name == "decode":
            write_comparison(result, device, write)
        path = write_result(f"{name}-quick" if quick else name, result, device) if write else None
        out[name] = {"written_to": str(path) if path else None, **headline(name, result)}
    return out


def headline(name: str, r: dict) -> dict:
    """The few numbers of a result worth a line in the suite's summary."""
    if name in ("memory", "transfer"):
        return {"bandwidth_bytes_per_s": r.get("bandwidth_bytes_per_s")}
    if name == "decode":
        return {"points": len(r["points"]), "skipped": len(r["skipped"]), "summary": r["summary"]}
    return {c["preset"]: {"crossover_tokens": c["crossover_tokens"],
                          "predicted_crossover_tokens": c["predicted_crossover_tokens"]} for c in r["curves"]}

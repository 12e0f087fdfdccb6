"""`python -m kvlab.book.warm`: the chapters' expensive runs, once, into their caches.

`make book` runs this before it builds the two editions at once: both then read the same
stored results (chapter 6 also quotes how long its searches took, which differs from run to
run) and neither repeats the other's work (chapter 4's simulations, chapter 5b's capacity curves,
chapter 6's searches).
"""

from __future__ import annotations

import sys
import time

from ..viz.prefix_caching import TRACES
from . import kv_centric, plan_searches, prefix_caching

#: Chapter 4's cached runs (kvlab.book.run_cache), each a function of no arguments.
CHAPTER_4_RUNS = (
    kv_centric.comparison,
    kv_centric.schedulers,
    kv_centric.preemption,
    kv_centric.sweep,
    kv_centric.critical_path,
    kv_centric.pools,
    kv_centric.load,
    kv_centric.regime,
    kv_centric.report,
)


def main() -> int:
    start = time.perf_counter()
    plan_searches.searches()
    print(f"kvlab book: chapter 6's searches ready ({time.perf_counter() - start:.0f} s)")
    for run in CHAPTER_4_RUNS:
        run()
    print(f"kvlab book: chapter 4's runs ready ({time.perf_counter() - start:.0f} s)")
    for trace in TRACES:
        prefix_caching.capacity_curve(trace)
    print(f"kvlab book: chapter 5b's capacity curves ready ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m kvlab.book.warm`: the chapters' expensive runs, once, into their caches.

`make book` runs this before it builds the two editions at once: both then read the same
stored results (chapter 6 also quotes how long its searches took, which differs from run to
run) and neither repeats the other's work (chapter 4's simulations, chapter 5b's capacity curves,
chapter 6's searches). Chapter 6's searches run on every core; chapters 4 and 5b run beside
them in one more process, which takes the cores the searches leave idle (their last
searches run on fewer processes than there are cores).
"""

from __future__ import annotations

import contextlib
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from ..plan.runners import cores, start_method
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


def chapters_4_and_5b() -> list[str]:
    """Chapter 4's runs and chapter 5b's capacity curves, into the run cache; what was done,
    with the seconds each part took."""
    start = time.perf_counter()
    for run in CHAPTER_4_RUNS:
        run()
    done = [f"chapter 4's runs ready ({time.perf_counter() - start:.0f} s)"]
    for trace in TRACES:
        prefix_caching.capacity_curve(trace)
    done.append(f"chapter 5b's capacity curves ready ({time.perf_counter() - start:.0f} s)")
    return done


def main() -> int:
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        later = None
        if cores() > 1:
            beside = stack.enter_context(ProcessPoolExecutor(1, mp_context=start_method()))
            later = beside.submit(chapters_4_and_5b)
        plan_searches.searches()
        print(f"kvlab book: chapter 6's searches ready ({time.perf_counter() - start:.0f} s)")
        side = later.result() if later else chapters_4_and_5b()
    for line in side:
        print(f"kvlab book: {line}")
    print(f"kvlab book: every chapter's runs ready ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

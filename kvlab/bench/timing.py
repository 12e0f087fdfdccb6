"""Timing discipline shared by the benchmarks: warm-up, synchronise, repeat, report the
median and the spread; a time budget; a progress line on stderr.

Benchmarks are not tests: nothing here asserts a speed. What it guards against is the
usual ways a microbenchmark lies: timing the first call (allocation, page faults, kernel
selection), timing an asynchronous launch instead of the work, one lucky repeat.
"""

from __future__ import annotations

import ctypes
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass

from ..errors import KvlabError

#: glibc mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def open_device(device: str):
    """The torch device a benchmark runs on, checked, and the CPU allocator tuned for it.

    Returns (torch.device, allocator settings to record in the environment)."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise KvlabError("no CUDA device visible to torch; use --device cpu")
    return dev, (tune_cpu_allocator() if dev.type == "cpu" else {})


def tune_cpu_allocator() -> dict:
    """Keep freed memory for reuse instead of returning it to the OS (glibc only).

    By default glibc serves every allocation above ~32 MB with a fresh mmap and unmaps
    it on free, so each large temporary (attention scores at 32K context) pays a page
    fault per 4 KiB: an "elementwise op" that costs 1 ms runs in 10. PyTorch's CPU
    tuning guides swap in jemalloc/tcmalloc for the same reason; mallopt needs no
    install. Returns what was applied, for the result's environment.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        mmap_ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30))
        trim_ok = bool(libc.mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1))
        return {
            "allocator": "glibc",
            "mmap_threshold_bytes": (1 << 30) if mmap_ok else None,
            "trim_threshold_bytes": (1 << 31) - 1 if trim_ok else None,
        }
    except (OSError, AttributeError):
        return {"allocator": "unchanged (not glibc)"}


def synchronize(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Timing:
    """Seconds per call: median and spread over `repeats` timed calls after `warmup`."""

    median_s: float
    min_s: float
    max_s: float
    p25_s: float
    p75_s: float
    repeats: int
    warmup: int

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median: 0.02 = quiet, 0.3 = disturbed."""
        return (self.p75_s - self.p25_s) / self.median_s if self.median_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "spread": self.spread}


def _quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    pos = q * (len(values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def time_call(fn, device="cpu", repeats: int = 5, warmup: int = 2, inner: int = 1) -> Timing:
    """Time `fn()` (which must not return before its work is queued): `warmup` untimed
    calls, then `repeats` timed ones, each `inner` back-to-back calls synchronised at
    both ends and divided by `inner` (for calls shorter than the clock's resolution)."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        synchronize(device)
        times.append((time.perf_counter() - t0) / inner)
    return Timing(
        statistics.median(times),
        min(times),
        max(times),
        _quantile(times, 0.25),
        _quantile(times, 0.75),
        repeats,
        warmup,
    )


#: Bytes one timed repeat of a copy should move at least. Below this a single call times
#: the launch, not the copy (a 1 MiB host->device copy takes ~20 us on PCIe 5, a 16 MiB
#: device copy ~8 us on an H200; launching either from Python takes ~5-10 us), so small
#: sizes time a loop of back-to-back calls per repeat and divide by its length.
MIN_BYTES_PER_REPEAT = 256 << 20


def calls_per_repeat(size_bytes: int, min_bytes: int = MIN_BYTES_PER_REPEAT) -> int:
    """Back-to-back calls per timed repeat so that a repeat moves at least `min_bytes`."""
    return max(1, -(-int(min_bytes) // max(1, int(size_bytes))))


class Budget:
    """A wall-clock allowance: benchmarks stop starting new points when it runs out."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def remaining(self) -> float:
        return float("inf") if self.seconds is None else self.seconds - self.elapsed()

    def allows(self, estimate_s: float) -> bool:
        return estimate_s <= self.remaining()


class Progress:
    """`[ 3/24 12s] decode b=8 ctx=4096: 41.2 ms` on stderr, one line per point."""

    def __init__(self, name: str, total: int, quiet: bool = False):
        self.name, self.total, self.done, self.quiet = name, total, 0, quiet
        self.start = time.monotonic()

    def step(self, message: str) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.start
        self.log(f"[{self.done:>{len(str(self.total))}}/{self.total} {elapsed:4.0f}s] {message}")

    def log(self, message: str) -> None:
        if not self.quiet:
            print(f"kvlab bench {self.name}: {message}", file=sys.stderr, flush=True)


def load_average() -> list[float] | None:
    """1/5/15-minute load averages: other work on the machine disturbs timings."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def cpu_pressure() -> float | None:
    """Share of the last 10 s in which some runnable task waited for a CPU (Linux PSI).

    On a small shared machine this is the honest "was I disturbed" figure: with two
    threads, one stolen core stalls every parallel region at its barrier.
    """
    try:
        for line in open("/proc/pressure/cpu"):
            if line.startswith("some"):
                return float(line.split("avg10=")[1].split()[0]) / 100
    except (OSError, IndexError, ValueError):
        pass
    return None


def _stall_total_us() -> float | None:
    try:
        for line in open("/proc/pressure/cpu"):
            if line.startswith("some"):
                return float(line.split("total=")[1].split()[0])
    except (OSError, IndexError, ValueError):
        pass
    return None


def measure_undisturbed(measure, max_stall: float = 0.05, attempts: int = 3, accept=None):
    """Run `measure()` until the CPU was not contended (and `accept(result)` holds).

    The stall fraction is the share of the measurement's wall time in which some task
    waited for a CPU (Linux PSI, cumulative counter): another process wanting a core.
    Returns (result, stall fraction or None where PSI is missing, attempts used): the
    first good attempt, else the least stalled one among those `accept` passes, else
    the least stalled.
    """
    tried = []
    for attempt in range(1, attempts + 1):
        s0, t0 = _stall_total_us(), time.monotonic()
        result = measure()
        s1, wall = _stall_total_us(), time.monotonic() - t0
        stall = None if s0 is None or s1 is None or wall <= 0 else min(1.0, (s1 - s0) / 1e6 / wall)
        ok = accept is None or accept(result)
        tried.append((not ok, stall or 0.0, result, stall))
        if ok and (stall is None or stall <= max_stall):
            return result, stall, attempt
    _, _, result, stall = min(tried, key=lambda x: (x[0], x[1]))
    return result, stall, len(tried)


def machine_state() -> dict:
    return {"load_average": load_average(), "cpu_pressure_10s": cpu_pressure()}

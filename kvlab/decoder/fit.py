"""Check free memory before allocating, so an oversize cache fails up front with one clear
line instead of an out-of-memory kill half-way through a sweep.

Host memory comes from /proc/meminfo (MemAvailable: what can be allocated without
swapping), falling back to sysconf; device memory from `torch.cuda.mem_get_info`.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import KvlabError
from ..fmt import si

#: Leave this share of the free memory alone: allocators round up, and the OS and other
#: processes need room; a sweep that fills memory to the last byte gets OOM-killed.
HEADROOM = 0.10


def host_available_bytes() -> float:
    """Bytes of host RAM that can be allocated now."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return float("inf")  # unknown: let the allocator decide


def device_available_bytes(device) -> float:
    """Free bytes on a torch device (host RAM for 'cpu')."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(cuda_index(device))
        return float(free)
    return host_available_bytes()


def cuda_index(device) -> int:
    """The CUDA device number `device` names: 'cuda:1' -> 1, 'cuda' -> the current device.

    Before torch 2.5 `torch.cuda.mem_get_info` (and other per-device calls) refuse a
    device without an index, and 'cuda' means whichever device is current; an explicit
    number works on every version and measures the GPU the benchmark named."""
    import torch

    device = torch.device(device)
    return device.index if device.index is not None else torch.cuda.current_device()


def require(what: str, needed_bytes: float, device, hint: str) -> None:
    """Raise KvlabError if `needed_bytes` does not fit in what `device` has free."""
    import torch

    device = torch.device(device)
    available = host_available_bytes() if device.type == "cpu" else device_available_bytes(device)
    usable = available * (1 - HEADROOM)
    if needed_bytes > usable:
        where = "host memory" if device.type == "cpu" else f"{device} memory"
        raise KvlabError(
            f"{what} needs {si(needed_bytes, 'B')} but only {si(available, 'B')} of {where} "
            "is free "
            f"({si(usable, 'B')} usable after {HEADROOM:.0%} headroom); {hint}"
        )

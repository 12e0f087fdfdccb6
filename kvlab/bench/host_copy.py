"""`kvlab bench transfer`: host <-> device copies, pinned and pageable (CUDA).

This is the path KV takes when it lives in host memory (placement `host`) or is fetched
on a cache hit. Bandwidth is bytes transferred (one way) / median time. Pinned memory
lets the copy engine DMA straight from host RAM; pageable memory is first staged through
a pinned bounce buffer by the driver, which is why it is slower. Without CUDA the same
benchmark times host -> host copies (the CPU decoder's `host` placement path).
"""

from __future__ import annotations

from .results import environment
from .timing import Budget, Progress, calls_per_repeat, machine_state, open_device, time_call

MiB, GiB = 1 << 20, 1 << 30
SIZES = {"cpu": [4 * MiB, 64 * MiB, 512 * MiB], "cuda": [MiB, 16 * MiB, 256 * MiB, GiB]}
QUICK_SIZES = {"cpu": [4 * MiB, 64 * MiB], "cuda": [MiB, 256 * MiB]}


def link_bandwidth(
    device, size_bytes: int = 256 * MiB, pinned: bool = True, repeats: int = 5
) -> tuple[float, dict]:
    """One-way bytes/s of host -> device copies of `size_bytes` (CPU: host -> host)."""
    import torch

    dev = torch.device(device)
    pin = pinned and dev.type == "cuda"
    src = torch.ones(size_bytes, dtype=torch.uint8, pin_memory=pin)
    dst = torch.empty(size_bytes, dtype=torch.uint8, device=dev)
    t = time_call(
        lambda: dst.copy_(src, non_blocking=True),
        dev,
        repeats,
        warmup=2,
        inner=calls_per_repeat(size_bytes),
    )
    return size_bytes / t.median_s, t.to_dict()


def run_transfer(
    device="cpu",
    quick: bool = False,
    repeats: int | None = None,
    budget_s: float | None = None,
    quiet: bool = False,
) -> dict:
    """Host<->device copy bandwidth over sizes, pinned and pageable; a JSON-ready dict."""
    import torch

    dev, alloc = open_device(device)
    repeats = repeats or (5 if quick else 9)
    sizes = (QUICK_SIZES if quick else SIZES).get(dev.type, SIZES["cpu"])
    cuda = dev.type == "cuda"
    kinds = ("pinned", "pageable") if cuda else ("pageable",)
    directions = ("h2d", "d2h") if cuda else ("h2h",)
    progress = Progress("transfer", len(sizes) * len(kinds) * len(directions), quiet)
    budget = Budget(budget_s)
    points = []
    for size in sizes:
        for kind in kinds:
            host = torch.ones(size, dtype=torch.uint8, pin_memory=(kind == "pinned"))
            other = torch.empty(size, dtype=torch.uint8, device=dev)
            for direction in directions:
                if not budget.allows(0):
                    break
                src, dst = (other, host) if direction == "d2h" else (host, other)
                inner = calls_per_repeat(size)
                t = time_call(
                    lambda src=src, dst=dst: dst.copy_(src, non_blocking=True),
                    dev,
                    repeats,
                    warmup=2,
                    inner=inner,
                )
                points.append(
                    {
                        "direction": direction,
                        "memory": kind,
                        "size_bytes": size,
                        **t.to_dict(),
                        "calls_per_repeat": inner,
                        "bandwidth_bytes_per_s": size / t.median_s,
                    }
                )
                progress.step(
                    f"{direction} {kind:8s} {size / MiB:6.0f} MiB: "
                    f"{size / t.median_s / 1e9:6.2f} GB/s"
                )
            del host, other
    main = [p for p in points if p["direction"] in ("h2d", "h2h") and p["memory"] == kinds[0]]
    best = max(main, key=lambda p: p["size_bytes"]) if main else None
    return {
        "benchmark": "transfer",
        "environment": {**environment(str(dev)), **alloc, "at_end": machine_state()},
        "quick": quick,
        "link": "host -> device over PCIe/NVLink-C2C (pinned and pageable)"
        if cuda
        else "host -> host memcpy (no accelerator: the CPU decoder's host-placement path)",
        "bandwidth_bytes_per_s": best["bandwidth_bytes_per_s"] if best else None,
        "bandwidth_definition": "bytes copied (one way) / median time, host->device "
        + ("pinned" if cuda else "pageable")
        + ", at the largest size",
        "points": points,
    }

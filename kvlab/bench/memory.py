"""`kvlab bench memory`: the device's copy bandwidth (STREAM-like) and matmul rate.

Copy bandwidth counts bytes read plus bytes written (STREAM's convention), on arrays far
larger than the last-level cache, median of repeats. It is the bandwidth the decode
benchmark hands to the ledger; read-only and write-only figures are recorded beside it
because a decode step is mostly reads. The matmul rate (large square bf16/fp32 GEMMs)
is the FLOP/s ceiling the ledger's compute term uses.
"""

from __future__ import annotations

from ..decoder import fit
from ..native import last_level_cache_bytes as cpu_cache_bytes
from .results import environment
from .timing import (
    Budget,
    Progress,
    calls_per_repeat,
    machine_state,
    measure_undisturbed,
    open_device,
    time_call,
)

MiB, GiB = 1 << 20, 1 << 30
SIZES = {
    "cpu": [4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, GiB],
    "cuda": [16 * MiB, 256 * MiB, GiB, 4 * GiB],
}
QUICK_SIZES = {"cpu": [4 * MiB, 128 * MiB], "cuda": [16 * MiB, GiB]}
MATMUL_N = {"cpu": 2048, "cuda": 8192}


def last_level_cache_bytes(device="cpu") -> int | None:
    """L3 (CPU, from sysfs) or L2 (CUDA) size in bytes; None when unknown."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", None)

    return cpu_cache_bytes()


def copy_bandwidth(
    device, size_bytes: int, repeats: int = 5, warmup: int = 2
) -> tuple[float, dict]:
    """(bytes read + written) / median time of `b.copy_(a)` over `size_bytes` arrays
    (small sizes: a loop of copies per repeat, see `calls_per_repeat`)."""
    import torch

    a = torch.ones(size_bytes // 4, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    t = time_call(lambda: b.copy_(a), device, repeats, warmup, inner=calls_per_repeat(size_bytes))
    return 2 * size_bytes / t.median_s, t.to_dict()


def matmul_rate(device, dtype: str, n: int | None = None, repeats: int = 5) -> float:
    """FLOP/s of an n x n x n matmul (2 n^3 FLOPs), median of repeats."""
    import torch

    from ..decoder.kvcache import torch_dtype  # noqa: PLC0415 - torch loads only when used

    dev = torch.device(device)
    n = n or MATMUL_N.get(dev.type, 2048)
    a = torch.randn(n, n, device=dev).to(torch_dtype(dtype))
    b = torch.randn(n, n, device=dev).to(torch_dtype(dtype))
    t, _, _ = measure_undisturbed(
        lambda: time_call(lambda: torch.matmul(a, b), dev, repeats, warmup=2)
    )
    return 2.0 * n**3 / t.median_s


def _measure_size(
    dev, size: int, repeats: int, attempts: int, budget: Budget, progress: Progress
) -> list:
    """Copy, read and write over `size`-byte arrays: one point each."""
    import torch

    a = torch.ones(size // 4, dtype=torch.float32, device=dev)
    b = torch.empty_like(a)
    kernels = (
        ("copy", lambda: b.copy_(a), 2 * size),
        ("read", lambda: torch.sum(a), size),
        ("write", lambda: a.fill_(1.0), size),
    )
    inner = calls_per_repeat(size)
    points = []
    for kernel, fn, moved in kernels:
        if not budget.allows(0):
            break
        t, stall, _ = measure_undisturbed(
            lambda fn=fn: time_call(fn, dev, repeats, warmup=2, inner=inner), attempts=attempts
        )
        points.append(
            {
                "kernel": kernel,
                "size_bytes": size,
                "bytes_moved": moved,
                **t.to_dict(),
                "calls_per_repeat": inner,
                "cpu_stall_fraction": stall,
                "bandwidth_bytes_per_s": moved / t.median_s,
                "best_bandwidth_bytes_per_s": moved / t.min_s,
            }
        )
        progress.step(
            f"{kernel:5s} {size / MiB:7.0f} MiB: {moved / t.median_s / 1e9:7.1f} GB/s "
            f"(spread {t.spread:.0%})"
        )
    return points


def run_memory(
    device="cpu",
    quick: bool = False,
    repeats: int | None = None,
    budget_s: float | None = None,
    quiet: bool = False,
) -> dict:
    """Copy/read/write bandwidth over several sizes and the matmul rate; a JSON-ready dict."""
    dev, alloc = open_device(device)
    repeats = repeats or (5 if quick else 9)
    sizes = (QUICK_SIZES if quick else SIZES).get(dev.type, SIZES["cpu"])
    free = (1 - fit.HEADROOM) * fit.device_available_bytes(dev)
    sizes = [s for s in sizes if 2.5 * s < free] or sizes[:1]
    budget = Budget(budget_s)
    dtypes = ("bf16",) if quick else ("bf16", "fp32")
    progress = Progress("memory", 3 * len(sizes) + len(dtypes), quiet)
    env = {**environment(str(dev)), **alloc, "at_start": machine_state()}
    points = []
    for size in sizes:
        points += _measure_size(dev, size, repeats, 1 if quick else 3, budget, progress)
    flops = {}
    for dtype in dtypes:
        flops[dtype] = matmul_rate(dev, dtype)
        progress.step(f"matmul {dtype}: {flops[dtype] / 1e12:.3f} TFLOP/s")

    def at_largest(kernel):
        mine = [p for p in points if p["kernel"] == kernel]
        return max(mine, key=lambda p: p["size_bytes"])["bandwidth_bytes_per_s"] if mine else None

    env["at_end"] = machine_state()
    return {
        "benchmark": "memory",
        "environment": env,
        "quick": quick,
        "bandwidth_bytes_per_s": at_largest("copy"),
        "read_bandwidth_bytes_per_s": at_largest("read"),
        "write_bandwidth_bytes_per_s": at_largest("write"),
        "bandwidth_definition": "STREAM copy b.copy_(a): (bytes read + bytes written) / median "
        "time, at the largest size; below 256 MiB a loop of calls per "
        "timed repeat",
        "matmul_flops_per_s": flops,
        "last_level_cache_bytes": last_level_cache_bytes(dev),
        "points": points,
    }

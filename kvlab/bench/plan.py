"""`kvlab bench ... --plan DEVICE`: what a benchmark run would do, without running it.

Every point the run would measure, in the order it would measure it, with the bytes it
moves, the ledger's predicted time and the memory it needs, against a catalogue device
(`kvlab hardware`) and host link, allocating nothing and needing no GPU. It walks the
same grids as the benchmarks (`decode_groups`, `recompute_grid`, the size lists), so
what it prints is what the run will try. It also says which points the run would refuse
(too big for the device's memory, host placement beyond its limit) and which its time
budget would leave out, from a wall-time estimate per point: the catalogue's peak
figures, every warm-up and repeat, no retries. A GPU session uses it to size its budget
before it spends device time.
"""

from __future__ import annotations

from ..cost import weight_bytes
from ..decoder import get_config, ledger
from ..decoder.fit import HEADROOM
from ..errors import KvlabError
from ..fmt import seconds, si
from ..hardware import Device, get_device, get_tier
from . import host_copy
from . import memory as memory_bench
from .decode import PROBE_BYTES, decode_groups, default_repeats, point_cost_s, resolve_grid
from .recompute import recompute_grid
from .suite import SHARES, allowance_s
from .timing import calls_per_repeat

DEFAULT_LINK = "pcie5-x16"
#: Seconds of set-up per benchmark not counted in its points: building the model,
#: measuring the machine's copy bandwidth, matmul rate and link.
SETUP_S = {"memory": 1.0, "transfer": 1.0, "recompute-vs-fetch": 5.0, "decode": 5.0}
#: Per measured decode point: planning, CUDA-graph capture, the bracketing probes.
DECODE_POINT_OVERHEAD_S = 0.3


def _point(
    label: str,
    moved: float,
    predicted_s: float | None,
    memory: tuple[float, float],
    wall_s: float,
    admit_s: float | None = None,
    refused: str | None = None,
) -> dict:
    """One planned point; `memory` = (device bytes, host bytes); `admit_s`: the estimate the
    run's budget check uses (default: `wall_s`)."""
    return {
        "point": label,
        "bytes": moved,
        "predicted_s": predicted_s,
        "device_bytes": memory[0],
        "host_bytes": memory[1],
        "wall_s": 0.0 if refused else wall_s,
        "admit_s": wall_s if admit_s is None else admit_s,
        "refused": refused,
    }


def plan_memory(dev: Device, quick: bool = False, repeats: int | None = None) -> list[dict]:
    """Copy, read and write at each size, then the matmul rate (bf16; fp32 unless quick)."""
    repeats = repeats or (5 if quick else 9)
    sizes = (memory_bench.QUICK_SIZES if quick else memory_bench.SIZES)["cuda"]
    sizes = [s for s in sizes if 2.5 * s < (1 - HEADROOM) * dev.capacity_bytes] or sizes[:1]
    out = []
    for size in sizes:
        inner = calls_per_repeat(size)
        for kernel, moved in (("copy", 2 * size), ("read", size), ("write", size)):
            t = moved / dev.memory_bandwidth_bytes_per_s
            out.append(
                _point(
                    f"{kernel} {si(size, 'B')} x{inner} a repeat",
                    moved,
                    t,
                    (2 * size, 0.0),
                    (2 + repeats) * inner * t,
                )
            )
    n = memory_bench.MATMUL_N["cuda"]
    for dtype, itemsize in (("bf16", 2),) if quick else (("bf16", 2), ("fp32", 4)):
        t = 2.0 * n**3 / dev.bf16_flops_per_s if dtype == "bf16" else None  # no fp32 figure
        out.append(
            _point(
                f"matmul {dtype} {n}^3",
                3 * n * n * itemsize,
                t,
                (3 * n * n * 4, 0.0),
                (2 + 5) * (t or 1e-3),
            )
        )
    return out


def plan_transfer(
    dev: Device, link_bytes_per_s: float, quick: bool = False, repeats: int | None = None
) -> list[dict]:
    """Host->device and device->host copies, pinned and pageable, at each size (the
    pageable ones are predicted at the link's speed too: the ledger has no staging copy)."""
    repeats = repeats or (5 if quick else 9)
    out = []
    for size in (host_copy.QUICK_SIZES if quick else host_copy.SIZES)["cuda"]:
        inner = calls_per_repeat(size)
        t = size / link_bytes_per_s
        for kind in ("pinned", "pageable"):
            for direction in ("h2d", "d2h"):
                out.append(
                    _point(
                        f"{direction} {kind} {si(size, 'B')} x{inner} a repeat",
                        size,
                        t,
                        (size, size),
                        (2 + repeats) * inner * t,
                    )
                )
    return out


def plan_recompute(  # noqa: PLR0913 - one keyword per `kvlab bench recompute-vs-fetch --plan` option
    dev: Device,
    link_bytes_per_s: float,
    quick: bool = False,
    repeats: int | None = None,
    presets=None,
    tokens=None,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
) -> list[dict]:
    """Per preset and N: the prefill's and the fetch's predicted times, the KV bytes fetched."""
    from ..decoder.kvcache import cache_footprint  # noqa: PLC0415 - torch loads only when used

    repeats = repeats or (3 if quick else 10)
    presets, grid_tokens = recompute_grid(True, quick, presets, tokens)
    out = []
    for preset in presets:
        cfg = get_config(preset)
        weights = _weight_bytes(cfg, weight_dtype)
        for n in grid_tokens:
            pred_re = float(ledger.predict_prefill(cfg, dev, n, weight_dtype, kv_dtype))
            pred_fetch = float(ledger.fetch_time_s(cfg, n, link_bytes_per_s, kv_dtype))
            kv = n * ledger.kv_bytes_per_token(cfg, kv_dtype)
            device = weights + cache_footprint(cfg, 1, n, kv_dtype, "device", "cuda")[1] + kv
            label = f"{preset} N={n} (recompute {seconds(pred_re)}, fetch {seconds(pred_fetch)})"
            wall = (repeats + 1) * (pred_re + 2 * pred_fetch)
            admit = 3 * pred_re * (repeats + 2) + 1  # the run's own budget check
            out.append(
                _point(label, kv, pred_re, (device, 2 * kv), wall, admit, _refusal(device, dev))
            )
    return out


def plan_decode(
    dev: Device,
    link_bytes_per_s: float,
    quick: bool = False,
    repeats: int | None = None,
    **overrides,
) -> list[dict]:
    """Every point of the decode sweep in the order it runs (`decode_groups`)."""
    from ..decoder.kvcache import cache_footprint  # noqa: PLC0415 - torch loads only when used

    grid = resolve_grid(True, quick, **overrides)
    cfg, wd = get_config(grid["preset"]), grid["weight_dtype"]
    repeats, warmup = repeats or default_repeats(True, quick), 1 if quick else 2
    fixed = _weight_bytes(cfg, wd) + 2 * PROBE_BYTES["cuda-quick" if quick else "cuda"]
    out = []
    for group, ctxs, refused in decode_groups(grid, True):
        host, device = (
            cache_footprint(
                cfg, group.batch, max(ctxs), group.kv_dtype, group.placement, "cuda", group.prefetch
            )
            if ctxs
            else (0.0, 0.0)
        )
        device += fixed
        for ctx in grid["contexts"]:
            pred = ledger.predict_decode(
                cfg,
                dev,
                group.batch,
                ctx,
                wd,
                group.kv_dtype,
                group.placement,
                group.prefetch,
                link_bytes_per_s,
            )
            step = pred["predicted_step_s"]
            moved = pred["step_bytes"] + pred["fetch_bytes"]
            out.append(
                _point(
                    f"{group.label} ctx={ctx}",
                    moved,
                    step,
                    (device, host),
                    (warmup + repeats) * step + DECODE_POINT_OVERHEAD_S,
                    point_cost_s(step, repeats, warmup),
                    dict(refused).get(ctx) or _refusal(device, dev),
                )
            )
    return out


def _weight_bytes(cfg, weight_dtype: str) -> float:
    return weight_bytes(ledger.model_spec(cfg), ledger.weight_ledger_dtype(cfg, weight_dtype))


def _refusal(device_bytes: float, dev: Device) -> str | None:
    """The reason the run would refuse a point needing `device_bytes` (as `fit.require` does)."""
    usable = dev.capacity_bytes * (1 - HEADROOM)
    if device_bytes <= usable:
        return None
    return f"needs {si(device_bytes, 'B')} of {si(usable, 'B')} usable"


PLANNERS = {
    "memory": plan_memory,
    "transfer": plan_transfer,
    "recompute-vs-fetch": plan_recompute,
    "decode": plan_decode,
}


def plan_suite(
    hardware: str,
    link: str = DEFAULT_LINK,
    budget_s: float = 480.0,
    quick: bool = False,
    only: tuple[str, ...] | None = None,
    repeats: int | None = None,
    options: dict | None = None,
) -> dict:
    """The plan of a suite (or of the benchmarks in `only`) on catalogue device `hardware`,
    with the suite's budget shared as `run_suite` shares it (one benchmark alone has all of
    it). `options`: per benchmark, keyword arguments for its planner (decode's grid
    overrides, recompute's presets)."""
    dev, tier = get_device(hardware), get_tier(link)
    if tier.kind != "link":
        raise KvlabError(f"--plan-link {link!r} is a {tier.kind}, not a link; try {DEFAULT_LINK}")
    options = options or {}
    left, benchmarks = float(budget_s), []
    for name, share in SHARES:
        if only and name not in only:
            continue
        args = (dev,) if name == "memory" else (dev, tier.bandwidth_bytes_per_s)
        points = PLANNERS[name](*args, quick=quick, repeats=repeats, **options.get(name, {}))
        alone = only is not None and len(only) == 1
        allowance = budget_s if alone else allowance_s(name, share, left, budget_s)
        used = _admit(points, allowance - SETUP_S[name]) + SETUP_S[name]
        left -= used
        benchmarks.append(
            {"benchmark": name, "allowance_s": allowance, "wall_s": used, "points": points}
        )
    return {
        "device": dev.name,
        "device_name": dev.display_name,
        "capacity_bytes": dev.capacity_bytes,
        "bandwidth_bytes_per_s": dev.memory_bandwidth_bytes_per_s,
        "flops_per_s": dev.bf16_flops_per_s,
        "link": tier.name,
        "link_bytes_per_s": tier.bandwidth_bytes_per_s,
        "budget_s": budget_s,
        "quick": quick,
        "benchmarks": benchmarks,
        "wall_s": sum(b["wall_s"] for b in benchmarks),
        "basis": "catalogue peak figures; wall time counts every warm-up and repeat, no "
        "retries, plus set-up; allocates nothing",
    }


def _admit(points: list[dict], allowance_s: float) -> float:
    """Mark the points a budget of `allowance_s` would leave out (the run checks each point's
    generous estimate against what is left); returns the expected seconds spent."""
    spent = 0.0
    for p in points:
        p["beyond_budget"] = p["refused"] is None and p["admit_s"] > allowance_s - spent
        if p["refused"] is None and not p["beyond_budget"]:
            spent += p["wall_s"]
    return spent

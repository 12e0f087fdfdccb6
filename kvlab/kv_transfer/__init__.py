"""Real KV transfer between a "prefill" and a "decode" process, and its recorded results.

`run_benchmark([TransferConfig(...)])` spawns the two processes per engine, moves KV
blocks of 4 KiB..512 MiB (contiguous and paged), and returns one JSON-ready dict with
medians and spread per case, checksums from both sides and the environment;
`save_results` merges it into results/<machine>/kv_transfer.json. Importing this package
does not import torch or mooncake; only the child processes do.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict

from ..bench.results import environment, load_results, machine_slug, write_result
from ..errors import KvlabError
from ..tiers.link_model import fit_link_model
from .channel import PeerError
from .config import (
    DEFAULT_SIZES,
    ENGINES,
    LAYOUTS,
    QUICK_SIZES,
    TransferConfig,
    parse_size,
    parse_sizes,
    quick_config,
)
from .runner import run_local
from .torchrun import finish_torchrun, init_torchrun, run_torchrun, under_torchrun

RESULT_KIND = "kv_transfer"

__all__ = [
    "TransferConfig",
    "quick_config",
    "run_benchmark",
    "save_results",
    "PeerError",
    "ENGINES",
    "LAYOUTS",
    "DEFAULT_SIZES",
    "QUICK_SIZES",
    "parse_size",
    "parse_sizes",
    "RESULT_KIND",
]


def run_benchmark(configs, progress=None) -> dict:
    """Run each configuration (one engine each) and return the combined result.

    Raises KvlabError on any failure, including a checksum that differs between the
    two sides: a transfer that corrupts data has no bandwidth worth reporting.
    """

    configs = [c.validate() for c in configs]
    if not configs:
        raise KvlabError("no engine to run")
    device = configs[0].device
    if device.startswith("cuda"):
        _check_cuda(configs)
    where = "cuda" if device.startswith("cuda") else "cpu"
    result = {"kind": RESULT_KIND, "environment": environment(where), "engines": {}}
    reporter = True  # under torchrun only rank 0 (prefill) reports
    if under_torchrun():
        init_torchrun(configs)
    try:
        return _run_all(configs, result, progress, reporter)
    finally:
        if under_torchrun():
            finish_torchrun()


def _run_all(configs, result, progress, reporter) -> dict:
    for config in configs:
        start = time.monotonic()
        if under_torchrun():
            measured = run_torchrun(config, progress)
            if measured is None:
                reporter = False
                continue
        else:
            measured = run_local(config, progress)
        bad = [r for r in measured["rows"] if not r["checksum_ok"]]
        if bad:
            r = bad[0]
            raise KvlabError(
                f"kv-transfer ({config.label}): {r['layout']} {r['bytes']} bytes "
                f"arrived corrupted (prefill {r['checksum']['prefill']}, decode "
                f"{r['checksum']['decode']})"
            )
        settings = {k: v for k, v in asdict(config).items() if k != "fault"}
        result["engines"][config.label] = {
            "engine": config.engine,
            "backend": config.backend,
            "config": settings,
            "processes": measured["processes"],
            "pids": measured["pids"],
            "launcher": measured.get("launcher", "spawn"),
            "wall_s": time.monotonic() - start,
            # other work on the machine skews timings: the 1/5/15-minute load after this engine ran
            "load_average_after": (
                [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
            ),
            "summary": summary(measured["rows"]),
            "rows": measured["rows"],
        }
    return result if reporter else {}


def _check_cuda(configs) -> None:
    """Fail in one line before spawning anything if the GPUs cannot do what was asked."""

    try:
        import torch
    except ImportError:
        raise KvlabError("--device cuda needs torch with CUDA") from None
    if not torch.cuda.is_available():
        raise KvlabError(
            "--device cuda: torch sees no CUDA device (is this the CPU build of torch?)"
        )
    if (
        not under_torchrun()
        and torch.cuda.device_count() < 2
        and any(c.engine == "torch" for c in configs)
    ):
        raise KvlabError(
            "NCCL needs one GPU per process and this machine has one: use --engine "
            "mooncake --device cuda, or --device cpu, or two GPUs"
        )


def summary(rows: list[dict]) -> dict:
    """Smallest-message time, best bandwidth and the fitted (latency, bandwidth) per layout."""

    out = {}
    for layout in LAYOUTS:
        sel = sorted((r for r in rows if r["layout"] == layout), key=lambda r: r["bytes"])
        if not sel:
            continue
        entry = {
            "smallest_bytes": sel[0]["bytes"],
            "smallest_time_s": sel[0]["time_s"]["median"],
            "best_bandwidth_bytes_per_s": max(r["bandwidth_bytes_per_s"]["median"] for r in sel),
        }
        if len(sel) >= 2:
            try:
                entry["fit"] = fit_link_model(
                    [r["bytes"] for r in sel], [r["time_s"]["median"] for r in sel]
                )
            except KvlabError:
                pass
        out[layout] = entry
    return out


def save_results(result: dict, command: str = "", machine: str | None = None):
    """Merge `result` into results/<machine>/kv_transfer.json (by engine) and return the path.

    Each engine entry keeps the environment and command it was measured with, so a
    later run of one engine does not erase the other's figures.
    """

    env = result["environment"]
    device = env.get("device", "cpu")
    slug = machine or machine_slug(device)
    existing = load_results(RESULT_KIND).get(slug, {})
    engines = dict(existing.get("engines", {})) if existing.get("kind") == RESULT_KIND else {}
    for label, entry in result["engines"].items():
        engines[label] = {**entry, "environment": env, "command": command}
    payload = {"kind": RESULT_KIND, "machine": slug, "environment": env, "engines": engines}
    return write_result(RESULT_KIND, payload, device, machine=slug)

"""`kvlab bench recompute-vs-fetch`: prefill N tokens, or fetch their KV from host memory?

A prefix-cache hit replaces recomputation (a prefill of the N cached tokens) with a
fetch (their KV, from wherever it lives, into the device's memory). This benchmark times
both on the machine, for a range of N:

- recompute: one prefill of N tokens from scratch on the device (weights resident);
- fetch: N tokens of KV for every layer copied from host memory (pinned, one contiguous
  copy per layer, as a swap-in does) into device memory; on CUDA also from pageable memory.

The crossover is the N where the two curves cross (log-interpolated between grid
points): where fetch is slower than recompute, a hit is slower than a miss. The ledger's
prediction for both (with the measured matmul rate and link bandwidth) is recorded next
to each measurement.
"""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass

from ..decoder import fit, ledger
from ..errors import KvlabError
from .host_copy import link_bandwidth
from .memory import MiB, copy_bandwidth, matmul_rate
from .results import environment
from .timing import Budget, Progress, machine_state, measure_undisturbed, open_device, time_call

GRIDS = {
    "cpu": dict(presets=("cpu-bench",), tokens=(16, 32, 64, 128, 256, 512, 1024)),
    "cpu-quick": dict(presets=("small",), tokens=(16, 64, 256)),
    "cuda": dict(presets=("gpu-bench", "mha-small"), tokens=(16, 64, 256, 1024, 4096, 16384)),
    "cuda-quick": dict(presets=("mha-small",), tokens=(64, 1024)),
}


def crossover(tokens, recompute_s, fetch_s) -> float | None:
    """Token count where fetch_s - recompute_s changes sign (log-log interpolation), or None.

    Returns the first crossing along increasing N.
    """
    pts = [
        (n, r, f)
        for n, r, f in zip(tokens, recompute_s, fetch_s, strict=True)
        if r and f and r > 0 and f > 0
    ]
    for (n0, r0, f0), (n1, r1, f1) in zip(pts, pts[1:], strict=False):
        d0, d1 = math.log(f0 / r0), math.log(f1 / r1)
        if d0 == 0:
            return float(n0)
        if (d0 < 0) != (d1 < 0) or d1 == 0:
            w = d0 / (d0 - d1)
            return float(math.exp(math.log(n0) + w * (math.log(n1) - math.log(n0))))
    return None


def _fetch_fn(host_layers, dev_layers):
    def fetch():
        for src, dst in zip(host_layers, dev_layers, strict=True):
            dst.copy_(src, non_blocking=True)

    return fetch


def recompute_grid(
    cuda: bool, quick: bool, presets=None, tokens=None
) -> tuple[tuple[str, ...], list[int]]:
    """(decoder presets, token counts N) of the sweep: the device's default, or those asked for."""
    grid = GRIDS[("cuda" if cuda else "cpu") + ("-quick" if quick else "")]
    return tuple(presets or grid["presets"]), sorted(int(n) for n in (tokens or grid["tokens"]))


def _machine(dev, weight_dtype: str, quick: bool) -> dict:
    """The figures the ledger is fed: matmul rate, copy bandwidth, host->device bandwidth."""
    compute = weight_dtype if weight_dtype in ("fp32", "bf16", "fp16") else "bf16"
    size = 64 * MiB if quick else 256 * MiB
    machine = {"flops_per_s": matmul_rate(dev, compute), "flops_dtype": compute}
    machine["bandwidth_bytes_per_s"], _ = copy_bandwidth(dev, (256 if quick else 512) * MiB)
    machine["link_bytes_per_s"], _ = link_bandwidth(dev, size, pinned=True)
    if dev.type == "cuda":
        machine["pageable_link_bytes_per_s"], _ = link_bandwidth(dev, size, pinned=False)
    return machine


@dataclass
class _Run:
    """What every point of one recompute-vs-fetch sweep shares."""

    dev: object
    spec_device: object
    machine: dict
    weight_dtype: str
    kv_dtype: str
    repeats: int
    tries: int
    seed: int
    budget: Budget
    progress: Progress

    @property
    def kinds(self) -> tuple[str, ...]:
        return ("pinned", "pageable") if self.dev.type == "cuda" else ("pageable",)


def _time_fetch(run: _Run, nbytes: int, layers: int) -> dict:
    """Median time to copy `layers` host buffers of `nbytes` into the device, per kind of host
    memory (pinned and pageable on CUDA)."""
    import torch

    out = {}
    dev_layers = [torch.empty(nbytes, dtype=torch.uint8, device=run.dev) for _ in range(layers)]
    for kind in run.kinds:
        host_layers = [
            torch.ones(nbytes, dtype=torch.uint8, pin_memory=(kind == "pinned"))
            for _ in range(layers)
        ]
        fetch = _fetch_fn(host_layers, dev_layers)
        t, _, _ = measure_undisturbed(
            lambda fetch=fetch: time_call(fetch, run.dev, run.repeats, warmup=1), attempts=run.tries
        )
        key = "fetch_s" if kind == run.kinds[0] else f"fetch_{kind}_s"
        out[key], out[key.replace("_s", "_spread")] = t.median_s, t.spread
        del host_layers
    return out


def _time_prefill(run: _Run, model, cache, tok):
    """Median time of one prefill of `tok` into an empty cache (the same plan every repeat)."""
    import torch

    plan = model.plan(cache, [0], tok.shape[1])
    with torch.no_grad():
        t, _, _ = measure_undisturbed(
            lambda: time_call(
                lambda: model.forward_plan(tok, cache, plan), run.dev, run.repeats, warmup=1
            ),
            attempts=run.tries,
        )
    return t


def measure_tokens(run: _Run, model, n: int) -> dict | None:
    """One point: prefill N tokens against fetching their KV; None when refused (and logged)."""
    import torch

    cfg, preset = model.config, model.config.name
    pred_re = float(ledger.predict_prefill(cfg, run.spec_device, n, run.weight_dtype, run.kv_dtype))
    if not run.budget.allows(3 * pred_re * (run.repeats + 2) + 1):
        run.progress.step(f"{preset} N={n}: skipped (time budget)")
        return None
    nbytes = int(n * ledger.kv_bytes_per_token(cfg, run.kv_dtype) / cfg.num_layers)
    try:
        cache = model.new_cache(1, n, run.kv_dtype, "device")
        fit.require(
            f"host copy of {n} tokens of KV", 2 * nbytes * cfg.num_layers, "cpu", "use fewer tokens"
        )
    except KvlabError as exc:
        run.progress.step(f"{preset} N={n}: skipped ({exc})")
        return None
    gen = torch.Generator().manual_seed(run.seed)
    tok = torch.randint(0, cfg.vocab_size, (1, n), generator=gen).to(run.dev)
    t_re = _time_prefill(run, model, cache, tok)
    del cache
    point = {
        "tokens": n,
        "recompute_s": t_re.median_s,
        "recompute_spread": t_re.spread,
        "predicted_recompute_s": pred_re,
        "kv_bytes": nbytes * cfg.num_layers,
        "predicted_fetch_s": float(
            ledger.fetch_time_s(cfg, n, run.machine["link_bytes_per_s"], run.kv_dtype)
        ),
        **_time_fetch(run, nbytes, cfg.num_layers),
    }
    run.progress.step(
        f"{preset} N={n}: recompute {t_re.median_s * 1e3:9.3f} ms "
        f"(ledger {pred_re * 1e3:9.3f}), fetch {point['fetch_s'] * 1e3:8.3f} ms "
        f"(ledger {point['predicted_fetch_s'] * 1e3:8.3f})"
    )
    gc.collect()
    return point


def measure_preset(run: _Run, preset: str, grid_tokens: list[int], kernels: str, env: dict) -> dict:
    """One decoder preset's curve: every N, the two crossovers (measured and predicted)."""
    import torch

    from ..decoder import Decoder  # noqa: PLC0415 - torch

    model = Decoder(preset, run.weight_dtype, run.dev, seed=run.seed, kernels=kernels)
    env.update(model.kernels_environment())
    cfg = model.config
    points = [p for p in (measure_tokens(run, model, n) for n in grid_tokens) if p is not None]
    toks = [p["tokens"] for p in points]

    def column(key):
        return [p.get(key) for p in points]

    curve = {
        "preset": preset,
        "config": cfg.to_dict(),
        "weight_dtype": run.weight_dtype,
        "kv_dtype": run.kv_dtype,
        "kv_bytes_per_token": ledger.kv_bytes_per_token(cfg, run.kv_dtype),
        "streamed_weight_bytes": model.streamed_weight_bytes(),
        "points": points,
        "crossover_tokens": crossover(toks, column("recompute_s"), column("fetch_s")),
        "predicted_crossover_tokens": crossover(
            toks, column("predicted_recompute_s"), column("predicted_fetch_s")
        ),
    }
    if run.dev.type == "cuda":
        curve["pageable_crossover_tokens"] = crossover(
            toks, column("recompute_s"), column("fetch_pageable_s")
        )
    del model
    gc.collect()
    if run.dev.type == "cuda":
        torch.cuda.empty_cache()
    return curve


def run_recompute(  # noqa: PLR0913 - one keyword per `kvlab bench recompute-vs-fetch` option
    device="cpu",
    presets=None,
    tokens=None,
    weight_dtype="bf16",
    kv_dtype="bf16",
    repeats=None,
    budget_s=None,
    quick=False,
    quiet=False,
    seed=0,
    kernels="auto",
) -> dict:
    """Prefill N tokens against fetching their KV, for every preset and N; a JSON-ready dict."""
    dev, alloc = open_device(device)
    cuda = dev.type == "cuda"
    presets, grid_tokens = recompute_grid(cuda, quick, presets, tokens)
    env = {**environment(str(dev)), **alloc, "at_start": machine_state()}
    machine = _machine(dev, weight_dtype, quick)
    spec_device = ledger.measured_device(
        env["device_name"],
        machine["bandwidth_bytes_per_s"],
        machine["flops_per_s"],
        fit.device_available_bytes(dev),
    )
    repeats = repeats or (3 if quick or not cuda else 10)
    run = _Run(
        dev,
        spec_device,
        machine,
        weight_dtype,
        kv_dtype,
        repeats,
        1 if quick else 3,
        seed,
        Budget(budget_s),
        Progress("recompute-vs-fetch", len(presets) * len(grid_tokens), quiet),
    )
    curves = [measure_preset(run, preset, grid_tokens, kernels, env) for preset in presets]
    env["at_end"] = machine_state()
    return {
        "benchmark": "recompute-vs-fetch",
        "environment": env,
        "quick": quick,
        "machine": machine,
        "fetch_path": "pinned host -> device, one copy per layer"
        if cuda
        else "host -> host memcpy, one copy per layer (no accelerator)",
        "curves": curves,
    }

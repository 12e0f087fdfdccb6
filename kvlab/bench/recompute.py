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

from ..errors import KvlabError
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
    pts = [(n, r, f) for n, r, f in zip(tokens, recompute_s, fetch_s) if r and f and r > 0 and f > 0]
    for (n0, r0, f0), (n1, r1, f1) in zip(pts, pts[1:]):
        d0, d1 = math.log(f0 / r0), math.log(f1 / r1)
        if d0 == 0:
            return float(n0)
        if (d0 < 0) != (d1 < 0) or d1 == 0:
            w = d0 / (d0 - d1)
            return float(math.exp(math.log(n0) + w * (math.log(n1) - math.log(n0))))
    return None


def _fetch_fn(host_layers, dev_layers):
    def fetch():
        for src, dst in zip(host_layers, dev_layers):
            dst.copy_(src, non_blocking=True)
    return fetch


def run_recompute(device="cpu", presets=None, tokens=None, weight_dtype="bf16", kv_dtype="bf16", repeats=None,
                  budget_s=None, quick=False, quiet=False, seed=0, kernels="auto") -> dict:
    import torch

    from ..decoder import Decoder, fit, ledger
    from .memory import MiB, copy_bandwidth, matmul_rate
    from .transfer import link_bandwidth

    dev, alloc = open_device(device)
    cuda = dev.type == "cuda"
    grid = dict(GRIDS[("cuda" if cuda else "cpu") + ("-quick" if quick else "")])
    presets = tuple(presets or grid["presets"])
    grid_tokens = sorted(int(n) for n in (tokens or grid["tokens"]))
    repeats = repeats or (3 if quick or not cuda else 10)
    tries = 1 if quick else 3  # re-measure a point another process disturbed
    budget = Budget(budget_s)
    env = {**environment(str(dev)), **alloc, "at_start": machine_state()}
    compute = weight_dtype if weight_dtype in ("fp32", "bf16", "fp16") else "bf16"
    machine = {"flops_per_s": matmul_rate(dev, compute), "flops_dtype": compute}
    machine["bandwidth_bytes_per_s"], _ = copy_bandwidth(dev, (256 if quick else 512) * MiB)
    machine["link_bytes_per_s"], _ = link_bandwidth(dev, 64 * MiB if quick else 256 * MiB, pinned=True)
    if cuda:
        machine["pageable_link_bytes_per_s"], _ = link_bandwidth(dev, 64 * MiB if quick else 256 * MiB, pinned=False)
    spec_device = ledger.measured_device(env["device_name"], machine["bandwidth_bytes_per_s"],
                                         machine["flops_per_s"], fit.device_available_bytes(dev))
    kinds = ("pinned", "pageable") if cuda else ("pageable",)
    progress = Progress("recompute-vs-fetch", len(presets) * len(grid_tokens), quiet)
    curves = []
    for preset in presets:
        model = Decoder(preset, weight_dtype, dev, seed=seed, kernels=kernels)
        env["kernels"], env["kernels_note"] = model.kernels, model.kernels_note
        cfg = model.config
        per_layer_token = ledger.kv_bytes_per_token(cfg, kv_dtype) / cfg.num_layers
        points = []
        for n in grid_tokens:
            pred_re = float(ledger.predict_prefill(cfg, spec_device, n, weight_dtype, kv_dtype))
            if not budget.allows(3 * pred_re * (repeats + 2) + 1):
                progress.step(f"{preset} N={n}: skipped (time budget)")
                continue
            try:
                cache = model.new_cache(1, n, kv_dtype, "device")
                nbytes = int(n * per_layer_token)
                fit.require(f"host copy of {n} tokens of KV", 2 * nbytes * cfg.num_layers, "cpu", "use fewer tokens")
            except KvlabError as exc:
                progress.step(f"{preset} N={n}: skipped ({exc})")
                continue
            tok = torch.randint(0, cfg.vocab_size, (1, n), generator=torch.Generator().manual_seed(seed)).to(dev)
            plan = model.plan(cache, [0], n)
            with torch.no_grad():
                t_re, _, _ = measure_undisturbed(
                    lambda: time_call(lambda: model.forward_plan(tok, cache, plan), dev, repeats, warmup=1), attempts=tries)
            del cache, plan
            point = {"tokens": n, "recompute_s": t_re.median_s, "recompute_spread": t_re.spread,
                     "predicted_recompute_s": pred_re, "kv_bytes": nbytes * cfg.num_layers,
                     "predicted_fetch_s": float(ledger.fetch_time_s(cfg, n, machine["link_bytes_per_s"], kv_dtype))}
            dev_layers = [torch.empty(nbytes, dtype=torch.uint8, device=dev) for _ in range(cfg.num_layers)]
            for kind in kinds:
                host_layers = [torch.ones(nbytes, dtype=torch.uint8, pin_memory=(kind == "pinned"))
                               for _ in range(cfg.num_layers)]
                t_f, _, _ = measure_undisturbed(lambda: time_call(_fetch_fn(host_layers, dev_layers), dev, repeats, warmup=1),
                                               attempts=tries)
                key = "fetch_s" if kind == kinds[0] else f"fetch_{kind}_s"
                point[key] = t_f.median_s
                point[key.replace("_s", "_spread")] = t_f.spread
                del host_layers
            del dev_layers
            points.append(point)
            progress.step(f"{preset} N={n}: recompute {t_re.median_s * 1e3:9.3f} ms (ledger {pred_re * 1e3:9.3f}), "
                          f"fetch {point['fetch_s'] * 1e3:8.3f} ms (ledger {point['predicted_fetch_s'] * 1e3:8.3f})")
            gc.collect()
        toks = [p["tokens"] for p in points]
        curve = {
            "preset": preset, "config": cfg.to_dict(), "weight_dtype": weight_dtype, "kv_dtype": kv_dtype,
            "kv_bytes_per_token": ledger.kv_bytes_per_token(cfg, kv_dtype),
            "streamed_weight_bytes": model.streamed_weight_bytes(),
            "points": points,
            "crossover_tokens": crossover(toks, [p["recompute_s"] for p in points], [p["fetch_s"] for p in points]),
            "predicted_crossover_tokens": crossover(toks, [p["predicted_recompute_s"] for p in points],
                                                    [p["predicted_fetch_s"] for p in points]),
        }
        if cuda:
            curve["pageable_crossover_tokens"] = crossover(
                toks, [p["recompute_s"] for p in points], [p.get("fetch_pageable_s") for p in points])
        curves.append(curve)
        del model
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    env["at_end"] = machine_state()
    return {
        "benchmark": "recompute-vs-fetch",
        "environment": env,
        "quick": quick,
        "machine": machine,
        "fetch_path": "pinned host -> device, one copy per layer" if cuda
        else "host -> host memcpy, one copy per layer (no accelerator)",
        "curves": curves,
    }

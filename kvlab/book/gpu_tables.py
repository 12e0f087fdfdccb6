"""The measured chapter's GPU data: what real kernels reach on each GPU with published
measurements (kvlab.kernel_tables: TensorRT-LLM kernel tables from aiconfigurator-core), and
the ledger's ceiling and measured mode against them. Plain arrays in dicts."""

from __future__ import annotations

import numpy as np

from .. import cost
from ..deployment import Deployment, KernelTables
from ..hardware import get_device
from ..kernel_tables import devices_with_data, load

#: Llama 3.1 8B's layers: the GEMM the batch figure follows (gate and up fused: 4096 ->
#: 2 x 14336) and the attention layout (32 query heads, 8 K/V heads, head_dim 128).
BATCH_GEMM_NK = (28672, 4096)
ATTENTION_LAYOUT = (32, 8, 128)
#: Weights of at least this many bytes count as "large" GEMVs (the figure the notes quote).
LARGE_GEMV_BYTES = 50e6
BF16_BYTES = 2


def gpus() -> tuple[str, ...]:
    return devices_with_data()


def gemv_band(device: str) -> dict:
    """Achieved bandwidth of every bf16 GEMM with one token (m = 1) against its weight bytes:
    {"weight_bytes", "bandwidth_bytes_per_s", "fraction_of_sheet", "median_large_fraction"}."""
    t = load(device)
    table = t.raw["gemm"]["dtypes"]["bf16"]
    sheet = get_device(device).memory_bandwidth_bytes_per_s
    sizes, rates = [], []
    for shape, entry in table["shapes"].items():
        n, k = (int(v) for v in shape.split("x"))
        latency = entry["latency_us"][0]
        if entry["how"] != "measured" or latency is None:
            continue
        sizes.append(n * k * BF16_BYTES)
        rates.append(n * k * BF16_BYTES / (latency * 1e-6))
    order = np.argsort(sizes)
    size, rate = np.asarray(sizes, dtype=float)[order], np.asarray(rates)[order]
    large = rate[size >= LARGE_GEMV_BYTES] / sheet
    return {
        "device": device,
        "weight_bytes": size,
        "bandwidth_bytes_per_s": rate,
        "fraction_of_sheet": rate / sheet,
        "sheet_bytes_per_s": sheet,
        "median_large_fraction": float(np.median(large)) if large.size else float("nan"),
    }


def gemm_over_batch(device: str, nk=BATCH_GEMM_NK) -> dict:
    """One projection GEMM over the tokens m it multiplies: measured time against its
    ceiling (max of bytes / bandwidth and FLOPs / peak), bf16."""
    t = load(device)
    n, k = nk
    curve, _ = t.gemm("bf16", n, k)
    dev = get_device(device)
    m = curve.x
    flops = 2.0 * m * n * k
    moved = (n * k + m * k + m * n) * BF16_BYTES
    ceiling = np.maximum(
        moved / dev.memory_bandwidth_bytes_per_s, flops / dev.peak_flops_per_s("bf16")
    )
    return {
        "device": device,
        "m": m,
        "latency_s": curve.y,
        "ceiling_s": ceiling,
        "efficiency": ceiling / curve.y,
        "tflops": flops / curve.y / 1e12,
    }


def attention_over_context(device: str, batch: int, layout=ATTENTION_LAYOUT) -> dict:
    """One layer's decode attention over the tokens in the cache, at a batch: the KV bytes
    it reads per second, against the sheet bandwidth (bf16 KV)."""
    heads, kv_heads, head_dim = layout
    grid, _ = load(device).attention("generation", heads, kv_heads, head_dim, "bf16")
    tokens = grid.y
    latency, ok = grid(np.full(tokens.shape, float(batch)), tokens)
    kv_bytes = batch * tokens * 2 * kv_heads * head_dim * BF16_BYTES
    sheet = get_device(device).memory_bandwidth_bytes_per_s
    return {
        "device": device,
        "batch": batch,
        "tokens": tokens[ok],
        "latency_s": latency[ok],
        "bandwidth_bytes_per_s": kv_bytes[ok] / latency[ok],
        "fraction_of_sheet": kv_bytes[ok] / latency[ok] / sheet,
    }


def ledger_against_kernels(
    device: str, model: str = "llama-3.1-8b", context: int = 4096, batches=(1, 2, 4, 8, 16, 32, 64)
) -> dict:
    """A decode step's time, ceiling and measured mode, over the batch (bf16)."""
    b = np.asarray(batches)
    step = cost.decode_step(Deployment(model, device, "bf16", "bf16", KernelTables()), b, context)
    measured, ceiling = (
        np.asarray(step.step_time_s, dtype=float),
        np.asarray(step.ceiling_step_time_s),
    )
    ok = np.isfinite(measured)
    return {
        "device": device,
        "model": model,
        "context": context,
        "batch": b[ok],
        "measured_s": measured[ok],
        "ceiling_s": ceiling[ok],
        "ratio": measured[ok] / ceiling[ok],
    }

"""Tensor parallelism: the degree, the GPU link its all-reduces cross, and their latency.

Megatron-style tensor parallelism over N GPUs of one server splits every weight matrix and
the K/V heads N ways (`kvlab.operators` lays out the per-GPU shapes) and joins the partial
results with two all-reduces per layer, of batch x hidden elements each. An all-reduce
costs a fixed latency plus its traffic over the link; at decode's small messages the
latency dominates, which is why splitting a step N ways never makes it N times faster.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .errors import KvlabError
from .hardware import Device, get_device, gpu_link
from .kernel_tables.tables import devices_with_data, load
from .models import ModelSpec


@dataclass(frozen=True)
class AllReduceLink:
    """How the all-reduces of tensor parallelism are costed on one device at one degree:
    each takes `latency_s` plus 2 (N - 1) / N of its message over `bandwidth_bytes_per_s`."""

    link: str  # tier name of the GPU-to-GPU link
    bandwidth_bytes_per_s: float  # per direction, from the catalogue
    latency_s: float  # per all-reduce: the measured all-reduce of the smallest message
    how: str


@lru_cache(maxsize=64)
def allreduce_link(hardware: Device | str, gpus: int) -> AllReduceLink:
    """The link and per-collective latency of an all-reduce over `gpus` GPUs of `hardware`.

    The latency is what TensorRT-LLM's all-reduce of the smallest message (128 bf16
    elements) takes in the measured tables (`kvlab.kernel_tables`): a collective that moves
    almost nothing, so its time is the fixed cost every all-reduce pays (launch,
    synchronisation across the GPUs). Devices without tables use those of the device their
    link names (`allreduce_measured_on` in the catalogue); a link without any raises."""
    dev, gpus = get_device(hardware), int(gpus)
    link = gpu_link(dev)
    measured_on = dev.name if dev.name in devices_with_data() else link.allreduce_measured_on
    if measured_on is None:
        raise KvlabError(
            f"{dev.name}: no measured all-reduce latency for its {link.name} link "
            f"(tables exist for {', '.join(devices_with_data())}); tensor "
            "parallelism is not costed there"
        )
    curve = load(measured_on).all_reduce(gpus)
    latency = float(curve.y[0])
    how = (
        f"{link.name} at {link.bandwidth_bytes_per_s / 1e9:.4g} GB/s per direction, "
        f"{latency * 1e6:.2f} us per all-reduce (TensorRT-LLM's all-reduce of "
        f"{curve.lo:g} bf16 elements over {gpus} GPUs, measured on {measured_on})"
    )
    return AllReduceLink(link.name, link.bandwidth_bytes_per_s, latency, how)


def tensor_parallel_notes(m: ModelSpec, tp: int, link: AllReduceLink) -> tuple:
    """What a reader must know about a result at tensor-parallel `tp`."""
    notes = [
        f"tensor parallel {tp}: bytes, FLOPs, memory, fits and max_batch are per GPU, "
        f"tokens/s the group's; 2 all-reduces per layer over {link.how}"
    ]
    if m.is_mla:
        notes.append(
            f"{m.name} caches one MLA latent per token, which has no heads to split: "
            f"every one of the {tp} GPUs holds all of it (replicated)"
        )
    elif tp > m.num_kv_heads:
        notes.append(
            f"{m.num_kv_heads} K/V heads over {tp} GPUs: each GPU holds one, replicated "
            f"on {tp // m.num_kv_heads} GPUs, so its KV is 1/{m.num_kv_heads} of the "
            f"model's, not 1/{tp}"
        )
    return tuple(notes)

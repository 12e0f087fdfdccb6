"""Devices (GPUs) and tiers (memories and links) from the package catalogue.

Everything is converted to SI bytes, bytes/s and FLOP/s here, once: links are sold in
bits or transfers per second, and a bits-vs-bytes slip is the commonest bug of this
domain's calculators. `Tier.derivation` keeps the conversion readable.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from .errors import KvlabError, unknown_name

GB = 1e9
TFLOPS = 1e12
#: The share of a device's memory a serving engine gives the weights and the KV cache, the
#: rest holding activations, CUDA graphs and the allocator's slack: vLLM's default
#: gpu_memory_utilization. The ledger's capacity and the simulator's use this one number.
USABLE_MEMORY_FRACTION = 0.9


@dataclass(frozen=True)
class Device:
    """An accelerator: memory capacity and bandwidth, dense peak FLOP/s."""

    name: str
    display_name: str
    memory_type: str
    capacity_bytes: float
    memory_bandwidth_bytes_per_s: float
    bf16_flops_per_s: float
    fp8_flops_per_s: float | None  # None: no fp8 tensor cores
    source: str
    gpu_link: str | None = None  # tier name of the GPU-to-GPU link in one server
    kernel_tables_from: str | None = None  # a device of the same die whose tables stand in
    #: the names the driver reports for exactly this part (nvidia-smi, torch)
    reported_names: tuple[str, ...] = ()

    @property
    def usable_capacity_bytes(self) -> float:
        """What weights + KV may fill: capacity x USABLE_MEMORY_FRACTION."""
        return self.capacity_bytes * USABLE_MEMORY_FRACTION

    def peak_flops_per_s(self, compute: str = "bf16") -> float:
        """Dense peak for 'bf16' or 'fp8' matmuls; fp8 falls back to bf16 where absent."""
        if compute == "fp8" and self.fp8_flops_per_s:
            return self.fp8_flops_per_s
        return self.bf16_flops_per_s

    def ridge_flops_per_byte(self, compute: str = "bf16") -> float:
        """Arithmetic intensity where the roofline turns from memory- to compute-bound."""
        return self.peak_flops_per_s(compute) / self.memory_bandwidth_bytes_per_s


@dataclass(frozen=True)
class Tier:
    """A place bytes come from: a memory (HBM, GDDR, DDR) or a link (PCIe, NVLink, NIC)."""

    name: str
    kind: str  # "memory" or "link"
    bandwidth_bytes_per_s: float  # peak, per direction
    derivation: str  # how the sold figure became bytes/s
    example: str
    source: str
    allreduce_measured_on: str | None = None  # device whose all-reduce tables stand for it


def _tier_bandwidth(name: str, entry: dict) -> tuple[float, str]:
    """Convert the figure a tier is sold by into bytes/s, with the arithmetic spelled out."""
    if "bandwidth_gb_per_s" in entry:
        gbps = entry["bandwidth_gb_per_s"]
        return gbps * GB, f"{gbps:g} GB/s"
    if "gigabits_per_s" in entry:
        gbit = entry["gigabits_per_s"]
        return gbit * 1e9 / 8, f"{gbit:g} Gb/s / 8 bits per byte = {gbit / 8:g} GB/s"
    if "gigatransfers_per_s" in entry:
        gt, lanes, (num, den) = entry["gigatransfers_per_s"], entry["lanes"], entry["encoding"]
        value = gt * 1e9 * lanes * num / den / 8
        return value, (
            f"{gt:g} GT/s x {lanes} lanes x {num}/{den} encoding / 8 bits = {value / GB:.1f} GB/s"
        )
    if "mega_transfers_per_s" in entry:
        mt, ch, bits = entry["mega_transfers_per_s"], entry["channels"], entry["bus_bits"]
        value = mt * 1e6 * ch * bits / 8
        return value, f"{mt:g} MT/s x {ch} channels x {bits} bits / 8 = {value / GB:.1f} GB/s"
    raise KvlabError(f"hardware catalogue: tier {name!r} gives no bandwidth")


@lru_cache(maxsize=1)
def _catalogue() -> tuple[dict[str, Device], dict[str, Tier]]:
    text = resources.files("kvlab").joinpath("data/hardware.toml").read_text()
    raw = tomllib.loads(text)
    devices = {
        name: Device(
            name=name,
            display_name=e["display_name"],
            memory_type=e["memory_type"],
            capacity_bytes=e["capacity_gb"] * GB,
            memory_bandwidth_bytes_per_s=e["memory_bandwidth_gb_per_s"] * GB,
            bf16_flops_per_s=e["bf16_tflops"] * TFLOPS,
            fp8_flops_per_s=e["fp8_tflops"] * TFLOPS if "fp8_tflops" in e else None,
            source=e["source"],
            gpu_link=e.get("gpu_link"),
            kernel_tables_from=e.get("kernel_tables_from"),
            reported_names=tuple(e.get("reported_names", ())),
        )
        for name, e in raw["devices"].items()
    }
    claimed: dict[str, str] = {}
    for d in devices.values():
        for reported in d.reported_names:
            other = claimed.setdefault(_reported_key(reported), d.name)
            if other != d.name:
                raise KvlabError(
                    f"hardware catalogue: {reported!r} is a reported name of both {other} "
                    f"and {d.name}"
                )
    tiers = {}
    for name, e in raw["tiers"].items():
        bandwidth, derivation = _tier_bandwidth(name, e)
        tiers[name] = Tier(
            name,
            e["kind"],
            bandwidth,
            derivation,
            e["example"],
            e["source"],
            e.get("allreduce_measured_on"),
        )
    for d in devices.values():
        if d.gpu_link is not None and d.gpu_link not in tiers:
            raise KvlabError(f"hardware catalogue: {d.name}'s gpu_link {d.gpu_link!r} is no tier")
        if d.kernel_tables_from is not None and d.kernel_tables_from not in devices:
            raise KvlabError(
                f"hardware catalogue: {d.name}'s kernel_tables_from "
                f"{d.kernel_tables_from!r} is no device"
            )
    return devices, tiers


def devices() -> dict[str, Device]:
    """All catalogued devices by name."""
    return dict(_catalogue()[0])


def tiers() -> dict[str, Tier]:
    """All catalogued memory and link tiers by name, fastest first."""
    return dict(sorted(_catalogue()[1].items(), key=lambda kv: -kv[1].bandwidth_bytes_per_s))


def _lookup(kind: str, name, entries: dict):
    """The catalogue entry called `name`, case aside; unknown names raise with the valid list."""
    found = entries.get(str(name).lower())
    if found is None:
        raise unknown_name(kind, name, entries)
    return found


def get_device(name: str | Device) -> Device:
    """A device by catalogue name; unknown names raise with the valid list."""
    return name if isinstance(name, Device) else _lookup("hardware", name, _catalogue()[0])


def _reported_key(name: str) -> str:
    return " ".join(str(name).lower().split())


def device_for_reported_name(reported: str | None) -> Device | None:
    """The catalogue device whose `reported_names` hold this GPU's name (what nvidia-smi or
    torch report), case and spacing aside; None for a GPU the catalogue does not list. Never
    a device whose name is only part of it: an "NVIDIA L40" is not an L4."""
    key = _reported_key(reported or "")
    if not key:
        return None
    return next(
        (d for d in _catalogue()[0].values() if key in map(_reported_key, d.reported_names)),
        None,
    )


def get_tier(name: str | Tier) -> Tier:
    """A memory or link tier by catalogue name; unknown names raise with the valid list."""
    return name if isinstance(name, Tier) else _lookup("tier", name, _catalogue()[1])


def gpu_link(device: str | Device) -> Tier:
    """The link a device's GPUs use to talk to each other in one server (for the
    all-reduces of tensor parallelism); a device without one in the catalogue raises."""
    dev = get_device(device)
    if dev.gpu_link is None:
        raise KvlabError(f"{dev.name}: the hardware catalogue names no GPU-to-GPU link")
    return get_tier(dev.gpu_link)

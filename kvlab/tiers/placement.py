"""Placements (where KV lives), the one fetch formula, and the per-link latencies.

A fetch costs `latency + bytes / (bandwidth x efficiency)`; a placement's bandwidth is
its slowest hop's (host DRAM reaches the GPU through PCIe, a remote node through its NIC).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import cost
from ..cost import _out
from ..deployment import Deployment
from ..errors import KvlabError, check_number, unknown_name
from ..hardware import Device, Tier, get_device, get_tier, tiers

HBM = "hbm"

#: Per-transfer latency of each link, in seconds: the fixed cost paid before the
#: first byte counts. Modelling assumptions (override with `latency_s=`), chosen as:
LINK_LATENCY_S = {
    # a cudaMemcpyAsync from pinned host memory: launch + completion ~5-10 us on H100-class
    "pcie4-x16": 10e-6,
    "pcie5-x16": 10e-6,
    # a peer copy or NCCL send/recv between GPUs of one node: same launch cost
    "nvlink4": 10e-6,
    # one RDMA WRITE and its completion is ~1-3 us on HDR/NDR (ib_write_lat); a transfer
    # engine posting the work and polling the completion adds a few more
    "ib-200g": 5e-6,
    "ib-400g": 5e-6,
    # kernel TCP: half of a ~50-60 us ping-pong round trip on 10 GbE
    "ethernet-10g": 30e-6,
}


@dataclass(frozen=True)
class Placement:
    """Where a request's KV lives, as seen from the decode GPU.

    `hops` are the tiers the bytes cross on the way, catalogue names or `Tier` objects (a
    tier of your own); () means the device's own memory (HBM). The slowest hop is the
    bandwidth; `latency_s` is paid once per fetch.
    """

    name: str
    hops: tuple[str | Tier, ...]
    latency_s: float
    description: str

    def bandwidth_bytes_per_s(self, hardware: Device | str | None = None) -> float:
        """Peak bytes/s of the slowest hop (the device's memory bandwidth for HBM)."""
        if not self.hops:
            if hardware is None:
                raise KvlabError(
                    f"placement {self.name!r} is the device's own memory: pass hardware="
                )
            return get_device(hardware).memory_bandwidth_bytes_per_s
        return min(_hop(h).bandwidth_bytes_per_s for h in self.hops)

    @property
    def bottleneck(self) -> str:
        """The hop that sets the pace ('hbm' for device memory)."""
        if not self.hops:
            return HBM
        return min((_hop(h) for h in self.hops), key=lambda t: t.bandwidth_bytes_per_s).name


def _hop(hop: str | Tier) -> Tier:
    return hop if isinstance(hop, Tier) else get_tier(hop)


PLACEMENTS = {
    p.name: p
    for p in (
        Placement(HBM, (), 0.0, "the decode GPU's own memory"),
        Placement(
            "peer-nvlink4",
            ("hbm3", "nvlink4"),
            LINK_LATENCY_S["nvlink4"],
            "another GPU's HBM in the same node, over NVLink 4",
        ),
        Placement(
            "host-pcie5",
            ("ddr5", "pcie5-x16"),
            LINK_LATENCY_S["pcie5-x16"],
            "host DRAM (8-channel DDR5) over PCIe 5.0 x16",
        ),
        Placement(
            "host-pcie4",
            ("ddr5", "pcie4-x16"),
            LINK_LATENCY_S["pcie4-x16"],
            "host DRAM over PCIe 4.0 x16 (the article's ~32 GB/s)",
        ),
        Placement(
            "remote-ib-400g",
            ("ddr5", "pcie5-x16", "ib-400g", "pcie5-x16"),
            LINK_LATENCY_S["ib-400g"],
            "another node's memory over one 400 Gb/s NIC (NDR InfiniBand / RoCE)",
        ),
        Placement(
            "remote-ib-200g",
            ("ddr5", "pcie4-x16", "ib-200g", "pcie4-x16"),
            LINK_LATENCY_S["ib-200g"],
            "another node's memory over one 200 Gb/s NIC (HDR InfiniBand / RoCE)",
        ),
        Placement(
            "remote-10gbe",
            ("ddr5", "pcie4-x16", "ethernet-10g", "pcie4-x16"),
            LINK_LATENCY_S["ethernet-10g"],
            "another node's memory over commodity 10 GbE",
        ),
    )
}
#: Every catalogued placement, closest first: the ladder the book's figures compare.
PLACEMENT_NAMES = tuple(PLACEMENTS)


def placements() -> dict[str, Placement]:
    """The catalogued placements, fastest first (HBM first)."""
    return dict(PLACEMENTS)


def get_placement(where: Placement | Tier | str) -> Placement:
    """A placement by name; a catalogue tier name or `Tier` becomes a one-hop placement."""
    if isinstance(where, Placement):
        return where
    if isinstance(where, Tier):  # the tier itself, not its name: it need not be in the catalogue
        return Placement(where.name, (where,), LINK_LATENCY_S.get(where.name, 0.0), where.example)
    key = str(where).lower()
    if key in PLACEMENTS:
        return PLACEMENTS[key]
    if key in tiers():
        return get_placement(get_tier(key))
    raise unknown_name("KV placement", where, [*PLACEMENTS, *tiers()])


def _path(where, hardware, bandwidth_bytes_per_s, latency_s):
    """(placement, bandwidth, latency) with the overrides applied and checked."""
    p = get_placement(where)
    if bandwidth_bytes_per_s is None:
        bandwidth = p.bandwidth_bytes_per_s(hardware)
    else:
        bandwidth = check_number(
            "tier bandwidth (bytes/s)",
            bandwidth_bytes_per_s,
            maximum=cost.MAX_BANDWIDTH_BYTES_PER_S,
        )
    latency = p.latency_s if latency_s is None else latency_s
    return p, bandwidth, latency


@dataclass(frozen=True)
class TierPath:
    """A placement seen as a fetch path: where the KV is and how well the path performs.

    `efficiency` is the share of the path's peak reached; `bandwidth_bytes_per_s`
    overrides the slowest hop's bandwidth; `latency_s` None means the placement's own
    per-fetch latency.
    """

    where: Placement | Tier | str
    efficiency: float = 1.0
    bandwidth_bytes_per_s: float | None = None
    latency_s: float | None = None

    def resolve(self, hardware: Device | str | None = None):
        """(placement, bandwidth bytes/s, latency s) with the overrides applied and checked."""
        return _path(self.where, hardware, self.bandwidth_bytes_per_s, self.latency_s)

    def time_s(self, nbytes, hardware: Device | str | None = None):
        """Seconds to move `nbytes` once over this path (the one fetch formula)."""
        _, bandwidth, latency = self.resolve(hardware)
        return transfer_time_s(nbytes, bandwidth, self.efficiency, latency)


# ------------------------------------------------------------------------ fetching


def transfer_time_s(nbytes, bandwidth_bytes_per_s, efficiency=1.0, latency_s=0.0):
    """Seconds to move `nbytes` once: latency + bytes / (bandwidth x efficiency).

    The one fetch formula of kvlab; every tier and link model goes through it.
    """
    nbytes = check_number("bytes", nbytes, minimum=0, allow_equal_min=True, maximum=1e18)
    bandwidth = check_number(
        "bandwidth (bytes/s)", bandwidth_bytes_per_s, maximum=cost.MAX_BANDWIDTH_BYTES_PER_S
    )
    efficiency = check_number("efficiency", efficiency, maximum=1.0)
    latency_s = check_number("latency_s", latency_s, minimum=0, allow_equal_min=True, maximum=3600)
    seconds = latency_s + np.asarray(nbytes, dtype=float) / (
        np.asarray(bandwidth) * np.asarray(efficiency)
    )
    return _out(np.asarray(seconds))


def as_path(path: TierPath | Placement | Tier | str) -> TierPath:
    """A `TierPath` as given, or a placement or tier at its peak with its own latency."""
    return path if isinstance(path, TierPath) else TierPath(path)


def kv_fetch_time_s(d: Deployment, tokens, path: TierPath | Placement | Tier | str):
    """Seconds to bring `tokens` tokens of deployment `d`'s KV over `path` once
    (vectorised over tokens and the path's efficiency and bandwidth). `path` is a
    `TierPath`, or a catalogue tier ('pcie5-x16') or placement ('host-pcie5') name at its
    peak with its own per-fetch latency; `TierPath(..., latency_s=0.0)` gives a pure
    bandwidth figure."""
    tokens = check_number("tokens", tokens, minimum=0, allow_equal_min=True, maximum=1e9)
    moved = np.asarray(tokens, dtype=float) * d.kv_bytes_per_token
    return as_path(path).time_s(moved, d.hardware)

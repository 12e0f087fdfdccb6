"""Links of the simulated cluster: time of a move, NIC reservations, and the byte ledger.

A move takes `kvlab.tiers.transfer_time_s` (latency + bytes / (bandwidth x efficiency))
over the link's catalogue bandwidth. Each node has one NIC; a network move occupies the
sender's and the receiver's NIC for its duration, so moves to or from a busy node queue
(first come, first served). Host links (PCIe) are per node and not contended: only that
node's GPU uses them.

Every move is booked by purpose with its bytes and with how much of its time was on a
request's critical path ("exposed") versus hidden behind compute: the "same bytes, lower
latency" ledger of chapter 4.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..tiers.placement import LINK_LATENCY_S, get_placement, transfer_time_s

PURPOSES = (
    "kv-transfer",
    "prefix-load-local",
    "prefix-load-remote",
    "cache-store",
    "remote-decode",
    "preempt-swap",
)
HOST_PURPOSES = ("prefix-load-local", "cache-store", "preempt-swap")  # over the host link


class Link:
    """One kind of link (a catalogue tier) with a per-message latency and an efficiency;
    `lanes` links of it side by side (an instance of N GPUs has N NICs and N PCIe links,
    over which a transfer engine stripes one move)."""

    def __init__(self, name: str, efficiency: float = 1.0, lanes: int = 1):
        place = get_placement(name)
        self.name = place.name
        self.lanes = int(lanes)
        self.bandwidth_bytes_per_s = place.bandwidth_bytes_per_s() * self.lanes
        self.latency_s = LINK_LATENCY_S.get(place.name, place.latency_s)
        self.efficiency = efficiency
        # transfer_time_s is affine in the bytes: read its intercept and slope off it once
        # (a call per move would spend more time checking arguments than simulating)
        t0, t1 = transfer_time_s(
            np.array([0.0, 1e9]), self.bandwidth_bytes_per_s, efficiency, self.latency_s
        )
        self._t0, self._per_byte = float(t0), float(t1 - t0) / 1e9

    def time_s(self, nbytes: float) -> float:
        """Seconds to move `nbytes` once (0 for nothing): kvlab.tiers.transfer_time_s."""
        if nbytes <= 0:
            return 0.0
        return self._t0 + self._per_byte * nbytes


class Network:
    """The cluster's network (one NIC per node) and host links, with the byte ledger."""

    def __init__(self, link: Link, host_link: Link, nodes: int):
        self.link, self.host_link = link, host_link
        self.nic_free_s = [0.0] * nodes
        self.bytes = defaultdict(float)  # purpose -> bytes
        self.moves = defaultdict(int)
        self.wire_s = defaultdict(float)  # purpose -> seconds of moving (latency + bytes/bandwidth)
        # purpose -> seconds of the move on a request's critical path
        self.exposed_s = defaultdict(float)
        # purpose -> seconds requests waited on it (NIC queueing included)
        self.delay_s = defaultdict(float)
        self.nic_busy_s = [0.0] * nodes

    def reserve(
        self,
        src: int,
        dst: int,
        nbytes: float,
        ready_s: float,
        producer_end_s: float | None = None,
        stages: int = 1,
    ):
        """Book a network move from node src to node dst that can start at ready_s.

        With `producer_end_s` the bytes stream out while a producer (a prefill) makes them,
        in `stages` pieces (layers): the move cannot end before the producer's end plus one
        piece. Returns (start_s, end_s, wire_s)."""
        wire = self.link.time_s(nbytes)
        free = self.nic_free_s
        start = max(ready_s, free[src], free[dst])
        end = start + wire
        if producer_end_s is not None:
            end = max(end, producer_end_s + wire / stages)
        # the NICs owe `wire` seconds of work from `start`; a stream spread over a long
        # prefill leaves the rest of their bandwidth to other moves meanwhile
        free[src] = free[dst] = start + wire
        self.nic_busy_s[src] += wire
        if dst != src:
            self.nic_busy_s[dst] += wire
        return start, end, wire

    def book(self, purpose: str, nbytes: float, wire_s: float, exposed_s: float = 0.0) -> None:
        nbytes, wire_s, exposed_s = float(nbytes), float(wire_s), float(exposed_s)
        self.bytes[purpose] += nbytes
        self.moves[purpose] += 1
        self.wire_s[purpose] += wire_s
        self.exposed_s[purpose] += max(0.0, min(exposed_s, wire_s)) if wire_s > 0 else 0.0
        self.delay_s[purpose] += max(0.0, exposed_s)

    def link_of(self, purpose: str) -> str:
        return self.host_link.name if purpose in HOST_PURPOSES else self.link.name

    def summary(self) -> dict:
        """{"by_purpose": {purpose: {link, bytes, moves, wire_s, exposed_s, hidden_s, delay_s}},
        "by_link": {link: bytes}, "exposed_s", "hidden_s", "delay_s"}. wire = exposed + hidden;
        delay_s adds the time requests queued for a busy NIC."""
        by_purpose, by_link = {}, defaultdict(float)
        for p in PURPOSES:
            wire, exposed = self.wire_s[p], self.exposed_s[p]
            if wire - exposed < 1e-9 * max(
                wire, 1.0
            ):  # a sum of exact cancellations, not hidden time
                exposed = wire
            by_purpose[p] = {
                "link": self.link_of(p),
                "bytes": self.bytes[p],
                "moves": self.moves[p],
                "wire_s": wire,
                "exposed_s": exposed,
                "hidden_s": max(0.0, wire - exposed),
                "delay_s": self.delay_s[p],
            }
            by_link[self.link_of(p)] += self.bytes[p]
        exposed = sum(v["exposed_s"] for v in by_purpose.values())
        hidden = sum(v["hidden_s"] for v in by_purpose.values())
        delay = sum(v["delay_s"] for v in by_purpose.values())
        return {
            "by_purpose": by_purpose,
            "by_link": dict(by_link),
            "exposed_s": exposed,
            "hidden_s": hidden,
            "delay_s": delay,
            "network_link": self.link.name,
            "host_link": self.host_link.name,
        }

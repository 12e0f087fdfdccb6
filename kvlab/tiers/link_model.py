"""The link model: time and effective bandwidth of one message against its size.

time(size) = latency + size / (bandwidth x efficiency): a fixed per-message cost (see
`LINK_LATENCY_S` for what each link's figure stands for) plus the wire time. Effective
bandwidth = size / time rises with size and reaches half the link's rate at
size = latency x bandwidth (the "half-bandwidth message size"): small KV blocks see the
latency, a whole request's KV sees the bandwidth. Measured transfers are plotted against
these curves; `fit_link_model` turns measured points back into (latency, bandwidth).
"""

from __future__ import annotations

import numpy as np

from ..errors import KvlabError, check_number
from ..hardware import Tier
from .placement import LINK_LATENCY_S, get_placement, transfer_time_s

#: The links the chapter compares: commodity Ethernet, RoCE/InfiniBand NICs, NVLink.
MODEL_LINKS = ("ethernet-10g", "ib-200g", "ib-400g", "nvlink4")

#: 4 KiB .. 512 MiB: a KV block of a few tokens up to a 4K request of the article's 7B.
DEFAULT_SIZES_BYTES = 2.0 ** np.arange(12, 30)


def link_model(
    link: Tier | str,
    sizes_bytes=DEFAULT_SIZES_BYTES,
    efficiency=1.0,
    latency_s=None,
    bandwidth_bytes_per_s=None,
) -> dict:
    """Model time and effective bandwidth of one message per size over `link`.

    Returns plain data: name, peak bandwidth, latency, half-bandwidth size, and arrays
    `sizes_bytes`, `time_s`, `bandwidth_bytes_per_s` (effective, size / time).
    """
    place = get_placement(link)
    peak = place.bandwidth_bytes_per_s() if bandwidth_bytes_per_s is None else bandwidth_bytes_per_s
    latency = LINK_LATENCY_S.get(place.name, place.latency_s) if latency_s is None else latency_s
    sizes = np.atleast_1d(check_number("message size (bytes)", sizes_bytes, maximum=1e15)).astype(
        float
    )
    time_s = np.asarray(transfer_time_s(sizes, peak, efficiency, latency), dtype=float)
    return {
        "link": place.name,
        "peak_bandwidth_bytes_per_s": float(peak),
        "efficiency": float(efficiency),
        "latency_s": float(latency),
        "half_bandwidth_bytes": float(latency * peak * efficiency),
        "sizes_bytes": sizes,
        "time_s": time_s,
        "bandwidth_bytes_per_s": sizes / time_s,
    }


def link_model_curves(links=MODEL_LINKS, sizes_bytes=DEFAULT_SIZES_BYTES, efficiency=1.0) -> dict:
    """`link_model` for several links on one size axis: {"sizes_bytes", "links": {name: model}}."""
    sizes = np.atleast_1d(np.asarray(sizes_bytes, dtype=float))
    return {
        "sizes_bytes": sizes,
        "links": {str(link): link_model(link, sizes, efficiency) for link in links},
    }


def fit_link_model(sizes_bytes, time_s) -> dict:
    """Least-squares (latency, bandwidth) of time = latency + size / bandwidth.

    Residuals are weighted by 1 / time, so 4 KB messages (microseconds) count as much
    as 512 MB ones (a second): the fit must explain both ends of the curve.
    """
    sizes = np.atleast_1d(np.asarray(sizes_bytes, dtype=float))
    times = np.atleast_1d(np.asarray(time_s, dtype=float))
    if sizes.shape != times.shape or sizes.size < 2:
        raise KvlabError("fit_link_model needs at least two (size, time) points of equal count")
    if np.any(~np.isfinite(times)) or np.any(times <= 0) or np.any(sizes <= 0):
        raise KvlabError("fit_link_model needs positive, finite sizes and times")
    weights = 1.0 / times
    design = np.stack([np.ones_like(sizes), sizes], axis=1) * weights[:, None]
    (latency, seconds_per_byte), *_ = np.linalg.lstsq(design, times * weights, rcond=None)
    if seconds_per_byte <= 0:
        raise KvlabError("the measured times do not grow with size; cannot fit a bandwidth")
    return {
        "latency_s": float(max(latency, 0.0)),
        "bandwidth_bytes_per_s": float(1.0 / seconds_per_byte),
    }

"""Read the committed kernel-table extract (numpy only) and interpolate it in log space.

Latencies of GPU kernels are close to power laws of their size over most of a table (a
memory-bound GEMV takes time proportional to its bytes, a compute-bound GEMM to its
FLOPs), so interpolating log latency linearly in log size is exact for those and smooth
between. Outside the measured range nothing is extrapolated: every lookup returns an
`in_range` flag next to the value (NaN there), and callers refuse or say so.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

from ..errors import KvlabError

#: kvlab dtype base -> the extract's dtype key (fp16 and bf16 run the same kernels).
DTYPE_KEYS = {"bf16": "bf16", "fp16": "bf16", "fp8": "fp8", "int8": "int8", "int4": "int4"}


class Curve:
    """A 1-D table y(x), interpolated linearly in (log x, log y); missing points dropped."""

    def __init__(self, x, y):
        x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        keep = np.isfinite(y) & (y > 0) & (x > 0)
        if keep.sum() < 1:
            raise KvlabError("a measured table has no usable points")
        self.x, self.y = x[keep], y[keep]
        self.log_x, self.log_y = np.log(self.x), np.log(self.y)
        self._lx, self._ly = self.log_x.tolist(), self.log_y.tolist()
        self.lo, self.hi = float(self.x[0]), float(self.x[-1])

    def scalar(self, x: float) -> float:
        """The value at one point, NaN outside [lo, hi] (no numpy: a simulator's hot path)."""
        if not self.lo <= x <= self.hi:
            return math.nan
        lx, i = math.log(x), bisect.bisect_right(self._lx, math.log(x)) - 1
        if i >= len(self._lx) - 1:
            return math.exp(self._ly[-1])
        w = (lx - self._lx[i]) / (self._lx[i + 1] - self._lx[i])
        return math.exp(self._ly[i] + w * (self._ly[i + 1] - self._ly[i]))

    def __call__(self, x):
        """(values, in_range) at x (any shape); values are NaN where out of range."""
        x = np.asarray(x, dtype=float)
        ok = (x >= self.lo) & (x <= self.hi)
        if self.x.size == 1:
            return np.where(ok, self.y[0], np.nan), ok
        lx = np.log(np.where(ok, x, self.lo))
        i = np.clip(np.searchsorted(self.log_x, lx, side="right") - 1, 0, self.x.size - 2)
        w = (lx - self.log_x[i]) / (self.log_x[i + 1] - self.log_x[i])
        y = np.exp(self.log_y[i] + w * (self.log_y[i + 1] - self.log_y[i]))
        return np.where(ok, y, np.nan), ok


class Grid:
    """A 2-D table z(x, y) with holes (NaN), interpolated bilinearly in log x, log y, log z.
    A point is in range only if the corners around it were all measured."""

    def __init__(self, x, y, z):
        self.x, self.y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        z = np.asarray(z, dtype=float)
        if z.shape != (self.x.size, self.y.size):
            raise KvlabError(f"a measured grid is {z.shape}, expected {(self.x.size, self.y.size)}")
        with np.errstate(divide="ignore", invalid="ignore"):
            self.log_z = np.log(np.where(z > 0, z, np.nan))
        self.log_x, self.log_y = np.log(self.x), np.log(self.y)
        self._x, self._y = self.x.tolist(), self.y.tolist()
        self._lx, self._ly, self._lz = self.log_x.tolist(), self.log_y.tolist(), self.log_z.tolist()

    @staticmethod
    def _axis(log_grid, v):
        """Lower index, upper index and log-space weight of v on a grid (v inside it)."""
        i0 = np.clip(np.searchsorted(log_grid, v, side="right") - 1, 0, log_grid.size - 1)
        i1 = np.minimum(i0 + 1, log_grid.size - 1)
        span = log_grid[i1] - log_grid[i0]
        w = np.where(span > 0, (v - log_grid[i0]) / np.where(span > 0, span, 1.0), 0.0)
        return i0, np.where(w > 0, i1, i0), w

    def scalar(self, x: float, y: float) -> float:
        """The value at one point, NaN out of range (no numpy: a simulator's hot path)."""
        if not (self._x[0] <= x <= self._x[-1] and self._y[0] <= y <= self._y[-1]):
            return math.nan
        (i0, i1, wx), (j0, j1, wy) = _scalar_axis(self._lx, x), _scalar_axis(self._ly, y)
        z = self._lz
        log = (
            (1 - wx) * (1 - wy) * z[i0][j0]
            + wx * (1 - wy) * z[i1][j0]
            + (1 - wx) * wy * z[i0][j1]
            + wx * wy * z[i1][j1]
        )
        return math.exp(log) if math.isfinite(log) else math.nan

    def __call__(self, x, y):
        x, y = np.broadcast_arrays(np.asarray(x, dtype=float), np.asarray(y, dtype=float))
        ok = (x >= self.x[0]) & (x <= self.x[-1]) & (y >= self.y[0]) & (y <= self.y[-1])
        i0, i1, wx = self._axis(self.log_x, np.log(np.where(ok, x, self.x[0])))
        j0, j1, wy = self._axis(self.log_y, np.log(np.where(ok, y, self.y[0])))
        z = self.log_z
        log = (
            (1 - wx) * (1 - wy) * z[i0, j0]
            + wx * (1 - wy) * z[i1, j0]
            + (1 - wx) * wy * z[i0, j1]
            + wx * wy * z[i1, j1]
        )
        ok = ok & np.isfinite(log)
        return np.where(ok, np.exp(np.where(ok, log, 0.0)), np.nan), ok


def _scalar_axis(log_grid: list, v: float) -> tuple[int, int, float]:
    """Lower index, upper index (the lower one when v sits on it) and log weight."""
    lv = math.log(v)
    i = max(bisect.bisect_right(log_grid, lv) - 1, 0)
    if i >= len(log_grid) - 1 or lv == log_grid[i]:
        return i, i, 0.0
    return i, i + 1, (lv - log_grid[i]) / (log_grid[i + 1] - log_grid[i])


@dataclass(frozen=True)
class TableInfo:
    """Where a table came from: every figure that uses it names this."""

    kind: str
    source: str
    framework: str
    framework_version: str
    device_string: str

    @property
    def label(self) -> str:
        return f"{self.framework} {self.framework_version} {self.kind} ({self.device_string})"


def _info(kind: str, entry: dict) -> TableInfo:
    return TableInfo(
        kind,
        entry["source"],
        entry["framework"],
        entry["framework_version"],
        entry["device_string"],
    )


def _folder():
    return resources.files("kvlab").joinpath("data/kernel_tables")


@lru_cache(maxsize=1)
def devices_with_data() -> tuple[str, ...]:
    """Catalogue devices that have a measured extract."""
    return tuple(sorted(e.name[:-5] for e in _folder().iterdir() if e.name.endswith(".json")))


def no_data_error(device: str) -> KvlabError:
    return KvlabError(
        f"no measured kernel tables for {device!r}; devices with data: "
        f"{', '.join(devices_with_data())}"
    )


class DeviceTables:
    """One device's extract: GEMM curves over m, attention grids, MoE and all-reduce curves."""

    def __init__(self, raw: dict):
        self.raw = raw
        self.device, self.device_string = raw["device"], raw["device_string"]
        self.framework, self.framework_version = raw["framework"], raw["framework_version"]
        self.kernel_floor_s = raw["derived"]["kernel_floor_us"] * 1e-6
        self.gemv_bandwidth_bytes_per_s = raw["derived"]["gemv_bandwidth_bytes_per_s"]
        self.info = {
            kind: _info(kind, raw[kind])
            for kind in ("gemm", "generation_attention", "context_attention", "moe", "all_reduce")
        }
        self._memo: dict = {}

    def _cached(self, key: tuple, build):
        """Interpolators are built once per device and key (parsing JSON rows is slow)."""
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    @property
    def label(self) -> str:
        return (
            f"{self.framework} {self.framework_version} kernel tables, {self.device_string} "
            f"({self.raw['package']})"
        )

    def gemm_dtypes(self) -> list[str]:
        return sorted(self.raw["gemm"]["dtypes"])

    def _key(self, dtype: str, have: list[str], what: str) -> str:
        key = DTYPE_KEYS.get(dtype)
        if key not in have:
            raise KvlabError(
                f"no measured {what} for {dtype} on {self.device} "
                f"({self.framework} {self.framework_version} tables have "
                f"{', '.join(have) or 'none'})"
            )
        return key

    def gemm(self, dtype: str, n: int, k: int) -> tuple[Curve, str]:
        """Latency (s) of one n x k GEMM over m, and how the extract obtained it."""
        return self._cached(("gemm", dtype, n, k), lambda: self._gemm(dtype, n, k))

    def _gemm(self, dtype: str, n: int, k: int) -> tuple[Curve, str]:
        table = self.raw["gemm"]["dtypes"][self._key(dtype, self.gemm_dtypes(), "GEMMs")]
        entry = table["shapes"].get(f"{n}x{k}")
        if entry is None:
            raise KvlabError(
                f"no measured {n}x{k} GEMM on {self.device}: the extract holds the "
                "catalogue models' shapes (add a model to kvlab/data/models and run "
                "`python -m kvlab.kernel_tables extract`)"
            )
        return Curve(table["m"], np.asarray(entry["latency_us"], dtype=float) * 1e-6), entry["how"]

    def _layout(self, kind: str, heads: int, kv_heads: int, head_dim: int, kv_dtype: str) -> dict:
        layouts = self.raw[kind]["layouts"]
        entry = layouts.get(f"{heads}/{kv_heads}/{head_dim}")
        if entry is None:
            raise KvlabError(
                f"no measured {kind.replace('_', ' ')} for {heads} query heads, "
                f"{kv_heads} K/V heads, head_dim {head_dim} on {self.device}"
            )
        return entry[self._key(kv_dtype, sorted(entry), f"{kind.replace('_', ' ')} KV")]

    def attention(self, kind: str, heads, kv_heads, head_dim, kv_dtype) -> tuple[Grid, str]:
        """Latency (s) of one layer's attention: kind 'generation' over (batch, tokens in the
        cache), 'context' over (batch, prompt tokens)."""
        return self._cached(
            (kind, heads, kv_heads, head_dim, kv_dtype),
            lambda: self._attention(kind, heads, kv_heads, head_dim, kv_dtype),
        )

    def _attention(self, kind, heads, kv_heads, head_dim, kv_dtype) -> tuple[Grid, str]:
        t = self.raw[f"{kind}_attention"]
        entry = self._layout(f"{kind}_attention", heads, kv_heads, head_dim, kv_dtype)
        lat = np.array([[np.nan if v is None else v for v in row] for row in entry["latency_us"]])
        sizes = t["tokens_in_cache"] if kind == "generation" else t["prompt_tokens"]
        return Grid(t["batch"], sizes, lat * 1e-6), entry["how"]

    def moe(self, hidden, inter, experts, topk, tp, dtype) -> tuple[Curve, str]:
        """Latency (s) of one MoE layer's routed experts over tokens."""
        return self._cached(
            ("moe", hidden, inter, experts, topk, tp, dtype),
            lambda: self._moe(hidden, inter, experts, topk, tp, dtype),
        )

    def _moe(self, hidden, inter, experts, topk, tp, dtype) -> tuple[Curve, str]:
        t = self.raw["moe"]
        shape = t["shapes"].get(f"{hidden}x{inter}/{experts}/{topk}/tp{tp}")
        if shape is None:
            raise KvlabError(
                f"no measured MoE layer {hidden}x{inter}, {experts} experts, "
                f"top-{topk}, tensor-parallel {tp} on {self.device}"
            )
        entry = shape[self._key(dtype, sorted(shape), "MoE")]
        lat = np.array([np.nan if v is None else v for v in entry["latency_us"]])
        return Curve(t["tokens"], lat * 1e-6), f"routing {entry['distribution']}"

    def all_reduce(self, gpus: int) -> Curve:
        """Latency (s) of one bf16 all-reduce over `gpus` GPUs, by message elements (a
        decode step's message is tokens x hidden size elements, 2 bytes each)."""
        return self._cached(("all_reduce", gpus), lambda: self._all_reduce(gpus))

    def _all_reduce(self, gpus: int) -> Curve:
        t = self.raw["all_reduce"]
        if str(gpus) not in t["gpus"]:
            raise KvlabError(
                f"no measured all-reduce over {gpus} GPUs on {self.device} "
                f"(have {', '.join(sorted(t['gpus']))})"
            )
        lat = np.array([np.nan if v is None else v for v in t["gpus"][str(gpus)]])
        return Curve(t["message_elements"], lat * 1e-6)


@lru_cache(maxsize=16)
def load(device: str) -> DeviceTables:
    """One device's extract (cached); a device without data raises, naming those with data."""
    if device not in devices_with_data():
        raise no_data_error(device)
    text = _folder().joinpath(f"{device}.json").read_text(encoding="utf-8")
    return DeviceTables(json.loads(text))

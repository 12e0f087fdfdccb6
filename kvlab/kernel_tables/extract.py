"""Regenerate the committed kernel-table extract from aiconfigurator-core's parquet tables.

    pip install 'aiconfigurator-core==0.12.0'     # (kvlab's optional extra `measured`)
    python -m kvlab.kernel_tables extract [--out DIR]

NVIDIA's aiconfigurator-core 0.12.0 (Apache-2.0) ships per-kernel latencies measured with
TensorRT-LLM, vLLM and SGLang under `aiconfigurator_core/systems/data/<system>/`. kvlab
takes one framework throughout, TensorRT-LLM, because it is the only one with every table
kvlab needs on every device here (GEMMs incl. weight-only int8/int4 on A100, generation
and context attention with fp8 KV, MoE, its own all-reduce), and one version per device,
the one its GEMM table was collected with. Only what the catalogue models need is kept:

- GEMMs at their projection shapes (per GPU at tensor-parallel 1, 2, 4, 8) over every m
  the table has. Shapes off the table's n/k grid are interpolated log-bilinearly in
  (n, k) (exact for latency proportional to n x k, as a memory-bound GEMV is); n beyond
  the grid is split into equal column blocks run one after another; n or k below the
  grid is timed at the grid's smallest (an upper bound). Each shape says how.
- generation attention over batch x tokens in the cache, context attention over batch x
  prompt length, for their head layouts (query heads, K/V heads, head_dim per GPU) and KV
  dtypes; a layout the table lacks is interpolated linearly in query heads between the
  nearest measured layouts with the same K/V heads.
- MoE layers (routed experts, fused) over tokens; TensorRT-LLM's all-reduce by message
  size (bf16 elements) and GPU count.
- two figures derived from the GEMM table, which the measured mode uses for the kernels
  no table has (norms, activation, embedding, sampling): the latency floor of a kernel
  that does almost nothing, and the bandwidth large GEMVs reach.

Output: one JSON file per device plus NOTICE, byte for byte the same on every run:
sorted keys, latencies in microseconds rounded to 5 significant digits, null where the
source has no measurement. Importing this module needs numpy only; pandas, pyarrow and
aiconfigurator-core are imported when `extract` runs.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from importlib import metadata
from pathlib import Path

import numpy as np

from ..errors import KvlabError
from ..hardware import get_device
from ..models import models
from ..operators import TP_DEGREES, layer_shapes

PACKAGE = "aiconfigurator-core"
PACKAGE_VERSION = "0.12.0"
FRAMEWORK = "trtllm"
#: kvlab device -> (aiconfigurator system, TensorRT-LLM version of its tables)
SYSTEMS = {
    "h100-sxm": ("h100_sxm", "1.3.0rc20"),
    "h200": ("h200_sxm", "1.3.0rc20"),
    "a100-80gb": ("a100_sxm", "1.0.0"),
    "l40s": ("l40s", "1.3.0rc20"),
    "b200": ("b200_sxm", "1.3.0rc20"),
}
#: kvlab weight dtype -> the GEMM table's dtype (fp8: per-tensor W8A8; int8/int4: weight-only)
GEMM_DTYPES = {"bf16": "bfloat16", "fp8": "fp8", "int8": "int8_wo", "int4": "int4_wo"}
MOE_DTYPES = {"bf16": "bfloat16", "fp8": "fp8"}
KV_DTYPES = {"bf16": "bfloat16", "fp8": "fp8"}
#: Preferred MoE routing: balanced matches the ledger's uniform routing; else the mildest skew.
MOE_DISTRIBUTIONS = ("balanced", "power_law_1.01")
KERNEL_SOURCES = ("torch_flow", "moe_torch_flow_cutlass", "moe_torch_flow")
#: GEMV bandwidth: bf16, m = 1, weights of at least this many bytes (as in the issue's note).
GEMV_MIN_BYTES = 50e6
#: Kernel floor: bf16 GEMMs with m <= 16 and n, k <= 256 move almost nothing.
FLOOR_MAX_M, FLOOR_MAX_NK = 16, 256
SIGNIFICANT = 5


# ----------------------------------------------------------------------- formatting


def _round(x) -> float | None:
    x = float(x)
    return None if not math.isfinite(x) else float(f"{x:.{SIGNIFICANT}g}")


def _us(latency_ms) -> list:
    """Milliseconds (the tables' unit) -> rounded microseconds, None where missing."""
    return [_round(1e3 * v) for v in np.asarray(latency_ms, dtype=float).ravel()]


def dumps(obj, indent: int = 0) -> str:
    """JSON with sorted keys, objects indented, lists of scalars on one line."""
    pad = " " * indent
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{pad} {json.dumps(str(k))}: {dumps(obj[k], indent + 1)}" for k in sorted(obj)]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(obj, (list, tuple)):
        if all(not isinstance(v, (dict, list, tuple)) for v in obj):
            return "[" + ",".join(json.dumps(v) for v in obj) + "]"
        return "[\n" + ",\n".join(f"{pad} {dumps(v, indent + 1)}" for v in obj) + f"\n{pad}]"
    return json.dumps(obj, allow_nan=False)


# ------------------------------------------------------------------------ the source


def _data_root() -> Path:
    try:
        import aiconfigurator_core
    except ImportError:
        raise KvlabError(
            f"extract needs {PACKAGE}=={PACKAGE_VERSION} (pip install "
            f"'kvlab[measured]'), with pandas and pyarrow"
        ) from None

    if metadata.version(PACKAGE) != PACKAGE_VERSION:
        raise KvlabError(
            f"extract reads {PACKAGE} {PACKAGE_VERSION}, found {metadata.version(PACKAGE)}"
        )
    return Path(aiconfigurator_core.__file__).parent / "systems" / "data"


def _table(root: Path, system: str, rel: str):
    import pandas as pd

    path = root / system / rel
    if not path.exists():
        raise KvlabError(f"{PACKAGE} {PACKAGE_VERSION} has no {system}/{rel}")
    return pd.read_parquet(path)


def _one_source(df):
    """Rows of one kernel implementation: the first of KERNEL_SOURCES present, else the
    first by name (a table may hold several implementations of the same operation)."""
    present = sorted(set(df["kernel_source"]))
    if len(present) <= 1:
        return df
    chosen = next((s for s in KERNEL_SOURCES if s in present), present[0])
    return df[df["kernel_source"] == chosen]


def _meta(df, system: str, rel: str) -> dict:
    """What every table states: where it came from and what measured it."""
    return {
        "source": f"{PACKAGE} {PACKAGE_VERSION} (PyPI, Apache-2.0), "
        f"aiconfigurator_core/systems/data/{system}/{rel}",
        "framework": str(df["framework"].iloc[0]),
        "framework_version": str(df["version"].iloc[0]),
        "device_string": str(df["device"].iloc[0]),
    }


def _catalogue_layouts():
    """Per-GPU shapes of every catalogue model that measured mode can lay out (not MLA)."""
    for name, m in models().items():
        if m.is_mla:
            continue
        for tp in TP_DEGREES:
            if m.num_heads % tp == 0:
                yield name, m, tp, layer_shapes(m, tp)


# ------------------------------------------------------------------------------ GEMMs


def _bracket(grid: np.ndarray, x: float) -> tuple[int, int, float]:
    """Neighbours of x on a sorted grid and its weight between them in log space."""
    hi = int(np.searchsorted(grid, x))
    if grid[hi] == x:
        return hi, hi, 0.0
    lo = hi - 1
    return lo, hi, math.log(x / grid[lo]) / math.log(grid[hi] / grid[lo])


def _gemm_curve(ns, ks, log_lat, n: int, k: int) -> tuple[np.ndarray, str]:
    """Latency (ms) of an n x k GEMM at every m of the table, and how it was obtained."""
    how, blocks, n_eff, k_eff = [], 1, float(n), float(k)
    if n_eff < ns[0]:
        how.append(f"n={n} below the table's smallest n={ns[0]:g}: timed at n={ns[0]:g}")
        n_eff = ns[0]
    if k_eff < ks[0]:
        how.append(f"k={k} below the table's smallest k={ks[0]:g}: timed at k={ks[0]:g}")
        k_eff = ks[0]
    if k_eff > ks[-1]:
        raise KvlabError(f"GEMM k={k} is beyond the table's largest k={ks[-1]:g}")
    if n_eff > ns[-1]:
        blocks = math.ceil(n_eff / ns[-1])
        n_eff = n_eff / blocks
        how.append(
            f"n={n} beyond the table's largest n={ns[-1]:g}: {blocks} column blocks "
            f"of n={n_eff:g}, one after another"
        )
    i0, i1, wn = _bracket(ns, n_eff)
    j0, j1, wk = _bracket(ks, k_eff)
    log = (
        (1 - wn) * (1 - wk) * log_lat[:, i0, j0]
        + wn * (1 - wk) * log_lat[:, i1, j0]
        + (1 - wn) * wk * log_lat[:, i0, j1]
        + wn * wk * log_lat[:, i1, j1]
    )
    if wn or wk:
        how.append("interpolated log-bilinearly in (n, k) between grid points")
    return blocks * np.exp(log), "; ".join(how) or "measured"


def _gemm(root: Path, system: str, version: str, shapes: set) -> dict:
    rel = f"gemm/{FRAMEWORK}/{version}/gemm_perf.parquet"
    df = _table(root, system, rel)
    out = {**_meta(df, system, rel), "dtypes": {}}
    for ours, theirs in GEMM_DTYPES.items():
        d = df[df["gemm_dtype"] == theirs]
        if d.empty:
            continue
        d = _one_source(d)
        ms, ns, ks = (np.array(sorted(d[c].unique()), dtype=float) for c in ("m", "n", "k"))
        lat = np.full((len(ms), len(ns), len(ks)), np.nan)
        lat[
            np.searchsorted(ms, d["m"]), np.searchsorted(ns, d["n"]), np.searchsorted(ks, d["k"])
        ] = d["latency"]
        log_lat = np.log(lat)
        table = {}
        for n, k in sorted(shapes):
            curve, how = _gemm_curve(ns, ks, log_lat, n, k)
            table[f"{n}x{k}"] = {"how": how, "latency_us": _us(curve)}
        out["dtypes"][ours] = {
            "table_dtype": theirs,
            "m": [int(v) for v in ms],
            "shapes": table,
            "kernel_source": str(d["kernel_source"].iloc[0]),
        }
    return out


def _derived(gemm_df, device: str) -> dict:
    """The kernel floor and the large-GEMV bandwidth, from the bf16 GEMM table."""
    b = gemm_df[gemm_df["gemm_dtype"] == "bfloat16"]
    small = b[(b["m"] <= FLOOR_MAX_M) & (b["n"] <= FLOOR_MAX_NK) & (b["k"] <= FLOOR_MAX_NK)]
    gemv = b[(b["m"] == 1) & (2.0 * b["n"] * b["k"] >= GEMV_MIN_BYTES)]
    bandwidth = float(np.median(2.0 * gemv["n"] * gemv["k"] / (1e-3 * gemv["latency"])))
    sheet = get_device(device).memory_bandwidth_bytes_per_s
    return {
        "kernel_floor_us": _round(1e3 * float(np.median(small["latency"]))),
        "kernel_floor_how": f"median latency of the {len(small)} bf16 GEMMs with "
        f"m <= {FLOOR_MAX_M} and n, k <= {FLOOR_MAX_NK}: kernels that "
        "move and compute almost nothing",
        "gemv_bandwidth_bytes_per_s": _round(bandwidth),
        "gemv_fraction_of_sheet": _round(bandwidth / sheet),
        "gemv_how": f"median of weight bytes / latency over the {len(gemv)} bf16 GEMMs with "
        f"m = 1 and at least {GEMV_MIN_BYTES / 1e6:g} MB of weights",
    }


# -------------------------------------------------------------------------- attention


def _layout_key(heads: int, kv: int, head_dim: int) -> str:
    return f"{heads}/{kv}/{head_dim}"


def _attention(root: Path, system: str, version: str, kind: str, layouts: set) -> dict:
    """Generation (batch x tokens in cache) or context (batch x prompt) attention grids."""
    rel = f"attention/{FRAMEWORK}/{version}/{kind}_attention_perf.parquet"
    df = _table(root, system, rel)
    df = _one_source(df[(df["window_size"] == 0) & (df["attn_dtype"] == "bfloat16")])
    axis = "step" if kind == "generation" else "isl"
    batches = np.array(sorted(df["batch_size"].unique()))
    sizes = np.array(sorted(df[axis].unique()))
    grids = {}
    for key, g in df.groupby(["num_heads", "num_key_value_heads", "head_dim", "kv_cache_dtype"]):
        lat = np.full((len(batches), len(sizes)), np.nan)
        rows, cols = np.searchsorted(batches, g["batch_size"]), np.searchsorted(sizes, g[axis])
        lat[rows, cols] = g["latency"]
        grids[tuple(int(v) if i < 3 else v for i, v in enumerate(key))] = lat
    out = {
        **_meta(df, system, rel),
        "kernel_source": str(df["kernel_source"].iloc[0]),
        "batch": [int(v) for v in batches],
        "tokens_in_cache" if kind == "generation" else "prompt_tokens": [int(v) for v in sizes],
        "layouts": {},
    }
    for heads, kv, hd in sorted(layouts):
        entry = {}
        for ours, theirs in KV_DTYPES.items():
            lat, how = _layout_grid(grids, heads, kv, hd, theirs)
            if lat is not None:
                entry[ours] = {"how": how, "latency_us": [_us(row) for row in lat]}
        if entry:
            out["layouts"][_layout_key(heads, kv, hd)] = entry
    return out


def _layout_grid(grids: dict, heads: int, kv: int, hd: int, kv_dtype: str):
    """A layout's grid, or one interpolated linearly in query heads between neighbours."""
    if (heads, kv, hd, kv_dtype) in grids:
        return grids[heads, kv, hd, kv_dtype], "measured"
    measured = sorted(h for (h, k, d, t) in grids if (k, d, t) == (kv, hd, kv_dtype))
    lo = [h for h in measured if h < heads]
    hi = [h for h in measured if h > heads]
    if not lo or not hi:
        return None, ""
    lo, hi = lo[-1], hi[0]
    w = (heads - lo) / (hi - lo)
    lat = (1 - w) * grids[lo, kv, hd, kv_dtype] + w * grids[hi, kv, hd, kv_dtype]
    return lat, (
        f"{heads} query heads not measured: interpolated linearly between "
        f"{lo} and {hi} query heads with {kv} K/V heads"
    )


# ------------------------------------------------------------------- MoE, all-reduce


def _moe(root: Path, system: str, version: str, shapes: set) -> dict:
    rel = f"moe/{FRAMEWORK}/{version}/moe_perf.parquet"
    df = _table(root, system, rel)
    tokens = np.array(sorted(df["num_tokens"].unique()))
    out = {**_meta(df, system, rel), "tokens": [int(v) for v in tokens], "shapes": {}}
    for hidden, inter, experts, topk, tp in sorted(shapes):
        sel = df[
            (df["hidden_size"] == hidden)
            & (df["inter_size"] == inter)
            & (df["num_experts"] == experts)
            & (df["topk"] == topk)
            & (df["moe_tp_size"] == tp)
            & (df["moe_ep_size"] == 1)
        ]
        entry = {}
        for ours, theirs in MOE_DTYPES.items():
            d = sel[sel["moe_dtype"] == theirs]
            dist = next((x for x in MOE_DISTRIBUTIONS if (d["distribution"] == x).any()), None)
            if dist is None:
                continue
            d = _one_source(d[d["distribution"] == dist])
            lat = np.full(len(tokens), np.nan)
            lat[np.searchsorted(tokens, d["num_tokens"])] = d["latency"]
            entry[ours] = {
                "distribution": dist,
                "kernel_source": str(d["kernel_source"].iloc[0]),
                "latency_us": _us(lat),
            }
        if entry:
            out["shapes"][f"{hidden}x{inter}/{experts}/{topk}/tp{tp}"] = entry
    return out


def _all_reduce(root: Path, system: str, version: str) -> dict:
    """TensorRT-LLM's all-reduce by message size. The source's `message_size` counts bf16
    elements, not bytes: its collector all-reduces a (size / 4096, 4096) tensor, and
    aiconfigurator queries the table with tokens x hidden size."""
    rel = f"comm/{FRAMEWORK}/{version}/custom_allreduce_perf.parquet"
    df = _table(root, system, rel)
    df = df[(df["op_name"] == "all_reduce") & (df["allreduce_dtype"] == "bfloat16")]
    sizes = np.array(sorted(df["message_size"].unique()))
    gpus = {}
    for count, g in df.groupby("num_gpus"):
        lat = np.full(len(sizes), np.nan)
        lat[np.searchsorted(sizes, g["message_size"])] = g["latency"]
        gpus[str(int(count))] = _us(lat)
    return {
        **_meta(df, system, rel),
        "dtype": "bf16",
        "message_elements": [int(v) for v in sizes],
        "gpus": gpus,
    }


# ------------------------------------------------------------------------ the driver


def _wanted() -> tuple[set, set, set]:
    """GEMM shapes, attention layouts and MoE shapes of the catalogue models."""
    gemms, layouts, moes = set(), set(), set()
    for _, _m, tp, shapes in _catalogue_layouts():
        gemms.update(shapes.gemms.values())
        layouts.add((shapes.heads, shapes.kv_heads, shapes.head_dim))
        if shapes.moe:
            moes.add((*shapes.moe, tp))
    return gemms, layouts, moes


def extract_device(root: Path, device: str) -> dict:
    """Everything kvlab keeps for one device, as a JSON-ready dict."""
    system, version = SYSTEMS[device]
    gemms, layouts, moes = _wanted()
    gemm = _gemm(root, system, version, gemms)
    raw_gemm = _table(root, system, f"gemm/{FRAMEWORK}/{version}/gemm_perf.parquet")
    return {
        "device": device,
        "system": system,
        "device_string": gemm["device_string"],
        "package": f"{PACKAGE} {PACKAGE_VERSION}",
        "framework": gemm["framework"],
        "framework_version": gemm["framework_version"],
        "units": "latency_us: microseconds per call, null where the source has no measurement",
        "derived": _derived(raw_gemm, device),
        "gemm": gemm,
        "generation_attention": _attention(root, system, version, "generation", layouts),
        "context_attention": _attention(root, system, version, "context", layouts),
        "moe": _moe(root, system, version, moes),
        "all_reduce": _all_reduce(root, system, version),
    }


def _copyright_lines(root: Path) -> list[str]:
    """The SPDX copyright lines of the collection metadata beside the tables used."""
    lines = set()
    for system, version in SYSTEMS.values():
        for meta in (root / system).glob(f"*/{FRAMEWORK}/{version}/collection_meta.yaml"):
            for line in meta.read_text().splitlines():
                if "SPDX-FileCopyrightText:" in line:
                    lines.add(line.split("SPDX-FileCopyrightText:", 1)[1].strip())
    return sorted(lines)


def notice(root: Path, extracts: dict) -> str:
    """The NOTICE: what was taken from where, under which licence, and what was changed."""
    lines = [
        "kvlab/data/kernel_tables: kernel latency tables extracted from aiconfigurator-core",
        "",
        "The JSON files in this directory are an extract of the kernel latency tables in the",
        f"Python package {PACKAGE} {PACKAGE_VERSION} by NVIDIA",
        "(https://pypi.org/project/aiconfigurator-core/, https://github.com/ai-dynamo/aiconfigurator),",
        "licensed under the Apache License, Version 2.0. The wheel's METADATA states",
        "'License-Expression: Apache-2.0' (its dist-info carries no licence text; LICENSE",
        "beside this file is the Apache License 2.0). The source tables' metadata carry:",
        "",
    ]
    lines += [f"    {line}" for line in _copyright_lines(root)]
    lines += ["", "Taken, per kvlab device (from aiconfigurator_core/systems/data/):"]
    for device, ex in sorted(extracts.items()):
        lines.append(
            f"  {device}: {ex['device_string']}, {ex['framework']} {ex['framework_version']}"
        )
        for kind in ("gemm", "generation_attention", "context_attention", "moe", "all_reduce"):
            lines.append(f"    {ex[kind]['source'].split('systems/data/', 1)[1]}")
    lines += [
        "",
        "Changes: rows selected for the catalogue models' shapes, head layouts and dtypes;",
        "GEMM shapes off the source grid interpolated log-bilinearly in (n, k), head layouts",
        "off it interpolated linearly in query heads (each entry says how); latencies",
        "converted from milliseconds to microseconds and rounded to 5 significant digits;",
        "two figures per device derived from the GEMM table (see 'derived'). Regenerate with",
        "`python -m kvlab.kernel_tables extract` (kvlab/kernel_tables/extract.py).",
        "",
    ]
    return "\n".join(lines)


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def extract(out: Path) -> list[Path]:
    """Write one JSON per device and NOTICE into `out`; return the paths written."""
    root = _data_root()
    out.mkdir(parents=True, exist_ok=True)
    extracts = {device: extract_device(root, device) for device in SYSTEMS}
    written = []
    for device, ex in extracts.items():
        written.append(out / f"{device}.json")
        _write_atomic(written[-1], dumps(ex) + "\n")
    written.append(out / "NOTICE")
    _write_atomic(written[-1], notice(root, extracts))
    return written

"""The ledger panels' "speed" choice: the ceiling (the sheet's peaks x an efficiency), or
every operator timed from published kernel tables (`kvlab.kernel_tables`, the ledger's
measured mode).

A static page cannot run the measured timing, so the panels ship build-time terms that
`KVLAB.measuredTime` (js/speed.js) adds up exactly as `Kernels.decode_step_s` does:
for each (model, device, weight dtype) the tables cover, the step's time outside
attention at every batch of the grid; for each (device, attention layout, KV dtype), one
layer's attention time at every (batch, context) of the grid. The page then prints the
very seconds `kvlab budget --efficiency measured` prints. The numbers travel as base64 of
little-endian doubles: bit for bit, 10.7 characters each where JSON decimals take ~19.

Where a state has no measured time, the panels say why in one short phrase (`why_not`)
and draw the ceiling; js/speed.js derives the same phrase from the terms.
"""

from __future__ import annotations

import base64
import functools
import math

import numpy as np

from .. import fmt
from ..errors import KvlabError
from ..hardware import get_device
from ..kernel_tables import devices_with_data, kernels, load
from ..kernel_tables.tables import DTYPE_KEYS
from ..models import get_model
from .panel import Control

SPEEDS = ("ceiling", "measured")
SPEED_LABELS = ("ceiling × efficiency", "measured kernels")

#: Why a state has no measured time (js/speed.js holds the same phrases).
NO_DEVICE = "no kernel tables for this device"
NO_MLA = "no MLA attention tables"
NO_RANGE = "outside the tables' range"


def no_weights(dtype: str) -> str:
    return f"no {dtype} weight tables"


def no_kv(dtype: str) -> str:
    return f"no {dtype} KV tables"


def speed_control(default: str = "ceiling") -> Control:
    return Control("speed", "Speed", SPEEDS, default, option_labels=SPEED_LABELS)


def short_source(hardware: str) -> str:
    """Framework and version of a device's tables, for legends: 'TRTLLM 1.3.0rc20 kernels'."""
    t = load(hardware)
    return f"{t.framework} {t.framework_version} kernels"


def table_title(hardware: str) -> str:
    """Framework, version and device of a device's tables, for figure titles."""
    t = load(hardware)
    return f"{t.framework} {t.framework_version} kernel tables, {t.device_string}"


def speed_text(measured: bool, why: str, efficiency: float, hardware: str) -> str:
    """The readout's one phrase: where the numbers come from, and why not measured."""
    if measured and not why:
        return f"measured: {short_source(hardware)}"
    ceiling = f"ceiling × {fmt.percent(efficiency)}"
    return f"{ceiling}: {why}" if measured else ceiling


# ------------------------------------------------------------- what has data
@functools.lru_cache(maxsize=1024)
def why_not(model: str, hardware: str, weight_dtype: str, kv_dtype: str) -> str:
    """'' when the tables cover this configuration, else a short phrase saying why not."""
    # the panels time devices with tables of their own (an A800 or H800 borrows its
    # sibling's in the ledger and the simulator, not in the panels' precomputed terms)
    if get_device(hardware).name not in devices_with_data():
        return NO_DEVICE
    if get_model(model).is_mla:
        return NO_MLA
    try:
        k = kernels(model, hardware, weight_dtype, kv_dtype)  # its GEMM curves, or it raises
    except KvlabError:
        return no_weights(weight_dtype)
    try:
        k.tables.attention("generation", *k.layout)
    except KvlabError:
        return no_kv(kv_dtype)
    return ""


def measured_time(model, hardware, weight_dtype, kv_dtype, batch, context) -> tuple[float, str]:
    """(seconds of one decode step from the kernel tables, '') or (NaN, why not)."""
    why = why_not(model, hardware, weight_dtype, kv_dtype)
    if why:
        return math.nan, why
    t = kernels(model, hardware, weight_dtype, kv_dtype).decode_step_s(int(batch), context)
    return (t, "") if t == t else (math.nan, NO_RANGE)


# ------------------------------------------------------------ the page's terms
def _layout_key(k) -> str:
    heads, kv_heads, head_dim, kv_base = k.layout
    return f"{heads}/{kv_heads}/{head_dim}/{kv_base}"


def _fixed_s(k, batches) -> list[float]:
    """The step outside attention at each batch, summed as `Kernels.decode_step_s` sums it."""
    return [
        float(
            sum(op.measured_s for op in k.decode(float(b), 1.0).operators if op.kind != "attention")
        )
        for b in batches
    ]


def _attention_rows(k, batches, contexts) -> list[list[float]]:
    """One layer's attention at each (batch, context), each row cut after its last value."""
    grid, _how = k.tables.attention("generation", *k.layout)
    rows = []
    for b in batches:
        row = [grid.scalar(float(b), float(c)) for c in contexts]
        while row and row[-1] != row[-1]:
            row.pop()
        rows.append(row)
    return rows


@functools.lru_cache(maxsize=8)
def _measured_terms(models: tuple, devices: tuple, batches: tuple, contexts: tuple) -> dict:
    numbers: list[float] = []
    fixed, attention, device_terms, model_terms = {}, {}, {}, {}
    for name in models:
        m = get_model(name)
        model_terms[name] = {
            "mla": m.is_mla,
            "layers": m.num_layers,
            "window": m.sliding_window or 0,
            "kv_tok_layer": {},
            "attn_flops_layer": None,
            "layout": "",
        }
    for hw in (d for d in devices if d in devices_with_data()):
        t = load(hw)
        device_terms[hw] = {
            "short": short_source(hw),
            "source": f"measured: {t.label}",
            "tables": table_title(hw),
        }
        for name in (m for m in models if not model_terms[m]["mla"]):
            for w in sorted(set(DTYPE_KEYS.values())):
                for kv in sorted(set(DTYPE_KEYS.values())):
                    if why_not(name, hw, w, kv):
                        continue
                    k = kernels(name, hw, w, kv)
                    mt = model_terms[name]
                    mt["layout"] = "/".join(map(str, k.layout[:3]))
                    mt["kv_tok_layer"][kv] = k.kv_tok_layer
                    mt["attn_flops_layer"] = k.attn_flops_layer
                    key = f"{name}|{hw}|{w}"
                    if key not in fixed:
                        fixed[key] = [len(numbers), k.overhead_s]
                        numbers += _fixed_s(k, batches)
                    key = f"{hw}|{_layout_key(k)}"
                    if key not in attention:
                        rows = _attention_rows(k, batches, contexts)
                        attention[key] = [len(numbers), *(len(r) for r in rows)]
                        numbers += [v for r in rows for v in r]
    data = base64.b64encode(np.asarray(numbers, dtype="<f8").tobytes()).decode("ascii")
    return {
        "batches": list(batches),
        "contexts": list(contexts),
        "dtype_keys": dict(DTYPE_KEYS),
        "devices": device_terms,
        "models": model_terms,
        "fixed": fixed,
        "attention": attention,
        "data": data,
        "no": {"device": NO_DEVICE, "mla": NO_MLA, "range": NO_RANGE},
    }


def measured_terms(models, devices, batches, contexts) -> dict:
    """What js/speed.js needs to time these models on these devices at every (batch,
    context) of the grids (and at a sliding window's length, where a model has one)."""
    windows = {get_model(m).sliding_window for m in models} - {None, 0}
    attended = sorted(set(contexts) | {w for w in windows if w < max(contexts)})
    return _measured_terms(tuple(models), tuple(devices), tuple(batches), tuple(attended))

"""Build-time numbers that static panels' JavaScript combines (never re-derives).

The browser gets, per model, the ledger's operator groups as `kvlab.operators` builds them
(in elements: per pass, per routed expert touched, per KV token; FLOPs per token and per
query-key pair; score bytes per pair), and each dtype's bytes per element; `KVLAB.step`
and `KVLAB.prefill` (js/kvlab.js) only count a pass (rows, KV tokens, pairs, experts
touched) and sum the groups' max(bytes / bandwidth, FLOPs / peak), as `kvlab.cost` does.
"""

from __future__ import annotations

from ..dtypes import DType, parse_dtype
from ..hardware import get_device
from ..models import get_model
from ..operators import operator_table

DTYPES = ("fp16", "bf16", "fp8", "int8", "int4", "fp32")
#: A dtype of one byte per element: the table in elements.
ONE_BYTE = DType("int8")


def model_terms(name: str) -> dict:
    """One model's groups as `kvlab.operators` builds them, in elements (the table at one
    byte per element): the browser multiplies the byte terms by the dtype's bytes per
    element, exactly as the table scales with the dtype."""
    m = get_model(name)
    table = operator_table(m, ONE_BYTE, ONE_BYTE)
    dense, experts = table.groups["dense"], table.groups.get("experts")
    attention = table.groups["attention"]
    return {
        "label": m.display_name,
        "num_experts": m.num_experts,
        "experts_per_token": m.experts_per_token,
        "sliding_window": m.sliding_window or 0,
        "dense_elements": dense.weight_bytes,
        "dense_flops_per_token": dense.flops_per_token,
        "expert_elements": experts.expert_bytes if experts else 0.0,
        "experts_flops_per_token": experts.flops_per_token if experts else 0.0,
        "resident_elements": table.resident_weight_bytes,
        "kv_elements_per_token": table.kv_bytes_per_token,
        "flops_per_pair": attention.flops_per_pair,
        "score_bytes_per_pair": attention.score_bytes_per_pair,
    }


def device_terms(name: str) -> dict:
    d = get_device(name)
    return {
        "label": d.display_name,
        "memory_bandwidth_bytes_per_s": d.memory_bandwidth_bytes_per_s,
        "capacity_bytes": d.usable_capacity_bytes,  # what weights + KV may fill
        "bf16_flops_per_s": d.bf16_flops_per_s,
        "fp8_flops_per_s": d.fp8_flops_per_s or 0.0,
    }


def dtype_terms(name: str) -> dict:
    dt = parse_dtype(name)
    return {"bytes_per_element": dt.bytes_per_element, "compute": dt.compute}


def ledger_terms(models, devices, dtypes=DTYPES) -> dict:
    """What `KVLAB.step` / `KVLAB.prefill` need for these models, devices and dtypes."""
    return {
        "models": {m: model_terms(m) for m in models},
        "devices": {d: device_terms(d) for d in devices},
        "dtypes": {t: dtype_terms(t) for t in dtypes},
    }

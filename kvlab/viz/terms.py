"""Build-time numbers that static panels' JavaScript may combine (never re-derive).

Everything here is read off kvlab's catalogues and ledger, so the browser recomputes
with exactly the figures Python uses; the JS twin of the ledger lives in js/kvlab.js.
"""

from __future__ import annotations

from .. import cost
from ..dtypes import parse_dtype
from ..hardware import get_device
from ..models import get_model

DTYPES = ("fp16", "bf16", "fp8", "int8", "int4", "fp32")


def model_terms(name: str) -> dict:
    m = get_model(name)
    p = m.params
    return {
        "label": m.display_name,
        "total_params": p.total,
        "streamed_dense": p.streamed_dense,
        "expert": p.expert,
        "moe_layers": p.moe_layers,
        "num_experts": m.num_experts,
        "experts_per_token": m.experts_per_token,
        "active_params": p.active_per_token(m.experts_per_token),
        "kv_elements_per_token": m.kv_elements_per_token,
        "attention_flops_per_cached_token": m.attention_flops_per_cached_token,
        "sliding_window": m.sliding_window or 0,
        "heads_x_layers": m.num_heads * m.num_layers,
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
        # attention without FlashAttention: bytes of score traffic per query-key pair
        "naive_attention_bytes_per_pair": cost.NAIVE_ATTENTION_PASSES * cost.SCORE_BYTES,
    }

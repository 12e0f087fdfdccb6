"""The one place that maps the toy decoder onto the ledger (`kvlab.cost`).

A benchmark's prediction is the ledger's, fed the decoder's own shapes and the machine's
measured bandwidth and matmul rate. What each decoder choice means in ledger terms:

- shapes: `DecoderConfig.to_hf_config()` -> `models.spec_from_config` (untied LM head,
  no biases; the embedding table is gathered, not streamed, exactly as the ledger counts);
- weights: fp32/bf16/fp16 as named; int8 keeps one scale (in the compute dtype) per
  output row, i.e. one per `in_features` weights: `int8-g<weights per scale>`;
- KV: fp32/bf16/fp16 as named; int8/fp8 keep one fp16 scale per (token, head), i.e. per
  `head_dim` elements: `int8-g<head_dim>` / `fp8-g<head_dim>`;
- the machine: a `hardware.Device` whose bandwidth is the measured copy bandwidth and
  whose FLOP/s is the measured matmul rate in the compute dtype;
- `host` placement adds the fetch of every layer's KV over the measured host->device
  path (`tiers.kv_fetch_time_s` with the measured bandwidth), serially, or overlapped
  with the step when prefetching.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..cost import decode_step, prefill
from ..cost import kv_bytes_per_token as ledger_kv
from ..deployment import Deployment
from ..dtypes import DType
from ..errors import check_number
from ..hardware import Device
from ..models import ModelSpec, spec_from_config
from ..tiers import Placement, TierPath
from .config import DecoderConfig, get_config


@lru_cache(maxsize=64)
def model_spec(config: DecoderConfig | str) -> ModelSpec:
    """The decoder's shapes as a kvlab ModelSpec."""
    c = get_config(config)
    return spec_from_config(
        c.to_hf_config(), name=f"kvlab-{c.name}", where=f"decoder preset {c.name}"
    )


def weight_ledger_dtype(
    config: DecoderConfig | str, weight_dtype: str, scale_bytes: float = 2.0
) -> DType | str:
    """The ledger dtype of the decoder's weights (int8: per-row scales as a group size)."""
    if weight_dtype != "int8":
        return weight_dtype
    c = get_config(config)
    streamed = model_spec(c).params.streamed_dense
    rows = (
        c.num_layers
        * (
            (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
            + c.hidden_size
            + 2 * c.intermediate_size
            + c.hidden_size
        )
        + c.vocab_size
    )
    return DType("int8", group_size=max(1, round(streamed / rows)), scale_bytes=scale_bytes)


def kv_ledger_dtype(config: DecoderConfig | str, kv_dtype: str) -> str:
    """The ledger dtype of the decoder's KV cache (quantized: one fp16 scale per head row)."""
    if kv_dtype in ("int8", "fp8"):
        return f"{kv_dtype}-g{get_config(config).head_dim}"
    return kv_dtype


def measured_device(
    name: str,
    bandwidth_bytes_per_s: float,
    flops_per_s: float,
    capacity_bytes: float,
    source: str = "measured by kvlab bench",
) -> Device:
    """A `Device` for the machine a benchmark ran on, from its measured figures."""
    return Device(
        name=name,
        display_name=name,
        memory_type="measured",
        capacity_bytes=float(capacity_bytes),
        memory_bandwidth_bytes_per_s=float(bandwidth_bytes_per_s),
        bf16_flops_per_s=float(flops_per_s),
        fp8_flops_per_s=None,
        source=source,
    )


#: The measured host -> device path; its bandwidth is passed with each call.
MEASURED_LINK = Placement(
    "measured-link", (), 0.0, "host -> device copies, bandwidth measured by kvlab bench"
)


def deployment(config, device: Device, weight_dtype: str, kv_dtype: str) -> Deployment:
    """The decoder on a machine, in ledger terms (its shapes and dtypes as the ledger
    counts them; the device's figures are what the benchmark measured)."""
    return Deployment(
        model_spec(config),
        device,
        weight_ledger_dtype(config, weight_dtype),
        kv_ledger_dtype(config, kv_dtype),
    )


def fetch_time_s(config, tokens, link_bytes_per_s: float, kv_dtype: str):
    """The ledger's time to bring `tokens` tokens of KV over the measured link (pure
    bandwidth: no per-fetch latency)."""
    tokens = check_number("tokens", tokens, minimum=0, allow_equal_min=True, maximum=1e9)
    moved = np.asarray(tokens, dtype=float) * kv_bytes_per_token(config, kv_dtype)
    link = TierPath(MEASURED_LINK, bandwidth_bytes_per_s=float(link_bytes_per_s), latency_s=0.0)
    return link.time_s(moved)


def predict_decode(  # noqa: PLR0913 - the decoder's shape and placement, keyword-only
    config,
    device: Device,
    batch,
    context,
    weight_dtype: str,
    kv_dtype: str,
    placement: str = "device",
    prefetch: bool = False,
    link_bytes_per_s: float | None = None,
) -> dict:
    """The ledger's step for the decoder at (batch, context); array arguments broadcast.

    Returns step_bytes, predicted_step_s, memory/compute time, bound, and for `host`
    placement fetch_bytes and fetch_s (the KV history crossing the host->device link).
    """
    step = decode_step(deployment(config, device, weight_dtype, kv_dtype), batch, context)
    out = {
        "step_bytes": step.step_bytes,
        "weight_read_bytes": step.weight_read_bytes,
        "kv_read_bytes": step.kv_read_bytes,
        "flops": step.flops,
        "memory_time_s": step.memory_time_s,
        "compute_time_s": step.compute_time_s,
        "bound": step.bound,
        "predicted_step_s": step.step_time_s,
        "fetch_bytes": 0.0,
        "fetch_s": 0.0,
    }
    if placement == "host":
        if link_bytes_per_s is None:
            raise ValueError("host placement needs the measured host->device bandwidth")

        tokens = np.asarray(batch, dtype=float) * np.asarray(context, dtype=float)
        fetch = fetch_time_s(config, tokens, link_bytes_per_s, kv_dtype)
        out["fetch_bytes"] = step.kv_read_bytes
        out["fetch_s"] = fetch
        out["predicted_step_s"] = with_fetch(step.step_time_s, fetch, prefetch)
    return {k: _plain(v) for k, v in out.items()}


def with_fetch(step_s, fetch_s, prefetch: bool):
    """A host-placement step: the KV fetch after the step's work (serial), or beside it."""
    return np.maximum(step_s, fetch_s) if prefetch else step_s + fetch_s


def _plain(x):
    """numpy scalars and 0-d arrays -> Python float/str (JSON and reprs stay clean)."""
    if isinstance(x, np.ndarray) and x.ndim == 0:
        x = x.item()
    if isinstance(x, np.generic):
        x = x.item()
    return x


def predict_prefill(config, device: Device, tokens, weight_dtype: str, kv_dtype: str) -> float:
    """The ledger's time to prefill `tokens` tokens of one sequence from scratch (at the
    device's bf16 FLOP/s: a measured device has no other)."""
    d = deployment(config, device, weight_dtype, kv_dtype)
    return _plain(prefill(d, tokens, 0, 1).time_s)


def kv_bytes_per_token(config, kv_dtype: str) -> float:
    """KV bytes one token adds, over all layers, in the decoder's cache."""
    return ledger_kv(model_spec(config), kv_ledger_dtype(config, kv_dtype))

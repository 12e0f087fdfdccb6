"""A toy Llama-style decoder with a placeable KV cache (torch), and its ledger mapping.

    from kvlab.decoder import Decoder
    model = Decoder("tiny", weight_dtype="fp32")
    cache = model.new_cache(batch=2, max_seq_len=64, kv_dtype="int8", placement="host")
    logits = model.prefill(prompt, cache); logits = model.decode(next_tokens, cache)

`kvlab.decoder.config` and `kvlab.decoder.ledger` do not need torch; the model and cache
are imported on first use.
"""

from .config import KV_DTYPES, PLACEMENTS, PRESETS, WEIGHT_DTYPES, DecoderConfig, get_config

__all__ = [
    "Decoder",
    "DecoderConfig",
    "KVCache",
    "StepPlan",
    "PRESETS",
    "KV_DTYPES",
    "PLACEMENTS",
    "WEIGHT_DTYPES",
    "get_config",
]


def __getattr__(name):
    if name in ("Decoder", "StepPlan"):
        from . import model  # noqa: PLC0415 - torch loads only when used

        return getattr(model, name)
    if name == "KVCache":
        from .kvcache import KVCache  # noqa: PLC0415 - torch loads only when used

        return KVCache
    raise AttributeError(f"module 'kvlab.decoder' has no attribute {name!r}")

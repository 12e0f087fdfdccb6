"""Figures other people published (papers, engine documentation), with their sources.

Kept as data (kvlab/data/published/*.toml) so the book quotes them from one place and
every figure carries its source; kvlab's own numbers come from the ledger, never from here.
"""

from __future__ import annotations

import tomllib
from functools import lru_cache
from importlib import resources

from .errors import unknown_name


@lru_cache(maxsize=8)
def _table(name: str) -> dict:
    return tomllib.loads(
        resources.files("kvlab").joinpath(f"data/published/{name}.toml").read_text()
    )


def kv_quantization(key: str) -> dict:
    """One published result on KV-cache quantization (keys: kivi, kvquant, vllm_fp8, sglang_fp8)."""
    table = _table("kv_quantization")
    if key not in table:
        raise unknown_name("published KV-quantization result", key, table)
    return table[key]


def mooncake(key: str) -> dict:
    """One of Mooncake's published experiments (kvlab/data/published/mooncake.toml): its
    setting and results as FAST'25 or the arXiv report gives them, with the source."""
    table = _table("mooncake")
    if key not in table:
        raise unknown_name("published Mooncake experiment", key, table)
    return table[key]

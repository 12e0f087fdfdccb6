"""What a simulated cluster is: one frozen dataclass, swept with `dataclasses.replace`.

An architecture is a bundle of defaults for four choices, each of which can be set on its
own to take the architectures apart:

                     prefix cache   prefill router   decode router   overlap
    colocated        local          least-loaded     (same GPU)      no
    disaggregated    local          least-loaded     least-loaded    no
    kv-centric       global         cache-aware      free-hbm        yes

`local`: each node caches the prefixes it prefilled in its own host DRAM; `global`: one
pool over all those nodes' host DRAM, any node's blocks usable by any other (over the
network); the total capacity is the same, so only the sharing differs. `overlap`: KV
moves (prefix loads, the prefill->decode transfer) stream layer by layer while the
prefill computes, instead of before / after it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import KvlabError, check_number, unknown_name

ARCHS = ("colocated", "disaggregated", "kv-centric")
PREFIX_CACHES = ("none", "local", "global")
PREFILL_ROUTERS = ("least-loaded", "cache-aware")
DECODE_ROUTERS = ("least-loaded", "free-hbm")
CACHE_POLICIES = ("lru", "lfu", "length-aware")

ARCH_DEFAULTS = {
    "colocated": dict(prefix_cache="local", prefill_router="least-loaded", decode_router="least-loaded", overlap=False),
    "disaggregated": dict(prefix_cache="local", prefill_router="least-loaded", decode_router="least-loaded",
                          overlap=False),
    "kv-centric": dict(prefix_cache="global", prefill_router="cache-aware", decode_router="free-hbm", overlap=True),
}


@dataclass(frozen=True)
class SimConfig:
    """A cluster and its policies. None fields take the architecture's default (`resolved()`)."""

    arch: str = "kv-centric"
    model: str = "llama-3.1-8b"  # catalogue name or config.json path (kvlab.models.get_model)
    hardware: str = "h100-sxm"  # every GPU of the cluster
    weight_dtype: str = "fp16"
    kv_dtype: str = "fp16"
    efficiency: float = 1.0  # share of peak FLOP/s and HBM bandwidth reached (the ledger's ceiling at 1)
    prefill_workers: int = 2  # colocated: prefill_workers + decode_workers GPUs doing both
    decode_workers: int = 2
    link: str = "ib-200g"  # network tier between nodes, one NIC per GPU (kvlab.hardware tiers)
    host_link: str = "pcie5-x16"  # host DRAM <-> GPU inside a node
    link_efficiency: float = 1.0  # share of the links' peak reached
    pool_bytes_per_node: float = 500e9  # host DRAM each prefill-capable node gives to prefix KV
    prefix_cache: str | None = None  # none | local | global
    cache_policy: str = "lru"  # eviction policy of the prefix caches (kvlab.prefix)
    prefill_router: str | None = None  # least-loaded | cache-aware
    decode_router: str | None = None  # least-loaded | free-hbm
    overlap: bool | None = None  # layer-wise overlap of KV moves with prefill compute
    remote_kv: bool = False  # decode reads the KV over `link` every step instead of moving it once
    chunk_tokens: int = 8192  # colocated: prompt tokens one iteration prefills (0 = whole prompt at once)
    max_batch: int = 256  # sequences a GPU decodes at once (vLLM's max_num_seqs)
    memory_fraction: float = 0.9  # share of HBM for weights + KV (vLLM's gpu_memory_utilization)
    step_jitter: float = 0.0  # coefficient of variation of every GPU step's time (0 = exact ledger times)
    seed: int = 0

    def __post_init__(self):
        if self.arch not in ARCHS:
            raise unknown_name("architecture", self.arch, ARCHS)
        for name, valid in (("prefix_cache", PREFIX_CACHES), ("prefill_router", PREFILL_ROUTERS),
                            ("decode_router", DECODE_ROUTERS), ("cache_policy", CACHE_POLICIES)):
            value = getattr(self, name)
            if value is not None and value not in valid:
                raise unknown_name(name.replace("_", " "), value, valid)
        check_number("prefill_workers", self.prefill_workers, minimum=1, allow_equal_min=True, maximum=4096,
                     integer=True)
        check_number("decode_workers", self.decode_workers, minimum=1 if self.arch != "colocated" else 0,
                     allow_equal_min=True, maximum=4096, integer=True)
        check_number("efficiency", self.efficiency, maximum=1.0)
        check_number("link_efficiency", self.link_efficiency, maximum=1.0)
        check_number("pool_bytes_per_node", self.pool_bytes_per_node, minimum=0, allow_equal_min=True, maximum=1e15)
        check_number("chunk_tokens", self.chunk_tokens, minimum=0, allow_equal_min=True, maximum=1e8, integer=True)
        check_number("max_batch", self.max_batch, minimum=1, allow_equal_min=True, maximum=65536, integer=True)
        check_number("memory_fraction", self.memory_fraction, maximum=1.0)
        check_number("step_jitter", self.step_jitter, minimum=0, allow_equal_min=True, maximum=10)
        check_number("seed", self.seed, minimum=0, allow_equal_min=True, maximum=2**63, integer=True)
        if self.remote_kv and self.arch == "colocated":
            raise KvlabError("remote_kv needs separate decode workers: use arch 'disaggregated' or 'kv-centric'")

    def resolved(self) -> "SimConfig":
        """This config with every None replaced by the architecture's default."""
        defaults = ARCH_DEFAULTS[self.arch]
        return dataclasses.replace(self, **{k: v for k, v in defaults.items() if getattr(self, k) is None})

    @property
    def gpus(self) -> int:
        return self.prefill_workers + self.decode_workers

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

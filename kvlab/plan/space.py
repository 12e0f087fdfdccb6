"""The design space of `kvlab plan`: what a design is, the GPUs on offer, the axes, and
their enumeration.

A design is one cluster: an architecture, a tensor-parallel degree per instance (an
instance is TP GPUs serving one model copy), how many instances prefill and how many
decode (colocated: every instance does both), the iteration scheduler and its token
budget (colocated only: a disaggregated GPU runs only prefills or only decodes, so no
scheduler choice is left), the batch cap, the prefix cache and its pool, and the GPU
type. A design uses every GPU of its type on offer, rounded down to whole instances:
capacity per GPU is what is ranked, and instances of one design share the load.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

from ..errors import KvlabError, check_number
from ..fmt import si
from ..hardware import get_device
from ..sim.config import ARCH_DEFAULTS, ARCHS, PREFIX_CACHES, SimConfig, engine_chunk_tokens
from ..sim.schedulers import SCHEDULERS

#: The degrees engines offer within one server (kvlab.operators.TP_DEGREES).
TP_CHOICES = (1, 2, 4, 8)
#: Most GPUs of one type a search may be offered: beyond this a count is a typo.
MAX_GPUS = 4096
#: Default prefill:decode splits, as the prefill share of the instances (rounded, deduplicated,
#: at least one of each); `all` tries every split.
DEFAULT_PREFILL_SHARES = (0.25, 0.5, 0.75)
#: The `prefix_cache` value that means "the architecture's own" (kvlab.sim.config.ARCH_DEFAULTS).
ARCH_DEFAULT = "default"
#: Most dollars per GPU-hour a price may state: beyond this it is a typo.
MAX_USD_PER_HOUR = 1e4


@dataclass(frozen=True)
class Design:
    """One cluster to evaluate. `prefill_workers`/`decode_workers` count instances of
    `tensor_parallel` GPUs; colocated designs have decode_workers = 0 (every instance does
    both). `scheduler` and `chunk_tokens` are None where no GPU mixes prefill and decode."""

    hardware: str
    arch: str
    tensor_parallel: int
    prefill_workers: int
    decode_workers: int
    scheduler: str | None
    chunk_tokens: int | None
    max_batch: int
    prefix_cache: str
    pool_bytes_per_node: float

    @property
    def instances(self) -> int:
        return self.prefill_workers + self.decode_workers

    @property
    def gpus(self) -> int:
        return self.instances * self.tensor_parallel

    @property
    def key(self) -> str:
        """A stable, readable identifier (the resume file's and the ranking's tie-break):
        'h100-sxm colocated tp1 x8 chunked:8192 batch256 cache=local:500GB',
        'h100-sxm kv-centric tp2 1P:3D batch256 cache=global:500GB'."""
        if self.arch == "colocated":
            shape = f"x{self.prefill_workers}"
            budget = f":{self.chunk_tokens}" if self.chunk_tokens else ""
            shape += f" {self.scheduler}{budget}"
        else:
            shape = f"{self.prefill_workers}P:{self.decode_workers}D"
        cache = self.prefix_cache
        if cache != "none":
            cache += ":" + si(self.pool_bytes_per_node, "B").replace(" ", "")
        return (
            f"{self.hardware} {self.arch} tp{self.tensor_parallel} {shape} "
            f"batch{self.max_batch} cache={cache}"
        )

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["gpus"] = self.gpus
        out["instances"] = self.instances
        return out


@dataclass(frozen=True)
class Space:
    """The axes a search crosses (each a tuple of choices). None for `chunk_tokens` is the
    engine's default for the GPU (vLLM's: 8192 on >= 70 GiB GPUs but the A100, else 2048)
    with `chunked`, no limit with the others; `prefix_cache` 'default' is the
    architecture's own (local for colocated and disaggregated, global for kv-centric).
    A scheduler may carry its own budget ('chunked:512', 'prefill-first:4096'); those
    without one take each `chunk_tokens` (chunked) or no limit (the others)."""

    archs: tuple = ARCHS
    tensor_parallel: tuple = (1,)
    prefill_shares: tuple | None = DEFAULT_PREFILL_SHARES  # None: every split
    schedulers: tuple = ("chunked", "prefill-first")
    chunk_tokens: tuple = (None,)
    max_batch: tuple = (SimConfig.max_batch,)
    prefix_cache: tuple = (ARCH_DEFAULT,)
    pool_bytes_per_node: tuple = (SimConfig.pool_bytes_per_node,)

    def __post_init__(self):
        for name in ("archs", "tensor_parallel", "schedulers", "chunk_tokens", "max_batch"):
            if not getattr(self, name):
                raise KvlabError(f"the design space needs at least one {name.replace('_', ' ')}")
        for arch in self.archs:
            if arch not in ARCHS:
                raise KvlabError(f"unknown architecture {arch!r}; valid: {', '.join(ARCHS)}")
        for tp in self.tensor_parallel:
            if tp not in TP_CHOICES:
                raise KvlabError(f"tensor-parallel degree must be one of {TP_CHOICES}, got {tp!r}")
        for s in self.schedulers:
            scheduler_budget(s)
        for c in self.prefix_cache:
            if c != ARCH_DEFAULT and c not in PREFIX_CACHES:
                valid = ", ".join((ARCH_DEFAULT, *PREFIX_CACHES))
                raise KvlabError(f"unknown prefix cache {c!r}; valid: {valid}")
        if self.prefill_shares is not None:
            for share in self.prefill_shares:
                check_number("prefill share", share, maximum=1.0)
        for c in self.chunk_tokens:
            if c is not None:
                check_number("chunk tokens", c, minimum=1, allow_equal_min=True, maximum=1e8)
        for b in self.max_batch:
            check_number("max batch", b, minimum=1, allow_equal_min=True, maximum=65536)
        for p in self.pool_bytes_per_node:
            check_number("pool bytes", p, minimum=0, allow_equal_min=True, maximum=1e15)

    def to_dict(self) -> dict:
        return {k: list(v) if v is not None else None for k, v in dataclasses.asdict(self).items()}


def parse_gpus(text: str) -> dict[str, int]:
    """'h100-sxm:8,a100-80gb:16' -> {'h100-sxm': 8, 'a100-80gb': 16} (catalogue names)."""
    offers: dict[str, int] = {}
    for part in str(text).split(","):
        name, sep, count = part.strip().partition(":")
        if not sep or not name or not count:
            raise KvlabError(f"--gpus wants TYPE:COUNT[,TYPE:COUNT], got {part.strip()!r}")
        device = get_device(name.strip()).name
        try:
            value = float(count)
        except ValueError:
            raise KvlabError(
                f"GPU count of {device} must be a whole number, got {count!r}"
            ) from None
        n = check_number(
            f"GPU count of {device}",
            value,
            minimum=1,
            allow_equal_min=True,
            maximum=MAX_GPUS,
            integer=True,
        )
        if device in offers:
            raise KvlabError(f"--gpus names {device} twice")
        offers[device] = n
    return offers


def parse_prices(items, offers: dict[str, int]) -> dict[str, float]:
    """['h100-sxm=2.5', ...] -> {'h100-sxm': 2.5} (USD per GPU-hour). Prices must name GPUs on
    offer, and either every type on offer or none (a ranking per dollar needs all)."""
    prices: dict[str, float] = {}
    for item in items or ():
        name, sep, value = str(item).partition("=")
        if not sep or not name.strip() or not value.strip():
            raise KvlabError(f"--price wants TYPE=USD_PER_HOUR, got {item!r}")
        device = get_device(name.strip()).name
        if device not in offers:
            raise KvlabError(f"--price names {device}, which --gpus does not offer")
        try:
            usd = float(value)
        except ValueError:
            raise KvlabError(f"price of {device} must be a number, got {value!r}") from None
        prices[device] = check_number(
            f"price of {device} (USD per GPU-hour)", usd, maximum=MAX_USD_PER_HOUR
        )
    missing = [d for d in offers if d not in prices]
    if prices and missing:
        raise KvlabError(
            f"prices name {', '.join(prices)} but not {', '.join(missing)}: price every GPU "
            "type on offer, or none"
        )
    return prices


def splits(instances: int, shares) -> list[tuple[int, int]]:
    """(prefill, decode) instance counts for `instances` split at the prefill `shares`
    (None: every split); each side keeps at least one instance."""
    if instances < 2:
        return []
    if shares is None:
        return [(p, instances - p) for p in range(1, instances)]
    picked = sorted({min(max(round(s * instances), 1), instances - 1) for s in shares})
    return [(p, instances - p) for p in picked]


def enumerate_designs(space: Space, offers: dict[str, int]) -> list[Design]:
    """Every design of the space on the GPUs on offer, in a fixed order."""
    out = []
    for hardware, count in offers.items():
        for tp in space.tensor_parallel:
            instances = count // tp
            if instances < 1:
                continue
            for arch in space.archs:
                out += _designs_of(space, hardware, arch, tp, instances)
    return out


def _designs_of(space: Space, hardware: str, arch: str, tp: int, instances: int) -> list:
    if arch == "colocated":
        shapes = [(instances, 0)]
        schedules = []
        for entry in space.schedulers:
            name, budget = scheduler_budget(entry)
            budgets = (budget,) if budget is not None else space.chunk_tokens
            if name != "chunked" and budget is None:
                budgets = (None,)
            schedules += [
                (name, b if b is not None else _default_chunk(name, hardware)) for b in budgets
            ]
        schedules = list(dict.fromkeys(schedules))
    else:
        shapes = splits(instances, space.prefill_shares)
        schedules = [(None, None)]
    caches = []
    for cache in space.prefix_cache:
        name = _cache_of(arch, cache)
        pools = space.pool_bytes_per_node
        if name == "none":
            pools = pools[:1]  # no cache: the pool size changes nothing
        caches += [(name, float(pool)) for pool in pools]
    out = [
        Design(hardware, arch, tp, prefill, decode, scheduler, chunk, int(batch), cache, pool)
        for (prefill, decode), (scheduler, chunk), batch, (cache, pool) in itertools.product(
            shapes, schedules, space.max_batch, caches
        )
    ]
    return list(dict.fromkeys(out))


def _cache_of(arch: str, cache: str) -> str:
    return ARCH_DEFAULTS[arch]["prefix_cache"] if cache == ARCH_DEFAULT else cache


def scheduler_budget(entry: str) -> tuple[str, int | None]:
    """'chunked' -> ('chunked', None); 'prefill-first:4096' -> ('prefill-first', 4096): a
    scheduler with its token budget per iteration (chunked: the chunk budget, decodes
    included; prefill-first and decode-first: whole prompts per prefill iteration, vLLM
    v0's max_num_batched_tokens; 0: no limit)."""
    name, sep, budget = str(entry).partition(":")
    if name not in SCHEDULERS:
        raise KvlabError(f"unknown scheduler {name!r}; valid: {', '.join(SCHEDULERS)}")
    if not sep:
        return name, None
    try:
        value = float(budget)
    except ValueError:
        raise KvlabError(f"token budget of {name} must be a whole number, got {budget!r}") from None
    tokens = check_number(
        f"token budget of {name}",
        value,
        minimum=0,
        allow_equal_min=True,
        maximum=1e8,
        integer=True,
    )
    return name, tokens


def _default_chunk(scheduler: str, hardware: str) -> int:
    """The engine's token budget: vLLM's default with chunked prefill, none (0) without."""
    return engine_chunk_tokens(hardware) if scheduler == "chunked" else 0


def gpu_hours_usd(design: Design, prices: dict[str, float]) -> float:
    """Dollars per hour the design's GPUs cost (nan without prices)."""
    price = prices.get(design.hardware)
    return design.gpus * price if price is not None else math.nan

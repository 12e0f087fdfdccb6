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

Every field carries its help text in `metadata`; `kvlab simulate` builds its flags from
these fields (kvlab/cli/simulate.py), so a default lives here and nowhere else.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .. import metrics
from ..cost import check_count
from ..deployment import Ceiling, Deployment, Speed, parse_speed
from ..errors import KvlabError, check_number, unknown_name
from ..hardware import USABLE_MEMORY_FRACTION, get_device, tiers
from .routers import DECODE_ROUTERS, PREFILL_ROUTERS
from .schedulers import PREEMPTION_MODES, SCHEDULERS

ARCHS = ("colocated", "disaggregated", "kv-centric")
PREFIX_CACHES = ("none", "local", "global")
CACHE_POLICIES = ("lru", "lfu", "length-aware")

ARCH_DEFAULTS = {
    "colocated": dict(
        prefix_cache="local",
        prefill_router="least-loaded",
        decode_router="least-loaded",
        overlap=False,
    ),
    "disaggregated": dict(
        prefix_cache="local",
        prefill_router="least-loaded",
        decode_router="least-loaded",
        overlap=False,
    ),
    "kv-centric": dict(
        prefix_cache="global", prefill_router="cache-aware", decode_router="free-hbm", overlap=True
    ),
}

#: The token budget of one chunked-prefill iteration that vLLM ships (`max_num_batched_tokens`
#: when `vllm serve` is started without it; vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults,
#: vLLM V1, Apache-2.0): 8192 on GPUs with at least 70 GiB of memory other than the A100 (H100,
#: H200, MI300X), 2048 on the others (A100, L40S, L4, consumer cards). SGLang's default
#: `chunked_prefill_size` is also 8192 on H100/H200-class GPUs (sglang/srt/server_args.py).
ENGINE_CHUNK_TOKENS_LARGE_GPU = 8192
ENGINE_CHUNK_TOKENS_OTHER_GPU = 2048
LARGE_GPU_BYTES = 70 * 2**30
#: The least share of the links' peak a run may assume: a millionth already makes a move
#: last an hour; less would put events where the simulator's clock stops resolving them.
MIN_LINK_EFFICIENCY = 1e-6


def engine_chunk_tokens(hardware: str) -> int:
    """vLLM's default per-iteration token budget for chunked prefill on `hardware`."""
    device = get_device(hardware)
    large = device.capacity_bytes >= LARGE_GPU_BYTES and "a100" not in device.name.lower()
    return ENGINE_CHUNK_TOKENS_LARGE_GPU if large else ENGINE_CHUNK_TOKENS_OTHER_GPU


def _check_link(field_name: str, name) -> None:
    """A link field must name a catalogued link tier (a NIC, PCIe, NVLink), not a memory tier
    (hbm3, ddr5): the simulator moves bytes over it, as `kvlab bench` refuses memories."""

    catalogue = tiers()
    links = [n for n, t in catalogue.items() if t.kind == "link"]
    tier = catalogue.get(str(name).lower())
    if tier is None:
        raise unknown_name(field_name.replace("_", " "), name, links)
    if tier.kind != "link":
        flag = "--" + field_name.replace("_", "-")
        raise KvlabError(
            f"{flag} {name!r} is a {tier.kind} tier, not a link; links: {', '.join(links)}"
        )


def _f(default, help: str, **cli):  # noqa: A002 - argparse's word
    """A config field with its command-line help (and flag details) in its metadata."""
    return field(default=default, metadata={"help": help, **cli})


def _seconds(default: float, flag: str, help: str):  # noqa: A002 - argparse's word
    """A config field in seconds, set by `flag`."""
    return _f(default, help, kind="number", flag=flag, metavar="S")


@dataclass(frozen=True)
class SimConfig:
    """A cluster and its policies. None fields take the architecture's default (`resolved()`)."""

    arch: str = _f("kv-centric", "cluster architecture", choices=ARCHS, required=True)
    model: str = _f("llama-3.1-8b", "catalogue name or config.json path", metavar="NAME")
    hardware: str = _f("h100-sxm", "GPU of every worker", metavar="NAME")
    weight_dtype: str = _f("fp16", "weight dtype", metavar="DTYPE")
    kv_dtype: str = _f("fp16", "KV cache dtype", metavar="DTYPE")
    efficiency: Speed = _f(
        Ceiling(),
        "share of peak FLOP/s and HBM bandwidth reached (1 = the ledger's ceiling), or "
        "'measured': every operator timed from published kernel tables (TensorRT-LLM via "
        "aiconfigurator-core; kvlab/sim/kernel_cost.py)",
        kind="efficiency",
        metavar="F|measured",
    )
    prefill_workers: int = _f(
        2,
        "prefill instances (colocated: prefill + decode workers instances doing both)",
        kind="count",
        metavar="N",
    )
    decode_workers: int = _f(2, "decode instances", kind="count", metavar="N")
    tensor_parallel: int = _f(
        1,
        "GPUs per instance (tensor parallelism: 1, 2, 4 or 8 GPUs of one server; workers "
        "count instances; each GPU brings its memory and its NIC)",
        kind="count",
        metavar="N",
    )
    link: str = _f(
        "ib-400g",
        "network between nodes, one NIC per GPU (a kvlab.hardware link): H100 nodes carry one "
        "400 Gb/s NIC per GPU (50 GB/s), which Mooncake's transfer engine aggregates; ib-200g "
        "for one 200 Gb/s NIC",
        metavar="TIER",
    )
    host_link: str = _f(
        "pcie5-x16",
        "host DRAM <-> GPU link inside a node (prefix loads, swaps; a kvlab.hardware link)",
        metavar="TIER",
    )
    link_efficiency: float = _f(1.0, "share of the links' peak reached", kind="number", metavar="F")
    pool_bytes_per_node: float = _f(
        500e9,
        "host DRAM each prefill-capable node gives to prefix KV, e.g. 5e11",
        kind="number",
        flag="--pool-bytes",
        metavar="BYTES",
    )
    prefix_cache: str | None = _f(
        None, "prefix cache (default: the architecture's)", choices=PREFIX_CACHES
    )
    cache_policy: str = _f("lru", "eviction policy of the prefix caches", choices=CACHE_POLICIES)
    prefill_router: str | None = _f(
        None, "prefill router (default: the architecture's)", choices=tuple(PREFILL_ROUTERS)
    )
    decode_router: str | None = _f(
        None, "decode router (default: the architecture's)", choices=tuple(DECODE_ROUTERS)
    )
    overlap: bool | None = _f(
        None,
        "stream KV moves layer by layer during the prefill (kv-centric default)",
        kind="tristate",
    )
    remote_kv: bool = _f(
        False,
        "leave the KV remote during decode, read over the link every step (the disaster)",
        kind="flag",
    )
    scheduler: str = _f(
        "chunked",
        "what each GPU runs per iteration: prefill-first (vLLM v0: a prompt runs "
        "alone, decodes wait), chunked (vLLM v1 / Sarathi: decodes plus prompt chunks up to "
        "the token budget), decode-first (TGI-like: prompts wait up to --max-waiting-steps); "
        "disaggregated and kv-centric: only what a decode GPU prefills again (its preempted "
        "sequences); their prefill GPUs run one prompt at a time",
        choices=tuple(SCHEDULERS),
    )
    chunk_tokens: int | None = _f(
        None,
        "token budget of one iteration, decode tokens included (vLLM's "
        "max_num_batched_tokens); 0 = no limit; default: vLLM's for the GPU (8192 on "
        ">= 70 GiB GPUs but the A100, else 2048) with chunked, 0 otherwise",
        kind="count",
        metavar="TOKENS",
    )
    max_batch: int = _f(
        256, "sequences a GPU holds at once (vLLM's max_num_seqs)", kind="count", metavar="N"
    )
    memory_fraction: float = _f(
        USABLE_MEMORY_FRACTION,
        "share of HBM for weights + KV (vLLM's gpu_memory_utilization)",
        kind="number",
        metavar="F",
    )
    kv_block_tokens: int = _f(
        16, "tokens per KV block in HBM (vLLM's block_size)", kind="count", metavar="TOKENS"
    )
    preemption: str = _f(
        "recompute",
        "what a GPU does with the newest sequence when a step finds no free KV "
        "block: recompute it later, or swap its KV to host memory over the host link",
        choices=PREEMPTION_MODES,
    )
    max_waiting_steps: int = _f(
        20,
        "decode-first: decode steps a waiting prompt lets pass before it runs "
        "(TGI's max_waiting_tokens)",
        kind="count",
        metavar="N",
    )
    early_reject: bool = _f(
        False,
        "reject at arrival a request whose predicted TTFT (prefill queue + its prefill and "
        "prefix load + wait for decode memory + KV move) or TBT misses its SLO (Mooncake's "
        "Algorithm 1; early rejection, section 7 of its arXiv report)",
        kind="flag",
    )
    ttft_slo_s: float = _seconds(metrics.DEFAULT_TTFT_SLO_S, "--ttft-slo", "TTFT limit in seconds")
    tbt_slo_s: float = _seconds(
        metrics.DEFAULT_TBT_SLO_S,
        "--tbt-slo",
        "time-between-tokens limit in seconds (Mooncake used 0.1/0.2/0.3)",
    )
    tbt_stat: str = _f(
        metrics.DEFAULT_TBT_STAT,
        "which statistic of the token gaps must meet the TBT limit: per request mean "
        "(TPOT, DistServe), p90 (Mooncake's arXiv report), p99, max, slowest10-mean (the mean "
        "of the slowest tenth of a request's gaps, Mooncake FAST'25); or pooled-p99 (the p99 of "
        "the run's gaps pooled, Sarathi-Serve, with --scheduling-delay-slo)",
        choices=metrics.TBT_STATS,
    )
    scheduling_delay_slo_s: float = _seconds(
        metrics.DEFAULT_SCHEDULING_DELAY_SLO_S,
        "--scheduling-delay-slo",
        "with --tbt-stat pooled-p99: the median scheduling delay (arrival to prefill "
        "start) must stay under this (Sarathi-Serve's capacity search: 2 s)",
    )
    step_overhead_s: float = _seconds(
        0.0,
        "--step-overhead",
        "host seconds each engine iteration adds to its GPU time (the CPU scheduling, "
        "sampling and launches between steps that kernel tables leave out; 0 = the GPU's "
        "time only); fit to a published engine with bench/peers/mooncake_repro.py",
    )
    step_jitter: float = _f(
        0.0,
        "coefficient of variation of every GPU step's time (0 = exact ledger times)",
        kind="number",
        flag="--jitter",
        metavar="CV",
    )
    seed: int = _f(0, "seed of the random streams", kind="count")

    def __post_init__(self):
        if self.arch not in ARCHS:
            raise unknown_name("architecture", self.arch, ARCHS)
        for name, valid in (
            ("prefix_cache", PREFIX_CACHES),
            ("prefill_router", PREFILL_ROUTERS),
            ("decode_router", DECODE_ROUTERS),
            ("cache_policy", CACHE_POLICIES),
            ("scheduler", SCHEDULERS),
            ("preemption", PREEMPTION_MODES),
            ("tbt_stat", metrics.TBT_STATS),
        ):
            value = getattr(self, name)
            if value is not None and value not in valid:
                raise unknown_name(name.replace("_", " "), value, valid)
        self._check_numbers()
        for name in ("link", "host_link"):
            _check_link(name, getattr(self, name))
        if self.remote_kv and self.arch == "colocated":
            raise KvlabError(
                "remote_kv needs separate decode workers: use arch 'disaggregated' or 'kv-centric'"
            )

    def _check_numbers(self) -> None:
        """Range checks; whole-number fields are stored as int (a CLI count arrives as a float)."""
        whole = {
            "prefill_workers": (1, 4096),
            "decode_workers": (1 if self.arch != "colocated" else 0, 4096),
            "max_batch": (1, 65536),
            "tensor_parallel": (1, 8),
            "kv_block_tokens": (1, 65536),
            "max_waiting_steps": (0, 1e6),
            "seed": (0, 2**63),
        }
        if self.chunk_tokens is not None:
            whole["chunk_tokens"] = (0, 1e8)
        for name, (low, high) in whole.items():
            object.__setattr__(self, name, check_count(name, getattr(self, name), low, high))
        # a number is a Ceiling; a speed a caller typed as a word is parsed once, here
        object.__setattr__(self, "efficiency", parse_speed(self.efficiency))
        for name, least, most in (  # least None: above 0; else at least `least`
            ("link_efficiency", MIN_LINK_EFFICIENCY, 1.0),
            ("memory_fraction", None, 1.0),
            ("pool_bytes_per_node", 0, 1e15),
            ("step_jitter", 0, 10),
            ("step_overhead_s", 0, 10),
            ("ttft_slo_s", None, 1e9),
            ("tbt_slo_s", None, 1e9),
            ("scheduling_delay_slo_s", None, 1e9),
        ):
            value, at_least = getattr(self, name), least is not None
            check_number(name, value, minimum=least or 0, allow_equal_min=at_least, maximum=most)

    def resolved(self) -> "SimConfig":
        """This config with every None replaced by the architecture's (or the engine's) default."""
        defaults = dict(ARCH_DEFAULTS[self.arch])
        if self.scheduler == "chunked":
            defaults["chunk_tokens"] = engine_chunk_tokens(self.hardware)
        else:
            defaults["chunk_tokens"] = 0  # vLLM v0 without chunking: a prompt is never split
        return dataclasses.replace(
            self, **{k: v for k, v in defaults.items() if getattr(self, k) is None}
        )

    @property
    def instances(self) -> int:
        """Prefill plus decode workers: engine instances of `tensor_parallel` GPUs each."""
        return self.prefill_workers + self.decode_workers

    def to_dict(self) -> dict:
        """The fields as JSON values (the speed as its label: a number or "measured")."""
        return dataclasses.asdict(self) | {"efficiency": self.efficiency.label}

    @property
    def deployment(self) -> Deployment:
        """What every worker runs: the model, GPU, dtypes, speed and tensor parallelism."""
        names = ("model", "hardware", "weight_dtype", "kv_dtype", "efficiency", "tensor_parallel")
        return Deployment(*(getattr(self, name) for name in names))

    @property
    def gpus(self) -> int:
        """GPUs in the cluster: every instance's tensor-parallel group."""
        return self.instances * self.tensor_parallel

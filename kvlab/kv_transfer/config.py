"""What a KV-transfer run measures: engine, sizes, layouts, repeats and time bounds.

Pure data and validation (no torch): the parent checks a configuration before it
spawns anything, so bad input fails in a line instead of in two child processes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..errors import KvlabError, check_number

PREFILL, DECODE = "prefill", "decode"
ROLES = (PREFILL, DECODE)
ENGINES = ("torch", "mooncake")
LAYOUTS = ("contiguous", "paged")
COMPLETIONS = ("notify", "flag")

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
#: 4 KiB (a few tokens of one layer) .. 512 MiB (a 4K request of the article's 7B).
DEFAULT_SIZES = (
    4 * KIB,
    16 * KIB,
    64 * KIB,
    256 * KIB,
    MIB,
    4 * MIB,
    16 * MIB,
    64 * MIB,
    256 * MIB,
    512 * MIB,
)
QUICK_SIZES = (4 * KIB, 256 * KIB, 2 * MIB)
#: 16 tokens x one layer's K and V of the article's 7B (8 KV heads x 128 x fp16):
#: the unit a paged KV cache (vLLM's default block of 16 tokens) moves per layer.
DEFAULT_BLOCK_BYTES = 16 * 2 * 8 * 128 * 2
QUICK_BLOCK_BYTES = 16 * KIB
MAX_SIZE_BYTES = 4 * GIB

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """'4k' -> 4096, '512M' / '512MiB' -> 536870912, '1g' -> 1 GiB (binary, as KV sizes are)."""
    if isinstance(text, int):
        return text
    match = _SIZE.match(str(text))
    if not match:
        raise KvlabError(f"expected a size such as 4k, 64KiB, 512M or 1G, got {text!r}")
    scale = {"": 1, "k": KIB, "m": MIB, "g": GIB}[match[2].lower()]
    value = float(match[1]) * scale
    if value != int(value):
        raise KvlabError(f"size {text!r} is not a whole number of bytes")
    return int(value)


def format_size(nbytes: int) -> str:
    """4096 -> '4 KiB', 536870912 -> '512 MiB' (binary, the inverse of parse_size)."""
    for scale, unit in ((GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:g} {unit}" if value == int(value) else f"{value:.3g} {unit}"
    return f"{nbytes} B"


def parse_sizes(text: str) -> tuple[int, ...]:
    """'4k,64k,1M' -> (4096, 65536, 1048576)."""
    return tuple(parse_size(part) for part in str(text).split(",") if part.strip())


@dataclass(frozen=True)
class TransferConfig:
    """One benchmark run between a prefill and a decode process."""

    engine: str = "torch"  # torch (gloo on CPU, NCCL on CUDA) or mooncake
    device: str = "cpu"  # where the KV buffers live: cpu or cuda
    sizes_bytes: tuple[int, ...] = DEFAULT_SIZES
    layouts: tuple[str, ...] = LAYOUTS
    block_bytes: int = DEFAULT_BLOCK_BYTES  # paged layout: bytes per KV block
    warmup: int = 2
    min_repeats: int = 5
    max_repeats: int = 200
    seconds_per_size: float = 2.0  # timed-loop budget per (layout, size)
    timeout_s: float = 60.0  # bound on every blocking wait in the children
    time_limit_s: float = 900.0  # bound on the whole run, enforced by the parent
    startup_timeout_s: float = 120.0  # spawn + import torch + connect
    host: str = "127.0.0.1"  # address this process binds/advertises (per node under torchrun)
    mooncake_protocol: str = "tcp"  # tcp here; rdma on RDMA-capable nodes
    completion: str = "notify"  # mooncake: TransferNotify message, or a one-sided "flag" write
    threads: int = 1  # torch intra-op threads per process
    poll_s: float = 2e-5  # sleep between polls of a Mooncake completion
    seed: int = 0
    quick: bool = False
    fault: str | None = None  # test hook "ROLE:exit@N" / "ROLE:hang@N": fail at case N

    @property
    def backend(self) -> str:
        """The data path's name: gloo / nccl for torch, the transport for Mooncake."""
        if self.engine == "torch":
            return "nccl" if self.device.startswith("cuda") else "gloo"
        return self.mooncake_protocol

    @property
    def label(self) -> str:
        """Result key: 'torch-gloo', 'torch-nccl', 'mooncake-tcp', 'mooncake-tcp-flag',
        'mooncake-rdma'."""
        flag = "-flag" if self.engine == "mooncake" and self.completion == "flag" else ""
        return f"{self.engine}-{self.backend}{flag}"

    def cases(self) -> list[tuple[str, int]]:
        """(layout, size) pairs measured, in order. Paged needs >= 2 whole blocks."""
        out = []
        for layout in self.layouts:
            for size in self.sizes_bytes:
                if layout == "paged" and (size < 2 * self.block_bytes or size % self.block_bytes):
                    continue
                out.append((layout, size))
        return out

    def fault_at(self, role: str) -> tuple[str, int] | None:
        """('exit' | 'hang', case index) if the test hook targets `role`."""
        if not self.fault:
            return None
        who, _, rest = self.fault.partition(":")
        action, _, index = rest.partition("@")
        return (action, int(index)) if who == role else None

    def validate(self) -> "TransferConfig":
        if self.engine not in ENGINES:
            raise KvlabError(
                f"unknown transfer engine {self.engine!r}. Valid: {', '.join(ENGINES)}"
            )
        if not (self.device == "cpu" or re.fullmatch(r"cuda(:\d+)?", self.device)):
            raise KvlabError(f"device must be cpu or cuda, got {self.device!r}")
        bad = [x for x in self.layouts if x not in LAYOUTS]
        if bad or not self.layouts:
            raise KvlabError(
                f"layouts must be among {', '.join(LAYOUTS)}, "
                f"got {', '.join(self.layouts) or 'none'}"
            )
        if self.completion not in COMPLETIONS:
            raise KvlabError(
                f"completion must be one of {', '.join(COMPLETIONS)}, got {self.completion!r}"
            )
        if not self.sizes_bytes:
            raise KvlabError("no transfer sizes given")
        for size in self.sizes_bytes:
            check_number(
                "transfer size (bytes)",
                size,
                minimum=8,
                allow_equal_min=True,
                maximum=MAX_SIZE_BYTES,
                integer=True,
            )
        check_number(
            "block size (bytes)",
            self.block_bytes,
            minimum=8,
            allow_equal_min=True,
            maximum=MAX_SIZE_BYTES,
            integer=True,
        )
        check_number(
            "warmup", self.warmup, minimum=0, allow_equal_min=True, maximum=1000, integer=True
        )
        check_number(
            "min_repeats",
            self.min_repeats,
            minimum=1,
            allow_equal_min=True,
            maximum=100000,
            integer=True,
        )
        check_number(
            "max_repeats",
            self.max_repeats,
            minimum=self.min_repeats,
            allow_equal_min=True,
            maximum=100000,
            integer=True,
        )
        for name in ("seconds_per_size", "timeout_s", "time_limit_s", "startup_timeout_s"):
            check_number(name, getattr(self, name), maximum=86400)
        check_number(
            "threads", self.threads, minimum=1, allow_equal_min=True, maximum=1024, integer=True
        )
        check_number("poll_s", self.poll_s, minimum=0, allow_equal_min=True, maximum=1.0)
        if not self.cases():
            raise KvlabError(
                f"nothing to measure: paged transfers need sizes of at least two "
                f"{self.block_bytes}-byte blocks, in whole blocks"
            )
        if self.fault and not re.fullmatch(r"(prefill|decode):(exit|hang)@\d+", self.fault):
            raise KvlabError(
                f"fault must look like decode:exit@1 or prefill:hang@0, got {self.fault!r}"
            )
        return self


def quick_config(**overrides) -> TransferConfig:
    """A few small sizes, few repeats, short time bounds: for tests and smoke runs."""
    base = TransferConfig(
        sizes_bytes=QUICK_SIZES,
        block_bytes=QUICK_BLOCK_BYTES,
        warmup=1,
        min_repeats=3,
        max_repeats=5,
        seconds_per_size=0.2,
        timeout_s=20.0,
        time_limit_s=120.0,
        startup_timeout_s=90.0,
        quick=True,
    )
    return replace(base, **overrides).validate()
